//! What an operator sees of the calls: one log line per RPC and the Prometheus metrics.
//!
//! [`CallLog`] is a tower layer around every service. For each call it logs, at info, the
//! method, the gRPC status code and the latency, plus what the handler summarised in a
//! [`CallSummary`] response extension (for `Route`: tools sent, domains with reasons, whether
//! it was a fallback; a short hash of the conversation id, never the message). A failed call
//! is logged at warn with its cause (the status message); a call dropped before it answered
//! (its caller gone, or its `grpc-timeout` passed) as `CANCELLED`; a stream when it ends,
//! with the status in its trailers. The same observations feed the [`Metrics`], which
//! `--metrics-listen` serves in the Prometheus text format.
//!
//! Metrics are built with the `prometheus` crate (the Prometheus project's Rust client): each
//! daemon owns its own registry, so several servers in one process (the tests) keep separate
//! counts, and the text exposition is the library's, not hand-written.
//!
//! - `call_log`: the tower layer, its log lines and what it observes for the metrics;
//!   the contract's codes for what the transport refuses.
//! - `format`: the text and JSON log formats (one line per event, lists as JSON).
//! - `metrics`: the Prometheus registry and the `/metrics` endpoint.
//! - `accept`: an accept loop's pause while the process is out of file descriptors.

mod accept;
mod call_log;
mod format;
mod metrics;
#[cfg(test)]
mod tests;

use std::sync::{Arc, OnceLock};

use crate::registry::{self, DomainId};
use crate::router::Reason;

pub(crate) use accept::AcceptPause;
pub(crate) use call_log::{CallLog, grpc_timeout};
pub(crate) use format::{JsonLogFormat, TextLogFormat};
use format::{is_plain, push_json_str};
pub(crate) use metrics::{Metrics, serve_metrics};

/// What a handler tells the call log and the metrics about its answer, as a response
/// extension.
#[derive(Debug, Clone, Default)]
pub(crate) struct CallSummary {
    /// A short hash of the conversation id ([`conversation_hash`]).
    pub conversation: Option<String>,
    /// Tools sent (`Route`, `LoadToolGroup`).
    pub tools: Option<usize>,
    /// `Route`: each included domain and its reason (shared with a remembered answer).
    pub domains: Option<Arc<RoutedDomains>>,
    /// `Route`: whether the answer was the fallback.
    pub fallback: Option<bool>,
    /// `LoadToolGroup`: the group loaded; `SearchTools` with `load`: the groups it loaded.
    pub groups: Vec<String>,
    /// Those of `groups` the conversation had not loaded before (what
    /// `toolrouter_group_loads_total` counts).
    pub new_loads: Vec<String>,
    /// `Route`, `LoadToolGroup`: the tokens of the tools sent, and the format they were
    /// counted in (the requested one; OpenAI chat for native answers).
    pub tokens: Option<(u32, &'static str)>,
}

/// The domains of a `Route` answer with their reasons, named by the registry the answer came
/// from (shared, so a fallback answer's hundreds of domains cost no copies of their names).
#[derive(Debug)]
pub(crate) struct RoutedDomains {
    pub registry: Arc<registry::Registry>,
    pub domains: Vec<(DomainId, Reason)>,
    /// [`RoutedDomains::to_json`], written on first use: a fallback answer served again
    /// (see `Scope::answer_parts`) logs the same text.
    json: OnceLock<String>,
}

impl RoutedDomains {
    pub fn new(registry: Arc<registry::Registry>, domains: Vec<(DomainId, Reason)>) -> Self {
        RoutedDomains {
            registry,
            domains,
            json: OnceLock::new(),
        }
    }

    /// `["name:reason", ...]` as JSON text, for the call log; written once.
    fn json(&self) -> &str {
        self.json.get_or_init(|| self.to_json())
    }

