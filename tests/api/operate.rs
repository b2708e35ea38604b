//! Operating the daemon from the command line: `host:port` addresses, timeouts against a
//! daemon that never answers, `--json` as protobuf's canonical JSON mapping, `reset`,
//! `describe`, exit codes, and `settings` refusing to write a database the daemon does not use.

use std::time::{Duration, Instant};

use crate::helpers::{
    Backend, Daemon, TestApp, demo_registry, fresh_postgres_database, json_of, manifest_dir,
    other_programs_database, run, shown, spawn_app, sqlite_url, temp_dir,
};

#[tokio::test]
async fn search_prints_its_hits_as_a_table_and_says_when_nothing_matched() {
    let mut app = spawn_app().await;
    app.set("qbittorrent_url", "http://nas:8080").await;
    let addr = app.addr.to_string();
    let out = run(app.dir(), &["search", "--addr", &addr, "torrent"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("TOOL"), "{text}");
    assert!(text.contains("qbittorrent"), "{text}");

    let out = run(app.dir(), &["search", "--addr", &addr, "zzzqqq"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("No tools matched 'zzzqqq'."),
        "the answer's text, not an empty table: {text}"
    );
}

#[tokio::test]
async fn client_commands_take_host_and_port_and_print_canonical_protobuf_json() {
    let mut app = spawn_app().await;
    app.set("qbittorrent_url", "http://nas:8080").await;
    let addr = app.addr.to_string(); // host:port, no scheme
    let out = run(
        app.dir(),
        &["route", "--addr", &addr, "--json", "are my torrents seeding?"],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let v = json_of(&out);
    // 64-bit integers are strings (JavaScript and jq 1.6 would round a number).
    let version = v["registryVersion"].as_str().unwrap_or_else(|| panic!("{v}"));
    assert_eq!(version, demo_registry().version().to_string());
    // Enums by name, field names in lowerCamelCase, the schema as the JSON text it is.
    let reasons: Vec<&str> = v["domains"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons, ["REASON_CORE", "REASON_KEYWORD"], "{v}");
    assert_eq!(v["domains"][1]["matchedKeywords"][0], "torrent", "{v}");
    assert!(v["tools"][1]["inputSchemaJson"].is_string(), "{v}");
    assert!(v.get("registry_version").is_none(), "no private shape: {v}");

    for args in [
        &["groups", "--json"][..],
        &["tools", "--json"],
        &["invalidate", "--json"],
        &["describe", "--json"],
        &["load", "--conversation", "c", "--json", "sonarr"],
    ] {
        let mut full = args.to_vec();
        full.extend(["--addr", &addr]);
        let out = run(app.dir(), &full).await;
        // sonarr is not configured: a runtime failure, exit 1, with no JSON on stdout.
        if args[0] == "load" {
            assert_eq!(out.status.code(), Some(1), "{}", shown(&out));
            continue;
        }
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", shown(&out));
        let v = json_of(&out);
        assert!(v.is_object(), "{args:?}: {v}");
        if let Some(version) = v.get("registryVersion") {
            assert!(version.is_string(), "{args:?}: {v}");
        }
    }
    // A URL still works.
    let out = run(app.dir(), &["groups", "--addr", &format!("http://{addr}")]).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    app.stop().await;
}

#[tokio::test]
async fn a_port_that_accepts_and_never_answers_ends_each_client_command_with_exit_1() {
    let dir = temp_dir();
    // Accepts connections and never says a word.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming() {
            held.push(s);
        }
    });
    let cases: &[(&[&str], Duration)] = &[
        (&["health"], Duration::from_secs(1)),
        (&["groups", "--timeout", "1s"], Duration::from_secs(1)),
        (&["route", "--timeout", "500ms", "hi"], Duration::from_millis(500)),
        (
            &["reset", "--conversation", "c", "--timeout", "1s"],
            Duration::from_secs(1),
        ),
        (&["describe", "--timeout", "1s"], Duration::from_secs(1)),
    ];
    for (args, limit) in cases {
        let mut full = args.to_vec();
        full.extend(["--addr", &addr]);
        let started = Instant::now();
        let out = tokio::time::timeout(Duration::from_secs(20), run(dir.path(), &full))
            .await
            .unwrap_or_else(|_| panic!("{args:?} hung"));
        let took = started.elapsed();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", shown(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("no answer from {addr} within")),
            "{args:?}: {stderr}"
        );
        assert!(took < *limit + Duration::from_secs(3), "{args:?} took {took:?}");
    }
}

