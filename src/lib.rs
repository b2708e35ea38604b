//! toolrouter decides, for every chat turn, which LLM tool definitions a chat backend sends
//! to the model: core domains, plus the domains whose keywords the message hits, or every
//! active domain when nothing hit. Domains are active when their settings keys have values in
//! a `settings` table (SQLite, or PostgreSQL shared by several daemons).
//!
//! # Layout
//! Modules in data-flow order; each uses only modules above it (`.ci/layers.py` checks):
//! - [`error`]: the crate's `Error`, whose request variants own the SPEC texts, and its one
//!   mapping onto gRPC status codes.
//! - [`registry`]: manifests (both formats, validated) into an immutable `Registry`.
//! - [`matcher`]: the Aho-Corasick keyword automaton and the word-boundary rule. Pure.
//! - [`search`]: the search index over tool text (BM25F, Snowball stems). Pure.
//! - [`router`]: the pure decision: the settings snapshot and what it activates for a
//!   consumer (profiles and disabled tools scope it), the conversation state a route reads,
//!   `route()`, `load()` and `check_call()`. No I/O, no clock.
//! - [`render`]: provider tool formats (OpenAI chat and responses, Anthropic, Gemini, MCP)
//!   and `o200k_base` token counts: each tool rendered once per registry and format, answers
//!   assembled from those bytes. Pure.
//! - [`eval`]: routing quality over labelled messages (`toolrouter eval`), in-process.
//! - [`db`]: the database behind one interface, SQLite (the default) or PostgreSQL (several
//!   replicas): pools, migrations, every SQL statement (one fn each, one module per
//!   backend) and PostgreSQL's settings notifications.
//! - `settings`: the TTL cache of the settings snapshot over the database.
//! - `conversations`: per-conversation state over the database: cache, locks, persistence.
//! - [`config`]: defaults < `--config` file < `TOOLROUTER_*` environment < flags.
//! - [`state`]: the composition root: the swapped view (registry, automaton, index,
//!   activation), the registry composed of the manifests and the domains registered at run
//!   time, and the operations that ask the router and persist what it changed.
//! - [`telemetry`]: one log line per call and the Prometheus metrics.
//! - [`wire`]: the answers whose tools are written from bytes encoded once per registry,
//!   and the generated server trait that sends them.
//! - [`service`]: the tonic `ToolRouter` service: requests parsed at the edge, domain types
//!   into proto; `codec`: its protobuf codec (a request that does not decode is
//!   `INVALID_ARGUMENT`); `guard`: auth (tokens bound to profiles too), load shedding and the per-request timeout.
//! - [`server`]: `serve(listener, state, config, shutdown)` with health, reflection, TLS,
//!   metrics and the drain timeout.
//! - [`cli`]: the command line, one file per command family; [`cli::connection`]: how the
//!   client commands, the load generator and tests reach a daemon (token, TLS, timeout).
#![warn(missing_docs)]

pub mod error;
pub mod registry;
pub mod matcher;
pub mod search;
pub mod router;
pub mod render;
pub mod eval;
pub mod db;
pub(crate) mod settings;
pub(crate) mod conversations;
pub mod config;
pub mod state;
pub(crate) mod codec;
pub(crate) mod guard;
pub mod telemetry;
pub mod wire;
pub mod service;
pub mod server;
pub mod cli;

pub use error::{Error, Result};

/// The generated protobuf and gRPC code for `toolrouter.v1`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("toolrouter.v1");
    include!(concat!(env!("OUT_DIR"), "/toolrouter.v1.serde.rs"));

    /// The encoded file descriptor set, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("toolrouter_descriptor");
}
