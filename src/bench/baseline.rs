//! The transport floor: a server with the same `Route` RPC that answers every request with
//! one prebuilt `RouteResponse`, of the size the real daemon returns for the same messages.
//! Measuring it beside the daemon separates the cost of routing from the cost of gRPC.

use std::sync::Arc;

use prost::Message as _;
use tonic::{Request, Response, Status};

use crate::proto::{self, tool_router_server::ToolRouter};

/// A `ToolRouter` whose `Route` returns a fixed answer; every other RPC is unimplemented.
#[derive(Clone)]
pub struct BaselineService {
    response: Arc<proto::RouteResponse>,
}

impl BaselineService {
    /// Picks, among the real daemon's answers to the messages, the one of median encoded
    /// size, and serves it for every request.
    pub fn from_answers(mut answers: Vec<proto::RouteResponse>) -> Option<BaselineService> {
        answers.sort_by_key(|r| r.encoded_len());
        let mid = answers.len() / 2;
        let response = answers.into_iter().nth(mid)?;
        Some(BaselineService {
            response: Arc::new(response),
        })
    }

    /// The encoded size of the fixed answer.
    pub fn response_bytes(&self) -> usize {
        self.response.encoded_len()
    }
}

fn unimplemented<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("the baseline server only answers Route"))
}

#[tonic::async_trait]
impl ToolRouter for BaselineService {
    async fn route(
        &self,
        _request: Request<proto::RouteRequest>,
    ) -> Result<Response<proto::RouteResponse>, Status> {
        Ok(Response::new((*self.response).clone()))
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
    ) -> Result<Response<proto::ListAllToolsResponse>, Status> {
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
}
