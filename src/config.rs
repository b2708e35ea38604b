//! Configuration: defaults < `--config` TOML < `TOOLROUTER_*` environment < flags.
//! The environment and flags are merged by clap (see `cli::serve::ServeArgs`); this file owns
//! the defaults and the TOML layer, both ways: read from `--config`, printed by
//! `--print-config` and `DescribeServer`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, Result};
use crate::matcher::MatchMode;
use crate::registry::Tier;
use crate::router::{FallbackPolicy, Patterns, Profile, Profiles};
use crate::search::{self, SearchMode};

/// The default `max_tools`: OpenAI's limit on tools per request.
pub const DEFAULT_MAX_TOOLS: u32 = 128;

/// The longest busy timeout: SQLite and PostgreSQL take a 32-bit count of milliseconds.
const MAX_BUSY_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

/// The longest conversation TTL, 100 years of 365.25 days (the conversation cache refuses
/// more than 1,000 years).
const MAX_CONVERSATION_TTL: Duration = Duration::from_secs(100 * 31_557_600);

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The daemon's effective configuration. It serialises as the TOML `--config` reads (see
/// [`Config::to_toml`]): durations as `humantime` text, the auth token never.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address to listen on; loopback by default so nothing outside the host can call it.
    #[serde(deserialize_with = "listen_addr")]
    pub listen: SocketAddr,
    /// The settings and conversations database, created (SQLite) and migrated on start:
    /// `sqlite://FILE`, or `postgres://...` for several daemons sharing one database.
    pub database: String,
    /// Manifest folders; empty means the demo registry built into the binary.
    pub manifests: Vec<PathBuf>,
    /// How long a settings snapshot is served before the table is read again.
    #[serde(with = "duration")]
    pub settings_ttl: Duration,
    /// What a turn with no keyword or search hit gets.
    pub fallback: FallbackPolicy,
    /// How keywords hit.
    pub keyword_match: MatchMode,
    /// Whether answers start with the `load_tool_group` meta-tool.
    pub expose_load_tool_group: bool,
    /// Whether answers carry the `search_tools` meta-tool.
    pub expose_search_tools: bool,
    /// When the search index routes: `off`, `fallback` or `augment`.
    pub search: SearchMode,
    /// A domain is a search hit when it scores at least this share of its segment's best, in
    /// the message's best segment (see `search_weak_min_ratio` for the others).
    pub search_min_ratio: f32,
    /// The share of its best a domain must score in a segment that scores nothing against
    /// the message's best; a segment's share rises from `search_min_ratio` to this as its best
    /// falls against the message's best.
    pub search_weak_min_ratio: f32,
    /// At most this many search hits per segment of a message.
    pub search_per_segment: usize,
    /// A segment's search hits stop before the one that would bring their tools past this
    /// share of the registry's tools; the segment's best domain itself is a hit whatever its
    /// size.
    pub search_segment_share: f32,
    /// The tools a segment's search hits may always bring, however small the registry.
    pub search_segment_min_tools: usize,
    /// A segment counts only when its best score is at least this share of the message's best.
    pub search_segment_ratio: f32,
    /// How long an idle conversation is remembered.
    #[serde(with = "duration")]
    pub conversation_ttl: Duration,
    /// Largest accepted message, in bytes (exactly the limit is accepted).
    pub max_message_bytes: usize,
    /// At most this many tools in a `Route` answer unless the request says otherwise (0: no
    /// limit); 128 is OpenAI's limit on tools per request.
    pub max_tools: u32,
    /// At most this many tokens of tools in a `Route` answer unless the request says
    /// otherwise (0: none, as for `max_tools`); none by default.
    pub token_budget: Option<u32>,
    /// Log output format.
    pub log_format: LogFormat,
    /// How long a database statement may wait for another writer's lock before failing; on
    /// PostgreSQL also how long a statement or the wait for a pooled connection may take (a
    /// slow or unreachable server).
    #[serde(with = "duration")]
    pub busy_timeout: Duration,
    /// On SIGTERM, how long in-flight calls get to finish before the daemon exits anyway.
    #[serde(with = "duration")]
    pub drain_timeout: Duration,
    /// How long one call may take before it is answered `DEADLINE_EXCEEDED`.
    #[serde(with = "duration")]
    pub request_timeout: Duration,
    /// Calls served at once; more are refused at once with `RESOURCE_EXHAUSTED`.
    pub max_concurrent_requests: usize,
    /// When set, every call except health needs `authorization: Bearer <token>`. A secret:
    /// never serialised.
    #[serde(skip_serializing)]
    pub auth_token: Option<String>,
    /// Allow listening on a non-loopback address without an auth token.
    pub allow_unauthenticated: bool,
    /// PEM certificate chain for TLS (with `tls_key`).
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for TLS (with `tls_cert`).
    pub tls_key: Option<PathBuf>,
    /// Where to serve Prometheus metrics (`GET /metrics`); off when unset.
    #[serde(default, deserialize_with = "optional_listen_addr")]
    pub metrics_listen: Option<SocketAddr>,
    /// Memory the conversation cache may use, in bytes (estimated per conversation from its
    /// id and members); least-used conversations beyond it are re-read from the database.
    pub conversation_cache_bytes: u64,
    /// Connections the kernel queues for the listener before the daemon accepts them.
    pub listen_backlog: u32,
    /// How long a new connection may stay silent before it is closed (a client sends its
    /// HTTP/2 preface at once; a socket that sends nothing only holds a file descriptor).
    #[serde(with = "duration")]
    pub handshake_timeout: Duration,
    /// What each kind of consumer may see (SPEC §10), by profile name: `[profiles.NAME]`.
    pub profiles: BTreeMap<String, ProfileConfig>,
    /// Auth tokens bound to a profile (`[tokens]`: token = "profile"): a call with one of
    /// them is authenticated and sees only its profile. Secrets: never serialised.
    #[serde(skip_serializing)]
    pub tokens: BTreeMap<String, String>,
}

