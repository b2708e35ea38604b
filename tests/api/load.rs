//! LoadToolGroup: the exact texts of its refusals, the tools and text it answers, and a loaded
//! group coming with every later turn of its conversation.

use tonic::Code;

use crate::helpers::{Backend, TestApp, decisions, spawn_app_on};

crate::on_both_backends!(
    missing_parameters_are_invalid_with_the_exact_text_conversation_first,
    an_unknown_group_is_not_found_and_lists_the_available_groups,
    an_inactive_group_is_a_failed_precondition_naming_its_keys,
    a_group_without_tools_is_a_failed_precondition,
    a_load_answers_the_tools_and_text_and_is_idempotent,
    loading_a_core_domain_succeeds_as_already_loaded,
    a_loaded_group_comes_with_every_turn_of_its_conversation_only,
    a_20_kb_group_name_is_invalid_and_no_error_echoes_more_than_128_characters,
);

async fn missing_parameters_are_invalid_with_the_exact_text_conversation_first(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    let cases = [
        ("", "", "Required parameter 'conversation_id' is missing."),
        ("  ", "sonarr", "Required parameter 'conversation_id' is missing."),
        ("c1", "", "Required parameter 'group_name' is missing."),
        ("c1", " \t", "Required parameter 'group_name' is missing."),
    ];
    for (conv, group, text) in cases {
        let err = app.load(conv, group).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{conv:?} {group:?}");
        assert_eq!(err.message(), text);
    }
    app.stop().await;
}

async fn an_unknown_group_is_not_found_and_lists_the_available_groups(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    app.set("sonarr_url", "x").await;
    app.set("docker_host", "unix:///var/run/docker.sock").await;
    let err = app.load("c1", "nope").await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(
        err.message(),
        "Tool group 'nope' not found. Available groups: docker, sonarr"
    );
    let err = app.load("c1", "Sonarr").await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "group names are case-sensitive");
    app.stop().await;
}

async fn an_inactive_group_is_a_failed_precondition_naming_its_keys(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    let err = app.load("c1", "sonarr").await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(
        err.message(),
        "Tool group 'sonarr' is not configured: set one of sonarr_url, sonarr_api_key."
    );
    app.stop().await;
}

async fn a_group_without_tools_is_a_failed_precondition(backend: Backend) {
    let mut app = TestApp::builder_on(backend)
        .sources(&[
            (
                "base.json",
                r#"{"name":"base","core":true,"tools":[{"name":"b","description":"B"}]}"#,
            ),
            ("hollow.json", r#"{"name":"hollow","keywords":["hollow"]}"#),
        ])
        .spawn()
        .await;
    let err = app.load("c1", "hollow").await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(err.message(), "Tool group 'hollow' has no available tools.");
    app.stop().await;
}

async fn a_load_answers_the_tools_and_text_and_is_idempotent(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    app.set("qbittorrent_url", "x").await;
    let first = app.load("c1", "qbittorrent").await.unwrap();
    assert!(!first.already_loaded);
    let group = first.group.clone().unwrap();
    assert_eq!(
        (group.name.as_str(), group.active, group.core),
        ("qbittorrent", true, false)
    );
    assert_eq!(group.tool_count as usize, first.tools.len());
    let mut expected = format!("Loaded {} tools from group 'qBittorrent':", first.tools.len());
    for t in &first.tools {
        expected.push_str(&format!("\n- {}: {}", t.name, t.description));
    }
    assert_eq!(first.text, expected);
    assert!(first.tools.iter().all(|t| t.domain == "qbittorrent"));

    let second = app.load("c1", "qbittorrent").await.unwrap();
    assert!(second.already_loaded);
    assert_eq!(second.tools, first.tools);
    assert_eq!(second.text, first.text);
    assert!(
        !app.load("c2", "qbittorrent").await.unwrap().already_loaded,
        "per conversation"
    );
    app.stop().await;
}

async fn loading_a_core_domain_succeeds_as_already_loaded(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    let r = app.load("c1", "system").await.unwrap();
    assert!(r.already_loaded);
    assert!(r.text.starts_with("Loaded "));
    app.stop().await;
}

async fn a_loaded_group_comes_with_every_turn_of_its_conversation_only(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    app.set("sonarr_url", "x").await;
    app.set("radarr_url", "x").await;
    app.load("c1", "sonarr").await.unwrap();
    let r = app.route("play a movie", "c1").await;
    let reasons = decisions(&r);
    assert_eq!(reasons[1].0, "sonarr");
    assert_eq!(reasons[1].1, "REASON_LOADED");
    assert_eq!(reasons[2].0, "radarr");
    let other = app.route("play a movie", "c2").await;
    assert!(decisions(&other).iter().all(|d| d.0 != "sonarr"));
    app.stop().await;
}

async fn a_20_kb_group_name_is_invalid_and_no_error_echoes_more_than_128_characters(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    app.set("sonarr_url", "x").await;
    let cut = |s: &str| format!("{}…", s.chars().take(128).collect::<String>());
    let unknown = "g".repeat(200);
    let cases: Vec<(String, Code, String)> = vec![
        (
            "x".repeat(20_000),
            Code::InvalidArgument,
            "'group_name' is 20000 bytes, over the limit of 256 bytes.".into(),
        ),
        (
            "a".repeat(257),
            Code::InvalidArgument,
            "'group_name' is 257 bytes, over the limit of 256 bytes.".into(),
        ),
        (
            "son\u{7}arr".into(),
            Code::InvalidArgument,
            "'group_name' must not contain control characters.".into(),
        ),
        (
            unknown.clone(),
            Code::NotFound,
            format!(
                "Tool group '{}' not found. Available groups: sonarr",
                cut(&unknown)
            ),
        ),
        (
            "g".repeat(128),
            Code::NotFound,
            format!(
                "Tool group '{}' not found. Available groups: sonarr",
                "g".repeat(128)
            ),
        ),
    ];
    for (group, code, text) in cases {
        let err = app.load("c1", &group).await.unwrap_err();
        assert_eq!(err.code(), code, "{} bytes", group.len());
        assert_eq!(err.message(), text);
    }
    app.stop().await;
}
