//! The daemon as a process: SIGKILL right after an acknowledged load, SIGTERM with calls in
//! flight (drained, or cut at the drain timeout), SIGHUP reloads, another process writing
//! the settings table under load, and the refusal to listen openly without a token.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use toolrouter::proto::{InvalidateSettingsRequest, ListGroupsRequest, Reason, WatchRegistryRequest};

use crate::helpers::{
    Backend, Daemon, WriteLock, call_lines, certificates, conversation_hash, database_on, db_url,
    demo_registry, free_addr, health, http1, json_lines, load_request, loaded, manifest_dir, raw, reasons,
    route_request, run, run_with_env, sample, scrape, set_settings, set_settings_at, shown, temp_dir,
};

crate::on_both_backends!(a_load_acknowledged_before_sigkill_is_there_after_a_restart);

async fn a_load_acknowledged_before_sigkill_is_there_after_a_restart(backend: Backend) {
    let dir = temp_dir();
    let database = database_on(backend, dir.path()).await;
    set_settings_at(&database, &[("sonarr_url", "x")]).await;
    let mut daemon = Daemon::start_on(&database, &[]);
    let mut client = daemon.client().await;
    client
        .load_tool_group(load_request("c1", "sonarr"))
        .await
        .unwrap();
    daemon.signal("KILL");
    let status = daemon.exit(Duration::from_secs(10)).await.expect("killed");
    assert!(!status.success());

    let daemon = Daemon::start_on(&database, &[]);
    let r = daemon
        .client()
        .await
        .route(route_request("thanks", "c1"))
        .await
        .unwrap()
        .into_inner();
    let sonarr = r
        .domains
        .iter()
        .find(|d| d.domain == "sonarr")
        .expect("loaded after restart");
    assert_eq!(sonarr.reason(), Reason::Loaded);
}