/// A `[profiles.NAME]` table (SPEC §10): glob patterns on domain and tool names (deny wins;
/// no allow pattern allows everything), the highest tier shown, and optional budget limits.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProfileConfig {
    /// Domains the profile may see (all when empty).
    pub allow_domains: Vec<String>,
    /// Domains it never sees.
    pub deny_domains: Vec<String>,
    /// Tools it may see (all when empty).
    pub allow_tools: Vec<String>,
    /// Tools it never sees.
    pub deny_tools: Vec<String>,
    /// The highest tier it sees: `read` < `modify` < `destructive` (the default; tools
    /// without a tier count as destructive).
    pub max_tier: Option<TierName>,
    /// Its `max_tools` for `Route` (requests may ask for fewer).
    pub max_tools: Option<u32>,
    /// Its token budget for `Route` (requests may ask for less).
    pub token_budget: Option<u32>,
}

/// A tier as a profile names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TierName {
    /// Only reading tools.
    Read,
    /// Reading and modifying tools.
    Modify,
    /// Every tool.
    Destructive,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            database: "sqlite://toolrouter.db".to_string(),
            manifests: Vec::new(),
            settings_ttl: Duration::from_secs(10),
            fallback: FallbackPolicy::AllActive,
            keyword_match: MatchMode::Word,
            expose_load_tool_group: true,
            expose_search_tools: true,
            search: SearchMode::Augment,
            search_min_ratio: search::DEFAULT_MIN_RATIO,
            search_weak_min_ratio: search::DEFAULT_WEAK_MIN_RATIO,
            search_per_segment: search::DEFAULT_PER_SEGMENT,
            search_segment_share: search::DEFAULT_SEGMENT_SHARE,
            search_segment_min_tools: search::DEFAULT_SEGMENT_MIN_TOOLS,
            search_segment_ratio: search::DEFAULT_SEGMENT_RATIO,
            conversation_ttl: Duration::from_secs(24 * 3600),
            max_message_bytes: 65_536,
            max_tools: DEFAULT_MAX_TOOLS,
            token_budget: None,
            log_format: LogFormat::Text,
            busy_timeout: crate::db::BUSY_TIMEOUT,
            drain_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
            max_concurrent_requests: 1024,
            auth_token: None,
            allow_unauthenticated: false,
            tls_cert: None,
            tls_key: None,
            metrics_listen: None,
            conversation_cache_bytes: crate::conversations::DEFAULT_CACHE_BYTES,
            listen_backlog: 1024,
            handshake_timeout: Duration::from_secs(10),
            profiles: BTreeMap::new(),
            tokens: BTreeMap::new(),
        }
    }
}

