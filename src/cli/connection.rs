//! Reaching a running daemon: address, bearer token, TLS trust and timeout, shared by the
//! client commands, `settings` and the load generator (and by tests and examples that talk
//! to a daemon the same way).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::error::{Error, Result};
use crate::proto::tool_router_client::ToolRouterClient;

/// Default daemon address for the client subcommands.
pub(crate) const DEFAULT_ADDR: &str = "http://127.0.0.1:50051";

/// How long a client command waits to connect and for each answer, unless `--timeout` says.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// How a client reaches the daemon.
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// The daemon's address: `host:port` (plain HTTP/2; TLS with `--tls-ca`) or a URL
    /// (`https://` when it serves TLS).
    #[arg(long, env = "TOOLROUTER_ADDR", default_value = DEFAULT_ADDR)]
    pub addr: String,
    /// Bearer token, when the daemon requires one.
    #[arg(long, env = "TOOLROUTER_AUTH_TOKEN", hide_env_values = true)]
    pub auth_token: Option<String>,
    /// CA certificate (PEM) that signed the daemon's certificate, for an `https://` address.
    #[arg(long, env = "TOOLROUTER_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// How long to wait to connect, and then for each answer, e.g. `3s` [default: 10s; 1s for
    /// `health`].
    #[arg(long, env = "TOOLROUTER_TIMEOUT", value_parser = humantime::parse_duration)]
    pub timeout: Option<Duration>,
}

