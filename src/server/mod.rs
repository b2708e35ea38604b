//! `serve(listener, state, config, shutdown)`: the gRPC server with the `ToolRouter` service,
//! health and reflection, behind the [`Guard`] (auth, load shedding, timeout), over TLS when
//! configured. The caller owns the listener (tests bind `127.0.0.1:0`) and the shutdown
//! trigger.
//!
//! **Connections** ([`connection`]). The accept loop backs off (and logs once per streak)
//! while the process is out of file descriptors instead of spinning; a connection that has
//! not finished its handshake (TLS, and the HTTP/2 preface) within the handshake timeout is
//! closed; each may open a bounded number of streams; HTTP/2 and TCP keepalives find dead
//! peers.
//!
//! **Drain.** On shutdown health turns `NOT_SERVING` and the listener closes at once;
//! connections still in their handshake are closed; calls in flight get the drain timeout to
//! finish, while health calls on open connections still answer (`NOT_SERVING`) and other new
//! calls are refused `UNAVAILABLE`. When the last call has finished every connection is
//! closed and the server returns.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tonic::transport::Server;

use crate::codec::TRANSPORT_LIMIT_BYTES;
use crate::config::Config;
use crate::error::Error;
use crate::guard::Guard;

/// The largest health or reflection request decoded: a service name, a file or symbol name.
const SMALL_REQUEST_BYTES: usize = 4 * 1024;

use crate::service::{Limits, ToolRouterService};
use crate::state::State;
use crate::wire::tool_router_server::ToolRouterServer;

mod connection;

pub(crate) use connection::raise_open_files_limit;
pub use connection::{Conn, Incoming, bind, incoming, tls};

/// Bytes allowed in a request beyond the message limit, for the other fields and framing.
const REQUEST_OVERHEAD_BYTES: usize = 4096;

/// After the drain timeout cut calls short, how long the final database flush may take.
const CUT_GRACE: Duration = Duration::from_secs(1);

/// Streams one connection may have open beyond the calls the daemon admits at once, for
/// health checks.
const HEALTH_STREAMS: u32 = 64;

/// The streams one connection may have open at once (HTTP/2 `MAX_CONCURRENT_STREAMS`): the
/// calls the daemon admits at once, 1,024 at least so that calls past a small limit are shed
/// (`RESOURCE_EXHAUSTED`) rather than queued by the client, and some for health checks.
/// Without a cap one connection could open any number of streams the guard never counts.
fn streams_per_connection(max_concurrent_requests: usize) -> u32 {
    u32::try_from(max_concurrent_requests.max(1024))
        .unwrap_or(u32::MAX)
        .saturating_add(HEALTH_STREAMS)
}

/// HTTP/2 PING interval on an open connection, and how long the answer may take before the
/// connection is closed as dead.
const HTTP2_KEEPALIVE: (Duration, Duration) = (Duration::from_secs(30), Duration::from_secs(10));

/// Keeps the memory of freed answer buffers in the allocator for the next call. An answer is
/// encoded into a buffer as large as it is (about 400 KB for a large registry's fallback);
/// glibc's defaults hand such buffers back to the system when they are freed at the top of
/// an arena (trim threshold) or map them afresh each time (mmap threshold), so under
/// concurrent load every call paid again for zeroed pages. Buffers under 4 MiB now come from
/// the arenas, and free memory at an arena's top is returned only beyond 32 MiB; the peak
/// memory in use is unchanged. A registry build still hands its memory back explicitly.
pub fn keep_freed_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; it has no preconditions.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 32 << 20);
    }
}

