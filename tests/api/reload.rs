//! ReloadRegistry: the new registry is swapped in whole; invalid manifests keep the old one
//! and list every problem; conversations simply stop getting groups that are gone.

use std::collections::{BTreeSet, HashMap};

use tonic::Code;

use crate::helpers::{Backend, TestApp, decisions, route_request, routed};

crate::on_both_backends!(
    a_reload_serves_the_new_manifests,
    invalid_manifests_keep_the_old_registry_and_list_every_problem,
    a_conversation_simply_stops_getting_a_group_that_is_gone,
    calls_in_flight_during_reloads_see_one_registry_or_the_other_never_a_mix,
);

/// A manifest for a domain without settings keys (so always active) with one tool.
fn manifest(name: &str, keyword: &str) -> String {
    format!(
        r#"{{"name":"{name}","keywords":["{keyword}"],"tools":[{{"name":"{name}_tool","description":"Does {name} things"}}]}}"#
    )
}

const CORE: &str =
    r#"{"name":"base","core":true,"tools":[{"name":"base_tool","description":"Always there"}]}"#;

/// A server on a manifest folder holding `files`, and that folder.
async fn start(backend: Backend, files: &[(&str, &str)]) -> (TestApp, std::path::PathBuf) {
    let app = TestApp::builder_on(backend).manifests(files).spawn().await;
    let folder = app.manifests();
    (app, folder)
}

async fn a_reload_serves_the_new_manifests(backend: Backend) {
    let a = manifest("alpha", "apple");
    let (mut app, folder) = start(backend, &[("base.json", CORE), ("alpha.json", &a)]).await;
    let before = app.route("apple", "").await.registry_version;
    std::fs::write(folder.join("beta.json"), manifest("beta", "banana")).unwrap();

    let r = app.reload().await.unwrap();
    assert_eq!((r.domains, r.tools), (3, 3));
    assert_ne!(r.registry_version, before);
    assert_eq!(app.group_names().await, ["alpha", "base", "beta"]);
    let routed = app.route("banana", "").await;
    assert_eq!(routed.registry_version, r.registry_version);
    assert_eq!(decisions(&routed)[1].0, "beta");
    app.stop().await;
}