fn optional_listen_addr<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<SocketAddr>, D::Error> {
    listen_addr(d).map(Some)
}

fn listen_addr<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<SocketAddr, D::Error> {
    let s = String::deserialize(d)?;
    parse_listen(&s).map_err(serde::de::Error::custom)
}

/// Parses a listening address: `ip:port`, or `host:port` with the host name resolved (the
/// first address it resolves to, e.g. `localhost:50061`).
///
/// # Errors
/// A text without a port, or a host name that does not resolve.
pub fn parse_listen(s: &str) -> std::result::Result<SocketAddr, String> {
    if let Ok(addr) = s.parse() {
        return Ok(addr);
    }
    use std::net::ToSocketAddrs as _;
    let mut addrs = s
        .to_socket_addrs()
        .map_err(|e| format!("{s:?} is not a listening address (host:port): {e}"))?;
    addrs
        .next()
        .ok_or_else(|| format!("{s:?} resolves to no address"))
}

/// Durations as `humantime` text both ways: `"10s"`, `"1day"`.
mod duration {
    use super::{Deserialize, Deserializer, Duration, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(*d))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

impl Config {
    /// The routing options this configuration asks for.
    pub fn routing(&self) -> crate::router::Options {
        crate::router::Options {
            fallback: self.fallback,
            expose_load_tool_group: self.expose_load_tool_group,
            expose_search_tools: self.expose_search_tools,
            search: search::SearchOptions {
                mode: self.search,
                min_ratio: self.search_min_ratio,
                weak_min_ratio: self.search_weak_min_ratio,
                per_segment: self.search_per_segment,
                segment_share: self.search_segment_share,
                segment_min_tools: self.search_segment_min_tools,
                segment_ratio: self.search_segment_ratio,
            },
        }
    }

    /// The configuration as a TOML file `--config` would accept. The auth token and the
    /// database URL's credentials are never printed; a comment says when they were left out.
    pub(crate) fn to_toml(&self) -> String {
        self.to_toml_for(None)
    }

    /// [`Config::to_toml`] as a caller bound to `profile` may see it (SPEC §10: what is
    /// outside its profile is invisible to it): of the profiles, only its own, without its
    /// deny patterns (they name what it must not see); nothing of the other tokens.
    pub(crate) fn to_toml_for(&self, profile: Option<&str>) -> String {
        let database = crate::db::redact_url(&self.database);
        let redacted = database != self.database;
        let mut shown = Config {
            database,
            ..self.clone()
        };
        if let Some(p) = profile {
            shown.profiles.retain(|name, _| name == p);
            for own in shown.profiles.values_mut() {
                own.deny_domains.clear();
                own.deny_tools.clear();
            }
        }
        // Every field is a string, number, bool, list or absent option, all of which TOML
        // holds; only a path that is not UTF-8 cannot be written, and then the text says so.
        let mut out = toml::to_string(&shown)
            .unwrap_or_else(|e| format!("# the configuration cannot be written as TOML: {e}\n"));
        if self.auth_token.is_some() {
            out.push_str("# auth_token is set (not printed)\n");
        }
        if !self.tokens.is_empty() && profile.is_none() {
            out.push_str(&format!(
                "# {} auth token(s) bound to profiles (not printed)\n",
                self.tokens.len()
            ));
        }
        if redacted {
            out.push_str("# database credentials are set (not printed)\n");
        }
        if let Some(p) = profile {
            // The same words whatever there is to leave out, so they tell nothing of it.
            out.push_str(&format!(
                "# as a token bound to profile '{p}' sees it: other profiles, deny patterns and tokens are not shown\n"
            ));
        }
        // Printed with `println!`-style line ends by its callers.
        out.truncate(out.trim_end().len());
        out
    }

    /// Whether calls need an auth token (`auth_token` or a token bound to a profile).
    pub fn authenticates(&self) -> bool {
        self.auth_token.is_some() || !self.tokens.is_empty()
    }

