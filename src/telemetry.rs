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

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use prometheus::{
    Encoder as _, Gauge, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use tonic::codegen::http;
use tower_service::Service;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::registry::{self, DomainId};
use crate::router::Reason;
use crate::state::State;

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

/// `toolrouter_route_domains_total`'s counter for each domain (by index) and [`Reason`] (by
/// discriminant) of one registry, each fetched when first counted.
struct RouteCounters {
    version: u64,
    cells: Vec<[OnceLock<IntCounter>; REASONS]>,
}

/// How many [`Reason`]s there are.
const REASONS: usize = 6;
const _: () = assert!(Reason::Fallback as usize == REASONS - 1);

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

/// The daemon's metrics. Cloning is shallow.
#[derive(Clone)]
pub(crate) struct Metrics {
    inner: Arc<MetricsInner>,
}

struct MetricsInner {
    registry: Registry,
    requests: IntCounterVec,
    latency: HistogramVec,
    route_domains: IntCounterVec,
    /// `route_domains`' counters for the registry being served, looked up by label once per
    /// domain and reason instead of on every answer (a fallback answer counts hundreds).
    route_counters: ArcSwapOption<RouteCounters>,
    tokens_sent: IntCounterVec,
    route_fallbacks: IntCounter,
    loads: IntCounterVec,
    settings_age: Gauge,
    conversations: IntGauge,
    registry_info: IntGaugeVec,
    registry_domains: IntGauge,
    registry_tools: IntGauge,
}

impl Metrics {
    /// A fresh registry with every metric registered.
    ///
    /// # Panics
    /// Never in practice: names, labels and buckets are constants checked by the tests.
    pub fn new() -> Metrics {
        let registry = Registry::new();
        macro_rules! reg {
            ($m:expr) => {{
                let m = $m.expect("valid metric");
                registry
                    .register(Box::new(m.clone()))
                    .expect("registered once");
                m
            }};
        }
        let requests = reg!(IntCounterVec::new(
            Opts::new(
                "toolrouter_requests_total",
                "gRPC calls by method and status code."
            ),
            &["method", "code"]
        ));
        let latency = reg!(HistogramVec::new(
            HistogramOpts::new(
                "toolrouter_request_duration_seconds",
                "Time from receiving a call to its answer, by method."
            )
            .buckets(vec![
                0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                0.5, 1.0, 2.5, 5.0, 10.0
            ]),
            &["method"]
        ));
        let route_domains = reg!(IntCounterVec::new(
            Opts::new(
                "toolrouter_route_domains_total",
                "Domains included in Route answers, by domain and reason (core, keyword, search, sticky, loaded, fallback); reason=\"search\" counts search hits."
            ),
            &["domain", "reason"]
        ));
        let tokens_sent = reg!(IntCounterVec::new(
            Opts::new(
                "toolrouter_tokens_sent_total",
                "o200k_base tokens of the tools sent in Route and LoadToolGroup answers, by method \
                 and the format they were counted in (OpenAI chat for native answers)."
            ),
            &["method", "format"]
        ));
        let route_fallbacks = reg!(IntCounter::new(
            "toolrouter_route_fallbacks_total",
            "Route answers that were the fallback (nothing routed the message); divide by \
             toolrouter_requests_total{method=\"Route\",code=\"OK\"} for the fallback rate."
        ));
        let loads = reg!(IntCounterVec::new(
            Opts::new(
                "toolrouter_group_loads_total",
                "Groups loaded into conversations that had not loaded them (LoadToolGroup, and SearchTools with load), by group."
            ),
            &["group"]
        ));
        let settings_age = reg!(Gauge::new(
            "toolrouter_settings_snapshot_age_seconds",
            "Age of the settings snapshot the daemon routes with."
        ));
        let conversations = reg!(IntGauge::new(
            "toolrouter_conversations_cached",
            "Conversations held in memory."
        ));
        let registry_info = reg!(IntGaugeVec::new(
            Opts::new(
                "toolrouter_registry_info",
                "1 for the registry being served, labelled with its version (16 hex digits)."
            ),
            &["version"]
        ));
        let registry_domains = reg!(IntGauge::new(
            "toolrouter_registry_domains",
            "Domains in the registry."
        ));
        let registry_tools = reg!(IntGauge::new(
            "toolrouter_registry_tools",
            "Tools in the registry."
        ));
        registry
            .register(Box::new(crate::db::DATABASE_ERRORS.clone()))
            .expect("registered once per registry");
        // Each RPC's OK count and latency from the start, at 0: alerts on a series that is
        // absent, and rates over it, work before the first call.
        for method in METHODS {
            requests.with_label_values(&[method, code_name(tonic::Code::Ok)]);
            latency.with_label_values(&[method]);
        }
        Metrics {
            inner: Arc::new(MetricsInner {
                registry,
                requests,
                latency,
                route_domains,
                route_counters: ArcSwapOption::empty(),
                tokens_sent,
                route_fallbacks,
                loads,
                settings_age,
                conversations,
                registry_info,
                registry_domains,
                registry_tools,
            }),
        }
    }

    fn observe(&self, method: &str, code: &str, seconds: f64, summary: Option<&CallSummary>) {
        let m = &self.inner;
        m.requests.with_label_values(&[method, code]).inc();
        m.latency.with_label_values(&[method]).observe(seconds);
        let Some(s) = summary else { return };
        if let Some(routed) = &s.domains {
            let counters = self.route_counters(&routed.registry);
            for &(domain, reason) in &routed.domains {
                counters.cells[domain.index()][reason as usize]
                    .get_or_init(|| {
                        let name = routed.registry.domain(domain).name.as_str();
                        m.route_domains.with_label_values(&[name, reason.as_str()])
                    })
                    .inc();
            }
        }
        if let Some((tokens, format)) = s.tokens {
            m.tokens_sent
                .with_label_values(&[method, format])
                .inc_by(u64::from(tokens));
        }
        if s.fallback == Some(true) {
            m.route_fallbacks.inc();
        }
        for group in &s.new_loads {
            m.loads.with_label_values(&[group.as_str()]).inc();
        }
    }

    /// The route counters of `registry`, made when it is not the one they were made for.
    fn route_counters(&self, registry: &registry::Registry) -> Arc<RouteCounters> {
        let current = self.inner.route_counters.load_full();
        let fits =
            |c: &RouteCounters| c.version == registry.version() && c.cells.len() == registry.domains().len();
        match current {
            Some(c) if fits(&c) => c,
            _ => {
                let c = Arc::new(RouteCounters {
                    version: registry.version(),
                    cells: registry.domains().iter().map(|_| Default::default()).collect(),
                });
                self.inner.route_counters.store(Some(Arc::clone(&c)));
                c
            }
        }
    }

    /// The Prometheus text exposition, with the gauges read from `state` now.
    pub(crate) async fn render(&self, state: &State) -> String {
        let m = &self.inner;
        let d = state.describe(None);
        m.settings_age.set(d.settings_age.as_secs_f64());
        m.conversations
            .set(i64::try_from(state.conversations_cached().await).unwrap_or(i64::MAX));
        m.registry_info.reset();
        m.registry_info
            .with_label_values(&[format!("{:016x}", d.registry_version).as_str()])
            .set(1);
        // Series of domains no longer served go: run-time domains registered and deleted
        // over and over would otherwise add series without end.
        // The registry served, as `describe` reads it: a scrape reads nothing from the
        // database.
        let registry = state.served_registry();
        let served = |name: &str| registry.find(name).is_some();
        if drop_series(&m.route_domains, "domain", served) {
            // The counters fetched for the registry may be among those dropped: the same
            // domain served again (the same registry version) fetches its series anew.
            m.route_counters.store(None);
        }
        drop_series(&m.loads, "group", served);
        m.registry_domains
            .set(i64::try_from(d.domains).unwrap_or(i64::MAX));
        m.registry_tools.set(i64::try_from(d.tools).unwrap_or(i64::MAX));
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metrics.
        let _ = TextEncoder::new().encode(&m.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// Removes a counter vector's series whose `label` has a value `keep` refuses; whether it
/// removed any.
fn drop_series(counters: &IntCounterVec, label: &str, keep: impl Fn(&str) -> bool) -> bool {
    use prometheus::core::Collector as _;
    let mut dropped = false;
    for family in counters.collect() {
        for metric in family.get_metric() {
            let labels = metric.get_label();
            if labels.iter().any(|l| l.name() == label && !keep(l.value())) {
                let values: std::collections::HashMap<&str, &str> =
                    labels.iter().map(|l| (l.name(), l.value())).collect();
                // Present a moment ago; a concurrent removal is the same outcome.
                let _ = counters.remove(&values);
                dropped = true;
            }
        }
    }
    dropped
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Serves `GET /metrics` on `listener` until `shutdown` resolves. A deliberately small
/// HTTP/1.1 responder: one request per connection, anything else is 404.
pub(crate) async fn serve_metrics(
    listener: tokio::net::TcpListener,
    metrics: Metrics,
    state: State,
    shutdown: impl Future<Output = ()> + Send,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    tokio::pin!(shutdown);
    let mut pause = AcceptPause::new("metrics endpoint: ");
    loop {
        let (mut stream, _) = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(c) => {
                    pause.accepted();
                    c
                }
                Err(e) => {
                    if let Some(wait) = pause.failed(&e) {
                        tokio::select! {
                            () = &mut shutdown => return,
                            () = tokio::time::sleep(wait) => {}
                        }
                    }
                    continue;
                }
            },
        };
        let (metrics, state) = (metrics.clone(), state.clone());
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let mut len = 0;
            // Read the request head (bounded, with a deadline, so a silent peer costs nothing).
            let read = tokio::time::timeout(std::time::Duration::from_secs(5), async {
                while len < buf.len() {
                    match stream.read(&mut buf[len..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => len += n,
                    }
                    if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            })
            .await;
            if read.is_err() {
                return;
            }
            let head = String::from_utf8_lossy(&buf[..len]);
            let path = head.split_whitespace().nth(1).unwrap_or("");
            let (status, body) =
                if head.starts_with("GET ") && (path == "/metrics" || path.starts_with("/metrics?")) {
                    ("200 OK", metrics.render(&state).await)
                } else {
                    ("404 Not Found", "try /metrics\n".to_string())
                };
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

/// The tower layer that logs and measures every call.
#[derive(Clone)]
pub(crate) struct CallLog {
    metrics: Option<Metrics>,
}

impl CallLog {
    /// Logs every call and records it in `metrics`, when they are served (counting what
    /// nobody can read would only cost each call time).
    pub fn new(metrics: Option<Metrics>) -> CallLog {
        CallLog { metrics }
    }
}

impl<S> tower_layer::Layer<S> for CallLog {
    type Service = Logged<S>;

    fn layer(&self, inner: S) -> Logged<S> {
        Logged {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// A service whose calls are logged and measured.
#[derive(Clone)]
pub(crate) struct Logged<S> {
    inner: S,
    metrics: Option<Metrics>,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B, R> Service<http::Request<B>> for Logged<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: std::fmt::Display,
    B: Send + 'static,
    R: http_body::Body + Unpin + Send + 'static,
    R::Error: std::fmt::Display,
{
    type Response = http::Response<LoggedBody<R>>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // The readied service serves this call; a fresh clone waits for the next one.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let metrics = self.metrics.clone();
        let path = request.uri().path().to_string();
        let deadline = grpc_timeout(request.headers());
        Box::pin(async move {
            let started = Instant::now();
            // A call whose future is dropped before it answers (given up by its client, cut
            // at its deadline or at the drain timeout) still gets its line and its count.
            let noted = NotedConversation::default();
            let unanswered = Unanswered {
                call: Some(Ended {
                    path,
                    started,
                    metrics,
                    deadline,
                }),
                conversation: noted.clone(),
            };
            let mut result = CALL_CONVERSATION.scope(noted.clone(), inner.call(request)).await;
            let conversation = lock(&noted).take();
            let call = unanswered.answered();
            if let Ok(response) = &mut result {
                transport_refusals_in_the_contracts_codes(response);
            }
            let mut response = match result {
                Ok(response) => response,
                Err(e) => {
                    call.transport_error(&e);
                    return Err(e);
                }
            };
            // A unary error is a trailers-only answer: its status is in the headers. Without
            // one the call succeeded (OK travels in the trailers), unless it is a stream,
            // whose status comes at its end.
            let status = tonic::Status::from_header_map(response.headers());
            if status.is_none() && crate::guard::STREAMS.contains(&call.path.as_str()) {
                return Ok(response.map(|body| LoggedBody {
                    inner: body,
                    stream: Some((call, conversation)),
                }));
            }
            let summary = response.extensions_mut().remove::<CallSummary>();
            match status.filter(|s| s.code() != tonic::Code::Ok) {
                Some(status) => call.failed(
                    status.code(),
                    status.message(),
                    conversation.as_deref(),
                    summary.as_ref(),
                ),
                None => call.succeeded(summary.unwrap_or_default(), true),
            }
            Ok(response.map(|body| LoggedBody {
                inner: body,
                stream: None,
            }))
        })
    }
}

/// A call as the call log ends it: one line and one count, whichever way it ends.
struct Ended {
    path: String,
    started: Instant,
    metrics: Option<Metrics>,
    /// The caller's deadline, if it set one.
    deadline: Option<Duration>,
}

impl Ended {
    /// Why a call ended before its answer (or a stream before its end): its caller's
    /// deadline when it has run that long, else `otherwise`.
    fn cut_cause(&self, otherwise: &str) -> String {
        // tonic's timer for the deadline starts just before this call's clock (and fires on
        // a millisecond tick), so a call it cut has run its deadline less a few microseconds.
        match self.deadline {
            Some(d) if self.started.elapsed() + Duration::from_millis(1) >= d => format!(
                "the caller's deadline (grpc-timeout) of {} passed",
                humantime::format_duration(d)
            ),
            _ => otherwise.to_string(),
        }
    }

    fn observe(&self, code: &str, summary: Option<&CallSummary>) {
        if let Some(m) = &self.metrics {
            m.observe(
                method_label(&self.path),
                code,
                self.started.elapsed().as_secs_f64(),
                summary,
            );
        }
    }

    fn latency_ms(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1000.0
    }

    /// A call answered OK: its info line, written after the answer when `after_the_answer`
    /// (health probes and reflection, frequent and telling little, at debug).
    fn succeeded(self, summary: CallSummary, after_the_answer: bool) {
        self.observe(code_name(tonic::Code::Ok), Some(&summary));
        let method = logged_method(&self.path);
        let latency_ms = self.latency_ms();
        if method.starts_with("/grpc.") {
            tracing::debug!(method = %method, code = code_name(tonic::Code::Ok), latency_ms, "call");
            return;
        }
        let line = CallLine {
            method: method.into_owned(),
            latency_ms,
            summary,
        };
        if after_the_answer {
            line.write_after_the_answer();
        } else {
            // Written now (a stream's end: its answer has gone).
            drop(line);
        }
    }

    /// A call that ended with status `code`, not OK: a warn line with its cause.
    fn failed(
        self,
        code: tonic::Code,
        cause: &str,
        conversation: Option<&str>,
        summary: Option<&CallSummary>,
    ) {
        let code_name = code_name(code);
        self.observe(code_name, summary);
        // The router answers a method no service has with a bare status.
        let cause = match (cause, code) {
            ("", tonic::Code::Unimplemented) => "no service of this daemon has this method",
            ("", _) => "(the answer gave no message)",
            (cause, _) => cause,
        };
        tracing::warn!(
            method = %logged_method(&self.path),
            code = code_name,
            latency_ms = self.latency_ms(),
            conversation = conversation.unwrap_or(""),
            cause = %cause,
            "call failed"
        );
    }

    /// A call whose answer failed in the transport (no gRPC status).
    fn transport_error(self, e: &dyn std::fmt::Display) {
        self.observe("TRANSPORT_ERROR", None);
        tracing::warn!(
            method = %logged_method(&self.path),
            latency_ms = self.latency_ms(),
            cause = %e,
            "call failed in transport"
        );
    }
}

/// An answer's body, as the call log passes it on. A stream's carries its call, ended by
/// the status in its trailers, or `CANCELLED` when the body is dropped before them (its
/// caller closed it or went away, or the daemon cut it at the drain timeout).
pub(crate) struct LoggedBody<R> {
    inner: R,
    stream: Option<(Ended, Option<String>)>,
}

impl<R> LoggedBody<R> {
    fn end(&mut self, status: Option<tonic::Status>) {
        let Some((call, conversation)) = self.stream.take() else {
            return;
        };
        match status.filter(|s| s.code() != tonic::Code::Ok) {
            Some(s) => call.failed(s.code(), s.message(), conversation.as_deref(), None),
            None => call.succeeded(
                CallSummary {
                    conversation,
                    ..CallSummary::default()
                },
                false,
            ),
        }
    }
}

impl<R> http_body::Body for LoggedBody<R>
where
    R: http_body::Body + Unpin,
    R::Error: std::fmt::Display,
{
    type Data = R::Data;
    type Error = R::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if self.stream.is_some() {
            match &polled {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(trailers) = frame.trailers_ref() {
                        let status = tonic::Status::from_header_map(trailers);
                        self.end(status);
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    if let Some((call, _)) = self.stream.take() {
                        call.transport_error(e);
                    }
                }
                Poll::Ready(None) => self.end(None),
                Poll::Pending => {}
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl<R> Drop for LoggedBody<R> {
    fn drop(&mut self) {
        if let Some((call, conversation)) = self.stream.take() {
            let code = code_name(tonic::Code::Cancelled);
            call.observe(code, None);
            let cause = call
                .cut_cause("its caller closed it or went away, or the daemon stopped at the drain timeout");
            tracing::info!(
                method = %logged_method(&call.path),
                code,
                latency_ms = call.latency_ms(),
                conversation = conversation.as_deref().unwrap_or(""),
                cause = %cause,
                "stream closed before its end (by its caller, or cut at the drain timeout)"
            );
        }
    }
}

/// The deadline a caller set on its call (`grpc-timeout`: at most 8 digits and a unit).
fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    let unit = value.chars().last()?;
    let digits = &value[..value.len() - unit.len_utf8()];
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        'H' => Duration::from_secs(n * 3600),
        'M' => Duration::from_secs(n * 60),
        'S' => Duration::from_secs(n),
        'm' => Duration::from_millis(n),
        'u' => Duration::from_micros(n),
        'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The info line of a call that succeeded. It is written after the answer's bytes leave
/// (formatting and writing it is a few microseconds, a large answer's turn-around at low
/// concurrency), and written when dropped, so a line whose task the runtime drops at exit
/// is written then: none is lost.
struct CallLine {
    method: String,
    latency_ms: f64,
    summary: CallSummary,
}

impl CallLine {
    /// Writes the line once the connection's task has had its turn to send the answer: the
    /// task that writes it first yields, which puts it behind the tasks already woken.
    fn write_after_the_answer(self) {
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            drop(self);
        });
    }
}

impl Drop for CallLine {
    fn drop(&mut self) {
        let s = &self.summary;
        // Only the fields the call has (a `None` is not written): `SearchTools` sent no
        // tools, it did not send 0. Lists as JSON text, so the JSON log format can embed
        // them as real arrays.
        let groups = (!s.groups.is_empty()).then(|| serde_json::to_string(&s.groups).unwrap_or_default());
        tracing::info!(
            method = %self.method,
            code = code_name(tonic::Code::Ok),
            latency_ms = self.latency_ms,
            conversation = s.conversation.as_deref().unwrap_or(""),
            tools = s.tools,
            tokens = s.tokens.map(|(t, _)| t),
            domains = s.domains.as_deref().map(|d| tracing::field::display(d.json())),
            fallback = s.fallback,
            groups = groups.as_deref().map(tracing::field::display),
            "call"
        );
    }
}

/// Ends a call dropped before it answered, when dropped armed: `CANCELLED`, as gRPC names a
/// call its caller gave up (tonic answers a call past its `grpc-timeout` so).
struct Unanswered {
    /// The call while armed.
    call: Option<Ended>,
    /// The conversation the call named, once noted.
    conversation: NotedConversation,
}

impl Unanswered {
    /// Disarms it (the call answered, and the call log's line follows), giving the call back.
    fn answered(mut self) -> Ended {
        self.call.take().expect("armed until answered")
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        let Some(call) = self.call.take() else { return };
        let code = code_name(tonic::Code::Cancelled);
        call.observe(code, None);
        let elapsed = call.started.elapsed();
        let cause = call
            .cut_cause("the caller cancelled it or went away, or the daemon stopped at the drain timeout");
        let conversation = lock(&self.conversation).take();
        tracing::warn!(
            method = %logged_method(&call.path),
            code,
            latency_ms = elapsed.as_secs_f64() * 1000.0,
            conversation = conversation.as_deref().unwrap_or(""),
            cause = %cause,
            "call dropped before it answered"
        );
    }
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

/// Fields logged as JSON text (lists). The text log format shows that text
/// (`domains=["system:core","docker:keyword"]`); [`JsonLogFormat`] embeds it as a JSON value,
/// so a list field is a real JSON array, not a string.
pub(crate) const JSON_VALUED_FIELDS: &[&str] = &["domains", "groups", "manifests"];

/// The `--log-format json` event format: tracing-subscriber's JSON format (`F`), with the
/// fields in [`JSON_VALUED_FIELDS`] embedded as JSON values instead of strings. Events
/// without such a field are written by `F` untouched.
///
/// The call log's own events (this module's, outside any span, the common case: one per
/// call) are written directly in `F`'s shape, the JSON text copied in as it is: going through
/// `F` escapes a fallback answer's few kilobytes of domains into a string only to parse them
/// back out, which cost more than the rest of the call's logging.
pub(crate) struct JsonLogFormat<F>(pub F);

impl<S, N, F> FormatEvent<S, N> for JsonLogFormat<F>
where
    F: FormatEvent<S, N>,
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let fields = event.metadata().fields();
        if !JSON_VALUED_FIELDS.iter().any(|name| fields.field(name).is_some()) {
            return self.0.format_event(ctx, writer, event);
        }
        let in_span = event.parent().is_some() || ctx.lookup_current().is_some();
        if event.metadata().target() == module_path!() && !in_span {
            return write_call_line(&mut writer, event);
        }
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        for name in JSON_VALUED_FIELDS {
            embed_json_field(&mut line, name);
        }
        writer.write_str(&line)
    }
}

/// The `--log-format text` event format: tracing-subscriber's text format (`F`, which
/// decides on colour itself), with the line breaks an event's fields hold written as `\n`
/// and `\r`, so that one event is one line (SPEC §11) whatever it carries (the problems of
/// a refused manifest, one per line in the caller's status, as a failed call's cause). An
/// event without one is written exactly as `F` writes it.
pub(crate) struct TextLogFormat<F>(pub F);

impl<S, N, F> FormatEvent<S, N> for TextLogFormat<F>
where
    F: FormatEvent<S, N>,
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let mut line = OneLine {
            inner: &mut writer,
            held: false,
        };
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        if line.held {
            writer.write_char('\n')?;
        }
        Ok(())
    }
}

/// Writes through to `inner` with every `\r` and every `\n` but the last escaped: a
/// trailing `\n` is held back until more text follows it (then escaped) or the event ends
/// (then written).
struct OneLine<'a, 'w> {
    inner: &'a mut Writer<'w>,
    held: bool,
}

impl std::fmt::Write for OneLine<'_, '_> {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        if text.is_empty() {
            return Ok(());
        }
        if std::mem::take(&mut self.held) {
            self.inner.write_str("\\n")?;
        }
        let (mut rest, held) = match text.strip_suffix('\n') {
            Some(body) => (body, true),
            None => (text, false),
        };
        while let Some(at) = memchr::memchr2(b'\n', b'\r', rest.as_bytes()) {
            self.inner.write_str(&rest[..at])?;
            self.inner.write_str(if rest.as_bytes()[at] == b'\n' {
                "\\n"
            } else {
                "\\r"
            })?;
            rest = &rest[at + 1..];
        }
        self.inner.write_str(rest)?;
        self.held = held;
        Ok(())
    }
}

/// One event as tracing-subscriber's JSON format writes an event outside any span
/// (`timestamp`, `level`, `fields` in the event's order, `target`), with the fields in
/// [`JSON_VALUED_FIELDS`] copied in as the JSON text this module wrote for them.
fn write_call_line(writer: &mut Writer<'_>, event: &tracing::Event<'_>) -> std::fmt::Result {
    use tracing_subscriber::fmt::time::FormatTime as _;
    let mut line = String::with_capacity(512);
    line.push_str("{\"timestamp\":\"");
    tracing_subscriber::fmt::time::SystemTime.format_time(&mut Writer::new(&mut line))?;
    line.push_str("\",\"level\":\"");
    line.push_str(event.metadata().level().as_str());
    line.push_str("\",\"fields\":{");
    let mut fields = JsonFields {
        line,
        first: true,
        scratch: String::new(),
    };
    event.record(&mut fields);
    let mut line = fields.line;
    line.push_str("},\"target\":");
    push_json_str(&mut line, event.metadata().target());
    line.push_str("}\n");
    writer.write_str(&line)
}

/// Writes an event's fields as JSON members, as `tracing_serde` does: strings, numbers and
/// booleans as themselves, anything else as its `Debug` text.
struct JsonFields {
    line: String,
    first: bool,
    scratch: String,
}

impl JsonFields {
    fn key(&mut self, field: &tracing::field::Field) {
        if !std::mem::take(&mut self.first) {
            self.line.push(',');
        }
        push_json_str(&mut self.line, field.name());
        self.line.push(':');
    }

    fn integer(&mut self, field: &tracing::field::Field, value: impl std::fmt::Display) {
        use std::fmt::Write as _;
        self.key(field);
        let _ = write!(self.line, "{value}");
    }
}

impl tracing::field::Visit for JsonFields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write as _;
        self.key(field);
        if JSON_VALUED_FIELDS.contains(&field.name()) {
            // JSON text already: written into the line as it is.
            let _ = write!(self.line, "{value:?}");
        } else {
            self.scratch.clear();
            let _ = write!(self.scratch, "{value:?}");
            push_json_str(&mut self.line, &self.scratch);
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.key(field);
        push_json_str(&mut self.line, value);
    }

    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.key(field);
        // As serde_json writes it (shortest round trip; `null` when not finite).
        self.line
            .push_str(&serde_json::to_string(&value).unwrap_or_default());
    }

    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.integer(field, value);
    }

    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.integer(field, value);
    }

    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.key(field);
        self.line.push_str(if value { "true" } else { "false" });
    }
}

/// Whether `text` needs no escaping inside a JSON string.
fn is_plain(text: &str) -> bool {
    text.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\')
}

/// Appends `text` as a JSON string.
fn push_json_str(out: &mut String, text: &str) {
    if is_plain(text) {
        out.push('"');
        out.push_str(text);
        out.push('"');
    } else {
        // A string always serializes.
        out.push_str(&serde_json::to_string(text).unwrap_or_default());
    }
}

/// Replaces the string value of field `name` in the JSON `line` by the JSON text it holds,
/// when it holds JSON. Inside a JSON string every `"` is escaped, so `"name":` occurs only
/// where the field's key is (under "fields", or at the top level when flattened).
fn embed_json_field(line: &mut String, name: &str) {
    let key = format!("\"{name}\":");
    let Some(at) = line.find(&key) else { return };
    let start = at + key.len();
    let mut values = serde_json::Deserializer::from_str(&line[start..]).into_iter::<String>();
    let Some(Ok(text)) = values.next() else { return };
    let end = start + values.byte_offset();
    if serde_json::from_str::<serde::de::IgnoredAny>(&text).is_ok() {
        line.replace_range(start..end, &text);
    }
}

/// The contract's codes for what tonic refuses before the service sees a request. A request
/// over the decoding limit tonic answers `OUT_OF_RANGE`; gRPC's own servers (and this
/// daemon's documentation) answer `RESOURCE_EXHAUSTED` for a message larger than the
/// transport accepts, naming the limit of the service called (and so for one that would
/// decompress past it, which tonic answers `RESOURCE_EXHAUSTED` in its own words). A body that
/// cannot be decompressed, that is not one gRPC message, or whose message does not decode
/// (health and reflection use tonic's codec) tonic answers `INTERNAL`, which the contract
/// keeps for the daemon's own faults: it is the caller's, `INVALID_ARGUMENT`.
fn transport_refusals_in_the_contracts_codes<R>(response: &mut http::Response<R>) {
    let headers = response.headers_mut();
    let Some(status) = headers
        .get("grpc-status")
        .filter(|v| *v == "8" || *v == "11" || *v == "13")
    else {
        return;
    };
    let exhausted = status == "8";
    let refused_for_size = status == "11";
    let Some(tonic_message) = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .map(|m| {
            percent_encoding::percent_decode_str(m)
                .decode_utf8_lossy()
                .into_owned()
        })
    else {
        return;
    };
    let (code, message) = if exhausted {
        // "Error decompressing: size limit, of N bytes, exceeded while decompressing message"
        let Some(limit) = tonic_message
            .strip_prefix("Error decompressing: size limit, of ")
            .and_then(|rest| rest.split(' ').next())
        else {
            return;
        };
        (
            "8",
            format!("The request is over the transport limit of {limit} bytes once decompressed."),
        )
    } else if refused_for_size && tonic_message.contains("message length too large") {
        // "..., the limit is: N bytes"
        let limit = tonic_message
            .split("the limit is: ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(crate::codec::TRANSPORT_LIMIT_BYTES);
        (
            "8",
            format!("The request is over the transport limit of {limit} bytes."),
        )
    } else if let Some(detail) = (!refused_for_size)
        .then(|| tonic_message.strip_prefix("Error decompressing: "))
        .flatten()
    {
        let detail = detail.split(", while ").next().unwrap_or(detail);
        ("3", format!("The request cannot be decompressed: {detail}."))
    } else if let Some(message) = (!refused_for_size)
        .then(|| not_one_message(&tonic_message))
        .flatten()
    {
        ("3", message)
    } else if let Some(detail) = (!refused_for_size)
        .then(|| tonic_message.strip_prefix("failed to decode Protobuf message: "))
        .flatten()
    {
        ("3", format!("The request could not be decoded: {detail}"))
    } else {
        return;
    };
    headers.insert("grpc-status", http::HeaderValue::from_static(code));
    let encoded = percent_encoding::utf8_percent_encode(&message, GRPC_MESSAGE).to_string();
    if let Ok(v) = http::HeaderValue::from_str(&encoded) {
        headers.insert("grpc-message", v);
    }
}

/// tonic's words for a request body that is not one gRPC message (its framing is the
/// caller's, so `INVALID_ARGUMENT`), as the contract says them; `None` for any other text.
fn not_one_message(tonic_message: &str) -> Option<String> {
    // (A message flagged compressed in a call that names no encoding stays `INTERNAL`: gRPC's
    // compression rules say it MUST.)
    let what = if tonic_message.starts_with("protocol error: received message with invalid compression flag")
    {
        "its message's compressed flag is neither 0 nor 1"
    } else if tonic_message == "Unexpected EOF decoding stream." {
        "it ends before the message its length prefix announces"
    } else if tonic_message == "Missing request message." {
        "it holds no message"
    } else {
        return None;
    };
    Some(format!("The request is not a gRPC message: {what}."))
}

/// What a `grpc-message` value percent-encodes: controls, space, `%` and everything outside
/// ASCII's printable range (gRPC's rule).
const GRPC_MESSAGE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b' ').add(b'%');

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

// Shared by the gRPC listener (`server`) and the metrics endpoint.

/// An accept loop's pause while the process is out of file descriptors or kernel memory:
/// retrying at once fails again, so the loop waits, 10 ms doubling to 1 s, and logs once per
/// streak (and once when accepting works again) instead of spinning and filling the log.
#[derive(Debug)]
pub(crate) struct AcceptPause {
    /// How the listener's log lines begin ("" for the gRPC listener).
    listener: &'static str,
    delay: std::time::Duration,
    failing: bool,
}

impl AcceptPause {
    const FIRST: std::time::Duration = std::time::Duration::from_millis(10);
    const LONGEST: std::time::Duration = std::time::Duration::from_secs(1);

    pub(crate) fn new(listener: &'static str) -> AcceptPause {
        AcceptPause {
            listener,
            delay: Self::FIRST,
            failing: false,
        }
    }

    /// An accept succeeded: a streak of failures, if any, is over.
    pub(crate) fn accepted(&mut self) {
        if self.failing {
            tracing::info!("{}accepting connections again", self.listener);
            (self.delay, self.failing) = (Self::FIRST, false);
        }
    }

    /// An accept failed: how long to pause before the next one, or `None` when only that
    /// connection was lost (reset before it was accepted, and the like).
    pub(crate) fn failed(&mut self, e: &std::io::Error) -> Option<std::time::Duration> {
        if !out_of_resources(e) {
            tracing::debug!(error = %e, "{}accept failed", self.listener);
            return None;
        }
        if !self.failing {
            self.failing = true;
            tracing::error!(
                error = %e,
                "{}cannot accept connections: out of file descriptors; pausing the accept loop \
                 (raise the open-files limit, or lower the number of idle connections)",
                self.listener
            );
        }
        let pause = self.delay;
        self.delay = (self.delay * 2).min(Self::LONGEST);
        Some(pause)
    }
}

/// Whether an accept failed for lack of file descriptors or kernel memory.
fn out_of_resources(e: &std::io::Error) -> bool {
    #[cfg(unix)]
    {
        matches!(
            e.raw_os_error(),
            Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
        )
    }
    #[cfg(not(unix))]
    {
        let _ = e;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::tests::Captured;

    #[test]
    fn method_labels_are_the_served_calls_and_unknown_for_anything_else() {
        // Every RPC of the proto has its label, and no other.
        let proto = include_str!("../proto/toolrouter/v1/router.proto");
        let rpcs: Vec<&str> = proto
            .lines()
            .filter_map(|l| l.trim().strip_prefix("rpc "))
            .filter_map(|l| l.split(['(', ' ']).next())
            .collect();
        assert_eq!(rpcs, METHODS);
        for m in METHODS {
            assert_eq!(method_label(&format!("/toolrouter.v1.ToolRouter/{m}")), *m);
        }
        assert_eq!(
            method_label("/grpc.health.v1.Health/Check"),
            "/grpc.health.v1.Health/Check"
        );
        for path in [
            "/toolrouter.v1.ToolRouter/Bogus",
            "/x.y/Z",
            "/",
            "",
            "/toolrouter.v1.ToolRouter/",
        ] {
            assert_eq!(method_label(path), "unknown", "{path}");
        }
    }

    #[test]
    fn a_logged_method_is_the_served_name_or_the_callers_path_cut_and_escaped() {
        assert_eq!(logged_method("/toolrouter.v1.ToolRouter/Route"), "Route");
        assert_eq!(
            logged_method("/grpc.health.v1.Health/Check"),
            "/grpc.health.v1.Health/Check"
        );
        let long = format!("/{}/x", "A".repeat(15_000));
        assert_eq!(logged_method(&long), format!("/{}…", "A".repeat(127)));
        let forged = "/x\n{\"level\":\"ERROR\"}";
        assert!(!logged_method(forged).contains('\n'), "{}", logged_method(forged));
        assert!(logged_method("/toolrouter.v1.ToolRouter/Nope").starts_with("/toolrouter.v1.ToolRouter/"));
    }

    #[test]
    fn a_callers_deadline_is_read_from_grpc_timeout_and_a_malformed_one_is_none() {
        let cases: &[(&str, Option<Duration>)] = &[
            ("300m", Some(Duration::from_millis(300))),
            ("2S", Some(Duration::from_secs(2))),
            ("1H", Some(Duration::from_secs(3600))),
            ("5M", Some(Duration::from_secs(300))),
            ("250u", Some(Duration::from_micros(250))),
            ("99999999n", Some(Duration::from_nanos(99_999_999))),
            // Nine digits, no digits, no unit, a unit gRPC does not define, a sign.
            ("123456789m", None),
            ("m", None),
            ("300", None),
            ("3s", None),
            ("-3S", None),
            ("3 S", None),
            ("3é", None),
        ];
        for &(value, want) in cases {
            let mut headers = http::HeaderMap::new();
            headers.insert(
                "grpc-timeout",
                http::HeaderValue::from_bytes(value.as_bytes()).unwrap(),
            );
            assert_eq!(grpc_timeout(&headers), want, "{value}");
        }
        assert_eq!(grpc_timeout(&http::HeaderMap::new()), None);
    }

    #[test]
    fn a_conversation_hash_is_short_stable_and_not_the_id() {
        let h = conversation_hash("user-42");
        assert_eq!(h.len(), 8);
        assert_eq!(h, conversation_hash("user-42"));
        assert_ne!(h, conversation_hash("user-43"));
        assert!(!h.contains("user"));
        // Ids one character apart get hashes apart in most digits, not in one.
        for (a, b) in [
            ("conv-1", "conv-2"),
            ("user-42", "user-43"),
            ("a", "b"),
            ("db0", "db1"),
        ] {
            let (a, b) = (conversation_hash(a), conversation_hash(b));
            let differ = a.chars().zip(b.chars()).filter(|(x, y)| x != y).count();
            assert!(differ >= 5, "{a} {b}");
        }
    }

    #[test]
    fn a_json_valued_field_is_embedded_where_its_key_is_and_nowhere_else() {
        let cases = [
            // Under "fields", and flattened at the top level.
            (
                r#"{"level":"INFO","fields":{"message":"call","domains":"[\"a:core\",\"b:fallback\"]","tools":3}}"#,
                r#"{"level":"INFO","fields":{"message":"call","domains":["a:core","b:fallback"],"tools":3}}"#,
            ),
            (r#"{"domains":"[]","x":1}"#, r#"{"domains":[],"x":1}"#),
            // A string that is not JSON stays a string.
            (
                r#"{"domains":"not json","x":1}"#,
                r#"{"domains":"not json","x":1}"#,
            ),
            // The key's text inside another value is escaped there, so it is not the key.
            (
                r#"{"cause":"bad \"domains\":\"[1]\"","domains":"[2]"}"#,
                r#"{"cause":"bad \"domains\":\"[1]\"","domains":[2]}"#,
            ),
            // No such field, or not a string: unchanged.
            (
                r#"{"fields":{"message":"call"}}"#,
                r#"{"fields":{"message":"call"}}"#,
            ),
            (r#"{"domains":7}"#, r#"{"domains":7}"#),
        ];
        for (line, want) in cases {
            let mut got = line.to_string();
            embed_json_field(&mut got, "domains");
            assert_eq!(got, want, "{line}");
            serde_json::from_str::<serde_json::Value>(&got).unwrap();
        }
    }

    /// The lines one `event` gives with `--log-format json`'s event format and with
    /// tracing-subscriber's own JSON format (the reference), timestamps blanked.
    fn json_lines(event: impl Fn()) -> (String, String) {
        let blank_time = |buf: &Captured| {
            let text = buf.text();
            let at = text.find("\",\"level\"").unwrap();
            format!("{{\"timestamp\":\"T{}", &text[at..])
        };
        let (ours, reference) = (Captured::default(), Captured::default());
        let w = ours.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .event_format(JsonLogFormat(tracing_subscriber::fmt::format().json()))
            .with_writer(move || w.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, &event);
        let w = reference.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_writer(move || w.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, &event);
        (blank_time(&ours), blank_time(&reference))
    }

    #[test]
    fn a_failed_calls_line_always_has_a_cause() {
        // (status message, code, the cause logged)
        let cases = [
            (
                "",
                tonic::Code::Unimplemented,
                "no service of this daemon has this method",
            ),
            ("", tonic::Code::Unavailable, "(the answer gave no message)"),
            (
                "Unknown profile 'x'.",
                tonic::Code::InvalidArgument,
                "Unknown profile 'x'.",
            ),
        ];
        for (message, code, cause) in cases {
            let (logs, _default) = Captured::on_this_thread();
            Ended {
                path: "/toolrouter.v1.ToolRouter/Bogus".into(),
                started: Instant::now(),
                metrics: None,
                deadline: None,
            }
            .failed(code, message, None, None);
            let text = logs.text();
            assert!(text.contains(&format!("cause={cause}")), "{message:?}: {text}");
        }
    }

    #[test]
    fn a_call_line_is_written_once_after_the_answer_or_when_the_runtime_drops_its_task() {
        // Whether the task gets its turn before the runtime goes: one line either way.
        for runs in [true, false] {
            let (logs, default) = Captured::on_this_thread();
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            runtime.block_on(async {
                CallLine {
                    method: "Route".into(),
                    latency_ms: 0.5,
                    summary: CallSummary::default(),
                }
                .write_after_the_answer();
                assert!(logs.text().is_empty(), "written before the answer");
                if runs {
                    for _ in 0..4 {
                        tokio::task::yield_now().await;
                    }
                    assert!(!logs.text().is_empty(), "not written once its task ran");
                }
            });
            // Dropping the runtime drops a task that never ran.
            drop(runtime);
            drop(default);
            let text = logs.text();
            assert_eq!(text.matches(" call ").count(), 1, "runs {runs}: {text}");
            assert!(text.contains("method=Route"), "{text}");
        }
    }

    #[test]
    fn the_call_line_is_the_json_format_with_its_list_embedded() {
        let domains = r#"["a:core","b\"x:fallback"]"#;
        let (ours, reference) = json_lines(|| {
            // The call log's target, as its events in `Logged` have.
            tracing::info!(
                target: "toolrouter::telemetry",
                method = %"Route",
                code = "OK",
                latency_ms = 0.25,
                big = 1e300,
                nan = f64::NAN,
                conversation = "tab\there \"quoted\" \\ é",
                tools = 3u64,
                below = -3i64,
                domains = %domains,
                fallback = false,
                cause = ?Some("debug"),
                "call"
            );
        });
        let mut want = reference.clone();
        embed_json_field(&mut want, "domains");
        assert_eq!(ours, want);
        assert!(ours.ends_with('\n'));
        let v: serde_json::Value = serde_json::from_str(&ours).unwrap();
        assert_eq!(v["fields"]["domains"][1], "b\"x:fallback");
        assert_eq!(v["fields"]["nan"], serde_json::Value::Null);

        // Inside a span the reference format writes the span too; the embedding still holds.
        let (ours, reference) = json_lines(|| {
            let span = tracing::info_span!("outer", id = 7);
            let _entered = span.enter();
            tracing::info!(target: "toolrouter::telemetry", domains = %"[]", "call");
        });
        let mut want = reference;
        embed_json_field(&mut want, "domains");
        assert_eq!(ours, want);
        assert!(ours.contains(r#""spans":[{"id":7,"name":"outer"}]"#), "{ours}");
    }

    /// The text one `event` gives with `--log-format text`'s event format and with
    /// tracing-subscriber's own, timestamps left out, with colour codes or without.
    fn text_lines(ansi: bool, event: impl Fn()) -> (String, String) {
        let (ours, reference) = (Captured::default(), Captured::default());
        let w = ours.clone();
        let subscriber = tracing_subscriber::fmt()
            .event_format(TextLogFormat(
                tracing_subscriber::fmt::format().without_time().with_ansi(ansi),
            ))
            .with_writer(move || w.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, &event);
        let w = reference.clone();
        let subscriber = tracing_subscriber::fmt()
            .without_time()
            .with_ansi(ansi)
            .with_writer(move || w.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, &event);
        (ours.text(), reference.text())
    }

    #[test]
    fn a_text_log_line_is_one_line_whatever_its_fields_hold() {
        // A failed call's cause listing a refused manifest's problems, one per line.
        let cause = "The domain is refused; nothing changed.\nmanifest_json:1:1: malformed JSON\r\nnext";
        let (ours, reference) = text_lines(false, || {
            tracing::warn!(method = %"UpsertDomain", cause = %cause, "call failed");
        });
        assert_eq!(reference.lines().count(), 3, "{reference}");
        assert_eq!(ours.matches('\n').count(), 1, "{ours}");
        assert!(ours.ends_with('\n'), "{ours}");
        assert!(!ours.contains('\r'), "{ours}");
        assert_eq!(
            ours,
            reference.replace("\r", "\\r").replacen('\n', "\\n", 2),
            "the same line, its breaks escaped"
        );
        // Breaks in the message, and at the end of a field's text, are escaped too.
        let (ours, _) = text_lines(false, || tracing::info!(note = %"ends\n", "two\nlines"));
        assert!(
            ours.contains("two\\nlines") && ours.contains("note=ends\\n"),
            "{ours}"
        );
        assert_eq!(ours.matches('\n').count(), 1, "{ours}");
        // In colour too: the same coloured line, its breaks escaped.
        let (ours, reference) = text_lines(true, || {
            tracing::warn!(method = %"UpsertDomain", cause = %cause, "call failed");
        });
        assert!(ours.contains('\u{1b}'), "{ours}");
        assert_eq!(ours.matches('\n').count(), 1, "{ours}");
        assert_eq!(ours, reference.replace("\r", "\\r").replacen('\n', "\\n", 2));
        // Without a break: exactly tracing-subscriber's line, in colour on a terminal too.
        for ansi in [false, true] {
            let (ours, reference) = text_lines(ansi, || {
                tracing::info!(target: "toolrouter::telemetry", method = %"Route", domains = %r#"["a:core"]"#, "call");
            });
            assert_eq!(ours, reference);
            assert_eq!(ours.contains('\u{1b}'), ansi, "{ours}");
        }
    }

    #[test]
    fn routed_domains_are_logged_as_a_json_array_of_name_and_reason() {
        let registry = Arc::new(crate::registry::Registry::demo());
        let first = registry.domain_ids().next().unwrap();
        let last = registry.domain_ids().last().unwrap();
        let routed = RoutedDomains::new(
            Arc::clone(&registry),
            vec![(first, Reason::Core), (last, Reason::Fallback)],
        );
        let want = serde_json::json!([
            format!("{}:core", registry.domain(first).name),
            format!("{}:fallback", registry.domain(last).name),
        ]);
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(routed.json()).unwrap(),
            want
        );
        assert_eq!(routed.json(), routed.to_json(), "written once, the same text");
        let none = RoutedDomains::new(registry, Vec::new());
        assert_eq!(none.json(), "[]");
    }

    #[test]
    fn route_reasons_are_counted_per_domain_and_reason() {
        let registry = Arc::new(crate::registry::Registry::demo());
        let (first, last) = (
            registry.domain_ids().next().unwrap(),
            registry.domain_ids().last().unwrap(),
        );
        let summary = CallSummary {
            domains: Some(Arc::new(RoutedDomains::new(
                Arc::clone(&registry),
                vec![(first, Reason::Core), (last, Reason::Fallback)],
            ))),
            ..CallSummary::default()
        };
        let metrics = Metrics::new();
        metrics.observe("Route", "OK", 0.001, Some(&summary));
        metrics.observe("Route", "OK", 0.001, Some(&summary));
        let count = |d: DomainId, r: &str| {
            let name = registry.domain(d).name.as_str();
            metrics.inner.route_domains.with_label_values(&[name, r]).get()
        };
        assert_eq!(count(first, "core"), 2);
        assert_eq!(count(last, "fallback"), 2);
        assert_eq!(count(first, "fallback"), 0);
    }

    #[test]
    fn every_metric_registers() {
        let a = Metrics::new();
        let b = Metrics::new();
        a.observe("Route", "OK", 0.001, None);
        assert_eq!(a.inner.requests.with_label_values(&["Route", "OK"]).get(), 1);
        assert_eq!(b.inner.requests.with_label_values(&["Route", "OK"]).get(), 0);
    }
}