/// Lets a write past the file-size limit (`ulimit -f`, systemd's `LimitFSIZE=`) fail with
/// `EFBIG`, which the database answers as a full disk (`UNAVAILABLE`), instead of the
/// default action of `SIGXFSZ`, which ends the process.
pub fn survive_file_size_limit() {
    #[cfg(unix)]
    // SAFETY: ignoring a signal installs no handler code; it has no preconditions.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}

/// The health service, whose `Watch` streams end when the drain starts, after telling the
/// watcher `NOT_SERVING`: an open watch would otherwise hold the shutdown to the drain
/// timeout, as a call in flight does.
struct DrainingHealth {
    inner: tonic_health::server::HealthService,
    draining: watch::Receiver<bool>,
}

/// Resolves once the drain has started (or its sender is gone).
async fn drain_started(mut draining: watch::Receiver<bool>) {
    while !*draining.borrow_and_update() {
        if draining.changed().await.is_err() {
            return;
        }
    }
}

type HealthStream = Pin<
    Box<
        dyn tokio_stream::Stream<
                Item = std::result::Result<tonic_health::pb::HealthCheckResponse, tonic::Status>,
            > + Send,
    >,
>;

#[tonic::async_trait]
impl tonic_health::pb::health_server::Health for DrainingHealth {
    async fn check(
        &self,
        request: tonic::Request<tonic_health::pb::HealthCheckRequest>,
    ) -> std::result::Result<tonic::Response<tonic_health::pb::HealthCheckResponse>, tonic::Status> {
        self.inner.check(request).await
    }

    type WatchStream = HealthStream;

    async fn watch(
        &self,
        request: tonic::Request<tonic_health::pb::HealthCheckRequest>,
    ) -> std::result::Result<tonic::Response<HealthStream>, tonic::Status> {
        use tokio_stream::StreamExt as _;
        use tonic_health::pb::health_check_response::ServingStatus;
        let mut statuses = self.inner.watch(request).await?.into_inner();
        let not_serving = ServingStatus::NotServing as i32;
        let draining = drain_started(self.draining.clone());
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            tokio::pin!(draining);
            let mut last = None;
            loop {
                tokio::select! {
                    // A status already waiting goes first, so NOT_SERVING is not skipped.
                    biased;
                    item = statuses.next() => {
                        let Some(item) = item else { return };
                        last = item.as_ref().ok().map(|r| r.status).or(last);
                        if tx.send(item).await.is_err() {
                            return;
                        }
                    }
                    () = &mut draining => {
                        if last != Some(not_serving) {
                            let end = tonic_health::pb::HealthCheckResponse { status: not_serving };
                            let _ = tx.send(Ok(end)).await;
                        }
                        return;
                    }
                    () = tx.closed() => return,
                }
            }
        });
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(tonic::Response::new(Box::pin(stream)))
    }
}

