//! The daemon as a process: SIGKILL right after an acknowledged load, SIGTERM with calls in
//! flight (drained, or cut at the drain timeout), SIGHUP reloads, another process writing
//! the settings table under load, and the refusal to listen openly without a token.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::Code;
use toolrouter::cli::connection::{Client, Connection};
use toolrouter::db::Db;
use toolrouter::proto::{InvalidateSettingsRequest, ListGroupsRequest, LoadToolGroupRequest, RouteRequest};

use crate::helpers::{WriteLock, manifest_dir, temp_dir};

const BIN: &str = env!("CARGO_BIN_EXE_toolrouter");

fn db_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("toolrouter.db").display())
}

/// A running `toolrouter serve`, killed when dropped.
struct Daemon {
    child: Child,
    addr: String,
    log: Arc<Mutex<String>>,
}

impl Daemon {
    /// Starts the binary on a free loopback port over the database in `dir` and waits until
    /// it logs that it is serving.
    fn start(dir: &Path, extra: &[&str]) -> Daemon {
        Daemon::start_with(dir, extra, |_| {})
    }

    /// Starts the binary with open-files limits `(soft, hard)`.
    fn start_with_files(dir: &Path, extra: &[&str], (soft, hard): (u64, u64)) -> Daemon {
        Daemon::start_with(dir, extra, |c| {
            use std::os::unix::process::CommandExt as _;
            let limit = libc::rlimit {
                rlim_cur: soft as libc::rlim_t,
                rlim_max: hard as libc::rlim_t,
            };
            // SAFETY: between fork and exec only setrlimit runs, which is async-signal-safe,
            // on a value copied into the closure.
            unsafe {
                c.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        })
    }

    fn start_with(dir: &Path, extra: &[&str], configure: impl FnOnce(&mut Command)) -> Daemon {
        let mut command = Command::new(BIN);
        configure(&mut command);
        let mut child = command
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--log-format",
                "json",
                "--database",
            ])
            .arg(db_url(dir))
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
                    && v["fields"]["message"] == "serving"
                    && let Some(addr) = v["fields"]["addr"].as_str()
                {
                    let _ = tx.send(addr.to_string());
                }
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(addr) => addr,
            Err(_) => panic!("the daemon did not start:\n{}", log.lock().unwrap()),
        };
        Daemon {
            child,
            addr: format!("http://{addr}"),
            log,
        }
    }

    async fn client(&self) -> Client {
        Connection::plain(&self.addr).client().await.unwrap()
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit, at most `limit`.
    async fn exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn set_settings(dir: &Path, settings: &[(&str, &str)]) {
    let db = Db::connect(&db_url(dir)).await.unwrap();
    for (k, v) in settings {
        db.set_setting(k, v).await.unwrap();
    }
    db.close().await;
}

async fn loaded(dir: &Path, conversation: &str, domain: &str) -> bool {
    let db = Db::connect(&db_url(dir)).await.unwrap();
    let found = db
        .load_conversation(conversation)
        .await
        .unwrap()
        .is_some_and(|(_, members)| members.iter().any(|m| m.domain == domain && m.loaded));
    db.close().await;
    found
}

fn load_request(conversation: &str, group: &str) -> LoadToolGroupRequest {
    LoadToolGroupRequest {
        conversation_id: conversation.into(),
        group_name: group.into(),
    }
}

#[tokio::test]
async fn a_load_acknowledged_before_sigkill_is_there_after_a_restart() {
    let dir = temp_dir();
    set_settings(dir.path(), &[("sonarr_url", "x")]).await;
    let mut daemon = Daemon::start(dir.path(), &[]);
    let mut client = daemon.client().await;
    client
        .load_tool_group(load_request("c1", "sonarr"))
        .await
        .unwrap();
    daemon.signal("KILL");
    let status = daemon.exit(Duration::from_secs(10)).await.expect("killed");
    assert!(!status.success());

    let daemon = Daemon::start(dir.path(), &[]);
    let r = daemon
        .client()
        .await
        .route(RouteRequest {
            message: "thanks".into(),
            conversation_id: "c1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let sonarr = r
        .domains
        .iter()
        .find(|d| d.domain == "sonarr")
        .expect("loaded after restart");
    assert_eq!(sonarr.reason(), toolrouter::proto::Reason::Loaded);
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
        Connection::plain(&daemon.addr).channel().await.is_err(),
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
    assert!(daemon.log().contains("drain timeout reached"), "{}", daemon.log());
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
    let daemon = Daemon::start(dir.path(), &["--manifests", folder.to_str().unwrap()]);
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
                .list_groups(ListGroupsRequest {})
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
    assert!(daemon.log().contains("gamma.json"), "{}", daemon.log());
    let groups = client
        .list_groups(ListGroupsRequest {})
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
    // The other process: `toolrouter settings`, run back to back, setting and clearing
    // docker's key in the daemon's database and asking the daemon to re-read it each time.
    let (database, addr) = (db_url(dir.path()), daemon.addr.clone());
    let flipper = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut writes = 0u32;
        while Instant::now() < deadline {
            let action: &[&str] = if writes.is_multiple_of(2) {
                &["set", "docker_host", "x"]
            } else {
                &["unset", "docker_host"]
            };
            let out = Command::new(BIN)
                .arg("settings")
                .args(action)
                .args(["--database", &database, "--addr", &addr])
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            writes += 1;
        }
        writes
    });
    let mut workers = Vec::new();
    for w in 0..4 {
        let mut client = daemon.client().await;
        workers.push(tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(3);
            let (mut ok, mut refused) = (0u32, 0u32);
            let mut n = 0;
            while Instant::now() < deadline {
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
                            .route(RouteRequest {
                                message: "restart the container for the next episode".into(),
                                conversation_id,
                                ..Default::default()
                            })
                            .await
                            .unwrap();
                    }
                }
                ok += 1;
            }
            (ok, refused)
        }));
    }
    let mut total = 0;
    for w in workers {
        total += w.await.unwrap().0;
    }
    let writes = flipper.await.unwrap();
    assert!(
        writes > 20,
        "the settings were written meanwhile ({writes} writes)"
    );
    assert!(total > 100, "the daemon served load meanwhile ({total} calls)");
    assert!(!daemon.log().contains("\"ERROR\""), "{}", daemon.log());
}

