//! The tonic `ToolRouter` service: checks requests, calls the shared [`State`], and turns
//! domain types into proto messages. Errors become `Status` in one place (`error.rs`).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tonic::{Request, Response, Status};

use crate::error::{Error, Result};
use crate::guard::BoundProfile;
use crate::proto;
use crate::registry::{DomainId, Registry};
use crate::render::{Format, assemble, native};
use crate::router::{Decision, ProfileId, Reason, Refusal};
use crate::state::{CallCheck, Loaded, RouteOptions, Routed, Scope, State};
use crate::telemetry::{CallSummary, RoutedDomains, conversation_hash};
use crate::wire::{self, Spliced, tool_router_server::ToolRouter};

/// Longest accepted `conversation_id` or `group_name`, in bytes.
pub(crate) const MAX_CONVERSATION_ID_BYTES: usize = 256;

/// What the service accepts, from the configuration.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest accepted `message` or `query`, in bytes.
    pub max_message_bytes: usize,
}

/// `UpsertDomain.manifest_json` may be this many times `max_message_bytes` (1 MiB by
/// default): a manifest carries whole JSON schemas, so it outgrows a chat message, but it
/// stays bounded because it is parsed and validated in full, then kept in memory and stored.
pub(crate) const MANIFEST_BYTES_PER_MESSAGE_BYTE: usize = 16;

/// The status that ends a `WatchRegistry` stream when the daemon starts draining.
pub const WATCH_ENDED_BY_SHUTDOWN: &str =
    "The daemon is shutting down; watch again (another replica, or this one once it is back).";

impl Limits {
    /// Longest accepted `UpsertDomain.manifest_json`, in bytes.
    pub(crate) fn max_manifest_bytes(self) -> usize {
        self.max_message_bytes
            .saturating_mul(MANIFEST_BYTES_PER_MESSAGE_BYTE)
    }
}

/// The gRPC service; cloning is shallow.
#[derive(Clone)]
pub struct ToolRouterService {
    state: State,
    limits: Limits,
}

impl ToolRouterService {
    /// A service over the shared state.
    pub fn new(state: State, limits: Limits) -> Self {
        ToolRouterService { state, limits }
    }

    /// Checks a free-text field against `max_message_bytes`.
    fn check_text(&self, text: &str, field: &'static str) -> Result<()> {
        let limit = self.limits.max_message_bytes;
        if text.len() > limit {
            return Err(Error::MessageTooLong {
                field,
                len: text.len(),
                limit,
            });
        }
        Ok(())
    }

    /// The profile a request names (empty: its auth token's, or none), checked.
    fn profile(&self, extensions: &tonic::Extensions, named: &str) -> Result<Option<ProfileId>> {
        let bound = extensions.get::<BoundProfile>();
        self.state.profile(named, bound.map(|b| &*b.0))
    }
}

/// A request's `conversation_id`, checked: at most [`MAX_CONVERSATION_ID_BYTES`] bytes and
/// no control characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ConversationId<'a>(&'a str);

impl<'a> ConversationId<'a> {
    const FIELD: &'static str = "conversation_id";

    /// For requests where a conversation is optional: empty or spaces only is none; blank
    /// with a control character (a tab, a line break) is refused like any id holding one,
    /// since a caller that sends it meant some conversation.
    fn optional(raw: &'a str) -> Result<Option<Self>> {
        if raw.trim().is_empty() && !raw.chars().any(char::is_control) {
            return Ok(None);
        }
        Self::checked(raw).map(Some)
    }

    /// For requests that need one: empty or whitespace-only is a missing parameter.
    fn required(raw: &'a str) -> Result<Self> {
        if raw.trim().is_empty() {
            return Err(Error::MissingParameter { field: Self::FIELD });
        }
        Self::checked(raw)
    }

    fn checked(raw: &'a str) -> Result<Self> {
        let id = bounded(raw, Self::FIELD)?;
        crate::telemetry::note_conversation(id);
        Ok(ConversationId(id))
    }

    fn as_str(self) -> &'a str {
        self.0
    }
}

