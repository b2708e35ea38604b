//! Settings written to the database by another program: seen after InvalidateSettings, or by
//! themselves within one settings TTL.

use std::time::Duration;

use crate::helpers::{TestApp, spawn_app};

#[tokio::test]
async fn a_setting_written_to_sqlite_shows_after_invalidate_settings() {
    let mut app = spawn_app().await;
    app.ui.set_setting("radarr_api_key", "k").await.unwrap();
    assert!(
        app.route("a movie", "").await.fallback,
        "not yet: the TTL is an hour"
    );
    let r = app.invalidate().await.unwrap();
    assert_eq!(r.active_domains, ["radarr", "system"]);
    assert!(!app.route("a movie", "").await.fallback);

    app.ui.set_setting("radarr_api_key", " \t ").await.unwrap();
    let r = app.invalidate().await.unwrap();
    assert_eq!(r.active_domains, ["system"], "whitespace counts as unset");
    app.stop().await;
}

#[tokio::test]
async fn a_setting_written_to_sqlite_shows_within_one_ttl_without_invalidation() {
    let mut app = TestApp::builder()
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
