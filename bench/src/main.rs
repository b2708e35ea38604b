//! The `toolrouter-bench` binary: exports workloads, serves the transport floor and flips
//! settings for the soak. Exit codes as the daemon's: 0 ok, 1 runtime failure, 2 bad
//! configuration or manifests.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use toolrouter::Error;
use toolrouter::cli::serve::{LogFormatArg, init_tracing};
use toolrouter::config::{Config, parse_listen};
use toolrouter_bench::{baseline, export, flip, watch, workload};

/// toolrouter-bench: benchmark and evaluation tooling for toolrouter.
#[derive(Debug, Parser)]
#[command(name = "toolrouter-bench", version, about)]
struct Cli {
    /// What to do.
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
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
        /// Write the settings to this database instead of `toolrouter.db` in `--out` (e.g. a
        /// PostgreSQL database several replicas share).
        #[arg(long)]
        database: Option<String>,
    },
    /// Serve `Route` with the daemon's answers prebuilt, without routing: the transport floor.
    BaselineServer {
        /// Address to listen on, `host:port` [default: 127.0.0.1:50051].
        #[arg(long, value_parser = parse_listen)]
        listen: Option<SocketAddr>,
        /// The daemon's SQLite database, whose settings decide the prebuilt answers.
        #[arg(long, env = "TOOLROUTER_DATABASE", default_value = "sqlite://toolrouter.db")]
        database: String,
        /// The daemon's manifest folders [default: the demo registry].
        #[arg(long, value_delimiter = ':')]
        manifests: Vec<PathBuf>,
        /// The messages the load generator will send; their answers are prebuilt [default:
        /// the demo workload's messages].
        #[arg(long)]
        messages: Option<PathBuf>,
        /// Log format.
        #[arg(long, value_enum, default_value = "text")]
        log_format: LogFormatArg,
        /// As the daemon's `--search`, so the prebuilt answers are the daemon's [default:
        /// augment].
        #[arg(long)]
        search: Option<toolrouter::search::SearchMode>,
        /// As the daemon's `--max-tools` [default: 128; 0: no limit].
        #[arg(long)]
        max_tools: Option<u32>,
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
    /// Hold `WatchRegistry` streams open on a daemon until it stops, reading slowly; prints
    /// the events read. Exits 1 if a stream failed or ended before its first event.
    Watch {
        /// The daemon, e.g. `http://127.0.0.1:50051`.
        #[arg(long)]
        addr: String,
        /// Streams to hold open.
        #[arg(long, default_value_t = 4)]
        streams: usize,
        /// Time between reads of one stream, e.g. `50ms`.
        #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration)]
        pause: Duration,
    },
}

async fn run(command: Command) -> toolrouter::Result<()> {
    match command {
        Command::Export {
            workload,
            out,
            eval,
            database,
        } => {
            let load = workload::by_name(&workload, &eval)?;
            export::export(&load, &out, database.as_deref()).await?;
            println!(
                "wrote {} domains, {} tools and {} messages to {}",
                load.registry.domains().len(),
                load.registry.tool_count(),
                load.messages.len(),
                out.display()
            );
            Ok(())
        }
        Command::BaselineServer {
            listen,
            database,
            manifests,
            messages,
            log_format,
            search,
            max_tools,
        } => {
            let defaults = Config::default();
            let config = Config {
                listen: listen.unwrap_or(defaults.listen),
                database,
                manifests,
                log_format: log_format.into(),
                search: search.unwrap_or(defaults.search),
                max_tools: max_tools.unwrap_or(defaults.max_tools),
                ..defaults
            };
            config.validate()?;
            init_tracing(config.log_format);
            let messages = match messages {
                Some(path) => toolrouter::cli::bench::read_messages(&path)?,
                None => workload::demo().messages,
            };
            baseline::serve(&config, messages).await
        }
        Command::FlipSettings {
            database,
            manifests,
            duration,
            every,
        } => {
            let flips = flip::flip_settings(&database, &manifests, duration, every).await?;
            println!(
                "{} settings writes, {} failed, over {} keys",
                flips.writes, flips.failures, flips.keys
            );
            if flips.failures > 0 {
                return Err(Error::Unavailable(format!(
                    "{} settings writes failed",
                    flips.failures
                )));
            }
            Ok(())
        }
        Command::Watch { addr, streams, pause } => {
            let w = watch::watch(&addr, streams, pause).await?;
            println!(
                "{} watch streams read {} events (at least {} each) until the daemon stopped",
                w.streams, w.events, w.fewest
            );
            Ok(())
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Cli::parse().command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(match e {
                Error::Config(_) | Error::Manifests(_) => 2,
                _ => 1,
            })
        }
    }
}
