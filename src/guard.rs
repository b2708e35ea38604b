//! Admission control in front of every service but health: the bearer token, the
//! concurrency limit with load shedding, and the per-request timeout. One tower layer, so
//! the services behind it stay unaware of all three.
//!
//! - **gRPC only** (health included). A request whose content type is not
//!   `application/grpc` (or `application/grpc+…`) is answered HTTP 415, as gRPC's protocol
//!   asks, with `INVALID_ARGUMENT` naming the content type.
//! - **Auth.** With a token configured, a call without `authorization: Bearer <token>` is
//!   answered `UNAUTHENTICATED`; the token is compared in constant time.
//! - **Load shedding.** At most `max_concurrent` calls run at once; one more is answered
//!   `RESOURCE_EXHAUSTED` at once instead of queueing without bound.
//! - **Timeout.** A call that runs longer than `timeout` is answered `DEADLINE_EXCEEDED`
//!   (its work is dropped; nothing it did not finish is acknowledged).
//!
//! - **Drain.** Once the server drains, a new call is answered `UNAVAILABLE` (retry on
//!   another replica) and [`Guard::drain`] resolves when the calls in flight have finished.
//!
//! Health stays outside auth, shedding and the drain, so a load balancer can probe an
//! overloaded, locked-down or draining daemon (it answers `NOT_SERVING` then); its request
//! must still arrive within the timeout.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use subtle::ConstantTimeEq as _;
use tokio::sync::Semaphore;
use tonic::Status;
use tonic::codegen::http;
use tower_service::Service;

/// Paths under this prefix (gRPC health) skip the guard.
const HEALTH_PREFIX: &str = "/grpc.health.v1.Health/";

/// The streamed answers (server and bidirectional streams): each holds one of the open
/// streams the guard allows for as long as it is open (health's too), and the call log's
/// line and count wait for its end.
pub(crate) const STREAMS: &[&str] = &[
    "/toolrouter.v1.ToolRouter/WatchRegistry",
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
];

/// The policy; a tower layer. Cloning is shallow.
#[derive(Clone)]
pub(crate) struct Guard {
    policy: Arc<Policy>,
}

/// The profile a call's auth token is bound to (SPEC §10), in its request extensions.
#[derive(Debug, Clone)]
pub(crate) struct BoundProfile(pub Arc<str>);

struct Policy {
    /// `auth_token`, bound to no profile.
    token: Option<Box<[u8]>>,
    /// Tokens bound to a profile.
    bound: Vec<(Box<[u8]>, Arc<str>)>,
    permits: Arc<Semaphore>,
    /// Open streams, each held until its answer ends: a stream outlives its call's permit,
    /// and streams nobody reads must not add up without bound (health's need no token).
    streams: Arc<Semaphore>,
    max_concurrent: usize,
    timeout: Duration,
    /// Set when the server starts draining: new calls are refused from then on.
    draining: AtomicBool,
}

impl Guard {
    /// A guard requiring `token` or one of the tokens `bound` to a profile (token, profile),
    /// when any is given: a call with a bound token carries [`BoundProfile`]. It admits
    /// `max_concurrent` calls at once and allows each `timeout`.
    pub fn new(
        token: Option<&str>,
        bound: &[(&str, &str)],
        max_concurrent: usize,
        timeout: Duration,
    ) -> Guard {
        Guard {
            policy: Arc::new(Policy {
                token: token.map(|t| t.as_bytes().into()),
                bound: bound
                    .iter()
                    .map(|&(t, p)| (t.as_bytes().into(), p.into()))
                    .collect(),
                permits: Arc::new(Semaphore::new(max_concurrent)),
                streams: Arc::new(Semaphore::new(max_concurrent)),
                max_concurrent,
                timeout,
                draining: AtomicBool::new(false),
            }),
        }
    }

    /// Refuses new calls from now on and resolves once every call in flight has finished.
    pub async fn drain(&self) {
        self.policy.draining.store(true, Ordering::SeqCst);
        // Every call holds one permit, so holding them all means none is in flight. The
        // semaphore is never closed, so the acquire cannot fail.
        let all = u32::try_from(self.policy.max_concurrent).unwrap_or(u32::MAX);
        let _ = self.policy.permits.acquire_many(all).await;
    }
}

