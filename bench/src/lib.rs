//! Benchmark and evaluation tooling for toolrouter, kept out of the daemon it measures.
//!
//! # Layout
//! - [`workload`]: the workloads: the demo registry with realistic messages, the third-party
//!   eval sets (Seal-Tools, StableToolBench) read at run time, synthetic `scale-N`.
//! - [`export`]: a workload written out as manifests, messages, labelled queries and a
//!   settings database, to serve and evaluate it for real.
//! - [`baseline`]: the transport floor, a server with the daemon's `Route` answers prebuilt.
//! - [`flip`]: the soak's settings writer.
//! - [`scan`]: the automaton floor of the route bench (`benches/route.rs`).
//!
//! The binary `toolrouter-bench` runs `export`, `baseline-server` and `flip-settings`; the
//! load generator they pair with ships in the daemon (`toolrouter bench grpc`).
#![warn(missing_docs)]

use std::path::PathBuf;

pub mod baseline;
pub mod export;
pub mod flip;
pub mod scan;
pub mod watch;
pub mod workload;

/// The eval data folder for the route bench and the tests: `TOOLROUTER_EVAL_DIR`, else
/// `shared/eval` beside the repository.
pub fn eval_dir() -> PathBuf {
    std::env::var_os("TOOLROUTER_EVAL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/eval")))
}
