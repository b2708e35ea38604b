//! The tower layer that logs and measures every call.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tonic::codegen::http;
use tower_service::Service;

use super::{
    CALL_CONVERSATION, CallSummary, Metrics, NotedConversation, code_name, lock, logged_method, method_label,
};

/// The target of the call log's lines: what `RUST_LOG` names to filter them (README, Logs)
/// and the JSON lines' `target`, the same whichever file of this module writes them. The
/// JSON log format writes these lines on a path of its own.
pub(super) const TARGET: &str = "toolrouter::telemetry";

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
    S: Service<http::Request<RequestBody<B>>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: std::fmt::Display,
    B: http_body::Body<Error = tonic::Status> + Unpin + Send + 'static,
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
        let broken = Arc::new(AtomicBool::new(false));
        let request = request.map(|inner| RequestBody {
            inner,
            broken: Arc::clone(&broken),
        });
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
            // However the service answered a request whose stream broke under it (tonic reads
            // a stream its caller reset as one that ended, so a unary call finds no message),
            // nobody is there to read the answer: the caller gave the call up.
            let gone = broken.load(Ordering::Relaxed);
            let mut response = match result {
                Ok(response) => response,
                Err(e) if gone => {
                    call.dropped(REQUEST_BROKEN, conversation.as_deref());
                    return Err(e);
                }
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
                Some(_) if gone => call.dropped(REQUEST_BROKEN, conversation.as_deref()),
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
        millis(self.started.elapsed())
    }

    /// A call answered OK: its info line, written after the answer when `after_the_answer`
    /// (health probes and reflection, frequent and telling little, at debug).
    fn succeeded(self, summary: CallSummary, after_the_answer: bool) {
        self.observe(code_name(tonic::Code::Ok), Some(&summary));
        let method = logged_method(&self.path);
        let latency_ms = self.latency_ms();
        if method.starts_with("/grpc.") {
            tracing::debug!(target: TARGET, method = %method, code = code_name(tonic::Code::Ok), latency_ms, "call");
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
            target: TARGET,
            method = %logged_method(&self.path),
            code = code_name,
            latency_ms = self.latency_ms(),
            conversation = conversation.unwrap_or(""),
            cause = %cause,
            "call failed"
        );
    }

    /// A call dropped before it answered, or whose answer nobody is there to read:
    /// `CANCELLED`, as gRPC names a call its caller gave up, with `cause`.
    fn dropped(self, cause: &str, conversation: Option<&str>) {
        let code = code_name(tonic::Code::Cancelled);
        self.observe(code, None);
        tracing::warn!(
            target: TARGET,
            method = %logged_method(&self.path),
            code,
            latency_ms = self.latency_ms(),
            conversation = conversation.unwrap_or(""),
            cause = %cause,
            "call dropped before it answered"
        );
    }

    /// A call whose answer failed in the transport (no gRPC status).
    fn transport_error(self, e: &dyn std::fmt::Display) {
        self.observe("TRANSPORT_ERROR", None);
        tracing::warn!(
            target: TARGET,
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
                target: TARGET,
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

/// `d` in milliseconds, to the nanosecond as a decimal reads it: 11,407 ns is `0.011407`,
/// where `as_secs_f64() * 1000.0` gives `0.011406999999999999` (dividing the exact count of
/// nanoseconds once rounds to the nearest double of the decimal).
fn millis(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1e6
}

/// The deadline a caller set on its call (`grpc-timeout`: at most 8 digits and a unit).
pub(crate) fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
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
            target: TARGET,
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
        let cause = call
            .cut_cause("the caller cancelled it or went away, or the daemon stopped at the drain timeout");
        let conversation = lock(&self.conversation).take();
        call.dropped(&cause, conversation.as_deref());
    }
}

/// Why a call whose request broke was dropped (see [`RequestBody`]).
const REQUEST_BROKEN: &str = "the caller reset the call or lost its connection while sending the request";

/// A request's body as the call log passes it on, noting whether the caller gave the call
/// up before the request was whole: it reset the stream (`CANCEL`, which tonic reads as the
/// end of the request), or its connection went (an h2 error without a reason, `UNKNOWN`).
/// Other transport errors (a protocol error, the keepalive's timeout, too many resets) are
/// not noted: the call is logged with the code tonic gives them. The body itself is
/// unchanged.
pub(crate) struct RequestBody<B> {
    inner: B,
    broken: Arc<AtomicBool>,
}

impl<B: http_body::Body<Error = tonic::Status> + Unpin> http_body::Body for RequestBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Err(e))) = &frame
            && matches!(e.code(), tonic::Code::Cancelled | tonic::Code::Unknown)
        {
            self.broken.store(true, Ordering::Relaxed);
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::tests::Captured;

    /// A call's latency is logged as the decimal of its nanoseconds in milliseconds, with no
    /// digits of binary rounding after it.
    #[test]
    fn latency_reads_as_its_decimal_milliseconds() {
        for (nanos, logged) in [
            (11_407, "0.011407"),
            (2_121_172, "2.121172"),
            (300_000_000, "300.0"),
            (1, "1e-6"),
            (0, "0.0"),
            (86_400_000_000_001, "86400000.000001"),
        ] {
            let ms = millis(Duration::from_nanos(nanos));
            assert_eq!(serde_json::to_string(&ms).unwrap(), logged, "{nanos} ns");
        }
    }

    /// A request body that fails with `status` at once.
    struct Failing(Option<tonic::Status>);

    impl http_body::Body for Failing {
        type Data = bytes::Bytes;
        type Error = tonic::Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
            Poll::Ready(self.0.take().map(Err))
        }
    }

    #[test]
    fn a_request_body_notes_only_a_caller_that_gave_the_call_up() {
        use tonic::Status;
        let cases = [
            (
                Status::cancelled("h2 protocol error: stream reset by peer (CANCEL)"),
                true,
            ),
            (
                Status::unknown("h2 protocol error: error reading a body from connection"),
                true,
            ),
            (Status::internal("h2 protocol error: PROTOCOL_ERROR"), false),
            (Status::unavailable("keep-alive timed out"), false),
            (
                Status::resource_exhausted("h2 protocol error: ENHANCE_YOUR_CALM"),
                false,
            ),
        ];
        let waker = std::task::Waker::noop();
        for (status, gave_up) in cases {
            let code = status.code();
            let broken = Arc::new(AtomicBool::new(false));
            let mut body = RequestBody {
                inner: Failing(Some(status)),
                broken: Arc::clone(&broken),
            };
            let frame = http_body::Body::poll_frame(Pin::new(&mut body), &mut Context::from_waker(waker));
            assert!(
                matches!(frame, Poll::Ready(Some(Err(_)))),
                "{code:?}: passed on as it came"
            );
            assert_eq!(broken.load(Ordering::Relaxed), gave_up, "{code:?}");
        }
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
            // The target `RUST_LOG` filters on (README, Logs), whichever file writes the line.
            assert!(text.contains(" toolrouter::telemetry: call "), "{text}");
        }
    }
}
