//! The registry as a whole: the demo passes the validation user manifests get, the version
//! follows the content, `check` warnings, folders read once, and keyword id order.

use super::*;

#[test]
fn the_demo_registry_passes_the_same_validation_as_user_manifests() {
    let r = Registry::from_sources(DEMO.iter().map(|(p, t)| (*p, *t))).expect("demo is valid");
    assert!(r.domains().len() >= 10, "at least 10 domains");
    assert!(r.tool_count() >= 60, "at least 60 tools");
    assert_eq!(
        r.domains().iter().filter(|d| d.core).count(),
        1,
        "one core domain"
    );
    assert!(r.domains().iter().any(|d| !d.settings_keys.is_empty()));
    assert!(DEMO.iter().any(|(p, _)| p.ends_with(".toml")), "a TOML manifest");
    assert!(
        DEMO.iter()
            .any(|(p, t)| p.ends_with(".json") && t.trim_start().starts_with('[')),
        "a group-array manifest"
    );
    for d in r.domains() {
        for t in &d.tools {
            let schema: serde_json::Value = serde_json::from_str(&t.input_schema_json).unwrap();
            assert_eq!(schema["type"], "object", "{}", t.name);
        }
    }
}

#[test]
fn equal_content_gives_equal_versions_and_any_change_a_new_one() {
    let a = Registry::demo();
    let b = Registry::demo();
    assert_eq!(a.version(), b.version());
    let mut domains = a.domains().to_vec();
    domains[0].tools[0].description.push('!');
    let c = Registry::new(domains).unwrap();
    assert_ne!(a.version(), c.version());
}

#[test]
fn check_warns_about_missing_tiers_long_descriptions_top_level_unions_hollow_domains_empty_folders_and_skipped_files()
 {
    let root = tempfile::tempdir().unwrap();
    let (full, empty) = (root.path().join("full"), root.path().join("empty"));
    std::fs::create_dir_all(&full).unwrap();
    std::fs::create_dir_all(&empty).unwrap();
    let long = "x".repeat(MAX_DESCRIPTION_CHARS + 1);
    std::fs::write(
        full.join("a.json"),
        format!(
            r#"{{"name": "a", "tools": [{{"name": "no_tier", "description": "d"}},
                    {{"name": "wordy", "description": "{long}", "tier": "read"}},
                    {{"name": "fine", "description": "{}", "tier": "read"}},
                    {{"name": "either", "description": "d", "tier": "read",
                      "input_schema": {{"type": "object", "properties": {{"id": {{"type": "string"}}}},
                                        "oneOf": [{{"required": ["id"]}}]}}}},
                    {{"name": "nested", "description": "d", "tier": "read",
                      "input_schema": {{"type": "object", "properties": {{"v": {{"anyOf": [{{"type": "string"}}]}},
                                        "a.b-c_9": {{"type": "object", "properties": {{"deep key": {{}}}}}}}}}}}},
                    {{"name": "bracketed", "description": "d", "tier": "read",
                      "input_schema": {{"type": "object", "properties": {{"ok": {{}}, "filter[tag]": {{}}}}}}}}]}}"#,
            "y".repeat(MAX_DESCRIPTION_CHARS)
        ),
    )
    .unwrap();
    std::fs::write(
        full.join("hollow.json"),
        r#"{"name": "hollow", "keywords": ["void"]}"#,
    )
    .unwrap();
    std::fs::write(
        full.join("spaced.json"),
        r#"{"name": "spaced", "keywords": [" smart home", "lamp", "tv\t"],
            "settings_keys": ["lamp_url ", "lamp_token"],
            "tools": [{"name": "s", "description": "d", "tier": "read"}]}"#,
    )
    .unwrap();
    std::fs::write(full.join("quiet.json"), r#"{"name": "quiet"}"#).unwrap();
    std::fs::write(full.join("README.md"), "notes").unwrap();
    std::fs::write(full.join("b.yaml"), "name: b").unwrap();
    let (registry, warnings) = Registry::check_dirs(&[full.clone(), empty.clone()]);
    let registry = registry.expect("warnings do not fail the load");
    assert_eq!(registry.tool_count(), 7);
    let shown: Vec<String> = warnings.iter().map(ToString::to_string).collect();
    let expect = [
        (
            full.join("README.md"),
            "skipped: only *.json and *.toml files are manifests",
        ),
        (full.join("b.yaml"), "skipped"),
        (empty.clone(), "the folder holds no manifest"),
        (full.join("a.json"), "tool `no_tier` has no tier"),
        (
            full.join("a.json"),
            "tool `wordy` has a description of 1025 characters (over 1024)",
        ),
        (
            full.join("a.json"),
            "tool `either`'s input schema has `oneOf` at its top level: OpenAI and Anthropic refuse",
        ),
        (
            full.join("a.json"),
            "tool `bracketed`'s input schema has a property named `filter[tag]`: Anthropic refuses",
        ),
        (
            full.join("hollow.json"),
            "domain `hollow` has keywords but no tools: a message that hits them gets no fallback",
        ),
        (
            full.join("spaced.json"),
            "domain `spaced`'s keyword \" smart home\" begins or ends with white space",
        ),
        (
            full.join("spaced.json"),
            "domain `spaced`'s keyword \"tv\\t\" begins or ends with white space",
        ),
        (
            full.join("spaced.json"),
            "domain `spaced`'s settings key \"lamp_url \" begins or ends with white space: only a settings row whose key has the same spaces there activates it",
        ),
    ];
    assert_eq!(warnings.len(), expect.len(), "{shown:#?}");
    for (path, text) in expect {
        let path = path.display().to_string();
        assert!(
            warnings
                .iter()
                .any(|w| w.path == path && w.message.contains(text)),
            "expected a warning on {path} containing {text:?}: {shown:#?}"
        );
    }
}

