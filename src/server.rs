//! `serve(listener, state, shutdown)`: the gRPC server with the `ToolRouter` service, health
//! and reflection. The caller owns the listener (tests bind `127.0.0.1:0`) and the shutdown
//! trigger; on shutdown the server stops accepting and finishes in-flight calls.

use std::future::Future;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;

use crate::proto::tool_router_server::ToolRouterServer;
use crate::service::ToolRouterService;
use crate::state::State;

/// Bytes allowed in a request beyond the message limit, for the other fields and framing.
const REQUEST_OVERHEAD_BYTES: usize = 4096;

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

/// Serves until `shutdown` resolves, then drains in-flight calls and closes the database.
///
/// # Errors
/// A transport failure or a reflection descriptor that cannot be decoded.
pub async fn serve(
    listener: TcpListener,
    state: State,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (reporter, health) = tonic_health::server::health_reporter();
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    // A request may carry a message of exactly the limit plus the other fields; anything
    // larger is refused by the transport before it is decoded.
    let decode_limit = state.max_message_bytes() + REQUEST_OVERHEAD_BYTES;
    let service =
        ToolRouterServer::new(ToolRouterService::new(state.clone())).max_decoding_message_size(decode_limit);

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

    tracing::info!(addr = ?listener.local_addr().ok(), "serving");
    let result = Server::builder()
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(service)
        .serve_with_incoming_shutdown(incoming(listener), shutdown)
        .await;
    let _ = stop_upkeep.send(());
    if let Err(e) = upkeep.await {
        tracing::error!(error = %e, "conversation upkeep task failed");
    }
    state.close().await;
    tracing::info!("stopped");
    Ok(result?)
}
