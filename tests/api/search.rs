//! Search routing, `SearchTools`, the `search_tools` meta-tool and `dry_run`, through the
//! real server on the demo registry.

use tonic::Code;
use toolrouter::proto::SearchToolsRequest;

use crate::helpers::{Backend, SearchMode, TestApp, decisions, search_request, spawn_app_on};

crate::on_both_backends!(
    an_exact_tool_name_ranks_first,
    an_inactive_domain_is_listed_with_the_keys_to_set_and_never_loaded,
    load_puts_the_top_groups_into_the_conversation_before_answering,
    nothing_matched_says_so_and_lists_the_active_groups,
    bad_search_requests_are_invalid_arguments_a_person_can_act_on,
    route_finds_a_domain_by_search_explains_it_and_remembers_it,
    search_off_routes_by_keywords_only,
    a_dry_run_records_nothing,
    the_search_tools_meta_tool_follows_load_tool_group_and_can_be_turned_off,
);

async fn an_exact_tool_name_ranks_first(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    let r = app
        .search(search_request("  QBT_Get_Torrent_Details "))
        .await
        .unwrap();
    let first = r.hits[0].tool.as_ref().unwrap();
    assert_eq!(first.name, "qbt_get_torrent_details");
    assert_eq!(first.domain, "qbittorrent");
    assert!(r.hits.len() <= 5, "the default limit is 5");
    assert!(
        r.hits.windows(2).skip(1).all(|w| w[0].score >= w[1].score),
        "best first"
    );
    assert_ne!(r.registry_version, 0);
    app.stop().await;
}

