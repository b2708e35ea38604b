//! Provider formats, token counts and budgets (SPEC §6, §9) through the real server: every
//! format on every RPC that takes one, `tools_json` holding the same tools as the native
//! answer in the same order, `tokens` the sum of each tool's count, and whole domains
//! dropped to fit `max_tools` / `token_budget` in the SPEC's order.

use serde_json::Value;
use tonic::Code;
use toolrouter::proto::{
    Format, ListAllToolsRequest, LoadToolGroupRequest, Reason, RouteRequest, RouteResponse,
    SearchToolsRequest,
};
use toolrouter::render::count_tokens;

use crate::helpers::{Backend, TestApp, demo_registry, route_request, spawn_app, spawn_app_on};

crate::on_both_backends!(
    route_answers_every_format_with_the_native_tools_in_the_same_order,
    load_list_all_and_search_answer_every_format,
    an_unknown_format_is_an_invalid_argument_on_every_rpc,
    over_max_tools_the_largest_fallback_domains_are_dropped_and_stay_loadable,
    core_keyword_and_meta_tools_are_sent_even_over_the_budget,
    a_loaded_group_is_never_dropped_even_when_search_hits_it,
    the_server_default_budget_applies_unless_the_request_gives_one,
    a_server_token_budget_of_0_is_no_budget_as_max_tools_0_is_no_limit,
    the_default_max_tools_is_openais_128_and_the_demo_fits,
    include_prompt_section_answers_list_groups_prompt_section,
    a_fallback_answer_served_again_is_the_answer_built_for_its_decision,
);

const FORMATS: [Format; 5] = [
    Format::OpenaiChat,
    Format::OpenaiResponses,
    Format::Anthropic,
    Format::Gemini,
    Format::Mcp,
];

/// Sets every settings key of the demo registry, so every domain is active.
async fn activate_all(app: &mut TestApp) {
    for d in demo_registry().domains() {
        for k in &d.settings_keys {
            app.ui.set_setting(k, "set").await.unwrap();
        }
    }
    app.invalidate().await.unwrap();
}

/// The tool names of a `tools_json` array, and the sum of each element's tokens.
fn names_and_tokens(format: Format, json: &[u8]) -> (Vec<String>, u32) {
    let array: Vec<Value> = serde_json::from_slice(json).expect("tools_json is a JSON array");
    let mut tokens = 0;
    let names = array
        .iter()
        .map(|t| {
            // Each element re-serialised compactly is exactly the bytes the daemon rendered.
            tokens += count_tokens(&t.to_string()) as u32;
            let name = if format == Format::OpenaiChat {
                &t["function"]["name"]
            } else {
                &t["name"]
            };
            name.as_str().expect("a name").to_string()
        })
        .collect();
    (names, tokens)
}

fn route_in(message: &str, conversation: &str, format: Format) -> RouteRequest {
    RouteRequest {
        format: format.into(),
        ..route_request(message, conversation)
    }
}

fn tool_names(r: &RouteResponse) -> Vec<String> {
    r.tools.iter().map(|t| t.name.clone()).collect()
}

async fn route_answers_every_format_with_the_native_tools_in_the_same_order(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    activate_all(&mut app).await;
    for message in [
        "thanks",
        "are my torrents seeding? also restart the docker container",
    ] {
        let native = app.route(message, "").await;
        assert!(native.tools_json.is_empty(), "native answers carry no JSON");
        let expected = tool_names(&native);
        assert_eq!(&expected[..2], ["load_tool_group", "search_tools"]);
        for format in FORMATS {
            let r = app.route_with(route_in(message, "", format)).await.unwrap();
            assert!(r.tools.is_empty(), "{format:?}: the tools are sent once, as JSON");
            let (names, tokens) = names_and_tokens(format, &r.tools_json);
            assert_eq!(names, expected, "{format:?}");
            assert_eq!(r.tokens, tokens, "{format:?}: the sum of the tools' tokens");
            assert_eq!(r.domains.len(), native.domains.len());
            let meta: u32 = names_and_tokens(format, &meta_json(&r, format)).1;
            let per_domain: u32 = r.domains.iter().map(|d| d.tokens).sum();
            assert_eq!(per_domain + meta, r.tokens, "{format:?}: domains plus meta-tools");
            if format == Format::OpenaiChat {
                assert_eq!(native.tokens, r.tokens, "native counts as OpenAI chat");
                let native_domains: Vec<u32> = native.domains.iter().map(|d| d.tokens).collect();
                let chat_domains: Vec<u32> = r.domains.iter().map(|d| d.tokens).collect();
                assert_eq!(native_domains, chat_domains);
            }
        }
    }
    app.stop().await;
}

