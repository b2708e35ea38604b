//! `serve(listener, state, config, shutdown)`: the gRPC server with the `ToolRouter` service,
//! health and reflection, behind the [`Guard`] (auth, load shedding, timeout), over TLS when
//! configured. The caller owns the listener (tests bind `127.0.0.1:0`) and the shutdown
//! trigger; on shutdown the server reports `NOT_SERVING`, stops accepting, and gives in-flight
//! calls the drain timeout to finish.

use std::future::Future;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Identity, Server, ServerTlsConfig};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::guard::Guard;

use crate::proto::tool_router_server::ToolRouterServer;
use crate::service::ToolRouterService;
use crate::state::State;

/// Bytes allowed in a request beyond the message limit, for the other fields and framing.
const REQUEST_OVERHEAD_BYTES: usize = 4096;

/// The transport's limit on one request. Requests over the field limits but under this one
/// are decoded and answered `INVALID_ARGUMENT` naming the field limit; larger ones are
/// refused before decoding with `RESOURCE_EXHAUSTED`.
pub const TRANSPORT_LIMIT_BYTES: usize = 4 * 1024 * 1024;

/// After the drain timeout cut calls short, how long the final database flush may take.
const CUT_GRACE: Duration = Duration::from_secs(1);

/// How often conversation idle clocks are flushed and idle conversations forgotten.
const UPKEEP_PERIOD: Duration = Duration::from_secs(60);

/// Accepted connections with Nagle's algorithm off: answers are single small writes, and
/// waiting to coalesce them costs a delayed-ACK round (tens of milliseconds) per call.
pub fn incoming(
    listener: TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> + Send + 'static {
    use tokio_stream::StreamExt as _;
    TcpListenerStream::new(listener).map(|conn| {
        if let Ok(stream) = &conn
            && let Err(e) = stream.set_nodelay(true)
        {
            tracing::warn!(error = %e, "cannot set TCP_NODELAY");
        }
        conn
    })
}

/// The TLS configuration for `config`, if it names a certificate and key.
///
/// # Errors
/// `Config` naming a file that cannot be read.
pub fn tls(config: &Config) -> Result<Option<ServerTlsConfig>> {
    let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) else {
        return Ok(None);
    };
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|e| Error::Config(format!("cannot read TLS file {}: {e}", p.display())))
    };
    Ok(Some(
        ServerTlsConfig::new().identity(Identity::from_pem(read(cert)?, read(key)?)),
    ))
}

/// Serves until `shutdown` resolves, then drains in-flight calls (for at most the drain
/// timeout) and closes the database.
///
/// # Errors
/// Unreadable or invalid TLS files, a transport failure, or a reflection descriptor that
/// cannot be decoded.
pub async fn serve(
    listener: TcpListener,
    state: State,
    config: &Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (reporter, health) = tonic_health::server::health_reporter();
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    // A request may carry a message of exactly the limit plus the other fields; a larger one,
    // up to the transport limit, is decoded so the service can name the field limit.
    let decode_limit = (state.max_message_bytes() + REQUEST_OVERHEAD_BYTES).max(TRANSPORT_LIMIT_BYTES);
    use tonic::codec::CompressionEncoding;
    let service = ToolRouterServer::new(ToolRouterService::new(state.clone()))
        .max_decoding_message_size(decode_limit)
        // gzip both ways: accepted on requests, used for answers when the client accepts it.
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Gzip);
    let mut builder = Server::builder();
    if let Some(tls) = tls(config)? {
        builder = builder.tls_config(tls)?;
    }
    let guard = Guard::new(
        config.auth_token.as_deref(),
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
        tokio::spawn(async move {
            state
                .maintain(UPKEEP_PERIOD, async {
                    let _ = upkeep_stopped.await;
                })
                .await;
        })
    };

    // Shutdown: health turns NOT_SERVING first, then the server stops accepting; the drain
    // clock starts at the same moment.
    let (draining, drain_started) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        shutdown.await;
        reporter
            .set_not_serving::<ToolRouterServer<ToolRouterService>>()
            .await;
        reporter
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        let _ = draining.send(());
    };
    let drain_timeout = config.drain_timeout;
    let drain_expired = async move {
        if drain_started.await.is_ok() {
            tokio::time::sleep(drain_timeout).await;
        } else {
            std::future::pending::<()>().await;
        }
    };

    let metrics = crate::telemetry::Metrics::new();
    let (stop_metrics, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
    if let Some(addr) = config.metrics_listen {
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
        auth = config.auth_token.is_some(),
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
        .serve_with_incoming_shutdown(incoming(listener), shutdown);
    let (result, cut) = tokio::select! {
        result = server => (result.map_err(Into::into), false),
        () = drain_expired => {
            tracing::warn!(?drain_timeout, "drain timeout reached; dropping the calls still in flight");
            (Ok(()), true)
        }
    };
    // The final flush and pool close wait on the database; a call cut at the drain timeout may
    // be what holds it up, so they get a short grace after a cut and the drain timeout otherwise.
    let cleanup = async {
        let _ = stop_upkeep.send(());
        if let Err(e) = upkeep.await {
            tracing::error!(error = %e, "conversation upkeep task failed");
        }
        state.close().await;
    };
    let _ = stop_metrics.send(());
    let grace = if cut { CUT_GRACE } else { drain_timeout };
    if tokio::time::timeout(grace, cleanup).await.is_err() {
        tracing::warn!("the database is still busy at shutdown; exiting without the final idle-clock flush");
    }
    tracing::info!("stopped");
    result
}
