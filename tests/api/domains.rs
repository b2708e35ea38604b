//! UpsertDomain and DeleteDomain: domains registered at run time are validated as manifest
//! files are, served like them, stored in the database (so they survive restarts and
//! reloads), refused for names the manifests define, and never half-applied.

use tonic::Code;

use crate::helpers::{
    Backend, Daemon, ProfileConfig, TestApp, db_url, decisions, demo_registry, json_lines, json_of,
    manifest_dir, next_event, run, search_request, shown, spawn_app, spawn_app_on, temp_dir,
};

crate::on_both_backends!(
    an_upserted_domain_is_served_everywhere_and_a_second_upsert_replaces_it,
    a_deleted_domain_is_gone_and_an_unknown_name_is_not_found_with_the_registered_ones,
    run_time_domains_survive_a_restart_and_a_reload_with_the_same_version,
    a_domain_the_manifests_define_cannot_be_replaced_or_deleted_at_run_time,
    invalid_manifests_are_refused_naming_every_problem_and_nothing_changes,
    a_database_fault_during_an_upsert_or_a_delete_leaves_the_registry_unchanged,
    concurrent_upserts_all_land_in_the_registry_and_the_database,
    a_stored_domain_that_no_longer_fits_is_left_out_at_start_and_comes_back_when_it_fits,
    watchers_hear_of_each_upsert_and_delete_and_profiles_apply_to_run_time_domains,
);

/// A domain `lab` with one tool and the keyword `oscilloscope`.
const LAB: &str = r#"{
  "name": "lab",
  "display_name": "Lab bench",
  "description": "Bench instruments: oscilloscope captures and the power supply",
  "keywords": ["oscilloscope"],
  "tools": [
    {"name": "lab_capture_waveform", "description": "Capture a waveform from the oscilloscope", "tier": "read",
     "input_schema": {"type": "object", "properties": {"channel": {"type": "integer"}}, "required": ["channel"]}}
  ]
}"#;

/// `lab` again, with a second tool.
fn lab_with_two_tools() -> String {
    let mut lab: serde_json::Value = serde_json::from_str(LAB).unwrap();
    lab["tools"].as_array_mut().unwrap().push(serde_json::json!({
        "name": "lab_set_voltage",
        "description": "Set the bench power supply's output voltage",
        "tier": "modify"
    }));
    lab.to_string()
}

