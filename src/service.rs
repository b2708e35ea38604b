//! The tonic `ToolRouter` service: checks requests, calls the shared [`State`], and turns
//! domain types into proto messages. Errors become `Status` in one place (`error.rs`).

use tonic::{Request, Response, Status};

use crate::error::{Error, Result};
use crate::proto::{self, tool_router_server::ToolRouter};
use crate::registry::{Domain, DomainId, Registry, Tool};
use crate::router::Reason;
use crate::state::{State, View};
use crate::telemetry::{CallSummary, conversation_hash};

/// Longest accepted `conversation_id` or `group_name`, in bytes.
pub const MAX_CONVERSATION_ID_BYTES: usize = 256;

/// The gRPC service; cloning is shallow.
#[derive(Clone)]
pub struct ToolRouterService {
    state: State,
}

impl ToolRouterService {
    /// A service over the shared state.
    pub fn new(state: State) -> Self {
        ToolRouterService { state }
    }

    fn check_message(&self, message: &str) -> Result<()> {
        self.check_text(message, "message")
    }

    /// Checks a free-text field against `max_message_bytes`.
    fn check_text(&self, text: &str, field: &str) -> Result<()> {
        let limit = self.state.max_message_bytes();
        if text.len() > limit {
            return Err(Error::InvalidArgument(format!(
                "'{field}' is {} bytes, over the limit of {limit} bytes (max_message_bytes).",
                text.len()
            )));
        }
        Ok(())
    }
}

/// Checks a conversation id; `Ok(None)` when it is empty or whitespace-only.
fn conversation_id(id: &str) -> Result<Option<&str>> {
    if id.trim().is_empty() {
        return Ok(None);
    }
    bounded(id, "conversation_id").map(Some)
}

/// Checks a name-like field: at most [`MAX_CONVERSATION_ID_BYTES`] bytes, no control
/// characters (Unicode category Cc).
fn bounded<'a>(value: &'a str, name: &str) -> Result<&'a str> {
    if value.len() > MAX_CONVERSATION_ID_BYTES {
        return Err(Error::InvalidArgument(format!(
            "'{name}' is {} bytes, over the limit of {MAX_CONVERSATION_ID_BYTES} bytes.",
            value.len()
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(Error::InvalidArgument(format!(
            "'{name}' must not contain control characters."
        )));
    }
    Ok(value)
}

fn required<'a>(value: &'a str, name: &str) -> Result<&'a str> {
    if value.trim().is_empty() {
        return Err(Error::InvalidArgument(format!(
            "Required parameter '{name}' is missing."
        )));
    }
    Ok(value)
}

fn tool(domain: &str, t: &Tool) -> proto::Tool {
    proto::Tool {
        name: t.name.clone(),
        description: t.description.clone(),
        input_schema_json: t.input_schema_json.clone(),
        domain: domain.to_string(),
        tier: t.tier.as_str().to_string(),
    }
}

fn domain_tools(d: &Domain) -> impl Iterator<Item = proto::Tool> + '_ {
    d.tools.iter().map(move |t| tool(&d.name, t))
}

fn group(view: &View, id: DomainId) -> proto::Group {
    let d = view.registry.domain(id);
    proto::Group {
        name: d.name.clone(),
        display_name: d.display_name.clone(),
        description: d.description.clone(),
        tool_count: d.tools.len() as u32,
        core: d.core,
        active: view.activation.is_active(id),
        settings_keys: d.settings_keys.clone(),
        keywords: d.keywords.clone(),
    }
}

fn groups(view: &View) -> Vec<proto::Group> {
    (0..view.registry.domains().len())
        .map(|d| group(view, d))
        .collect()
}

fn reason(r: Reason) -> proto::Reason {
    match r {
        Reason::Core => proto::Reason::Core,
        Reason::Keyword => proto::Reason::Keyword,
        Reason::Search => proto::Reason::Search,
        Reason::Loaded => proto::Reason::Loaded,
        Reason::Sticky => proto::Reason::Sticky,
        Reason::Fallback => proto::Reason::Fallback,
    }
}

fn domain_names(registry: &Registry, ids: impl Iterator<Item = DomainId>) -> Vec<String> {
    ids.map(|d| registry.domain(d).name.clone()).collect()
}

