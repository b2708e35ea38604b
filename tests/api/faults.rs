//! Settings-database faults after start: the file deleted, replaced by a corrupt one, locked
//! past the busy timeout. Routing goes on from the last good settings; what cannot be done
//! answers UNAVAILABLE with the cause; the daemon recovers by itself.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::Code;

use crate::helpers::{
    Backend, TestApp, WriteLock, db_path, decisions, reasons, routed, set_settings, spawn_app, stored_members,
};

crate::on_both_backends!(a_write_locked_past_the_busy_timeout_is_unavailable_and_then_succeeds,);

/// Removes the database file and its WAL companions, as `rm toolrouter.db*` would.
fn delete_database(dir: &Path) {
    let path = db_path(dir);
    for suffix in ["", "-wal", "-shm"] {
        let p = PathBuf::from(format!("{}{suffix}", path.display()));
        let _ = std::fs::remove_file(p);
    }
}

#[tokio::test]
async fn a_deleted_database_keeps_routing_refuses_writes_and_recovers_when_it_returns() {
    let mut app = spawn_app().await;
    app.set("sonarr_url", "x").await;
    app.set("radarr_url", "y").await;
    app.invalidate().await.unwrap();
    let held = app.route("next episode", "held").await;
    assert_eq!(reasons(&held)[1..], [("sonarr".into(), "REASON_KEYWORD")]);
    delete_database(app.dir());

    // Routing goes on from the last good settings, and from the conversation state held.
    assert_eq!(routed(&app.route("next episode", "").await), ["system", "sonarr"]);
    assert_eq!(
        routed(&app.route("next episode", "c1").await),
        ["system", "sonarr"],
        "a conversation that cannot be read still gets an answer"
    );
    let thanks = app.route("thanks", "held").await;
    assert_eq!(
        reasons(&thanks)[1..],
        [("sonarr".into(), "REASON_STICKY")],
        "the conversation's hit is still held (SPEC §12), not the fallback"
    );
    assert!(!thanks.fallback);
    let groups = app.list_groups().await.unwrap();
    assert!(groups.groups.iter().any(|g| g.name == "sonarr" && g.active));

    // What cannot be done says why.
    let err = app.invalidate().await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(
        err.message().contains("cannot read the settings table"),
        "{}",
        err.message()
    );
    assert!(
        err.message().contains("toolrouter.db"),
        "names the file: {}",
        err.message()
    );
    let err = app.load("c1", "sonarr").await.unwrap_err();
    assert_eq!(
        err.code(),
        Code::Unavailable,
        "a load that would be lost is never OK"
    );

    // A new file at the path: the daemon reopens it and serves what it holds.
    set_settings(app.dir(), &[("radarr_url", "y")]).await;
    assert_eq!(
        app.invalidate().await.unwrap().active_domains,
        ["radarr", "system"]
    );
    let loaded = app.load("c2", "radarr").await.unwrap();
    assert!(!loaded.already_loaded);
    let dir = app.stop().await;

    let members = stored_members(dir.path(), "c2").await.expect("persisted");
    assert!(
        members.iter().any(|m| m.domain == "radarr" && m.loaded),
        "{members:?}"
    );
}

#[tokio::test]
async fn a_corrupt_replacement_is_unavailable_with_the_cause_until_a_good_file_returns() {
    let mut app = spawn_app().await;
    app.set("sonarr_url", "x").await;
    // Replaced, as a restore from a bad backup would: a new file at the same path.
    delete_database(app.dir());
    let tmp = app.dir().join("garbage");
    std::fs::write(&tmp, vec![0x5a_u8; 64 * 1024]).unwrap();
    std::fs::rename(&tmp, app.db_path()).unwrap();

    let err = app.invalidate().await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.message().contains("not a database"), "{}", err.message());
    assert_eq!(routed(&app.route("next episode", "").await), ["system", "sonarr"]);
    assert_eq!(
        app.load("c1", "sonarr").await.unwrap_err().code(),
        Code::Unavailable
    );

    delete_database(app.dir());
    set_settings(app.dir(), &[("sonarr_url", "x"), ("docker_host", "d")]).await;
    assert_eq!(
        app.invalidate().await.unwrap().active_domains,
        ["docker", "sonarr", "system"]
    );
    assert!(app.load("c1", "sonarr").await.is_ok());
    app.stop().await;
}