async fn an_inactive_domain_is_listed_with_the_keys_to_set_and_never_loaded(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    let r = app
        .search(SearchToolsRequest {
            query: "pause the seeding torrents".into(),
            conversation_id: "s1".into(),
            load: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let top = &r.hits[0];
    assert_eq!(top.tool.as_ref().unwrap().domain, "qbittorrent");
    assert!(!top.active);
    assert_eq!(
        top.missing_settings_keys,
        ["qbittorrent_url", "qbittorrent_username", "qbittorrent_password"]
    );
    assert!(
        top.matched_terms.contains(&"torrents".to_string()),
        "{:?}",
        top.matched_terms
    );
    assert!(
        !r.loaded_groups.contains(&"qbittorrent".to_string()),
        "inactive: not loaded"
    );
    assert!(
        r.text.contains("(qbittorrent)") && r.text.contains("not configured: set one of qbittorrent_url"),
        "{}",
        r.text
    );
    app.stop().await;
}

async fn load_puts_the_top_groups_into_the_conversation_before_answering(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    app.set("qbittorrent_url", "http://nas:8080").await;
    let r = app
        .search(SearchToolsRequest {
            query: "pause the seeding torrents".into(),
            limit: 20,
            conversation_id: "s1".into(),
            load: true,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(r.loaded_groups.first().map(String::as_str), Some("qbittorrent"));
    assert!(
        r.loaded_groups.len() <= 3,
        "at most 3 groups: {:?}",
        r.loaded_groups
    );
    assert!(
        !r.loaded_groups.contains(&"system".to_string()),
        "core is never loaded"
    );
    assert!(
        r.text.contains("Loaded for this conversation: qbittorrent"),
        "{}",
        r.text
    );

    // Persisted before the answer: a new server on the same database routes it as loaded.
    let mut again = app.restart().await;
    let routed = again.route("thanks", "s1").await;
    assert!(
        decisions(&routed).contains(&("qbittorrent".into(), "REASON_LOADED", vec![])),
        "{:?}",
        decisions(&routed)
    );
    again.stop().await;
}

/// Small talk routes nothing by search (SPEC §8): each of these falls back, and a conversation
/// that starts with them keeps its fallback.
#[tokio::test]
async fn small_talk_has_no_search_hit_and_leaves_nothing_sticky() {
    let mut app = TestApp::builder().spawn().await;
    for d in toolrouter::registry::Registry::demo().domains() {
        for k in &d.settings_keys {
            app.set(k, "x").await;
        }
    }
    for message in [
        "hi",
        "thanks!",
        "ok do it",
        "how are you doing today?",
        "have a nice day",
        "good evening",
        "talk to you later",
        "I'm back",
        "Thanks for everything today",
        "nice one",
        "I have a question",
        // Courtesy and one other word is still small talk.
        "many thanks",
        "thanks for your time",
        "good night",
        "good night and thanks",
        "cheers mate",
        "many thanks, good night",
        "hi, thanks",
        "thanks, bye",
    ] {
        let r = app.route(message, "small-talk").await;
        assert!(
            r.fallback && !decisions(&r).iter().any(|(_, why, _)| *why == "REASON_SEARCH"),
            "{message:?}: {:?}",
            decisions(&r)
        );
    }
    // Courtesy beside a request is no small talk: the request is searched, also when it is
    // one word, after a comma.
    for message in [
        "thanks, download the newest mistral model",
        "thanks, what is playing?",
        "hi, what is playing",
        "thanks, pause",
        // A full-width comma, and a symbol before the comma.
        "thanks\u{ff0c}pause",
        "thanks \u{1f64f}, pause",
        // Courtesy after the request, past a comma, likewise.
        "pause, thanks",
        "pause it, thanks",
        "pause \u{1f3ac}, thanks a lot",
    ] {
        let r = app.route(message, "").await;
        assert!(
            !r.fallback && decisions(&r).iter().any(|(_, why, _)| *why == "REASON_SEARCH"),
            "{message:?}: {:?}",
            decisions(&r)
        );
    }
    app.stop().await;
}

/// Groups one `SearchTools` call loads join the conversation as domains joining on one turn
/// do: by name, whatever their rank.
#[tokio::test]
async fn groups_loaded_by_one_search_join_by_name() {
    let tool = |name: &str, description: &str| {
        format!(
            r#"[{{"_meta": true}}, {{"name": "{name}", "description": "{description}", "parameters": {{}}}}]"#
        )
    };
    let (gamma, alpha, delta) = (
        tool("gamma_one", "gamma one gamma one"),
        tool("alpha_one", "gamma one"),
        tool("delta_one", "one gamma"),
    );
    let mut app = TestApp::builder()
        .manifests(&[
            ("gamma.json", &gamma),
            ("alpha.json", &alpha),
            ("delta.json", &delta),
        ])
        .spawn()
        .await;
    let r = app
        .search(SearchToolsRequest {
            query: "gamma_one".into(),
            limit: 5,
            conversation_id: "s".into(),
            load: true,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        r.loaded_groups.first().map(String::as_str),
        Some("gamma"),
        "rank order: {:?}",
        r.loaded_groups
    );
    assert_eq!(r.loaded_groups.len(), 3, "{:?}", r.loaded_groups);
    let routed = app.dry_run("hello", "s").await;
    let order: Vec<&str> = routed.domains.iter().map(|d| d.domain.as_str()).collect();
    assert_eq!(order, ["alpha", "delta", "gamma"]);
    app.stop().await;
}

async fn nothing_matched_says_so_and_lists_the_active_groups(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    app.set("pihole_url", "http://pi.hole").await;
    let r = app.search(search_request("xyzzy plugh")).await.unwrap();
    assert!(r.hits.is_empty());
    assert_eq!(
        r.text,
        "No tools matched 'xyzzy plugh'. Active groups: pihole, system."
    );
    // A long query is echoed as errors echo a caller's value: cut to 128 characters.
    let long = "q".repeat(5_000);
    let r = app.search(search_request(&long)).await.unwrap();
    assert_eq!(
        r.text,
        format!(
            "No tools matched '{}…'. Active groups: pihole, system.",
            "q".repeat(128)
        )
    );
    app.stop().await;
}

async fn bad_search_requests_are_invalid_arguments_a_person_can_act_on(backend: Backend) {
    let mut app = TestApp::builder_on(backend)
        .config(|c| c.max_message_bytes = 100)
        .spawn()
        .await;
    let cases: &[(SearchToolsRequest, &str)] = &[
        (search_request(" "), "Required parameter 'query' is missing."),
        (
            search_request(&"a".repeat(101)),
            "'query' is 101 bytes, over the limit of 100 bytes",
        ),
        (
            SearchToolsRequest {
                query: "torrents".into(),
                load: true,
                ..Default::default()
            },
            "Required parameter 'conversation_id' is missing (needed with 'load').",
        ),
        (
            SearchToolsRequest {
                query: "torrents".into(),
                conversation_id: "a\u{7}b".into(),
                ..Default::default()
            },
            "control characters",
        ),
    ];
    for (request, message) in cases {
        let e = app.search(request.clone()).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{request:?}");
        assert!(e.message().contains(message), "{request:?}: {}", e.message());
    }
    let many = app
        .search(SearchToolsRequest {
            query: "list".into(),
            limit: 500,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(many.hits.len(), 20, "a larger limit is cut to 20");
    app.stop().await;
}

async fn route_finds_a_domain_by_search_explains_it_and_remembers_it(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    app.set("pihole_url", "http://pi.hole").await;
    app.set("jellyfin_url", "http://media").await;
    let r = app.route("why do I still see ads on my phone?", "c1").await;
    assert!(!r.fallback);
    let pihole = r
        .domains
        .iter()
        .find(|d| d.domain == "pihole")
        .expect("pihole routed");
    assert_eq!(pihole.reason, toolrouter::proto::Reason::Search as i32);
    assert!(pihole.matched_keywords.is_empty());
    assert_eq!(pihole.matched_terms, ["ads"]);
    assert!(pihole.score > 0.0);
    // A search hit joins the conversation like a keyword hit.
    let later = app.route("thanks", "c1").await;
    assert!(!later.fallback);
    assert!(decisions(&later).contains(&("pihole".into(), "REASON_STICKY", vec![])));
    app.stop().await;
}

async fn search_off_routes_by_keywords_only(backend: Backend) {
    let mut app = TestApp::builder_on(backend)
        .config(|c| c.search = SearchMode::Off)
        .spawn()
        .await;
    app.set("pihole_url", "http://pi.hole").await;
    let r = app.route("why do I still see ads on my phone?", "").await;
    assert!(r.fallback);
    assert!(
        r.domains
            .iter()
            .all(|d| d.matched_terms.is_empty() && d.score == 0.0)
    );
    app.stop().await;
}

async fn a_dry_run_records_nothing(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    app.set("qbittorrent_url", "http://nas:8080").await;
    let dry = app.dry_run("are my torrents seeding?", "d1").await;
    assert!(decisions(&dry).contains(&(
        "qbittorrent".into(),
        "REASON_KEYWORD",
        vec!["torrent".into(), "seeding".into()]
    )));
    let after = app.route("thanks", "d1").await;
    assert!(
        after.fallback,
        "the dry run left nothing sticky: {:?}",
        decisions(&after)
    );
    app.stop().await;
}

async fn the_search_tools_meta_tool_follows_load_tool_group_and_can_be_turned_off(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    app.set("pihole_url", "http://pi.hole").await;
    let r = app.route("hello", "").await;
    let names: Vec<&str> = r.tools.iter().take(2).map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["load_tool_group", "search_tools"]);
    let meta = &r.tools[1];
    assert_eq!((meta.domain.as_str(), meta.tier.as_str()), ("", "read"));
    let schema: serde_json::Value = serde_json::from_str(&meta.input_schema_json).unwrap();
    assert_eq!(schema["required"], serde_json::json!(["query"]));
    assert_eq!(schema["properties"]["query"]["type"], "string");
    assert_eq!(schema["properties"]["limit"]["type"], "integer");
    // Fixed for a snapshot: the same schema on every turn.
    let again = app.route("something else entirely", "").await;
    assert_eq!(again.tools[1], r.tools[1]);

    let mut app = app.restart_with(|c| c.expose_search_tools = false).await;
    let r = app.route("hello", "").await;
    assert!(r.tools.iter().all(|t| t.name != "search_tools"));
    assert_eq!(r.tools[0].name, "load_tool_group");
    app.stop().await;
}