#[tonic::async_trait]
impl ToolRouter for ToolRouterService {
    async fn route(
        &self,
        request: Request<proto::RouteRequest>,
    ) -> Result<Response<proto::RouteResponse>, Status> {
        let req = request.into_inner();
        self.check_message(&req.message)?;
        let conv = conversation_id(&req.conversation_id)?;
        let (view, decision) = self.state.route(&req.message, conv, req.dry_run).await?;
        tracing::debug!(
            message_bytes = req.message.len(),
            domains = decision.domains.len(),
            fallback = decision.fallback,
            "routed"
        );
        let registry = &view.registry;
        // For the call log and the metrics (the telemetry layer reads it off the response).
        let summary = CallSummary {
            conversation: conv.map(conversation_hash),
            tools: Some(decision.tool_count(registry, &view.activation)),
            domains: decision
                .domains
                .iter()
                .map(|inc| (registry.domain(inc.domain).name.clone(), inc.reason.as_str()))
                .collect(),
            fallback: Some(decision.fallback),
            group: None,
        };
        let mut tools = Vec::with_capacity(decision.tool_count(registry, &view.activation));
        tools.extend(
            decision
                .tools(registry, &view.activation)
                .map(|(d, t)| tool(d, t)),
        );
        let mut response = Response::new(proto::RouteResponse {
            tools,
            domains: decision
                .domains
                .iter()
                .map(|inc| {
                    let search = (inc.reason == Reason::Search)
                        .then(|| decision.search_hit(inc.domain))
                        .flatten();
                    proto::DomainDecision {
                        domain: registry.domain(inc.domain).name.clone(),
                        reason: reason(inc.reason).into(),
                        matched_keywords: decision
                            .matched(inc)
                            .iter()
                            .map(|&k| registry.keyword(k).to_string())
                            .collect(),
                        matched_terms: search.map(|h| h.terms.clone()).unwrap_or_default(),
                        score: search.map_or(0.0, |h| h.score),
                    }
                })
                .collect(),
            fallback: decision.fallback,
            registry_version: registry.version(),
        });
        response.extensions_mut().insert(summary);
        Ok(response)
    }

    async fn load_tool_group(
        &self,
        request: Request<proto::LoadToolGroupRequest>,
    ) -> Result<Response<proto::LoadToolGroupResponse>, Status> {
        let req = request.into_inner();
        let id = required(&req.conversation_id, "conversation_id")?;
        let group_name = required(&req.group_name, "group_name")?;
        let id = conversation_id(id)?.unwrap_or(id);
        let group_name = bounded(group_name, "group_name")?;
        let (view, load) = self.state.load_group(id, group_name).await?;
        let d = view.registry.domain(load.domain);
        tracing::debug!(group = %d.name, already_loaded = load.already_loaded, "group loaded");
        let mut response = Response::new(proto::LoadToolGroupResponse {
            group: Some(group(&view, load.domain)),
            tools: domain_tools(d).collect(),
            already_loaded: load.already_loaded,
            text: crate::router::load_text(&view.registry, load.domain),
        });
        response.extensions_mut().insert(CallSummary {
            conversation: Some(conversation_hash(id)),
            tools: Some(d.tools.len()),
            group: Some(d.name.clone()),
            ..CallSummary::default()
        });
        Ok(response)
    }

    async fn list_groups(
        &self,
        _request: Request<proto::ListGroupsRequest>,
    ) -> Result<Response<proto::ListGroupsResponse>, Status> {
        let view = self.state.view().await;
        Ok(Response::new(proto::ListGroupsResponse {
            groups: groups(&view),
            prompt_section: view.activation.prompt_section(&view.registry),
            registry_version: view.registry.version(),
        }))
    }

    async fn list_all_tools(
        &self,
        _request: Request<proto::ListAllToolsRequest>,
    ) -> Result<Response<proto::ListAllToolsResponse>, Status> {
        let view = self.state.view().await;
        let domains = view.registry.domains();
        // Core domains first, then the rest; each part is already by name.
        let ordered = domains
            .iter()
            .filter(|d| d.core)
            .chain(domains.iter().filter(|d| !d.core));
        Ok(Response::new(proto::ListAllToolsResponse {
            tools: ordered.flat_map(domain_tools).collect(),
            groups: groups(&view),
            registry_version: view.registry.version(),
        }))
    }

    async fn invalidate_settings(
        &self,
        _request: Request<proto::InvalidateSettingsRequest>,
    ) -> Result<Response<proto::InvalidateSettingsResponse>, Status> {
        let view = self.state.invalidate_settings().await?;
        let active_domains = domain_names(&view.registry, view.activation.active());
        tracing::info!(active = active_domains.len(), "settings invalidated");
        Ok(Response::new(proto::InvalidateSettingsResponse {
            active_domains,
        }))
    }

    async fn reset_conversation(
        &self,
        request: Request<proto::ResetConversationRequest>,
    ) -> Result<Response<proto::ResetConversationResponse>, Status> {
        let req = request.into_inner();
        let id = required(&req.conversation_id, "conversation_id")?;
        let id = conversation_id(id)?.unwrap_or(id);
        self.state.reset_conversation(id).await?;
        let mut response = Response::new(proto::ResetConversationResponse {});
        response.extensions_mut().insert(CallSummary {
            conversation: Some(conversation_hash(id)),
            ..CallSummary::default()
        });
        Ok(response)
    }