    /// Each domain's name and reason (`core`, `keyword`, ...), in answer order.
    fn iter(&self) -> impl Iterator<Item = (&str, &'static str)> {
        self.domains
            .iter()
            .map(|&(d, r)| (self.registry.domain(d).name.as_str(), r.as_str()))
    }

    /// `["name:reason", ...]` as JSON text, for the call log.
    fn to_json(&self) -> String {
        let mut out = String::with_capacity(2 + self.domains.len() * 24);
        out.push('[');
        for (i, (name, reason)) in self.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            if is_plain(name) {
                out.push('"');
                out.push_str(name);
                out.push(':');
                out.push_str(reason);
                out.push('"');
            } else {
                push_json_str(&mut out, &format!("{name}:{reason}"));
            }
        }
        out.push(']');
        out
    }
}

/// Where a call's conversation is noted: shared by the call's future and its log, so a call
/// dropped before it answered still names its conversation.
type NotedConversation = Arc<std::sync::Mutex<Option<String>>>;

tokio::task_local! {
    /// The hash of the conversation the call being served names, once its request named a
    /// valid one: for the call log's line of a call that failed (or was dropped) after that.
    static CALL_CONVERSATION: NotedConversation;
}

/// Notes the conversation the call being served names, for its log line (nothing outside a
/// call the call log serves).
pub(crate) fn note_conversation(id: &str) {
    let _ = CALL_CONVERSATION.try_with(|c| *lock(c) = Some(conversation_hash(id)));
}

/// The noted conversation (a poisoned lock still holds a valid `Option`).
fn lock(noted: &NotedConversation) -> std::sync::MutexGuard<'_, Option<String>> {
    noted.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A short, stable hash of a conversation id (FNV-1a, mixed by MurmurHash3's 64-bit
/// finaliser, 8 hex digits): enough to follow one conversation through the log without
/// writing the id (which may be a user id) itself. The finaliser spreads every input bit
/// over every digit, so ids that differ in their last character (`conv-1`, `conv-2`) do not
/// get hashes that differ in one digit, easy to take for one another.
pub fn conversation_hash(id: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    format!("{:08x}", h >> 32)
}

/// A call's method as its log line names it: `/toolrouter.v1.ToolRouter/Route` -> `Route`;
/// other services keep their full path. A path the daemon does not serve is the caller's
/// text: it is cut to 128 characters and its control characters escaped, as an error
/// repeats a value, so a caller cannot write long or forged lines into the log.
fn logged_method(path: &str) -> std::borrow::Cow<'_, str> {
    match path.strip_prefix("/toolrouter.v1.ToolRouter/") {
        Some(method) if METHODS.contains(&method) => std::borrow::Cow::Borrowed(method),
        _ if OTHER_METHODS.contains(&path) => std::borrow::Cow::Borrowed(path),
        _ => crate::error::echo(path),
    }
}

/// The `ToolRouter` RPCs, as the `method` label names them.
const METHODS: &[&str] = &[
    "Route",
    "LoadToolGroup",
    "ListGroups",
    "ListAllTools",
    "InvalidateSettings",
    "ResetConversation",
    "ReloadRegistry",
    "SearchTools",
    "DescribeServer",
    "CheckToolCall",
    "WatchRegistry",
    "UpsertDomain",
    "DeleteDomain",
];

/// The other services' calls, labelled by their full path.
const OTHER_METHODS: &[&str] = &[
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
];

/// A call's `method` label: the RPC's name (other services' by path), or `unknown` for a path
/// the daemon does not serve, so a caller cannot add metric series at will.
fn method_label(path: &str) -> &str {
    match path.strip_prefix("/toolrouter.v1.ToolRouter/") {
        Some(m) if METHODS.contains(&m) => m,
        None if OTHER_METHODS.contains(&path) => path,
        _ => "unknown",
    }
}

/// The canonical upper-snake name of a gRPC status code (as in the gRPC docs and grpcurl).
pub(crate) fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}
