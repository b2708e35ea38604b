//! Profiles, auth tokens bound to them, disabled tools and `CheckToolCall` (SPEC §10), through
//! the real server: a tool outside the consumer's view is invisible in every RPC.

use std::collections::BTreeMap;

use serde_json::Value;
use tonic::Code;
use toolrouter::proto::{Format, ListAllToolsRequest, ListGroupsRequest, RouteRequest};

use crate::helpers::{
    Backend, ProfileConfig, TestApp, TierName, json_of, load_request, reasons, route_request, run,
    search_request, shown,
};

crate::on_both_backends!(
    a_profile_sees_only_its_tools_in_every_rpc,
    disabled_tools_vanish_everywhere_after_an_invalidation,
    check_tool_call_gives_every_reason,
);

/// Jellyfin's and Radarr's read tools: what the `mcp-media` profile sees.
const MEDIA_READ_TOOLS: &[&str] = &[
    "jf_list_libraries",
    "jf_search_items",
    "jf_get_item_details",
    "jf_get_recently_added",
    "jf_get_active_sessions",
    "jf_get_watch_history",
    "radarr_search_movies",
    "radarr_list_movies",
    "radarr_get_calendar",
    "radarr_get_queue",
];

/// The README's example: an MCP server's token that only sees the read tools of two domains,
/// and an operator profile with a budget.
fn profiles() -> BTreeMap<String, ProfileConfig> {
    let mut p = BTreeMap::new();
    p.insert(
        "mcp-media".to_string(),
        ProfileConfig {
            allow_domains: vec!["jellyfin".into(), "radarr".into()],
            max_tier: Some(TierName::Read),
            ..ProfileConfig::default()
        },
    );
    p.insert(
        "ops".to_string(),
        ProfileConfig {
            allow_domains: vec!["docker".into(), "system".into()],
            deny_tools: vec!["docker_*prune*".into(), "docker_remove_*".into()],
            max_tools: Some(12),
            ..ProfileConfig::default()
        },
    );
    p
}

/// The demo registry with Jellyfin, Radarr, Docker and Sonarr configured, and the profiles.
async fn app(backend: Backend) -> TestApp {
    let mut app = TestApp::builder_on(backend)
        .config(|c| c.profiles = profiles())
        .spawn()
        .await;
    for key in ["jellyfin_url", "radarr_url", "docker_host", "sonarr_url"] {
        app.ui.set_setting(key, "http://x").await.unwrap();
    }
    app.invalidate().await.unwrap();
    app
}

fn names(tools: &[toolrouter::proto::Tool]) -> Vec<&str> {
    tools.iter().map(|t| t.name.as_str()).collect()
}

fn json_names(tools_json: &[u8]) -> Vec<String> {
    let v: Value = serde_json::from_slice(tools_json).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_string())
        .collect()
}

fn route_as(message: &str, conversation: &str, profile: &str) -> RouteRequest {
    RouteRequest {
        profile: profile.into(),
        ..route_request(message, conversation)
    }
}

