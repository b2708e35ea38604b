//! The CLI binary itself: `check` on manifest folders, exit codes, configuration layers,
//! `health`, `eval` and `keywords suggest`.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::helpers::{
    BIN, TestApp, json_of, manifest_dir, other_programs_database, run, run_with_env, set_settings, shown,
    spawn_app, temp_dir,
};

#[tokio::test]
async fn check_on_a_broken_manifest_folder_exits_2_and_names_the_file() {
    let dir = temp_dir();
    let folder = manifest_dir(
        dir.path(),
        "broken",
        &[
            (
                "good.json",
                r#"{"name":"good","tools":[{"name":"g","description":"G"}]}"#,
            ),
            ("bad.json", "{\"name\": \"bad\",\n \"tools\": [}\n"),
        ],
    );
    let out = run(dir.path(), &["check", folder.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let bad = folder.join("bad.json").display().to_string();
    assert!(
        stderr.contains(&format!("{bad}:2:")),
        "names the file and line: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[tokio::test]
async fn check_on_a_valid_folder_prints_a_summary_and_exits_0() {
    let dir = temp_dir();
    let folder = manifest_dir(
        dir.path(),
        "ok",
        &[(
            "a.json",
            r#"{"name":"a","keywords":["x","y"],"tools":[{"name":"t","description":"T"}]}"#,
        )],
    );
    let out = run(dir.path(), &["check", folder.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("1 domains, 1 tools, 2 keywords"), "{stdout}");
}

#[tokio::test]
async fn a_wrong_flag_exits_2_and_an_unreachable_daemon_exits_1_with_one_line() {
    let dir = temp_dir();
    let out = run(dir.path(), &["route", "--no-such-flag", "hi"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    let out = run(dir.path(), &["groups", "--addr", "http://127.0.0.1:1"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", shown(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("error: cannot reach the daemon at http://127.0.0.1:1"),
        "{stderr}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    // A port no address can have is a bad flag, not an unreachable daemon.
    let out = run(dir.path(), &["groups", "--addr", "127.0.0.1:99999"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("port 99999 is not between 0 and 65535"),
        "{stderr}"
    );
    // A path or query would be dropped: gRPC calls go to the authority.
    for addr in ["http://127.0.0.1:1/api", "127.0.0.1:1/x?y=1", "https://h:1?q"] {
        let out = run(dir.path(), &["groups", "--addr", addr]).await;
        assert_eq!(out.status.code(), Some(2), "{addr}: {}", shown(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("has no path or query"), "{addr}: {stderr}");
    }
    // A trailing slash is no path.
    let out = run(dir.path(), &["groups", "--addr", "http://127.0.0.1:1/"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", shown(&out));
}

#[tokio::test]
async fn configuration_layers_apply_defaults_then_file_then_environment_then_flags() {
    let dir = temp_dir();
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        "settings_ttl = \"3s\"\nfallback = \"core-only\"\nmax_message_bytes = 100\n",
    )
    .unwrap();
    let out = run_with_env(
        dir.path(),
        &[
            "serve",
            "--print-config",
            "--config",
            file.to_str().unwrap(),
            "--max-message-bytes",
            "300",
        ],
        &[
            ("TOOLROUTER_FALLBACK", "all-active"),
            ("TOOLROUTER_MAX_MESSAGE_BYTES", "200"),
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let printed = String::from_utf8_lossy(&out.stdout);
    for line in [
        "listen = \"127.0.0.1:50051\"", // default
        "settings_ttl = \"3s\"",        // file over default
        "fallback = \"all-active\"",    // environment over file
        "max_message_bytes = 300",      // flag over environment
        "conversation_ttl = \"1day\"",  // default
    ] {
        assert!(
            printed.lines().any(|l| l == line),
            "missing {line:?} in:\n{printed}"
        );
    }
}

#[tokio::test]
async fn a_bad_config_file_exits_2_naming_the_key() {
    let dir = temp_dir();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "fallbak = \"core-only\"\n").unwrap();
    let out = run(
        dir.path(),
        &["serve", "--print-config", "--config", file.to_str().unwrap()],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("fallbak"));
}

#[tokio::test]
async fn health_exits_0_and_prints_serving_against_a_running_daemon() {
    let app = spawn_app().await;
    let addr = format!("http://{}", app.addr);
    let out = run(app.dir(), &["health", "--addr", &addr]).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "SERVING");
    app.stop().await;
}

/// Two small domains whose tools say what they do, and labelled messages over them.
fn eval_fixture(dir: &Path) -> (PathBuf, PathBuf) {
    let folder = manifest_dir(
        dir,
        "eval",
        &[
            (
                "climate.json",
                r#"{"name":"climate","keywords":["thermostat"],"tools":[
                    {"name":"set_temperature","description":"Set the target temperature of the heating","tier":"modify"},
                    {"name":"read_temperature","description":"Read the room temperature","tier":"read"}]}"#,
            ),
            (
                "media.json",
                r#"{"name":"media","keywords":["movie"],"tools":[
                    {"name":"play_film","description":"Play a film or a TV episode","tier":"modify"}]}"#,
            ),
        ],
    );
    let queries = dir.join("queries.jsonl");
    std::fs::write(
        &queries,
        concat!(
            r#"{"query":"set the thermostat to 20","domains":["climate"],"split":"a"}"#,
            "\n",
            r#"{"query":"turn the heating up","domains":["climate"],"split":"a"}"#,
            "\n\n",
            r#"{"query":"hello","domains":["media"],"split":"b","id":"x"}"#,
            "\n",
        ),
    )
    .unwrap();
    (folder, queries)
}

/// `eval` of `queries` over the manifests in `folder` with `--search search`: its stdout and
/// the JSON report on its last line.
async fn evaluate(dir: &Path, folder: &Path, queries: &Path, search: &str) -> (String, Value) {
    let out = run(
        dir,
        &[
            "eval",
            "--manifests",
            folder.to_str().unwrap(),
            "--queries",
            queries.to_str().unwrap(),
            "--search",
            search,
        ],
    )
    .await;
    assert!(out.status.success(), "{}", shown(&out));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let last: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    (stdout, last)
}

#[tokio::test]
async fn eval_reports_each_split_and_ends_with_one_json_line() {
    let dir = temp_dir();
    let (folder, queries) = eval_fixture(dir.path());
    let (table, report) = evaluate(dir.path(), &folder, &queries, "augment").await;
    assert!(table.contains("SPLIT") && table.contains("overall"), "{table}");
    // The time column is the median the JSON calls `us_median` (`us_per_query` is the mean).
    assert!(table.contains("US MEDIAN"), "{table}");
    // "turn the heating up" says no keyword: search finds climate; "hello" falls back to all.
    assert_eq!(report["splits"]["a"]["strict_recall"], 1.0);
    assert_eq!(report["splits"]["a"]["reasons"]["search"], 1);
    assert_eq!(report["splits"]["b"]["fallback_rate"], 1.0);
    assert_eq!(report["overall"]["queries"], 3);
    assert_eq!(report["overall"]["strict_recall"], 1.0);
    assert_eq!(report["registry_tools"], 3);
    // (2 + 2 + 3) tools sent; oracle 2 + 2 + 1.
    assert_eq!(report["overall"]["tools_sent"], 7.0 / 3.0);
    assert_eq!(report["overall"]["cost_ratio"], 7.0 / 5.0);

    let (_, keywords_only) = evaluate(dir.path(), &folder, &queries, "off").await;
    assert_eq!(
        keywords_only["splits"]["a"]["strict_recall"], 1.0,
        "the fallback sent climate"
    );
    assert_eq!(keywords_only["splits"]["a"]["fallback_rate"], 0.5);

    // Splits named like the table's own rows stay apart from them.
    std::fs::write(
        &queries,
        concat!(
            r#"{"query":"set the thermostat","domains":["climate"],"split":"overall"}"#,
            "\n",
            r#"{"query":"play a movie","domains":["media"],"split":"(no split)"}"#,
            "\n",
            r#"{"query":"play a movie","domains":["media"]}"#,
            "\n",
        ),
    )
    .unwrap();
    let (table, report) = evaluate(dir.path(), &folder, &queries, "augment").await;
    let labels: Vec<&str> = table
        .lines()
        .skip(1)
        .take_while(|l| !l.is_empty())
        .map(|l| l.split("  ").next().unwrap().trim())
        .collect();
    assert_eq!(
        labels,
        ["(no split)", "\"(no split)\"", "\"overall\"", "overall"],
        "{table}"
    );
    assert_eq!(report["splits"]["overall"]["queries"], 1);
    assert_eq!(report["overall"]["queries"], 3);
}

/// `eval --misses FILE` writes each message whose answer lacked a labelled domain, with what
/// it got instead; a path it cannot write stops it before it routes anything (exit 2).
#[tokio::test]
async fn eval_writes_each_miss_with_what_it_got_instead() {
    let dir = temp_dir();
    let (folder, queries) = eval_fixture(dir.path());
    std::fs::write(
        &queries,
        concat!(
            r#"{"query":"play a movie","domains":["media"]}"#,
            "\n",
            r#"{"query":"play a movie and warm the room","domains":["media","climate"],"split":"s","id":"q2"}"#,
            "\n",
            r#"{"query":"play a movie","domains":["nope","media","nope"]}"#,
            "\n",
        ),
    )
    .unwrap();
    let misses = dir.path().join("misses.jsonl");
    let args = |misses: &Path| {
        [
            "eval".to_string(),
            "--manifests".into(),
            folder.to_str().unwrap().into(),
            "--queries".into(),
            queries.to_str().unwrap().into(),
            "--search".into(),
            "off".into(),
            "--misses".into(),
            misses.to_str().unwrap().into(),
        ]
    };
    let argv = args(&misses);
    let out = run(dir.path(), &argv.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert!(out.status.success(), "{}", shown(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "2 messages lacked a labelled domain: written to {}",
            misses.display()
        )),
        "{stdout}"
    );
    let written: Vec<Value> = std::fs::read_to_string(&misses)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        written,
        [
            serde_json::json!({"id": "q2", "split": "s", "query": "play a movie and warm the room",
                "missed": ["climate"], "answer": ["media:keyword"], "tools": 1, "fallback": false}),
            serde_json::json!({"query": "play a movie", "missed": ["nope"],
                "answer": ["media:keyword"], "tools": 1, "fallback": false}),
        ]
    );

    // A run that fails after the file was named leaves it as it was, or, one it created,
    // not there.
    let before = std::fs::read(&misses).unwrap();
    let fresh = dir.path().join("fresh.jsonl");
    for path in [&misses, &fresh] {
        let mut argv = args(path).to_vec();
        argv.extend(["--database".to_string(), "sqlite://no-such.db".to_string()]);
        let out = run(dir.path(), &argv.iter().map(String::as_str).collect::<Vec<_>>()).await;
        assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    }
    assert_eq!(std::fs::read(&misses).unwrap(), before);
    assert!(!fresh.exists());
    // A device is written through, not replaced.
    let argv = args(Path::new("/dev/null"));
    let out = run(dir.path(), &argv.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert!(out.status.success(), "{}", shown(&out));
    {
        use std::os::unix::fs::FileTypeExt as _;
        assert!(
            std::fs::metadata("/dev/null")
                .unwrap()
                .file_type()
                .is_char_device()
        );
    }
    // The labelled file itself is never written over, however it is spelled.
    let labelled = std::fs::read(&queries).unwrap();
    let spelled = dir.path().join(".").join(queries.file_name().unwrap());
    let argv = args(&spelled);
    let out = run(dir.path(), &argv.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("it is the labelled file --queries reads"),
        "{}",
        shown(&out)
    );
    assert_eq!(std::fs::read(&queries).unwrap(), labelled);

    let nowhere = dir.path().join("no-such-folder").join("misses.jsonl");
    let argv = args(&nowhere);
    let out = run(dir.path(), &argv.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("cannot write the misses to {}", nowhere.display())),
        "{stderr}"
    );
}

/// `eval` serves nothing: what a shell set for `serve` (a public address, half a TLS pair) does
/// not stop it. A split whose labels name no tool has no cost ratio (not a free `0.00x`), and
/// labels the registry lacks are named quoted, blank ones too.
#[tokio::test]
async fn eval_ignores_serving_settings_and_says_when_there_is_no_cost_ratio() {
    let dir = temp_dir();
    let (folder, queries) = eval_fixture(dir.path());
    std::fs::write(
        &queries,
        concat!(
            r#"{"query":"hello there","domains":[],"split":"none"}"#,
            "\n",
            r#"{"query":"hello there","domains":[" ","Media"],"split":"none"}"#,
            "\n",
            r#"{"query":"play a movie","domains":["media"],"split":"some"}"#,
            "\n",
        ),
    )
    .unwrap();
    let args = [
        "eval",
        "--manifests",
        folder.to_str().unwrap(),
        "--queries",
        queries.to_str().unwrap(),
        "--search",
        "off",
    ];
    let env = [
        ("TOOLROUTER_LISTEN", "0.0.0.0:50051"),
        ("TOOLROUTER_TLS_CERT", "/nowhere/cert.pem"),
    ];
    let out = run_with_env(dir.path(), &args, &env).await;
    assert!(out.status.success(), "{}", shown(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(report["splits"]["none"]["oracle_tools"], 0.0, "{report}");
    assert_eq!(report["splits"]["none"]["cost_ratio"], Value::Null, "{report}");
    assert_eq!(report["splits"]["some"]["cost_ratio"], 1.0, "{report}");
    let row = stdout.lines().find(|l| l.starts_with("none ")).unwrap();
    assert!(row.contains("n/a") && !row.contains("0.00x"), "{stdout}");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("2 labelled domains are not in the registry (counted as misses): \" \", \"Media\""),
        "{}",
        shown(&out)
    );
    // `serve` still refuses them.
    let out = run_with_env(
        dir.path(),
        &["serve", "--manifests", folder.to_str().unwrap()],
        &env,
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
}

#[tokio::test]
async fn eval_reads_the_settings_database_a_config_file_names_and_never_creates_one() {
    let dir = temp_dir();
    let (folder, queries) = eval_fixture(dir.path());
    let missing = dir.path().join("typo.db");
    let config = dir.path().join("eval.toml");
    std::fs::write(
        &config,
        format!("database = {:?}\n", format!("sqlite://{}", missing.display())),
    )
    .unwrap();
    let base = [
        "eval",
        "--manifests",
        folder.to_str().unwrap(),
        "--queries",
        queries.to_str().unwrap(),
    ];
    let by_file = [&base[..], &["--config", config.to_str().unwrap()]].concat();
    let url = format!("sqlite://{}", missing.display());
    let by_flag = [&base[..], &["--database", url.as_str()]].concat();
    for args in [by_file, by_flag] {
        let out = run(dir.path(), &args).await;
        assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("does not exist"),
            "{}",
            shown(&out)
        );
        assert!(!missing.exists(), "{args:?} created the database");
    }

    // Another program's database is read, never changed: without a settings table it is
    // refused, and left as it was.
    let other = dir.path().join("other_app.db");
    let before = other_programs_database(&other).await;
    let url = format!("sqlite://{}", other.display());
    let out = run(dir.path(), &[&base[..], &["--database", url.as_str()]].concat()).await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("has no settings table"),
        "{}",
        shown(&out)
    );
    assert_eq!(std::fs::read(&other).unwrap(), before, "the file was changed");
    // A file that is no database at all is bad configuration alike.
    let garbage = dir.path().join("notes.db");
    std::fs::write(&garbage, "these are my notes, not a database ".repeat(200)).unwrap();
    let url = format!("sqlite://{}", garbage.display());
    let out = run(dir.path(), &[&base[..], &["--database", url.as_str()]].concat()).await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a database"),
        "{}",
        shown(&out)
    );

    // A settings table is read (these domains need no settings: every one is active).
    set_settings(dir.path(), &[("unrelated", "x")]).await;
    let url = format!("sqlite://{}", dir.path().join("toolrouter.db").display());
    let out = run(
        dir.path(),
        &[&base[..], &["--database", url.as_str(), "--json"]].concat(),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    assert_eq!(json_of(&out)["overall"]["strict_recall"], 1.0, "{}", shown(&out));
}

/// `eval` on a deployment's database measures what that daemon serves: its disabled tools
/// are not sent, its run-time domains are in the registry, and a labelled core domain that
/// is not active counts in the oracle like any labelled domain.
#[tokio::test]
async fn eval_on_a_database_measures_the_registry_and_tools_its_daemon_serves() {
    let dir = temp_dir();
    let (folder, _) = eval_fixture(dir.path());
    std::fs::write(
        folder.join("base.json"),
        r#"{"name":"base","core":true,"settings_keys":["base_url"],"tools":[
            {"name":"base_info","description":"Facts about the house","tier":"read"}]}"#,
    )
    .unwrap();
    set_settings(
        dir.path(),
        &[("toolrouter.disabled_tools", r#"["read_temperature"]"#)],
    )
    .await;
    let db = toolrouter::db::Db::connect(&format!(
        "sqlite://{}",
        dir.path().join("toolrouter.db").display()
    ))
    .await
    .unwrap();
    db.upsert_domain(
        "lab",
        r#"{"name":"lab","keywords":["oscilloscope"],"tools":[{"name":"capture","description":"Capture a trace"}]}"#,
        1,
    )
    .await
    .unwrap();
    db.close().await;
    let queries = dir.path().join("deployed.jsonl");
    std::fs::write(
        &queries,
        concat!(
            r#"{"query":"grab a capture from the oscilloscope","domains":["lab"],"split":"lab"}"#,
            "\n",
            r#"{"query":"set the thermostat to 20","domains":["climate"],"split":"climate"}"#,
            "\n",
            r#"{"query":"what do you know about the house","domains":["base"],"split":"core"}"#,
            "\n",
        ),
    )
    .unwrap();
    // Named by a config file, as the default database is named: relative to where it runs.
    let config = dir.path().join("deployed.toml");
    std::fs::write(&config, "database = \"sqlite://toolrouter.db\"\n").unwrap();
    let out = run(
        dir.path(),
        &[
            "eval",
            "--manifests",
            folder.to_str().unwrap(),
            "--queries",
            queries.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--json",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let report = json_of(&out);
    assert_eq!(report["unknown_domains"], serde_json::json!([]), "{report}");
    assert_eq!(report["registry_tools"], 5, "{report}");
    assert_eq!(report["splits"]["lab"]["strict_recall"], 1.0, "{report}");
    // climate sends one tool: read_temperature is disabled.
    assert_eq!(report["splits"]["climate"]["tools_sent"], 1.0, "{report}");
    assert_eq!(report["splits"]["climate"]["oracle_tools"], 1.0, "{report}");
    // base is inactive (no base_url): not sent, but its tool is in the oracle.
    assert_eq!(report["splits"]["core"]["strict_recall"], 0.0, "{report}");
    assert_eq!(report["splits"]["core"]["oracle_tools"], 1.0, "{report}");
}

#[tokio::test]
async fn output_that_cannot_be_written_fails_the_command() {
    let dir = temp_dir();
    let (folder, _) = eval_fixture(dir.path());
    let full = std::fs::File::create("/dev/full").unwrap();
    let out = std::process::Command::new(crate::helpers::BIN)
        .args(["check", folder.to_str().unwrap(), "--json"])
        .stdout(full)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot write the output"),
        "{out:?}"
    );
}

#[tokio::test]
async fn client_addresses_take_a_scheme_in_any_case_and_refuse_other_schemes() {
    let app = spawn_app().await;
    let port = app.addr.port();
    let upper = format!("HTTP://127.0.0.1:{port}");
    let out = run(app.dir(), &["health", "--addr", &upper]).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    for other in [
        format!("ftp://127.0.0.1:{port}"),
        format!("grpcs://127.0.0.1:{port}"),
    ] {
        let out = run(app.dir(), &["groups", "--addr", &other]).await;
        assert_eq!(out.status.code(), Some(2), "{other}: {}", shown(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("invalid --addr"),
            "{}",
            shown(&out)
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn the_client_takes_answers_over_4_mib() {
    // One tool whose description alone is over tonic's default limit of 4 MiB.
    let description = "Reads the gauge of the boiler. ".repeat(160_000);
    let manifest = format!(
        r#"{{"name":"big","tools":[{{"name":"read_gauge","description":"{description}","tier":"read"}}]}}"#
    );
    let app = TestApp::builder()
        .manifests(&[("big.json", &manifest)])
        .spawn()
        .await;
    let out = run(app.dir(), &["tools", "--addr", &app.addr.to_string(), "--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    assert!(out.stdout.len() > 4 << 20, "{}", out.stdout.len());
    app.stop().await;
}

#[tokio::test]
async fn an_interrupted_mixed_bench_reports_and_leaves_no_domain_behind() {
    let mut app = spawn_app().await;
    let messages = app.dir().join("messages.txt");
    std::fs::write(&messages, "restart the nginx container\nwhat is playing?\n").unwrap();
    let child = tokio::process::Command::new(crate::helpers::BIN)
        .args(["bench", "grpc", "--addr", &app.addr.to_string(), "--messages"])
        .arg(&messages)
        .args(["--duration", "60s", "--concurrency", "4", "--mix", "mixed"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let pid = i32::try_from(child.id().unwrap()).unwrap();
    // SAFETY: a signal to the child this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let out = tokio::time::timeout(std::time::Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("the run ends at the signal")
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("requests/s"),
        "{}",
        shown(&out)
    );
    let groups = app.group_names().await;
    assert!(
        !groups.iter().any(|g| g.starts_with("bench-worker")),
        "{groups:?}"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_load_bench_loads_active_groups_only_and_eval_prints_its_configuration() {
    let mut app = spawn_app().await;
    // One group configured among the demo's unconfigured ones.
    crate::helpers::set_settings(app.dir(), &[("sonarr_url", "http://nas:8989")]).await;
    app.invalidate().await.unwrap();
    let messages = app.dir().join("messages.txt");
    std::fs::write(&messages, "what is playing?\n").unwrap();
    let addr = app.addr.to_string();
    let messages = messages.to_str().unwrap();
    let args = [
        "bench",
        "grpc",
        "--addr",
        &addr,
        "--messages",
        messages,
        "--duration",
        "1s",
    ];
    let out = run(app.dir(), &[&args[..], &["--mix", "load"]].concat()).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(report["refused"], 0, "every load writes: {report}");
    assert!(report["ok"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(report["calls"]["LoadToolGroup"], report["ok"], "{report}");
    // `eval --print-config` prints the configuration and evaluates nothing.
    let queries = app.dir().join("q.jsonl");
    std::fs::write(&queries, "{\"query\": \"x\", \"domains\": [\"docker\"]}\n").unwrap();
    let out = run(
        app.dir(),
        &["eval", "--queries", queries.to_str().unwrap(), "--print-config"],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("fallback = \"all-active\""), "{stdout}");
    assert!(!stdout.contains("strict_recall"), "{stdout}");
    app.stop().await;
}

#[tokio::test]
async fn eval_names_a_bad_labelled_line() {
    let dir = temp_dir();
    let (folder, _) = eval_fixture(dir.path());
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"query\":\"x\",\"domains\":[\"climate\"]}\n{\"query\": 3}\n",
    )
    .unwrap();
    let out = run(
        dir.path(),
        &[
            "eval",
            "--manifests",
            folder.to_str().unwrap(),
            "--queries",
            bad.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("{}:2:", bad.display())), "{stderr}");
}

#[tokio::test]
async fn keywords_suggest_proposes_words_the_keywords_do_not_cover() {
    let dir = temp_dir();
    let (folder, _) = eval_fixture(dir.path());
    let out = run(
        dir.path(),
        &["keywords", "suggest", "--json", folder.to_str().unwrap()],
    )
    .await;
    assert!(out.status.success(), "{}", shown(&out));
    let v = json_of(&out);
    let climate = &v["domains"][0];
    assert_eq!(climate["domain"], "climate");
    let terms: Vec<&str> = climate["suggestions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["term"].as_str().unwrap())
        .collect();
    assert_eq!(terms.first(), Some(&"temperature"), "{terms:?}");
    assert!(!terms.contains(&"thermostat"), "already a keyword: {terms:?}");
}

#[tokio::test]
async fn keywords_suggest_warns_of_a_folder_without_manifests() {
    let dir = temp_dir();
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = run(dir.path(), &["keywords", "suggest", empty.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", shown(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("warning: ")
            && String::from_utf8_lossy(&out.stderr).contains("the folder holds no manifest"),
        "{}",
        shown(&out)
    );
}

/// SPEC §8 names `toolrouter bench export`: it runs the workspace's `toolrouter-bench export`
/// when that is built beside it, and otherwise says how to run it, arguments quoted.
#[tokio::test]
async fn bench_export_runs_the_tool_that_exports_or_says_how() {
    let dir = temp_dir();
    let out = run(dir.path(), &["bench", "export", "demo", "--out", "my out"]).await;
    let beside = std::path::Path::new(BIN).with_file_name("toolrouter-bench");
    if beside.is_file() {
        assert!(out.status.success(), "{}", shown(&out));
        assert!(dir.path().join("my out/manifests").is_dir(), "{}", shown(&out));
        // Its refusals and exit codes are its own.
        let out = run(dir.path(), &["bench", "export", "nosuch", "--out", "x"]).await;
        assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("nosuch"),
            "{}",
            shown(&out)
        );
    } else {
        assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr)
                .contains(r#"cargo run --release -p toolrouter-bench -- export demo --out "my out""#),
            "{}",
            shown(&out)
        );
        assert!(!dir.path().join("my out").exists());
    }
}
