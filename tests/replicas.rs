//! Three daemons (real processes) on one PostgreSQL database: a settings write by another
//! program reaches all three within 500 ms without InvalidateSettings; a group loaded through
//! one is routed as loaded by the others on their next call; a SIGKILLed replica loses
//! nothing it acknowledged while the others keep answering; and a PostgreSQL restart under
//! load is ridden out: Route answers from the last snapshot, writes are UNAVAILABLE while the
//! server is down, and the replicas recover by themselves.
//!
//! Needs `TOOLROUTER_TEST_POSTGRES_URL`, and for the restart `TOOLROUTER_TEST_POSTGRES_CTL`
//! (pg_ctl for that cluster): `.ci/postgres.sh cargo test` sets both. Its own test binary,
//! so restarting the cluster cannot disturb the other test binaries' PostgreSQL tests (cargo
//! runs test binaries one after another); within it, the restart waits for the other tests.

// The API tests' harness; this binary uses only part of it.
#[allow(dead_code, unused_imports)]
#[path = "api/helpers.rs"]
mod helpers;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use helpers::{Daemon, fresh_postgres_database, load_request, reasons, route_request, routed};
use tokio::sync::RwLock;
use tonic::Code;
use toolrouter::cli::connection::Client;
use toolrouter::db::Db;
// Quiet when unset: the API tests print the one line that says how to run these.
use toolrouter::db::testing::{cluster_var, postgres_url};
use toolrouter::proto::{InvalidateSettingsRequest, ListGroupsRequest};

/// Held shared by every test and exclusively by the one that restarts the cluster.
static CLUSTER: RwLock<()> = RwLock::const_new(());

/// The bound that ends a wait that would otherwise never end (not a measured limit).
const PATIENCE: Duration = Duration::from_secs(30);

/// Three replicas on `database`. The settings TTL is an hour: within a test only
/// notifications (or an invalidation) can refresh settings.
fn three(database: &str, extra: &[&str]) -> Vec<Daemon> {
    // Settings reach the replicas by notification, not by the TTL, unless a test says.
    let mut flags = if extra.contains(&"--settings-ttl") {
        vec![]
    } else {
        vec!["--settings-ttl", "1h"]
    };
    flags.extend_from_slice(extra);
    (0..3).map(|_| Daemon::start_on(database, &flags)).collect()
}

/// Three replicas on a fresh database, a client of each, and a settings UI's connection;
/// the daemons die with it.
struct Fleet {
    database: String,
    daemons: Vec<Daemon>,
    clients: Vec<Client>,
    ui: Db,
    /// The test's hold on the cluster.
    _hold: Hold,
}

/// A test's hold on the test cluster: shared, or alone (to restart it).
enum Hold {
    Shared {
        _guard: tokio::sync::RwLockReadGuard<'static, ()>,
    },
    Alone {
        _guard: tokio::sync::RwLockWriteGuard<'static, ()>,
    },
}

/// A [`Fleet`] whose settings set `keys` (to `x`) before the replicas start, sharing the
/// cluster with the other tests; `None` without a test server.
async fn fleet(keys: &[&str], extra: &[&str]) -> Option<Fleet> {
    postgres_url()?;
    Some(
        start(
            Hold::Shared {
                _guard: CLUSTER.read().await,
            },
            keys,
            extra,
        )
        .await,
    )
}

async fn start(hold: Hold, keys: &[&str], extra: &[&str]) -> Fleet {
    let database = fresh_postgres_database().await;
    let ui = Db::connect(&database).await.unwrap();
    for key in keys {
        ui.set_setting(key, "x").await.unwrap();
    }
    let daemons = three(&database, extra);
    let mut clients = Vec::new();
    for d in &daemons {
        clients.push(d.client().await);
    }
    Fleet {
        database,
        daemons,
        clients,
        ui,
        _hold: hold,
    }
}

/// Whether the replica behind `client` sees `group` active.
async fn active(client: &mut Client, group: &str) -> bool {
    let groups = client
        .list_groups(ListGroupsRequest::default())
        .await
        .unwrap()
        .into_inner();
    groups.groups.iter().any(|g| g.name == group && g.active)
}