/// A minimal always-active domain `name` whose one tool is `tool`.
fn domain(name: &str, tool: &str) -> String {
    format!(r#"{{"name":"{name}","tools":[{{"name":"{tool}","description":"Does {name} things"}}]}}"#)
}

/// A server on a manifest folder holding one domain, `base` (tool `base_tool`), so a test can
/// change the folder and reload.
async fn on_a_manifest_folder(backend: Backend) -> TestApp {
    let base = domain("base", "base_tool");
    TestApp::builder_on(backend)
        .manifests(&[("base.json", &base)])
        .spawn()
        .await
}

/// The names of every tool `ListAllTools` answers, and its registry version.
async fn all_tools(app: &mut TestApp) -> (Vec<String>, u64) {
    let r = app.list_all_tools().await.unwrap();
    (r.tools.into_iter().map(|t| t.name).collect(), r.registry_version)
}

/// The stored run-time domains' names, read from another connection.
async fn stored(app: &TestApp) -> Vec<String> {
    let rows = app.ui.read_domains().await.unwrap();
    rows.into_iter().map(|(name, _)| name).collect()
}

async fn an_upserted_domain_is_served_everywhere_and_a_second_upsert_replaces_it(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    let demo = demo_registry().version();

    let first = app.upsert_domain(LAB).await.unwrap();
    assert_eq!(
        (first.domain.as_str(), first.created, first.tools),
        ("lab", true, 1)
    );
    assert_ne!(first.registry_version, demo);

    let (tools, version) = all_tools(&mut app).await;
    assert!(tools.contains(&"lab_capture_waveform".to_string()), "{tools:?}");
    assert_eq!(version, first.registry_version);
    let groups = app.list_groups().await.unwrap();
    let lab = groups.groups.iter().find(|g| g.name == "lab").expect("listed");
    assert_eq!(
        (lab.display_name.as_str(), lab.tool_count, lab.active),
        ("Lab bench", 1, true)
    );
    assert_eq!(groups.registry_version, first.registry_version);
    let routed = app.route("capture the oscilloscope trace", "").await;
    assert!(
        decisions(&routed).contains(&("lab".into(), "REASON_KEYWORD", vec!["oscilloscope".into()])),
        "{:?}",
        decisions(&routed)
    );
    assert_eq!(routed.registry_version, first.registry_version);
    let found = app.search(search_request("waveform")).await.unwrap();
    assert_eq!(found.hits[0].tool.as_ref().unwrap().name, "lab_capture_waveform");

    let second = app.upsert_domain(&lab_with_two_tools()).await.unwrap();
    assert_eq!((second.created, second.tools), (false, 2));
    assert_ne!(second.registry_version, first.registry_version);
    let (tools, _) = all_tools(&mut app).await;
    assert!(tools.contains(&"lab_set_voltage".to_string()), "{tools:?}");

    // The version is the content's: the same manifest gives the same version again.
    let again = app.upsert_domain(LAB).await.unwrap();
    assert_eq!(
        (again.created, again.registry_version),
        (false, first.registry_version)
    );
    let (tools, _) = all_tools(&mut app).await;
    assert!(
        !tools.contains(&"lab_set_voltage".to_string()),
        "replaced whole: {tools:?}"
    );
    assert_eq!(stored(&app).await, ["lab"]);
    app.stop().await;
}

async fn a_deleted_domain_is_gone_and_an_unknown_name_is_not_found_with_the_registered_ones(
    backend: Backend,
) {
    let mut app = spawn_app_on(backend).await;
    let demo = demo_registry().version();
    app.upsert_domain(LAB).await.unwrap();
    app.upsert_domain(&domain("bench", "bench_tool")).await.unwrap();

    let deleted = app.delete_domain("lab").await.unwrap();
    assert!(deleted.deleted);
    let (tools, version) = all_tools(&mut app).await;
    assert_eq!(version, deleted.registry_version);
    assert!(!tools.contains(&"lab_capture_waveform".to_string()), "{tools:?}");
    assert!(!app.group_names().await.contains(&"lab".to_string()));
    let routed = app.route("capture the oscilloscope trace", "").await;
    assert!(routed.tools.iter().all(|t| t.domain != "lab"), "{routed:?}");
    assert_eq!(stored(&app).await, ["bench"]);

    let err = app.delete_domain("lab").await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(
        err.message(),
        "Run-time domain 'lab' not found. Domains registered at run time: bench"
    );
    assert_eq!(app.delete_domain("bench").await.unwrap().registry_version, demo);
    let err = app.delete_domain(" ").await.unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (Code::InvalidArgument, "Required parameter 'name' is missing.")
    );
    app.stop().await;
}

async fn run_time_domains_survive_a_restart_and_a_reload_with_the_same_version(backend: Backend) {
    let mut app = on_a_manifest_folder(backend).await;
    app.upsert_domain(LAB).await.unwrap();
    app.upsert_domain(&domain("gone", "gone_tool")).await.unwrap();
    let version = app.delete_domain("gone").await.unwrap().registry_version;

    let mut app = app.restart().await;
    assert_eq!(
        app.group_names().await,
        ["base", "lab"],
        "kept, and the deleted one stays deleted"
    );
    let (tools, after_restart) = all_tools(&mut app).await;
    assert_eq!(after_restart, version);
    assert_eq!(tools, ["base_tool", "lab_capture_waveform"]);

    // A reload re-reads the manifest files and keeps the run-time domains.
    std::fs::write(app.manifests().join("more.json"), domain("more", "more_tool")).unwrap();
    let reloaded = app.reload().await.unwrap();
    assert_eq!((reloaded.domains, reloaded.tools), (3, 3));
    assert_eq!(app.group_names().await, ["base", "lab", "more"]);
    std::fs::remove_file(app.manifests().join("more.json")).unwrap();
    assert_eq!(app.reload().await.unwrap().registry_version, version);
    app.stop().await;
}