/// Checks a name-like field: at most [`MAX_CONVERSATION_ID_BYTES`] bytes, no control
/// characters (Unicode category Cc).
fn bounded<'a>(value: &'a str, field: &'static str) -> Result<&'a str> {
    if value.len() > MAX_CONVERSATION_ID_BYTES {
        return Err(Error::NameTooLong {
            field,
            len: value.len(),
            limit: MAX_CONVERSATION_ID_BYTES,
        });
    }
    if value.chars().any(char::is_control) {
        return Err(Error::ControlCharacters { field });
    }
    Ok(value)
}

/// A field that must not be empty or whitespace-only.
fn required<'a>(value: &'a str, field: &'static str) -> Result<&'a str> {
    if value.trim().is_empty() {
        return Err(Error::MissingParameter { field });
    }
    Ok(value)
}

/// A request's `format`: `None` for native `Tool` messages only.
fn format(raw: i32) -> Result<Option<Format>> {
    use proto::Format as F;
    match F::try_from(raw) {
        Ok(F::Unspecified) => Ok(None),
        Ok(F::OpenaiChat) => Ok(Some(Format::OpenAiChat)),
        Ok(F::OpenaiResponses) => Ok(Some(Format::OpenAiResponses)),
        Ok(F::Anthropic) => Ok(Some(Format::Anthropic)),
        Ok(F::Gemini) => Ok(Some(Format::Gemini)),
        Ok(F::Mcp) => Ok(Some(Format::Mcp)),
        Err(_) => Err(Error::UnknownEnumValue {
            field: "format",
            value: raw,
        }),
    }
}

/// The format tokens are counted in: the requested one, or OpenAI chat for native answers.
fn counted(format: Option<Format>) -> Format {
    format.unwrap_or(Format::OpenAiChat)
}

/// An answer whose tools are `pieces`: native `Tool` entries, or with a format the pieces
/// of `tools_json` (field `tools_json`).
fn spliced<M>(message: M, format: Option<Format>, tools_json: u32, pieces: Vec<Bytes>) -> Spliced<M> {
    match format {
        None => Spliced::new(message).with_entries(pieces),
        Some(_) => Spliced::new(message).with_array(tools_json, pieces),
    }
}

/// A domain's tools the consumer sees, native.
fn domain_tools<'a>(scope: Scope<'a>, d: DomainId) -> impl Iterator<Item = proto::Tool> + 'a {
    let registry = &scope.view.registry;
    let name = registry.domain(d).name.as_str();
    scope
        .activation
        .visible_tools(registry, d)
        .map(move |t| native(name, t))
}

/// A group with the tools the consumer sees.
fn group(scope: Scope<'_>, id: DomainId) -> proto::Group {
    let d = scope.view.registry.domain(id);
    proto::Group {
        name: d.name.clone(),
        display_name: d.display_name.clone(),
        description: d.description.clone(),
        tool_count: scope.activation.visible_count(&scope.view.registry, id) as u32,
        core: d.core,
        active: scope.activation.is_active(id),
        settings_keys: d.settings_keys.clone(),
        keywords: d.keywords.clone(),
        tokens: scope.domain_tokens(id, Format::OpenAiChat),
    }
}