/// The meta-tools' elements of a `tools_json` answer (its first two), as an array.
fn meta_json(r: &RouteResponse, _format: Format) -> Vec<u8> {
    let array: Vec<Value> = serde_json::from_slice(&r.tools_json).unwrap();
    serde_json::to_vec(&array[..2]).unwrap()
}

async fn load_list_all_and_search_answer_every_format(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    activate_all(&mut app).await;
    let native_all = app.list_all_tools().await.unwrap();
    let all_names: Vec<String> = native_all.tools.iter().map(|t| t.name.clone()).collect();
    let native_load = app.load("c1", "docker").await.unwrap();
    let load_names: Vec<String> = native_load.tools.iter().map(|t| t.name.clone()).collect();
    let search = |format: Format| SearchToolsRequest {
        query: "restart a container".into(),
        format: format.into(),
        ..Default::default()
    };
    let native_search = app.search(search(Format::Unspecified)).await.unwrap();
    assert!(native_search.tools_json.is_empty());
    let hit_names: Vec<String> = native_search
        .hits
        .iter()
        .map(|h| h.tool.as_ref().unwrap().name.clone())
        .collect();
    assert!(!hit_names.is_empty());
    for format in FORMATS {
        let all = app
            .list_all_tools_with(ListAllToolsRequest {
                format: format.into(),
                ..Default::default()
            })
            .await
            .unwrap();
        let (names, tokens) = names_and_tokens(format, &all.tools_json);
        assert_eq!(names, all_names, "{format:?}: no meta-tool, core first");
        assert_eq!(all.tokens, tokens, "{format:?}");
        assert!(all.tools.is_empty());
        if format == Format::OpenaiChat {
            let groups: u32 = all.groups.iter().map(|g| g.tokens).sum();
            assert_eq!(groups, tokens, "Group.tokens are OpenAI chat tokens");
            assert_eq!(native_all.tokens, tokens);
        }

        let load = app
            .load_with(LoadToolGroupRequest {
                conversation_id: "c1".into(),
                group_name: "docker".into(),
                format: format.into(),
                ..Default::default()
            })
            .await
            .unwrap();
        let (names, tokens) = names_and_tokens(format, &load.tools_json);
        assert_eq!(names, load_names, "{format:?}");
        assert_eq!(load.tokens, tokens);
        assert!(load.tools.is_empty() && load.already_loaded);

        let found = app.search(search(format)).await.unwrap();
        let (names, _) = names_and_tokens(format, &found.tools_json);
        assert_eq!(names, hit_names, "{format:?}: the hits' tools, best first");
    }
    app.stop().await;
}

