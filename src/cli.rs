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
        /// Connection and output options.
        #[command(flatten)]
        client: ClientArgs,
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
    /// Ask the daemon to reload its manifests (as SIGHUP does).
    Reload {
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
    /// Validate manifest folders offline; exits 2 on any error.
    Check {
        /// Folders of `*.json` / `*.toml` manifests.
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
    },
    /// Benchmark tools: the gRPC load generator and the transport-floor server.
    Bench {
        /// Which tool.
        #[command(subcommand)]
        command: BenchCommand,
    },
    /// Edit the settings table, then ask a running daemon to invalidate (best effort).
    Settings {
        /// What to do with the table.
        #[command(subcommand)]
        action: SettingsAction,
        /// The database the daemon uses.
        #[arg(
            long,
            global = true,
            env = "TOOLROUTER_DATABASE",
            default_value = "sqlite://toolrouter.db"
        )]
        database: String,
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
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
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
        /// Folder to write `manifests/`, `messages.jsonl` and `toolrouter.db` into.
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
    /// Address to listen on [default: 127.0.0.1:50051].
    #[arg(long, env = "TOOLROUTER_LISTEN")]
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
        overlay_some!(auth_token, tls_cert, tls_key);
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

/// Runs the parsed command line and returns the process exit code.
pub async fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Serve(args) => serve(&args).await,
        Command::Route {
            message,
            conversation,
            client,
        } => route(&client, message, conversation).await,
        Command::Groups { client } => groups(&client).await,
        Command::Load {
            group,
            conversation,
            client,
        } => load(&client, group, conversation).await,
        Command::Tools { client } => tools(&client).await,
        Command::Invalidate { client } => invalidate(&client).await,
        Command::Reload { client } => reload(&client).await,
        Command::Health { client } => health(&client).await,
        Command::Check { dirs } => check(&dirs),
        Command::Settings {
            action,
            database,
            addr,
            auth_token,
            tls_ca,
        } => {
            let conn = Connection {
                addr,
                auth_token,
                tls_ca,
            };
            settings(action, &database, &conn).await
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
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // `try_init` fails only when a subscriber is already set (tests); keeping it is fine.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
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
    let r = c
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await?
        .into_inner();
    let status = r.status().as_str_name();
    if client.json {
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
        proto::Reason::Sticky => "sticky",
        proto::Reason::Loaded => "loaded",
        proto::Reason::Fallback => "fallback",
        proto::Reason::Unspecified => "unspecified",
    }
}

fn tool_json(t: &proto::Tool) -> Value {
    json!({
        "name": t.name,
        "description": t.description,
        "input_schema": serde_json::from_str::<Value>(&t.input_schema_json).unwrap_or(Value::Null),
        "domain": t.domain,
        "tier": t.tier,
    })
}

fn group_json(g: &proto::Group) -> Value {
    json!({
        "name": g.name,
        "display_name": g.display_name,
        "description": g.description,
        "tool_count": g.tool_count,
        "core": g.core,
        "active": g.active,
        "settings_keys": g.settings_keys,
        "keywords": g.keywords,
    })
}