/// Serves until `shutdown` resolves, then drains in-flight calls (for at most the drain
/// timeout) and closes the database. `tls` is [`tls`]'s answer for `config`, read and
/// checked once by the caller before anything starts.
///
/// # Errors
/// A transport failure, a metrics address that cannot be bound, or a reflection descriptor
/// that cannot be decoded.
pub async fn serve(
    listener: TcpListener,
    state: State,
    config: &Config,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (drain_tx, drain_rx) = watch::channel(false);
    use tonic::codec::CompressionEncoding;
    // gzip and zstd both ways, on every service (a client that compresses everything checks
    // health too): accepted on requests, used for answers in the first of them the client
    // lists in grpc-accept-encoding.
    macro_rules! compressed {
        ($server:expr) => {
            $server
                .accept_compressed(CompressionEncoding::Gzip)
                .accept_compressed(CompressionEncoding::Zstd)
                .send_compressed(CompressionEncoding::Gzip)
                .send_compressed(CompressionEncoding::Zstd)
        };
    }
    let reporter = tonic_health::server::HealthReporter::new();
    // Health takes no token and is never shed, so its requests (a service name) are decoded
    // only up to a few KiB: a connection's streams each held 4 MiB until the request timeout.
    let health = compressed!(
        tonic_health::pb::health_server::HealthServer::new(DrainingHealth {
            inner: tonic_health::server::HealthService::from_health_reporter(reporter.clone()),
            draining: drain_rx.clone(),
        })
        .max_decoding_message_size(SMALL_REQUEST_BYTES)
    );
    // Reflection requests name a file or a symbol: a few KiB too.
    let reflection_v1 = compressed!(
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()?
            .max_decoding_message_size(SMALL_REQUEST_BYTES)
    );
    let reflection_v1alpha = compressed!(
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1alpha()?
            .max_decoding_message_size(SMALL_REQUEST_BYTES)
    );
    // A request may carry a message (or an `UpsertDomain` manifest, the larger field) of
    // exactly its limit plus the other fields; a larger one, up to the transport limit, is
    // decoded so the service can name the field limit.
    let limits = Limits {
        max_message_bytes: config.max_message_bytes,
    };
    let decode_limit = limits
        .max_manifest_bytes()
        .saturating_add(REQUEST_OVERHEAD_BYTES)
        .max(TRANSPORT_LIMIT_BYTES);
    let service = compressed!(
        ToolRouterServer::new(ToolRouterService::new(state.clone(), limits))
            .max_decoding_message_size(decode_limit)
    );
    let builder = Server::builder()
        .max_concurrent_streams(streams_per_connection(config.max_concurrent_requests))
        .http2_keepalive_interval(Some(HTTP2_KEEPALIVE.0))
        .http2_keepalive_timeout(Some(HTTP2_KEEPALIVE.1));
    let bound: Vec<(&str, &str)> = config
        .tokens
        .iter()
        .map(|(t, p)| (t.as_str(), p.as_str()))
        .collect();
    let guard = Guard::new(
        config.auth_token.as_deref(),
        &bound,
        config.max_concurrent_requests,
        config.request_timeout,
    );

    // The registry and database are ready (State::new did both), so we are serving.
    reporter
        .set_serving::<ToolRouterServer<ToolRouterService>>()
        .await;
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;

    let (stop_upkeep, upkeep_stopped) = tokio::sync::oneshot::channel::<()>();
    let upkeep = {
        let state = state.clone();
        let period = crate::conversations::upkeep_period(config.conversation_ttl);
        tokio::spawn(async move {
            state
                .maintain(period, async {
                    let _ = upkeep_stopped.await;
                })
                .await;
        })
    };

    // Shutdown: health turns NOT_SERVING first, then the listener closes and the guard
    // refuses new calls; the drain clock starts at the same moment. The server itself (which
    // closes every connection, health callers' too) stops when the calls in flight are done.
    let (draining, drain_started) = tokio::sync::oneshot::channel::<()>();
    let drain_guard = guard.clone();
    let drain_state = state.clone();
    // Whether the calls in flight had all finished when the drain timeout came: if so, only
    // connections that did not close (a peer that ignores GOAWAY) were left.
    let calls_done = Arc::new(AtomicBool::new(false));
    let drain_done = Arc::clone(&calls_done);
    let shutdown = async move {
        shutdown.await;
        reporter
            .set_not_serving::<ToolRouterServer<ToolRouterService>>()
            .await;
        reporter
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        let _ = draining.send(());
        let _ = drain_tx.send(true);
        drain_state.stop_watchers();
        drain_guard.drain().await;
        drain_done.store(true, Ordering::SeqCst);
    };
    let drain_timeout = config.drain_timeout;
    let drain_expired = async move {
        if drain_started.await.is_ok() {
            tokio::time::sleep(drain_timeout).await;
        } else {
            std::future::pending::<()>().await;
        }
    };

    let metrics = config.metrics_listen.map(|_| crate::telemetry::Metrics::new());
    let (stop_metrics, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
    if let (Some(addr), Some(metrics)) = (config.metrics_listen, &metrics) {
        let metrics_listener = TcpListener::bind(addr)
            .await
            .map_err(|e| Error::Config(format!("cannot listen for metrics on {addr}: {e}")))?;
        tracing::info!(addr = %metrics_listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), "serving metrics at /metrics");
        tokio::spawn(crate::telemetry::serve_metrics(
            metrics_listener,
            metrics.clone(),
            state.clone(),
            async {
                let _ = metrics_stopped.await;
            },
        ));
    }

    tracing::info!(
        addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        tls = config.tls_cert.is_some(),
        auth = config.authenticates(),
        "serving"
    );
    let server = builder
        // Outermost, so calls the guard refuses are logged and counted too.
        .layer(crate::telemetry::CallLog::new(metrics))
        .layer(guard)
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(service)
        .serve_with_incoming_shutdown(
            incoming(listener, drain_rx, config.handshake_timeout, tls),
            shutdown,
        );
    let (result, cut) = tokio::select! {
        result = server => (result.map_err(Into::into), false),
        () = drain_expired => {
            if calls_done.load(Ordering::SeqCst) {
                tracing::warn!(
                    ?drain_timeout,
                    "drain timeout reached with no call in flight; closing the connections whose \
                     clients did not close them"
                );
            } else {
                tracing::warn!(?drain_timeout, "drain timeout reached; dropping the calls still in flight");
            }
            (Ok(()), true)
        }
    };
    // The final flush and pool close wait on the database; a call cut at the drain timeout may
    // be what holds it up, so they get a short grace once the drain timeout was reached and
    // the drain timeout otherwise, never less than that grace (a drain timeout of 0 drains
    // nothing, but the flush still gets its turn).
    let cleanup = async {
        let _ = stop_upkeep.send(());
        if let Err(e) = upkeep.await {
            tracing::error!(error = %e, "conversation upkeep task failed");
        }
        state.close().await;
    };
    let _ = stop_metrics.send(());
    let grace = if cut {
        CUT_GRACE
    } else {
        drain_timeout.max(CUT_GRACE)
    };
    if tokio::time::timeout(grace, cleanup).await.is_err() {
        tracing::warn!("the database is still busy at shutdown; exiting without the final idle-clock flush");
    }
    tracing::info!("stopped");
    result
}