    /// The profiles, compiled.
    ///
    /// # Errors
    /// `Config` naming the profile, the key and the pattern that is not a glob.
    pub fn profiles(&self) -> Result<Profiles> {
        let mut out = Vec::with_capacity(self.profiles.len());
        for (name, p) in &self.profiles {
            let compile = |key: &str, patterns: &[String]| {
                Patterns::new(patterns).map_err(|e| Error::Config(format!("profile `{name}`: {key}: {e}")))
            };
            out.push(Profile {
                name: name.clone(),
                allow_domains: compile("allow_domains", &p.allow_domains)?,
                deny_domains: compile("deny_domains", &p.deny_domains)?,
                allow_tools: compile("allow_tools", &p.allow_tools)?,
                deny_tools: compile("deny_tools", &p.deny_tools)?,
                max_tier: match p.max_tier {
                    Some(TierName::Read) => Tier::Read,
                    Some(TierName::Modify) => Tier::Modify,
                    Some(TierName::Destructive) | None => Tier::Destructive,
                },
                max_tools: p.max_tools,
                token_budget: p.token_budget,
            });
        }
        Ok(Profiles::new(out))
    }

    /// Checks what cannot be expressed in types: a safe listening address, TLS files in
    /// pairs, non-zero limits.
    ///
    /// # Errors
    /// `Config` naming the setting and what to do.
    pub fn validate(&self) -> Result<()> {
        self.validate_serving()?;
        self.validate_offline()
    }

    /// What a daemon needs to serve: tokens a client can send, a safe listening address, TLS
    /// files in pairs, limits on connections.
    ///
    /// # Errors
    /// `Config` naming the setting and what to do.
    pub fn validate_serving(&self) -> Result<()> {
        crate::db::check_writable_url(&self.database)?;
        if self.auth_token.as_deref().is_some_and(|t| t.trim().is_empty()) {
            return Err(Error::Config(
                "the auth token is empty; give a token or leave it unset".into(),
            ));
        }
        // A client sends a token in a header value: printable ASCII without spaces, or no
        // client could ever be let in. The token itself is never repeated.
        let sendable = |t: &str| t.bytes().all(|b| b.is_ascii_graphic());
        if self.auth_token.as_deref().is_some_and(|t| !sendable(t)) {
            return Err(Error::Config(
                "the auth token holds a character no client can send (only printable ASCII \
                 without spaces): check for a stray newline or space"
                    .into(),
            ));
        }
        for (token, profile) in &self.tokens {
            if token.trim().is_empty() {
                return Err(Error::Config("a token in [tokens] is empty".into()));
            }
            if !sendable(token) {
                return Err(Error::Config(format!(
                    "the token bound to profile `{profile}` in [tokens] holds a character no client \
                     can send (only printable ASCII without spaces)"
                )));
            }
            // The bound profile would win, and the operator's token would lose its rights.
            if self.auth_token.as_deref() == Some(token.as_str()) {
                return Err(Error::Config(format!(
                    "the token bound to profile `{profile}` in [tokens] is the auth token: give \
                     that profile's consumers a token of their own"
                )));
            }
            if !self.profiles.contains_key(profile) {
                return Err(Error::Config(format!(
                    "a token in [tokens] is bound to profile `{profile}`, which [profiles] does not define"
                )));
            }
        }
        if !self.listen.ip().is_loopback() && !self.authenticates() && !self.allow_unauthenticated {
            return Err(Error::Config(format!(
                "refusing to listen on {} (not loopback) without an auth token: set --auth-token \
                 (TOOLROUTER_AUTH_TOKEN), or pass --allow-unauthenticated to accept anyone who can reach it",
                self.listen
            )));
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(Error::Config(
                "TLS needs both --tls-cert and --tls-key (PEM files)".into(),
            ));
        }
        if self.listen.port() != 0 && self.metrics_listen == Some(self.listen) {
            return Err(Error::Config(format!(
                "metrics_listen and listen are both {}: metrics need an address of their own",
                self.listen
            )));
        }
        if self.listen_backlog == 0 {
            return Err(Error::Config("listen_backlog must be at least 1".into()));
        }
        // A drain holds every permit at once, in one request of at most u32::MAX.
        if !(1..=u32::MAX as usize).contains(&self.max_concurrent_requests) {
            return Err(Error::Config(format!(
                "max_concurrent_requests must be between 1 and {}, not {}",
                u32::MAX,
                self.max_concurrent_requests
            )));
        }
        Ok(())
    }

