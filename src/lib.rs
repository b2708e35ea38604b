//! toolrouter decides, for every chat turn, which LLM tool definitions a chat backend sends
//! to the model: core domains, plus the domains whose keywords the message hits, or every
//! active domain when nothing hit. Domains are active when their settings keys have values in
//! a SQLite `settings` table.
//!
//! # Layout
//! Data flows top to bottom:
//! - [`registry`]: manifests (both formats, validated) into an immutable `Registry`.
//! - [`matcher`]: the Aho-Corasick keyword automaton and the word-boundary rule. Pure.
//! - [`search`]: the search index over tool text (BM25F, Snowball stems). Pure.
//! - [`router`]: `route()` and `load()`, pure functions of registry, settings snapshot,
//!   conversation and message.
//! - [`settings`]: the settings snapshot and its TTL cache.
//! - [`conversations`]: loaded groups and sticky hits per conversation, persisted.
//! - [`db`]: the SQLite pool, migrations and every SQL statement.
//! - [`state`]: the shared state tying them together for one request.
//! - [`service`]: the tonic `ToolRouter` service: proto to domain types and back; [`codec`]:
//!   its protobuf codec (a request that does not decode is `INVALID_ARGUMENT`).
//! - [`guard`]: auth, load shedding and the per-request timeout, in front of the services.
//! - [`telemetry`]: one log line per call and the Prometheus metrics (`--metrics-listen`).
//! - [`server`]: `serve(listener, state, config, shutdown)` with health, reflection, TLS and
//!   the drain timeout.
//! - [`eval`]: `toolrouter eval`, routing quality over labelled messages.
//! - [`config`] and [`cli`]: configuration layers and the command line, one file per
//!   command family; [`cli::connection`]: how the client commands, the load generator and
//!   tests reach a daemon (token, TLS, timeout).
#![warn(missing_docs)]

pub mod cli;
pub mod codec;
pub mod config;
pub mod conversations;
pub mod db;
pub mod error;
pub mod eval;
pub mod guard;
pub mod matcher;
pub mod registry;
pub mod router;
pub mod search;
pub mod server;
pub mod service;
pub mod settings;
pub mod state;
pub mod telemetry;

pub use error::{Error, Result};

/// The generated protobuf and gRPC code for `toolrouter.v1`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("toolrouter.v1");
    include!(concat!(env!("OUT_DIR"), "/toolrouter.v1.serde.rs"));

    /// The encoded file descriptor set, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("toolrouter_descriptor");
}