impl Policy {
    /// Checks the bearer token; `Ok(Some(profile))` for a token bound to a profile.
    fn authorize(&self, headers: &http::HeaderMap) -> Result<Option<Arc<str>>, Status> {
        if self.token.is_none() && self.bound.is_empty() {
            return Ok(None);
        }
        let Some(value) = headers.get(http::header::AUTHORIZATION) else {
            return Err(Status::unauthenticated(
                "This daemon requires 'authorization: Bearer <token>' metadata on every call.",
            ));
        };
        let value = value.as_bytes();
        // The scheme is case-insensitive (RFC 9110); the token is compared in constant time.
        let scheme_ok = value.len() > 7 && value[..7].eq_ignore_ascii_case(b"bearer ");
        let given = value.get(7..).unwrap_or_default();
        // Every token is compared, so the time taken does not tell which one was close.
        let main = self
            .token
            .as_ref()
            .is_some_and(|expected| bool::from(given.ct_eq(expected)));
        let mut profile = None;
        for (expected, p) in &self.bound {
            if bool::from(given.ct_eq(expected)) {
                profile = Some(p.clone());
            }
        }
        if scheme_ok && (main || profile.is_some()) {
            Ok(profile)
        } else {
            Err(Status::unauthenticated(
                "The bearer token is not the one this daemon was started with.",
            ))
        }
    }
}

impl<S> tower_layer::Layer<S> for Guard {
    type Service = Guarded<S>;

    fn layer(&self, inner: S) -> Guarded<S> {
        Guarded {
            inner,
            policy: self.policy.clone(),
        }
    }
}

/// A service behind the guard.
#[derive(Clone)]
pub(crate) struct Guarded<S> {
    inner: S,
    policy: Arc<Policy>,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B, R> Service<http::Request<B>> for Guarded<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = http::Response<Held<R>>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let refuse = |status: Status| -> Self::Future {
            Box::pin(async move { Ok(status.into_http::<R>().map(Held::from)) })
        };
        if let Some(status) = not_grpc(request.headers()) {
            // HTTP 415, as gRPC's protocol asks, so a client that is not gRPC's does not take
            // the answer for a success; the gRPC status says why to one that is.
            let mut response = status.into_http::<R>();
            *response.status_mut() = http::StatusCode::UNSUPPORTED_MEDIA_TYPE;
            return Box::pin(async move { Ok(response.map(Held::from)) });
        }
        // A stream holds one of the open streams allowed until its answer ends.
        let stream = if STREAMS.contains(&request.uri().path()) {
            match self.policy.streams.clone().try_acquire_owned() {
                Ok(held) => Some(held),
                Err(_) => {
                    return refuse(Status::resource_exhausted(format!(
                        "The daemon is at its limit of {} open streams; retry shortly.",
                        self.policy.max_concurrent
                    )));
                }
            }
        } else {
            None
        };
        let held = move |response: http::Response<R>| {
            response.map(|inner| Held {
                inner,
                _stream: stream,
            })
        };
        if request.uri().path().starts_with(HEALTH_PREFIX) {
            // No token, no shedding, no refusal while draining; but the request must arrive
            // within the timeout, or a stream whose request is never finished is held for good.
            let answer = within(self.policy.timeout, self.inner.call(request));
            return Box::pin(async move { answer.await.map(held) });
        }
        match self.policy.authorize(request.headers()) {
            Ok(None) => {}
            Ok(Some(profile)) => {
                request.extensions_mut().insert(BoundProfile(profile));
            }
            // The call log's line for the call says it was refused, and why.
            Err(status) => return refuse(status),
        }
        if self.policy.draining.load(Ordering::SeqCst) {
            return refuse(Status::unavailable(
                "The daemon is shutting down; retry on another instance or after it restarts.",
            ));
        }
        let Ok(permit) = self.policy.permits.clone().try_acquire_owned() else {
            return refuse(Status::resource_exhausted(format!(
                "The daemon is at its limit of {} concurrent calls; retry shortly.",
                self.policy.max_concurrent
            )));
        };
        // The ready service answers this call; a fresh clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let timeout = self.policy.timeout;
        Box::pin(async move {
            let _permit = permit;
            within(timeout, inner.call(request)).await.map(held)
        })
    }
}

