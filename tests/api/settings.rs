use std::time::Duration;

use toolrouter::proto::InvalidateSettingsRequest;

use crate::helpers::{config, spawn_app, temp_dir};

#[tokio::test]
async fn a_setting_written_to_sqlite_shows_after_invalidate_settings() {
    let dir = temp_dir();
    let mut app = spawn_app(config(dir.path())).await;
    app.ui.set_setting("radarr_api_key", "k").await.unwrap();
    assert!(
        app.route("a movie", "").await.fallback,
        "not yet: the TTL is an hour"
    );
    let r = app
        .client
        .invalidate_settings(InvalidateSettingsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.active_domains, ["radarr", "system"]);
    assert!(!app.route("a movie", "").await.fallback);

    app.ui.set_setting("radarr_api_key", " \t ").await.unwrap();
    let r = app
        .client
        .invalidate_settings(InvalidateSettingsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.active_domains, ["system"], "whitespace counts as unset");
    app.stop().await;
}

#[tokio::test]
async fn a_setting_written_to_sqlite_shows_within_one_ttl_without_invalidation() {
    let dir = temp_dir();
    let mut c = config(dir.path());
    c.settings_ttl = Duration::from_millis(300);
    let mut app = spawn_app(c).await;
    assert!(app.route("a movie", "").await.fallback);
    app.ui.set_setting("radarr_url", "http://nas:7878").await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let r = app.route("a movie", "").await;
    assert!(!r.fallback, "visible after the TTL");
    app.stop().await;
}