/// Adds the bearer token, when there is one, to every call.
#[derive(Clone)]
pub struct BearerToken(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for BearerToken {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

/// A `ToolRouter` client that sends the bearer token.
pub type Client = ToolRouterClient<InterceptedService<Channel, BearerToken>>;

/// The innermost cause: transport errors wrap the useful part several levels down.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// How long asking an `http://` address whether it serves TLS may take, at most: a call that
/// failed is explained only when the answer comes this fast.
pub(crate) const TLS_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Whether a connection failed because the peer's TLS certificate was refused: the peer
/// spoke TLS. (A plain HTTP/2 peer's answer to a TLS hello is a malformed record, not a
/// certificate.) I/O errors hold the TLS error as their payload, which `source()` skips.
fn is_certificate_refusal(e: &(dyn std::error::Error + 'static)) -> bool {
    use tokio_rustls::rustls;
    let mut cur = Some(e);
    while let Some(err) = cur {
        let tls = err.downcast_ref::<rustls::Error>().or_else(|| {
            err.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if matches!(
            tls,
            Some(rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented)
        ) {
            return true;
        }
        cur = err.source();
    }
    false
}

/// The largest answer a client takes: a whole large registry's `ListAllTools` or fallback
/// `Route` (Seal's 4,076 tools are about 5 MB), past tonic's default of 4 MiB.
pub const MAX_ANSWER_BYTES: usize = 64 << 20;

impl Connection {
    /// A connection to `addr` without token or TLS.
    pub fn plain(addr: impl Into<String>) -> Connection {
        Connection {
            addr: addr.into(),
            auth_token: None,
            tls_ca: None,
            timeout: None,
        }
    }

    /// The address as a URL: `host:port` means `http://host:port`, as grpcurl and the
    /// Python client spell it, or `https://host:port` with a CA to check the daemon's
    /// certificate with (`--tls-ca` says the daemon serves TLS).
    pub fn url(&self) -> String {
        match self.addr.split_once("://") {
            // A scheme is case-insensitive (RFC 3986): `HTTPS://` is TLS too.
            Some((scheme, rest)) => format!("{}://{rest}", scheme.to_ascii_lowercase()),
            None if self.tls_ca.is_some() => format!("https://{}", self.addr),
            None => format!("http://{}", self.addr),
        }
    }

    /// A failed call's status, with what to do when it is what a plain HTTP/2 client meets
    /// at a daemon serving TLS. The daemon's TLS answer to the HTTP/2 preface is no HTTP/2,
    /// so the call fails as a protocol error, as cancelled or as a transport error, depending
    /// on when the connection closes, each of which alone reads like a fault of the daemon.
    /// So a call to an `http://` address that fails so asks the address for a TLS handshake
    /// (for at most [`TLS_PROBE_TIMEOUT`]): when it gets one (trusted or not), it says to use
    /// `https://`.
    pub(crate) async fn explained(&self, status: tonic::Status) -> tonic::Status {
        use tonic::Code;
        let url = self.url();
        let Some(host) = url.strip_prefix("http://") else {
            return status;
        };
        if !matches!(
            status.code(),
            Code::Internal | Code::Cancelled | Code::Unknown | Code::Unavailable
        ) {
            return status;
        }
        if !self.serves_tls(host).await {
            return status;
        }
        tonic::Status::new(
            status.code(),
            format!(
                "{} (the daemon at {host} serves TLS: use --addr https://{host}, with --tls-ca when \
                 its certificate is not from a public CA)",
                status.message()
            ),
        )
    }

    /// Whether `host` answers a TLS handshake within [`TLS_PROBE_TIMEOUT`] (or the
    /// connection's timeout, when shorter): a connection, or a certificate this client does
    /// not trust, both say TLS. Read from the TLS library's own error, never from a message
    /// (which names the address).
    async fn serves_tls(&self, host: &str) -> bool {
        let probe = Connection {
            addr: format!("https://{host}"),
            auth_token: None,
            tls_ca: None,
            timeout: Some(self.timeout().min(TLS_PROBE_TIMEOUT)),
        };
        let Ok(endpoint) = probe.endpoint() else {
            return false;
        };
        match tokio::time::timeout(probe.timeout(), endpoint.connect()).await {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => is_certificate_refusal(&e),
            Err(_) => false,
        }
    }

    /// The connect and call timeout: `--timeout`, else [`DEFAULT_TIMEOUT`].
    pub fn timeout(&self) -> Duration {
        self.timeout.unwrap_or(DEFAULT_TIMEOUT)
    }

    /// Connects a channel (for health or other services).
    ///
    /// # Errors
    /// `Config` for a bad address or CA file, `Unavailable` when the daemon cannot be reached.
    pub async fn channel(&self) -> Result<Channel> {
        let addr = &self.addr;
        let timeout = self.timeout();
        let endpoint = self.endpoint()?;
        // The connect timeout covers TCP only; this one also covers the HTTP/2 handshake with
        // a peer that accepted the connection but never speaks.
        match tokio::time::timeout(timeout, endpoint.connect()).await {
            Ok(Ok(channel)) => Ok(channel),
            Ok(Err(e)) => {
                let cause = root_cause(&e);
                // A certificate no CA it trusts signed, and none was named: say how to name it.
                let hint = if cause.contains("UnknownIssuer") && self.tls_ca.is_none() {
                    " (pass --tls-ca with the CA certificate that signed the daemon's, PEM)"
                } else {
                    ""
                };
                Err(Error::Unavailable(format!(
                    "cannot reach the daemon at {addr}: {cause}{hint}"
                )))
            }
            Err(_) => Err(Error::Unavailable(format!(
                "no answer from {addr} within {} (connecting)",
                humantime::format_duration(timeout)
            ))),
        }
    }

    /// The endpoint for the address, with the timeouts and TLS trust; nothing connected yet.
    fn endpoint(&self) -> Result<Endpoint> {
        let addr = &self.addr;
        let timeout = self.timeout();
        let url = self.url();
        // Plain HTTP/2 or TLS: any other scheme would be spoken to as plain HTTP/2.
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(Error::Config(format!(
                "invalid --addr {addr:?}: use host:port, http://host:port or https://host:port"
            )));
        }
        // A CA is for checking a daemon serving TLS; `http://` would not use it.
        if let Some(ca) = &self.tls_ca
            && url.starts_with("http://")
        {
            return Err(Error::Config(format!(
                "--tls-ca {} is for a daemon serving TLS, but --addr {addr:?} says plain HTTP/2: \
                 use https://{}",
                ca.display(),
                url.trim_start_matches("http://")
            )));
        }
        let endpoint =
            Endpoint::from_shared(url).map_err(|e| Error::Config(format!("invalid --addr {addr:?}: {e}")))?;
        // The URL parser takes any digits for a port (and then has none); a connection to
        // one past 65535 would only fail as "connection refused".
        if let Some(authority) = endpoint.uri().authority()
            && authority.port_u16().is_none()
            && let Some((_, port)) = authority.as_str().rsplit_once(':')
            && !port.is_empty()
            && port.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(Error::Config(format!(
                "invalid --addr {addr:?}: port {port} is not between 0 and 65535"
            )));
        }
        // gRPC calls go to `/package.Service/Method` at the authority: a path or query in the
        // address would be dropped without a word.
        if let Some(rest) = endpoint.uri().path_and_query()
            && rest.as_str() != "/"
        {
            return Err(Error::Config(format!(
                "invalid --addr {addr:?}: a daemon's address has no path or query ({rest}); use \
                 host:port, http://host:port or https://host:port"
            )));
        }
        let mut endpoint = endpoint
            .connect_timeout(timeout)
            // Every call gets a deadline (the client's own: tonic does not send it as
            // `grpc-timeout`), so a daemon that accepts and never answers cannot hang the
            // caller.
            .timeout(timeout)
            .tcp_nodelay(true);
        // TLS for an `https://` address: the CA `--tls-ca` names, else the public web PKI's
        // roots (a certificate from a public CA needs no `--tls-ca`).
        let tls = match &self.tls_ca {
            Some(ca) => {
                let pem = std::fs::read(ca)
                    .map_err(|e| Error::Config(format!("cannot read --tls-ca {}: {e}", ca.display())))?;
                // Anything else would only fail later, as a certificate the daemon's is not
                // signed by.
                if !pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") {
                    return Err(Error::Config(format!(
                        "--tls-ca {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                        ca.display()
                    )));
                }
                Some(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)))
            }
            None if self.url().starts_with("https://") => Some(ClientTlsConfig::new().with_webpki_roots()),
            None => None,
        };
        if let Some(tls) = tls {
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| Error::Config(format!("TLS: {}", root_cause(&e))))?;
        }
        Ok(endpoint)
    }

    /// Whether something accepts TCP connections at the address: a daemon the client could
    /// not talk to (its certificate not trusted, say) is still there.
    pub async fn listening(&self) -> bool {
        let Ok(uri) = self.url().parse::<tonic::codegen::http::Uri>() else {
            return false;
        };
        let Some(authority) = uri.authority() else {
            return false;
        };
        let port = authority
            .port_u16()
            .unwrap_or(if uri.scheme_str() == Some("https") {
                443
            } else {
                80
            });
        let host = authority.host().trim_start_matches('[').trim_end_matches(']');
        matches!(
            tokio::time::timeout(self.timeout(), tokio::net::TcpStream::connect((host, port))).await,
            Ok(Ok(_))
        )
    }

    /// The interceptor adding this connection's token.
    ///
    /// # Errors
    /// `Config` when the token is not printable ASCII.
    pub fn token(&self) -> Result<BearerToken> {
        let value = self
            .auth_token
            .as_ref()
            .map(|t| format!("Bearer {t}").parse())
            .transpose()
            .map_err(|_| Error::Config("the auth token must be printable ASCII".into()))?;
        Ok(BearerToken(value))
    }

    /// Connects a `ToolRouter` client that sends the token.
    ///
    /// # Errors
    /// As [`Connection::channel`] and [`Connection::token`].
    pub async fn client(&self) -> Result<Client> {
        Ok(ToolRouterClient::new(self.service().await?).max_decoding_message_size(MAX_ANSWER_BYTES))
    }

    /// The channel with the bearer token added to every call, for calls made without the
    /// generated client (the load generator's counting `Route`).
    ///
    /// # Errors
    /// As [`Connection::channel`], and `Config` for a token that cannot be sent.
    pub async fn service(&self) -> Result<InterceptedService<Channel, BearerToken>> {
        let token = self.token()?;
        Ok(InterceptedService::new(self.channel().await?, token))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    /// A peer at an `http://` address that does not speak TLS leaves a failed call's status
    /// as it was, and asking it takes the probe's bound, not the call's timeout.
    #[tokio::test]
    async fn a_peer_that_speaks_no_tls_leaves_the_status_as_it_was() {
        /// What the peer does with each connection.
        #[derive(Clone, Copy, Debug)]
        enum Peer {
            Closes,
            Silent,
            AnswersPlainText,
        }
        for peer in [Peer::Closes, Peer::Silent, Peer::AnswersPlainText] {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let server = tokio::spawn(async move {
                let mut held = Vec::new();
                loop {
                    let Ok((mut socket, _)) = listener.accept().await else {
                        return;
                    };
                    match peer {
                        Peer::Closes => drop(socket),
                        Peer::Silent => held.push(socket),
                        Peer::AnswersPlainText => {
                            let _ = socket.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
                        }
                    }
                }
            });
            let conn = Connection {
                timeout: Some(Duration::from_secs(30)),
                ..Connection::plain(format!("http://{addr}"))
            };
            let started = std::time::Instant::now();
            let status = conn
                .explained(tonic::Status::unavailable("the call failed"))
                .await;
            assert_eq!(status.code(), tonic::Code::Unavailable, "{peer:?}");
            assert_eq!(status.message(), "the call failed", "{peer:?}");
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{peer:?}: the probe took {:?}",
                started.elapsed()
            );
            server.abort();
        }
    }

    /// Only a failure a TLS peer could cause is explained: a refusal is the daemon's answer.
    #[tokio::test]
    async fn an_answer_from_the_daemon_is_not_explained() {
        let conn = Connection::plain("http://127.0.0.1:1");
        for status in [
            tonic::Status::invalid_argument("bad"),
            tonic::Status::not_found("no such group"),
        ] {
            let (code, message) = (status.code(), status.message().to_string());
            let out = conn.explained(status).await;
            assert_eq!((out.code(), out.message()), (code, message.as_str()));
        }
    }
}