async fn route(client: &ClientArgs, message: String, conversation: Option<String>) -> Result<(), Failure> {
    let mut c = connect(client).await?;
    let r = c
        .route(proto::RouteRequest {
            message,
            conversation_id: conversation.unwrap_or_default(),
        })
        .await?
        .into_inner();
    if client.json {
        print_json(&json!({
            "tools": r.tools.iter().map(tool_json).collect::<Vec<_>>(),
            "domains": r.domains.iter().map(|d| json!({
                "domain": d.domain,
                "reason": reason_name(d.reason),
                "matched_keywords": d.matched_keywords,
            })).collect::<Vec<_>>(),
            "fallback": r.fallback,
            "registry_version": r.registry_version,
        }));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = r
        .domains
        .iter()
        .map(|d| {
            let n = r.tools.iter().filter(|t| t.domain == d.domain).count();
            vec![
                d.domain.clone(),
                reason_name(d.reason).to_string(),
                d.matched_keywords.join(", "),
                n.to_string(),
            ]
        })
        .collect();
    print_table(&["DOMAIN", "REASON", "KEYWORDS", "TOOLS"], &rows);
    let meta = r.tools.first().is_some_and(|t| t.domain.is_empty());
    out!(
        "\n{} tools{}; fallback: {}; registry version {:016x}",
        r.tools.len(),
        if meta { " (including load_tool_group)" } else { "" },
        if r.fallback { "yes" } else { "no" },
        r.registry_version
    );
    Ok(())
}

async fn groups(client: &ClientArgs) -> Result<(), Failure> {
    let mut c = connect(client).await?;
    let r = c.list_groups(proto::ListGroupsRequest {}).await?.into_inner();
    if client.json {
        print_json(&json!({
            "groups": r.groups.iter().map(group_json).collect::<Vec<_>>(),
            "prompt_section": r.prompt_section,
            "registry_version": r.registry_version,
        }));
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
    let r = c
        .load_tool_group(proto::LoadToolGroupRequest {
            conversation_id: conversation,
            group_name: group,
        })
        .await?
        .into_inner();
    if client.json {
        print_json(&json!({
            "group": r.group.as_ref().map(group_json),
            "tools": r.tools.iter().map(tool_json).collect::<Vec<_>>(),
            "already_loaded": r.already_loaded,
            "text": r.text,
        }));
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
    let r = c
        .list_all_tools(proto::ListAllToolsRequest {})
        .await?
        .into_inner();
    if client.json {
        print_json(&json!({
            "tools": r.tools.iter().map(tool_json).collect::<Vec<_>>(),
            "groups": r.groups.iter().map(group_json).collect::<Vec<_>>(),
            "registry_version": r.registry_version,
        }));
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
    let r = c
        .invalidate_settings(proto::InvalidateSettingsRequest {})
        .await?
        .into_inner();
    if client.json {
        print_json(&json!({ "active_domains": r.active_domains }));
    } else {
        out!(
            "settings re-read; active domains: {}",
            r.active_domains.join(", ")
        );
    }
    Ok(())
}

async fn reload(client: &ClientArgs) -> Result<(), Failure> {
    let mut c = connect(client).await?;
    let r = c
        .reload_registry(proto::ReloadRegistryRequest {})
        .await?
        .into_inner();
    if client.json {
        print_json(&json!({
            "registry_version": r.registry_version,
            "domains": r.domains,
            "tools": r.tools,
        }));
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

fn check(dirs: &[PathBuf]) -> Result<(), Failure> {
    let registry = Registry::load_dirs(dirs)?;
    let keywords = registry.keywords().count();
    // About four characters per token, over what a provider is sent for each tool.
    let chars: usize = registry
        .domains()
        .iter()
        .flat_map(|d| &d.tools)
        .map(|t| t.name.len() + t.description.len() + t.input_schema_json.len())
        .sum();
    out!(
        "ok: {} domains, {} tools, {} keywords, ~{} schema tokens",
        registry.domains().len(),
        registry.tool_count(),
        keywords,
        chars / 4
    );
    Ok(())
}

async fn settings(action: SettingsAction, database: &str, conn: &Connection) -> Result<(), Failure> {
    let addr = &conn.addr;
    let db = Db::connect(database).await?;
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
            let rows: Vec<Vec<String>> = rows.into_iter().map(|(k, v)| vec![k, v]).collect();
            print_table(&["KEY", "VALUE"], &rows);
            db.close().await;
            return Ok(());
        }
    }
    db.close().await;
    // Best effort: the change is in the table either way and shows within one TTL.
    match tokio::time::timeout(Duration::from_secs(3), async {
        let mut c = conn.client().await.map_err(Failure::from)?;
        Ok::<_, Failure>(
            c.invalidate_settings(proto::InvalidateSettingsRequest {})
                .await?
                .into_inner(),
        )
    })
    .await
    {
        Ok(Ok(r)) => out!(
            "daemon at {addr} re-read settings; active domains: {}",
            r.active_domains.join(", ")
        ),
        Ok(Err(f)) => out!(
            "note: {} (the daemon will see the change within its settings TTL)",
            f.message
        ),
        Err(_) => {
            out!("note: no answer from {addr} (the daemon will see the change within its settings TTL)")
        }
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
    let real = crate::service::ToolRouterService::new(state.clone());
    let mut answers = Vec::new();
    for message in messages {
        let req = tonic::Request::new(proto::RouteRequest {
            message: message.clone(),
            conversation_id: String::new(),
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
