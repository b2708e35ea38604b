//! Conversations: keyword hits that stick in join order, loads that survive a restart, reset,
//! the conversation TTL, writes only on change, and loads racing evictions of a tiny cache.

use std::time::Duration;

use tonic::Code;

use crate::helpers::{
    Backend, TestApp, TestAppBuilder, WriteLock, decisions, load_request, reasons, route_request,
    spawn_app_on,
};

crate::on_both_backends!(
    keyword_hits_stick_to_the_conversation_in_join_order,
    a_conversations_groups_survive_a_server_restart_on_the_same_database,
    reset_forgets_a_conversation_and_an_empty_id_is_invalid,
    an_idle_conversation_is_forgotten_after_the_conversation_ttl,
    a_dry_run_does_not_keep_a_conversation_alive,
    a_route_that_changes_nothing_writes_nothing,
    a_load_acknowledged_while_its_conversation_was_evicted_is_visible_to_every_later_route,
    concurrent_loads_under_a_full_cache_are_each_visible_to_the_next_route,
);

async fn keyword_hits_stick_to_the_conversation_in_join_order(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    for key in ["sonarr_url", "radarr_url", "qbittorrent_url"] {
        app.set(key, "x").await;
    }
    let t1 = app.route("add the movie", "c1").await;
    assert_eq!(reasons(&t1)[1..], [("radarr".into(), "REASON_KEYWORD")]);
    // Joined on the same turn: by name.
    let t2 = app.route("torrent of the next episode", "c1").await;
    assert_eq!(
        reasons(&t2)[1..],
        [
            ("radarr".into(), "REASON_STICKY"),
            ("qbittorrent".into(), "REASON_KEYWORD"),
            ("sonarr".into(), "REASON_KEYWORD")
        ]
    );
    // Nothing hits now, but sticky domains stop the fallback and keep their order.
    let t3 = app.route("thanks!", "c1").await;
    assert!(!t3.fallback);
    assert_eq!(
        reasons(&t3)[1..],
        [
            ("radarr".into(), "REASON_STICKY"),
            ("qbittorrent".into(), "REASON_STICKY"),
            ("sonarr".into(), "REASON_STICKY")
        ]
    );
    // Without a conversation the same message falls back.
    assert!(app.route("thanks!", "").await.fallback);
    app.stop().await;
}

async fn a_conversations_groups_survive_a_server_restart_on_the_same_database(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    app.set("sonarr_url", "x").await;
    app.set("radarr_url", "x").await;
    app.load("c1", "sonarr").await.unwrap();
    app.route("a movie please", "c1").await;

    let mut again = app.restart().await;
    assert!(again.load("c1", "sonarr").await.unwrap().already_loaded);
    let r = again.route("hello", "c1").await;
    assert_eq!(
        decisions(&r)[1..],
        [
            ("sonarr".into(), "REASON_LOADED", vec![]),
            ("radarr".into(), "REASON_STICKY", vec![])
        ]
    );
    again.stop().await;
}

async fn reset_forgets_a_conversation_and_an_empty_id_is_invalid(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    app.set("sonarr_url", "x").await;
    app.load("c1", "sonarr").await.unwrap();
    app.reset("c1").await.unwrap();
    assert!(!app.load("c1", "sonarr").await.unwrap().already_loaded);
    app.reset("never-seen").await.unwrap();
    let err = app.reset(" ").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(err.message(), "Required parameter 'conversation_id' is missing.");
    app.stop().await;
}

async fn an_idle_conversation_is_forgotten_after_the_conversation_ttl(backend: Backend) {
    let mut app = TestApp::builder_on(backend)
        .config(|c| c.conversation_ttl = Duration::from_millis(300))
        .spawn()
        .await;
    app.set("sonarr_url", "x").await;
    app.load("c1", "sonarr").await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!app.load("c1", "sonarr").await.unwrap().already_loaded);
    app.stop().await;
}