async fn a_domain_the_manifests_define_cannot_be_replaced_or_deleted_at_run_time(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    let err = app
        .upsert_domain(&domain("sonarr", "my_sonarr_tool"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    assert!(
        err.message()
            .starts_with("Domain 'sonarr' comes from the manifests the daemon loads (sonarr.json)"),
        "{}",
        err.message()
    );
    let err = app.delete_domain("sonarr").await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    // The demo's manifests are built in: there is no file to remove.
    assert!(
        err.message().contains("'sonarr'")
            && err.message().contains("cannot be deleted")
            && err
                .message()
                .ends_with("it is built in; serve your own manifests with --manifests."),
        "{}",
        err.message()
    );
    let (tools, version) = all_tools(&mut app).await;
    assert_eq!(version, demo_registry().version());
    assert!(!tools.contains(&"my_sonarr_tool".to_string()));
    assert!(stored(&app).await.is_empty());
    app.stop().await;
}

async fn invalid_manifests_are_refused_naming_every_problem_and_nothing_changes(backend: Backend) {
    let mut app = TestApp::builder_on(backend)
        .config(|c| c.max_message_bytes = 1000)
        .spawn()
        .await;
    let demo = demo_registry().version();
    let cases: &[(&str, &[&str])] = &[
        (r#"{"name": "mine","#, &["manifest_json:1:", "malformed JSON"]),
        (
            r#"{"name": "mine", "keywrods": ["x"]}"#,
            &["upsert:mine", "unknown field `keywrods`"],
        ),
        (
            r#"{"name": "mine", "tools": [{"name": "bad name!", "description": "d"}]}"#,
            &["upsert:mine", "tool #1 `bad name!`: tool name is invalid"],
        ),
        (
            r#"{"name": "mine", "tools": [{"name": "t1", "description": "d",
                "input_schema": {"type": "object", "properties": {"a": {"type": "banana"}}}}]}"#,
            &["upsert:mine", "`input_schema` is not a valid JSON Schema"],
        ),
        (
            r#"{"name": "mine", "tools": [{"name": "t1", "description": "d",
                "input_schema": {"type": "object", "properties": {}, "required": ["x"]}}]}"#,
            &["upsert:mine", "lists `x` in `required`"],
        ),
        (
            r#"{"name": "mine", "tools": [{"name": "sonarr_list_series", "description": "d"}]}"#,
            &[
                "tool `sonarr_list_series` is defined in two domains: `sonarr` (sonarr.json) and `mine` (upsert:mine)",
            ],
        ),
        (
            r#"{"name": "mine", "keywrods": [], "tools": [{"name": "bad name!", "description": " "}]}"#,
            &[
                "unknown field `keywrods`",
                "tool name is invalid",
                "`description` is empty",
            ],
        ),
        (
            r#"[{"name": "t1", "description": "d"}]"#,
            &["group-array manifest", "native manifest"],
        ),
        ("name = \"mine\"\n", &["malformed JSON", "TOML"]),
    ];
    for (manifest, wants) in cases {
        let err = app.upsert_domain(manifest).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{manifest}: {}", err.message());
        assert!(
            err.message()
                .starts_with("The domain is refused; nothing changed.\n"),
            "{manifest}: {}",
            err.message()
        );
        for want in *wants {
            assert!(
                err.message().contains(want),
                "{manifest}: want {want:?} in:\n{}",
                err.message()
            );
        }
    }
    for blank in ["", " \n"] {
        let err = app.upsert_domain(blank).await.unwrap_err();
        assert_eq!(
            (err.code(), err.message()),
            (
                Code::InvalidArgument,
                "Required parameter 'manifest_json' is missing."
            )
        );
    }
    // At most 16 times max_message_bytes: exactly the limit is accepted.
    let padded = |len: usize| format!("{LAB:<len$}");
    let err = app.upsert_domain(&padded(16_001)).await.unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (
            Code::InvalidArgument,
            "'manifest_json' is 16001 bytes, over the limit of 16000 bytes (16 times max_message_bytes)."
        )
    );
    let (_, version) = all_tools(&mut app).await;
    assert_eq!(version, demo, "nothing changed");
    assert!(stored(&app).await.is_empty(), "nothing stored");
    assert!(app.upsert_domain(&padded(16_000)).await.unwrap().created);
    app.stop().await;
}

