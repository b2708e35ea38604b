//! The daemon's Prometheus metrics and the `/metrics` endpoint.

use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwapOption;
use prometheus::{
    Encoder as _, Gauge, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use super::{AcceptPause, CallSummary, METHODS, code_name};
use crate::registry;
use crate::router::Reason;
use crate::state::State;

/// `toolrouter_route_domains_total`'s counter for each domain (by index) and [`Reason`] (by
/// discriminant) of one registry, each fetched when first counted.
struct RouteCounters {
    version: u64,
    cells: Vec<[OnceLock<IntCounter>; REASONS]>,
}

/// How many [`Reason`]s there are.
const REASONS: usize = 6;
const _: () = assert!(Reason::Fallback as usize == REASONS - 1);
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

    pub(super) fn observe(&self, method: &str, code: &str, seconds: f64, summary: Option<&CallSummary>) {
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
            let asked = Asked::of(&head);
            let (status, body, allow) = match asked {
                Asked::Metrics => ("200 OK", metrics.render(&state).await, ""),
                Asked::NotFound => ("404 Not Found", "try /metrics\n".to_string(), ""),
                Asked::NotAllowed => (
                    "405 Method Not Allowed",
                    "GET or HEAD /metrics\n".to_string(),
                    "allow: GET, HEAD\r\n",
                ),
            };
            // A HEAD is answered the headers a GET would get, without the body (HTTP sends
            // none in an answer to a HEAD, whatever its status).
            let sent = if Asked::is_head(&head) { "" } else { body.as_str() };
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\ncontent-length: {}\r\n{allow}connection: close\r\n\r\n{sent}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

/// What a request to the metrics endpoint asks, from its request line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Asked {
    /// `GET` or `HEAD` of `/metrics` (a query string is ignored; whether it is a `HEAD`,
    /// [`Asked::is_head`] tells, for any path).
    Metrics,
    /// Another path.
    NotFound,
    /// Another method on `/metrics`.
    NotAllowed,
}

impl Asked {
    /// Whether the request is a `HEAD` (of any path), read as [`Asked::of`] reads it.
    fn is_head(head: &str) -> bool {
        head.split_whitespace().next() == Some("HEAD")
    }

    fn of(head: &str) -> Asked {
        let mut line = head.split_whitespace();
        let (method, path) = (line.next().unwrap_or(""), line.next().unwrap_or(""));
        if path != "/metrics" && !path.starts_with("/metrics?") {
            return Asked::NotFound;
        }
        match method {
            "GET" | "HEAD" => Asked::Metrics,
            _ => Asked::NotAllowed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::DomainId;
    use crate::telemetry::RoutedDomains;

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
    fn the_endpoint_serves_get_and_head_of_metrics_only() {
        let cases = [
            ("GET /metrics HTTP/1.1\r\n", Asked::Metrics),
            ("GET /metrics?name[]=x HTTP/1.1\r\n", Asked::Metrics),
            ("HEAD /metrics HTTP/1.1\r\n", Asked::Metrics),
            ("POST /metrics HTTP/1.1\r\n", Asked::NotAllowed),
            ("PUT /metrics?x HTTP/1.1\r\n", Asked::NotAllowed),
            ("get /metrics HTTP/1.1\r\n", Asked::NotAllowed),
            ("GET / HTTP/1.1\r\n", Asked::NotFound),
            ("GET /metricsx HTTP/1.1\r\n", Asked::NotFound),
            ("POST /other HTTP/1.1\r\n", Asked::NotFound),
            ("", Asked::NotFound),
            ("garbage", Asked::NotFound),
        ];
        for (head, want) in cases {
            assert_eq!(Asked::of(head), want, "{head:?}");
        }
        // A body goes to no HEAD, whatever it asks; read as the request line is read.
        for (head, is_head) in [
            ("HEAD /metrics HTTP/1.1\r\n", true),
            ("\r\nHEAD /metrics HTTP/1.1\r\n", true),
            ("HEAD /other HTTP/1.1\r\n", true),
            ("GET /metrics HTTP/1.1\r\n", false),
            ("HEADX /metrics HTTP/1.1\r\n", false),
        ] {
            assert_eq!(Asked::is_head(head), is_head, "{head:?}");
            if is_head && head.contains("/metrics") {
                assert_eq!(Asked::of(head), Asked::Metrics, "{head:?}");
            }
        }
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
