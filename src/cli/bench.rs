//! `bench`: the benchmark tools: the gRPC load generator (`crate::bench::grpc`), the
//! transport-floor server, the settings flipper of the soak, and workload export.

use std::path::PathBuf;
use std::time::Duration;

use clap::Subcommand;

use super::Failure;
use super::connection::Connection;
use super::serve::{ServeArgs, init_tracing, shutdown_signal};
use crate::db::Db;
use crate::proto;
use crate::registry::Registry;
use crate::state::State;

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
        /// Messages, one per line (a JSON string, a JSON object with `query`, or text)
        /// [default: the demo workload's messages].
        #[arg(long)]
        messages: Option<PathBuf>,
        /// Which calls to send: `route` (throughput) or `mixed` (the soak).
        #[arg(long, value_enum, default_value = "route")]
        mix: crate::bench::grpc::Mix,
    },
    /// Flip settings in the database for a while, as a busy settings UI would: each tick sets
    /// or clears one settings key of the registry. Exits 1 if any write failed.
    FlipSettings {
        /// The database the daemon uses.
        #[arg(long, env = "TOOLROUTER_DATABASE", default_value = "sqlite://toolrouter.db")]
        database: String,
        /// The daemon's manifest folders, for the settings keys [default: the demo registry].
        #[arg(long, value_delimiter = ':')]
        manifests: Vec<PathBuf>,
        /// How long to keep flipping, e.g. `60s`.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        duration: Duration,
        /// Time between writes, e.g. `20ms`.
        #[arg(long, default_value = "20ms", value_parser = humantime::parse_duration)]
        every: Duration,
    },
    /// Serve `Route` with the daemon's answers prebuilt, without routing: the transport floor.
    BaselineServer {
        /// The same registry, database and listen flags as `serve`.
        #[command(flatten)]
        serve: Box<ServeArgs>,
        /// The messages the load generator will send; their answers are prebuilt.
        #[arg(long)]
        messages: Option<PathBuf>,
    },
    /// Write a benchmark workload as manifests, a messages file and a database whose settings
    /// activate every domain, to serve it for real.
    Export {
        /// `demo`, `seal`, `stb` or `scale-N` (N tools).
        workload: String,
        /// Folder to write `manifests/`, `messages.jsonl`, `toolrouter.db` and, for the eval
        /// sets, `queries.jsonl` (labelled, for `toolrouter eval`) into.
        #[arg(long)]
        out: PathBuf,
        /// The eval data folder.
        #[arg(long, env = "TOOLROUTER_EVAL_DIR", default_value = "../shared/eval")]
        eval: PathBuf,
    },
}

fn bench_messages(path: Option<&std::path::Path>) -> Result<Vec<String>, Failure> {
    match path {
        Some(p) => Ok(crate::bench::grpc::read_messages(p)?),
        None => Ok(crate::bench::eval::demo().messages),
    }
}

pub(super) async fn bench(command: BenchCommand) -> Result<(), Failure> {
    match command {
        BenchCommand::Grpc {
            conn,
            duration,
            concurrency,
            messages,
            mix,
        } => {
            if concurrency == 0 {
                return Err(Failure::config("--concurrency must be at least 1"));
            }
            let messages = bench_messages(messages.as_deref())?;
            let r = crate::bench::grpc::run(&conn, duration, concurrency, messages, mix).await?;
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
        BenchCommand::BaselineServer { serve, messages } => {
            baseline_server(&serve, messages.as_deref()).await
        }
        BenchCommand::Export { workload, out, eval } => export(&workload, &out, &eval).await,
        BenchCommand::FlipSettings {
            database,
            manifests,
            duration,
            every,
        } => flip_settings(&database, &manifests, duration, every).await,
    }
}

async fn baseline_server(serve: &ServeArgs, messages: Option<&std::path::Path>) -> Result<(), Failure> {
    use crate::proto::tool_router_server::ToolRouter as _;
    let config = serve.config()?;
    init_tracing(config.log_format);
    let registry = Registry::load(&config.manifests)?;
    let messages = bench_messages(messages)?;
    // The daemon's own answers, through the real service, are what the baseline sends.
    let state = State::new(registry, &config).await?;
    let real = crate::service::ToolRouterService::new(state.clone());
    let mut answers = Vec::new();
    for message in messages {
        let req = tonic::Request::new(proto::RouteRequest {
            message: message.clone(),
            ..proto::RouteRequest::default()
        });
        answers.push((message, real.route(req).await?.into_inner()));
    }
    state.close().await;
    let baseline = crate::bench::baseline::BaselineService::from_answers(answers)
        .ok_or_else(|| Failure::config("no messages to build the baseline answer from"))?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| Failure::runtime(format!("cannot listen on {}: {e}", config.listen)))?;
    tracing::info!(listen = %config.listen, response_bytes = baseline.response_bytes(), "baseline serving");
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    tonic::transport::Server::builder()
        .add_service(health)
        .add_service(proto::tool_router_server::ToolRouterServer::new(baseline))
        // No drain phase here: the shutdown signal stops it at once.
        .serve_with_incoming_shutdown(
            crate::server::incoming(
                listener,
                tokio::sync::watch::channel(false).1,
                config.handshake_timeout,
            ),
            shutdown_signal(),
        )
        .await
        .map_err(|e| Failure::runtime(format!("server failed: {e}")))
}

