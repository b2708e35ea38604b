//! The load generator: a tonic client that sends requests at a fixed concurrency for a fixed
//! time, checks every status, decodes every response, and reports requests/s and latency
//! percentiles (HdrHistogram).
//!
//! Two workloads: `route` (only `Route`, no conversation: the throughput benchmark) and
//! `mixed` (the soak: mostly `Route` within conversations, plus `LoadToolGroup`,
//! `ListGroups`, `InvalidateSettings` and `ReloadRegistry`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::Value;
use tonic::Code;

use crate::cli::connection::{Client, Connection};
use crate::proto::{self, RouteRequest};

/// Which calls the load generator sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mix {
    /// Only `Route`, without a conversation.
    Route,
    /// Of every 100 calls: 90 `Route` (two in three within a conversation), 4
    /// `LoadToolGroup`, 3 `ListGroups`, 2 `InvalidateSettings`, 1 `ReloadRegistry`.
    Mixed,
}

/// What one run measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// Requests answered OK per second.
    pub requests_per_sec: f64,
    /// Median latency, microseconds.
    pub p50_us: u64,
    /// 99th percentile latency, microseconds.
    pub p99_us: u64,
    /// 99.9th percentile latency, microseconds.
    pub p999_us: u64,
    /// Requests that failed unexpectedly (any other non-OK status or transport error).
    pub errors: u64,
    /// Requests answered OK.
    pub ok: u64,
    /// `LoadToolGroup` calls refused as the contract says they must be (`FAILED_PRECONDITION`
    /// for a group the flipped settings made inactive): correct answers, not errors.
    pub refused: u64,
    /// OK answers per call.
    pub calls: BTreeMap<&'static str, u64>,
    /// Unexpected failures per call and status code, e.g. `Route UNAVAILABLE`.
    pub failures: BTreeMap<String, u64>,
    /// Concurrent in-flight requests.
    pub concurrency: usize,
    /// Measured duration, seconds.
    pub seconds: f64,
}

/// Reads messages: one per line, each a JSON string, a JSON object with `query` or
/// `message` (so the eval `queries.jsonl` files work as they are), or plain text.
///
/// # Errors
/// An unreadable file, or one without any message.
pub fn read_messages(path: &Path) -> crate::Result<Vec<String>> {
    let text = std::fs::read_to_string(path).map_err(|source| crate::Error::Io {
        context: format!("cannot read {}", path.display()),
        source,
    })?;
    let messages: Vec<String> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| match serde_json::from_str::<Value>(line) {
            Ok(Value::String(s)) => s,
            Ok(Value::Object(o)) => o
                .get("query")
                .or_else(|| o.get("message"))
                .and_then(Value::as_str)
                .unwrap_or(line)
                .to_string(),
            _ => line.to_string(),
        })
        .collect();
    if messages.is_empty() {
        return Err(crate::Error::Config(format!(
            "{} holds no messages",
            path.display()
        )));
    }
    Ok(messages)
}

