//! Route: core plus the domains a message hits, the fallback when nothing does, the route
//! options in the config, and the limits on a message and a conversation id.

use tonic::Code;
use toolrouter::proto::RouteRequest;

use crate::helpers::{Backend, FallbackPolicy, MatchMode, TestApp, decisions, spawn_app_on};

crate::on_both_backends!(
    a_keyword_hit_on_an_activated_domain_routes_core_plus_that_domain,
    without_a_hit_every_active_fallback_domain_comes_in,
    the_core_only_fallback_policy_sends_only_core_tools,
    the_meta_tool_can_be_turned_off,
    substring_mode_hits_inside_words,
    a_message_over_the_limit_is_invalid_and_exactly_the_limit_is_accepted,
    a_request_far_over_the_field_limit_but_under_the_transport_limit_names_the_field_limit,
    a_bad_conversation_id_is_invalid_and_says_which_limit,
    cjk_and_emoji_messages_route_without_false_hits,
);

fn kw(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

async fn a_keyword_hit_on_an_activated_domain_routes_core_plus_that_domain(backend: Backend) {
    let mut app = spawn_app_on(backend).await;

    let before = app.route("are my torrents seeding?", "").await;
    assert!(before.fallback, "qbittorrent is inactive, so nothing hits");
    assert_eq!(decisions(&before), vec![("system".into(), "REASON_CORE", vec![])]);

    app.set("qbittorrent_url", "http://nas:8080").await;
    let r = app.route("are my torrents seeding?", "").await;
    assert!(!r.fallback);
    assert_eq!(
        decisions(&r),
        vec![
            ("system".into(), "REASON_CORE", vec![]),
            (
                "qbittorrent".into(),
                "REASON_KEYWORD",
                kw(&["torrent", "seeding"])
            ),
        ]
    );
    assert_eq!(r.tools[0].name, "load_tool_group");
    assert_eq!(r.tools[0].domain, "");
    let schema: serde_json::Value = serde_json::from_str(&r.tools[0].input_schema_json).unwrap();
    assert_eq!(
        schema["properties"]["group_name"]["enum"],
        serde_json::json!(["qbittorrent"])
    );
    assert_eq!(r.tools[1].name, "search_tools", "the v2 meta-tool follows");
    assert_eq!(r.tools[1].domain, "");
    let domains: Vec<&str> = r.tools[2..].iter().map(|t| t.domain.as_str()).collect();
    let system = domains.iter().take_while(|d| **d == "system").count();
    assert!(system > 0 && domains[system..].iter().all(|d| *d == "qbittorrent"));
    assert_ne!(r.registry_version, 0);
    app.stop().await;
}

async fn without_a_hit_every_active_fallback_domain_comes_in(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    app.set("sonarr_url", "http://nas:8989").await;
    app.set("proxmox_url", "https://pve:8006").await; // fallback = false in the demo
    app.set("radarr_url", "").await; // blank counts as unset
    let r = app.route("hello there", "").await;
    assert!(r.fallback);
    assert_eq!(
        decisions(&r),
        vec![
            ("system".into(), "REASON_CORE", vec![]),
            ("sonarr".into(), "REASON_FALLBACK", vec![])
        ]
    );
    app.stop().await;
}

async fn the_core_only_fallback_policy_sends_only_core_tools(backend: Backend) {
    let mut app = TestApp::builder_on(backend)
        .config(|c| c.fallback = FallbackPolicy::CoreOnly)
        .spawn()
        .await;
    app.set("sonarr_url", "http://nas:8989").await;
    let r = app.route("hello there", "").await;
    assert!(r.fallback);
    assert_eq!(decisions(&r), vec![("system".into(), "REASON_CORE", vec![])]);
    app.stop().await;
}

async fn the_meta_tool_can_be_turned_off(backend: Backend) {
    let mut app = TestApp::builder_on(backend)
        .config(|c| c.expose_load_tool_group = false)
        .spawn()
        .await;
    app.set("sonarr_url", "x").await;
    let r = app.route("hello", "").await;
    assert!(r.tools.iter().all(|t| t.name != "load_tool_group"));
    // Nothing tells the model to call the tool it does not have.
    let groups = app.list_groups().await.unwrap();
    assert_eq!(
        groups.prompt_section,
        "## Available Tool Groups\n\n- sonarr: TV series manager: search and add shows, episode calendar, download queue and missing episodes"
    );
    assert_eq!(
        app.route_with(RouteRequest {
            message: "hello".into(),
            include_prompt_section: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .prompt_section,
        groups.prompt_section
    );
    // A sticky hit on radarr: no fallback, so sonarr needs a load.
    app.set("radarr_url", "x").await;
    app.route("add the movie Dune to radarr", "c1").await;
    let check = app.check_call("sonarr_search_series", "c1", "").await.unwrap();
    assert_eq!(check.reason, "needs_load");
    assert_eq!(
        check.text,
        "Tool 'sonarr_search_series' is not available in this conversation now: group 'sonarr' is not loaded."
    );
    app.stop().await;
}

async fn substring_mode_hits_inside_words(backend: Backend) {
    let mut app = TestApp::builder_on(backend)
        .config(|c| c.keyword_match = MatchMode::Substring)
        .spawn()
        .await;
    app.set("home_assistant_url", "x").await;
    let word = app.route("highlight the text", "").await;
    assert_eq!(
        decisions(&word)[1],
        ("home_assistant".into(), "REASON_KEYWORD", kw(&["light"]))
    );
    app.stop().await;
}

async fn a_message_over_the_limit_is_invalid_and_exactly_the_limit_is_accepted(backend: Backend) {
    let mut app = TestApp::builder_on(backend)
        .config(|c| c.max_message_bytes = 1000)
        .spawn()
        .await;
    let ok = app.try_route(&"a".repeat(1000), "").await;
    assert!(ok.is_ok(), "{ok:?}");
    let err = app.try_route(&"a".repeat(1001), "").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(
        err.message(),
        "'message' is 1001 bytes, over the limit of 1000 bytes (max_message_bytes)."
    );
    app.stop().await;
}

async fn a_request_far_over_the_field_limit_but_under_the_transport_limit_names_the_field_limit(
    backend: Backend,
) {
    let mut app = TestApp::builder_on(backend)
        .config(|c| c.max_message_bytes = 1000)
        .spawn()
        .await;
    let err = app.try_route(&"a".repeat(100_000), "").await.unwrap_err();
    // v2 (issue 13): not the transport's OUT_OF_RANGE, but the documented answer naming
    // the limit; only requests over the 4 MiB transport limit are refused before decoding
    // (RESOURCE_EXHAUSTED, tested in server.rs).
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("1000 bytes"), "{err:?}");
    app.stop().await;
}

async fn a_bad_conversation_id_is_invalid_and_says_which_limit(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    let cases = [
        (
            "x".repeat(257),
            "'conversation_id' is 257 bytes, over the limit of 256 bytes.",
        ),
        (
            "a\nb".to_string(),
            "'conversation_id' must not contain control characters.",
        ),
    ];
    for (id, message) in cases {
        let err = app.try_route("hi", &id).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{id:?}");
        assert_eq!(err.message(), message);
    }
    assert!(app.try_route("hi", &"x".repeat(256)).await.is_ok());
    app.stop().await;
}

async fn cjk_and_emoji_messages_route_without_false_hits(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    for key in ["qbittorrent_url", "home_assistant_url", "audiobookshelf_url"] {
        app.set(key, "x").await;
    }
    let r = app.route("灯りを消して 💡🔥 ライト", "").await;
    assert!(r.fallback);
    let r = app.route("Spiel das HÖRBUCH weiter", "").await;
    assert_eq!(
        decisions(&r)[1],
        ("audiobookshelf".into(), "REASON_KEYWORD", kw(&["hörbuch"]))
    );
    app.stop().await;
}