#[tokio::test]
async fn sigterm_stops_accepting_finishes_the_call_in_flight_and_exits_0() {
    let dir = temp_dir();
    set_settings(dir.path(), &[("sonarr_url", "x")]).await;
    let mut daemon = Daemon::start(dir.path(), &["--busy-timeout", "30s"]);
    let lock = WriteLock::take(dir.path()).await;
    let mut client = daemon.client().await;
    let in_flight = tokio::spawn(async move { client.load_tool_group(load_request("c1", "sonarr")).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    daemon.signal("TERM");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        daemon.connection().channel().await.is_err(),
        "no new connections while draining"
    );
    assert!(
        daemon.child.try_wait().unwrap().is_none(),
        "still draining the call in flight"
    );

    lock.release().await;
    let answer = in_flight.await.unwrap();
    assert!(answer.is_ok(), "the call in flight finished: {answer:?}");
    let status = daemon.exit(Duration::from_secs(20)).await.expect("exited");
    assert_eq!(status.code(), Some(0), "{}", daemon.log());
    assert!(
        loaded(dir.path(), "c1", "sonarr").await,
        "the acknowledged load is on disk"
    );
}

#[tokio::test]
async fn a_client_that_ignores_the_shutdown_holds_it_to_the_drain_timeout_and_the_log_says_no_call_was_cut() {
    use tokio::io::AsyncWriteExt as _;
    let dir = temp_dir();
    let mut daemon = Daemon::start(dir.path(), &["--drain-timeout", "500ms"]);
    // HTTP/2 spoken, then nothing read: the daemon's GOAWAY and PING go unanswered.
    let mut deaf = tokio::net::TcpStream::connect(daemon.addr).await.unwrap();
    deaf.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    daemon.signal("TERM");
    let status = daemon.exit(Duration::from_secs(20)).await.expect("exited");
    assert_eq!(status.code(), Some(0), "{}", daemon.log());
    let log = daemon.log();
    assert!(
        log.contains("drain timeout reached with no call in flight") && !log.contains("dropping the calls"),
        "{log}"
    );
    drop(deaf);
}

#[tokio::test]
async fn at_the_drain_timeout_the_daemon_exits_0_and_the_cut_call_is_not_acknowledged() {
    let dir = temp_dir();
    set_settings(dir.path(), &[("sonarr_url", "x")]).await;
    let mut daemon = Daemon::start(dir.path(), &["--busy-timeout", "60s", "--drain-timeout", "500ms"]);
    let lock = WriteLock::take(dir.path()).await;
    let mut client = daemon.client().await;
    let in_flight = tokio::spawn(async move { client.load_tool_group(load_request("c1", "sonarr")).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    daemon.signal("TERM");
    // The lock is still held: only the drain timeout can end the call.
    let status = daemon
        .exit(Duration::from_secs(20))
        .await
        .expect("exited at the drain timeout");
    assert_eq!(status.code(), Some(0), "{}", daemon.log());
    assert!(
        daemon
            .log()
            .contains("drain timeout reached; dropping the calls still in flight"),
        "{}",
        daemon.log()
    );
    // The cut call still has its line (SPEC §11: one per call).
    let lines = json_lines(&daemon.log());
    let cut: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|v| v["fields"]["method"] == "LoadToolGroup")
        .collect();
    assert_eq!(cut.len(), 1, "{}", daemon.log());
    assert!(
        cut[0]["fields"]["message"]
            .as_str()
            .unwrap()
            .starts_with("call dropped before it answered"),
        "{}",
        daemon.log()
    );
    let answer = in_flight.await.unwrap();
    assert!(
        answer.is_err(),
        "a call cut at shutdown is not answered OK: {answer:?}"
    );
    lock.release().await;
    assert!(
        !loaded(dir.path(), "c1", "sonarr").await,
        "nothing unacknowledged was written"
    );
}

#[tokio::test]
async fn sighup_reloads_the_manifests_and_a_broken_reload_keeps_the_old_registry() {
    let dir = temp_dir();
    let one = r#"{"name":"alpha","tools":[{"name":"a","description":"A"}]}"#;
    let folder = manifest_dir(dir.path(), "m", &[("alpha.json", one)]);
    let daemon = Daemon::start(
        dir.path(),
        &["--manifests", folder.to_str().unwrap(), "--log-format", "text"],
    );
    let mut client = daemon.client().await;
    let names = |r: toolrouter::proto::ListGroupsResponse| -> Vec<String> {
        r.groups.into_iter().map(|g| g.name).collect()
    };

    std::fs::write(
        folder.join("beta.json"),
        r#"{"name":"beta","tools":[{"name":"b","description":"B"}]}"#,
    )
    .unwrap();
    daemon.signal("HUP");
    let mut seen = Vec::new();
    for _ in 0..200 {
        seen = names(
            client
                .list_groups(ListGroupsRequest::default())
                .await
                .unwrap()
                .into_inner(),
        );
        if seen.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seen, ["alpha", "beta"]);

    std::fs::write(folder.join("gamma.json"), "{ not json").unwrap();
    daemon.signal("HUP");
    for _ in 0..200 {
        if daemon.log().contains("registry reload failed") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = daemon.log();
    // The error (a head line, then the problem) in the one line of its event (SPEC §11:
    // one line each), each line of the log an event of its own with its time and level.
    let failed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("registry reload failed"))
        .collect();
    assert!(
        failed.len() == 1
            && failed[0].contains("still serving registry version")
            && failed[0].contains("gamma.json"),
        "{log}"
    );
    for line in log.lines() {
        let level = line.split_whitespace().nth(1).unwrap_or("");
        assert!(
            ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&level),
            "a line that is not an event of its own: {line:?} in\n{log}"
        );
    }
    let groups = client
        .list_groups(ListGroupsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(names(groups), ["alpha", "beta"], "the old registry serves on");
}

#[tokio::test]
async fn another_process_flipping_settings_under_load_causes_no_errors() {
    let dir = temp_dir();
    set_settings(dir.path(), &[("sonarr_url", "x")]).await;
    let daemon = Daemon::start(dir.path(), &["--settings-ttl", "50ms"]);
    // The other process: `toolrouter settings`, run back to back a fixed number of times,
    // setting and clearing docker's key in the daemon's database and asking the daemon to
    // re-read it each time. The load runs until the last write is done, however slow the
    // machine, so every write meets calls in flight.
    const WRITES: u32 = 24;
    let flipping = Arc::new(AtomicBool::new(true));
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(daemon.client().await);
    }
    let flipper = {
        let cwd = dir.path().to_owned();
        let (database, addr) = (db_url(dir.path()), daemon.addr.to_string());
        // Cleared when the flipper ends, by a failed write too, so the load always stops.
        struct Done(Arc<AtomicBool>);
        impl Drop for Done {
            fn drop(&mut self) {
                self.0.store(false, Ordering::SeqCst);
            }
        }
        let done = Done(Arc::clone(&flipping));
        tokio::spawn(async move {
            let _done = done;
            let mut writes = 0u32;
            while writes < WRITES {
                let action: &[&str] = if writes.is_multiple_of(2) {
                    &["set", "docker_host", "x"]
                } else {
                    &["unset", "docker_host"]
                };
                let mut args = vec!["settings"];
                args.extend_from_slice(action);
                args.extend(["--database", &database, "--addr", &addr]);
                let out = run(&cwd, &args).await;
                assert!(out.status.success(), "{}", shown(&out));
                writes += 1;
            }
            writes
        })
    };
    let mut workers = Vec::new();
    for (w, mut client) in clients.into_iter().enumerate() {
        let flipping = Arc::clone(&flipping);
        workers.push(tokio::spawn(async move {
            // Calls answered while the flipper was still writing.
            let (mut during, mut refused) = (0u32, 0u32);
            let mut n = 0;
            while flipping.load(Ordering::SeqCst) || n < 30 {
                n += 1;
                let conversation_id = format!("w{w}-{}", n / 20);
                match n % 10 {
                    0 => {
                        client
                            .invalidate_settings(InvalidateSettingsRequest {})
                            .await
                            .unwrap();
                    }
                    1 => match client
                        .load_tool_group(load_request(&conversation_id, "docker"))
                        .await
                    {
                        Ok(_) => {}
                        // The flipper may have just cleared docker's settings: a correct refusal.
                        Err(s) if s.code() == Code::FailedPrecondition => refused += 1,
                        Err(s) => panic!("LoadToolGroup failed: {s:?}"),
                    },
                    _ => {
                        client
                            .route(route_request(
                                "restart the container for the next episode",
                                &conversation_id,
                            ))
                            .await
                            .unwrap();
                    }
                }
                if flipping.load(Ordering::SeqCst) {
                    during += 1;
                }
            }
            (during, refused)
        }));
    }
    let mut during = 0;
    for w in workers {
        during += w.await.unwrap().0;
    }
    let writes = flipper.await.unwrap();
    assert_eq!(writes, WRITES, "the settings were written meanwhile");
    assert!(
        during >= WRITES,
        "the daemon served load while they were written ({during} calls)"
    );
    assert!(!daemon.log().contains("\"ERROR\""), "{}", daemon.log());
}

#[tokio::test]
async fn a_non_loopback_address_without_a_token_is_refused_with_what_to_do() {
    let dir = temp_dir();
    let out = run(
        dir.path(),
        &[
            "serve",
            "--listen",
            "0.0.0.0:0",
            "--database",
            "sqlite://never.db",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("refusing to listen on 0.0.0.0:0"), "{stderr}");
    assert!(stderr.contains("--allow-unauthenticated"), "{stderr}");
    for extra in [&["--auth-token", "t"][..], &["--allow-unauthenticated"][..]] {
        let args = [&["serve", "--listen", "0.0.0.0:0", "--print-config"][..], extra].concat();
        let out = run(dir.path(), &args).await;
        assert_eq!(out.status.code(), Some(0), "{extra:?}: {}", shown(&out));
    }
}

#[tokio::test]
async fn a_tls_certificate_out_of_date_is_a_warning_in_the_log() {
    let dir = temp_dir();
    let key = rcgen::KeyPair::generate().unwrap();
    let key_file = dir.path().join("key.pem");
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    // (certificate, valid from, valid until, the warning)
    let cases = [
        (
            "expired.pem",
            (2020, 1, 1),
            (2021, 1, 1),
            "expired at Jan  1 00:00:00 2021",
        ),
        (
            "future.pem",
            (2090, 1, 1),
            (2091, 1, 1),
            "is not valid until Jan  1 00:00:00 2090",
        ),
    ];
    for (name, from, until, want) in cases {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.not_before = rcgen::date_time_ymd(from.0, from.1, from.2);
        params.not_after = rcgen::date_time_ymd(until.0, until.1, until.2);
        let cert = dir.path().join(name);
        std::fs::write(&cert, params.self_signed(&key).unwrap().pem()).unwrap();
        // The missing manifest folder ends the start right after the TLS files are read.
        let out = run(
            dir.path(),
            &[
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--tls-cert",
                cert.to_str().unwrap(),
                "--tls-key",
                key_file.to_str().unwrap(),
                "--manifests",
                "no-such-folder",
            ],
        )
        .await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("WARN") && stderr.contains(want) && stderr.contains("clients will refuse"),
            "{name}: {}",
            shown(&out)
        );
    }
}

#[tokio::test]
async fn bad_database_urls_and_tls_files_are_bad_configuration_exit_2() {
    let dir = temp_dir();
    // A file of `text` in the folder: its path.
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let missing = dir.path().join("missing.pem");
    let missing = missing.to_str().unwrap();
    let garbage = &file("garbage.pem", "not a certificate");
    let (_, cert, key) = certificates(dir.path());
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let (_, other_cert, _) = certificates(&other);
    let other_cert = other_cert.to_str().unwrap();
    let encrypted = &file(
        "encrypted.pem",
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIBvTBXBgkqhkiG9w0BBQ0wSjApBgkqhkiG\n-----END ENCRYPTED PRIVATE KEY-----\n",
    );
    let broken = &file(
        "broken.pem",
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    );
    let database_cases: [(&[&str], &str); 3] = [
        (
            &["--database", "mysql://x/y"],
            "neither sqlite://FILE nor postgres://",
        ),
        (&["--database", ""], "neither sqlite://FILE nor postgres://"),
        (&["--database", "sqlite::memory:"], "is an in-memory database"),
    ];
    // (--tls-cert, --tls-key, what the refusal says)
    let tls_cases = [
        (missing, missing, "cannot read TLS file"),
        (garbage, garbage, "garbage.pem holds no PEM certificate"),
        (cert, garbage, "garbage.pem holds no PEM private key"),
        (key, key, "key.pem holds no PEM certificate"),
        (other_cert, key, "key.pem does not belong to the certificate in "),
        (
            cert,
            encrypted,
            "encrypted.pem holds an encrypted private key: give it unencrypted",
        ),
        (broken, key, "broken.pem is not a usable certificate: "),
    ];
    let cases = database_cases
        .iter()
        .map(|(extra, want)| (extra.to_vec(), *want))
        .chain(tls_cases.iter().map(|&(cert, key, want)| {
            let extra = vec![
                "--database",
                "sqlite://never.db",
                "--tls-cert",
                cert,
                "--tls-key",
                key,
            ];
            (extra, want)
        }));
    for (extra, want) in cases {
        let args = [&["serve", "--listen", "127.0.0.1:0"][..], &extra].concat();
        let out = run(dir.path(), &args).await;
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", shown(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(want),
            "{extra:?}: {}",
            shown(&out)
        );
    }
    // A database file that cannot be opened is a runtime failure (exit 1) naming the file,
    // and why where SQLite would not say.
    let not_a_db = dir.path().join("notes.db");
    std::fs::write(&not_a_db, vec![0x5a_u8; 8192]).unwrap();
    let folder = dir.path().join("no-such-folder");
    let no_folder = folder.join("t.db");
    let a_folder = dir.path().to_path_buf();
    for (file, why) in [
        (&not_a_db, "file is not a database".to_string()),
        (
            &no_folder,
            format!("its folder {} does not exist", folder.display()),
        ),
        (&a_folder, "it is a directory".to_string()),
    ] {
        let url = format!("sqlite://{}", file.display());
        let out = run(
            dir.path(),
            &["serve", "--listen", "127.0.0.1:0", "--database", &url],
        )
        .await;
        assert_eq!(out.status.code(), Some(1), "{}", shown(&out));
        let want = format!("cannot open the database file {}: ", file.display());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.lines().any(|l| l.contains(&want) && l.ends_with(&why)),
            "{}",
            shown(&out)
        );
    }
}

