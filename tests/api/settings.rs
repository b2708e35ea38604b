//! Settings written to the database by another program: seen after InvalidateSettings, or by
//! themselves within one settings TTL; on PostgreSQL, by themselves as soon as the table's
//! notification arrives.

use std::time::Duration;

use crate::helpers::{Backend, TestApp, spawn_app_on};

crate::on_both_backends!(
    a_setting_written_to_the_database_shows_after_invalidate_settings,
    a_setting_written_to_the_database_shows_within_one_ttl_without_invalidation,
);

async fn a_setting_written_to_the_database_shows_after_invalidate_settings(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    app.ui.set_setting("radarr_api_key", "k").await.unwrap();
    // On PostgreSQL the table's notification may already have arrived.
    if backend == Backend::Sqlite {
        assert!(
            app.route("a movie", "").await.fallback,
            "not yet: the TTL is an hour"
        );
    }
    let r = app.invalidate().await.unwrap();
    assert_eq!(r.active_domains, ["radarr", "system"]);
    assert!(!app.route("a movie", "").await.fallback);

    app.ui.set_setting("radarr_api_key", " \t ").await.unwrap();
    let r = app.invalidate().await.unwrap();
    assert_eq!(r.active_domains, ["system"], "whitespace counts as unset");
    app.stop().await;
}

async fn a_setting_written_to_the_database_shows_within_one_ttl_without_invalidation(backend: Backend) {
    let mut app = TestApp::builder_on(backend)
        .config(|c| c.settings_ttl = Duration::from_millis(300))
        .spawn()
        .await;
    assert!(app.route("a movie", "").await.fallback);
    app.ui.set_setting("radarr_url", "http://nas:7878").await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let r = app.route("a movie", "").await;
    assert!(!r.fallback, "visible after the TTL");
    app.stop().await;
}

#[tokio::test]
async fn on_postgres_a_setting_written_by_another_program_shows_without_invalidation() {
    if Backend::postgres_url().is_none() {
        return;
    }
    let mut app = spawn_app_on(Backend::Postgres).await;
    assert!(app.route("a movie", "").await.fallback);
    app.ui.set_setting("radarr_url", "http://nas:7878").await.unwrap();
    // The TTL is an hour: only the notification can bring it. The bound only ends a test
    // that would otherwise wait forever.
    let started = std::time::Instant::now();
    while app.route("a movie", "").await.fallback {
        assert!(started.elapsed() < Duration::from_secs(30), "never seen");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    app.stop().await;
}

#[tokio::test]
async fn on_postgres_a_watcher_hears_of_a_setting_written_by_another_program_without_any_call() {
    use tokio_stream::StreamExt as _;
    if Backend::postgres_url().is_none() {
        return;
    }
    let mut app = spawn_app_on(Backend::Postgres).await;
    let mut events = app.watch("").await.unwrap();
    let first = events.next().await.unwrap().unwrap();
    assert!(!first.active_domains.contains(&"radarr".to_string()));
    app.ui.set_setting("radarr_url", "http://nas:7878").await.unwrap();
    // The TTL is an hour and no call is made: only the notification can bring the event.
    let next = tokio::time::timeout(Duration::from_secs(30), events.next())
        .await
        .expect("an event")
        .unwrap()
        .unwrap();
    assert!(next.active_domains.contains(&"radarr".to_string()), "{next:?}");
    app.stop().await;
}
