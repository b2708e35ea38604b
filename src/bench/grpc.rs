//! The load generator: a tonic client that sends `Route` requests at a fixed concurrency for a
//! fixed time, checks every status, decodes every response, and reports requests/s and
//! latency percentiles (HdrHistogram).

use std::path::Path;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::Value;
use tonic::transport::Endpoint;

use crate::proto::{RouteRequest, tool_router_client::ToolRouterClient};

/// What one run measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// Requests answered OK per second.
    pub requests_per_sec: f64,
    /// Median latency, microseconds.
    pub p50_us: u64,
    /// 99th percentile latency, microseconds.
    pub p99_us: u64,
    /// 99.9th percentile latency, microseconds.
    pub p999_us: u64,
    /// Requests that failed (any non-OK status or transport error).
    pub errors: u64,
    /// Requests answered OK.
    pub ok: u64,
    /// Concurrent in-flight requests.
    pub concurrency: usize,
    /// Measured duration, seconds.
    pub seconds: f64,
}

/// Reads messages: one per line, each a JSON string, a JSON object with `query` or
/// `message` (so the eval `queries.jsonl` files work as they are), or plain text.
///
/// # Errors
/// An unreadable file, or one without any message.
pub fn read_messages(path: &Path) -> crate::Result<Vec<String>> {
    let text = std::fs::read_to_string(path).map_err(|source| crate::Error::Io {
        context: format!("cannot read {}", path.display()),
        source,
    })?;
    let messages: Vec<String> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| match serde_json::from_str::<Value>(line) {
            Ok(Value::String(s)) => s,
            Ok(Value::Object(o)) => o
                .get("query")
                .or_else(|| o.get("message"))
                .and_then(Value::as_str)
                .unwrap_or(line)
                .to_string(),
            _ => line.to_string(),
        })
        .collect();
    if messages.is_empty() {
        return Err(crate::Error::Config(format!(
            "{} holds no messages",
            path.display()
        )));
    }
    Ok(messages)
}

/// A latency histogram from 1 µs to 60 s at 3 significant digits.
fn histogram() -> Histogram<u64> {
    // The bounds are constants within what HdrHistogram accepts, so this cannot fail.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// Sends `Route` requests to `addr` from `concurrency` tasks for `duration`.
///
/// # Errors
/// When the daemon cannot be reached at all.
pub async fn run(
    addr: &str,
    duration: Duration,
    concurrency: usize,
    messages: Vec<String>,
) -> crate::Result<Report> {
    let channel = Endpoint::from_shared(addr.to_string())
        .map_err(|e| crate::Error::Config(format!("invalid address {addr:?}: {e}")))?
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| crate::Error::Config(format!("cannot reach {addr}: {e}")))?;
    let messages = std::sync::Arc::new(messages);
    // A short warm-up so connection set-up and first-touch allocation are not measured.
    let warmup = Duration::from_millis(500).min(duration / 10);
    let start = Instant::now();
    let measure_from = start + warmup;
    let deadline = measure_from + duration;
    let mut tasks = Vec::with_capacity(concurrency);
    for worker in 0..concurrency {
        let mut client = ToolRouterClient::new(channel.clone()).max_decoding_message_size(64 << 20);
        let messages = messages.clone();
        tasks.push(tokio::spawn(async move {
            let mut hist = histogram();
            let (mut ok, mut errors) = (0u64, 0u64);
            let mut i = worker;
            loop {
                let sent = Instant::now();
                if sent >= deadline {
                    break;
                }
                let message = messages[i % messages.len()].clone();
                i += 1;
                let result = client
                    .route(RouteRequest {
                        message,
                        conversation_id: String::new(),
                    })
                    .await;
                let took = sent.elapsed();
                if sent < measure_from {
                    continue;
                }
                match result {
                    Ok(r) if !r.get_ref().tools.is_empty() || !r.get_ref().domains.is_empty() => {
                        ok += 1;
                        hist.saturating_record(took.as_micros() as u64);
                    }
                    _ => errors += 1,
                }
            }
            (hist, ok, errors)
        }));
    }
    let mut hist = histogram();
    let (mut ok, mut errors) = (0, 0);
    for t in tasks {
        let (h, o, e) = t
            .await
            .map_err(|e| crate::Error::Config(format!("load task failed: {e}")))?;
        hist.add(h)
            .map_err(|e| crate::Error::Config(format!("histogram merge: {e}")))?;
        ok += o;
        errors += e;
    }
    let seconds = duration.as_secs_f64();
    Ok(Report {
        requests_per_sec: ok as f64 / seconds,
        p50_us: hist.value_at_quantile(0.50),
        p99_us: hist.value_at_quantile(0.99),
        p999_us: hist.value_at_quantile(0.999),
        errors,
        ok,
        concurrency,
        seconds,
    })
}