async fn a_dry_run_does_not_keep_a_conversation_alive(backend: Backend) {
    let mut app = TestApp::builder_on(backend)
        .config(|c| c.conversation_ttl = Duration::from_millis(1_000))
        .spawn()
        .await;
    app.set("sonarr_url", "x").await;
    app.load("c1", "sonarr").await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let dry = app.dry_run("hello", "c1").await;
    assert!(
        reasons(&dry).contains(&("sonarr".into(), "REASON_LOADED")),
        "still loaded within the TTL: {:?}",
        reasons(&dry)
    );
    // Past the TTL since the load, and the grace a shared database gives other replicas'
    // unwritten uses (a quarter of this TTL).
    tokio::time::sleep(Duration::from_millis(900)).await;
    // Idle since the load: the dry run recorded nothing, its use included.
    assert!(!app.load("c1", "sonarr").await.unwrap().already_loaded);
    app.stop().await;
}

async fn a_route_that_changes_nothing_writes_nothing(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    app.set("sonarr_url", "x").await;
    app.route("hello", "quiet-conv").await;
    assert_eq!(app.ui.load_conversation("quiet-conv").await.unwrap(), None);
    app.route("next episode", "quiet-conv").await;
    let members = app
        .ui
        .load_conversation("quiet-conv")
        .await
        .unwrap()
        .expect("the hit was written")
        .members;
    assert_eq!(members.len(), 1);
    app.stop().await;
}

/// A conversation cache too small for even one conversation: every entry is evicted at once.
fn tiny_cache(backend: Backend) -> TestAppBuilder {
    TestApp::builder_on(backend).config(|c| {
        c.conversation_cache_bytes = 1;
        c.busy_timeout = Duration::from_secs(30);
    })
}

async fn a_load_acknowledged_while_its_conversation_was_evicted_is_visible_to_every_later_route(
    backend: Backend,
) {
    let mut app = tiny_cache(backend).spawn().await;
    app.set("sonarr_url", "x").await;
    // A settings UI holds the write lock: the load waits in its commit, holding its entry.
    let lock = WriteLock::on(&app).await;
    let mut loader = app.client.clone();
    let load = tokio::spawn(async move { loader.load_tool_group(load_request("c1", "sonarr")).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Other conversations churn the cache meanwhile, and a turn of c1 arrives.
    for n in 0..200 {
        app.route("thanks", &format!("other-{n}")).await;
    }
    let mut router = app.client.clone();
    let during = tokio::spawn(async move { router.route(route_request("thanks", "c1")).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    lock.release().await;
    load.await.unwrap().expect("the load is acknowledged");
    during
        .await
        .unwrap()
        .expect("the turn during the load is answered");
    for turn in 0..5 {
        let r = app.route("thanks", "c1").await;
        assert!(
            decisions(&r)
                .iter()
                .any(|(d, why, _)| d == "sonarr" && *why == "REASON_LOADED"),
            "turn {turn} after the acknowledged load: {:?}",
            decisions(&r)
        );
    }
    app.stop().await;
}

async fn concurrent_loads_under_a_full_cache_are_each_visible_to_the_next_route(backend: Backend) {
    let mut app = tiny_cache(backend).spawn().await;
    for key in ["sonarr_url", "radarr_url", "qbittorrent_url"] {
        app.set(key, "x").await;
    }
    let mut workers = Vec::new();
    for w in 0..8 {
        let mut client = app.client.clone();
        workers.push(tokio::spawn(async move {
            for n in 0..15 {
                // Two workers share each conversation, so a route and a load of one
                // conversation race each other while others evict it.
                let conversation_id = format!("c{}-{n}", w / 2);
                let group = ["sonarr", "radarr", "qbittorrent"][w % 3];
                client
                    .load_tool_group(load_request(&conversation_id, group))
                    .await
                    .unwrap();
                let r = client
                    .route(route_request("thanks", &conversation_id))
                    .await
                    .unwrap()
                    .into_inner();
                assert!(
                    decisions(&r)
                        .iter()
                        .any(|(d, why, _)| d == group && *why == "REASON_LOADED"),
                    "{conversation_id}: {group} acknowledged but not routed: {:?}",
                    decisions(&r)
                );
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    app.stop().await;
}