/// An editor's lock, swap or copy beside a manifest is not a manifest: a restart while one is
/// open for editing loads what the folder's manifests say.
#[cfg(unix)]
#[test]
fn hidden_files_are_not_read_as_manifests() {
    let dir = tempfile::tempdir().unwrap();
    let a = r#"{"name": "a", "tools": [{"name": "t", "description": "d", "tier": "read"}]}"#;
    std::fs::write(dir.path().join("a.json"), a).unwrap();
    std::fs::write(dir.path().join(".a.json"), a).unwrap();
    std::fs::write(dir.path().join("._a.json"), [0u8, 5, 22, 7, 0xff]).unwrap();
    std::os::unix::fs::symlink("user@host.1234:1700000000", dir.path().join(".#a.json")).unwrap();
    std::fs::write(dir.path().join(".a.json.swp"), "swap").unwrap();
    let (registry, warnings) = Registry::check_dirs(&[dir.path().to_path_buf()]);
    let registry = registry.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(registry.domains().len(), 1);
    // Each one named like a manifest is said to be skipped; the swap file is not.
    let skipped: Vec<String> = warnings
        .iter()
        .filter(|w| w.message.starts_with("skipped: a hidden file"))
        .map(|w| w.path.rsplit('/').next().unwrap().to_string())
        .collect();
    assert_eq!(skipped, [".#a.json", "._a.json", ".a.json"], "{warnings:?}");
    assert_eq!(warnings.len(), 3, "{warnings:?}");
}

/// A manifest that is a link to nowhere fails the load naming it, instead of its domain
/// disappearing without a word.
#[cfg(unix)]
#[test]
fn a_dangling_link_named_like_a_manifest_fails_the_load_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("a.json"),
        r#"{"name": "a", "tools": [{"name": "t", "description": "d", "tier": "read"}]}"#,
    )
    .unwrap();
    let link = dir.path().join("gone.json");
    std::os::unix::fs::symlink(dir.path().join("nowhere.json"), &link).unwrap();
    std::fs::create_dir(dir.path().join("folder.json")).unwrap();
    let (registry, _) = Registry::check_dirs(&[dir.path().to_path_buf()]);
    let e = registry.unwrap_err().to_string();
    assert!(
        e.contains(&link.display().to_string()) && e.contains("cannot read manifest"),
        "{e}"
    );
    assert!(!e.contains("folder.json"), "a folder is not a manifest: {e}");
}

#[test]
fn a_fifo_named_like_a_manifest_fails_the_load_naming_it_without_waiting_for_a_writer() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("a.json"),
        r#"{"name": "a", "tools": [{"name": "t", "description": "d", "tier": "read"}]}"#,
    )
    .unwrap();
    let fifo = dir.path().join("pipe.json");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    // Run aside, so that a load blocked on the FIFO fails the test instead of hanging it.
    let dirs = vec![dir.path().to_path_buf()];
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(
            Registry::check_dirs(&dirs)
                .0
                .map(|_| ())
                .map_err(|e| e.to_string()),
        );
    });
    let e = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the load returns")
        .unwrap_err();
    assert_eq!(
        e,
        format!("{}: cannot read manifest: not a regular file", fifo.display())
    );
}

#[test]
fn the_same_folder_given_twice_is_read_once() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("m");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.json"), r#"{"name": "a"}"#).unwrap();
    let again = root.path().join("m/../m/");
    let r = Registry::load_dirs(&[dir.clone(), dir.clone(), again]).expect("read once, no duplicate");
    assert_eq!(r.domains().len(), 1);
}

#[test]
fn the_demo_registry_draws_no_warning() {
    let r = Registry::demo();
    let shown: Vec<String> = r.warnings().iter().map(ToString::to_string).collect();
    assert!(shown.is_empty(), "{shown:#?}");
}