#[test]
fn a_non_loopback_address_without_a_token_is_refused_with_what_to_do() {
    let out = Command::new(BIN)
        .args(["serve", "--listen", "0.0.0.0:0", "--database", "sqlite::memory:"])
        .env_remove("TOOLROUTER_AUTH_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("refusing to listen on 0.0.0.0:0"), "{stderr}");
    assert!(stderr.contains("--allow-unauthenticated"), "{stderr}");
    for extra in [&["--auth-token", "t"][..], &["--allow-unauthenticated"][..]] {
        let out = Command::new(BIN)
            .args(["serve", "--listen", "0.0.0.0:0", "--print-config"])
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `GET /metrics` from the metrics endpoint, as Prometheus would scrape it.
fn scrape(addr: &str) -> String {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nhost: {addr}\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    out
}

/// The value of one sample line (`name{labels} value`), or 0 when absent.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or(0.0)
}

#[tokio::test]
async fn each_call_is_logged_once_without_its_text_and_counted_in_the_metrics() {
    let dir = temp_dir();
    set_settings(dir.path(), &[("qbittorrent_url", "http://nas:8080")]).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = format!("127.0.0.1:{port}");
    let daemon = Daemon::start(dir.path(), &["--metrics-listen", &metrics]);
    let before = scrape(&metrics);
    let route_ok = r#"toolrouter_requests_total{code="OK",method="Route"}"#;
    assert_eq!(sample(&before, route_ok), 0.0, "{before}");

    let mut c = daemon.client().await;
    let secret = "are my torrents seeding for secret-conversation?";
    for _ in 0..2 {
        c.route(RouteRequest {
            message: secret.into(),
            conversation_id: "user-42-private".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    c.route(RouteRequest {
        message: "hello there".into(),
        conversation_id: String::new(),
        ..Default::default()
    })
    .await
    .unwrap();
    let too_long = c
        .route(RouteRequest {
            message: "x".repeat(70_000),
            conversation_id: String::new(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(too_long.code(), Code::InvalidArgument);
    c.load_tool_group(LoadToolGroupRequest {
        conversation_id: "user-42-private".into(),
        group_name: "qbittorrent".into(),
    })
    .await
    .unwrap();

    let after = scrape(&metrics);
    let checks = [
        (route_ok, 3.0),
        (
            r#"toolrouter_requests_total{code="INVALID_ARGUMENT",method="Route"}"#,
            1.0,
        ),
        (
            r#"toolrouter_requests_total{code="OK",method="LoadToolGroup"}"#,
            1.0,
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
        (r#"toolrouter_group_loads_total{group="qbittorrent"}"#, 1.0),
        (
            r#"toolrouter_request_duration_seconds_count{method="Route"}"#,
            4.0,
        ),
        (r#"toolrouter_conversations_cached"#, 1.0),
        (r#"toolrouter_registry_domains"#, 14.0),
    ];
    for (series, want) in checks {
        assert_eq!(sample(&after, series), want, "{series}:\n{after}");
    }
    let version = toolrouter::registry::Registry::demo().version();
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
    let lines: Vec<serde_json::Value> = log.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let calls: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|v| v["fields"]["message"] == "call" && v["fields"]["method"] == "Route")
        .collect();
    assert_eq!(calls.len(), 3, "{log}");
    let first = &calls[0]["fields"];
    assert_eq!(calls[0]["level"], "INFO", "{log}");
    assert_eq!(first["code"], "OK");
    assert!(first["latency_ms"].as_f64().is_some(), "{first}");
    assert_eq!(
        first["conversation"],
        toolrouter::telemetry::conversation_hash("user-42-private")
    );
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
    for secret in ["torrents seeding", "user-42-private", "hello there", "\u{1b}["] {
        assert!(!log.contains(secret), "the log carries {secret:?}:\n{log}");
    }
}

#[tokio::test]
async fn a_search_hit_is_counted_per_domain_and_logged_in_a_json_array() {
    let dir = temp_dir();
    set_settings(dir.path(), &[("qbittorrent_url", "http://nas:8080")]).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = format!("127.0.0.1:{port}");
    let daemon = Daemon::start(dir.path(), &["--metrics-listen", &metrics]);
    let search = r#"toolrouter_route_domains_total{domain="qbittorrent",reason="search"}"#;
    let before = scrape(&metrics);
    assert_eq!(sample(&before, search), 0.0, "{before}");

    // No qbittorrent keyword in it: the search index routes it.
    let r = daemon
        .client()
        .await
        .route(RouteRequest {
            message: "pause all my downloads".into(),
            conversation_id: String::new(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let reasons: Vec<(String, toolrouter::proto::Reason)> =
        r.domains.iter().map(|d| (d.domain.clone(), d.reason())).collect();
    assert_eq!(
        reasons,
        [
            ("system".to_string(), toolrouter::proto::Reason::Core),
            ("qbittorrent".to_string(), toolrouter::proto::Reason::Search),
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
    let call = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["fields"]["message"] == "call" && v["fields"]["method"] == "Route")
        .unwrap_or_else(|| panic!("no Route call line:\n{log}"));
    assert_eq!(
        call["fields"]["domains"],
        serde_json::json!(["system:core", "qbittorrent:search"]),
        "{log}"
    );
}

async fn health(channel: tonic::transport::Channel) -> Result<i32, tonic::Status> {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map(|r| r.into_inner().status)
}

#[tokio::test]
async fn while_draining_health_on_open_connections_answers_not_serving_and_new_calls_are_unavailable() {
    use tonic_health::pb::health_check_response::ServingStatus;
    let dir = temp_dir();
    set_settings(dir.path(), &[("sonarr_url", "x")]).await;
    let mut daemon = Daemon::start(dir.path(), &["--busy-timeout", "30s"]);
    // A load balancer's connection, open before the shutdown.
    let probe = Connection::plain(&daemon.addr).channel().await.unwrap();
    assert_eq!(
        health(probe.clone()).await.unwrap(),
        ServingStatus::Serving as i32
    );
    let lock = WriteLock::take(dir.path()).await;
    let mut client = daemon.client().await;
    let mut other = client.clone();
    let in_flight = tokio::spawn(async move { client.load_tool_group(load_request("c1", "sonarr")).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    daemon.signal("TERM");
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..3 {
        let status = health(probe.clone()).await;
        assert_eq!(
            status.as_ref().ok(),
            Some(&(ServingStatus::NotServing as i32)),
            "health during the drain: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let refused = other
        .route(RouteRequest {
            message: "thanks".into(),
            conversation_id: String::new(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(daemon.child.try_wait().unwrap().is_none(), "still draining");

    lock.release().await;
    let answer = in_flight.await.unwrap();
    assert!(answer.is_ok(), "the call in flight finished: {answer:?}");
    let status = daemon.exit(Duration::from_secs(20)).await.expect("exited");
    assert_eq!(status.code(), Some(0), "{}", daemon.log());
}

#[tokio::test]
async fn sigterm_closes_idle_connections_at_once_instead_of_waiting_the_drain_timeout() {
    let dir = temp_dir();
    let mut daemon = Daemon::start(dir.path(), &["--drain-timeout", "30s"]);
    let addr = daemon.addr.trim_start_matches("http://").to_string();
    // A socket that never sends anything, and an HTTP/2 connection with no call in flight.
    let silent = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let idle = Connection::plain(&daemon.addr).channel().await.unwrap();
    health(idle.clone()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start = Instant::now();
    daemon.signal("TERM");
    let status = daemon
        .exit(Duration::from_secs(5))
        .await
        .unwrap_or_else(|| panic!("still running 5 s after SIGTERM:\n{}", daemon.log()));
    assert_eq!(status.code(), Some(0), "{}", daemon.log());
    assert!(start.elapsed() < Duration::from_secs(5));
    drop((silent, idle));
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

#[tokio::test]
async fn silent_sockets_at_the_file_limit_neither_spin_the_accept_loop_nor_lock_out_new_clients() {
    let dir = temp_dir();
    let daemon = Daemon::start_with_files(dir.path(), &["--handshake-timeout", "1s"], (64, 64));
    let addr = daemon.addr.trim_start_matches("http://").to_string();
    // More silent sockets than the daemon has file descriptors; the test keeps them all open.
    let mut silent = Vec::new();
    for _ in 0..150 {
        silent.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
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
    // The silent sockets are closed at the handshake timeout, so a new client gets in while
    // they are all still open on this side.
    let started = Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(15), async {
        Connection::plain(&daemon.addr)
            .client()
            .await
            .unwrap()
            .list_groups(ListGroupsRequest {})
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
async fn the_listen_backlog_is_configurable() {
    let dir = temp_dir();
    let daemon = Daemon::start(dir.path(), &["--listen-backlog", "7"]);
    let port = daemon.addr.rsplit(':').next().unwrap().to_string();
    let out = Command::new("ss")
        .args(["-ltnH", &format!("sport = :{port}")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // For a listening socket, ss shows the backlog as Send-Q (the third column).
    let send_q: Vec<&str> = text.lines().filter_map(|l| l.split_whitespace().nth(2)).collect();
    assert_eq!(send_q, ["7"], "{text}");
}
