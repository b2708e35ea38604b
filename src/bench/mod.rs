//! Benchmark tools: the eval and synthetic workloads (`eval`), the gRPC load generator
//! (`grpc`) and the transport-floor server (`baseline`). The CLI exposes the last two as
//! `toolrouter bench grpc` and `toolrouter bench baseline-server`.

pub mod baseline;
pub mod eval;
pub mod grpc;