async fn invalid_manifests_keep_the_old_registry_and_list_every_problem(backend: Backend) {
    let a = manifest("alpha", "apple");
    let (mut app, folder) = start(backend, &[("base.json", CORE), ("alpha.json", &a)]).await;
    let before = app.route("apple", "").await.registry_version;
    std::fs::write(
        folder.join("broken.json"),
        "{\"name\": \"broken\",\n \"tools\": [}\n",
    )
    .unwrap();
    std::fs::write(
        folder.join("nodesc.json"),
        r#"{"name":"nodesc","tools":[{"name":"x","description":""}]}"#,
    )
    .unwrap();

    let err = app.reload().await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    let text = err.message();
    assert!(
        text.contains(&format!("{before:016x}")),
        "names the registry still serving: {text}"
    );
    assert!(
        text.contains("broken.json:2:"),
        "file and line of the syntax error: {text}"
    );
    assert!(text.contains("nodesc.json"), "every file with a problem: {text}");
    assert_eq!(app.group_names().await, ["alpha", "base"]);
    assert_eq!(app.route("apple", "").await.registry_version, before);

    // So many problems that the list would pass the client's header limit: the answer still
    // arrives, with as many as fit and the count of the rest.
    let tools: Vec<String> = (0..300)
        .map(|i| format!(r#"{{"name":"bad{i}","description":"d","tier":"nope"}}"#))
        .collect();
    std::fs::write(
        folder.join("many.json"),
        format!(r#"{{"name":"many","tools":[{}]}}"#, tools.join(",")),
    )
    .unwrap();
    let err = app.reload().await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(err.message().contains("many.json"), "{}", err.message());
    assert!(
        err.message()
            .ends_with("more problems (the daemon's log lists every one)."),
        "{}",
        err.message()
    );
    std::fs::remove_file(folder.join("many.json")).unwrap();

    // A folder that disappeared is a listed problem too, not a crash.
    std::fs::remove_dir_all(&folder).unwrap();
    let err = app.reload().await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("cannot read manifest folder"),
        "{}",
        err.message()
    );
    assert_eq!(app.route("apple", "").await.registry_version, before);
    app.stop().await;
}

async fn a_conversation_simply_stops_getting_a_group_that_is_gone(backend: Backend) {
    let (a, b) = (manifest("alpha", "apple"), manifest("beta", "banana"));
    let (mut app, folder) = start(
        backend,
        &[("base.json", CORE), ("alpha.json", &a), ("beta.json", &b)],
    )
    .await;
    app.load("c1", "beta").await.unwrap();
    app.route("apple", "c1").await;
    std::fs::remove_file(folder.join("beta.json")).unwrap();
    app.reload().await.unwrap();

    let r = app.route("hello", "c1").await;
    assert_eq!(routed(&r), ["base", "alpha"]);
    assert!(r.tools.iter().all(|t| t.domain != "beta"));
    let err = app.load("c1", "beta").await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    // Back again: the conversation's earlier load applies again.
    std::fs::write(folder.join("beta.json"), &b).unwrap();
    app.reload().await.unwrap();
    let r = app.route("hello", "c1").await;
    assert!(
        decisions(&r)
            .iter()
            .any(|(d, why, _)| d == "beta" && *why == "REASON_LOADED")
    );
    app.stop().await;
}

async fn calls_in_flight_during_reloads_see_one_registry_or_the_other_never_a_mix(backend: Backend) {
    let (a, b) = (manifest("alpha", "apple"), manifest("beta", "banana"));
    let (mut app, folder) = start(backend, &[("base.json", CORE), ("alpha.json", &a)]).await;
    // Registry one: base + alpha; registry two: base + beta. Fallback lists every domain.
    let one = app.route("hello", "").await.registry_version;
    let expected_one: BTreeSet<String> = ["base_tool", "alpha_tool"].map(String::from).into();
    let expected_two: BTreeSet<String> = ["base_tool", "beta_tool"].map(String::from).into();

    let mut readers = Vec::new();
    for _ in 0..4 {
        let mut client = app.client.clone();
        readers.push(tokio::spawn(async move {
            let mut seen: HashMap<u64, BTreeSet<BTreeSet<String>>> = HashMap::new();
            for _ in 0..300 {
                let r = client
                    .route(route_request("hello", ""))
                    .await
                    .unwrap()
                    .into_inner();
                let tools = r
                    .tools
                    .iter()
                    .filter(|t| !t.domain.is_empty())
                    .map(|t| t.name.clone())
                    .collect();
                seen.entry(r.registry_version).or_default().insert(tools);
            }
            seen
        }));
    }
    let mut two = None;
    for i in 0..20 {
        if i % 2 == 0 {
            std::fs::remove_file(folder.join("alpha.json")).unwrap();
            std::fs::write(folder.join("beta.json"), &b).unwrap();
        } else {
            std::fs::remove_file(folder.join("beta.json")).unwrap();
            std::fs::write(folder.join("alpha.json"), &a).unwrap();
        }
        let r = app.reload().await.unwrap();
        if i % 2 == 0 {
            two = Some(r.registry_version);
        }
        tokio::task::yield_now().await;
    }
    let two = two.unwrap();
    for reader in readers {
        for (version, answers) in reader.await.unwrap() {
            let expected = if version == one {
                &expected_one
            } else {
                assert_eq!(version, two, "only the two registries exist");
                &expected_two
            };
            assert_eq!(
                answers,
                BTreeSet::from([expected.clone()]),
                "version {version:016x}"
            );
        }
    }
    app.stop().await;
}
