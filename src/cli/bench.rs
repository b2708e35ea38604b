//! `bench grpc`: the load generator operators point at a deployment. A tonic client sends
//! requests at a fixed concurrency for a fixed time, checks every status, decodes every
//! response (with `--decode count`, `Route` answers are walked without building their
//! messages), and reports requests/s and exact latency percentiles (every latency is kept,
//! one `u64` per call, and sorted once at the end).
//!
//! Workloads: `route` (only `Route`, no conversation: the throughput benchmark), `converse`
//! (only `Route`, within conversations), `load` (only `LoadToolGroup`, each a write) and
//! `mixed` (the soak: mostly `Route` within conversations, plus `LoadToolGroup`,
//! `ListGroups`, `InvalidateSettings`, `ReloadRegistry`, and `UpsertDomain`/`DeleteDomain`
//! of one run-time domain per worker, deleted again when the run ends).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Subcommand, ValueEnum};
use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType, skip_field};
use serde_json::Value;
use tonic::Code;

use super::Failure;
use super::connection::{BearerToken, Client, Connection};
use crate::proto::tool_router_client::ToolRouterClient;
use crate::proto::{self, RouteRequest};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// `bench` tools.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Send `Route` requests for a fixed time and report requests/s and latency percentiles.
    Grpc {
        /// How to reach the server.
        #[command(flatten)]
        conn: Connection,
        /// How long to measure, e.g. `10s`.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        duration: Duration,
        /// Requests in flight at once.
        #[arg(long, default_value_t = 1)]
        concurrency: usize,
        /// Messages, one per line (a JSON string, a JSON object with `query` or `message`, or
        /// text), sent in turn.
        #[arg(long)]
        messages: PathBuf,
        /// Which calls to send: `route` (throughput), `mixed` (the soak), `converse`
        /// (`Route` in 50-turn conversations) or `load` (`LoadToolGroup` into new
        /// conversations). Ctrl-C or SIGTERM ends the run early, with its report.
        #[arg(long, value_enum, default_value = "route")]
        mix: Mix,
        /// Ask `Route` for the tools in this provider format (`tools_json`) instead of native
        /// `Tool` messages: openai_chat, openai_responses, anthropic, gemini or mcp.
        #[arg(long, value_parser = super::client::parse_format)]
        format: Option<proto::Format>,
        /// How `Route` answers are read: `full` decodes each into messages, as a client
        /// would; `count` walks their fields without building them (tools and decisions
        /// counted, `tools_json` measured), so that at high rates the server is measured
        /// rather than this generator's decoding.
        #[arg(long, value_enum, default_value = "full")]
        decode: Decode,
    },
    /// Write the third-party eval sets (Seal-Tools, StableToolBench) as manifests and
    /// labelled queries for `eval`: runs `toolrouter-bench export` (built beside this binary
    /// in the repository's workspace), e.g. `bench export seal --out DIR`.
    Export {
        /// What `toolrouter-bench export` takes (`--help` lists it).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// How `Route` answers are read (`--decode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Decode {
    /// Into `RouteResponse` messages.
    Full,
    /// Field by field, counting tools and decisions, not building them.
    Count,
}

/// A `RouteResponse` read without building it: its tools and domain decisions counted and
/// its `tools_json` measured; every other field skipped. Decoding still checks the framing
/// of every field.
#[derive(Debug, Default)]
struct RouteCount {
    tools: usize,
    domains: usize,
    /// With its length prefix.
    tools_json_bytes: usize,
}

impl prost::Message for RouteCount {
    /// Never sent.
    fn encode_raw(&self, _: &mut impl BufMut) {}

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        // RouteResponse's `tools`, `domains` and `tools_json`.
        match (tag, wire_type) {
            (1, WireType::LengthDelimited) => self.tools += 1,
            (2, WireType::LengthDelimited) => self.domains += 1,
            (5, WireType::LengthDelimited) => {
                let before = buf.remaining();
                skip_field(wire_type, tag, buf, ctx)?;
                self.tools_json_bytes += before - buf.remaining();
                return Ok(());
            }
            _ => {}
        }
        skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        0
    }

    fn clear(&mut self) {
        *self = RouteCount::default();
    }
}

