//! Configuration: defaults < `--config` TOML < `TOOLROUTER_*` environment < flags.
//! The environment and flags are merged by clap (see `cli::ServeArgs`); this file owns the
//! defaults and the TOML layer.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::error::{Error, Result};
use crate::matcher::MatchMode;
use crate::router::FallbackPolicy;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The daemon's effective configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address to listen on; loopback by default so nothing outside the host can call it.
    pub listen: SocketAddr,
    /// SQLite URL of the settings and conversations database (created and migrated on start).
    pub database: String,
    /// Manifest folders; empty means the demo registry built into the binary.
    pub manifests: Vec<PathBuf>,
    /// How long a settings snapshot is served before the table is read again.
    #[serde(deserialize_with = "duration")]
    pub settings_ttl: Duration,
    /// What a turn with no keyword hit gets.
    pub fallback: FallbackPolicy,
    /// How keywords hit.
    pub keyword_match: MatchMode,
    /// Whether answers start with the `load_tool_group` meta-tool.
    pub expose_load_tool_group: bool,
    /// How long an idle conversation is remembered.
    #[serde(deserialize_with = "duration")]
    pub conversation_ttl: Duration,
    /// Largest accepted message, in bytes (exactly the limit is accepted).
    pub max_message_bytes: usize,
    /// Log output format.
    pub log_format: LogFormat,
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
            conversation_ttl: Duration::from_secs(24 * 3600),
            max_message_bytes: 65_536,
            log_format: LogFormat::Text,
        }
    }
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map_err(serde::de::Error::custom)
}

/// The spelling of a value-enum value on the command line and in config files.
fn name<T: clap::ValueEnum>(v: &T) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}

impl Config {
    /// The configuration as a TOML file `--config` would accept.
    pub fn to_toml(&self) -> String {
        let manifests: Vec<String> = self
            .manifests
            .iter()
            .map(|p| format!("{:?}", p.display().to_string()))
            .collect();
        format!(
            "listen = \"{}\"\ndatabase = {:?}\nmanifests = [{}]\nsettings_ttl = \"{}\"\nfallback = \"{}\"\n\
             keyword_match = \"{}\"\nexpose_load_tool_group = {}\nconversation_ttl = \"{}\"\n\
             max_message_bytes = {}\nlog_format = \"{}\"",
            self.listen,
            self.database,
            manifests.join(", "),
            humantime::format_duration(self.settings_ttl),
            name(&self.fallback),
            name(&self.keyword_match),
            self.expose_load_tool_group,
            humantime::format_duration(self.conversation_ttl),
            self.max_message_bytes,
            name(&self.log_format),
        )
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
        toml::from_str(&text)
            .map_err(|e| Error::Config(format!("config file {}: {}", path.display(), e.message())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn an_unknown_config_key_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "setings_ttl = \"2s\"\n").unwrap();
        let e = Config::load(Some(&path)).unwrap_err().to_string();
        assert!(e.contains("setings_ttl"), "{e}");
    }
}