async fn a_database_fault_during_an_upsert_or_a_delete_leaves_the_registry_unchanged(backend: Backend) {
    let mut app = TestApp::builder_on(backend)
        .config(|c| c.busy_timeout = std::time::Duration::from_millis(200))
        .spawn()
        .await;
    let demo = demo_registry().version();
    let lock = crate::helpers::WriteLock::on(&app).await;
    let err = app.upsert_domain(LAB).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    // SQLite: "database is locked"; PostgreSQL: a lock or statement timeout.
    let cause = match backend {
        Backend::Sqlite => "locked",
        Backend::Postgres => "timeout",
    };
    assert!(err.message().contains(cause), "{}", err.message());
    let (tools, version) = all_tools(&mut app).await;
    assert_eq!(version, demo);
    assert!(!tools.contains(&"lab_capture_waveform".to_string()));
    lock.release().await;
    assert!(stored(&app).await.is_empty());
    let upserted = app.upsert_domain(LAB).await.unwrap();
    assert!(upserted.created, "the refused upsert was not half-applied");

    let lock = crate::helpers::WriteLock::on(&app).await;
    let err = app.delete_domain("lab").await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(
        all_tools(&mut app).await.1,
        upserted.registry_version,
        "still served"
    );
    lock.release().await;
    assert_eq!(stored(&app).await, ["lab"], "still stored");
    assert_eq!(app.delete_domain("lab").await.unwrap().registry_version, demo);
    app.stop().await;
}

async fn concurrent_upserts_all_land_in_the_registry_and_the_database(backend: Backend) {
    let mut app = spawn_app_on(backend).await;
    let mut calls = Vec::new();
    for i in 0..8 {
        let mut client = app.client.clone();
        calls.push(tokio::spawn(async move {
            let request = toolrouter::proto::UpsertDomainRequest {
                manifest_json: domain(&format!("d{i}"), &format!("d{i}_tool")),
            };
            client.upsert_domain(request).await.unwrap().into_inner()
        }));
    }
    let mut last = 0;
    for call in calls {
        let r = call.await.unwrap();
        assert!(r.created);
        last = last.max(r.registry_version);
    }
    let names: Vec<String> = (0..8).map(|i| format!("d{i}")).collect();
    assert_eq!(stored(&app).await, names);
    let groups = app.group_names().await;
    assert!(names.iter().all(|n| groups.contains(n)), "{groups:?}");
    let version = all_tools(&mut app).await.1;
    let mut app = app.restart().await;
    assert_eq!(
        all_tools(&mut app).await.1,
        version,
        "the same registry after a restart"
    );
    app.stop().await;
}