/// An answer's body, holding its stream's place among the open streams allowed (if it is
/// one) until it is dropped.
pub(crate) struct Held<R> {
    inner: R,
    _stream: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl<R> From<R> for Held<R> {
    fn from(inner: R) -> Self {
        Held { inner, _stream: None }
    }
}

impl<R: Default> Default for Held<R> {
    fn default() -> Self {
        R::default().into()
    }
}

impl<R: http_body::Body + Unpin> http_body::Body for Held<R> {
    type Data = R::Data;
    type Error = R::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The refusal of a request whose content type is not gRPC's (`application/grpc`, alone or
/// with a `+format` or parameters); `None` for a gRPC request.
fn not_grpc(headers: &http::HeaderMap) -> Option<Status> {
    let content_type = headers.get(http::header::CONTENT_TYPE).map(|v| v.as_bytes());
    let grpc = content_type.is_some_and(|t| {
        t.strip_prefix(b"application/grpc")
            .is_some_and(|rest| rest.is_empty() || rest[0] == b'+' || rest[0] == b';')
    });
    if grpc {
        return None;
    }
    let named = match content_type {
        Some(t) => format!("'{}'", String::from_utf8_lossy(t).escape_debug()),
        None => "missing".to_string(),
    };
    Some(Status::invalid_argument(format!(
        "The request's content-type is {named}: a gRPC call is sent as application/grpc."
    )))
}

/// `call`'s answer, or `DEADLINE_EXCEEDED` once it has taken `timeout` (for a streaming
/// answer, until its headers: the stream itself may run longer).
async fn within<R: Default, E>(
    timeout: Duration,
    call: impl Future<Output = Result<http::Response<R>, E>>,
) -> Result<http::Response<R>, E> {
    match tokio::time::timeout(timeout, call).await {
        Ok(response) => response,
        Err(_) => Ok(Status::deadline_exceeded(format!(
            "{PAST_THE_REQUEST_TIMEOUT} of {}.",
            humantime::format_duration(timeout)
        ))
        .into_http()),
    }
}

/// How the daemon's own `DEADLINE_EXCEEDED` answer begins, so a client tells it from its
/// own deadline (no answer at all).
pub(crate) const PAST_THE_REQUEST_TIMEOUT: &str = "The call took longer than the request timeout";

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: Option<&str>) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        if let Some(v) = value {
            h.insert(http::header::AUTHORIZATION, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn only_grpcs_content_types_are_served() {
        let with = |value: Option<&str>| {
            let mut h = http::HeaderMap::new();
            if let Some(v) = value {
                h.insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_str(v).unwrap(),
                );
            }
            not_grpc(&h).map(|s| s.message().to_string())
        };
        for served in [
            "application/grpc",
            "application/grpc+proto",
            "application/grpc; charset=utf-8",
        ] {
            assert_eq!(with(Some(served)), None, "{served}");
        }
        let refused = [
            (Some("application/json"), "'application/json'"),
            (Some("application/grpcx"), "'application/grpcx'"),
            (Some("application/grpc-web"), "'application/grpc-web'"),
            (Some("text/plain"), "'text/plain'"),
            (None, "missing"),
        ];
        for (value, named) in refused {
            assert_eq!(
                with(value).as_deref(),
                Some(
                    format!(
                        "The request's content-type is {named}: a gRPC call is sent as application/grpc."
                    )
                    .as_str()
                ),
                "{value:?}"
            );
        }
    }

    #[test]
    fn only_the_exact_bearer_token_is_accepted() {
        let guard = Guard::new(Some("s3cret"), &[], 1, Duration::from_secs(1));
        let p = &guard.policy;
        let cases: &[(Option<&str>, bool)] = &[
            (Some("Bearer s3cret"), true),
            (Some("bearer s3cret"), true),
            (Some("BEARER s3cret"), true),
            (None, false),
            (Some("Bearer"), false),
            (Some("Bearer "), false),
            (Some("Bearer s3cre"), false),
            (Some("Bearer s3cret "), false),
            (Some("Bearer S3CRET"), false),
            (Some("Basic s3cret"), false),
            (Some("s3cret"), false),
        ];
        for &(value, ok) in cases {
            let got = p.authorize(&headers(value));
            assert_eq!(got.is_ok(), ok, "{value:?}");
            if let Err(status) = got {
                assert_eq!(status.code(), tonic::Code::Unauthenticated);
            }
        }
    }

    #[test]
    fn a_bound_token_authenticates_and_names_its_profile() {
        let bound = [("reader-token", "reader"), ("ops-token", "ops")];
        let with_main = Guard::new(Some("main"), &bound, 1, Duration::from_secs(1));
        let only_bound = Guard::new(None, &bound, 1, Duration::from_secs(1));
        for guard in [&with_main, &only_bound] {
            let p = &guard.policy;
            let profile = |v| p.authorize(&headers(Some(v))).unwrap().map(|p| p.to_string());
            assert_eq!(profile("Bearer reader-token").as_deref(), Some("reader"));
            assert_eq!(profile("Bearer ops-token").as_deref(), Some("ops"));
            assert!(p.authorize(&headers(Some("Bearer reader"))).is_err());
            assert!(
                p.authorize(&headers(None)).is_err(),
                "bound tokens make auth required"
            );
        }
        assert_eq!(
            with_main
                .policy
                .authorize(&headers(Some("Bearer main")))
                .unwrap()
                .map(|p| p.to_string()),
            None,
            "the main token is bound to no profile"
        );
        assert!(
            only_bound
                .policy
                .authorize(&headers(Some("Bearer main")))
                .is_err()
        );
    }

    #[test]
    fn without_a_token_every_call_is_authorized() {
        let guard = Guard::new(None, &[], 1, Duration::from_secs(1));
        assert!(guard.policy.authorize(&headers(None)).is_ok());
        assert!(guard.policy.authorize(&headers(Some("Bearer x"))).is_ok());
    }
}