    async fn search_tools(
        &self,
        request: Request<proto::SearchToolsRequest>,
    ) -> Result<Response<proto::SearchToolsResponse>, Status> {
        let req = request.into_inner();
        let query = required(&req.query, "query")?;
        self.check_text(query, "query")?;
        let conv = conversation_id(&req.conversation_id)?;
        let load_into = match (req.load, conv) {
            (false, _) => None,
            (true, Some(id)) => Some(id),
            (true, None) => {
                return Err(Error::InvalidArgument(
                    "Required parameter 'conversation_id' is missing (needed with 'load').".to_string(),
                )
                .into());
            }
        };
        let limit = match req.limit as usize {
            0 => SEARCH_LIMIT.0,
            n => n.min(SEARCH_LIMIT.1),
        };
        let found = self.state.search_tools(query, limit, load_into).await?;
        let view = &found.view;
        let hits: Vec<proto::ToolHit> = found
            .hits
            .iter()
            .map(|h| {
                let d = view.registry.domain(h.domain);
                let active = view.activation.is_active(h.domain);
                proto::ToolHit {
                    tool: Some(tool(&d.name, &d.tools[h.tool])),
                    score: h.score,
                    matched_terms: h.terms.clone(),
                    active,
                    missing_settings_keys: if active {
                        Vec::new()
                    } else {
                        d.settings_keys.clone()
                    },
                }
            })
            .collect();
        let loaded_groups = domain_names(&view.registry, found.loaded.iter().copied());
        if !loaded_groups.is_empty() {
            tracing::info!(groups = ?loaded_groups, "groups loaded by search");
        }
        Ok(Response::new(proto::SearchToolsResponse {
            text: search_text(view, query, &hits, &loaded_groups),
            hits,
            loaded_groups,
            registry_version: view.registry.version(),
        }))
    }

    async fn reload_registry(
        &self,
        _request: Request<proto::ReloadRegistryRequest>,
    ) -> Result<Response<proto::ReloadRegistryResponse>, Status> {
        let r = self.state.reload().await?;
        Ok(Response::new(proto::ReloadRegistryResponse {
            registry_version: r.registry_version,
            domains: u32::try_from(r.domains).unwrap_or(u32::MAX),
            tools: u32::try_from(r.tools).unwrap_or(u32::MAX),
        }))
    }

    async fn describe_server(
        &self,
        _request: Request<proto::DescribeServerRequest>,
    ) -> Result<Response<proto::DescribeServerResponse>, Status> {
        let d = self.state.describe();
        Ok(Response::new(proto::DescribeServerResponse {
            version: env!("CARGO_PKG_VERSION").to_string(),
            registry_version: d.registry_version,
            domains: u32::try_from(d.domains).unwrap_or(u32::MAX),
            tools: u32::try_from(d.tools).unwrap_or(u32::MAX),
            database: d.database,
            database_path: d
                .database_path
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            settings_age_seconds: d.settings_age.as_secs_f64(),
            uptime_seconds: d.uptime.as_secs_f64(),
            config_toml: d.config_toml,
        }))
    }
}

/// Default and largest `SearchTools.limit` (SPEC §5); a larger limit is cut to the largest.
const SEARCH_LIMIT: (usize, usize) = (5, 20);

/// The `text` of a `SearchTools` answer, for the model to read.
fn search_text(view: &View, query: &str, hits: &[proto::ToolHit], loaded: &[String]) -> String {
    if hits.is_empty() {
        let active = domain_names(&view.registry, view.activation.loadable().iter().copied());
        return format!(
            "No tools matched '{}'. Active groups: {}.",
            query.trim(),
            if active.is_empty() {
                "none".to_string()
            } else {
                active.join(", ")
            }
        );
    }
    let mut text = format!(
        "Found {} {}:",
        hits.len(),
        if hits.len() == 1 { "tool" } else { "tools" }
    );
    for h in hits {
        let Some(t) = &h.tool else { continue };
        text.push_str(&format!("\n- {} ({}): {}", t.name, t.domain, t.description));
        if !h.active {
            text.push_str(&format!(
                " [not configured: set one of {}]",
                h.missing_settings_keys.join(", ")
            ));
        }
    }
    if !loaded.is_empty() {
        text.push_str(&format!("\nLoaded for this conversation: {}.", loaded.join(", ")));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversation_ids_are_checked_for_length_and_control_characters() {
        assert_eq!(conversation_id("").unwrap(), None);
        assert_eq!(conversation_id(" \t").unwrap(), None);
        assert_eq!(conversation_id("abc").unwrap(), Some("abc"));
        assert!(
            conversation_id(&"x".repeat(256)).is_ok(),
            "exactly the limit is accepted"
        );
        let long = conversation_id(&"x".repeat(257)).unwrap_err().to_string();
        assert!(long.contains("256 bytes"), "{long}");
        let ctrl = conversation_id("a\u{7}b").unwrap_err().to_string();
        assert!(ctrl.contains("control characters"), "{ctrl}");
        assert!(conversation_id("a\u{85}b").is_err(), "C1 controls are Cc too");
    }
}