async fn an_unknown_format_is_an_invalid_argument_on_every_rpc(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    let route = RouteRequest {
        format: 99,
        ..route_request("hello", "")
    };
    let e = app.route_with(route).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(e.message(), "'format' has an unknown value 99.");
    let e = app
        .list_all_tools_with(ListAllToolsRequest {
            format: 6,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = app
        .load_with(LoadToolGroupRequest {
            conversation_id: "c".into(),
            group_name: "system".into(),
            format: -1,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = app
        .search(SearchToolsRequest {
            query: "x".into(),
            format: 7,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    app.stop().await;
}

fn dropped(r: &RouteResponse) -> Vec<(String, Reason)> {
    r.dropped.iter().map(|d| (d.domain.clone(), d.reason())).collect()
}

async fn over_max_tools_the_largest_fallback_domains_are_dropped_and_stay_loadable(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    activate_all(&mut app).await;
    let full = app
        .route_with(RouteRequest {
            max_tools: 10_000,
            ..route_request("thanks", "")
        })
        .await
        .unwrap();
    assert!(full.dropped.is_empty());
    assert!(full.tools.len() > 60);
    let r = app
        .route_with(RouteRequest {
            max_tools: 40,
            ..route_request("thanks", "c1")
        })
        .await
        .unwrap();
    assert!(r.tools.len() <= 40, "{} tools", r.tools.len());
    assert!(!r.dropped.is_empty());
    // Dropped: fallback domains, most tokens first (ties by name), and only as many as needed.
    let mut by_tokens: Vec<(u32, String)> = full
        .domains
        .iter()
        .filter(|d| d.reason() == Reason::Fallback)
        .map(|d| (d.tokens, d.domain.clone()))
        .collect();
    by_tokens.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let expected: Vec<(String, Reason)> = by_tokens
        .iter()
        .take(r.dropped.len())
        .map(|(_, d)| (d.clone(), Reason::Fallback))
        .collect();
    assert_eq!(dropped(&r), expected);
    let last = r.dropped.last().unwrap();
    assert!(
        r.tools.len() + last.tools as usize > 40,
        "without dropping the last one it would not fit"
    );
    for d in &r.dropped {
        let tokens = full.domains.iter().find(|f| f.domain == d.domain).unwrap().tokens;
        assert_eq!(d.tokens, tokens);
        assert!(!r.domains.iter().any(|k| k.domain == d.domain));
        app.load("c1", &d.domain)
            .await
            .expect("a dropped domain stays loadable");
    }
    // Loaded now, so never dropped again.
    let again = app
        .route_with(RouteRequest {
            max_tools: 40,
            ..route_request("thanks", "c1")
        })
        .await
        .unwrap();
    for d in &r.dropped {
        assert!(
            again
                .domains
                .iter()
                .any(|k| k.domain == d.domain && k.reason() == Reason::Loaded)
        );
    }
    app.stop().await;
}

async fn core_keyword_and_meta_tools_are_sent_even_over_the_budget(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    activate_all(&mut app).await;
    let r = app
        .route_with(RouteRequest {
            max_tools: 1,
            token_budget: 1,
            ..route_request("are my torrents seeding?", "")
        })
        .await
        .unwrap();
    let reasons: Vec<(String, Reason)> = r.domains.iter().map(|d| (d.domain.clone(), d.reason())).collect();
    assert_eq!(
        reasons,
        vec![
            ("system".to_string(), Reason::Core),
            ("qbittorrent".to_string(), Reason::Keyword)
        ]
    );
    assert!(r.dropped.is_empty());
    assert!(r.tools.len() > 1);
    app.stop().await;
}

async fn a_loaded_group_is_never_dropped_even_when_search_hits_it(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    activate_all(&mut app).await;
    app.load("c1", "docker").await.unwrap();
    // The message's first reason for docker is its search hit; it is still a loaded group.
    let message = "restart the nginx service";
    let probe = app.dry_run(message, "").await;
    assert!(
        probe
            .domains
            .iter()
            .any(|d| d.domain == "docker" && d.reason() == Reason::Search),
        "the message must reach docker by search: {:?}",
        probe
            .domains
            .iter()
            .map(|d| (&d.domain, d.reason()))
            .collect::<Vec<_>>()
    );
    let r = app
        .route_with(RouteRequest {
            max_tools: 5,
            ..route_request(message, "c1")
        })
        .await
        .unwrap();
    assert!(
        r.domains
            .iter()
            .any(|d| d.domain == "docker" && d.reason() == Reason::Search),
        "{:?}",
        dropped(&r)
    );
    assert!(
        !r.dropped.iter().any(|d| d.domain == "docker"),
        "{:?}",
        dropped(&r)
    );
    assert!(r.tools.iter().any(|t| t.name.starts_with("docker_")));
    app.stop().await;
}

async fn the_server_default_budget_applies_unless_the_request_gives_one(backend: Backend) {
    let mut app = TestApp::builder_on(backend)
        .config(|c| {
            c.max_tools = 30;
            c.token_budget = Some(100_000);
        })
        .spawn()
        .await;
    activate_all(&mut app).await;
    let r = app.route("thanks", "").await;
    assert!(r.tools.len() <= 30 && !r.dropped.is_empty());
    let wider = app
        .route_with(RouteRequest {
            max_tools: 1000,
            ..route_request("thanks", "")
        })
        .await
        .unwrap();
    assert!(wider.tools.len() > 30 && wider.dropped.is_empty());
    let tight = app
        .route_with(RouteRequest {
            max_tools: 1000,
            token_budget: 3_000,
            format: Format::Anthropic.into(),
            ..route_request("thanks", "")
        })
        .await
        .unwrap();
    assert!(!tight.dropped.is_empty());
    assert!(tight.tokens <= 3_000, "{} tokens", tight.tokens);
    app.stop().await;
}

async fn a_server_token_budget_of_0_is_no_budget_as_max_tools_0_is_no_limit(backend: Backend) {
    let mut app = TestApp::builder_on(backend)
        .config(|c| {
            c.max_tools = 0;
            c.token_budget = Some(0);
        })
        .spawn()
        .await;
    activate_all(&mut app).await;
    let r = app.route("thanks", "").await;
    assert!(r.dropped.is_empty(), "{:?}", r.dropped);
    assert!(r.tools.len() > 100, "{} tools", r.tools.len());
    app.stop().await;
}

async fn the_default_max_tools_is_openais_128_and_the_demo_fits(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    activate_all(&mut app).await;
    let r = app.route("thanks", "").await;
    assert!(r.dropped.is_empty(), "113 tools fit under 128");
    assert!(r.tools.len() <= 128);
    app.stop().await;
}

async fn include_prompt_section_answers_list_groups_prompt_section(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    app.set("qbittorrent_url", "http://nas:8080").await;
    let plain = app.route("hello", "").await;
    assert!(plain.prompt_section.is_empty());
    let r = app
        .route_with(RouteRequest {
            include_prompt_section: true,
            ..route_request("hello", "")
        })
        .await
        .unwrap();
    let groups = app.list_groups().await.unwrap();
    assert!(!r.prompt_section.is_empty());
    assert_eq!(r.prompt_section, groups.prompt_section);
    app.stop().await;
}

#[tokio::test]
async fn the_cli_route_shows_tokens_and_prints_a_formats_json() {
    use crate::helpers::{run, shown};
    let mut app = spawn_app().await;
    app.set("qbittorrent_url", "http://nas:8080").await;
    let addr = app.addr.to_string();
    let message = "are my torrents seeding?";
    let answer = app.route(message, "").await;
    let out = run(app.dir(), &["route", "--addr", &addr, message]).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.lines().next().unwrap().ends_with("TOOLS  TOKENS"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(", {} tokens;", answer.tokens)),
        "{stdout}"
    );
    let out = run(
        app.dir(),
        &["route", "--addr", &addr, "--format", "anthropic", message],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let (names, _) = names_and_tokens(Format::Anthropic, &out.stdout);
    assert_eq!(names, tool_names(&answer));
    let out = run(app.dir(), &["route", "--addr", &addr, "--format", "xml", message]).await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    app.stop().await;
}

#[tokio::test]
async fn check_counts_each_domains_tokens_exactly() {
    use crate::helpers::{json_of, manifest_dir, run, shown, temp_dir};
    let dir = temp_dir();
    let folder = manifest_dir(
        dir.path(),
        "m",
        &[
            (
                "a.json",
                r#"{"name":"a","tools":[{"name":"t","description":"T","tier":"read"}]}"#,
            ),
            (
                "b.json",
                r#"{"name":"b","tools":[{"name":"u","description":"U","tier":"read"},{"name":"v","description":"V","tier":"read"}]}"#,
            ),
        ],
    );
    let out = run(dir.path(), &["check", "--json", folder.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let v = json_of(&out);
    let one = |name: &str| {
        count_tokens(&format!(
            r#"{{"type":"function","function":{{"name":"{name}","description":"{}","parameters":{{"type":"object","properties":{{}}}}}}}}"#,
            name.to_uppercase()
        )) as u64
    };
    let a = one("t");
    let b = one("u") + one("v");
    assert_eq!(v["domainTokens"][0]["tokens"], a, "{v}");
    assert_eq!(v["domainTokens"][1]["tokens"], b, "{v}");
    assert_eq!(v["schemaTokens"], a + b, "{v}");
    let out = run(dir.path(), &["check", folder.to_str().unwrap()]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(&format!("{} schema tokens", a + b)), "{stdout}");
}

/// A fallback's answer parts are built once per view, profile and format and served again to
/// every message that gets the same decision: served again, in every format, they are what
/// was built, a fallback of another decision (a loaded group) gets its own, and a settings
/// change (a new view) builds them anew.
async fn a_fallback_answer_served_again_is_the_answer_built_for_its_decision(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    for key in ["radarr_url", "sonarr_url", "proxmox_url"] {
        app.ui.set_setting(key, "set").await.unwrap();
    }
    app.invalidate().await.unwrap();
    let ask = |message: &str, conversation: &str, format: Format| RouteRequest {
        format: format.into(),
        ..route_request(message, conversation)
    };
    app.load("c1", "proxmox").await.unwrap();
    for format in std::iter::once(Format::Unspecified).chain(FORMATS) {
        let first = app.route_with(ask("hello there", "", format)).await.unwrap();
        assert!(first.fallback);
        assert_eq!(
            crate::helpers::reasons(&first),
            [
                ("system", "REASON_CORE"),
                ("radarr", "REASON_FALLBACK"),
                ("sonarr", "REASON_FALLBACK")
            ]
            .map(|(d, r)| (d.to_string(), r)),
            "{format:?}"
        );
        // The same tools as a keyword hit on every fallback domain, assembled per domain.
        let hit = app
            .route_with(ask("a film or a series", "", format))
            .await
            .unwrap();
        assert!(!hit.fallback);
        assert_eq!(first.tools, hit.tools, "{format:?}");
        assert_eq!(first.tools_json, hit.tools_json, "{format:?}");
        assert_eq!(first.tokens, hit.tokens, "{format:?}");
        // Another message without a hit: the same answer, whatever was answered between.
        let again = app.route_with(ask("thanks!", "", format)).await.unwrap();
        assert_eq!(again, first, "{format:?}");
        // A fallback with a group loaded is another decision, with its own answer.
        let loaded = app.route_with(ask("hello there", "c1", format)).await.unwrap();
        assert!(loaded.fallback);
        assert!(
            crate::helpers::reasons(&loaded).contains(&("proxmox".to_string(), "REASON_LOADED")),
            "{format:?}: {:?}",
            crate::helpers::reasons(&loaded)
        );
        assert_ne!(loaded.tokens, first.tokens, "{format:?}");
        let again = app.route_with(ask("ok", "", format)).await.unwrap();
        assert_eq!(again, first, "{format:?}");
    }
    // A settings change makes a new view: its fallback has the newly active domain.
    app.set("jellyfin_url", "set").await;
    for format in std::iter::once(Format::Unspecified).chain(FORMATS) {
        let r = app.route_with(ask("hello there", "", format)).await.unwrap();
        assert!(
            crate::helpers::reasons(&r).contains(&("jellyfin".to_string(), "REASON_FALLBACK")),
            "{format:?}"
        );
        let hit = app
            .route_with(ask("a film or a series on jellyfin", "", format))
            .await
            .unwrap();
        assert_eq!(
            (r.tools, r.tools_json, r.tokens),
            (hit.tools, hit.tools_json, hit.tokens)
        );
    }
    app.stop().await;
}
