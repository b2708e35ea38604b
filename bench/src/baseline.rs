//! The transport floor: a server with the same `Route` RPC that answers without routing,
//! with responses prebuilt from the real daemon's answers: the answer the daemon gave for
//! the same message text when there is one, else the one of mean size. The bytes on the
//! wire then match the daemon's, request for request, and only the routing differs. Each
//! answer is encoded once, ahead of time, and written as it is: the fastest a server can
//! send those bytes.
//! Measuring it beside the daemon separates the cost of routing from the cost of gRPC
//! (`toolrouter-bench baseline-server`, driven by `benches/grpc.sh`).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use prost::Message as _;
use tonic::{Request, Response, Status};
use toolrouter::Error;
use toolrouter::config::Config;
use toolrouter::proto;
use toolrouter::registry::Registry;
use toolrouter::service::{Limits, ToolRouterService};
use toolrouter::state::State;
use toolrouter::wire::{self, Spliced, tool_router_server::ToolRouter};

/// Serves the baseline on `config.listen` until Ctrl-C or SIGTERM, with health: the answers
/// are what the daemon, configured by `config`, gives for `messages`.
///
/// # Errors
/// Manifests, database or listening address that cannot be used, a message the daemon
/// refuses, or no messages at all.
pub async fn serve(config: &Config, messages: Vec<String>) -> toolrouter::Result<()> {
    // The daemon's allocator settings, so the floor's buffers are reused the same way.
    toolrouter::server::keep_freed_buffers();
    let registry = Registry::load(&config.manifests)?;
    // The daemon's own answers, through the real service, are what the baseline sends.
    let state = State::new(registry, config).await?;
    let limits = Limits {
        max_message_bytes: config.max_message_bytes,
    };
    let real = ToolRouterService::new(state.clone(), limits);
    let mut answers = Vec::new();
    // Native answers, and the OpenAI chat format's (`tools_json`), for the same messages.
    for format in [proto::Format::Unspecified, proto::Format::OpenaiChat] {
        for message in &messages {
            let req = Request::new(proto::RouteRequest {
                message: message.clone(),
                format: format.into(),
                ..proto::RouteRequest::default()
            });
            let answer = real
                .route(req)
                .await
                .map_err(|s| Error::Config(format!("the daemon refuses {message:?}: {}", s.message())))?;
            let encoded = Bytes::from(answer.into_inner().encode_to_vec());
            answers.push(((i32::from(format), message.clone()), encoded));
        }
    }
    state.close().await;
    let baseline = BaselineService::from_answers(answers)
        .ok_or_else(|| Error::Config("no messages to build the baseline answer from".into()))?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| Error::Io {
            context: format!("cannot listen on {}", config.listen),
            source,
        })?;
    tracing::info!(listen = %config.listen, response_bytes = baseline.response_bytes(), "baseline serving");
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    tonic::transport::Server::builder()
        .add_service(health)
        .add_service(wire::tool_router_server::ToolRouterServer::new(baseline))
        // No drain phase here: the shutdown signal stops it at once.
        .serve_with_incoming_shutdown(
            toolrouter::server::incoming(
                listener,
                tokio::sync::watch::channel(false).1,
                config.handshake_timeout,
                None,
            ),
            toolrouter::cli::serve::shutdown_signal(),
        )
        .await
        .map_err(|e| Error::Unavailable(format!("server failed: {e}")))
}

/// A `ToolRouter` whose `Route` returns prebuilt answers; every other RPC is unimplemented.
#[derive(Clone)]
pub struct BaselineService {
    /// Encoded answers by (requested format, message).
    by_message: Arc<HashMap<(i32, String), Bytes>>,
    response: Bytes,
}

impl BaselineService {
    /// Prebuilds the answers (encoded `RouteResponse`s): the daemon's answer per message,
    /// and as the default the one whose size is closest to their mean.
    pub fn from_answers(answers: Vec<((i32, String), Bytes)>) -> Option<BaselineService> {
        let n = answers.len();
        let mean = answers
            .iter()
            .map(|(_, r)| r.len())
            .sum::<usize>()
            .checked_div(n)?;
        let response = answers
            .iter()
            .map(|(_, r)| r)
            .min_by_key(|r| r.len().abs_diff(mean))?
            .clone();
        Some(BaselineService {
            by_message: Arc::new(answers.into_iter().collect()),
            response,
        })
    }

    /// The encoded size of the default answer.
    pub fn response_bytes(&self) -> usize {
        self.response.len()
    }
}

fn unimplemented<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("the baseline server only answers Route"))
}

#[tonic::async_trait]
impl ToolRouter for BaselineService {
    async fn route(
        &self,
        request: Request<proto::RouteRequest>,
    ) -> Result<Response<wire::RouteResponse>, Status> {
        let r = request.into_inner();
        let prebuilt = self
            .by_message
            .get(&(r.format, r.message))
            .unwrap_or(&self.response);
        // An encoded message is a run of field entries.
        Ok(Response::new(
            Spliced::default().with_entries(vec![prebuilt.clone()]),
        ))
    }

    async fn load_tool_group(
        &self,
        _request: Request<proto::LoadToolGroupRequest>,
    ) -> Result<Response<proto::LoadToolGroupResponse>, Status> {
        unimplemented()
    }

    async fn list_groups(
        &self,
        _request: Request<proto::ListGroupsRequest>,
    ) -> Result<Response<proto::ListGroupsResponse>, Status> {
        unimplemented()
    }

    async fn list_all_tools(
        &self,
        _request: Request<proto::ListAllToolsRequest>,
    ) -> Result<Response<wire::ListAllToolsResponse>, Status> {
        unimplemented()
    }

    async fn invalidate_settings(
        &self,
        _request: Request<proto::InvalidateSettingsRequest>,
    ) -> Result<Response<proto::InvalidateSettingsResponse>, Status> {
        unimplemented()
    }

    async fn reset_conversation(
        &self,
        _request: Request<proto::ResetConversationRequest>,
    ) -> Result<Response<proto::ResetConversationResponse>, Status> {
        unimplemented()
    }

    async fn reload_registry(
        &self,
        _: Request<proto::ReloadRegistryRequest>,
    ) -> Result<Response<proto::ReloadRegistryResponse>, Status> {
        unimplemented()
    }

    async fn search_tools(
        &self,
        _: Request<proto::SearchToolsRequest>,
    ) -> Result<Response<proto::SearchToolsResponse>, Status> {
        unimplemented()
    }

    async fn describe_server(
        &self,
        _: Request<proto::DescribeServerRequest>,
    ) -> Result<Response<proto::DescribeServerResponse>, Status> {
        unimplemented()
    }

    async fn check_tool_call(
        &self,
        _: Request<proto::CheckToolCallRequest>,
    ) -> Result<Response<proto::CheckToolCallResponse>, Status> {
        unimplemented()
    }

    type WatchRegistryStream = tokio_stream::Empty<Result<proto::RegistryEvent, Status>>;

    async fn watch_registry(
        &self,
        _: Request<proto::WatchRegistryRequest>,
    ) -> Result<Response<Self::WatchRegistryStream>, Status> {
        unimplemented()
    }

    async fn upsert_domain(
        &self,
        _: Request<proto::UpsertDomainRequest>,
    ) -> Result<Response<proto::UpsertDomainResponse>, Status> {
        unimplemented()
    }

    async fn delete_domain(
        &self,
        _: Request<proto::DeleteDomainRequest>,
    ) -> Result<Response<proto::DeleteDomainResponse>, Status> {
        unimplemented()
    }
}