    /// What routing, the database and the registry's options need, also when nothing is
    /// served (`eval`): a shell set up for `serve` (its address, TLS files) does not stop it.
    ///
    /// # Errors
    /// `Config` naming the setting and what to do.
    pub fn validate_offline(&self) -> Result<()> {
        crate::db::check_url(&self.database)?;
        self.profiles()?;
        if self.max_message_bytes == 0 {
            return Err(Error::Config(
                "max_message_bytes must be at least 1 (every message would be refused)".into(),
            ));
        }
        for (key, value) in [
            ("search_min_ratio", self.search_min_ratio),
            ("search_weak_min_ratio", self.search_weak_min_ratio),
            ("search_segment_ratio", self.search_segment_ratio),
            ("search_segment_share", self.search_segment_share),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(Error::Config(format!(
                    "{key} must be between 0 and 1, not {value}"
                )));
            }
        }
        if self.search_per_segment == 0 {
            return Err(Error::Config("search_per_segment must be at least 1".into()));
        }
        for (key, value) in [
            ("request_timeout", self.request_timeout),
            ("settings_ttl", self.settings_ttl),
            ("handshake_timeout", self.handshake_timeout),
            ("conversation_ttl", self.conversation_ttl),
        ] {
            if value.is_zero() {
                return Err(Error::Config(format!("{key} must be more than zero")));
            }
        }
        // What the libraries underneath take: SQLite's and PostgreSQL's timeouts are a 32-bit
        // count of milliseconds; the conversation cache keeps an idle entry at most 1,000 years.
        for (key, value, most) in [
            ("busy_timeout", self.busy_timeout, MAX_BUSY_TIMEOUT),
            ("conversation_ttl", self.conversation_ttl, MAX_CONVERSATION_TTL),
        ] {
            if value > most {
                return Err(Error::Config(format!(
                    "{key} must be at most {}, not {}",
                    humantime::format_duration(most),
                    humantime::format_duration(value)
                )));
            }
        }
        Ok(())
    }