#[tokio::test]
async fn serve_listens_on_a_host_name() {
    let dir = temp_dir();
    let out = run(
        dir.path(),
        &["serve", "--listen", "localhost:50061", "--print-config"],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("listen = \"127.0.0.1:50061\"") || stdout.contains("listen = \"[::1]:50061\""),
        "{stdout}"
    );
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "listen = \"localhost:50062\"\n").unwrap();
    let out = run(
        dir.path(),
        &["serve", "--print-config", "--config", file.to_str().unwrap()],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let out = run(
        dir.path(),
        &["serve", "--listen", "no-such-host.invalid:1", "--print-config"],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
}

#[tokio::test]
async fn reset_forgets_a_conversation() {
    let mut app = spawn_app().await;
    app.set("sonarr_url", "http://nas:8989").await;
    app.load("c1", "sonarr").await.unwrap();
    let loaded = |r: &toolrouter::proto::RouteResponse| r.domains.iter().any(|d| d.domain == "sonarr");
    assert!(loaded(&app.route("thanks", "c1").await));
    let out = run(
        app.dir(),
        &["reset", "--conversation", "c1", "--addr", &app.addr.to_string()],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let r = app.route("thanks", "c1").await;
    assert!(
        r.domains
            .iter()
            .all(|d| d.domain != "sonarr" || d.reason == toolrouter::proto::Reason::Fallback as i32),
        "{r:?}"
    );
    let out = run(
        app.dir(),
        &["reset", "--conversation", " ", "--addr", &app.addr.to_string()],
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", shown(&out));
    app.stop().await;
}

#[tokio::test]
async fn a_refused_reload_exits_2_and_a_good_one_0() {
    let app = TestApp::builder()
        .manifests(&[("a.json", r#"{"name":"a"}"#)])
        .spawn()
        .await;
    let folder = app.manifests();
    let addr = app.addr.to_string();
    let out = run(app.dir(), &["reload", "--addr", &addr]).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    std::fs::write(folder.join("b.json"), r#"[{"_meta": true, "keywrods": ["x"]}]"#).unwrap();
    let out = run(app.dir(), &["reload", "--addr", &addr]).await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown field `keywrods`"),
        "{}",
        shown(&out)
    );
    app.stop().await;
}

#[tokio::test]
async fn describe_names_the_daemons_database_and_registry() {
    let app = spawn_app().await;
    let out = run(
        app.dir(),
        &["describe", "--json", "--addr", &app.addr.to_string()],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let v = json_of(&out);
    let db = std::fs::canonicalize(app.db_path()).unwrap();
    assert_eq!(v["databasePath"], db.display().to_string(), "{v}");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"), "{v}");
    let demo = demo_registry();
    assert_eq!(v["registryVersion"], demo.version().to_string(), "{v}");
    assert_eq!(v["domains"], demo.domains().len(), "{v}");
    assert_eq!(v["tools"], demo.tool_count(), "{v}");
    assert!(v["uptimeSeconds"].as_f64().is_some_and(|s| s >= 0.0), "{v}");
    assert!(v["configToml"].as_str().unwrap().contains("settings_ttl"), "{v}");
    // Human output too.
    let out = run(app.dir(), &["describe", "--addr", &app.addr.to_string()]).await;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&db.display().to_string()),
        "{}",
        shown(&out)
    );
    app.stop().await;
}

#[tokio::test]
async fn settings_writes_the_daemons_database_and_refuses_another_one() {
    let mut app = spawn_app().await;
    let addr = app.addr.to_string();
    // The command runs elsewhere, where `./toolrouter.db` is another file.
    let elsewhere = temp_dir();
    let out = run(
        elsewhere.path(),
        &[
            "settings",
            "--addr",
            &addr,
            "set",
            "qbittorrent_url",
            "http://nas:8080",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    assert!(
        !elsewhere.path().join("toolrouter.db").exists(),
        "no stray database"
    );
    let r = app.route("torrent", "").await;
    assert!(
        r.domains.iter().any(|d| d.domain == "qbittorrent"),
        "the daemon's database was written: {r:?}"
    );

    // Naming another database is refused, and creates nothing.
    let other = elsewhere.path().join("other.db");
    let other_url = sqlite_url(&other);
    for args in [
        &[
            "settings",
            "--addr",
            &addr,
            "--database",
            &other_url,
            "set",
            "k",
            "v",
        ][..],
        &[
            "settings",
            "--addr",
            &addr,
            "--database",
            &other_url,
            "--create",
            "unset",
            "k",
        ],
    ] {
        let out = run(elsewhere.path(), args).await;
        assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("uses") && stderr.contains("--force"), "{stderr}");
        assert!(!other.exists(), "{args:?} created the other database");
    }
    // --force --create writes it anyway.
    let out = run(
        elsewhere.path(),
        &[
            "settings",
            "--addr",
            &addr,
            "--database",
            &other_url,
            "--force",
            "--create",
            "set",
            "k",
            "v",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    assert!(other.exists());
    // The daemon, which does not use that file, is not told (nor said to have re-read), and
    // the note says so rather than offer the --force just given.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.trim(), "set k", "{}", shown(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("anyway (--force); the daemon is not told") && !stderr.contains("or --force"),
        "{stderr}"
    );
    // `unset` takes a blank key (another program may have written one).
    let out = run(elsewhere.path(), &["settings", "--addr", &addr, "unset", " "]).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    // With --json the note is in the answer too.
    let out = run(
        elsewhere.path(),
        &[
            "settings",
            "--addr",
            &addr,
            "--database",
            &other_url,
            "--force",
            "unset",
            "k",
            "--json",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let v = json_of(&out);
    assert_eq!(v["wasSet"], true, "{v}");
    assert!(
        v["note"]
            .as_str()
            .is_some_and(|n| n.contains("the daemon is not told")),
        "{v}"
    );

    // `list --json` shows the daemon's settings.
    let out = run(elsewhere.path(), &["settings", "--addr", &addr, "list", "--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    assert_eq!(json_of(&out)["settings"]["qbittorrent_url"], "http://nas:8080");
    // `set`/`unset --json` say what was done and the daemon's answer.
    let out = run(
        elsewhere.path(),
        &["settings", "--addr", &addr, "unset", "qbittorrent_url", "--json"],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let v = json_of(&out);
    assert_eq!(
        (&v["action"], &v["key"], &v["wasSet"]),
        (&"unset".into(), &"qbittorrent_url".into(), &true.into()),
        "{v}"
    );
    assert!(v["invalidated"].is_object() && v.get("note").is_none(), "{v}");
    app.stop().await;
}

#[tokio::test]
async fn settings_refuses_to_guess_when_the_daemon_will_not_say_its_database() {
    let app = TestApp::builder()
        .config(|c| c.auth_token = Some("s3cret".into()))
        .spawn()
        .await;
    let addr = app.addr.to_string();
    let elsewhere = temp_dir();
    // No token: the daemon answers UNAUTHENTICATED, which is not "no daemon".
    let out = run(
        elsewhere.path(),
        &["settings", "--addr", &addr, "--create", "set", "k", "v"],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("did not say which database") && stderr.contains("--auth-token"),
        "{stderr}"
    );
    assert!(
        !elsewhere.path().join("toolrouter.db").exists(),
        "no stray database"
    );
    app.stop().await;
}

#[tokio::test]
async fn settings_refuses_to_guess_when_the_daemon_cannot_be_asked_and_names_bad_options() {
    let app = TestApp::builder().tls().spawn().await;
    let elsewhere = temp_dir();
    // A database of the folder's own, which the TLS daemon does not use.
    let local = elsewhere.path().join("toolrouter.db");
    let out = run(elsewhere.path(), &["settings", "--create", "set", "k", "local"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let before = std::fs::read(&local).unwrap();
    // The daemon's certificate is not trusted without --tls-ca: it is there, but cannot say
    // which database it uses.
    let https = format!("https://localhost:{}", app.addr.port());
    let out = run(elsewhere.path(), &["settings", "--addr", &https, "set", "k", "v"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("could not be asked which database"),
        "{}",
        shown(&out)
    );
    // A CA file that is no certificate, and a token that cannot be sent, are the caller's.
    let not_pem = elsewhere.path().join("ca.txt");
    std::fs::write(&not_pem, "not a certificate").unwrap();
    let plain = app.addr.to_string();
    for args in [
        vec!["--addr", https.as_str(), "--tls-ca", not_pem.to_str().unwrap()],
        vec!["--addr", plain.as_str(), "--auth-token", "x\u{1}"],
    ] {
        let out = run(
            elsewhere.path(),
            &[&["settings"][..], &args, &["set", "k", "v"]].concat(),
        )
        .await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", shown(&out));
    }
    assert_eq!(
        std::fs::read(&local).unwrap(),
        before,
        "nothing written to the wrong database"
    );
    app.stop().await;
}

/// A port that completes the HTTP/2 handshake (the daemon's SETTINGS, and an ACK of the
/// client's) and then reads every call without ever answering one.
fn http2_port_that_never_answers() -> String {
    use std::io::{Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            std::thread::spawn(move || {
                let mut preface = [0u8; 24];
                if s.read_exact(&mut preface).is_err() || s.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).is_err() {
                    return;
                }
                let mut header = [0u8; 9];
                while s.read_exact(&mut header).is_ok() {
                    let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
                    let mut payload = vec![0u8; len];
                    if s.read_exact(&mut payload).is_err() {
                        return;
                    }
                    // SETTINGS without the ACK flag: acknowledge it, as a server must.
                    if header[3] == 4
                        && header[4] & 1 == 0
                        && s.write_all(&[0, 0, 0, 4, 1, 0, 0, 0, 0]).is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn settings_refuses_to_guess_when_a_daemon_never_answers_and_writes_a_named_database() {
    let dir = temp_dir();
    let addr = http2_port_that_never_answers();
    // Whichever deadline ends the DescribeServer call (the client's own, the channel's sent as
    // grpc-timeout), a daemon is there (stopped, or overloaded) that did not name its
    // database: the default one may not be it, so nothing is written.
    let set = [
        "settings",
        "--addr",
        &addr,
        "--timeout",
        "1s",
        "--create",
        "set",
        "k",
        "v",
    ];
    let out = run(dir.path(), &set).await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "the daemon at {addr} did not say within 1s which database it uses: pass --database"
        )),
        "{stderr}"
    );
    assert!(
        !dir.path().join("toolrouter.db").exists(),
        "no database is written"
    );
    // With --database named, it is written; the re-read request meets the same silence: a
    // note, not a failure.
    let db = dir.path().join("named.db");
    let url = sqlite_url(&db);
    let mut named = set.to_vec();
    named.splice(3..3, ["--database", url.as_str()]);
    let out = run(dir.path(), &named).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("set k"), "{stdout}");
    assert!(
        stdout.contains(&format!("no answer from {addr} within 1s")),
        "{stdout}"
    );
    assert!(db.exists(), "the named database is written");
}

#[tokio::test]
async fn settings_refuses_a_value_the_daemon_would_ignore_and_a_url_it_cannot_use() {
    let dir = temp_dir();
    let db = dir.path().join("t.db");
    let url = sqlite_url(&db);
    let base = ["settings", "--addr", "127.0.0.1:1", "--timeout", "1s"];
    let refused: &[(&[&str], &str)] = &[
        (
            &[
                "--database",
                &url,
                "--create",
                "set",
                "toolrouter.disabled_tools",
                "docker_*,sys_uptime",
            ],
            "`toolrouter.disabled_tools` must be a JSON array of tool names or globs",
        ),
        (
            &["--database", &url, "--create", "set", " ", "v"],
            "the settings key is empty or whitespace-only",
        ),
        (
            &["--database", "mysql://x/y", "--create", "set", "k", "v"],
            "neither sqlite://FILE nor postgres://",
        ),
        (
            &["--database", "sqlite::memory:", "set", "k", "v"],
            "is an in-memory database",
        ),
    ];
    for (args, want) in refused {
        let out = run(dir.path(), &[&base[..], args].concat()).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", shown(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(want), "{args:?}: {stderr}");
        assert!(!db.exists(), "{args:?}: nothing written");
    }
    let out = run(
        dir.path(),
        &[
            &base[..],
            &[
                "--database",
                &url,
                "--create",
                "set",
                "toolrouter.disabled_tools",
                r#"["docker_*"]"#,
            ],
        ]
        .concat(),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
}

#[tokio::test]
async fn settings_refuses_a_database_that_does_not_exist_unless_create() {
    let dir = temp_dir();
    let missing = dir.path().join("nonexist").join("x.db");
    let url = sqlite_url(&missing);
    let fresh = dir.path().join("fresh.db");
    let fresh_url = sqlite_url(&fresh);
    // No daemon listens on port 1.
    let out = run(
        dir.path(),
        &["settings", "--addr", "127.0.0.1:1", "--database", &url, "list"],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not exist"),
        "{}",
        shown(&out)
    );
    assert!(!missing.exists());
    let out = run(
        dir.path(),
        &[
            "settings",
            "--addr",
            "127.0.0.1:1",
            "--database",
            &fresh_url,
            "set",
            "k",
            "v",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    assert!(!fresh.exists());
    // A log left beside a deleted file would be read as the new file's: refused.
    let orphan = dir.path().join("orphan.db");
    std::fs::write(dir.path().join("orphan.db-wal"), b"log").unwrap();
    let out = run(
        dir.path(),
        &[
            "settings",
            "--addr",
            "127.0.0.1:1",
            "--database",
            &sqlite_url(&orphan),
            "--create",
            "set",
            "k",
            "v",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("but its write-ahead log"),
        "{}",
        shown(&out)
    );
    assert!(!orphan.exists());
    let out = run(
        dir.path(),
        &[
            "settings",
            "--addr",
            "127.0.0.1:1",
            "--database",
            &fresh_url,
            "--create",
            "set",
            "k",
            "v",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    assert!(fresh.exists());
    let out = run(
        dir.path(),
        &[
            "settings",
            "--addr",
            "127.0.0.1:1",
            "--database",
            &fresh_url,
            "list",
            "--json",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    assert_eq!(json_of(&out)["settings"]["k"], "v", "{}", shown(&out));

    // Listing another program's database reads it and changes nothing; without a settings
    // table there is nothing to list.
    let other = dir.path().join("other_app.db");
    let before = other_programs_database(&other).await;
    let other_url = sqlite_url(&other);
    let out = run(
        dir.path(),
        &[
            "settings",
            "--addr",
            "127.0.0.1:1",
            "--database",
            &other_url,
            "list",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    assert!(shown(&out).contains("has no settings table"), "{}", shown(&out));
    assert_eq!(std::fs::read(&other).unwrap(), before, "the file was changed");
}

#[tokio::test]
async fn check_json_lists_errors_and_warnings_with_positions() {
    let dir = temp_dir();
    let folder = manifest_dir(
        dir.path(),
        "m",
        &[
            (
                "a.json",
                r#"{"name":"a","tools":[{"name":"t","description":"d"}]}"#,
            ),
            ("notes.txt", "hello"),
        ],
    );
    let f = folder.to_str().unwrap();
    let out = run(dir.path(), &["check", "--json", f]).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let v = json_of(&out);
    assert_eq!(
        (v["ok"].clone(), v["domains"].clone(), v["tools"].clone()),
        (true.into(), 1.into(), 1.into())
    );
    assert!(v["registryVersion"].is_string(), "{v}");
    let warnings: Vec<&str> = v["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["message"].as_str().unwrap())
        .collect();
    assert_eq!(warnings.len(), 2, "{v}");
    assert!(warnings.iter().any(|w| w.contains("has no tier")), "{v}");
    assert!(warnings.iter().any(|w| w.contains("skipped")), "{v}");

    std::fs::write(
        folder.join("b.json"),
        "{\n  \"name\": \"b\",\n  \"name\": \"c\"\n}",
    )
    .unwrap();
    let out = run(dir.path(), &["check", "--json", f]).await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    let v = json_of(&out);
    assert_eq!(v["ok"], false);
    let e = &v["errors"][0];
    assert_eq!(
        (e["line"].clone(), e["column"].clone()),
        (3.into(), 8.into()),
        "{v}"
    );
    assert!(
        e["message"].as_str().unwrap().contains("duplicate key `name`"),
        "{v}"
    );
    // Without --json: warnings on stderr, summary on stdout.
    std::fs::remove_file(folder.join("b.json")).unwrap();
    let out = run(dir.path(), &["check", f]).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("warning: "),
        "{}",
        shown(&out)
    );
}

/// `url` (the test server's, trust authentication, which ignores passwords) with a password
/// before the host and another as a query parameter.
fn with_credentials(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (user, rest) = rest.split_once('@').unwrap();
    let sep = if rest.contains('?') { '&' } else { '?' };
    format!("{scheme}://{user}:s3cret-user@{rest}{sep}password=s3cret-query")
}

#[tokio::test]
async fn on_postgres_credentials_show_nowhere_and_settings_asks_for_them() {
    if Backend::postgres_url().is_none() {
        return;
    }
    let dir = temp_dir();
    let database = with_credentials(&fresh_postgres_database().await);
    let out = run(dir.path(), &["serve", "--print-config", "--database", &database]).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    assert!(!shown(&out).contains("s3cret"), "{}", shown(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("# database credentials are set"),
        "{}",
        shown(&out)
    );

    let daemon = Daemon::start_on(&database, &[]);
    let addr = daemon.addr.to_string();
    let out = run(dir.path(), &["describe", "--json", "--addr", &addr]).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let v = json_of(&out);
    assert!(!v.to_string().contains("s3cret"), "{v}");
    assert!(
        v["database"]
            .as_str()
            .unwrap()
            .starts_with("postgres://127.0.0.1:"),
        "{v}"
    );
    assert_eq!(v["databasePath"], serde_json::Value::Null, "{v}");

    // Without --database, `settings` cannot write: the daemon does not hand out credentials.
    let set = ["settings", "--addr", &addr, "set", "sonarr_url", "x"];
    let out = run(dir.path(), &set).await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    assert!(shown(&out).contains("its credentials"), "{}", shown(&out));
    assert!(!dir.path().join("toolrouter.db").exists(), "no stray database");
    // With them it writes, and the daemon re-reads.
    let with = [
        "settings",
        "--addr",
        &addr,
        "--database",
        &database,
        "set",
        "sonarr_url",
        "x",
    ];
    let out = run(dir.path(), &with).await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("active domains: sonarr, system"),
        "{}",
        shown(&out)
    );
    // The same database with other connection parameters is the daemon's.
    let same = format!("{database}&application_name=settings-ui&sslmode=disable");
    let out = run(
        dir.path(),
        &["settings", "--addr", &addr, "--database", &same, "set", "k", "v"],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    // Another database is refused, as another file would be.
    let other = fresh_postgres_database().await;
    let elsewhere = ["settings", "--addr", &addr, "--database", &other, "set", "k", "v"];
    let out = run(dir.path(), &elsewhere).await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    assert!(shown(&out).contains("--force"), "{}", shown(&out));
    assert!(!daemon.log().contains("s3cret"), "{}", daemon.log());
}
