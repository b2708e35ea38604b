//! `serve`: its flags laid over the configuration (defaults < `--config` file <
//! `TOOLROUTER_*` environment < flags), the command-line spelling of the routing enums,
//! logging, and the signals: SIGHUP reloads the registry, SIGTERM or Ctrl-C drains and stops.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::Failure;
use crate::config::{Config, LogFormat, parse_listen};
use crate::matcher::MatchMode;
use crate::registry::Registry;
use crate::router::FallbackPolicy;
use crate::state::State;

/// `--fallback`: [`FallbackPolicy`] as the command line spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FallbackArg {
    /// Core, loaded, and every active non-core domain with `fallback = true`.
    AllActive,
    /// Core and loaded domains only.
    CoreOnly,
}

impl From<FallbackArg> for FallbackPolicy {
    fn from(v: FallbackArg) -> Self {
        match v {
            FallbackArg::AllActive => FallbackPolicy::AllActive,
            FallbackArg::CoreOnly => FallbackPolicy::CoreOnly,
        }
    }
}

/// `--keyword-match`: [`MatchMode`] as the command line spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KeywordMatchArg {
    /// On word boundaries, with the plural/verb suffix rule.
    Word,
    /// Anywhere in the message, no suffix rules.
    Substring,
}

impl From<KeywordMatchArg> for MatchMode {
    fn from(v: KeywordMatchArg) -> Self {
        match v {
            KeywordMatchArg::Word => MatchMode::Word,
            KeywordMatchArg::Substring => MatchMode::Substring,
        }
    }
}

/// `--log-format`: [`LogFormat`] as the command line spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormatArg {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl From<LogFormatArg> for LogFormat {
    fn from(v: LogFormatArg) -> Self {
        match v {
            LogFormatArg::Text => LogFormat::Text,
            LogFormatArg::Json => LogFormat::Json,
        }
    }
}

/// How a flag's value lands on the configuration key of the same name: an option given
/// replaces the key (converted: a command-line enum into the core one, `T` into
/// `Option<T>`), a non-empty list replaces the list. Absent flags leave the file's value
/// (or the default).
trait Overlay<K> {
    fn apply(self, key: &mut K);
}

impl<V: Into<K>, K> Overlay<K> for Option<V> {
    fn apply(self, key: &mut K) {
        if let Some(v) = self {
            *key = v.into();
        }
    }
}

impl<T> Overlay<Vec<T>> for Vec<T> {
    fn apply(self, key: &mut Vec<T>) {
        if !self.is_empty() {
            *key = self;
        }
    }
}