async fn a_profile_sees_only_its_tools_in_every_rpc(backend: Backend) {
    let mut app = app(backend).await;

    // ListAllTools ignores the settings but not the profile: native and rendered agree.
    let all = app
        .list_all_tools_with(ListAllToolsRequest {
            profile: "mcp-media".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(names(&all.tools), MEDIA_READ_TOOLS);
    let groups: Vec<(&str, u32)> = all
        .groups
        .iter()
        .map(|g| (g.name.as_str(), g.tool_count))
        .collect();
    assert_eq!(groups, [("jellyfin", 6), ("radarr", 4)]);
    let rendered = app
        .list_all_tools_with(ListAllToolsRequest {
            profile: "mcp-media".into(),
            format: Format::OpenaiChat.into(),
        })
        .await
        .unwrap();
    assert_eq!(json_names(&rendered.tools_json), MEDIA_READ_TOOLS);
    let group_tokens: u32 = rendered.groups.iter().map(|g| g.tokens).sum();
    assert_eq!(rendered.tokens, group_tokens, "tokens count only the tools shown");
    let everything = app.list_all_tools().await.unwrap();
    assert!(everything.tools.len() > 100, "without a profile, every tool");

    // ListGroups: the groups it sees, with the tools it leaves them; the prompt section too.
    let listed = app
        .client
        .list_groups(ListGroupsRequest {
            profile: "mcp-media".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let listed_names: Vec<&str> = listed.groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(listed_names, ["jellyfin", "radarr"]);
    assert!(listed.prompt_section.contains("- jellyfin:") && listed.prompt_section.contains("- radarr:"));
    assert!(
        !listed.prompt_section.contains("docker"),
        "{}",
        listed.prompt_section
    );

    // Route: a keyword hit routes as usual, with only the tools the profile sees.
    let r = app
        .route_with(route_as("add the movie Dune to radarr", "", "mcp-media"))
        .await
        .unwrap();
    assert_eq!(reasons(&r), [("radarr".to_string(), "REASON_KEYWORD")]);
    let tools = names(&r.tools);
    assert_eq!(
        tools,
        [
            "load_tool_group",
            "search_tools",
            "radarr_search_movies",
            "radarr_list_movies",
            "radarr_get_calendar",
            "radarr_get_queue"
        ]
    );
    let schema: Value = serde_json::from_str(&r.tools[0].input_schema_json).unwrap();
    assert_eq!(
        schema["properties"]["group_name"]["enum"],
        serde_json::json!(["jellyfin", "radarr"]),
        "the meta-tool offers only the groups the profile sees"
    );
    // A hit on a domain the profile hides does not count: fallback over what it sees.
    let r = app
        .route_with(route_as("restart the docker container", "", "mcp-media"))
        .await
        .unwrap();
    assert!(r.fallback);
    assert_eq!(
        reasons(&r),
        [
            ("jellyfin".to_string(), "REASON_FALLBACK"),
            ("radarr".to_string(), "REASON_FALLBACK")
        ]
    );
    let rendered = app
        .route_with(RouteRequest {
            format: Format::OpenaiChat.into(),
            ..route_as("restart the docker container", "", "mcp-media")
        })
        .await
        .unwrap();
    let mut want = vec!["load_tool_group".to_string(), "search_tools".to_string()];
    want.extend(MEDIA_READ_TOOLS.iter().map(|t| t.to_string()));
    assert_eq!(json_names(&rendered.tools_json), want);

    // LoadToolGroup: a group the profile refuses has no tools for it (SPEC §10), an unknown
    // one lists what it may load; one it sees loads its tools.
    let mut load = load_request("c1", "docker");
    load.profile = "mcp-media".into();
    let err = app.load_with(load).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(err.message(), "Tool group 'docker' has no available tools.");
    let mut load = load_request("c1", "nope");
    load.profile = "mcp-media".into();
    let err = app.load_with(load).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(
        err.message(),
        "Tool group 'nope' not found. Available groups: jellyfin, radarr"
    );
    let mut load = load_request("c1", "radarr");
    load.profile = "mcp-media".into();
    let loaded = app.load_with(load).await.unwrap();
    assert_eq!(names(&loaded.tools), &MEDIA_READ_TOOLS[6..]);
    assert_eq!(loaded.group.unwrap().tool_count, 4);
    assert!(!loaded.text.contains("radarr_delete_movie"), "{}", loaded.text);

    // SearchTools finds only tools the profile sees.
    let mut search = search_request("delete a movie");
    search.limit = 20;
    let found = app.search(search.clone()).await.unwrap();
    assert!(
        found
            .hits
            .iter()
            .any(|h| h.tool.as_ref().unwrap().name == "radarr_delete_movie"),
        "without a profile the tool is found"
    );
    search.profile = "mcp-media".into();
    let found = app.search(search).await.unwrap();
    assert!(!found.hits.is_empty());
    for hit in &found.hits {
        let name = hit.tool.as_ref().unwrap().name.as_str();
        assert!(MEDIA_READ_TOOLS.contains(&name), "{name} found under mcp-media");
    }

    // A profile's max_tools is the default budget of its routes, and a ceiling: the two
    // meta-tools and System's 8 fit in 12, Docker's 10 visible tools do not.
    for asked in [0, 100] {
        let r = app
            .route_with(RouteRequest {
                max_tools: asked,
                ..route_as("what can you do?", "", "ops")
            })
            .await
            .unwrap();
        assert_eq!(r.tools.len(), 10, "{asked}: {:?}", names(&r.tools));
        let dropped: Vec<(&str, u32)> = r.dropped.iter().map(|d| (d.domain.as_str(), d.tools)).collect();
        assert_eq!(dropped, [("docker", 10)], "{asked}");
    }
}

#[tokio::test]
async fn an_unknown_profile_is_invalid_in_every_rpc() {
    let mut app = app(Backend::Sqlite).await;
    let want = "Unknown profile 'nope'. Profiles: mcp-media, ops.";
    let check = |r: Result<(), tonic::Status>, rpc: &str| {
        let err = r.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{rpc}");
        assert_eq!(err.message(), want, "{rpc}");
    };
    check(
        app.route_with(route_as("hi", "", "nope")).await.map(drop),
        "Route",
    );
    let mut load = load_request("c", "radarr");
    load.profile = "nope".into();
    check(app.load_with(load).await.map(drop), "LoadToolGroup");
    check(
        app.client
            .list_groups(ListGroupsRequest {
                profile: "nope".into(),
            })
            .await
            .map(drop),
        "ListGroups",
    );
    check(
        app.list_all_tools_with(ListAllToolsRequest {
            profile: "nope".into(),
            ..Default::default()
        })
        .await
        .map(drop),
        "ListAllTools",
    );
    let mut search = search_request("movie");
    search.profile = "nope".into();
    check(app.search(search).await.map(drop), "SearchTools");
    check(
        app.check_call("jf_search_items", "", "nope").await.map(drop),
        "CheckToolCall",
    );
    check(app.watch("nope").await.map(drop), "WatchRegistry");
    // A name is matched as sent, like a group's: padding is not trimmed into another
    // profile's name, and white space alone is not "no profile".
    for (named, shown) in [
        (" ops", " ops"),
        ("ops\t", "ops\\t"),
        (" ", " "),
        ("\u{85}", "\\u{85}"),
    ] {
        let err = app.route_with(route_as("hi", "", named)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{named:?}");
        assert_eq!(
            err.message(),
            format!("Unknown profile '{shown}'. Profiles: mcp-media, ops."),
            "{named:?}"
        );
    }
}

#[tokio::test]
async fn a_token_bound_to_a_profile_uses_it_and_cannot_name_another() {
    let app = TestApp::builder()
        .config(|c| {
            c.profiles = profiles();
            c.auth_token = Some("admin-token".into());
            c.tokens = BTreeMap::from([("media-token".to_string(), "mcp-media".to_string())]);
        })
        .spawn()
        .await;
    let mut media = app.connection_with_token("media-token").client().await.unwrap();
    let tools = |r: toolrouter::proto::ListAllToolsResponse| -> Vec<String> {
        r.tools.into_iter().map(|t| t.name).collect()
    };
    let bound = media
        .list_all_tools(ListAllToolsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        tools(bound),
        MEDIA_READ_TOOLS,
        "the token's profile applies unnamed"
    );
    let named = media
        .list_all_tools(ListAllToolsRequest {
            profile: "mcp-media".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(tools(named), MEDIA_READ_TOOLS, "naming its own profile is fine");
    // A refusal names the token's profile even when the request named none.
    let refused = media
        .check_tool_call(toolrouter::proto::CheckToolCallRequest {
            tool_name: "docker_list_containers".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!refused.allowed);
    assert!(refused.text.contains("profile 'mcp-media'"), "{}", refused.text);
    // Domains its profile hides are not named to it, not even as active.
    app.ui.set_setting("docker_host", "tcp://nas:2375").await.unwrap();
    app.ui.set_setting("radarr_url", "http://nas:7878").await.unwrap();
    let active = media
        .invalidate_settings(toolrouter::proto::InvalidateSettingsRequest {})
        .await
        .unwrap()
        .into_inner()
        .active_domains;
    assert_eq!(active, ["radarr"]);
    let err = media.route(route_as("hi", "", "ops")).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert_eq!(
        err.message(),
        "This auth token is bound to profile 'mcp-media'; it cannot use profile 'ops'."
    );

    // The daemon's own token is bound to no profile: everything, or the profile it names.
    let mut admin = app.connection_with_token("admin-token").client().await.unwrap();
    let all = admin
        .list_all_tools(ListAllToolsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(all.tools.len() > 100);
    let named = admin
        .list_all_tools(ListAllToolsRequest {
            profile: "mcp-media".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(tools(named), MEDIA_READ_TOOLS);
    let err = app
        .connection_with_token("media")
        .client()
        .await
        .unwrap()
        .list_all_tools(ListAllToolsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
}

async fn disabled_tools_vanish_everywhere_after_an_invalidation(backend: Backend) {
    let mut app = app(backend).await;
    let everything = app.list_all_tools().await.unwrap().tools.len();
    app.ui
        .set_setting("toolrouter.disabled_tools", r#"["radarr_delete_*", "jf_*"]"#)
        .await
        .unwrap();
    // On PostgreSQL the table's notification may already have arrived.
    if backend == Backend::Sqlite {
        let before = app.list_all_tools().await.unwrap();
        assert!(
            names(&before.tools).contains(&"radarr_delete_movie"),
            "cached until the TTL or an invalidation"
        );
    }

    app.invalidate().await.unwrap();
    let after = app.list_all_tools().await.unwrap();
    let shown = names(&after.tools);
    assert!(!shown.contains(&"radarr_delete_movie"));
    assert!(!shown.iter().any(|t| t.starts_with("jf_")), "{shown:?}");
    assert_eq!(shown.len(), everything - 9);
    let groups = app.group_names().await;
    assert!(
        !groups.contains(&"jellyfin".to_string()),
        "a group left with no tools is not listed"
    );
    let r = app.route("what can you do?", "").await;
    assert!(r.fallback);
    assert!(!reasons(&r).iter().any(|(d, _)| d == "jellyfin"));
    assert!(!names(&r.tools).contains(&"radarr_delete_movie"));
    let r = app
        .route_with(route_as("what can you do?", "", "mcp-media"))
        .await
        .unwrap();
    assert_eq!(
        reasons(&r),
        [("radarr".to_string(), "REASON_FALLBACK")],
        "disabled tools are hidden under every profile"
    );
    let err = app.load("c", "jellyfin").await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    let mut search = search_request("jf_search_items");
    search.limit = 20;
    let found = app.search(search).await.unwrap();
    assert!(
        !found
            .hits
            .iter()
            .any(|h| h.tool.as_ref().unwrap().name.starts_with("jf_"))
    );
    let check = app.check_call("jf_search_items", "", "").await.unwrap();
    assert!(!check.allowed);
    assert_eq!(check.reason, "disabled");

    // A value that is not a JSON array of names is ignored (and logged): nothing is hidden.
    app.set("toolrouter.disabled_tools", "radarr_delete_movie").await;
    let all = app.list_all_tools().await.unwrap();
    assert_eq!(all.tools.len(), everything);
    app.set("toolrouter.disabled_tools", "").await;
    assert_eq!(app.list_all_tools().await.unwrap().tools.len(), everything);
}

async fn check_tool_call_gives_every_reason(backend: Backend) {
    let mut app = app(backend).await;
    app.set("toolrouter.disabled_tools", r#"["sonarr_delete_series"]"#)
        .await;

    struct Want {
        tool: &'static str,
        conversation: &'static str,
        profile: &'static str,
        allowed: bool,
        visible_now: bool,
        reason: &'static str,
        group: &'static str,
        keys: &'static [&'static str],
    }
    let cases = [
        Want {
            tool: "no_such_tool",
            conversation: "",
            profile: "",
            allowed: false,
            visible_now: false,
            reason: "unknown_tool",
            group: "",
            keys: &[],
        },
        Want {
            tool: "pihole_get_summary",
            conversation: "",
            profile: "",
            allowed: false,
            visible_now: false,
            reason: "not_configured",
            group: "pihole",
            keys: &["pihole_url", "pihole_api_token"],
        },
        Want {
            tool: "sonarr_delete_series",
            conversation: "",
            profile: "",
            allowed: false,
            visible_now: false,
            reason: "disabled",
            group: "sonarr",
            keys: &[],
        },
        Want {
            tool: "radarr_delete_movie",
            conversation: "",
            profile: "mcp-media",
            allowed: false,
            visible_now: false,
            reason: "denied_by_profile",
            group: "",
            keys: &[],
        },
        Want {
            tool: "docker_list_containers",
            conversation: "",
            profile: "mcp-media",
            allowed: false,
            visible_now: false,
            reason: "denied_by_profile",
            group: "",
            keys: &[],
        },
        Want {
            tool: "sys_uptime",
            conversation: "",
            profile: "",
            allowed: true,
            visible_now: true,
            reason: "",
            group: "system",
            keys: &[],
        },
        Want {
            tool: "radarr_list_movies",
            conversation: "",
            profile: "",
            allowed: true,
            visible_now: true,
            reason: "",
            group: "radarr",
            keys: &[],
        },
        // The meta-tools Route starts its answer with may be called too.
        Want {
            tool: "load_tool_group",
            conversation: "c1",
            profile: "",
            allowed: true,
            visible_now: true,
            reason: "",
            group: "",
            keys: &[],
        },
        Want {
            tool: "search_tools",
            conversation: "",
            profile: "mcp-media",
            allowed: true,
            visible_now: true,
            reason: "",
            group: "",
            keys: &[],
        },
    ];
    for w in &cases {
        let r = app.check_call(w.tool, w.conversation, w.profile).await.unwrap();
        assert_eq!(
            (r.allowed, r.visible_now, r.reason.as_str(), r.group.as_str()),
            (w.allowed, w.visible_now, w.reason, w.group),
            "{} under {:?}: {}",
            w.tool,
            w.profile,
            r.text
        );
        assert_eq!(r.settings_keys, w.keys, "{}", w.tool);
        assert!(!r.text.is_empty());
    }

    // In a conversation with a sticky hit there is no fallback: other groups need a load.
    app.route("add the movie Dune to radarr", "c1").await;
    let r = app.check_call("docker_list_containers", "c1", "").await.unwrap();
    assert!(!r.allowed && !r.visible_now);
    assert_eq!((r.reason.as_str(), r.group.as_str()), ("needs_load", "docker"));
    assert!(r.text.contains("load group 'docker'"), "{}", r.text);
    let r = app.check_call("radarr_add_movie", "c1", "").await.unwrap();
    assert!(r.allowed && r.visible_now, "the sticky group's tools: {}", r.text);
    app.load("c1", "docker").await.unwrap();
    let r = app.check_call("docker_list_containers", "c1", "").await.unwrap();
    assert!(r.allowed && r.visible_now, "after the load: {}", r.text);
    // What CheckToolCall says agrees with what Route answers.
    let routed = app.dry_run("hello", "c1").await;
    assert!(names(&routed.tools).contains(&"docker_list_containers"));

    let err = app.check_call(" ", "", "").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(err.message(), "Required parameter 'tool_name' is missing.");
}

#[tokio::test]
async fn a_meta_tool_may_be_called_exactly_when_answers_carry_it() {
    let mut app = TestApp::builder()
        .config(|c| c.expose_search_tools = false)
        .spawn()
        .await;
    // Only the core domain is active: no group to load, so no meta-tool at all.
    for tool in ["load_tool_group", "search_tools"] {
        let r = app.check_call(tool, "", "").await.unwrap();
        assert_eq!(
            (r.allowed, r.visible_now, r.reason.as_str()),
            (false, false, "unknown_tool"),
            "{tool}"
        );
    }
    app.set("radarr_url", "http://x").await;
    let routed = app.dry_run("hello", "").await;
    assert_eq!(names(&routed.tools)[0], "load_tool_group");
    assert!(!names(&routed.tools).contains(&"search_tools"));
    let r = app.check_call("load_tool_group", "", "").await.unwrap();
    assert_eq!(
        (r.allowed, r.visible_now, r.reason.as_str()),
        (true, true, ""),
        "{}",
        r.text
    );
    assert_eq!(r.text, "Tool 'load_tool_group' may be called now.");
    // Switched off, it is no tool of the daemon's.
    let r = app.check_call("search_tools", "", "").await.unwrap();
    assert_eq!(
        (r.allowed, r.reason.as_str()),
        (false, "unknown_tool"),
        "{}",
        r.text
    );
}

#[tokio::test]
async fn the_cli_checks_a_call_and_lists_under_a_profile() {
    let mut app = app(Backend::Sqlite).await;
    app.route("add the movie Dune to radarr", "c1").await;
    let addr = format!("http://{}", app.addr);
    let out = run(
        app.dir(),
        &[
            "check-call",
            "docker_list_containers",
            "--conversation",
            "c1",
            "--addr",
            &addr,
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("load group 'docker' first"), "{stdout}");
    assert!(
        stdout.contains("allowed: no; visible now: no; reason: needs_load"),
        "{stdout}"
    );

    let out = run(
        app.dir(),
        &[
            "check-call",
            "radarr_delete_movie",
            "--profile",
            "mcp-media",
            "--json",
            "--addr",
            &addr,
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let answer = json_of(&out);
    assert_eq!(answer["reason"], "denied_by_profile", "{answer}");

    let out = run(
        app.dir(),
        &["tools", "--profile", "mcp-media", "--json", "--addr", &addr],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let listed: Vec<String> = json_of(&out)["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(listed, MEDIA_READ_TOOLS);

    let out = run(app.dir(), &["groups", "--profile", "nope", "--addr", &addr]).await;
    assert_eq!(out.status.code(), Some(1), "{}", shown(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Unknown profile 'nope'"),
        "{}",
        shown(&out)
    );
}