/// A latency histogram from 1 µs to 60 s at 3 significant digits.
fn histogram() -> Histogram<u64> {
    // The bounds are constants within what HdrHistogram accepts, so this cannot fail.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// What one worker saw.
struct Tally {
    hist: Histogram<u64>,
    ok: u64,
    errors: u64,
    refused: u64,
    calls: BTreeMap<&'static str, u64>,
    failures: BTreeMap<String, u64>,
}

/// How one call ended.
enum Outcome {
    Ok,
    Refused,
    /// What kind of failure (the status code, or `empty answer`) and the details.
    Failed {
        kind: String,
        detail: String,
    },
}

fn outcome<T>(result: Result<tonic::Response<T>, tonic::Status>, valid: impl FnOnce(&T) -> bool) -> Outcome {
    match result {
        Ok(r) if valid(r.get_ref()) => Outcome::Ok,
        Ok(_) => Outcome::Failed {
            kind: "empty answer".into(),
            detail: String::new(),
        },
        Err(s) => Outcome::Failed {
            kind: format!("{:?}", s.code()),
            detail: s.message().to_string(),
        },
    }
}

/// One call of the mix, chosen by the worker's call counter.
async fn call(
    client: &mut Client,
    mix: Mix,
    worker: usize,
    n: usize,
    message: String,
    groups: &[String],
) -> (&'static str, Outcome) {
    let slot = n % 100;
    // Conversations of 50 calls each, distinct per worker; built only for the calls that use
    // one, so the Route-only benchmark allocates nothing extra per call.
    let conversation = || format!("soak-{worker}-{}", n / 50);
    match (mix, slot) {
        (Mix::Route, _) | (Mix::Mixed, 10..) => {
            let conversation_id = if mix == Mix::Mixed && !slot.is_multiple_of(3) {
                conversation()
            } else {
                String::new()
            };
            let r = client
                .route(RouteRequest {
                    message,
                    conversation_id,
                    ..RouteRequest::default()
                })
                .await;
            (
                "Route",
                outcome(r, |r| !r.tools.is_empty() || !r.domains.is_empty()),
            )
        }
        (Mix::Mixed, 0..=3) => {
            let group_name = groups.get(n % groups.len().max(1)).cloned().unwrap_or_default();
            let r = client
                .load_tool_group(proto::LoadToolGroupRequest {
                    conversation_id: conversation(),
                    group_name,
                })
                .await;
            let o = match r {
                Err(s) if s.code() == Code::FailedPrecondition => Outcome::Refused,
                r => outcome(r, |r| r.group.is_some()),
            };
            ("LoadToolGroup", o)
        }
        (Mix::Mixed, 4..=6) => {
            let r = client.list_groups(proto::ListGroupsRequest {}).await;
            ("ListGroups", outcome(r, |r| !r.groups.is_empty()))
        }
        (Mix::Mixed, 7..=8) => {
            let r = client
                .invalidate_settings(proto::InvalidateSettingsRequest {})
                .await;
            ("InvalidateSettings", outcome(r, |_| true))
        }
        (Mix::Mixed, _) => {
            let r = client.reload_registry(proto::ReloadRegistryRequest {}).await;
            ("ReloadRegistry", outcome(r, |r| r.domains > 0))
        }
    }
}

/// Sends the `mix` to the daemon from `concurrency` tasks for `duration`.
///
/// # Errors
/// When the daemon cannot be reached at all.
pub async fn run(
    conn: &Connection,
    duration: Duration,
    concurrency: usize,
    messages: Vec<String>,
    mix: Mix,
) -> crate::Result<Report> {
    let client = conn.client().await?.max_decoding_message_size(64 << 20);
    // Every non-core group, for LoadToolGroup.
    let groups: Vec<String> = if mix == Mix::Mixed {
        let mut c = client.clone();
        let all = c
            .list_groups(proto::ListGroupsRequest {})
            .await
            .map_err(|s| crate::Error::Unavailable(format!("ListGroups failed: {}", s.message())))?;
        all.into_inner()
            .groups
            .into_iter()
            .filter(|g| !g.core)
            .map(|g| g.name)
            .collect()
    } else {
        Vec::new()
    };
    let groups = std::sync::Arc::new(groups);
    let messages = std::sync::Arc::new(messages);
    // A short warm-up so connection set-up and first-touch allocation are not measured.
    let warmup = Duration::from_millis(500).min(duration / 10);
    let start = Instant::now();
    let measure_from = start + warmup;
    let deadline = measure_from + duration;
    let mut tasks = Vec::with_capacity(concurrency);
    for worker in 0..concurrency {
        let mut client = client.clone();
        let messages = messages.clone();
        let groups = groups.clone();
        tasks.push(tokio::spawn(async move {
            let mut t = Tally {
                hist: histogram(),
                ok: 0,
                errors: 0,
                refused: 0,
                calls: BTreeMap::new(),
                failures: BTreeMap::new(),
            };
            let mut n = worker;
            loop {
                let sent = Instant::now();
                if sent >= deadline {
                    break;
                }
                let message = messages[n % messages.len()].clone();
                let (name, result) = call(&mut client, mix, worker, n, message, &groups).await;
                n += 1;
                let took = sent.elapsed();
                if sent < measure_from {
                    continue;
                }
                match result {
                    Outcome::Ok => {
                        t.ok += 1;
                        *t.calls.entry(name).or_default() += 1;
                        t.hist.saturating_record(took.as_micros() as u64);
                    }
                    Outcome::Refused => t.refused += 1,
                    Outcome::Failed { kind, detail } => {
                        if t.errors == 0 {
                            tracing::warn!(call = name, %kind, %detail, "call failed");
                        }
                        t.errors += 1;
                        *t.failures.entry(format!("{name} {kind}")).or_default() += 1;
                    }
                }
            }
            t
        }));
    }
    let mut hist = histogram();
    let (mut ok, mut errors, mut refused) = (0, 0, 0);
    let mut calls = BTreeMap::new();
    let mut failures = BTreeMap::new();
    for task in tasks {
        let t = task
            .await
            .map_err(|e| crate::Error::Config(format!("load task failed: {e}")))?;
        hist.add(t.hist)
            .map_err(|e| crate::Error::Config(format!("histogram merge: {e}")))?;
        ok += t.ok;
        errors += t.errors;
        refused += t.refused;
        for (k, v) in t.calls {
            *calls.entry(k).or_default() += v;
        }
        for (k, v) in t.failures {
            *failures.entry(k).or_default() += v;
        }
    }
    let seconds = duration.as_secs_f64();
    Ok(Report {
        requests_per_sec: ok as f64 / seconds,
        p50_us: hist.value_at_quantile(0.50),
        p99_us: hist.value_at_quantile(0.99),
        p999_us: hist.value_at_quantile(0.999),
        errors,
        ok,
        refused,
        calls,
        failures,
        concurrency,
        seconds,
    })
}
