//! The command line: `serve`, the client subcommands against a running daemon (`route`,
//! `groups`, `load`, `tools`, `invalidate`), `check` (offline manifest validation) and
//! `settings` (edit the settings table like a settings UI would).
//!
//! Exit codes: 0 ok, 1 runtime failure, 2 bad configuration or manifests.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde_json::{Value, json};

use crate::client::{Client, Connection, DEFAULT_ADDR};
use crate::config::{Config, LogFormat};
use crate::db::Db;
use crate::error::Error;
use crate::matcher::MatchMode;
use crate::proto;
use crate::registry::Registry;
use crate::router::FallbackPolicy;
use crate::state::State;

/// toolrouter: decides which LLM tool definitions a chat backend sends on each turn.
#[derive(Debug, Parser)]
#[command(name = "toolrouter", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon.
    Serve(Box<ServeArgs>),
    /// Route a message: which domains and tools a turn gets, and why.
    Route {
        /// The user's message.
        message: String,
        /// Route within this conversation.
        #[arg(long)]
        conversation: Option<String>,
        /// Compute the answer but record nothing about the conversation.
        #[arg(long)]
        dry_run: bool,
        /// Connection and output options.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Search every tool of the registry by what it does (the `search_tools` meta-tool).
    Search {
        /// What to look for.
        query: String,
        /// How many hits (at most 20).
        #[arg(long, default_value_t = 5)]
        limit: u32,
        /// The conversation to load the top hits' groups into (with `--load`).
        #[arg(long)]
        conversation: Option<String>,
        /// Load the active groups of the top hits (at most 3) into the conversation.
        #[arg(long, requires = "conversation")]
        load: bool,
        /// Connection and output options.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Measure routing on labelled messages, in-process (no daemon needed).
    Eval(Box<EvalArgs>),
    /// Help for manifest authors.
    Keywords {
        /// What to do.
        #[command(subcommand)]
        command: KeywordsCommand,
    },
    /// List every domain, whether it is active, and the prompt section.
    Groups {
        /// Connection and output options.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Load a group's tools into a conversation.
    Load {
        /// The group's name.
        group: String,
        /// The conversation to load it into.
        #[arg(long)]
        conversation: String,
        /// Connection and output options.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List every tool of every domain, whatever the settings.
    Tools {
        /// Connection and output options.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Ask the daemon to re-read the settings table now.
    Invalidate {
        /// Connection and output options.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Forget one conversation's loaded groups and sticky hits.
    Reset {
        /// The conversation to forget.
        #[arg(long)]
        conversation: String,
        /// Connection and output options.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Ask the daemon to reload its manifests (as SIGHUP does); exits 2 when it refuses
    /// invalid manifests (the old registry keeps serving).
    Reload {
        /// Connection and output options.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Describe the running daemon: version, registry, database, settings age, uptime and
    /// its effective configuration (secrets left out).
    Describe {
        /// Connection and output options.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Check the daemon's gRPC health; exits 0 when it is SERVING.
    Health {
        /// Connection and output options.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Validate manifest folders offline; exits 2 on any error. Warnings (a tool without a
    /// tier, a description over 1,024 characters, a folder without manifests, a skipped
    /// file) are printed and do not fail.
    Check {
        /// Folders of `*.json` / `*.toml` manifests.
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// Print the summary, errors and warnings as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Benchmark tools: the gRPC load generator and the transport-floor server.
    Bench {
        /// Which tool.
        #[command(subcommand)]
        command: BenchCommand,
    },
    /// Edit the settings table, then ask a running daemon to invalidate (best effort).
    ///
    /// Without `--database`, the running daemon is asked which database it uses (else
    /// `sqlite://toolrouter.db`). A database other than the daemon's is refused without
    /// `--force`, and one that does not exist without `--create` (exit 2).
    Settings {
        /// What to do with the table.
        #[command(subcommand)]
        action: SettingsAction,
        /// The database to edit [default: the running daemon's, else sqlite://toolrouter.db].
        #[arg(long, global = true, env = "TOOLROUTER_DATABASE")]
        database: Option<String>,
        /// Write even though the daemon at `--addr` uses another database.
        #[arg(long, global = true)]
        force: bool,
        /// Create the database file when it does not exist.
        #[arg(long, global = true)]
        create: bool,
        /// Print `list` as JSON.
        #[arg(long, global = true)]
        json: bool,
        /// How long to wait for the daemon, e.g. `3s` [default: 3s].
        #[arg(long, global = true, env = "TOOLROUTER_TIMEOUT", value_parser = humantime::parse_duration)]
        timeout: Option<Duration>,
        /// The daemon to notify.
        #[arg(long, global = true, env = "TOOLROUTER_ADDR", default_value = DEFAULT_ADDR)]
        addr: String,
        /// Bearer token, when the daemon requires one.
        #[arg(long, global = true, env = "TOOLROUTER_AUTH_TOKEN", hide_env_values = true)]
        auth_token: Option<String>,
        /// CA certificate (PEM) to trust for an `https://` address.
        #[arg(long, global = true, env = "TOOLROUTER_TLS_CA")]
        tls_ca: Option<PathBuf>,
    },
}

/// Options shared by the client subcommands.
#[derive(Debug, Args)]
pub struct ClientArgs {
    /// How to reach the daemon.
    #[command(flatten)]
    pub conn: Connection,
    /// Print the response in protobuf's canonical JSON mapping (as grpcurl does: lowerCamelCase
    /// names, 64-bit integers as strings, enums by name, default values left out).
    #[arg(long)]
    pub json: bool,
}

/// `eval` options: the labelled messages, and the same manifest and routing options as
/// `serve` (every domain active unless `--database` is given).
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Labelled messages, JSONL: `{"query", "domains", "id"?, "split"?}` per line.
    #[arg(long)]
    pub queries: PathBuf,
    /// Print only the final JSON line.
    #[arg(long)]
    pub json: bool,
    /// Manifests, database and routing options, as for `serve`.
    #[command(flatten)]
    pub serve: Box<ServeArgs>,
}

/// `keywords` tools.
#[derive(Debug, Subcommand)]
pub enum KeywordsCommand {
    /// For each domain, the words that best separate its tools from the rest of the
    /// registry and that its keywords do not cover yet, best first.
    Suggest {
        /// Folders of `*.json` / `*.toml` manifests.
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// Suggestions per domain.
        #[arg(long, default_value_t = 10)]
        limit: usize,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

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

/// `settings` actions.
#[derive(Debug, Subcommand)]
pub enum SettingsAction {
    /// Set KEY to VALUE.
    Set {
        /// The settings key.
        key: String,
        /// Its value.
        value: String,
    },
    /// Remove KEY.
    Unset {
        /// The settings key.
        key: String,
    },
    /// Print every setting.
    List,
}

/// `serve` flags. Each is also `TOOLROUTER_<NAME>` in the environment and a key in the
/// `--config` file; flags win over the environment, which wins over the file.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// A TOML file with any of the keys below (snake_case).
    #[arg(long, env = "TOOLROUTER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on, `host:port` (a host name is resolved) [default: 127.0.0.1:50051].
    #[arg(long, env = "TOOLROUTER_LISTEN", value_parser = crate::config::parse_listen)]
    pub listen: Option<std::net::SocketAddr>,
    /// SQLite database URL [default: sqlite://toolrouter.db].
    #[arg(long, env = "TOOLROUTER_DATABASE")]
    pub database: Option<String>,
    /// Manifest folder (repeatable; in the environment, separated by `:`) [default: the
    /// built-in demo registry].
    #[arg(long, env = "TOOLROUTER_MANIFESTS", value_delimiter = ':')]
    pub manifests: Vec<PathBuf>,
    /// Settings cache TTL, e.g. `10s` [default: 10s].
    #[arg(long, env = "TOOLROUTER_SETTINGS_TTL", value_parser = humantime::parse_duration)]
    pub settings_ttl: Option<Duration>,
    /// What a turn with no keyword hit gets [default: all-active].
    #[arg(long, env = "TOOLROUTER_FALLBACK", value_enum)]
    pub fallback: Option<FallbackPolicy>,
    /// How keywords hit [default: word].
    #[arg(long, env = "TOOLROUTER_KEYWORD_MATCH", value_enum)]
    pub keyword_match: Option<MatchMode>,
    /// Start answers with the `load_tool_group` meta-tool [default: true].
    #[arg(long, env = "TOOLROUTER_EXPOSE_LOAD_TOOL_GROUP")]
    pub expose_load_tool_group: Option<bool>,
    /// Carry the `search_tools` meta-tool in answers [default: true].
    #[arg(long, env = "TOOLROUTER_EXPOSE_SEARCH_TOOLS")]
    pub expose_search_tools: Option<bool>,
    /// When the search index routes: `off` (keywords only), `fallback` (only when nothing
    /// else routed the message) or `augment` (always) [default: augment].
    #[arg(long, env = "TOOLROUTER_SEARCH")]
    pub search: Option<crate::search::SearchMode>,
    /// A domain is a search hit when it scores at least this share of its segment's best
    /// [default: 0.6].
    #[arg(long, env = "TOOLROUTER_SEARCH_MIN_RATIO")]
    pub search_min_ratio: Option<f32>,
    /// At most this many search hits per sentence or clause [default: 6].
    #[arg(long, env = "TOOLROUTER_SEARCH_PER_SEGMENT")]
    pub search_per_segment: Option<usize>,
    /// A sentence or clause counts only when its best score is at least this share of the
    /// message's best [default: 0.2].
    #[arg(long, env = "TOOLROUTER_SEARCH_SEGMENT_RATIO")]
    pub search_segment_ratio: Option<f32>,
    /// How long an idle conversation is remembered, e.g. `24h` [default: 24h].
    #[arg(long, env = "TOOLROUTER_CONVERSATION_TTL", value_parser = humantime::parse_duration)]
    pub conversation_ttl: Option<Duration>,
    /// Largest accepted message in bytes [default: 65536].
    #[arg(long, env = "TOOLROUTER_MAX_MESSAGE_BYTES")]
    pub max_message_bytes: Option<usize>,
    /// Log format [default: text].
    #[arg(long, env = "TOOLROUTER_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// How long a database statement waits for a lock, e.g. `5s` [default: 5s].
    #[arg(long, env = "TOOLROUTER_BUSY_TIMEOUT", value_parser = humantime::parse_duration)]
    pub busy_timeout: Option<Duration>,
    /// On SIGTERM, how long in-flight calls get to finish, e.g. `10s` [default: 10s].
    #[arg(long, env = "TOOLROUTER_DRAIN_TIMEOUT", value_parser = humantime::parse_duration)]
    pub drain_timeout: Option<Duration>,
    /// How long one call may take before `DEADLINE_EXCEEDED`, e.g. `10s` [default: 10s].
    #[arg(long, env = "TOOLROUTER_REQUEST_TIMEOUT", value_parser = humantime::parse_duration)]
    pub request_timeout: Option<Duration>,
    /// Calls served at once; more get `RESOURCE_EXHAUSTED` [default: 1024].
    #[arg(long, env = "TOOLROUTER_MAX_CONCURRENT_REQUESTS")]
    pub max_concurrent_requests: Option<usize>,
    /// Require `authorization: Bearer <TOKEN>` on every call except health.
    #[arg(long, env = "TOOLROUTER_AUTH_TOKEN", hide_env_values = true)]
    pub auth_token: Option<String>,
    /// Allow a non-loopback `--listen` address without `--auth-token`.
    #[arg(long, env = "TOOLROUTER_ALLOW_UNAUTHENTICATED")]
    pub allow_unauthenticated: bool,
    /// PEM certificate chain: serve TLS (with `--tls-key`).
    #[arg(long, env = "TOOLROUTER_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for `--tls-cert`.
    #[arg(long, env = "TOOLROUTER_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Serve Prometheus metrics at `http://ADDR/metrics` (`host:port`) [default: off].
    #[arg(long, env = "TOOLROUTER_METRICS_LISTEN", value_parser = crate::config::parse_listen)]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Memory for the conversation cache in bytes; less-used conversations beyond it are
    /// re-read from the database [default: 67108864 (64 MiB)].
    #[arg(long, env = "TOOLROUTER_CONVERSATION_CACHE_BYTES")]
    pub conversation_cache_bytes: Option<u64>,
    /// Connections the kernel queues before the daemon accepts them [default: 1024].
    #[arg(long, env = "TOOLROUTER_LISTEN_BACKLOG")]
    pub listen_backlog: Option<u32>,
    /// How long a new connection may send nothing before it is closed, e.g. `10s`
    /// [default: 10s].
    #[arg(long, env = "TOOLROUTER_HANDSHAKE_TIMEOUT", value_parser = humantime::parse_duration)]
    pub handshake_timeout: Option<Duration>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
}

impl ServeArgs {
    /// The effective configuration: defaults < config file < environment < flags.
    ///
    /// # Errors
    /// An unreadable or invalid config file, or a configuration `Config::validate` refuses.
    pub fn config(&self) -> crate::Result<Config> {
        let mut c = Config::load(self.config.as_deref())?;
        macro_rules! overlay {
            ($($field:ident),*) => { $( if let Some(v) = self.$field.clone() { c.$field = v; } )* };
        }
        // Optional settings: a flag given replaces the file's value, an absent one keeps it.
        macro_rules! overlay_some {
            ($($field:ident),*) => { $( if self.$field.is_some() { c.$field = self.$field.clone(); } )* };
        }
        overlay!(
            listen,
            database,
            settings_ttl,
            fallback,
            keyword_match,
            expose_load_tool_group,
            expose_search_tools,
            search,
            search_min_ratio,
            search_per_segment,
            search_segment_ratio,
            conversation_ttl,
            max_message_bytes,
            log_format,
            busy_timeout,
            drain_timeout,
            request_timeout,
            max_concurrent_requests,
            conversation_cache_bytes,
            listen_backlog,
            handshake_timeout
        );
        if !self.manifests.is_empty() {
            c.manifests = self.manifests.clone();
        }
        overlay_some!(auth_token, tls_cert, tls_key, metrics_listen);
        c.allow_unauthenticated |= self.allow_unauthenticated;
        c.validate()?;
        Ok(c)
    }
}

/// Writes a line to stdout, ignoring a closed pipe (`toolrouter tools | head`).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// A failure with the exit code it maps to.
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn runtime(message: impl Into<String>) -> Self {
        Failure {
            code: 1,
            message: message.into(),
        }
    }
    fn config(message: impl Into<String>) -> Self {
        Failure {
            code: 2,
            message: message.into(),
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        match e {
            Error::Manifests(_) | Error::Config(_) => Failure::config(e.to_string()),
            other => Failure::runtime(other.to_string()),
        }
    }
}

impl From<tonic::Status> for Failure {
    fn from(s: tonic::Status) -> Self {
        Failure::runtime(format!("{:?}: {}", s.code(), s.message()))
    }
}

/// `health`'s timeout unless `--timeout` says: a probe answers at once or not at all.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(1);
/// How long `settings` waits for the daemon (to ask its database, then to invalidate).
const SETTINGS_NOTIFY_TIMEOUT: Duration = Duration::from_secs(3);

/// Awaits one call within the connection's timeout. tonic's own deadline answers
/// `CANCELLED`/`DEADLINE_EXCEEDED`; the outer timeout is the guarantee that a daemon that
/// accepts and never answers cannot hang the command. Both read the same.
async fn call<T>(
    conn: &Connection,
    fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, Failure> {
    let timeout = conn.timeout();
    let late = || {
        Failure::runtime(format!(
            "no answer from {} within {}",
            conn.addr,
            humantime::format_duration(timeout)
        ))
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s))
            if s.code() == tonic::Code::DeadlineExceeded
                || (s.code() == tonic::Code::Cancelled && s.message().contains("Timeout expired")) =>
        {
            Err(late())
        }
        Ok(Err(s)) => Err(s.into()),
        Err(_) => Err(late()),
    }
}

/// Prints a response in protobuf's canonical JSON mapping (serde impls generated by pbjson).
fn print_proto<T: serde::Serialize>(message: &T) {
    // The generated impls serialise every message (no maps with non-string keys).
    out!("{}", serde_json::to_string_pretty(message).unwrap_or_default());
}

/// Runs the parsed command line and returns the process exit code.
pub async fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Serve(args) => serve(&args).await,
        Command::Route {
            message,
            conversation,
            dry_run,
            client,
        } => route(&client, message, conversation, dry_run).await,
        Command::Search {
            query,
            limit,
            conversation,
            load,
            client,
        } => search(&client, query, limit, conversation, load).await,
        Command::Eval(args) => eval(&args),
        Command::Keywords { command } => match command {
            KeywordsCommand::Suggest { dirs, limit, json } => suggest_keywords(&dirs, limit, json),
        },
        Command::Groups { client } => groups(&client).await,
        Command::Load {
            group,
            conversation,
            client,
        } => load(&client, group, conversation).await,
        Command::Tools { client } => tools(&client).await,
        Command::Invalidate { client } => invalidate(&client).await,
        Command::Reset { conversation, client } => reset(&client, conversation).await,
        Command::Reload { client } => reload(&client).await,
        Command::Describe { client } => describe(&client).await,
        Command::Health { mut client } => {
            // A health probe answers at once or not at all.
            client.conn.timeout.get_or_insert(HEALTH_TIMEOUT);
            health(&client).await
        }
        Command::Check { dirs, json } => check(&dirs, json),
        Command::Settings {
            action,
            database,
            force,
            create,
            json,
            timeout,
            addr,
            auth_token,
            tls_ca,
        } => {
            let conn = Connection {
                addr,
                auth_token,
                tls_ca,
                timeout: Some(timeout.unwrap_or(SETTINGS_NOTIFY_TIMEOUT)),
            };
            let opts = SettingsOptions {
                database,
                force,
                create,
                json,
            };
            settings(action, &opts, &conn).await
        }
        Command::Bench { command } => bench(command).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal as _;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour codes only where a person reads them, never into a file or a pipe.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    // `try_init` fails only when a subscriber is already set (tests); keeping it is fine.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .event_format(crate::telemetry::JsonLogFormat(
                tracing_subscriber::fmt::format().json(),
            ))
            .try_init(),
    };
}

async fn serve(args: &ServeArgs) -> Result<(), Failure> {
    let config = args.config()?;
    if args.print_config {
        out!("{}", config.to_toml());
        return Ok(());
    }
    init_tracing(config.log_format);
    let registry = Registry::load(&config.manifests)?;
    tracing::info!(
        listen = %config.listen,
        database = %config.database,
        manifests = ?config.manifests,
        settings_ttl = ?config.settings_ttl,
        fallback = ?config.fallback,
        keyword_match = ?config.keyword_match,
        expose_load_tool_group = config.expose_load_tool_group,
        conversation_ttl = ?config.conversation_ttl,
        max_message_bytes = config.max_message_bytes,
        domains = registry.domains().len(),
        tools = registry.tool_count(),
        registry_version = %format!("{:016x}", registry.version()),
        "starting"
    );
    #[cfg(unix)]
    match crate::server::raise_open_files_limit() {
        Ok(limit) => tracing::info!(limit, "open-files limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-files limit"),
    }
    let listener = crate::server::bind(config.listen, config.listen_backlog)
        .map_err(|e| Failure::runtime(format!("cannot listen on {}: {e}", config.listen)))?;
    let state = State::new(registry, &config).await?;
    #[cfg(unix)]
    tokio::spawn(reload_on_sighup(state.clone()));
    crate::server::serve(listener, state, &config, shutdown_signal())
        .await
        .map_err(|e| Failure::runtime(format!("server failed: {e}")))
}

/// Reloads the registry on each SIGHUP; a failed reload is logged and the old one serves on.
#[cfg(unix)]
async fn reload_on_sighup(state: State) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGHUP; reload with the ReloadRegistry call");
            return;
        }
    };
    while hup.recv().await.is_some() {
        tracing::info!("SIGHUP: reloading the registry");
        if let Err(e) = state.reload().await {
            tracing::error!(error = %e, "registry reload failed; the previous registry serves on");
        }
    }
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
    tracing::info!("shutdown requested; finishing in-flight calls");
}

async fn connect(client: &ClientArgs) -> Result<Client, Failure> {
    Ok(client.conn.client().await?)
}

async fn health(client: &ClientArgs) -> Result<(), Failure> {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let mut c = HealthClient::new(client.conn.channel().await?);
    let r = call(
        &client.conn,
        c.check(HealthCheckRequest {
            service: String::new(),
        }),
    )
    .await?;
    let status = r.status().as_str_name();
    if client.json {
        // HealthCheckResponse's canonical JSON mapping: its one enum field, by name.
        out!("{}", json!({ "status": status }));
    } else {
        out!("{status}");
    }
    if r.status() == tonic_health::pb::health_check_response::ServingStatus::Serving {
        Ok(())
    } else {
        Err(Failure::runtime(format!(
            "the daemon at {} is {status}",
            client.conn.addr
        )))
    }
}

fn print_json(v: &Value) {
    // A `Value` always serialises.
    out!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// Prints rows under headers, each column as wide as its widest cell.
fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out!("{}", padded.join("  ").trim_end());
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

fn reason_name(r: i32) -> &'static str {
    match proto::Reason::try_from(r).unwrap_or(proto::Reason::Unspecified) {
        proto::Reason::Core => "core",
        proto::Reason::Keyword => "keyword",
        proto::Reason::Search => "search",
        proto::Reason::Sticky => "sticky",
        proto::Reason::Loaded => "loaded",
        proto::Reason::Fallback => "fallback",
        proto::Reason::Unspecified => "unspecified",
    }
}

async fn route(
    client: &ClientArgs,
    message: String,
    conversation: Option<String>,
    dry_run: bool,
) -> Result<(), Failure> {
    let mut c = connect(client).await?;
    let r = call(
        &client.conn,
        c.route(proto::RouteRequest {
            message,
            conversation_id: conversation.unwrap_or_default(),
            dry_run,
        }),
    )
    .await?;
    if client.json {
        print_proto(&r);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = r
        .domains
        .iter()
        .map(|d| {
            let n = r.tools.iter().filter(|t| t.domain == d.domain).count();
            let matched = if d.matched_terms.is_empty() {
                d.matched_keywords.join(", ")
            } else {
                format!("{} (score {:.2})", d.matched_terms.join(", "), d.score)
            };
            vec![
                d.domain.clone(),
                reason_name(d.reason).to_string(),
                matched,
                n.to_string(),
            ]
        })
        .collect();
    print_table(&["DOMAIN", "REASON", "MATCHED", "TOOLS"], &rows);
    let meta: Vec<&str> = r
        .tools
        .iter()
        .take_while(|t| t.domain.is_empty())
        .map(|t| t.name.as_str())
        .collect();
    out!(
        "\n{} tools{}; fallback: {}; registry version {:016x}",
        r.tools.len(),
        if meta.is_empty() {
            String::new()
        } else {
            format!(" (including {})", meta.join(" and "))
        },
        if r.fallback { "yes" } else { "no" },
        r.registry_version
    );
    Ok(())
}

async fn groups(client: &ClientArgs) -> Result<(), Failure> {
    let mut c = connect(client).await?;
    let r = call(&client.conn, c.list_groups(proto::ListGroupsRequest {})).await?;
    if client.json {
        print_proto(&r);
        return Ok(());
    }
    let yes = |b: bool| if b { "yes" } else { "no" }.to_string();
    let rows: Vec<Vec<String>> = r
        .groups
        .iter()
        .map(|g| {
            vec![
                g.name.clone(),
                yes(g.active),
                yes(g.core),
                g.tool_count.to_string(),
                if g.settings_keys.is_empty() {
                    "-".into()
                } else {
                    g.settings_keys.join(", ")
                },
            ]
        })
        .collect();
    print_table(&["GROUP", "ACTIVE", "CORE", "TOOLS", "SETTINGS KEYS"], &rows);
    Ok(())
}

async fn load(client: &ClientArgs, group: String, conversation: String) -> Result<(), Failure> {
    let mut c = connect(client).await?;
    let r = call(
        &client.conn,
        c.load_tool_group(proto::LoadToolGroupRequest {
            conversation_id: conversation,
            group_name: group,
        }),
    )
    .await?;
    if client.json {
        print_proto(&r);
    } else {
        out!("{}", r.text);
        if r.already_loaded {
            out!("\n(already loaded in this conversation)");
        }
    }
    Ok(())
}

async fn tools(client: &ClientArgs) -> Result<(), Failure> {
    let mut c = connect(client).await?;
    let r = call(&client.conn, c.list_all_tools(proto::ListAllToolsRequest {})).await?;
    if client.json {
        print_proto(&r);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = r
        .tools
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                t.domain.clone(),
                t.tier.clone(),
                t.description.clone(),
            ]
        })
        .collect();
    print_table(&["TOOL", "DOMAIN", "TIER", "DESCRIPTION"], &rows);
    Ok(())
}

async fn invalidate(client: &ClientArgs) -> Result<(), Failure> {
    let mut c = connect(client).await?;
    let r = call(
        &client.conn,
        c.invalidate_settings(proto::InvalidateSettingsRequest {}),
    )
    .await?;
    if client.json {
        print_proto(&r);
    } else {
        out!(
            "settings re-read; active domains: {}",
            r.active_domains.join(", ")
        );
    }
    Ok(())
}

async fn describe(client: &ClientArgs) -> Result<(), Failure> {
    let mut c = connect(client).await?;
    let r = call(&client.conn, c.describe_server(proto::DescribeServerRequest {})).await?;
    if client.json {
        print_proto(&r);
        return Ok(());
    }
    out!("version:           {}", r.version);
    out!(
        "registry:          {:016x} ({} domains, {} tools)",
        r.registry_version,
        r.domains,
        r.tools
    );
    out!("database:          {}", r.database);
    if !r.database_path.is_empty() {
        out!("database file:     {}", r.database_path);
    }
    out!("settings age:      {:.1} s", r.settings_age_seconds);
    out!("uptime:            {:.1} s", r.uptime_seconds);
    out!("configuration:\n{}", r.config_toml);
    Ok(())
}

async fn reset(client: &ClientArgs, conversation: String) -> Result<(), Failure> {
    let mut c = connect(client).await?;
    let r = call(
        &client.conn,
        c.reset_conversation(proto::ResetConversationRequest {
            conversation_id: conversation.clone(),
        }),
    )
    .await?;
    if client.json {
        print_proto(&r);
    } else {
        out!("conversation {conversation:?} forgotten");
    }
    Ok(())
}

async fn reload(client: &ClientArgs) -> Result<(), Failure> {
    let mut c = connect(client).await?;
    let r = match call(&client.conn, c.reload_registry(proto::ReloadRegistryRequest {})).await {
        Ok(r) => r,
        // The daemon refused the manifests (and serves on with the old ones): a manifest
        // problem, exit 2 as `check` would.
        Err(f) if f.message.starts_with("FailedPrecondition") => {
            return Err(Failure::config(f.message));
        }
        Err(f) => return Err(f),
    };
    if client.json {
        print_proto(&r);
    } else {
        out!(
            "registry reloaded: {} domains, {} tools, version {:016x}",
            r.domains,
            r.tools,
            r.registry_version
        );
    }
    Ok(())
}

async fn search(
    client: &ClientArgs,
    query: String,
    limit: u32,
    conversation: Option<String>,
    load: bool,
) -> Result<(), Failure> {
    let mut c = connect(client).await?;
    let r = call(
        &client.conn,
        c.search_tools(proto::SearchToolsRequest {
            query,
            limit,
            conversation_id: conversation.unwrap_or_default(),
            load,
        }),
    )
    .await?;
    if client.json {
        print_proto(&r);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = r
        .hits
        .iter()
        .map(|h| {
            let t = h.tool.clone().unwrap_or_default();
            vec![
                t.name,
                t.domain,
                format!("{:.2}", h.score),
                h.matched_terms.join(", "),
                if h.active {
                    "yes".into()
                } else {
                    format!("no (set one of {})", h.missing_settings_keys.join(", "))
                },
            ]
        })
        .collect();
    print_table(&["TOOL", "DOMAIN", "SCORE", "MATCHED", "ACTIVE"], &rows);
    if !r.loaded_groups.is_empty() {
        out!("\nloaded: {}", r.loaded_groups.join(", "));
    }
    Ok(())
}

fn eval(args: &EvalArgs) -> Result<(), Failure> {
    use crate::eval::Figures;
    let config = args.serve.config()?;
    let labelled = crate::eval::read_labelled(&args.queries)?;
    let registry = Registry::load(&config.manifests)?;
    let matcher = crate::matcher::Matcher::new(registry.keywords(), config.keyword_match)?;
    let started = std::time::Instant::now();
    let index = crate::search::SearchIndex::new(&registry);
    let index_ms = started.elapsed().as_secs_f64() * 1e3;
    // Every domain active, unless a settings table is named.
    let snapshot = match &args.serve.database {
        None => crate::settings::Snapshot::every_key_set(&registry),
        Some(url) => {
            let runtime = tokio::runtime::Handle::current();
            let rows = tokio::task::block_in_place(|| {
                runtime.block_on(async {
                    let db = Db::connect(url).await?;
                    let rows = db.read_settings().await;
                    db.close().await;
                    rows
                })
            })?;
            crate::settings::Snapshot::new(rows)
        }
    };
    let activation = crate::router::Activation::new(&registry, &snapshot);
    let inputs = crate::router::Inputs {
        registry: &registry,
        matcher: &matcher,
        index: &index,
    };
    let report = crate::eval::evaluate(inputs, &activation, &config.routing(), &labelled);
    if !report.unknown_domains.is_empty() {
        eprintln!(
            "warning: {} labelled domains are not in the registry (counted as misses): {}",
            report.unknown_domains.len(),
            report.unknown_domains.join(", ")
        );
    }
    if !args.json {
        let row = |name: &str, f: &Figures| {
            vec![
                name.to_string(),
                f.queries.to_string(),
                format!("{:.3}", f.strict_recall),
                format!("{:.3}", f.soft_recall),
                format!("{:.1}", f.tools_sent),
                format!("{:.1} %", f.registry_share * 100.0),
                format!("{:.1}", f.oracle_tools),
                format!("{:.2}x", f.cost_ratio),
                format!("{:.1} %", f.fallback_rate * 100.0),
                format!("{:.1}", f.us_median),
            ]
        };
        let mut rows: Vec<Vec<String>> = report.splits.iter().map(|(n, f)| row(n, f)).collect();
        rows.push(row("overall", &report.overall));
        print_table(
            &[
                "SPLIT", "QUERIES", "STRICT", "SOFT", "TOOLS", "SHARE", "ORACLE", "COST", "FALLBACK",
                "US/QUERY",
            ],
            &rows,
        );
        let reasons: Vec<String> = report
            .overall
            .reasons
            .iter()
            .map(|(r, n)| format!("{r} {n}"))
            .collect();
        out!(
            "\n{} domains, {} tools; index built in {index_ms:.0} ms; domains by reason: {}",
            registry.domains().len(),
            report.registry_tools,
            reasons.join(", ")
        );
    }
    let line = serde_json::to_string(&report).map_err(|e| Failure::runtime(e.to_string()))?;
    out!("{line}");
    Ok(())
}

fn suggest_keywords(dirs: &[PathBuf], limit: usize, json: bool) -> Result<(), Failure> {
    let registry = Registry::load_dirs(dirs)?;
    let index = crate::search::SearchIndex::new(&registry);
    let suggestions = index.suggest_keywords(&registry, limit);
    if json {
        let domains: Vec<Value> = registry
            .domains()
            .iter()
            .zip(&suggestions)
            .map(|(d, s)| {
                json!({
                    "domain": d.name,
                    "suggestions": s.iter().map(|(w, score)| json!({"term": w, "score": score})).collect::<Vec<_>>(),
                })
            })
            .collect();
        print_json(&json!({ "domains": domains }));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = registry
        .domains()
        .iter()
        .zip(&suggestions)
        .map(|(d, s)| {
            let words: Vec<&str> = s.iter().map(|(w, _)| w.as_str()).collect();
            vec![d.name.clone(), words.join(", ")]
        })
        .collect();
    print_table(&["DOMAIN", "SUGGESTED KEYWORDS"], &rows);
    Ok(())
}

fn check(dirs: &[PathBuf], as_json: bool) -> Result<(), Failure> {
    let (registry, warnings) = Registry::check_dirs(dirs);
    // One JSON shape for problems of both kinds; lowerCamelCase like the RPCs' JSON.
    let problem = |e: &crate::error::ManifestError| {
        let mut v = json!({ "path": e.path, "message": e.message });
        if let Some((line, column)) = e.position {
            v["line"] = json!(line);
            v["column"] = json!(column);
        }
        v
    };
    let warnings_json: Vec<Value> = warnings.iter().map(problem).collect();
    if !as_json {
        for w in &warnings {
            eprintln!("warning: {w}");
        }
    }
    let registry = match registry {
        Ok(r) => r,
        Err(Error::Manifests(errors)) if as_json => {
            print_json(&json!({
                "ok": false,
                "errors": errors.0.iter().map(problem).collect::<Vec<_>>(),
                "warnings": warnings_json,
            }));
            return Err(Failure::config(format!(
                "{} manifest problem(s); see the JSON above",
                errors.0.len()
            )));
        }
        Err(e) => return Err(e.into()),
    };
    let keywords = registry.keywords().count();
    // About four characters per token, over what a provider is sent for each tool.
    let chars: usize = registry
        .domains()
        .iter()
        .flat_map(|d| &d.tools)
        .map(|t| t.name.len() + t.description.len() + t.input_schema_json.len())
        .sum();
    if as_json {
        print_json(&json!({
            "ok": true,
            "domains": registry.domains().len(),
            "tools": registry.tool_count(),
            "keywords": keywords,
            "schemaTokens": chars / 4,
            // 64-bit, so a string as in the RPCs' JSON.
            "registryVersion": registry.version().to_string(),
            "errors": [],
            "warnings": warnings_json,
        }));
        return Ok(());
    }
    out!(
        "ok: {} domains, {} tools, {} keywords, ~{} schema tokens",
        registry.domains().len(),
        registry.tool_count(),
        keywords,
        chars / 4
    );
    Ok(())
}

/// `settings` options besides the action.
struct SettingsOptions {
    /// `--database`, when given (flag or environment).
    database: Option<String>,
    force: bool,
    create: bool,
    json: bool,
}

/// The database `settings` used when neither `--database` nor a running daemon names one.
const DEFAULT_DATABASE: &str = "sqlite://toolrouter.db";

async fn settings(action: SettingsAction, opts: &SettingsOptions, conn: &Connection) -> Result<(), Failure> {
    let addr = &conn.addr;
    let writes = !matches!(action, SettingsAction::List);
    // Which database the daemon at --addr uses, when one answers.
    let daemon = match conn.client().await {
        Ok(mut c) => call(conn, c.describe_server(proto::DescribeServerRequest {}))
            .await
            .ok(),
        Err(_) => None,
    };
    let database = match (&opts.database, &daemon) {
        (Some(db), _) => db.clone(),
        // The daemon's own database: its URL, by the absolute path it reported.
        (None, Some(d)) if !d.database_path.is_empty() => format!("sqlite://{}", d.database_path),
        (None, _) => DEFAULT_DATABASE.to_string(),
    };
    let file = crate::db::database_file(&database)?;
    if let (Some(d), Some(file)) = (&daemon, &file)
        && !d.database_path.is_empty()
        && std::path::Path::new(&d.database_path) != file.as_path()
    {
        let message = format!(
            "the daemon at {addr} uses {}, not {}: pass --database {:?} to edit its settings{}",
            d.database_path,
            file.display(),
            format!("sqlite://{}", d.database_path),
            if writes {
                ", or --force to write the other database anyway"
            } else {
                ""
            }
        );
        if writes && !opts.force {
            return Err(Failure::config(message));
        }
        eprintln!("note: {message}");
    }
    if let Some(file) = &file
        && !file.exists()
        && !opts.create
    {
        return Err(Failure::config(format!(
            "the database {} does not exist; pass --create to create it (or --database to name the daemon's)",
            file.display()
        )));
    }
    let db = Db::connect(&database).await?;
    match action {
        SettingsAction::Set { key, value } => {
            db.set_setting(&key, &value).await?;
            out!("set {key}");
        }
        SettingsAction::Unset { key } => {
            let existed = db.unset_setting(&key).await?;
            out!("{} {key}", if existed { "unset" } else { "was not set:" });
        }
        SettingsAction::List => {
            let mut rows = db.read_settings().await?;
            rows.sort();
            db.close().await;
            if opts.json {
                let map: serde_json::Map<String, Value> =
                    rows.into_iter().map(|(k, v)| (k, Value::String(v))).collect();
                print_json(&json!({ "settings": map }));
            } else {
                let rows: Vec<Vec<String>> = rows.into_iter().map(|(k, v)| vec![k, v]).collect();
                print_table(&["KEY", "VALUE"], &rows);
            }
            return Ok(());
        }
    }
    db.close().await;
    // Best effort: the change is in the table either way and shows within one TTL.
    let notified = match conn.client().await {
        Ok(mut c) => call(conn, c.invalidate_settings(proto::InvalidateSettingsRequest {})).await,
        Err(e) => Err(e.into()),
    };
    match notified {
        Ok(r) => out!(
            "daemon at {addr} re-read settings; active domains: {}",
            r.active_domains.join(", ")
        ),
        Err(f) => out!(
            "note: {} (the daemon will see the change within its settings TTL)",
            f.message
        ),
    }
    Ok(())
}

fn bench_messages(path: Option<&std::path::Path>) -> Result<Vec<String>, Failure> {
    match path {
        Some(p) => Ok(crate::bench::grpc::read_messages(p)?),
        None => Ok(crate::bench::eval::demo().messages),
    }
}

async fn bench(command: BenchCommand) -> Result<(), Failure> {
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
    let real = crate::service::ToolRouterService::new(
        state.clone(),
        crate::service::Limits {
            max_message_bytes: usize::MAX,
        },
    );
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