async fn a_stored_domain_that_no_longer_fits_is_left_out_at_start_and_comes_back_when_it_fits(
    backend: Backend,
) {
    let mut app = on_a_manifest_folder(backend).await;
    app.upsert_domain(&domain("extra", "shared_tool")).await.unwrap();
    app.upsert_domain(&domain("named", "named_tool")).await.unwrap();
    // The manifests now define `named`, and another domain takes `extra`'s tool name.
    let folder = app.manifests();
    std::fs::write(folder.join("clash.json"), domain("clash", "shared_tool")).unwrap();
    std::fs::write(folder.join("named.json"), domain("named", "file_named_tool")).unwrap();

    let mut app = app.restart().await;
    assert_eq!(app.group_names().await, ["base", "clash", "named"]);
    let (tools, _) = all_tools(&mut app).await;
    assert!(tools.contains(&"file_named_tool".to_string()) && !tools.contains(&"named_tool".to_string()));
    assert_eq!(stored(&app).await, ["extra", "named"], "left out, not deleted");
    // An unknown name is told every stored domain, served or not: each can be deleted.
    let err = app.delete_domain("nosuch").await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(
        err.message(),
        "Run-time domain 'nosuch' not found. Domains registered at run time: extra, named"
    );
    assert_eq!(
        app.upsert_domain(&domain("named", "named_tool"))
            .await
            .unwrap_err()
            .code(),
        Code::AlreadyExists
    );
    assert_eq!(
        app.delete_domain("named").await.unwrap_err().code(),
        Code::FailedPrecondition
    );

    // Once the clash is gone, a reload serves it again.
    std::fs::remove_file(folder.join("clash.json")).unwrap();
    app.reload().await.unwrap();
    assert_eq!(app.group_names().await, ["base", "extra", "named"]);
    app.delete_domain("extra").await.unwrap();
    assert_eq!(app.group_names().await, ["base", "named"]);
    app.stop().await;
}

#[tokio::test]
async fn the_daemon_starts_and_warns_about_each_stored_domain_left_out_with_its_cause() {
    let dir = temp_dir();
    let folder = manifest_dir(
        dir.path(),
        "m",
        &[("clash.json", &domain("clash", "shared_tool"))],
    );
    let db = toolrouter::db::Db::connect(&db_url(dir.path())).await.unwrap();
    db.upsert_domain("extra", &domain("extra", "shared_tool"), 0)
        .await
        .unwrap();
    db.upsert_domain("broken", "{\"name\": \"broken\",", 0)
        .await
        .unwrap();
    db.upsert_domain("fine", &domain("fine", "fine_tool"), 0)
        .await
        .unwrap();
    db.close().await;

    let daemon = Daemon::start(dir.path(), &["--manifests", folder.to_str().unwrap()]);
    let mut client = daemon.client().await;
    let groups = client
        .list_groups(toolrouter::proto::ListGroupsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let names: Vec<&str> = groups.groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["clash", "fine"]);
    let log = daemon.log();
    let lines = json_lines(&log);
    let warning = |domain: &str| {
        lines
            .iter()
            .find(|v| v["level"] == "WARN" && v["fields"]["domain"] == domain)
            .map(|v| v["fields"]["cause"].as_str().unwrap_or_default().to_string())
            .unwrap_or_else(|| panic!("no warning about {domain}:\n{log}"))
    };
    assert!(
        warning("extra").contains("tool `shared_tool` is defined in two domains"),
        "{log}"
    );
    assert!(warning("broken").contains("malformed JSON"), "{log}");
}

async fn watchers_hear_of_each_upsert_and_delete_and_profiles_apply_to_run_time_domains(backend: Backend) {
    let mut app = TestApp::builder_on(backend)
        .config(|c| {
            c.profiles.insert(
                "no-lab".into(),
                ProfileConfig {
                    deny_domains: vec!["lab".into()],
                    ..ProfileConfig::default()
                },
            );
        })
        .spawn()
        .await;
    let mut watcher = app.watch("").await.unwrap();
    assert_eq!(
        next_event(&mut watcher).await.registry_version,
        demo_registry().version()
    );

    let upserted = app.upsert_domain(LAB).await.unwrap();
    let event = next_event(&mut watcher).await;
    assert_eq!(event.registry_version, upserted.registry_version);
    assert!(event.active_domains.contains(&"lab".to_string()), "{event:?}");

    let request = toolrouter::proto::ListGroupsRequest {
        profile: "no-lab".into(),
    };
    let hidden = app.client.list_groups(request).await.unwrap().into_inner();
    assert!(
        hidden.groups.iter().all(|g| g.name != "lab"),
        "the profile denies it"
    );

    let deleted = app.delete_domain("lab").await.unwrap();
    let event = next_event(&mut watcher).await;
    assert_eq!(event.registry_version, deleted.registry_version);
    assert!(!event.active_domains.contains(&"lab".to_string()), "{event:?}");
    app.stop().await;
}