/// The groups the consumer sees, by name.
fn groups(scope: Scope<'_>) -> Vec<proto::Group> {
    scope
        .view
        .registry
        .domain_ids()
        .filter(|&d| scope.activation.is_visible(d))
        .map(|d| group(scope, d))
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

/// The parts of a `Route` answer that follow from its decision, the consumer's scope and the
/// format alone (so a fallback's are built once per view: see [`Scope::answer_parts`]).
struct Parts {
    /// The included domains and their reasons, for the call log and the metrics.
    domains: Arc<RoutedDomains>,
    /// The `DomainDecision` entries, encoded.
    decisions: Bytes,
    /// The tokens of the tools sent: the meta-tools' plus each decision's.
    tokens: u32,
    /// How many tools are sent.
    tool_count: usize,
    /// The tools: native `Tool` entries, or with a format the pieces of `tools_json`.
    pieces: Vec<Bytes>,
}

impl Parts {
    fn new(scope: Scope<'_>, decision: &Decision, format: Option<Format>) -> Parts {
        let registry = &scope.view.registry;
        let meta = scope.meta_rendered(counted(format));
        // The decisions are written straight into one buffer, spliced in like the tools.
        let mut tokens = meta.tokens(0..meta.len());
        let mut decisions = BytesMut::with_capacity(decision.domains.len() * 32);
        for inc in &decision.domains {
            let search = (inc.reason == Reason::Search)
                .then(|| decision.search_hit(inc.domain))
                .flatten();
            let domain_tokens = scope.domain_tokens(inc.domain, counted(format));
            tokens += domain_tokens;
            wire::Decision {
                domain: &registry.domain(inc.domain).name,
                reason: reason(inc.reason),
                matched_keywords: decision.matched(inc).iter().map(|&k| registry.keyword(k)),
                matched_terms: search.map_or(&[], |h| &h.terms),
                score: search.map_or(0.0, |h| h.score),
                tokens: domain_tokens,
            }
            .put(&mut decisions);
        }
        // The tools are written from the bytes encoded or rendered once per registry (and
        // per activation for the meta-tools).
        let mut pieces = Vec::with_capacity(decision.domains.len() + 1);
        if format.is_none() {
            pieces.push(scope.meta_native());
            for inc in &decision.domains {
                scope.push_native(inc.domain, &mut pieces);
            }
        } else {
            pieces.push(meta.all());
            for inc in &decision.domains {
                scope.push_pieces(inc.domain, counted(format), &mut pieces);
            }
        }
        if decision.fallback {
            // Served again for every message that matches nothing: one piece copies in one
            // go (pieces of either kind are runs that may be joined).
            pieces = vec![Bytes::from(pieces.concat())];
        }
        let domains = decision
            .domains
            .iter()
            .map(|inc| (inc.domain, inc.reason))
            .collect();
        Parts {
            domains: Arc::new(RoutedDomains::new(Arc::clone(registry), domains)),
            decisions: decisions.freeze(),
            tokens,
            tool_count: decision.tool_count(registry, scope.activation),
            pieces,
        }
    }
}

#[tonic::async_trait]
impl ToolRouter for ToolRouterService {
    async fn route(
        &self,
        request: Request<proto::RouteRequest>,
    ) -> Result<Response<wire::RouteResponse>, Status> {
        let (_, extensions, req) = request.into_parts();
        // The conversation first: a call refused for anything after it is logged with its hash.
        let conv = ConversationId::optional(&req.conversation_id)?.map(ConversationId::as_str);
        let profile = self.profile(&extensions, &req.profile)?;
        self.check_text(&req.message, "message")?;
        let format = format(req.format)?;
        let options = RouteOptions {
            conversation: conv,
            dry_run: req.dry_run,
            format,
            max_tools: req.max_tools,
            token_budget: req.token_budget,
            profile,
        };
        let Routed {
            view,
            decision,
            dropped,
        } = self.state.route(&req.message, options).await?;
        tracing::debug!(
            message_bytes = req.message.len(),
            domain_count = decision.domains.len(),
            fallback = decision.fallback,
            "routed"
        );
        let registry = &view.registry;
        let scope = view.scope(profile);
        let parts = scope.answer_parts(&decision, format, || Parts::new(scope, &decision, format));
        // For the call log and the metrics (the telemetry layer reads it off the response).
        let summary = CallSummary {
            conversation: conv.map(conversation_hash),
            tools: Some(parts.tool_count),
            domains: Some(Arc::clone(&parts.domains)),
            fallback: Some(decision.fallback),
            groups: Vec::new(),
            new_loads: Vec::new(),
            tokens: Some((parts.tokens, counted(format).as_str())),
        };
        let message = proto::RouteResponse {
            tools: Vec::new(),
            tools_json: Vec::new(),
            tokens: parts.tokens,
            dropped: dropped
                .iter()
                .map(|d| proto::DroppedDomain {
                    domain: registry.domain(d.domain).name.clone(),
                    reason: reason(d.reason).into(),
                    tools: u32::try_from(d.cost.tools).unwrap_or(u32::MAX),
                    tokens: u32::try_from(d.cost.tokens).unwrap_or(u32::MAX),
                })
                .collect(),
            prompt_section: if req.include_prompt_section {
                scope.prompt_section()
            } else {
                String::new()
            },
            domains: Vec::new(),
            fallback: decision.fallback,
            registry_version: registry.version(),
        };
        let mut response = Response::new(
            spliced(message, format, wire::ROUTE_TOOLS_JSON, parts.pieces.clone())
                .and_entry(parts.decisions.clone()),
        );
        response.extensions_mut().insert(summary);
        Ok(response)
    }

    async fn load_tool_group(
        &self,
        request: Request<proto::LoadToolGroupRequest>,
    ) -> Result<Response<proto::LoadToolGroupResponse>, Status> {
        let (_, extensions, req) = request.into_parts();
        let id = ConversationId::required(&req.conversation_id)?.as_str();
        let profile = self.profile(&extensions, &req.profile)?;
        let group_name = bounded(required(&req.group_name, "group_name")?, "group_name")?;
        let format = format(req.format)?;
        let Loaded { view, load } = self.state.load_group(id, group_name, profile).await?;
        let scope = view.scope(profile);
        let d = view.registry.domain(load.domain);
        tracing::debug!(group = %d.name, already_loaded = load.already_loaded, "group loaded");
        let tokens = scope.domain_tokens(load.domain, counted(format));
        let mut tools_json = Vec::new();
        if let Some(f) = format {
            let mut pieces = Vec::new();
            scope.push_pieces(load.domain, f, &mut pieces);
            tools_json = assemble(&pieces);
        }
        let mut response = Response::new(proto::LoadToolGroupResponse {
            group: Some(group(scope, load.domain)),
            tools: if format.is_none() {
                domain_tools(scope, load.domain).collect()
            } else {
                Vec::new()
            },
            tools_json,
            tokens,
            already_loaded: load.already_loaded,
            text: crate::router::load_text(&view.registry, scope.activation, load.domain),
        });
        response.extensions_mut().insert(CallSummary {
            conversation: Some(conversation_hash(id)),
            tools: Some(scope.activation.visible_count(&view.registry, load.domain)),
            groups: vec![d.name.clone()],
            new_loads: if load.already_loaded {
                Vec::new()
            } else {
                vec![d.name.clone()]
            },
            tokens: Some((tokens, counted(format).as_str())),
            ..CallSummary::default()
        });
        Ok(response)
    }

    async fn list_groups(
        &self,
        request: Request<proto::ListGroupsRequest>,
    ) -> Result<Response<proto::ListGroupsResponse>, Status> {
        let profile = self.profile(request.extensions(), &request.get_ref().profile)?;
        let view = self.state.view().await;
        let scope = view.scope(profile);
        Ok(Response::new(proto::ListGroupsResponse {
            groups: groups(scope),
            prompt_section: scope.prompt_section(),
            registry_version: view.registry.version(),
        }))
    }

    async fn list_all_tools(
        &self,
        request: Request<proto::ListAllToolsRequest>,
    ) -> Result<Response<wire::ListAllToolsResponse>, Status> {
        let profile = self.profile(request.extensions(), &request.get_ref().profile)?;
        let format = format(request.into_inner().format)?;
        let view = self.state.view().await;
        let registry = &view.registry;
        let scope = view.scope(profile);
        // Core domains first, then the rest; each part is already by name. Whatever the
        // settings, but only what the consumer sees.
        let visible = |d: &DomainId| scope.activation.is_visible(*d);
        let ordered: Vec<DomainId> = registry
            .domain_ids()
            .filter(|&d| registry.domain(d).core)
            .chain(registry.domain_ids().filter(|&d| !registry.domain(d).core))
            .filter(visible)
            .collect();
        let mut pieces = Vec::with_capacity(ordered.len());
        for &d in &ordered {
            match format {
                None => scope.push_native(d, &mut pieces),
                Some(f) => scope.push_pieces(d, f, &mut pieces),
            }
        }
        let message = proto::ListAllToolsResponse {
            tools: Vec::new(),
            tools_json: Vec::new(),
            tokens: ordered
                .iter()
                .map(|&d| scope.domain_tokens(d, counted(format)))
                .sum(),
            groups: groups(scope),
            registry_version: registry.version(),
        };
        Ok(Response::new(spliced(
            message,
            format,
            wire::LIST_ALL_TOOLS_JSON,
            pieces,
        )))
    }

    async fn invalidate_settings(
        &self,
        request: Request<proto::InvalidateSettingsRequest>,
    ) -> Result<Response<proto::InvalidateSettingsResponse>, Status> {
        // The request names no profile; a token bound to one sees the domains it leaves.
        let profile = self.profile(request.extensions(), "")?;
        let view = self.state.invalidate_settings().await?;
        let active_domains = domain_names(&view.registry, view.scope(profile).activation.active());
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
        let id = ConversationId::required(&req.conversation_id)?.as_str();
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
        let (_, extensions, req) = request.into_parts();
        let conv = ConversationId::optional(&req.conversation_id)?;
        let profile = self.profile(&extensions, &req.profile)?;
        let query = required(&req.query, "query")?;
        self.check_text(query, "query")?;
        let format = format(req.format)?;
        let load_into = match (req.load, conv) {
            (false, _) => None,
            (true, Some(id)) => Some(id.as_str()),
            (true, None) => {
                return Err(Error::MissingWith {
                    field: ConversationId::FIELD,
                    with: "load",
                }
                .into());
            }
        };
        let limit = match req.limit as usize {
            0 => SEARCH_LIMIT.0,
            n => n.min(SEARCH_LIMIT.1),
        };
        let found = self.state.search_tools(query, limit, load_into, profile).await?;
        let view = &found.view;
        let scope = view.scope(profile);
        let hits: Vec<proto::ToolHit> = found
            .hits
            .iter()
            .map(|h| {
                let d = view.registry.domain(h.domain);
                let active = scope.activation.is_active(h.domain);
                proto::ToolHit {
                    tool: Some(native(&d.name, &d.tools[h.tool])),
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
        let tools_json = match format {
            None => Vec::new(),
            Some(f) => {
                let rendered = view.rendered(f);
                let pieces: Vec<_> = found
                    .hits
                    .iter()
                    .map(|h| {
                        let i = view.registry.tool_range(h.domain).start + h.tool;
                        rendered.span(i..i + 1)
                    })
                    .collect();
                assemble(&pieces)
            }
        };
        let loaded_groups = domain_names(&view.registry, found.loaded.iter().copied());
        // The call log and the metrics see the loads, as for `LoadToolGroup`.
        let summary = CallSummary {
            conversation: conv.map(|c| conversation_hash(c.as_str())),
            groups: loaded_groups.clone(),
            new_loads: domain_names(&view.registry, found.newly_loaded.iter().copied()),
            ..CallSummary::default()
        };
        let mut response = Response::new(proto::SearchToolsResponse {
            text: search_text(scope, query, &hits, &loaded_groups),
            hits,
            loaded_groups,
            tools_json,
            registry_version: view.registry.version(),
        });
        response.extensions_mut().insert(summary);
        Ok(response)
    }

    async fn reload_registry(
        &self,
        request: Request<proto::ReloadRegistryRequest>,
    ) -> Result<Response<proto::ReloadRegistryResponse>, Status> {
        // It serves every consumer a new registry, and its answer (counts, every manifest
        // problem) speaks of tools a bound token's profile must not see.
        registry_change_allowed(&request, "ReloadRegistry")?;
        let r = self.state.reload().await?;
        Ok(Response::new(proto::ReloadRegistryResponse {
            registry_version: r.registry_version,
            domains: u32::try_from(r.domains).unwrap_or(u32::MAX),
            tools: u32::try_from(r.tools).unwrap_or(u32::MAX),
        }))
    }

    async fn describe_server(
        &self,
        request: Request<proto::DescribeServerRequest>,
    ) -> Result<Response<proto::DescribeServerResponse>, Status> {
        // A token bound to a profile sees its own profile's configuration only.
        let bound = request.extensions().get::<BoundProfile>();
        let d = self.state.describe(bound.map(|b| &*b.0));
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

    async fn check_tool_call(
        &self,
        request: Request<proto::CheckToolCallRequest>,
    ) -> Result<Response<proto::CheckToolCallResponse>, Status> {
        let (_, extensions, req) = request.into_parts();
        let conv = ConversationId::optional(&req.conversation_id)?;
        let profile = self.profile(&extensions, &req.profile)?;
        let name = bounded(required(&req.tool_name, "tool_name")?, "tool_name")?;
        let check = self
            .state
            .check_call(name, conv.map(ConversationId::as_str), profile)
            .await?;
        // The profile by its name, also when the request named none and the token's applies.
        let profile_name = profile.map(|p| self.state.profile_name(p));
        let mut response = Response::new(call_check(&check, name, profile_name));
        response.extensions_mut().insert(CallSummary {
            conversation: conv.map(|c| conversation_hash(c.as_str())),
            ..CallSummary::default()
        });
        Ok(response)
    }

    type WatchRegistryStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<proto::RegistryEvent, Status>> + Send>>;

    async fn watch_registry(
        &self,
        request: Request<proto::WatchRegistryRequest>,
    ) -> Result<Response<Self::WatchRegistryStream>, Status> {
        use tokio_stream::StreamExt as _;
        let profile = self.profile(request.extensions(), &request.get_ref().profile)?;
        // A deadline the caller set ends the stream when it passes, with DEADLINE_EXCEEDED as
        // gRPC has it (tonic bounds a call only until its answer starts), so a watcher that
        // stopped reading does not hold its stream open past it.
        let timeout = crate::telemetry::grpc_timeout(request.metadata().as_ref())
            .map(|d| (tokio::time::Instant::now() + d, d));
        // One item at the deadline, or none without one.
        let deadline = tokio_stream::iter(timeout).then(|(ends, d)| async move {
            tokio::time::sleep_until(ends).await;
            Err(Status::deadline_exceeded(format!(
                "The caller's deadline (grpc-timeout) of {} passed.",
                humantime::format_duration(d)
            )))
        });
        // The current state first: settings no older than the TTL (or a notification's),
        // which nothing may have asked for since the last event.
        self.state.view().await;
        let (views, stopping) = self.state.watch();
        // Ends the stream when the daemon starts draining, with UNAVAILABLE (as gRPC tells a
        // call the server went away), so a consumer knows to watch again, elsewhere or later,
        // rather than take the end for the daemon having nothing more to say.
        let stop = tokio_stream::wrappers::WatchStream::new(stopping)
            .filter(|&stop| stop)
            .map(|_| Err(Status::unavailable(WATCH_ENDED_BY_SHUTDOWN)));
        // The latest view first, then each change; a slow reader skips to the latest. Each
        // stream tells only what changed for its consumer.
        let mut last: Option<(u64, proto::RegistryEvent)> = None;
        let events = tokio_stream::wrappers::WatchStream::new(views)
            .filter_map(move |view| {
                let event = registry_event(view.scope(profile));
                // Every reload (a new registry build) is news, even to a consumer it changed
                // nothing for (SPEC §11); a settings change only when it changed what this
                // consumer sees.
                if last
                    .as_ref()
                    .is_some_and(|(build, seen)| *build == view.build() && *seen == event)
                {
                    return None;
                }
                last = Some((view.build(), event.clone()));
                Some(Ok(event))
            })
            .merge(stop)
            .merge(deadline)
            // Nothing after the status that ends it.
            .map_while({
                let mut ended = false;
                move |item: Result<proto::RegistryEvent, Status>| {
                    (!std::mem::replace(&mut ended, item.is_err())).then_some(item)
                }
            });
        Ok(Response::new(Box::pin(events)))
    }

    async fn upsert_domain(
        &self,
        request: Request<proto::UpsertDomainRequest>,
    ) -> Result<Response<proto::UpsertDomainResponse>, Status> {
        registry_change_allowed(&request, "UpsertDomain")?;
        let req = request.into_inner();
        let manifest = required(&req.manifest_json, "manifest_json")?;
        let limit = self.limits.max_manifest_bytes();
        if manifest.len() > limit {
            return Err(Error::ManifestTooLong {
                len: manifest.len(),
                limit,
                factor: MANIFEST_BYTES_PER_MESSAGE_BYTE,
            }
            .into());
        }
        let u = self.state.upsert_domain(manifest).await?;
        tracing::info!(
            domain = %u.domain,
            created = u.created,
            tools = u.tools,
            registry_version = %format!("{:016x}", u.registry_version),
            "domain upserted"
        );
        Ok(Response::new(proto::UpsertDomainResponse {
            domain: u.domain,
            created: u.created,
            registry_version: u.registry_version,
            tools: u32::try_from(u.tools).unwrap_or(u32::MAX),
        }))
    }

    async fn delete_domain(
        &self,
        request: Request<proto::DeleteDomainRequest>,
    ) -> Result<Response<proto::DeleteDomainResponse>, Status> {
        registry_change_allowed(&request, "DeleteDomain")?;
        let req = request.into_inner();
        let name = bounded(required(&req.name, "name")?, "name")?;
        let registry_version = self.state.delete_domain(name).await?;
        tracing::info!(
            domain = %name,
            registry_version = %format!("{registry_version:016x}"),
            "domain deleted"
        );
        Ok(Response::new(proto::DeleteDomainResponse {
            deleted: true,
            registry_version,
        }))
    }
}

/// Refuses a call that changes the registry when its auth token is bound to a profile: such
/// a token is one consumer's, while a run-time domain is served to every consumer.
fn registry_change_allowed<T>(request: &Request<T>, method: &'static str) -> Result<()> {
    match request.extensions().get::<BoundProfile>() {
        Some(bound) => Err(Error::RegistryChangeNotAllowed {
            bound: bound.0.to_string(),
            method,
        }),
        None => Ok(()),
    }
}

/// What a consumer is told of the registry's state (SPEC §11 `WatchRegistry`).
fn registry_event(scope: Scope<'_>) -> proto::RegistryEvent {
    let registry = &scope.view.registry;
    proto::RegistryEvent {
        registry_version: registry.version(),
        active_domains: domain_names(registry, scope.activation.active()),
        disabled_tools: disabled_in_scope(&scope),
        tools: registry
            .domain_ids()
            .map(|d| scope.activation.visible_count(registry, d) as u32)
            .sum(),
    }
}

/// The disabled tools (names or globs) a `WatchRegistry` consumer is told of: every entry
/// without a profile; under one, only the entries that disable a tool the profile may see
/// (SPEC §10: its other tools are invisible to it), so a change to the others is no change.
fn disabled_in_scope(scope: &Scope<'_>) -> Vec<String> {
    let disabled = scope.view.settings.disabled();
    let Some(profile) = scope.profile else {
        return disabled.as_slice().to_vec();
    };
    let mut seen = vec![false; disabled.as_slice().len()];
    if !disabled.is_empty() {
        for domain in scope.view.registry.domains() {
            if !profile.allows_domain(&domain.name) {
                continue;
            }
            for tool in domain.tools.iter().filter(|t| profile.allows_tool(t)) {
                for i in disabled.matching(&tool.name) {
                    seen[i] = true;
                }
            }
        }
    }
    disabled
        .as_slice()
        .iter()
        .zip(seen)
        .filter(|(_, seen)| *seen)
        .map(|(entry, _)| entry.clone())
        .collect()
}

/// The answer to `CheckToolCall` (SPEC §10), with a sentence saying it.
fn call_check(check: &CallCheck, tool: &str, profile: Option<&str>) -> proto::CheckToolCallResponse {
    let registry = &check.view.registry;
    let tool = crate::error::echo(tool);
    let domain = check.domain.map(|d| registry.domain(d).name.clone());
    let mut response = proto::CheckToolCallResponse {
        allowed: check.refusal.is_none(),
        visible_now: check.visible_now,
        reason: check
            .refusal
            .as_ref()
            .map(|r| r.as_str().to_string())
            .unwrap_or_default(),
        registry_version: registry.version(),
        ..Default::default()
    };
    response.text = match &check.refusal {
        None => {
            response.group = domain.unwrap_or_default();
            format!("Tool '{tool}' may be called now.")
        }
        Some(Refusal::UnknownTool) => format!("No tool is named '{tool}'."),
        Some(Refusal::DeniedByProfile) => format!(
            "Tool '{tool}' is not available to profile '{}'.",
            profile.unwrap_or_default()
        ),
        Some(Refusal::Disabled) => {
            response.group = domain.unwrap_or_default();
            format!(
                "Tool '{tool}' is disabled (settings key {}).",
                crate::router::DISABLED_TOOLS_KEY
            )
        }
        Some(Refusal::NotConfigured { keys }) => {
            response.settings_keys = keys.clone();
            let group = domain.unwrap_or_default();
            let text = format!(
                "Tool '{tool}' is in group '{group}', which is not configured: set one of {}.",
                keys.join(", ")
            );
            response.group = group;
            text
        }
        Some(Refusal::NeedsLoad { group }) => {
            response.group = group.clone();
            if check.view.exposes_load_tool() {
                format!(
                    "Tool '{tool}' is not available in this conversation now: load group '{group}' first \
                     (load_tool_group)."
                )
            } else {
                format!(
                    "Tool '{tool}' is not available in this conversation now: group '{group}' is not loaded."
                )
            }
        }
    };
    response
}

/// Default and largest `SearchTools.limit` (SPEC §5); a larger limit is cut to the largest.
const SEARCH_LIMIT: (usize, usize) = (5, 20);

/// The `text` of a `SearchTools` answer, for the model to read.
fn search_text(scope: Scope<'_>, query: &str, hits: &[proto::ToolHit], loaded: &[String]) -> String {
    if hits.is_empty() {
        // Every active group, core ones too (SPEC §1), not only those a load would add.
        let active = domain_names(&scope.view.registry, scope.activation.active());
        // The query is echoed as error messages echo a caller's value (SPEC §5).
        return format!(
            "No tools matched '{}'. Active groups: {}.",
            crate::error::echo(query.trim()),
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
        fn optional(raw: &str) -> Result<Option<String>> {
            ConversationId::optional(raw).map(|c| c.map(|c| c.as_str().to_string()))
        }
        assert_eq!(optional("").unwrap(), None);
        assert_eq!(optional("  ").unwrap(), None);
        for blank_control in [" \t", "\n", "\u{85}"] {
            assert_eq!(
                optional(blank_control).unwrap_err().to_string(),
                "'conversation_id' must not contain control characters.",
                "{blank_control:?}"
            );
        }
        assert_eq!(optional("abc").unwrap().as_deref(), Some("abc"));
        assert!(
            optional(&"x".repeat(256)).is_ok(),
            "exactly the limit is accepted"
        );
        let long = optional(&"x".repeat(257)).unwrap_err().to_string();
        assert_eq!(
            long,
            "'conversation_id' is 257 bytes, over the limit of 256 bytes."
        );
        let ctrl = optional("a\u{7}b").unwrap_err().to_string();
        assert_eq!(ctrl, "'conversation_id' must not contain control characters.");
        assert!(optional("a\u{85}b").is_err(), "C1 controls are Cc too");
        for blank in [" ", "\t"] {
            let missing = ConversationId::required(blank).unwrap_err().to_string();
            assert_eq!(missing, "Required parameter 'conversation_id' is missing.");
        }
        assert_eq!(ConversationId::required("c1").unwrap().as_str(), "c1");
    }
}