    /// Whether the config file at `path` sets `key` (at its top level).
    ///
    /// # Errors
    /// As [`Config::load`]: a file that cannot be read or is not TOML.
    pub fn file_sets(path: Option<&Path>, key: &str) -> Result<bool> {
        let Some(path) = path else {
            return Ok(false);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("cannot read config file {}: {e}", path.display())))?;
        let table: toml::Table = toml::from_str(&text).map_err(|e| {
            Error::Config(format!(
                "config file {}: {}",
                path.display(),
                e.message().trim_end()
            ))
        })?;
        Ok(table.contains_key(key))
    }

    /// Defaults, overlaid with the TOML file when one is given.
    ///
    /// # Errors
    /// An unreadable file, or one with a syntax error or an unknown key.
    pub fn load(path: Option<&Path>) -> Result<Config> {
        let Some(path) = path else {
            return Ok(Config::default());
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("cannot read config file {}: {e}", path.display())))?;
        // A token that is not a string would be echoed by the type error below.
        if let Ok(table) = toml::from_str::<toml::Table>(&text)
            && table.get("auth_token").is_some_and(|t| !t.is_str())
        {
            return Err(Error::Config(format!(
                "config file {}: auth_token must be a string in quotes (its value is not shown)",
                path.display()
            )));
        }
        toml::from_str(&text).map_err(|e| {
            // Where in the file, as line:column, so a wrong value's key is found at once.
            let at = e.span().map_or_else(String::new, |span| {
                let (line, column) = crate::registry::manifest::line_col(&text, span.start);
                format!(":{line}:{column}")
            });
            Error::Config(format!(
                "config file {}{at}: {}",
                path.display(),
                e.message().trim_end()
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_search_share_outside_0_to_1_is_refused_naming_its_key() {
        type Set = fn(&mut Config);
        let cases: &[(&str, Set)] = &[
            ("search_min_ratio", |c| c.search_min_ratio = -0.1),
            ("search_weak_min_ratio", |c| c.search_weak_min_ratio = 1.5),
            ("search_weak_min_ratio", |c| c.search_weak_min_ratio = f32::NAN),
            ("search_segment_ratio", |c| c.search_segment_ratio = 2.0),
            ("search_segment_share", |c| c.search_segment_share = 1.01),
        ];
        for (key, set) in cases {
            let mut c = Config::default();
            assert!(c.validate().is_ok());
            set(&mut c);
            let e = c.validate().unwrap_err().to_string();
            assert!(
                e.contains(&format!("{key} must be between 0 and 1")),
                "{key}: {e}"
            );
        }
    }

    #[test]
    fn a_config_file_overrides_the_defaults_it_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "settings_ttl = \"2s\"\nfallback = \"core-only\"\nmanifests = [\"m\"]\n",
        )
        .unwrap();
        let c = Config::load(Some(&path)).unwrap();
        assert_eq!(c.settings_ttl, Duration::from_secs(2));
        assert_eq!(c.fallback, FallbackPolicy::CoreOnly);
        assert_eq!(c.manifests, vec![PathBuf::from("m")]);
        assert_eq!(
            c.conversation_ttl,
            Duration::from_secs(86400),
            "untouched keys keep defaults"
        );
    }

    #[test]
    fn profiles_and_bound_tokens_are_read_from_the_file_and_tokens_never_printed() {
        let text = r#"
auth_token = "admin"

[profiles.mcp-media]
allow_domains = ["jellyfin", "radarr"]
max_tier = "read"

[profiles.ops]
deny_tools = ["docker_*prune*"]
max_tools = 40

[tokens]
"media-secret" = "mcp-media"
"#;
        let c: Config = toml::from_str(text).unwrap();
        c.validate().unwrap();
        let profiles = c.profiles().unwrap();
        assert_eq!(profiles.names().collect::<Vec<_>>(), ["mcp-media", "ops"]);
        let media = profiles.get(profiles.find("mcp-media").unwrap());
        assert_eq!(media.max_tier, Tier::Read);
        assert!(media.allows_domain("radarr") && !media.allows_domain("docker"));
        let ops = profiles.get(profiles.find("ops").unwrap());
        assert_eq!((ops.max_tier, ops.max_tools), (Tier::Destructive, Some(40)));
        assert_eq!(
            c.tokens.get("media-secret").map(String::as_str),
            Some("mcp-media")
        );

        let printed = c.to_toml();
        assert!(
            !printed.contains("media-secret") && !printed.contains("admin"),
            "{printed}"
        );
        assert!(
            printed.contains("# 1 auth token(s) bound to profiles (not printed)"),
            "{printed}"
        );
        let back: Config = toml::from_str(&printed).unwrap();
        assert_eq!(back.profiles, c.profiles, "profiles print and read back");
        assert!(back.tokens.is_empty());
    }

    #[test]
    fn bad_profiles_and_tokens_are_refused_with_the_reason() {
        let cases: &[(&str, &str)] = &[
            (
                "[profiles.p]\nallow_tools = [\"[oops\"]\n",
                "profile `p`: allow_tools: `[oops` is not a valid glob",
            ),
            (
                "[profiles.p]\n[tokens]\nt = \"q\"\n",
                "bound to profile `q`, which [profiles] does not define",
            ),
            (
                "[profiles.p]\n[tokens]\n\" \" = \"p\"\n",
                "a token in [tokens] is empty",
            ),
            (
                "auth_token = \"a\"\n[profiles.p]\n[tokens]\na = \"p\"\n",
                "the token bound to profile `p` in [tokens] is the auth token",
            ),
        ];
        for (text, want) in cases {
            let c: Config = toml::from_str(text).unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
        let typo = toml::from_str::<Config>("[profiles.p]\nmax_teir = \"read\"\n").unwrap_err();
        assert!(typo.to_string().contains("max_teir"), "{typo}");
        let tier = toml::from_str::<Config>("[profiles.p]\nmax_tier = \"admin\"\n").unwrap_err();
        assert!(tier.to_string().contains("admin"), "{tier}");
        let c = Config {
            listen: "0.0.0.0:1".parse().unwrap(),
            tokens: BTreeMap::from([("t".to_string(), "p".to_string())]),
            profiles: BTreeMap::from([("p".to_string(), ProfileConfig::default())]),
            ..Config::default()
        };
        assert!(
            c.validate().is_ok(),
            "bound tokens authenticate a non-loopback listener"
        );
    }

    #[test]
    fn the_printed_config_reads_back_as_the_same_config() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        let c = Config {
            manifests: vec![PathBuf::from("a b"), PathBuf::from("c")],
            settings_ttl: Duration::from_millis(1500),
            fallback: FallbackPolicy::CoreOnly,
            ..Config::default()
        };
        std::fs::write(&path, c.to_toml()).unwrap();
        let back = Config::load(Some(&path)).unwrap();
        assert_eq!(back.to_toml(), c.to_toml());
        assert_eq!(back.settings_ttl, c.settings_ttl);
    }

    #[test]
    fn the_printed_config_never_shows_the_auth_token() {
        let c = Config {
            auth_token: Some("s3cret".into()),
            tls_cert: Some(PathBuf::from("c.pem")),
            tls_key: Some(PathBuf::from("k.pem")),
            ..Config::default()
        };
        let text = c.to_toml();
        assert!(!text.contains("s3cret"), "{text}");
        assert!(text.contains("# auth_token is set"), "{text}");
        let back: Config = toml::from_str(&text).unwrap();
        assert_eq!(back.tls_key, c.tls_key);
        assert_eq!(back.auth_token, None);
    }

    #[test]
    fn the_printed_config_never_shows_database_credentials() {
        let c = Config {
            database: "postgres://tr:s3cret@db:5432/tr?password=s3cret2&sslmode=require".into(),
            ..Config::default()
        };
        let text = c.to_toml();
        assert!(!text.contains("s3cret"), "{text}");
        assert!(
            text.contains("database = \"postgres://db:5432/tr?sslmode=require\""),
            "{text}"
        );
        assert!(text.contains("# database credentials are set"), "{text}");
        assert!(!Config::default().to_toml().contains("credentials"));
    }

    #[test]
    fn a_non_loopback_address_needs_a_token_or_an_explicit_opt_out() {
        let open = Config {
            listen: "0.0.0.0:50051".parse().unwrap(),
            ..Config::default()
        };
        let e = open.validate().unwrap_err().to_string();
        assert!(
            e.contains("--auth-token") && e.contains("--allow-unauthenticated"),
            "{e}"
        );
        assert!(
            Config {
                auth_token: Some("t".into()),
                ..open.clone()
            }
            .validate()
            .is_ok()
        );
        assert!(
            Config {
                allow_unauthenticated: true,
                ..open.clone()
            }
            .validate()
            .is_ok()
        );
        assert!(Config::default().validate().is_ok(), "loopback needs no token");
        assert!(
            Config {
                listen: "[::1]:1".parse().unwrap(),
                ..Config::default()
            }
            .validate()
            .is_ok()
        );
    }

    #[test]
    fn tls_files_come_in_pairs_and_limits_are_positive() {
        let half = Config {
            tls_cert: Some(PathBuf::from("c.pem")),
            ..Config::default()
        };
        assert!(half.validate().unwrap_err().to_string().contains("--tls-key"));
        let limits: &[(Config, &str)] = &[
            (
                Config {
                    max_concurrent_requests: 0,
                    ..Config::default()
                },
                "max_concurrent_requests must be between 1 and 4294967295, not 0",
            ),
            (
                Config {
                    max_concurrent_requests: usize::MAX,
                    ..Config::default()
                },
                "max_concurrent_requests must be between 1 and 4294967295, not 18446744073709551615",
            ),
            (
                Config {
                    max_message_bytes: 0,
                    ..Config::default()
                },
                "max_message_bytes must be at least 1 (every message would be refused)",
            ),
            (
                Config {
                    metrics_listen: Some(Config::default().listen),
                    ..Config::default()
                },
                "metrics_listen and listen are both 127.0.0.1:50051: metrics need an address of their own",
            ),
            (
                Config {
                    database: "sqlite://t.db?mode=ro".into(),
                    ..Config::default()
                },
                "database URL \"sqlite://t.db?mode=ro\" opens the file read-only (mode=ro), but the daemon stores conversations and run-time domains there: leave mode out",
            ),
            (
                Config {
                    database: "sqlite://t.db?cache=shared&immutable=1".into(),
                    ..Config::default()
                },
                "database URL \"sqlite://t.db?cache=shared&immutable=1\" opens the file read-only (immutable=1), but the daemon stores conversations and run-time domains there: leave immutable out",
            ),
        ];
        for (config, want) in limits {
            assert_eq!(config.validate().unwrap_err().to_string(), *want);
        }
        assert!(
            Config {
                max_concurrent_requests: u32::MAX as usize,
                max_message_bytes: 1,
                database: "sqlite://t.db?mode=rwc&immutable=0".into(),
                ..Config::default()
            }
            .validate()
            .is_ok()
        );
        let blank = Config {
            auth_token: Some(" ".into()),
            ..Config::default()
        };
        assert!(blank.validate().unwrap_err().to_string().contains("empty"));
        for token in ["abc\n", "a b", "tök"] {
            let unsendable = Config {
                auth_token: Some(token.into()),
                ..Config::default()
            };
            let e = unsendable.validate().unwrap_err().to_string();
            assert!(e.contains("no client can send") && !e.contains(token), "{e}");
        }
    }

    #[test]
    fn an_auth_token_that_is_not_a_string_is_refused_without_showing_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        for value in ["90817263", "90817263.5", "[\"90817263\"]", "{ t = \"90817263\" }"] {
            std::fs::write(&path, format!("auth_token = {value}\n")).unwrap();
            let e = Config::load(Some(&path)).unwrap_err().to_string();
            assert!(
                e.contains("auth_token must be a string") && !e.contains("90817263"),
                "{value}: {e}"
            );
        }
    }

    #[test]
    fn an_unknown_config_key_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "setings_ttl = \"2s\"\n").unwrap();
        let e = Config::load(Some(&path)).unwrap_err().to_string();
        assert!(e.contains("setings_ttl"), "{e}");
    }

    #[test]
    fn a_database_url_must_be_sqlite_or_postgres() {
        for url in ["mysql://x/y", "", "toolrouter.db", "postgres:x"] {
            let c = Config {
                database: url.into(),
                ..Config::default()
            };
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("neither sqlite://FILE nor postgres://"), "{url}: {e}");
        }
        for url in [
            "sqlite://t.db",
            "sqlite:t.db",
            "SQLITE:///tmp/t.db?mode=rwc",
            "postgres://u:p@h/d",
            "postgresql://h/d",
        ] {
            let c = Config {
                database: url.into(),
                ..Config::default()
            };
            assert!(c.validate().is_ok(), "{url}");
        }
        for url in ["sqlite::memory:", "sqlite://t.db?mode=memory"] {
            let c = Config {
                database: url.into(),
                ..Config::default()
            };
            let e = c.validate().unwrap_err().to_string();
            assert!(
                e.contains("is an in-memory database") && e.contains("sqlite://FILE"),
                "{url}: {e}"
            );
        }
        for url in ["sqlite://", "sqlite:"] {
            let c = Config {
                database: url.into(),
                ..Config::default()
            };
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("names no file"), "{url}: {e}");
        }
        let c = Config {
            conversation_ttl: Duration::ZERO,
            ..Config::default()
        };
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "conversation_ttl must be more than zero"
        );
        // Over what the libraries underneath take: a configuration error, not a panic at start.
        let day = Duration::from_secs(24 * 3600);
        for (c, want) in [
            (
                Config {
                    busy_timeout: 25 * day,
                    ..Config::default()
                },
                "busy_timeout must be at most 24days 20h 31m 23s 647ms, not 25days",
            ),
            (
                Config {
                    conversation_ttl: 1000 * 365 * day,
                    ..Config::default()
                },
                "conversation_ttl must be at most 100years, not ",
            ),
        ] {
            let e = c.validate().unwrap_err().to_string();
            assert!(e.starts_with(want), "{e}");
        }
        for c in [
            Config {
                busy_timeout: 24 * day,
                ..Config::default()
            },
            Config {
                conversation_ttl: 99 * 365 * day,
                ..Config::default()
            },
        ] {
            assert!(c.validate().is_ok(), "{c:?}");
        }
        let ephemeral: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
        let c = Config {
            listen: ephemeral,
            metrics_listen: Some(ephemeral),
            ..Config::default()
        };
        assert!(c.validate().is_ok(), "two ephemeral ports are two ports");
    }

    #[test]
    fn a_wrong_config_value_is_an_error_naming_its_line_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "settings_ttl = \"2s\"\nmax_tools = \"40\"\n").unwrap();
        let e = Config::load(Some(&path)).unwrap_err().to_string();
        assert!(e.contains(&format!("{}:2:13:", path.display())), "{e}");
        assert!(e.contains("u32"), "{e}");
    }
}