#[tokio::test]
async fn a_token_bound_to_a_profile_cannot_change_the_registry_and_the_daemons_token_can() {
    let app = TestApp::builder()
        .config(|c| {
            c.profiles.insert(
                "media".into(),
                ProfileConfig {
                    deny_domains: vec!["vault_secret".into()],
                    ..ProfileConfig::default()
                },
            );
            c.profiles.insert(
                "ops".into(),
                ProfileConfig {
                    deny_tools: vec!["docker_prune_images".into()],
                    ..ProfileConfig::default()
                },
            );
            c.auth_token = Some("admin-token".into());
            c.tokens = std::collections::BTreeMap::from([
                ("media-token".to_string(), "media".to_string()),
                ("ops-token".to_string(), "ops".to_string()),
            ]);
        })
        .spawn()
        .await;
    let upsert = || toolrouter::proto::UpsertDomainRequest {
        manifest_json: LAB.into(),
    };
    let delete = || toolrouter::proto::DeleteDomainRequest { name: "lab".into() };
    let mut media = app.connection_with_token("media-token").client().await.unwrap();
    let err = media.upsert_domain(upsert()).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert_eq!(
        err.message(),
        "This auth token is bound to profile 'media'; it cannot change the registry \
         (UpsertDomain needs the daemon's --auth-token)."
    );
    assert!(stored(&app).await.is_empty(), "nothing stored");

    let mut admin = app.connection_with_token("admin-token").client().await.unwrap();
    assert!(admin.upsert_domain(upsert()).await.unwrap().into_inner().created);
    let err = media.delete_domain(delete()).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(err.message().contains("DeleteDomain"), "{}", err.message());
    assert_eq!(stored(&app).await, ["lab"], "still stored");
    assert!(admin.delete_domain(delete()).await.unwrap().into_inner().deleted);
    // A reload serves every consumer, and its answer counts (or its refusal names) tools
    // the profile hides.
    let err = media
        .reload_registry(toolrouter::proto::ReloadRegistryRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert_eq!(
        err.message(),
        "This auth token is bound to profile 'media'; it cannot change the registry \
         (ReloadRegistry needs the daemon's --auth-token)."
    );
    let reloaded = admin
        .reload_registry(toolrouter::proto::ReloadRegistryRequest {})
        .await
        .unwrap()
        .into_inner();
    // DescribeServer shows a bound token its own profile only: another profile's patterns
    // name what this one must not see (SPEC §10); the daemon's token sees them all.
    let described = |c: &mut toolrouter::cli::connection::Client| {
        let mut c = c.clone();
        async move {
            c.describe_server(toolrouter::proto::DescribeServerRequest {})
                .await
                .unwrap()
                .into_inner()
                .config_toml
        }
    };
    let seen = described(&mut media).await;
    assert!(seen.contains("[profiles.media]"), "{seen}");
    // Nor its own deny patterns (they name what it cannot see), nor how many tokens there are.
    assert!(
        !seen.contains("[profiles.ops]")
            && !seen.contains("docker_prune_images")
            && !seen.contains("vault_secret")
            && !seen.contains("auth token(s)"),
        "{seen}"
    );
    assert!(
        seen.contains(
            "# as a token bound to profile 'media' sees it: other profiles, deny patterns and tokens are not shown"
        ),
        "{seen}"
    );
    let all = described(&mut admin).await;
    assert!(
        all.contains("[profiles.ops]")
            && all.contains("docker_prune_images")
            && all.contains("deny_domains = [\"vault_secret\"]")
            && all.contains("# 2 auth token(s) bound to profiles (not printed)"),
        "{all}"
    );
    // Its counts are what the profile sees, whatever the settings (as `ListAllTools`).
    let counts = |c: &mut toolrouter::cli::connection::Client| {
        let mut c = c.clone();
        async move {
            let d = c
                .describe_server(toolrouter::proto::DescribeServerRequest {})
                .await
                .unwrap()
                .into_inner();
            (d.domains, d.tools)
        }
    };
    let mut ops = app.connection_with_token("ops-token").client().await.unwrap();
    assert_eq!(counts(&mut admin).await, (reloaded.domains, reloaded.tools));
    assert_eq!(counts(&mut media).await, (reloaded.domains, reloaded.tools));
    assert_eq!(
        counts(&mut ops).await,
        (reloaded.domains, reloaded.tools - 1),
        "one tool the profile denies"
    );
    app.stop().await;
}

#[tokio::test]
async fn domains_upsert_and_delete_work_from_the_command_line() {
    let app = spawn_app().await;
    let addr = app.addr.to_string();
    let file = app.dir().join("lab.json");
    std::fs::write(&file, LAB).unwrap();
    let file = file.to_str().unwrap();

    let out = run(app.dir(), &["domains", "upsert", file, "--addr", &addr]).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("domain 'lab' registered (1 tools); registry version "),
        "{stdout}"
    );

    let out = run(app.dir(), &["domains", "upsert", file, "--json", "--addr", &addr]).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let v = json_of(&out);
    assert_eq!(v["domain"], "lab", "{v}");
    assert!(v["registryVersion"].is_string(), "{v}");
    assert!(
        v.get("created").is_none(),
        "false is left out in canonical JSON: {v}"
    );

    // A refused manifest is a manifest problem: exit 2, with the daemon's reasons.
    let toml = app.dir().join("lab.toml");
    std::fs::write(&toml, "name = \"lab\"\n").unwrap();
    let out = run(
        app.dir(),
        &["domains", "upsert", toml.to_str().unwrap(), "--addr", &addr],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("InvalidArgument") && stderr.contains("TOML"),
        "{stderr}"
    );
    // So is one named like a domain of the manifests the daemon loads.
    let sonarr = app.dir().join("sonarr.json");
    std::fs::write(&sonarr, LAB.replace("\"lab\"", "\"sonarr\"")).unwrap();
    let out = run(
        app.dir(),
        &["domains", "upsert", sonarr.to_str().unwrap(), "--addr", &addr],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("AlreadyExists: Domain 'sonarr' comes from the manifests"),
        "{}",
        shown(&out)
    );

    let out = run(app.dir(), &["domains", "delete", "lab", "--addr", &addr]).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("domain 'lab' deleted; registry version "));
    let out = run(app.dir(), &["domains", "delete", "lab", "--addr", &addr]).await;
    assert_eq!(out.status.code(), Some(1), "{}", shown(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("NotFound: Run-time domain 'lab' not found"),
        "{}",
        shown(&out)
    );
    app.stop().await;
}