#[test]
fn keyword_ids_follow_domain_then_manifest_order() {
    let r = Registry::demo();
    let mut k = 0;
    for (d, dom) in r.domains().iter().enumerate() {
        for kw in &dom.keywords {
            assert_eq!(r.keyword_domain(KeywordId(k)), DomainId(d));
            assert_eq!(r.keyword(KeywordId(k)), kw);
            k += 1;
        }
    }
    assert_eq!(r.keywords().count(), k);
}

/// A domain with these tools, labelled as coming from `source`.
fn domain(name: &str, tools: &[&str], source: &str) -> Domain {
    Domain {
        name: name.into(),
        display_name: name.into(),
        description: format!("{name} things"),
        settings_keys: Vec::new(),
        keywords: Vec::new(),
        core: false,
        fallback: true,
        tools: tools
            .iter()
            .map(|t| Tool {
                name: (*t).into(),
                description: "d".into(),
                input_schema_json: r#"{"type":"object","properties":{}}"#.into(),
                tier: Tier::Read,
            })
            .collect(),
        source: source.into(),
    }
}

#[test]
fn composing_leaves_out_each_extra_domain_that_takes_a_name_already_taken() {
    let base = vec![domain("a", &["a1"], "a.json"), domain("b", &["b1"], "b.json")];
    let extra = vec![
        domain("a", &["x1"], "db a"),       // a base domain's name
        domain("c", &["c1", "b1"], "db c"), // a base domain's tool
        domain("d", &["d1"], "db d"),
        domain("e", &["d1"], "db e"), // an earlier extra domain's tool
        domain("f", &["f1"], "db f"),
    ];
    let (registry, left_out) = Registry::compose(base.clone(), extra);
    let names: Vec<&str> = registry.domains().iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "d", "f"]);
    assert_eq!(registry.domain(DomainId(0)).source, "a.json", "the base one kept");
    let why: Vec<(&str, String)> = left_out
        .iter()
        .map(|(d, e)| (d.name.as_str(), e.to_string()))
        .collect();
    assert_eq!(why.len(), 3, "{why:#?}");
    assert_eq!(why[0].0, "a");
    assert!(
        why[0]
            .1
            .contains("domain `a` is defined twice: in a.json and in db a"),
        "{why:#?}"
    );
    assert_eq!(why[1].0, "c");
    assert!(
        why[1]
            .1
            .contains("tool `b1` is defined in two domains: `b` (b.json) and `c` (db c)"),
        "{why:#?}"
    );
    assert_eq!(why[2].0, "e");
    assert!(why[2].1.contains("`d` (db d) and `e` (db e)"), "{why:#?}");
    // The same registry as one built from what was kept.
    let kept = vec![
        base[0].clone(),
        base[1].clone(),
        domain("d", &["d1"], "db d"),
        domain("f", &["f1"], "db f"),
    ];
    assert_eq!(registry.version(), Registry::new(kept).unwrap().version());
}

#[test]
fn composing_what_fits_keeps_everything_and_the_version_ignores_where_domains_came_from() {
    let (registry, left_out) = Registry::compose(
        vec![domain("a", &["a1"], "a.json")],
        vec![domain("b", &["b1"], "upsert:b")],
    );
    assert!(left_out.is_empty());
    let relabelled = Registry::new(vec![
        domain("b", &["b1"], "database domain b"),
        domain("a", &["a1"], "x.json"),
    ])
    .unwrap();
    assert_eq!(registry.version(), relabelled.version());
    assert_eq!(registry.into_domains().len(), 2);
}

#[test]
fn property_names_anthropic_refuses_are_found_at_the_top_level_only() {
    let cases: &[(&str, Option<&str>)] = &[
        (r#"{"type":"object"}"#, None),
        (r#"{"type":"object","properties":{"a.b-c_9":{}}}"#, None),
        (
            &format!(
                r#"{{"type":"object","properties":{{"{}":{{}}}}}}"#,
                "k".repeat(64)
            ),
            None,
        ),
        (
            r#"{"type":"object","properties":{"o":{"properties":{"a b":{}}}}}"#,
            None,
        ),
        (
            r#"{"type":"object","properties":{"ok":{},"a b":{}}}"#,
            Some("a b"),
        ),
        (r#"{"type":"object","properties":{"":{}}}"#, Some("")),
        (r#"{"type":"object","properties":{"ключ":{}}}"#, Some("ключ")),
        (r#"{"type":"object","properties":{"cwd?":{}}}"#, Some("cwd?")),
    ];
    let parsed = |schema: &str| serde_json::from_str::<serde_json::Value>(schema).unwrap();
    for (schema, refused) in cases {
        assert_eq!(anthropic_refused_property(&parsed(schema)), *refused, "{schema}");
    }
    let long = "k".repeat(65);
    let schema = format!(r#"{{"type":"object","properties":{{"{long}":{{}}}}}}"#);
    assert_eq!(anthropic_refused_property(&parsed(&schema)), Some(long.as_str()));
}