async fn flip_settings(
    database: &str,
    manifests: &[PathBuf],
    duration: Duration,
    every: Duration,
) -> Result<(), Failure> {
    let registry = Registry::load(manifests)?;
    let mut keys: Vec<String> = registry
        .domains()
        .iter()
        .flat_map(|d| d.settings_keys.iter().cloned())
        .collect();
    keys.sort();
    keys.dedup();
    if keys.is_empty() {
        return Err(Failure::config("the registry has no settings keys to flip"));
    }
    let db = Db::connect(database).await?;
    let deadline = std::time::Instant::now() + duration;
    let (mut writes, mut failures) = (0u64, 0u64);
    let mut tick = tokio::time::interval(every);
    let mut n = 0usize;
    while std::time::Instant::now() < deadline {
        tick.tick().await;
        // Each key in turn; a key is set on even rounds over the list and cleared on odd ones.
        let key = &keys[n % keys.len()];
        let on = (n / keys.len()).is_multiple_of(2);
        n += 1;
        let result = if on {
            db.set_setting(key, "on").await
        } else {
            db.unset_setting(key).await.map(drop)
        };
        match result {
            Ok(()) => writes += 1,
            Err(e) => {
                failures += 1;
                eprintln!("write failed: {e}");
            }
        }
    }
    db.close().await;
    out!(
        "{writes} settings writes, {failures} failed, over {} keys",
        keys.len()
    );
    if failures > 0 {
        return Err(Failure::runtime(format!("{failures} settings writes failed")));
    }
    Ok(())
}

async fn export(workload: &str, out: &std::path::Path, eval: &std::path::Path) -> Result<(), Failure> {
    use crate::bench::eval as w;
    let load = match workload {
        "demo" => w::demo(),
        "seal" => w::seal(eval)?,
        "stb" => w::stb(eval)?,
        other => match other.strip_prefix("scale-").and_then(|n| n.parse().ok()) {
            Some(n) => w::scale(n),
            None => {
                return Err(Failure::config(format!(
                    "unknown workload {other:?}: use demo, seal, stb or scale-N"
                )));
            }
        },
    };
    let io = |e: std::io::Error| Failure::runtime(format!("cannot write to {}: {e}", out.display()));
    let manifests = out.join("manifests");
    std::fs::create_dir_all(&manifests).map_err(io)?;
    w::write_manifests(&load.registry, &manifests).map_err(io)?;
    w::write_messages(&load.messages, &out.join("messages.jsonl")).map_err(io)?;
    if !load.labelled.is_empty() {
        w::write_labelled(&load.labelled, &out.join("queries.jsonl")).map_err(io)?;
    }
    // The settings that activate every domain, in the database a daemon can be pointed at.
    let db = Db::connect(&format!("sqlite://{}", out.join("toolrouter.db").display())).await?;
    for (key, value) in load.settings.rows() {
        db.set_setting(key, value).await?;
    }
    db.close().await;
    out!(
        "wrote {} domains, {} tools and {} messages to {}",
        load.registry.domains().len(),
        load.registry.tool_count(),
        load.messages.len(),
        out.display()
    );
    Ok(())
}