/// The channel the load generator's clients share, with the token.
type Service = InterceptedService<Channel, BearerToken>;

/// A `Route` call whose answer is read as a [`RouteCount`].
async fn route_counted(
    service: Service,
    request: RouteRequest,
) -> Result<tonic::Response<RouteCount>, tonic::Status> {
    let mut grpc =
        tonic::client::Grpc::new(service).max_decoding_message_size(super::connection::MAX_ANSWER_BYTES);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("the channel is not ready: {e}")))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/toolrouter.v1.ToolRouter/Route");
    let codec = tonic_prost::ProstCodec::<RouteRequest, RouteCount>::default();
    grpc.unary(tonic::Request::new(request), path, codec).await
}

/// `bench export`: `toolrouter-bench export ARGS`, the tool beside this binary, with this
/// process's output and exit code; where it is not built, how to build and run it.
fn export(args: &[String]) -> Result<(), Failure> {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| {
            Some(
                exe.parent()?
                    .join(format!("toolrouter-bench{}", std::env::consts::EXE_SUFFIX)),
            )
        })
        .filter(|tool| tool.is_file());
    let Some(tool) = beside else {
        let shown: Vec<String> = args
            .iter()
            .map(|a| {
                if a.is_empty() || a.contains(|c: char| c.is_whitespace() || "'\"$\\".contains(c)) {
                    format!("{a:?}")
                } else {
                    a.clone()
                }
            })
            .collect();
        return Err(Failure::config(format!(
            "export is done by toolrouter-bench, which is not built beside this binary: run, in the repository, \
             cargo run --release -p toolrouter-bench -- export {}",
            if args.is_empty() {
                "seal|stb --out DIR".to_string()
            } else {
                shown.join(" ")
            }
        )));
    };
    let status = std::process::Command::new(&tool)
        .arg("export")
        .args(args)
        .status()
        .map_err(|e| Failure::runtime(format!("cannot run {}: {e}", tool.display())))?;
    match status.code() {
        Some(0) => Ok(()),
        Some(code) => std::process::exit(code),
        None => Err(Failure::runtime(format!(
            "{} was stopped by a signal",
            tool.display()
        ))),
    }
}

pub(super) async fn bench(command: BenchCommand) -> Result<(), Failure> {
    let (conn, duration, concurrency, messages, mix, format, decode) = match command {
        BenchCommand::Grpc {
            conn,
            duration,
            concurrency,
            messages,
            mix,
            format,
            decode,
        } => (conn, duration, concurrency, messages, mix, format, decode),
        BenchCommand::Export { args } => return export(&args),
    };
    if concurrency == 0 {
        return Err(Failure::config("--concurrency must be at least 1"));
    }
    if duration.is_zero() {
        return Err(Failure::config("--duration must be more than 0s"));
    }
    let messages = read_messages(&messages)?;
    let format = i32::from(format.unwrap_or_default());
    let r = run(&conn, duration, concurrency, messages, (mix, format, decode)).await?;
    out!(
        "{:.0} requests/s, p50 {} µs, p99 {} µs, p99.9 {} µs, {} errors ({} ok, {} refused as specified, concurrency {}, {:.1} s)",
        r.requests_per_sec,
        r.p50_us,
        r.p99_us,
        r.p999_us,
        r.errors,
        r.ok,
        r.refused,
        r.concurrency,
        r.seconds
    );
    out!("{}", serde_json::to_string(&r).unwrap_or_default());
    if r.errors > 0 {
        return Err(Failure::runtime(format!("{} requests failed", r.errors)));
    }
    Ok(())
}

/// Which calls the load generator sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mix {
    /// Only `Route`, without a conversation.
    Route,
    /// Of every 100 calls: 88 `Route` (two in three within a conversation), 4
    /// `LoadToolGroup`, 3 `ListGroups`, 2 `InvalidateSettings`, 1 `ReloadRegistry`, and 2
    /// that register the worker's own run-time domain (`UpsertDomain`) or delete it
    /// (`DeleteDomain`) in turn.
    Mixed,
    /// Only `Route`, each within a conversation of 50 turns.
    Converse,
    /// Only `LoadToolGroup`, each into a new conversation, so each one writes.
    Load,
}