#[tokio::test]
async fn calls_cut_at_their_callers_deadline_and_streams_are_logged_and_counted_as_they_ended() {
    let dir = temp_dir();
    set_settings(dir.path(), &[("qbittorrent_url", "http://nas:8080")]).await;
    let metrics = free_addr();
    let mut daemon = Daemon::start(
        dir.path(),
        &["--metrics-listen", &metrics, "--busy-timeout", "30s"],
    );
    let mut c = daemon.client().await;

    // A load waiting for another writer's lock past the 300 ms its caller allows: tonic
    // answers it CANCELLED at the caller's deadline and drops the call.
    let lock = WriteLock::take(dir.path()).await;
    let mut request = tonic::Request::new(load_request("c1", "qbittorrent"));
    request.set_timeout(Duration::from_millis(300));
    let cut = c.load_tool_group(request).await.unwrap_err();
    assert_eq!(cut.code(), Code::Cancelled, "{cut:?}");
    lock.release().await;

    // A watch its caller closes, and one still open when the daemon stops.
    let watch = || WatchRegistryRequest::default();
    let mut closed = c.watch_registry(watch()).await.unwrap().into_inner();
    closed.message().await.unwrap().expect("the current state");
    drop(closed);
    // One that reaches the deadline its caller set: the daemon ends it there, as gRPC has
    // it (tonic bounds a call only until its answer starts).
    let mut timed = tonic::Request::new(watch());
    timed.set_timeout(Duration::from_millis(300));
    let started = Instant::now();
    let mut timed = c.watch_registry(timed).await.unwrap().into_inner();
    timed.message().await.unwrap().expect("the current state");
    let ended = tokio::time::timeout(Duration::from_secs(5), timed.message())
        .await
        .expect("the daemon ends the stream at the deadline")
        .unwrap_err();
    assert_eq!(ended.code(), Code::DeadlineExceeded, "{ended:?}");
    assert_eq!(
        ended.message(),
        "The caller's deadline (grpc-timeout) of 300ms passed."
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    drop(timed);
    let mut open = c.watch_registry(watch()).await.unwrap().into_inner();
    open.message().await.unwrap().expect("the current state");

    let series =
        |code: &str, method: &str| format!(r#"toolrouter_requests_total{{code="{code}",method="{method}"}}"#);
    let wanted = [
        (series("CANCELLED", "LoadToolGroup"), 1.0),
        (series("CANCELLED", "WatchRegistry"), 1.0),
        (series("DEADLINE_EXCEEDED", "WatchRegistry"), 1.0),
        // A stream is counted when it ends, not when its headers go out.
        (series("OK", "WatchRegistry"), 0.0),
    ];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = scrape(&metrics);
        let off: Vec<_> = wanted
            .iter()
            .filter(|(s, want)| sample(&text, s) != *want)
            .collect();
        if off.is_empty() {
            assert_eq!(
                sample(
                    &text,
                    r#"toolrouter_request_duration_seconds_count{method="WatchRegistry"}"#
                ),
                2.0,
                "{text}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "{off:?}:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    daemon.signal("TERM");
    let ended = open.message().await.unwrap_err();
    assert_eq!(ended.code(), Code::Unavailable, "{ended:?}");
    let status = daemon.exit(Duration::from_secs(10)).await.expect("exits");
    assert!(status.success());

    // The log's last lines, once the thread reading the daemon's stderr has them.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !daemon.log().contains("The daemon is shutting down") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = daemon.log();
    let lines = json_lines(&log);
    let of = |method: &str, message: &str| -> Vec<&serde_json::Value> {
        lines
            .iter()
            .filter(|v| v["fields"]["method"] == method && v["fields"]["message"] == message)
            .map(|v| &v["fields"])
            .collect()
    };
    // `domains` has one type in every line (a count is `domain_count`), as log indexers need.
    assert!(
        lines.iter().any(|v| v["fields"]["message"] == "starting"),
        "{log}"
    );
    for v in &lines {
        let d = &v["fields"]["domains"];
        assert!(d.is_null() || d.is_array(), "{v}");
        let f = &v["fields"]["fallback"];
        assert!(f.is_null() || f.is_boolean(), "{v}");
    }
    let dropped = of("LoadToolGroup", "call dropped before it answered");
    assert_eq!(dropped.len(), 1, "{log}");
    assert_eq!(dropped[0]["code"], "CANCELLED", "{log}");
    assert_eq!(
        dropped[0]["cause"], "the caller's deadline (grpc-timeout) of 300ms passed",
        "{log}"
    );
    // Its conversation, named before the call was dropped, is in its line too.
    assert_eq!(
        dropped[0]["conversation"],
        toolrouter::telemetry::conversation_hash("c1"),
        "{log}"
    );
    let closed = of(
        "WatchRegistry",
        "stream closed before its end (by its caller, or cut at the drain timeout)",
    );
    assert_eq!(closed.len(), 1, "{log}");
    assert_eq!(closed[0]["code"], "CANCELLED", "{log}");
    assert_eq!(
        closed[0]["cause"], "its caller closed it or went away, or the daemon stopped at the drain timeout",
        "{log}"
    );
    let failed = of("WatchRegistry", "call failed");
    assert_eq!(failed.len(), 2, "{log}");
    assert_eq!(failed[0]["code"], "DEADLINE_EXCEEDED", "{log}");
    assert_eq!(
        failed[0]["cause"], "The caller's deadline (grpc-timeout) of 300ms passed.",
        "{log}"
    );
    assert_eq!(failed[1]["code"], "UNAVAILABLE", "{log}");
    assert!(
        failed[1]["cause"].as_str().unwrap().contains("shutting down"),
        "{log}"
    );
    assert!(
        of("WatchRegistry", "call").is_empty(),
        "no OK line for a stream:\n{log}"
    );
}

#[tokio::test]
async fn each_call_is_logged_once_without_its_text_and_counted_in_the_metrics() {
    let dir = temp_dir();
    set_settings(dir.path(), &[("qbittorrent_url", "http://nas:8080")]).await;
    let metrics = free_addr();
    let daemon = Daemon::start(dir.path(), &["--metrics-listen", &metrics]);
    let before = scrape(&metrics);
    let route_ok = r#"toolrouter_requests_total{code="OK",method="Route"}"#;
    assert_eq!(sample(&before, route_ok), 0.0, "{before}");
    // Each RPC's series are there from the start, at 0.
    for method in ["Route", "LoadToolGroup", "WatchRegistry"] {
        for series in [
            format!(r#"toolrouter_requests_total{{code="OK",method="{method}"}} 0"#),
            format!(r#"toolrouter_request_duration_seconds_count{{method="{method}"}} 0"#),
        ] {
            assert!(before.lines().any(|l| l == series), "{series}:\n{before}");
        }
    }

    let mut c = daemon.client().await;
    let secret = "are my torrents seeding for secret-conversation?";
    // Tokens the answers say they sent: native answers count as OpenAI chat.
    let mut route_tokens = 0.0;
    for _ in 0..2 {
        let r = c.route(route_request(secret, "user-42-private")).await.unwrap();
        route_tokens += f64::from(r.into_inner().tokens);
    }
    let r = c.route(route_request("hello there", "")).await.unwrap();
    route_tokens += f64::from(r.into_inner().tokens);
    let too_long = c.route(route_request(&"x".repeat(70_000), "")).await.unwrap_err();
    assert_eq!(too_long.code(), Code::InvalidArgument);
    let load = c
        .load_tool_group(load_request("user-42-private", "qbittorrent"))
        .await
        .unwrap();
    let load_tokens = f64::from(load.into_inner().tokens);
    assert!(route_tokens > 0.0 && load_tokens > 0.0);
    // Loading it again changes nothing, and is not counted as a load.
    let again = c
        .load_tool_group(load_request("user-42-private", "qbittorrent"))
        .await
        .unwrap()
        .into_inner();
    assert!(again.already_loaded);
    let load_tokens = load_tokens + f64::from(again.tokens);
    // A search that loads counts its loads and logs its conversation like a load; the same
    // search again names the group, loaded already.
    for _ in 0..2 {
        let searched = c
            .search_tools(toolrouter::proto::SearchToolsRequest {
                query: "pause my torrents".into(),
                conversation_id: "user-7-private".into(),
                load: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(searched.loaded_groups, ["qbittorrent"]);
    }

    let after = scrape(&metrics);
    let checks = [
        (route_ok, 3.0),
        (
            r#"toolrouter_requests_total{code="INVALID_ARGUMENT",method="Route"}"#,
            1.0,
        ),
        (
            r#"toolrouter_requests_total{code="OK",method="LoadToolGroup"}"#,
            2.0,
        ),
        // Both turns hit the keyword (this message's own hit comes before stickiness).
        (
            r#"toolrouter_route_domains_total{domain="qbittorrent",reason="keyword"}"#,
            2.0,
        ),
        (
            r#"toolrouter_route_domains_total{domain="qbittorrent",reason="fallback"}"#,
            1.0,
        ),
        (
            r#"toolrouter_route_domains_total{domain="system",reason="core"}"#,
            3.0,
        ),
        (r#"toolrouter_route_fallbacks_total"#, 1.0),
        (
            r#"toolrouter_tokens_sent_total{format="openai_chat",method="Route"}"#,
            route_tokens,
        ),
        (
            r#"toolrouter_tokens_sent_total{format="openai_chat",method="LoadToolGroup"}"#,
            load_tokens,
        ),
        // One load each for two conversations: the second load and the second search
        // of each found it loaded already.
        (r#"toolrouter_group_loads_total{group="qbittorrent"}"#, 2.0),
        (
            r#"toolrouter_request_duration_seconds_count{method="Route"}"#,
            4.0,
        ),
        (r#"toolrouter_conversations_cached"#, 2.0),
        (r#"toolrouter_registry_domains"#, 14.0),
    ];
    for (series, want) in checks {
        assert_eq!(sample(&after, series), want, "{series}:\n{after}");
    }
    let version = demo_registry().version();
    assert!(
        after.contains(&format!(
            "toolrouter_registry_info{{version=\"{version:016x}\"}} 1"
        )),
        "{after}"
    );
    for name in [
        "toolrouter_settings_snapshot_age_seconds",
        "toolrouter_database_errors_total",
    ] {
        assert!(after.contains(&format!("# TYPE {name}")), "{name}:\n{after}");
    }

    // The log: one info line per call with method, code and latency; the Route summary; a
    // hash of the conversation id; never the message or the id; failures with their cause.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = daemon.log();
    let lines = json_lines(&log);
    let calls = call_lines(&lines, "Route");
    assert_eq!(calls.len(), 3, "{log}");
    let first = &calls[0]["fields"];
    assert_eq!(calls[0]["level"], "INFO", "{log}");
    assert_eq!(first["code"], "OK");
    assert!(first["latency_ms"].as_f64().is_some(), "{first}");
    assert_eq!(first["conversation"], conversation_hash("user-42-private"));
    // A list is a real JSON array, not a joined string.
    assert_eq!(
        first["domains"],
        serde_json::json!(["system:core", "qbittorrent:keyword"]),
        "{first}"
    );
    assert_eq!(
        calls[2]["fields"]["domains"],
        serde_json::json!(["system:core", "qbittorrent:fallback"]),
        "{log}"
    );
    assert_eq!(first["fallback"], false, "{first}");
    let logged_tokens: f64 = calls
        .iter()
        .map(|c| c["fields"]["tokens"].as_f64().unwrap())
        .sum();
    assert_eq!(logged_tokens, route_tokens, "{log}");
    let failed: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|v| v["fields"]["message"] == "call failed")
        .collect();
    assert_eq!(failed.len(), 1, "{log}");
    assert_eq!(failed[0]["fields"]["code"], "INVALID_ARGUMENT");
    assert!(
        failed[0]["fields"]["cause"]
            .as_str()
            .unwrap()
            .contains("max_message_bytes"),
        "{log}"
    );
    let search = call_lines(&lines, "SearchTools");
    assert_eq!(search.len(), 2, "{log}");
    assert_eq!(
        search[0]["fields"]["conversation"],
        conversation_hash("user-7-private")
    );
    assert_eq!(
        search[0]["fields"]["groups"],
        serde_json::json!(["qbittorrent"]),
        "a list is a real JSON array: {log}"
    );
    // A line has the fields its call has: a search sent no tools (it did not send 0), a
    // route loaded no group.
    for field in ["tools", "tokens", "domains", "fallback"] {
        assert!(search[0]["fields"].get(field).is_none(), "{field}: {log}");
    }
    assert!(first.get("groups").is_none(), "{log}");
    // The start line's folder list is a real array too.
    let start = lines
        .iter()
        .find(|v| v["fields"]["message"] == "starting")
        .expect("a start line");
    assert!(start["fields"]["manifests"].is_array(), "{start}");
    // Options as the flags spell them; the fallback setting under a name of its own, since
    // a call line's `fallback` is a boolean.
    assert_eq!(start["fields"]["fallback_mode"], "all-active", "{start}");
    assert!(start["fields"].get("fallback").is_none(), "{start}");
    assert_eq!(start["fields"]["keyword_match"], "word", "{start}");
    for secret in [
        "torrents seeding",
        "user-42-private",
        "user-7-private",
        "pause my",
        "hello there",
        "\u{1b}[",
    ] {
        assert!(!log.contains(secret), "the log carries {secret:?}:\n{log}");
    }
}

#[tokio::test]
async fn the_series_of_a_run_time_domain_go_when_it_is_deleted() {
    let dir = temp_dir();
    let metrics = free_addr();
    let daemon = Daemon::start(dir.path(), &["--metrics-listen", &metrics]);
    let mut c = daemon.client().await;
    let series = |text: &str| text.lines().filter(|l| l.contains("churn")).count();
    for round in 0..3 {
        c.upsert_domain(toolrouter::proto::UpsertDomainRequest {
            manifest_json: r#"{"name": "churn", "keywords": ["oscilloscope"],
                "tools": [{"name": "churn_capture", "description": "Capture a waveform"}]}"#
                .into(),
        })
        .await
        .unwrap();
        c.route(route_request("grab the oscilloscope trace", ""))
            .await
            .unwrap();
        let conversation = format!("c{round}");
        c.load_tool_group(load_request(&conversation, "churn"))
            .await
            .unwrap();
        let served = scrape(&metrics);
        assert_eq!(
            series(&served),
            2,
            "round {round}: keyword and load series:\n{served}"
        );
        c.delete_domain(toolrouter::proto::DeleteDomainRequest { name: "churn".into() })
            .await
            .unwrap();
        let gone = scrape(&metrics);
        assert_eq!(
            series(&gone),
            0,
            "round {round}: no series of a domain not served:\n{gone}"
        );
    }
}

#[tokio::test]
async fn a_refused_call_is_logged_once() {
    let dir = temp_dir();
    let daemon = Daemon::start(dir.path(), &["--auth-token", "secret-token"]);
    let mut c = daemon.client().await;
    let refused = c.route(route_request("hello", "")).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = daemon.log();
    let lines = json_lines(&log);
    let about_it: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|v| v["level"] == "WARN" || v["fields"]["method"] == "Route")
        .collect();
    assert_eq!(about_it.len(), 1, "one line per call (SPEC §11): {log}");
    assert_eq!(about_it[0]["fields"]["message"], "call failed", "{log}");
    assert_eq!(about_it[0]["fields"]["code"], "UNAUTHENTICATED", "{log}");
}

/// A caller that resets its call, or whose connection goes, before its request is whole gave
/// the call up: it is logged and counted `CANCELLED`, as a call dropped before it answered,
/// not as a bad request (tonic reads a reset stream as one that ended, with no message) nor
/// as an unknown fault. A request sent whole with no message is still the caller's error.
#[tokio::test]
async fn a_call_its_caller_resets_or_abandons_mid_request_is_counted_cancelled() {
    let dir = temp_dir();
    let metrics = free_addr();
    let daemon = Daemon::start(dir.path(), &["--metrics-listen", &metrics]);
    let route = || raw::request(daemon.addr, "/toolrouter.v1.ToolRouter/Route");
    // A message announced at 100 bytes, of which 10 come.
    let part: &'static [u8] = &[
        0, 0, 0, 0, 100, 10, 8, b'p', b'a', b'u', b's', b'e', b' ', b'i', b't',
    ];

    // Reset by its caller.
    let (mut send, _connection) = raw::connect(daemon.addr).await;
    let (_answer, mut stream) = raw::send(&mut send, route(), part, false);
    tokio::time::sleep(Duration::from_millis(200)).await;
    stream.send_reset(h2::Reason::CANCEL);
    // Its connection gone.
    let (mut send, connection) = raw::connect(daemon.addr).await;
    let (_answer, stream) = raw::send(&mut send, route(), part, false);
    tokio::time::sleep(Duration::from_millis(200)).await;
    connection.abort();
    drop((send, stream));
    // Whole, and empty: the caller's error.
    let (mut send, _connection) = raw::connect(daemon.addr).await;
    let (answer, _stream) = raw::send(&mut send, route(), &[], true);
    let answer = raw::head(answer).await;
    assert_eq!(
        answer.headers().get("grpc-status").map(|v| v.as_bytes()),
        Some(&b"3"[..]),
        "{answer:?}"
    );

    let series = |code: &str| format!(r#"toolrouter_requests_total{{code="{code}",method="Route"}}"#);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = scrape(&metrics);
        let counts = (
            sample(&text, &series("CANCELLED")),
            sample(&text, &series("INVALID_ARGUMENT")),
            sample(&text, &series("UNKNOWN")),
        );
        if counts == (2.0, 1.0, 0.0) {
            break;
        }
        assert!(Instant::now() < deadline, "{counts:?}:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = daemon.log();
    let lines = json_lines(&log);
    let of = |message: &str| -> Vec<&serde_json::Value> {
        lines
            .iter()
            .filter(|v| v["fields"]["method"] == "Route" && v["fields"]["message"] == message)
            .map(|v| &v["fields"])
            .collect()
    };
    let dropped = of("call dropped before it answered");
    assert_eq!(dropped.len(), 2, "{log}");
    for line in dropped {
        assert_eq!(line["code"], "CANCELLED", "{log}");
        assert_eq!(
            line["cause"], "the caller reset the call or lost its connection while sending the request",
            "{log}"
        );
    }
    let failed = of("call failed");
    assert_eq!(failed.len(), 1, "{log}");
    assert_eq!(failed[0]["code"], "INVALID_ARGUMENT", "{log}");
}

/// The metrics endpoint answers `HEAD` as `GET` without the body (probes use it), and
/// another method `405` naming the two.
#[tokio::test]
async fn the_metrics_endpoint_answers_head_and_refuses_other_methods() {
    let dir = temp_dir();
    let metrics = free_addr();
    let _daemon = Daemon::start(dir.path(), &["--metrics-listen", &metrics]);
    let exchange = |request_line: &str| http1(&metrics, request_line);
    let head = exchange("HEAD /metrics HTTP/1.1");
    let (headers, body) = head.split_once("\r\n\r\n").unwrap();
    assert!(headers.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert_eq!(body, "", "{head}");
    let length: usize = headers
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(length > 1000, "the length a GET's body has: {head}");
    let post = exchange("POST /metrics HTTP/1.1");
    assert!(post.starts_with("HTTP/1.1 405 Method Not Allowed"), "{post}");
    assert!(post.contains("\r\nallow: GET, HEAD\r\n"), "{post}");
    let other = exchange("GET /other HTTP/1.1");
    assert!(other.starts_with("HTTP/1.1 404 Not Found"), "{other}");
    let other = exchange("HEAD /other HTTP/1.1");
    assert!(other.starts_with("HTTP/1.1 404 Not Found"), "{other}");
    assert!(other.ends_with("\r\n\r\n"), "no body for a HEAD: {other:?}");
}

#[tokio::test]
async fn a_failed_call_is_logged_with_its_conversations_hash() {
    let dir = temp_dir();
    let daemon = Daemon::start(dir.path(), &[]);
    let mut c = daemon.client().await;
    let err = c
        .load_tool_group(toolrouter::proto::LoadToolGroupRequest {
            conversation_id: "user-9-private".into(),
            group_name: "no-such-group".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    // Also when what fails is checked before anything is looked up: a profile, the message.
    let err = c
        .route(toolrouter::proto::RouteRequest {
            profile: "no-such-profile".into(),
            ..route_request("hello", "user-9-private")
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = c
        .route(route_request(&"x".repeat(70_000), "user-9-private"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = daemon.log();
    let lines = json_lines(&log);
    let failed: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|v| v["fields"]["message"] == "call failed")
        .collect();
    assert_eq!(failed.len(), 3, "{log}");
    let codes: Vec<&serde_json::Value> = failed.iter().map(|f| &f["fields"]["code"]).collect();
    assert_eq!(
        codes,
        ["NOT_FOUND", "INVALID_ARGUMENT", "INVALID_ARGUMENT"],
        "{log}"
    );
    for line in &failed {
        assert_eq!(
            line["fields"]["conversation"],
            conversation_hash("user-9-private"),
            "{log}"
        );
    }
    assert!(!log.contains("user-9-private"), "{log}");
}

#[tokio::test]
async fn a_search_hit_is_counted_per_domain_and_logged_in_a_json_array() {
    let dir = temp_dir();
    set_settings(dir.path(), &[("qbittorrent_url", "http://nas:8080")]).await;
    let metrics = free_addr();
    let daemon = Daemon::start(dir.path(), &["--metrics-listen", &metrics]);
    let search = r#"toolrouter_route_domains_total{domain="qbittorrent",reason="search"}"#;
    let before = scrape(&metrics);
    assert_eq!(sample(&before, search), 0.0, "{before}");

    // No qbittorrent keyword in it: the search index routes it.
    let r = daemon
        .client()
        .await
        .route(route_request("pause all my downloads", ""))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        reasons(&r),
        [
            ("system".to_string(), "REASON_CORE"),
            ("qbittorrent".to_string(), "REASON_SEARCH"),
        ],
        "{r:?}"
    );

    let after = scrape(&metrics);
    assert_eq!(sample(&after, search), 1.0, "{after}");
    assert_eq!(
        sample(
            &after,
            r#"toolrouter_route_domains_total{domain="qbittorrent",reason="keyword"}"#
        ),
        0.0,
        "{after}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = daemon.log();
    let lines = json_lines(&log);
    let call = call_lines(&lines, "Route")
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no Route call line:\n{log}"));
    assert_eq!(
        call["fields"]["domains"],
        serde_json::json!(["system:core", "qbittorrent:search"]),
        "{log}"
    );
}

#[tokio::test]
async fn while_draining_health_on_open_connections_answers_not_serving_and_new_calls_are_unavailable() {
    let dir = temp_dir();
    set_settings(dir.path(), &[("sonarr_url", "x")]).await;
    let mut daemon = Daemon::start(dir.path(), &["--busy-timeout", "30s"]);
    // A load balancer's connection, open before the shutdown.
    let probe = daemon.connection().channel().await.unwrap();
    assert_eq!(health(probe.clone(), "").await.unwrap(), ServingStatus::Serving);
    let lock = WriteLock::take(dir.path()).await;
    let mut client = daemon.client().await;
    let mut other = client.clone();
    let in_flight = tokio::spawn(async move { client.load_tool_group(load_request("c1", "sonarr")).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    daemon.signal("TERM");
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..3 {
        let status = health(probe.clone(), "").await;
        assert_eq!(
            status.as_ref().ok(),
            Some(&ServingStatus::NotServing),
            "health during the drain: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let refused = other.route(route_request("thanks", "")).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(daemon.child.try_wait().unwrap().is_none(), "still draining");

    lock.release().await;
    let answer = in_flight.await.unwrap();
    assert!(answer.is_ok(), "the call in flight finished: {answer:?}");
    let status = daemon.exit(Duration::from_secs(20)).await.expect("exited");
    assert_eq!(status.code(), Some(0), "{}", daemon.log());
}

/// Waits for `daemon`, signalled at `start`, to exit 0 within 5 s of it.
async fn exits_cleanly_within_5_s(daemon: &mut Daemon, start: Instant) {
    let status = daemon
        .exit(Duration::from_secs(5))
        .await
        .unwrap_or_else(|| panic!("still running 5 s after SIGTERM:\n{}", daemon.log()));
    assert_eq!(status.code(), Some(0), "{}", daemon.log());
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn sigterm_closes_idle_connections_at_once_instead_of_waiting_the_drain_timeout() {
    let dir = temp_dir();
    let mut daemon = Daemon::start(dir.path(), &["--drain-timeout", "30s"]);
    // A socket that never sends anything, and an HTTP/2 connection with no call in flight.
    let silent = tokio::net::TcpStream::connect(daemon.addr).await.unwrap();
    let idle = daemon.connection().channel().await.unwrap();
    health(idle.clone(), "").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start = Instant::now();
    daemon.signal("TERM");
    exits_cleanly_within_5_s(&mut daemon, start).await;
    drop((silent, idle));
}

/// A drain timeout of 0 waits for no call, but the final flush still gets its turn: it was
/// given the drain timeout, so an idle daemon exited without it, warning that the database
/// was busy.
#[tokio::test]
async fn a_zero_drain_timeout_still_flushes_at_shutdown() {
    let dir = temp_dir();
    set_settings(dir.path(), &[("qbittorrent_url", "http://nas:8080")]).await;
    let mut daemon = Daemon::start(dir.path(), &["--drain-timeout", "0s"]);
    let mut c = daemon.client().await;
    c.load_tool_group(load_request("c1", "qbittorrent"))
        .await
        .unwrap();
    c.route(route_request("hello", "c1")).await.unwrap();
    let start = Instant::now();
    daemon.signal("TERM");
    exits_cleanly_within_5_s(&mut daemon, start).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !daemon.log().contains("\"stopped\"") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = daemon.log();
    assert!(log.contains("\"stopped\""), "{log}");
    assert!(!log.contains("still busy at shutdown"), "{log}");
}

#[tokio::test]
async fn an_open_health_watch_ends_with_not_serving_and_does_not_hold_the_shutdown() {
    use tokio_stream::StreamExt as _;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let dir = temp_dir();
    let mut daemon = Daemon::start(dir.path(), &["--drain-timeout", "30s"]);
    let mut watcher = HealthClient::new(daemon.connection().channel().await.unwrap());
    let mut statuses = watcher
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = statuses.next().await.unwrap().unwrap();
    assert_eq!(first.status(), ServingStatus::Serving);
    let start = Instant::now();
    daemon.signal("TERM");
    // The watcher hears NOT_SERVING, then its stream ends.
    let mut seen = Vec::new();
    let end = loop {
        match tokio::time::timeout(Duration::from_secs(5), statuses.next()).await {
            Ok(Some(Ok(r))) => seen.push(r.status()),
            other => break format!("{other:?}"),
        }
    };
    assert_eq!(
        seen.last(),
        Some(&ServingStatus::NotServing),
        "{seen:?}, then {end} after {:?}\n{}",
        start.elapsed(),
        daemon.log()
    );
    exits_cleanly_within_5_s(&mut daemon, start).await;
    assert!(
        !daemon.log().contains("drain timeout reached"),
        "{}",
        daemon.log()
    );
}

/// `(soft, hard)` open-files limits of a running process.
fn open_files_limit(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .to_string();
    let mut fields = line.split_whitespace().skip(3);
    (
        fields.next().unwrap().to_string(),
        fields.next().unwrap().to_string(),
    )
}

/// CPU time a process has used so far, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces): state is the 3rd field, utime
    // and stime the 14th and 15th.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// With JSON logs, what stops the daemon is a JSON line too (a log collector cannot read a
/// plain one); with text logs it is the plain `error:` line.
#[tokio::test]
async fn with_json_logs_what_stops_the_daemon_is_a_json_line() {
    let dir = temp_dir();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let serve = |format: &'static str| {
        let addr = addr.clone();
        let dir = dir.path().to_path_buf();
        async move { run(&dir, &["serve", "--listen", &addr, "--log-format", format]).await }
    };
    let out = serve("json").await;
    assert_eq!(out.status.code(), Some(1), "{}", shown(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}\n{stderr}")))
        .collect();
    let last = &lines.last().unwrap();
    assert_eq!(last["level"], "ERROR", "{stderr}");
    assert_eq!(last["fields"]["message"], "the daemon cannot run", "{stderr}");
    assert_eq!(last["fields"]["exit_code"], 1, "{stderr}");
    assert!(
        last["fields"]["cause"]
            .as_str()
            .unwrap()
            .starts_with(&format!("cannot listen on {addr}: ")),
        "{stderr}"
    );
    let out = serve("text").await;
    assert_eq!(out.status.code(), Some(1), "{}", shown(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .lines()
            .last()
            .unwrap()
            .starts_with(&format!("error: cannot listen on {addr}: ")),
        "{stderr}"
    );
    // A log that would leave the event out still says why the daemon stopped.
    let quiet = ["serve", "--listen", &addr, "--log-format", "json"];
    let out = run_with_env(dir.path(), &quiet, &[("RUST_LOG", "off")]).await;
    assert_eq!(out.status.code(), Some(1), "{}", shown(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "only the plain line: {stderr}");
    assert!(
        stderr.starts_with(&format!("error: cannot listen on {addr}: ")),
        "{stderr}"
    );
    drop(taken);
}

#[tokio::test]
async fn a_second_daemon_on_the_same_sqlite_file_is_refused_and_may_start_once_the_first_is_gone() {
    let dir = temp_dir();
    let mut first = Daemon::start(dir.path(), &[]);
    let out = run(
        dir.path(),
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database",
            &db_url(dir.path()),
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", shown(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("another toolrouter daemon is serving the database file")
            && stderr.contains("toolrouter.db"),
        "{stderr}"
    );
    // The first one serves on, and its file is free once it has stopped.
    assert!(
        first
            .client()
            .await
            .route(route_request("hello", ""))
            .await
            .is_ok()
    );
    first.signal("TERM");
    first.exit(Duration::from_secs(20)).await.expect("exited");
    let second = Daemon::start(dir.path(), &[]);
    assert!(
        second
            .client()
            .await
            .route(route_request("hello", ""))
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn past_the_file_size_limit_writes_are_unavailable_and_the_daemon_lives_on() {
    let dir = temp_dir();
    set_settings(dir.path(), &[("sonarr_url", "x")]).await;
    // 1 MiB: the write-ahead log reaches it after a few hundred loads.
    let mut daemon = Daemon::start_with_limit(dir.path(), &[], libc::RLIMIT_FSIZE, (1 << 20, 1 << 20));
    let mut client = daemon.client().await;
    let mut refused = None;
    for i in 0..5000 {
        match client
            .load_tool_group(load_request(&format!("c{i}"), "sonarr"))
            .await
        {
            Ok(_) => {}
            Err(status) => {
                refused = Some(status);
                break;
            }
        }
    }
    let refused = refused.expect("a write past 1 MiB is refused");
    assert!(
        daemon.child.try_wait().unwrap().is_none(),
        "the daemon ended:\n{}",
        daemon.log()
    );
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    // Routing, which writes nothing, still answers.
    let routed = client.route(route_request("hello", "")).await;
    assert!(routed.is_ok(), "{routed:?}\n{}", daemon.log());
}

#[tokio::test]
async fn the_daemon_raises_its_soft_open_files_limit_to_the_hard_limit() {
    let dir = temp_dir();
    let daemon = Daemon::start_with_files(dir.path(), &[], (100, 300));
    assert_eq!(
        open_files_limit(daemon.child.id()),
        ("300".to_string(), "300".to_string())
    );
    assert!(daemon.log().contains("open-files limit"), "{}", daemon.log());
}

/// 150 connections to the daemon that never send anything: more than a daemon started with
/// 64 file descriptors can hold. Kept open while the caller holds them.
async fn silent_sockets(daemon: &Daemon) -> Vec<tokio::net::TcpStream> {
    let mut silent = Vec::new();
    for _ in 0..150 {
        silent.push(tokio::net::TcpStream::connect(daemon.addr).await.unwrap());
    }
    silent
}

/// The daemon, out of file descriptors, uses little CPU for a second: its accept loops pause.
async fn assert_idle_while_out_of_descriptors(daemon: &Daemon) {
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = daemon.child.id();
    let before = cpu_ticks(pid);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let used = cpu_ticks(pid) - before;
    // Clock ticks are 1/100 s: a spinning accept loop would use about 100 here.
    assert!(
        used < 30,
        "the daemon used {used} ticks of CPU in 1 s while out of descriptors"
    );
}

#[tokio::test]
async fn silent_sockets_at_the_file_limit_neither_spin_the_accept_loop_nor_lock_out_new_clients() {
    let dir = temp_dir();
    let daemon = Daemon::start_with_files(dir.path(), &["--handshake-timeout", "1s"], (64, 64));
    // More silent sockets than the daemon has file descriptors; the test keeps them all open.
    let silent = silent_sockets(&daemon).await;
    assert_idle_while_out_of_descriptors(&daemon).await;
    // The silent sockets are closed at the handshake timeout, so a new client gets in while
    // they are all still open on this side.
    let started = Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(15), async {
        daemon
            .client()
            .await
            .list_groups(ListGroupsRequest::default())
            .await
    })
    .await;
    assert!(
        matches!(answer, Ok(Ok(_))),
        "a new client after {:?}: {answer:?}\n{}",
        started.elapsed(),
        daemon.log()
    );
    let log = daemon.log();
    let streaks = log.matches("cannot accept connections").count();
    let recoveries = log.matches("accepting connections again").count();
    assert!(streaks >= 1, "{log}");
    assert!(
        recoveries == streaks || recoveries + 1 == streaks,
        "one line per streak: {streaks} failures, {recoveries} recoveries\n{log}"
    );
    drop(silent);
}

#[tokio::test]
async fn the_metrics_endpoint_out_of_descriptors_pauses_instead_of_spinning() {
    let dir = temp_dir();
    let metrics = free_addr();
    let daemon = Daemon::start_with_files(
        dir.path(),
        &[
            "--handshake-timeout",
            "60s",
            "--metrics-listen",
            &metrics.to_string(),
        ],
        (64, 64),
    );
    let silent = silent_sockets(&daemon).await;
    // A scrape waits in the metrics listener's queue, which cannot accept it.
    let scrape = tokio::net::TcpStream::connect(metrics).await.unwrap();
    assert_idle_while_out_of_descriptors(&daemon).await;
    let log = daemon.log();
    let lines = log.matches("metrics endpoint").count();
    assert!(lines <= 2, "one line per streak, not per attempt: {lines} lines");
    drop((silent, scrape));
}

#[tokio::test]
async fn the_listen_backlog_is_configurable() {
    let dir = temp_dir();
    let daemon = Daemon::start(dir.path(), &["--listen-backlog", "7"]);
    let port = daemon.addr.port();
    let out = Command::new("ss")
        .args(["-ltnH", &format!("sport = :{port}")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // For a listening socket, ss shows the backlog as Send-Q (the third column).
    let send_q: Vec<&str> = text.lines().filter_map(|l| l.split_whitespace().nth(2)).collect();
    assert_eq!(send_q, ["7"], "{text}");
}

/// A SIGHUP while the daemon starts (the registry loaded, the database being opened) is a
/// reload once it serves, never the signal's default action, which would end it.
#[test]
fn a_sighup_during_start_does_not_end_the_daemon() {
    use std::io::BufRead as _;
    let dir = temp_dir();
    let mut child = Daemon::command(&db_url(dir.path()), &[]).spawn().unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let (mut seen, mut reloaded) = (Vec::new(), false);
    for line in stderr.lines().map_while(Result::ok) {
        if line.contains("\"starting\"") {
            // SAFETY: a signal to the child this test started.
            assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGHUP) }, 0);
        }
        reloaded = line.contains("SIGHUP: reloading the registry");
        seen.push(line);
        if reloaded {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        reloaded,
        "the daemon ended without reloading:\n{}",
        seen.join("\n")
    );
}