#[tokio::test]
async fn settings_are_retried_each_ttl_and_recover_without_an_invalidation() {
    let ttl = Duration::from_millis(200);
    let mut app = TestApp::builder().config(|c| c.settings_ttl = ttl).spawn().await;
    app.set("sonarr_url", "x").await;
    delete_database(app.dir());
    tokio::time::sleep(ttl * 2).await;
    // The due re-read fails; the last good settings serve.
    assert_eq!(routed(&app.route("next episode", "").await), ["system", "sonarr"]);
    set_settings(app.dir(), &[("radarr_url", "y")]).await;
    // Within a few TTLs the daemon has read the new file by itself.
    let mut seen = Vec::new();
    for _ in 0..50 {
        tokio::time::sleep(ttl).await;
        seen = routed(&app.route("add the movie", "").await);
        if seen == ["system", "radarr"] {
            break;
        }
    }
    assert_eq!(seen, ["system", "radarr"]);
    app.stop().await;
}

/// Many writes waiting on another program's write lock take a connection each: a read still
/// finds one, and each write is refused within the busy timeout, none runs into the request
/// timeout waiting for a connection.
#[tokio::test]
async fn writes_waiting_on_a_lock_leave_connections_for_reads_and_each_answers_in_time() {
    let mut app = TestApp::builder()
        .config(|c| {
            c.busy_timeout = Duration::from_secs(1);
            c.request_timeout = Duration::from_millis(2500);
        })
        .spawn()
        .await;
    app.set("sonarr_url", "x").await;
    let lock = WriteLock::on(&app).await;
    let loads: Vec<_> = (0..12)
        .map(|i| {
            let mut c = app.client.clone();
            tokio::spawn(async move {
                c.load_tool_group(crate::helpers::load_request(&format!("c{i}"), "sonarr"))
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    let r = app.route("thanks", "a-new-conversation").await;
    assert!(r.fallback);
    // A read that had to wait for a connection would get one only when a write gave up.
    let gave_up = loads.iter().filter(|l| l.is_finished()).count();
    assert_eq!(
        gave_up,
        0,
        "a read waited {:?} for a connection, until a write gave up",
        started.elapsed()
    );
    for load in loads {
        let err = load.await.unwrap().unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    }
    lock.release().await;
    app.stop().await;
}

async fn a_write_locked_past_the_busy_timeout_is_unavailable_and_then_succeeds(backend: Backend) {
    let mut app = TestApp::builder_on(backend)
        .config(|c| c.busy_timeout = Duration::from_millis(200))
        .spawn()
        .await;
    app.set("sonarr_url", "x").await;
    // Another program holds the write lock.
    let lock = WriteLock::on(&app).await;

    let err = app.load("c1", "sonarr").await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    // SQLite: "database is locked"; PostgreSQL: "canceling statement due to lock timeout"
    // (or "statement timeout": both are the busy timeout).
    let cause = match backend {
        Backend::Sqlite => "locked",
        Backend::Postgres => "timeout",
    };
    assert!(err.message().contains(cause), "{}", err.message());
    // Not PostgreSQL's "at line N", the line of the server's own source.
    assert!(!err.message().contains(" at line "), "{}", err.message());
    // Routing is unaffected: reads are not blocked, and a turn is answered even when its
    // hits cannot be remembered.
    assert_eq!(
        routed(&app.route("next episode", "c2").await),
        ["system", "sonarr"]
    );
    assert!(app.invalidate().await.is_ok());

    lock.release().await;
    let loaded = app.load("c1", "sonarr").await.unwrap();
    assert!(!loaded.already_loaded, "the refused load was not half-applied");
    let again = app.route("thanks", "c1").await;
    assert_eq!(
        decisions(&again)[1..],
        [("sonarr".to_string(), "REASON_LOADED", vec![])]
    );
    app.stop().await;
}