/// Declares [`ServeArgs`]: `--config`, one flag per configuration key (named as the key of
/// [`Config`] it sets, so a new key is a `Config` field plus its flag here), and
/// `--print-config`; and `ServeArgs::overlay`, which lays every flag over its key.
macro_rules! serve_args {
    ($($(#[$meta:meta])* $key:ident: $ty:ty,)*) => {
        /// `serve` flags. Each is also `TOOLROUTER_<NAME>` in the environment and a key in the
        /// `--config` file; flags win over the environment, which wins over the file.
        #[derive(Debug, Args)]
        pub struct ServeArgs {
            /// A TOML file with any of the keys below (snake_case).
            #[arg(long, env = "TOOLROUTER_CONFIG")]
            pub config: Option<PathBuf>,
            $($(#[$meta])* pub $key: $ty,)*
            /// Print the effective configuration as TOML and exit.
            #[arg(long)]
            pub print_config: bool,
        }

        impl ServeArgs {
            fn overlay(&self, c: &mut Config) {
                $(self.$key.clone().apply(&mut c.$key);)*
            }
        }
    };
}

serve_args! {
    /// Address to listen on, `host:port` (a host name is resolved) [default: 127.0.0.1:50051].
    #[arg(long, env = "TOOLROUTER_LISTEN", value_parser = parse_listen)]
    listen: Option<SocketAddr>,
    /// Database URL: `sqlite://FILE`, or `postgres://USER:PASSWORD@HOST/DB` for several
    /// daemons on one database [default: sqlite://toolrouter.db].
    #[arg(long, env = "TOOLROUTER_DATABASE")]
    database: Option<String>,
    /// Manifest folder (repeatable; in the environment, separated by `:`) [default: the
    /// built-in demo registry].
    #[arg(long, env = "TOOLROUTER_MANIFESTS", value_delimiter = ':')]
    manifests: Vec<PathBuf>,
    /// Settings cache TTL, e.g. `10s` [default: 10s].
    #[arg(long, env = "TOOLROUTER_SETTINGS_TTL", value_parser = humantime::parse_duration)]
    settings_ttl: Option<Duration>,
    /// What a turn with no keyword or search hit gets [default: all-active].
    #[arg(long, env = "TOOLROUTER_FALLBACK", value_enum)]
    fallback: Option<FallbackArg>,
    /// How keywords hit [default: word].
    #[arg(long, env = "TOOLROUTER_KEYWORD_MATCH", value_enum)]
    keyword_match: Option<KeywordMatchArg>,
    /// Start answers with the `load_tool_group` meta-tool (`true`/`false`, or `1`/`0`,
    /// `yes`/`no`, `on`/`off`, as every boolean here) [default: true].
    #[arg(long, env = "TOOLROUTER_EXPOSE_LOAD_TOOL_GROUP", value_parser = clap::builder::BoolishValueParser::new())]
    expose_load_tool_group: Option<bool>,
    /// Carry the `search_tools` meta-tool in answers [default: true].
    #[arg(long, env = "TOOLROUTER_EXPOSE_SEARCH_TOOLS", value_parser = clap::builder::BoolishValueParser::new())]
    expose_search_tools: Option<bool>,
    /// When the search index routes: `off` (keywords only), `fallback` (only when nothing
    /// else routed the message) or `augment` (always) [default: augment].
    #[arg(long, env = "TOOLROUTER_SEARCH")]
    search: Option<crate::search::SearchMode>,
    /// A domain is a search hit when it scores at least this share of its segment's best, in
    /// the message's best sentence or clause [default: 0.48].
    #[arg(long, env = "TOOLROUTER_SEARCH_MIN_RATIO")]
    search_min_ratio: Option<f32>,
    /// The share asked in a sentence or clause that scores nothing against the message's
    /// best; weaker segments ask more, rising from --search-min-ratio to this [default: 0.75].
    #[arg(long, env = "TOOLROUTER_SEARCH_WEAK_MIN_RATIO")]
    search_weak_min_ratio: Option<f32>,
    /// At most this many search hits per sentence or clause [default: 12].
    #[arg(long, env = "TOOLROUTER_SEARCH_PER_SEGMENT")]
    search_per_segment: Option<usize>,
    /// A sentence or clause's search hits, best first, stop before the one that would bring
    /// their tools past this share of the registry's tools or --search-segment-min-tools,
    /// whichever is more; the segment's best domain itself always counts [default: 0.08].
    #[arg(long, env = "TOOLROUTER_SEARCH_SEGMENT_SHARE")]
    search_segment_share: Option<f32>,
    /// The tools a sentence or clause's search hits may always bring, however small the
    /// registry [default: 30].
    #[arg(long, env = "TOOLROUTER_SEARCH_SEGMENT_MIN_TOOLS")]
    search_segment_min_tools: Option<usize>,
    /// A sentence or clause counts only when its best score is at least this share of the
    /// message's best [default: 0.2].
    #[arg(long, env = "TOOLROUTER_SEARCH_SEGMENT_RATIO")]
    search_segment_ratio: Option<f32>,
    /// How long an idle conversation is remembered, e.g. `24h` [default: 24h].
    #[arg(long, env = "TOOLROUTER_CONVERSATION_TTL", value_parser = humantime::parse_duration)]
    conversation_ttl: Option<Duration>,
    /// Largest accepted message in bytes [default: 65536].
    #[arg(long, env = "TOOLROUTER_MAX_MESSAGE_BYTES")]
    max_message_bytes: Option<usize>,
    /// At most this many tools in a `Route` answer (0: no limit); whole domains are dropped
    /// to fit, fallback ones first [default: 128].
    #[arg(long, env = "TOOLROUTER_MAX_TOOLS")]
    max_tools: Option<u32>,
    /// At most this many tokens (o200k_base) of tools in a `Route` answer (0: none)
    /// [default: none].
    #[arg(long, env = "TOOLROUTER_TOKEN_BUDGET")]
    token_budget: Option<u32>,
    /// Log format [default: text].
    #[arg(long, env = "TOOLROUTER_LOG_FORMAT", value_enum)]
    log_format: Option<LogFormatArg>,
    /// How long a statement may wait for a lock (on PostgreSQL: a statement, or the wait for
    /// a connection, may take), e.g. `5s` [default: 5s].
    #[arg(long, env = "TOOLROUTER_BUSY_TIMEOUT", value_parser = humantime::parse_duration)]
    busy_timeout: Option<Duration>,
    /// On SIGTERM, how long in-flight calls get to finish, e.g. `10s` [default: 10s].
    #[arg(long, env = "TOOLROUTER_DRAIN_TIMEOUT", value_parser = humantime::parse_duration)]
    drain_timeout: Option<Duration>,
    /// How long one call may take before `DEADLINE_EXCEEDED`, e.g. `10s` [default: 10s].
    #[arg(long, env = "TOOLROUTER_REQUEST_TIMEOUT", value_parser = humantime::parse_duration)]
    request_timeout: Option<Duration>,
    /// Calls served at once; more get `RESOURCE_EXHAUSTED` [default: 1024].
    #[arg(long, env = "TOOLROUTER_MAX_CONCURRENT_REQUESTS")]
    max_concurrent_requests: Option<usize>,
    /// Require `authorization: Bearer <TOKEN>` on every call except health.
    #[arg(long, env = "TOOLROUTER_AUTH_TOKEN", hide_env_values = true)]
    auth_token: Option<String>,
    /// Allow a non-loopback `--listen` address without `--auth-token`
    /// (`--allow-unauthenticated=false` turns off what a config file turned on)
    /// [default: false].
    #[arg(
        long,
        env = "TOOLROUTER_ALLOW_UNAUTHENTICATED",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    allow_unauthenticated: Option<bool>,
    /// PEM certificate chain: serve TLS (with `--tls-key`).
    #[arg(long, env = "TOOLROUTER_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// PEM private key for `--tls-cert`.
    #[arg(long, env = "TOOLROUTER_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// Serve Prometheus metrics at `http://ADDR/metrics` (`host:port`) [default: off].
    #[arg(long, env = "TOOLROUTER_METRICS_LISTEN", value_parser = parse_listen)]
    metrics_listen: Option<SocketAddr>,
    /// Memory for the conversation cache in bytes; less-used conversations beyond it are
    /// re-read from the database [default: 67108864 (64 MiB)].
    #[arg(long, env = "TOOLROUTER_CONVERSATION_CACHE_BYTES")]
    conversation_cache_bytes: Option<u64>,
    /// Connections the kernel queues before the daemon accepts them [default: 1024].
    #[arg(long, env = "TOOLROUTER_LISTEN_BACKLOG")]
    listen_backlog: Option<u32>,
    /// How long a new connection has to finish its handshake (TLS, when served, and the
    /// HTTP/2 preface) before it is closed, e.g. `10s` [default: 10s].
    #[arg(long, env = "TOOLROUTER_HANDSHAKE_TIMEOUT", value_parser = humantime::parse_duration)]
    handshake_timeout: Option<Duration>,
}

impl ServeArgs {
    /// The effective configuration: defaults < config file < environment < flags.
    ///
    /// # Errors
    /// An unreadable or invalid config file, or a configuration `Config::validate` refuses.
    pub fn config(&self) -> crate::Result<Config> {
        let c = self.offline_config()?;
        c.validate_serving()?;
        Ok(c)
    }

    /// The effective configuration as [`ServeArgs::config`], checked only as far as a command
    /// that serves nothing needs it (`Config::validate_offline`).
    ///
    /// # Errors
    /// An unreadable or invalid config file, or a configuration that command cannot use.
    pub fn offline_config(&self) -> crate::Result<Config> {
        let mut c = Config::load(self.config.as_deref())?;
        self.overlay(&mut c);
        c.validate_offline()?;
        Ok(c)
    }
}

/// Logs to stderr in `format`, at the level `RUST_LOG` asks for (default `info`).
pub fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal as _;
    // Colour codes only where a person reads them, never into a file or a pipe.
    let ansi = std::io::stderr().is_terminal();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    // `try_init` fails only when a subscriber is already set (tests); keeping it is fine.
    let _ = match format {
        LogFormat::Text => builder
            .event_format(crate::telemetry::TextLogFormat(
                tracing_subscriber::fmt::format().with_ansi(ansi),
            ))
            .try_init(),
        LogFormat::Json => builder
            .json()
            .event_format(crate::telemetry::JsonLogFormat(
                tracing_subscriber::fmt::format().json(),
            ))
            .try_init(),
    };
}

/// A configuration value as the configuration file spells it.
fn spelled(value: &impl serde::Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

pub(super) async fn serve(args: &ServeArgs) -> Result<(), Failure> {
    let config = args.config()?;
    if args.print_config {
        out!("{}", config.to_toml());
        return Ok(());
    }
    init_tracing(config.log_format);
    let ended = run(&config).await;
    match ended {
        // In JSON logs what stops the daemon is a line like the others, which whatever
        // collects the log can read; on a terminal or in a text log, the plain line says it,
        // and so it does when `RUST_LOG` filters the event out: it is never left unsaid.
        Err(mut f) if config.log_format == LogFormat::Json && tracing::enabled!(tracing::Level::ERROR) => {
            tracing::error!(cause = %f.message, exit_code = f.code, "the daemon cannot run");
            f.logged = true;
            Err(f)
        }
        ended => ended,
    }
}

/// Runs the daemon `config` describes, logging in place, until it is asked to stop.
async fn run(config: &Config) -> Result<(), Failure> {
    // TLS files that cannot be read or do not make a server identity are bad configuration,
    // found before anything starts (and a certificate out of date is a warning in the log).
    let tls = crate::server::tls(config)?;
    // From here on a SIGHUP is taken (and served once the daemon is ready), never the default
    // action that ends the process: a reload sent while the registry loads must not kill it.
    #[cfg(unix)]
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    crate::server::keep_freed_buffers();
    crate::server::survive_file_size_limit();
    // The token counter's tables take about 70 ms to build: build them while the manifests
    // are read, not after.
    std::thread::spawn(crate::render::warm_up);
    let registry = Registry::load(&config.manifests)?;
    tracing::info!(
        listen = %config.listen,
        database = %crate::db::redact_url(&config.database),
        // JSON text, which the JSON log format embeds as a real array.
        manifests = %serde_json::to_string(&config.manifests).unwrap_or_default(),
        settings_ttl = ?config.settings_ttl,
        // As the flags and the configuration file spell them (`all-active`, `word`); not
        // `fallback`, which a call line holds as a boolean.
        fallback_mode = %spelled(&config.fallback),
        keyword_match = %spelled(&config.keyword_match),
        expose_load_tool_group = config.expose_load_tool_group,
        conversation_ttl = ?config.conversation_ttl,
        max_message_bytes = config.max_message_bytes,
        domain_count = registry.domains().len(),
        tools = registry.tool_count(),
        registry_version = %format!("{:016x}", registry.version()),
        "starting"
    );
    #[cfg(unix)]
    match crate::server::raise_open_files_limit() {
        Ok(limit) => tracing::info!(limit, "open-files limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-files limit"),
    }
    // Before the daemon is reachable: from here on SIGTERM and Ctrl-C drain it.
    let shutdown = shutdown_signal();
    let listener = crate::server::bind(config.listen, config.listen_backlog)
        .map_err(|e| Failure::runtime(format!("cannot listen on {}: {e}", config.listen)))?;
    let state = State::new(registry, config).await?;
    // Held until the daemon exits, and taken on each file restored over this one.
    state.claim_database()?;
    #[cfg(unix)]
    tokio::spawn(reload_on_sighup(hup, state.clone()));
    crate::server::serve(listener, state, config, tls, shutdown)
        .await
        .map_err(|e| Failure::runtime(format!("server failed: {e}")))
}

/// Reloads the registry on each SIGHUP; a failed reload is logged and the old one serves on.
#[cfg(unix)]
async fn reload_on_sighup(hup: std::io::Result<tokio::signal::unix::Signal>, state: State) {
    let mut hup = match hup {
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

/// Resolves on Ctrl-C or SIGTERM, taken (on Unix) from the moment this is called, not from
/// the first poll: a SIGTERM that comes before its handler is in place takes the default
/// action and ends the process at once, cutting the calls in flight and the health watchers'
/// last status. So it is called before the daemon is reachable, inside the runtime.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let (interrupt, term) = {
        use tokio::signal::unix::{SignalKind, signal};
        (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
    };
    async move {
        #[cfg(unix)]
        let (ctrl_c, term) = (received(interrupt, "Ctrl-C"), received(term, "SIGTERM"));
        #[cfg(not(unix))]
        let (ctrl_c, term) = (
            async {
                if let Err(e) = tokio::signal::ctrl_c().await {
                    tracing::error!(error = %e, "cannot listen for Ctrl-C");
                    std::future::pending::<()>().await;
                }
            },
            std::future::pending::<()>(),
        );
        tokio::select! {
            () = ctrl_c => {}
            () = term => {}
        }
        tracing::info!("shutdown requested; finishing in-flight calls");
    }
}

/// Resolves when `signal`, already registered, is received; never, if it could not be.
#[cfg(unix)]
async fn received(signal: std::io::Result<tokio::signal::unix::Signal>, name: &str) {
    match signal {
        Ok(mut s) => {
            s.recv().await;
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for {name}");
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each command-line value converts to the core value the config file spells the same.
    fn spelled_as_in_config_files<A, C>()
    where
        A: ValueEnum + Into<C>,
        C: serde::Serialize,
    {
        for v in A::value_variants() {
            let flag = v.to_possible_value().unwrap();
            let core: C = v.clone().into();
            assert_eq!(serde_json::to_value(core).unwrap(), flag.get_name());
        }
    }

    /// A SIGTERM that comes after the daemon is reachable but before the server first polls
    /// its shutdown signal drains it: were the handler put in place on that first poll, the
    /// default action would end this test process here.
    #[cfg(unix)]
    #[tokio::test]
    async fn a_sigterm_before_the_shutdown_signal_is_polled_is_taken() {
        let shutdown = shutdown_signal();
        // SAFETY: raise sends a signal to this process, which the call above handles.
        assert_eq!(unsafe { libc::raise(libc::SIGTERM) }, 0);
        tokio::time::timeout(Duration::from_secs(10), shutdown)
            .await
            .expect("the SIGTERM raised before the first poll ends the wait");
    }

    #[test]
    fn every_flag_value_is_spelled_as_in_the_config_file() {
        spelled_as_in_config_files::<FallbackArg, FallbackPolicy>();
        spelled_as_in_config_files::<KeywordMatchArg, MatchMode>();
        spelled_as_in_config_files::<LogFormatArg, LogFormat>();
    }

    #[test]
    fn flags_given_replace_their_keys_and_absent_ones_keep_them() {
        use clap::Parser as _;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "fallback = \"core-only\"\nmanifests = [\"m\"]\nallow_unauthenticated = true\n\
             auth_token = \"file\"\nmax_message_bytes = 100\n",
        )
        .unwrap();
        let cli = crate::cli::Cli::try_parse_from([
            "toolrouter",
            "serve",
            "--config",
            file.to_str().unwrap(),
            "--keyword-match",
            "substring",
            "--log-format",
            "json",
            "--auth-token",
            "flag",
            "--settings-ttl",
            "2s",
        ])
        .unwrap();
        let crate::cli::Command::Serve(args) = cli.command else {
            panic!("not serve")
        };
        let c = args.config().unwrap();
        assert_eq!(c.keyword_match, MatchMode::Substring);
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.auth_token.as_deref(), Some("flag"));
        assert_eq!(c.settings_ttl, Duration::from_secs(2));
        assert_eq!(c.fallback, FallbackPolicy::CoreOnly, "the file's, no flag");
        assert_eq!(c.manifests, vec![PathBuf::from("m")]);
        assert!(c.allow_unauthenticated);
        assert_eq!(c.max_message_bytes, 100);
    }

    #[test]
    fn every_boolean_flag_takes_the_same_spellings() {
        use clap::Parser as _;
        let config = |argv: &[&str]| {
            let cli = crate::cli::Cli::try_parse_from([&["toolrouter", "serve"], argv].concat()).unwrap();
            let crate::cli::Command::Serve(args) = cli.command else {
                panic!("not serve")
            };
            args.config().unwrap()
        };
        for (spelled, value) in [
            ("true", true),
            ("1", true),
            ("yes", true),
            ("on", true),
            ("TRUE", true),
        ]
        .into_iter()
        .chain([
            ("false", false),
            ("0", false),
            ("no", false),
            ("off", false),
            ("False", false),
        ]) {
            let c = config(&[
                "--expose-load-tool-group",
                spelled,
                "--expose-search-tools",
                spelled,
            ]);
            assert_eq!(
                (c.expose_load_tool_group, c.expose_search_tools),
                (value, value),
                "{spelled}"
            );
            let c = config(&[&format!("--allow-unauthenticated={spelled}")]);
            assert_eq!(c.allow_unauthenticated, value, "{spelled}");
        }
        assert!(
            crate::cli::Cli::try_parse_from(["toolrouter", "serve", "--expose-search-tools", "maybe"])
                .is_err()
        );
    }

    #[test]
    fn a_flag_turns_off_a_switch_the_config_file_turned_on() {
        use clap::Parser as _;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "allow_unauthenticated = true\n").unwrap();
        let parsed = |extra: &[&str]| {
            let mut argv = vec!["toolrouter", "serve", "--config", file.to_str().unwrap()];
            argv.extend_from_slice(extra);
            let cli = crate::cli::Cli::try_parse_from(argv).unwrap();
            let crate::cli::Command::Serve(args) = cli.command else {
                panic!("not serve")
            };
            args.config().unwrap().allow_unauthenticated
        };
        assert!(parsed(&[]), "the file's");
        assert!(!parsed(&["--allow-unauthenticated=false"]));
        assert!(parsed(&["--allow-unauthenticated"]));
        assert!(parsed(&["--allow-unauthenticated=true"]));
        assert!(
            crate::cli::Cli::try_parse_from(["toolrouter", "serve", "--allow-unauthenticated=maybe"])
                .is_err()
        );
    }
}