#[tokio::test]
async fn a_backup_moved_over_the_sqlite_file_brings_the_run_time_domains_it_holds() {
    // Upkeep (which notices the replaced file) runs every 100 ms with this TTL.
    let mut app = TestApp::builder()
        .config(|c| c.conversation_ttl = std::time::Duration::from_millis(400))
        .spawn()
        .await;
    let demo = demo_registry().version();
    app.upsert_domain(&domain("bench", "bench_tool")).await.unwrap();
    // A backup holding `bench`, taken before `lab` is registered.
    let backup = app.dir().join("backup.db");
    let pool = sqlx::SqlitePool::connect(&db_url(app.dir())).await.unwrap();
    sqlx::query("VACUUM INTO ?1")
        .bind(backup.to_str().unwrap())
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let with_lab = app.upsert_domain(LAB).await.unwrap().registry_version;
    std::fs::rename(&backup, app.db_path()).unwrap();
    // A call that reads the database finds the file replaced.
    app.route("hello", "c1").await;
    let mut groups = Vec::new();
    for _ in 0..50 {
        let listed = app.list_groups().await.unwrap();
        groups = listed.groups.iter().map(|g| g.name.clone()).collect::<Vec<_>>();
        if !groups.contains(&"lab".to_string()) {
            assert_ne!(listed.registry_version, with_lab);
            assert_ne!(listed.registry_version, demo);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        groups.contains(&"bench".to_string()) && !groups.contains(&"lab".to_string()),
        "the backup's run-time domains: {groups:?}"
    );
    app.stop().await;
}
