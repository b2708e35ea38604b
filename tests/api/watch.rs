//! `WatchRegistry` (SPEC §11): the state at once, then an event on every reload and every
//! change of the active domains or the disabled tools, in order; a watcher that does not read
//! holds nothing up.

use std::time::Duration;

use tokio_stream::StreamExt as _;
use toolrouter::proto::RegistryEvent;

use crate::helpers::{ProfileConfig, TestApp, next_event as next, route_request};

const A: &str = r#"{"name":"a","keywords":["alpha"],"tools":[{"name":"a1","description":"A one"},{"name":"a2","description":"A two"}]}"#;
const B: &str = r#"{"name":"b","settings_keys":["b_url"],"keywords":["beta"],"tools":[{"name":"b1","description":"B one"}]}"#;

/// Whether the stream stays quiet for a moment.
async fn quiet(stream: &mut tonic::Streaming<RegistryEvent>) -> bool {
    tokio::time::timeout(Duration::from_millis(300), stream.next())
        .await
        .is_err()
}

#[tokio::test]
async fn a_watcher_sees_the_state_then_each_change_in_order() {
    let mut app = TestApp::builder()
        .manifests(&[("a.json", A), ("b.json", B)])
        .config(|c| {
            c.profiles.insert(
                "only-a".into(),
                ProfileConfig {
                    allow_domains: vec!["a".into()],
                    ..ProfileConfig::default()
                },
            );
        })
        .spawn()
        .await;
    let mut all = app.watch("").await.unwrap();
    let mut only_a = app.watch("only-a").await.unwrap();

    let first = next(&mut all).await;
    assert_eq!(first.active_domains, ["a"]);
    assert_eq!(first.tools, 3, "every tool, whatever the settings");
    assert!(first.disabled_tools.is_empty());
    let first_a = next(&mut only_a).await;
    assert_eq!(
        (first_a.active_domains.as_slice(), first_a.tools),
        (&["a".to_string()][..], 2)
    );

    // A settings flip that changes the active set.
    app.set("b_url", "http://b").await;
    let second = next(&mut all).await;
    assert_eq!(second.active_domains, ["a", "b"]);
    assert_eq!(second.registry_version, first.registry_version);
    assert!(
        quiet(&mut only_a).await,
        "the profile does not see b: nothing changed for it"
    );

    // A settings write that changes nothing a watcher is told: no event.
    app.set("unrelated", "x").await;
    assert!(quiet(&mut all).await);

    // Disabled tools.
    app.set("toolrouter.disabled_tools", r#"["a2"]"#).await;
    let third = next(&mut all).await;
    assert_eq!(third.disabled_tools, ["a2"]);
    assert_eq!(third.tools, 2);
    let third_a = next(&mut only_a).await;
    assert_eq!(
        (third_a.disabled_tools.as_slice(), third_a.tools),
        (&["a2".to_string()][..], 1)
    );
    // Disabling a tool the profile cannot see: news to the whole registry's watcher only,
    // and the profile's events never name it (SPEC §10).
    app.set("toolrouter.disabled_tools", r#"["a2", "b*"]"#).await;
    let disabled_b = next(&mut all).await;
    assert_eq!(disabled_b.disabled_tools, ["a2", "b*"]);
    assert!(
        quiet(&mut only_a).await,
        "the profile does not see b1: nothing changed for it"
    );
    app.set("toolrouter.disabled_tools", r#"["a2"]"#).await;
    assert_eq!(next(&mut all).await.disabled_tools, ["a2"]);
    assert!(quiet(&mut only_a).await);

    // A reload with new manifests.
    std::fs::write(
        app.manifests().join("c.json"),
        r#"{"name":"c","tools":[{"name":"c1","description":"C"}]}"#,
    )
    .unwrap();
    let reloaded = app.reload().await.unwrap();
    let fourth = next(&mut all).await;
    assert_eq!(fourth.registry_version, reloaded.registry_version);
    assert_ne!(fourth.registry_version, first.registry_version);
    assert_eq!(fourth.active_domains, ["a", "b", "c"]);
    let fourth_a = next(&mut only_a).await;
    assert_eq!(fourth_a.registry_version, reloaded.registry_version);
    assert_eq!(fourth_a.active_domains, ["a"]);
    assert_eq!(fourth_a.disabled_tools, ["a2"]);

    // A reload that finds nothing changed is a reload all the same: an event on each stream,
    // the same state (SPEC §11, "an event on every registry reload").
    let again = app.reload().await.unwrap();
    assert_eq!(again.registry_version, reloaded.registry_version);
    assert_eq!(next(&mut all).await, fourth);
    assert_eq!(next(&mut only_a).await, fourth_a);
    assert!(
        quiet(&mut all).await && quiet(&mut only_a).await,
        "one event per reload"
    );
}

#[tokio::test]
async fn a_watcher_hears_of_a_settings_write_within_the_ttl_without_other_calls() {
    let mut app = TestApp::builder()
        .manifests(&[("a.json", A), ("b.json", B)])
        .config(|c| c.settings_ttl = Duration::from_millis(300))
        .spawn()
        .await;
    let mut stream = app.watch("").await.unwrap();
    assert_eq!(next(&mut stream).await.active_domains, ["a"]);
    // Another program writes the table, at different moments of the TTL; nobody calls the
    // daemon. Each change is heard within one TTL (and a little for the read itself).
    for (round, pause_ms) in [0u64, 50, 120, 200, 290, 10, 150, 240].into_iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        let (value, want): (&str, &[&str]) = if round % 2 == 0 {
            ("http://b", &["a", "b"])
        } else {
            ("", &["a"])
        };
        let written = std::time::Instant::now();
        app.ui.set_setting("b_url", value).await.unwrap();
        assert_eq!(next(&mut stream).await.active_domains, want, "round {round}");
        let heard = written.elapsed();
        assert!(
            heard < Duration::from_millis(300 + 150),
            "round {round}: heard {heard:?} after the write, with a TTL of 300 ms"
        );
    }
}

#[tokio::test]
async fn a_new_watcher_starts_from_the_settings_as_they_are_not_as_last_told() {
    let mut app = TestApp::builder()
        .manifests(&[("a.json", A), ("b.json", B)])
        .config(|c| c.settings_ttl = Duration::from_millis(200))
        .spawn()
        .await;
    // Written by another program while nobody watches or calls, for longer than the TTL.
    app.ui.set_setting("b_url", "http://b").await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let mut stream = app.watch("").await.unwrap();
    assert_eq!(next(&mut stream).await.active_domains, ["a", "b"]);
}

#[tokio::test]
async fn a_watcher_that_does_not_read_holds_nothing_up_and_then_gets_the_latest_state() {
    let mut app = TestApp::builder()
        .manifests(&[("a.json", A), ("b.json", B)])
        .spawn()
        .await;
    let mut stalled = app.watch("").await.unwrap();
    for i in 0..200 {
        let value = if i % 2 == 0 { "http://b" } else { "" };
        app.set("b_url", value).await;
        app.route("alpha", "").await;
    }
    app.set("toolrouter.disabled_tools", r#"["a1"]"#).await;
    // The stream catches up to the latest state; nothing older comes after it.
    let mut last = next(&mut stalled).await;
    while last.disabled_tools.is_empty() {
        last = next(&mut stalled).await;
    }
    assert_eq!(last.active_domains, ["a"]);
    assert!(quiet(&mut stalled).await);
    let routed = app
        .client
        .route(route_request("alpha", ""))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(routed.registry_version, last.registry_version);
}

#[tokio::test]
async fn watch_streams_end_when_the_daemon_stops() {
    let mut app = TestApp::builder().spawn().await;
    let mut stream = app.watch("").await.unwrap();
    next(&mut stream).await;
    let stopping = tokio::spawn(async move { app.stop().await });
    let end = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("the stream ends within 5 s");
    // UNAVAILABLE, as gRPC tells of a server gone away: the consumer watches again.
    match end {
        Some(Err(status)) => {
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
            assert_eq!(
                status.message(),
                "The daemon is shutting down; watch again (another replica, or this one once it is back)."
            );
        }
        other => panic!("the stream ends with UNAVAILABLE, not {other:?}"),
    }
    assert!(
        stream.next().await.is_none(),
        "nothing after the status that ends it"
    );
    tokio::time::timeout(Duration::from_secs(5), stopping)
        .await
        .expect("the daemon stops without waiting for the watcher")
        .unwrap();
}

/// Conversation upkeep runs beside the daemon's other duties: while it waits on a database
/// another program holds locked (as it would on thousands of clock writes), a watcher still
/// hears of a settings write within the TTL.
#[tokio::test]
async fn a_watcher_hears_of_a_settings_write_while_upkeep_waits_on_the_database() {
    let mut app = TestApp::builder()
        .manifests(&[("a.json", A), ("b.json", B)])
        .config(|c| {
            c.settings_ttl = Duration::from_millis(300);
            // Upkeep every 100 ms, each one waiting up to 3 s for the write lock.
            c.conversation_ttl = Duration::from_millis(400);
            c.busy_timeout = Duration::from_secs(3);
        })
        .spawn()
        .await;
    let mut stream = app.watch("").await.unwrap();
    assert_eq!(next(&mut stream).await.active_domains, ["a"]);
    app.ui.set_setting("b_url", "http://b").await.unwrap();
    let written = std::time::Instant::now();
    let lock = crate::helpers::WriteLock::on(&app).await;
    let heard = tokio::time::timeout(Duration::from_millis(1_500), next(&mut stream)).await;
    let waited = written.elapsed();
    lock.release().await;
    let event = heard.unwrap_or_else(|_| panic!("nothing heard within 1.5 s (upkeep held the loop)"));
    assert_eq!(event.active_domains, ["a", "b"]);
    assert!(waited < Duration::from_millis(1_000), "heard after {waited:?}");
}

/// Open streams are bounded like calls (`--max-concurrent-requests`), health's too though it
/// takes no token: streams nobody reads cannot add up without bound. A stream's place is
/// freed when it ends, and calls go on while the streams are full.
#[tokio::test]
async fn open_streams_are_bounded_and_a_closed_one_frees_its_place() {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let mut app = TestApp::builder()
        .manifests(&[("a.json", A), ("b.json", B)])
        .config(|c| c.max_concurrent_requests = 3)
        .spawn()
        .await;
    let channel = app.connection().channel().await.unwrap();
    let health_watch = || {
        let channel = channel.clone();
        async move {
            HealthClient::new(channel)
                .watch(HealthCheckRequest {
                    service: String::new(),
                })
                .await
        }
    };
    let first = app.watch("").await.unwrap();
    let _second = app.watch("").await.unwrap();
    let _third = health_watch().await.unwrap();
    let err = app.watch("").await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert_eq!(
        err.message(),
        "The daemon is at its limit of 3 open streams; retry shortly."
    );
    let err = health_watch().await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(app.try_route("alpha", "").await.is_ok(), "calls go on");
    drop(first);
    // The daemon sees the stream reset a moment later.
    let mut again = None;
    for _ in 0..50 {
        match app.watch("").await {
            Ok(s) => {
                again = Some(s);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    assert!(again.is_some(), "a closed stream's place is free again");
}