/// What one run measured.
#[derive(Debug, Clone, serde::Serialize)]
struct Report {
    /// Requests answered OK per second.
    requests_per_sec: f64,
    /// Median latency, microseconds.
    p50_us: u64,
    /// 99th percentile latency, microseconds.
    p99_us: u64,
    /// 99.9th percentile latency, microseconds.
    p999_us: u64,
    /// Requests that failed unexpectedly (any other non-OK status or transport error).
    errors: u64,
    /// Requests answered OK.
    ok: u64,
    /// `LoadToolGroup` calls refused as the contract says they must be (`FAILED_PRECONDITION`
    /// for a group the flipped settings made inactive): correct answers, not errors.
    refused: u64,
    /// OK answers per call.
    calls: BTreeMap<&'static str, u64>,
    /// Unexpected failures per call and status code, e.g. `Route UNAVAILABLE`.
    failures: BTreeMap<String, u64>,
    /// Concurrent in-flight requests.
    concurrency: usize,
    /// Measured duration, seconds.
    seconds: f64,
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

/// The latency at quantile `q` of `sorted` latencies, by nearest rank (the smallest value
/// at least a `q` share of the calls did not exceed); 0 when there are none.
fn percentile(sorted: &[u64], q: f64) -> u64 {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted
        .get(rank.clamp(1, sorted.len().max(1)) - 1)
        .copied()
        .unwrap_or(0)
}

/// What one worker saw.
struct Tally {
    /// Latency of every OK call, microseconds.
    latencies: Vec<u64>,
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

/// The run-time domain worker `worker` of the mixed workload registers and deletes: its
/// name and its native manifest (one tool, a keyword no message says).
fn worker_domain(worker: usize) -> (String, String) {
    let name = format!("bench-worker-{worker}");
    let manifest = serde_json::json!({
        "name": name,
        "description": "A domain the load generator registers and deletes at run time",
        "keywords": [format!("benchworker{worker}")],
        "tools": [{
            "name": format!("bench_worker_{worker}_status"),
            "description": "Report the load generator worker's status",
            "tier": "read",
            "input_schema": {"type": "object", "properties": {"verbose": {"type": "boolean"}}}
        }]
    });
    (name, manifest.to_string())
}

/// Deletes the worker's run-time domain.
async fn delete_worker_domain(client: &mut Client, worker: usize) -> Outcome {
    let name = worker_domain(worker).0;
    let r = client.delete_domain(proto::DeleteDomainRequest { name }).await;
    outcome(r, |r| r.deleted)
}

/// One call of the mix, chosen by the worker's call counter; `registered` says whether the
/// worker's run-time domain is registered now, so it is deleted only once it was.
async fn call(
    (client, service): (&mut Client, &Service),
    (mix, format, decode): (Mix, i32, Decode),
    (worker, registered): (usize, bool),
    n: usize,
    message: String,
    groups: &[String],
) -> (&'static str, Outcome) {
    let slot = n % 100;
    // Conversations of 50 calls each, distinct per worker and per load generator (several
    // may drive replicas of one database); built only for the calls that use one, so the
    // Route-only benchmark allocates nothing extra per call.
    let conversation = || format!("soak-{}-{worker}-{}", std::process::id(), n / 50);
    match (mix, slot) {
        (Mix::Load, _) => {
            let group_name = groups.get(n % groups.len().max(1)).cloned().unwrap_or_default();
            let r = client
                .load_tool_group(proto::LoadToolGroupRequest {
                    conversation_id: format!("load-{}-{worker}-{n}", std::process::id()),
                    group_name,
                    ..Default::default()
                })
                .await;
            let o = match r {
                Err(s) if s.code() == Code::FailedPrecondition => Outcome::Refused,
                r => outcome(r, |r| r.group.is_some() && !r.already_loaded),
            };
            ("LoadToolGroup", o)
        }
        (Mix::Route | Mix::Converse, _) | (Mix::Mixed, 12..) => {
            let conversation_id = match mix {
                Mix::Converse => conversation(),
                Mix::Mixed if !slot.is_multiple_of(3) => conversation(),
                _ => String::new(),
            };
            let request = RouteRequest {
                message,
                conversation_id,
                format,
                ..RouteRequest::default()
            };
            let o = match decode {
                Decode::Full => outcome(client.route(request).await, |r| {
                    !r.tools.is_empty() || !r.tools_json.is_empty() || !r.domains.is_empty()
                }),
                Decode::Count => outcome(route_counted(service.clone(), request).await, |r| {
                    r.tools > 0 || r.tools_json_bytes > 0 || r.domains > 0
                }),
            };
            ("Route", o)
        }
        (Mix::Mixed, 0..=3) => {
            let group_name = groups.get(n % groups.len().max(1)).cloned().unwrap_or_default();
            let r = client
                .load_tool_group(proto::LoadToolGroupRequest {
                    conversation_id: conversation(),
                    group_name,
                    ..Default::default()
                })
                .await;
            let o = match r {
                Err(s) if s.code() == Code::FailedPrecondition => Outcome::Refused,
                r => outcome(r, |r| r.group.is_some()),
            };
            ("LoadToolGroup", o)
        }
        (Mix::Mixed, 4..=6) => {
            let r = client.list_groups(proto::ListGroupsRequest::default()).await;
            ("ListGroups", outcome(r, |r| !r.groups.is_empty()))
        }
        (Mix::Mixed, 7..=8) => {
            let r = client
                .invalidate_settings(proto::InvalidateSettingsRequest {})
                .await;
            ("InvalidateSettings", outcome(r, |_| true))
        }
        (Mix::Mixed, 10..=11) if registered => ("DeleteDomain", delete_worker_domain(client, worker).await),
        (Mix::Mixed, 10..=11) => {
            let (name, manifest_json) = worker_domain(worker);
            let r = client
                .upsert_domain(proto::UpsertDomainRequest { manifest_json })
                .await;
            ("UpsertDomain", outcome(r, |r| r.domain == name && r.tools == 1))
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
async fn run(
    conn: &Connection,
    duration: Duration,
    concurrency: usize,
    messages: Vec<String>,
    mix: (Mix, i32, Decode),
) -> crate::Result<Report> {
    let service = conn.service().await?;
    let client =
        ToolRouterClient::new(service.clone()).max_decoding_message_size(super::connection::MAX_ANSWER_BYTES);
    // The non-core groups, for LoadToolGroup: every one in the mixed run, which counts the
    // refusals of unconfigured ones as specified; only active ones in a load run, which
    // measures loads that write.
    let groups: Vec<String> = if matches!(mix.0, Mix::Mixed | Mix::Load) {
        let mut c = client.clone();
        let all = c
            .list_groups(proto::ListGroupsRequest::default())
            .await
            .map_err(|s| crate::Error::Unavailable(format!("ListGroups failed: {}", s.message())))?;
        all.into_inner()
            .groups
            .into_iter()
            .filter(|g| !g.core && (g.active || mix.0 == Mix::Mixed))
            .map(|g| g.name)
            .collect()
    } else {
        Vec::new()
    };
    if mix.0 == Mix::Load && groups.is_empty() {
        return Err(crate::Error::Config(
            "--mix load loads active groups, and the daemon has no active non-core group: configure one (toolrouter settings set KEY VALUE)".into(),
        ));
    }
    let groups = std::sync::Arc::new(groups);
    let messages = std::sync::Arc::new(messages);
    // A short warm-up so connection set-up and first-touch allocation are not measured.
    let warmup = Duration::from_millis(500).min(duration / 10);
    let start = Instant::now();
    let measure_from = start + warmup;
    let deadline = measure_from + duration;
    // Ctrl-C or SIGTERM ends the run early, as its end would: each worker deletes the
    // domain it registered, and the report covers the time measured.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Taken from here, not from the task's first turn, while the workers already call.
    let signalled = super::serve::shutdown_signal();
    let interrupt = tokio::spawn({
        let stop = stop.clone();
        async move {
            signalled.await;
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    let mut tasks = Vec::with_capacity(concurrency);
    for worker in 0..concurrency {
        let mut client = client.clone();
        let service = service.clone();
        let messages = messages.clone();
        let groups = groups.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut t = Tally {
                latencies: Vec::new(),
                ok: 0,
                errors: 0,
                refused: 0,
                calls: BTreeMap::new(),
                failures: BTreeMap::new(),
            };
            let mut n = worker;
            let mut registered = false;
            loop {
                let sent = Instant::now();
                if sent >= deadline || stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let message = messages[n % messages.len()].clone();
                let (name, result) = call(
                    (&mut client, &service),
                    mix,
                    (worker, registered),
                    n,
                    message,
                    &groups,
                )
                .await;
                n += 1;
                if matches!(result, Outcome::Ok) {
                    registered = match name {
                        "UpsertDomain" => true,
                        "DeleteDomain" => false,
                        _ => registered,
                    };
                }
                let took = sent.elapsed();
                if sent < measure_from {
                    continue;
                }
                match result {
                    Outcome::Ok => {
                        t.ok += 1;
                        *t.calls.entry(name).or_default() += 1;
                        t.latencies.push(took.as_micros() as u64);
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
            // A run against a deployment leaves no domain of its own behind (not measured).
            if registered
                && let Outcome::Failed { kind, detail } = delete_worker_domain(&mut client, worker).await
            {
                t.errors += 1;
                *t.failures.entry(format!("DeleteDomain {kind}")).or_default() += 1;
                tracing::warn!(%kind, %detail, "cannot delete the worker's run-time domain");
            }
            t
        }));
    }
    let mut latencies = Vec::new();
    let (mut ok, mut errors, mut refused) = (0, 0, 0);
    let mut calls = BTreeMap::new();
    let mut failures = BTreeMap::new();
    for task in tasks {
        let t = task
            .await
            .map_err(|e| crate::Error::Config(format!("load task failed: {e}")))?;
        latencies.extend(t.latencies);
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
    interrupt.abort();
    latencies.sort_unstable();
    // The time measured: all of it, or up to an interruption.
    let seconds = Instant::now()
        .min(deadline)
        .saturating_duration_since(measure_from)
        .as_secs_f64()
        .max(f64::MIN_POSITIVE);
    Ok(Report {
        requests_per_sec: ok as f64 / seconds,
        p50_us: percentile(&latencies, 0.50),
        p99_us: percentile(&latencies, 0.99),
        p999_us: percentile(&latencies, 0.999),
        errors,
        ok,
        refused,
        calls,
        failures,
        concurrency,
        seconds,
    })
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;

    /// Counting reads what decoding reads, and refuses what decoding refuses.
    #[test]
    fn a_counted_route_answer_has_the_decoded_ones_tools_and_decisions() {
        let tool = proto::Tool {
            name: "t".into(),
            ..Default::default()
        };
        let answer = proto::RouteResponse {
            tools: vec![tool.clone(), tool.clone(), tool],
            domains: vec![proto::DomainDecision::default(), proto::DomainDecision::default()],
            fallback: true,
            registry_version: 7,
            tools_json: b"[{}]".to_vec(),
            prompt_section: "p".into(),
            ..Default::default()
        };
        let bytes = answer.encode_to_vec();
        let counted = RouteCount::decode(&bytes[..]).unwrap();
        assert_eq!((counted.tools, counted.domains), (3, 2));
        // The value and its one-byte length prefix.
        assert_eq!(counted.tools_json_bytes, 5);
        assert_eq!(RouteCount::decode(&[][..]).unwrap().tools, 0);
        for cut in 1..bytes.len() {
            if proto::RouteResponse::decode(&bytes[..cut]).is_err() {
                assert!(RouteCount::decode(&bytes[..cut]).is_err(), "cut at {cut}");
            }
        }
    }

    #[test]
    fn percentiles_are_nearest_rank_over_every_latency() {
        let sorted: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile(&sorted, 0.50), 500);
        assert_eq!(percentile(&sorted, 0.99), 990);
        assert_eq!(percentile(&sorted, 0.999), 999);
        assert_eq!(percentile(&[7], 0.999), 7);
        assert_eq!(percentile(&[], 0.5), 0);
    }

    #[test]
    fn messages_are_read_from_json_strings_objects_or_text() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        std::fs::write(
            &path,
            "\"a string\"\n{\"query\": \"a query\"}\n\n{\"message\": \"a message\"}\nplain text\n",
        )
        .unwrap();
        assert_eq!(
            read_messages(&path).unwrap(),
            ["a string", "a query", "a message", "plain text"]
        );
        std::fs::write(&path, "\n").unwrap();
        assert!(read_messages(&path).is_err());
    }
}