/// Waits until every replica sees `group` as `want`; returns when each first did, measured
/// from `since`.
async fn until_all_see(clients: &mut [Client], group: &str, want: bool, since: Instant) -> Vec<Duration> {
    let mut seen: Vec<Option<Duration>> = vec![None; clients.len()];
    while seen.iter().any(Option::is_none) {
        assert!(
            since.elapsed() < PATIENCE,
            "{group} never became {want} everywhere: {seen:?}"
        );
        for (i, c) in clients.iter_mut().enumerate() {
            if seen[i].is_none() && active(c, group).await == want {
                seen[i] = Some(since.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    seen.into_iter().flatten().collect()
}

/// Prints a line into the test output (the harness captures print macros only).
fn report(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Whether `group` is in a Route answer as loaded.
fn routed_loaded(r: &toolrouter::proto::RouteResponse, group: &str) -> bool {
    reasons(r)
        .iter()
        .any(|(d, why)| d == group && *why == "REASON_LOADED")
}

/// `message` routed within `conversation` by the replica behind `client`.
async fn route_on(client: &Client, message: &str, conversation: &str) -> toolrouter::proto::RouteResponse {
    client
        .clone()
        .route(route_request(message, conversation))
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn a_settings_write_by_another_program_reaches_all_three_within_500_ms() {
    let Some(mut f) = fleet(&[], &[]).await else {
        return;
    };
    // A first change, not measured: each replica's listening connection is up by the end.
    f.ui.set_setting("sonarr_url", "x").await.unwrap();
    until_all_see(&mut f.clients, "sonarr", true, Instant::now()).await;

    const TRIALS: usize = 20;
    let mut slowest = Vec::with_capacity(TRIALS);
    for trial in 0..TRIALS {
        // Alternately unset and set, so each trial is a change.
        let want = trial % 2 == 1;
        let value = if want { "http://nas:8989" } else { " " };
        let written = Instant::now();
        f.ui.set_setting("sonarr_url", value).await.unwrap();
        let seen = until_all_see(&mut f.clients, "sonarr", want, written).await;
        slowest.push(seen.into_iter().max().unwrap());
    }
    let mut sorted = slowest.clone();
    sorted.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    report(&format!(
        "settings write -> visible on all 3 replicas, {TRIALS} trials: p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms",
        ms(sorted[TRIALS / 2 - 1]),
        ms(sorted[TRIALS * 9 / 10 - 1]),
        ms(sorted[TRIALS - 1])
    ));
    for (trial, took) in slowest.iter().enumerate() {
        assert!(
            *took <= Duration::from_millis(500),
            "trial {trial}: {took:?} until all three saw the change"
        );
    }
    f.ui.close().await;
}

#[tokio::test]
async fn a_group_loaded_through_one_replica_is_loaded_on_the_others_next_call() {
    let Some(mut f) = fleet(&[], &[]).await else {
        return;
    };
    // A settings UI that writes without the trigger seeing it would still reach every
    // replica through one InvalidateSettings; here the write and the call both tell them.
    f.ui.set_setting("sonarr_url", "x").await.unwrap();
    f.clients[0]
        .invalidate_settings(InvalidateSettingsRequest {})
        .await
        .unwrap();
    until_all_see(&mut f.clients, "sonarr", true, Instant::now()).await;
    // B and C know the conversation (cached, nothing loaded) before A loads into it.
    for c in &mut f.clients[1..] {
        let r = route_on(c, "thanks", "c1").await;
        assert!(!routed_loaded(&r, "sonarr"));
    }
    let loaded = f.clients[0]
        .load_tool_group(load_request("c1", "sonarr"))
        .await
        .unwrap()
        .into_inner();
    assert!(!loaded.already_loaded);
    for (i, c) in f.clients.iter_mut().enumerate().skip(1) {
        let r = route_on(c, "thanks", "c1").await;
        assert!(routed_loaded(&r, "sonarr"), "replica {i}: {:?}", reasons(&r));
        let again = c.load_tool_group(load_request("c1", "sonarr")).await.unwrap();
        assert!(again.into_inner().already_loaded, "replica {i}");
    }
    // A reset on C is seen by A.
    f.clients[2]
        .reset_conversation(toolrouter::proto::ResetConversationRequest {
            conversation_id: "c1".into(),
        })
        .await
        .unwrap();
    let r = route_on(&f.clients[0], "thanks", "c1").await;
    assert!(!routed_loaded(&r, "sonarr"), "{:?}", reasons(&r));
    f.ui.close().await;
}

/// The answer's domains among `of`, in its order.
fn among(r: &toolrouter::proto::RouteResponse, of: &[&str]) -> Vec<String> {
    routed(r)
        .into_iter()
        .filter(|d| of.contains(&d.as_str()))
        .collect()
}

/// Calls on one conversation through several replicas at the same moment take effect one
/// after the other, each on the state the one before it left, as on one daemon: one of three
/// loads of a group is the first; a reset racing a turn never brings back what it removed;
/// two turns that each hit a domain are answered in the order the domains joined.
#[tokio::test]
async fn calls_on_one_conversation_through_several_replicas_at_once_take_turns() {
    let Some(f) = fleet(&["sonarr_url", "radarr_url"], &[]).await else {
        return;
    };
    let c = &f.clients;
    const ROUNDS: usize = 20;
    for round in 0..ROUNDS {
        // Every replica knows the conversation (cached) before the race.
        let (loads, resets, turns) = (format!("l{round}"), format!("r{round}"), format!("t{round}"));
        for (i, client) in c.iter().enumerate() {
            for id in [&loads, &resets, &turns] {
                route_on(client, "thanks", id).await;
            }
            if i == 0 {
                let load = load_request(&resets, "sonarr");
                client.clone().load_tool_group(load).await.unwrap();
            }
        }
        let load = |i: usize| {
            let (mut client, id) = (c[i].clone(), loads.clone());
            async move {
                client
                    .load_tool_group(load_request(&id, "sonarr"))
                    .await
                    .unwrap()
                    .into_inner()
            }
        };
        let (a, b, d) = tokio::join!(load(0), load(1), load(2));
        let first = [a, b, d].iter().filter(|l| !l.already_loaded).count();
        assert_eq!(first, 1, "round {round}: loads that said they were the first");

        let mut reset = c[2].clone();
        let (routed_hit, ()) = tokio::join!(route_on(&c[1], "next episode", &resets), async {
            let request = toolrouter::proto::ResetConversationRequest {
                conversation_id: resets.clone(),
            };
            reset.reset_conversation(request).await.unwrap();
        });
        assert!(
            among(&routed_hit, &["sonarr"]) == ["sonarr"],
            "{:?}",
            reasons(&routed_hit)
        );
        let after = route_on(&c[0], "thanks", &resets).await;
        assert!(
            !routed_loaded(&after, "sonarr"),
            "round {round}: a reset brought back by a turn: {:?}",
            reasons(&after)
        );

        let (movie, episode) = tokio::join!(
            route_on(&c[1], "a movie", &turns),
            route_on(&c[2], "next episode", &turns)
        );
        let both = ["radarr", "sonarr"];
        let joined = among(&route_on(&c[0], "thanks", &turns).await, &both);
        assert_eq!(joined.len(), 2, "round {round}: {joined:?}");
        // The turn whose domain joined first came first: it did not see the other's.
        let (earlier, later) = if joined[0] == "radarr" {
            (&movie, &episode)
        } else {
            (&episode, &movie)
        };
        assert_eq!(
            among(earlier, &both),
            joined[..1],
            "round {round}: {:?}",
            reasons(earlier)
        );
        assert_eq!(among(later, &both), joined, "round {round}: {:?}", reasons(later));
    }
}

#[tokio::test]
async fn a_domain_upserted_or_deleted_through_one_replica_is_served_so_by_the_others() {
    let Some(mut f) = fleet(&[], &[]).await else {
        return;
    };
    let manifest_json = r#"{"name":"lab","keywords":["oscilloscope"],"tools":[{"name":"lab_probe","description":"Probes the lab bench"}]}"#;
    f.clients[0]
        .upsert_domain(toolrouter::proto::UpsertDomainRequest {
            manifest_json: manifest_json.into(),
        })
        .await
        .unwrap();
    // No call tells B and C: the table's notification makes them rebuild their registry.
    until_all_list(&mut f.clients, "lab", true).await;
    let r = route_on(&f.clients[2], "read the oscilloscope", "").await;
    assert!(reasons(&r).iter().any(|(d, _)| d == "lab"), "{:?}", reasons(&r));
    f.clients[1]
        .delete_domain(toolrouter::proto::DeleteDomainRequest { name: "lab".into() })
        .await
        .unwrap();
    until_all_list(&mut f.clients, "lab", false).await;
}

/// Waits until every replica lists `group` (or none does).
async fn until_all_list(clients: &mut [Client], group: &str, want: bool) {
    let started = Instant::now();
    for (i, c) in clients.iter_mut().enumerate() {
        loop {
            let groups = c
                .list_groups(ListGroupsRequest::default())
                .await
                .unwrap()
                .into_inner();
            if groups.groups.iter().any(|g| g.name == group) == want {
                break;
            }
            assert!(
                started.elapsed() < PATIENCE,
                "replica {i} never listed {group}: {want}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

#[tokio::test]
async fn after_sigkill_of_one_replica_the_others_answer_and_nothing_acknowledged_is_lost() {
    let Some(mut f) = fleet(&["sonarr_url", "radarr_url", "qbittorrent_url"], &[]).await else {
        return;
    };
    // Loads through A, as fast as it answers, until it is killed.
    let mut a = f.clients[0].clone();
    let loader = tokio::spawn(async move {
        let mut acknowledged = Vec::new();
        for n in 0.. {
            let conversation = format!("k{n}");
            let group = ["sonarr", "radarr", "qbittorrent"][n % 3];
            match a.load_tool_group(load_request(&conversation, group)).await {
                Ok(_) => acknowledged.push((conversation, group)),
                Err(_) => break,
            }
        }
        acknowledged
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    f.daemons[0].signal("KILL");
    let acknowledged = loader.await.unwrap();
    assert!(!acknowledged.is_empty());
    report(&format!(
        "{} loads acknowledged by the replica before SIGKILL",
        acknowledged.len()
    ));
    for (i, c) in f.clients.iter_mut().enumerate().skip(1) {
        for (conversation, group) in &acknowledged {
            let r = c
                .route(route_request("thanks", conversation))
                .await
                .unwrap_or_else(|s| panic!("replica {i} did not answer: {s}"))
                .into_inner();
            assert!(
                routed_loaded(&r, group),
                "replica {i}, {conversation}: {group} was acknowledged: {:?}",
                reasons(&r)
            );
        }
    }
    assert!(f.daemons[0].exit(PATIENCE).await.is_some());
    f.ui.close().await;
}

/// Runs the test cluster's pg_ctl (`.ci/postgres.sh` writes one that runs as its owner).
fn pg_ctl(ctl: &str, args: &[&str]) {
    let out = std::process::Command::new(ctl).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "pg_ctl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// How the background load's calls ended, by call and status.
type Outcomes = BTreeMap<String, u64>;

#[tokio::test]
async fn a_postgres_restart_under_load_is_ridden_out_and_recovered_from_by_itself() {
    if postgres_url().is_none() {
        return;
    }
    let Some(ctl) = cluster_var("TOOLROUTER_TEST_POSTGRES_CTL") else {
        return;
    };
    // A request timeout shorter than the busy timeout, and settings re-read on nearly every
    // call: were a call to wait for the stopped server as long as the busy timeout lets it
    // (or once for the settings and once more for the conversation), a Route would run into
    // the request timeout instead of answering from memory. Database calls are cut at half
    // the request timeout, and once one found the server unreachable the others fail over.
    let hold = Hold::Alone {
        _guard: CLUSTER.write().await,
    };
    let mut f = start(
        hold,
        &["sonarr_url", "radarr_url"],
        &[
            "--busy-timeout",
            "5s",
            "--request-timeout",
            "2s",
            "--settings-ttl",
            "200ms",
        ],
    )
    .await;
    f.ui.close().await;
    for c in &mut f.clients {
        c.load_tool_group(load_request("c1", "sonarr")).await.unwrap();
    }

    // Route on every replica, with and without a conversation, throughout.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for (i, c) in f.clients.iter().enumerate() {
        let (mut c, stop) = (c.clone(), stop.clone());
        load.push(tokio::spawn(async move {
            let mut outcomes = Outcomes::new();
            let mut n = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let conversation = if n.is_multiple_of(2) { "c1" } else { "" };
                let code = match c.route(route_request("next episode", conversation)).await {
                    Ok(r) if r.get_ref().domains.iter().any(|d| d.domain == "sonarr") => "OK".into(),
                    Ok(r) => format!("OK without sonarr: {:?}", reasons(r.get_ref())),
                    Err(s) => format!("{:?}", s.code()),
                };
                *outcomes.entry(format!("replica {i} Route {code}")).or_default() += 1;
                n += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            outcomes
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    pg_ctl(&ctl, &["stop", "-m", "fast", "-w"]);
    for (i, c) in f.clients.iter_mut().enumerate() {
        let r = c
            .route(route_request("thanks", "c1"))
            .await
            .unwrap_or_else(|s| panic!("replica {i}: Route while the f.database is down: {s}"))
            .into_inner();
        assert!(routed_loaded(&r, "sonarr"), "replica {i}: {:?}", reasons(&r));
        let err = c
            .load_tool_group(load_request("c2", "radarr"))
            .await
            .expect_err("a load that cannot be written is never acknowledged");
        assert_eq!(err.code(), Code::Unavailable, "replica {i}: {err:?}");
        // A write to c1 that failed leaves c1's state held in memory as it was.
        let err = c
            .load_tool_group(load_request("c1", "radarr"))
            .await
            .expect_err("a load that cannot be written is never acknowledged");
        assert_eq!(err.code(), Code::Unavailable, "replica {i}: {err:?}");
        let r = c
            .route(route_request("thanks", "c1"))
            .await
            .unwrap_or_else(|s| panic!("replica {i}: Route after a failed write: {s}"))
            .into_inner();
        assert!(
            routed_loaded(&r, "sonarr"),
            "replica {i}, after a failed write: {:?}",
            reasons(&r)
        );
        assert!(
            !routed_loaded(&r, "radarr"),
            "replica {i}: the failed load was adopted"
        );
    }
    // Long enough for calls to probe the stopped server (one a second), each cut in time.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    pg_ctl(&ctl, &["start", "-w", "-t", "60"]);

    // Each replica recovers by itself: its next writes succeed, and it hears settings
    // changes again (its listening connection is back).
    let started = Instant::now();
    for (i, c) in f.clients.iter_mut().enumerate() {
        loop {
            match c
                .load_tool_group(load_request(&format!("after-{i}"), "radarr"))
                .await
            {
                Ok(_) => break,
                Err(s) => assert!(
                    started.elapsed() < PATIENCE,
                    "replica {i} has not recovered: {s:?}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    report(&format!(
        "PostgreSQL restarted: writes succeeded on all 3 replicas {:.0} ms after it was back",
        started.elapsed().as_secs_f64() * 1e3
    ));
    f.ui = Db::connect(&f.database).await.unwrap();
    f.ui.set_setting("radarr_url", "").await.unwrap();
    until_all_see(&mut f.clients, "radarr", false, Instant::now()).await;

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut outcomes = Outcomes::new();
    for task in load {
        for (k, v) in task.await.unwrap() {
            *outcomes.entry(k).or_default() += v;
        }
    }
    report(&format!("Route calls during the restart: {outcomes:?}"));
    assert!(
        outcomes.keys().all(|k| k.ends_with("Route OK")),
        "every Route answered from the last snapshot: {outcomes:?}"
    );
    f.ui.close().await;
}
