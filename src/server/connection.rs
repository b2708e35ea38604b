//! Connections: the listener (`bind`, the open-files limit), the accept loop that pauses
//! while the process is out of file descriptors, and each accepted connection until it has
//! spoken HTTP/2.
//!
//! **Handshake deadline.** A connection must finish its handshake (TLS, when served, and the
//! 24-byte HTTP/2 preface) within the handshake timeout, or before the drain starts, or it is
//! closed: a socket that never speaks, sends one byte, or finishes TLS and stops cannot hold
//! a file descriptor or the shutdown. Past the preface, HTTP/2 keepalive finds dead peers.
//! The TLS handshake is driven here rather than by the transport, so that one deadline covers
//! both steps and sees the preface inside the encrypted stream.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::telemetry::AcceptPause;

/// Idle time before the kernel probes a connection's peer (TCP keepalive).
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// The client's connection preface (RFC 9113 §3.4): `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`.
const HTTP2_PREFACE_BYTES: usize = 24;

/// Binds `addr` with `backlog` connections queued by the kernel before they are accepted
/// (Linux caps it at `net.core.somaxconn`).
///
/// # Errors
/// The address cannot be bound.
pub fn bind(addr: std::net::SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As std and tokio do: a restarted daemon can bind while old connections are in TIME_WAIT.
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// Raises the soft open-files limit to the hard limit: every connection is a file
/// descriptor, and the common soft default (1,024) is far below what the daemon can serve.
/// Returns the limit in force afterwards.
#[cfg(unix)]
pub(crate) fn raise_open_files_limit() -> std::io::Result<libc::rlim_t> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit through a valid pointer to a local.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads one rlimit through a valid pointer to a local.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        limit = raised;
    }
    Ok(limit.rlim_cur)
}

/// The TLS acceptor for `config`, if it names a certificate and key, checked to make a
/// server identity (ALPN `h2`).
///
/// # Errors
/// `Config` naming a file that cannot be read, or saying why the pair makes no identity.
pub fn tls(config: &Config) -> Result<Option<TlsAcceptor>> {
    let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) else {
        return Ok(None);
    };
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|e| Error::Config(format!("cannot read TLS file {}: {e}", p.display())))
    };
    let no_identity = |why: String| {
        Error::Config(format!(
            "--tls-cert and --tls-key do not make a server identity: {why}"
        ))
    };
    let chain = CertificateDer::pem_slice_iter(&read(cert)?)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| no_identity(format!("{}: {e}", cert.display())))?;
    if chain.is_empty() {
        return Err(no_identity(format!(
            "{} holds no PEM certificate",
            cert.display()
        )));
    }
    if let Some(problem) = validity_problem(&chain[0], std::time::SystemTime::now()) {
        tracing::warn!(
            cert = %cert.display(),
            "the TLS certificate {problem}: clients will refuse to connect until it is replaced \
             and the daemon restarted"
        );
    }
    let key_pem = read(key)?;
    let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        let encrypted = key_pem
            .windows(b"ENCRYPTED PRIVATE KEY".len())
            .any(|w| w == b"ENCRYPTED PRIVATE KEY");
        no_identity(if encrypted {
            format!(
                "{} holds an encrypted private key: give it unencrypted (e.g. `openssl pkey -in \
                 KEY -out PLAIN`) and readable only by the daemon's user",
                key.display()
            )
        } else {
            format!(
                "{} holds no PEM private key (PKCS #8, PKCS #1 or SEC1): {e}",
                key.display()
            )
        })
    })?;
    let mut server = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| match e {
            // rustls words this as the peer's: here it is the daemon's own certificate.
            rustls::Error::InvalidCertificate(why) => {
                no_identity(format!("{} is not a usable certificate: {why}", cert.display()))
            }
            rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => no_identity(format!(
                "the private key in {} does not belong to the certificate in {}",
                key.display(),
                cert.display()
            )),
            other => no_identity(other.to_string()),
        })?;
    server.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Some(TlsAcceptor::from(Arc::new(server))))
}

/// What is wrong with a certificate's validity period at `now`, if anything: "expired at
/// ..." or "is not valid until ...". A certificate that cannot be parsed here is left to
/// the TLS library, which refuses it by itself.
fn validity_problem(cert: &CertificateDer<'_>, now: std::time::SystemTime) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert).ok()?;
    let validity = parsed.validity();
    let now = match now.duration_since(std::time::UNIX_EPOCH) {
        Ok(since) => i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_secs()).unwrap_or(i64::MAX),
    };
    if validity.not_after.timestamp() < now {
        Some(format!("expired at {}", validity.not_after))
    } else if validity.not_before.timestamp() > now {
        Some(format!("is not valid until {}", validity.not_before))
    } else {
        None
    }
}

/// The accepted connections: a stream for tonic that closes the listener when the drain
/// starts, and pauses (logging once per streak) while accepting fails for lack of resources.
pub struct Incoming {
    listener: Option<TcpListener>,
    draining: Pin<Box<dyn Future<Output = ()> + Send>>,
    drain: watch::Receiver<bool>,
    handshake_timeout: Duration,
    tls: Option<TlsAcceptor>,
    backoff: Option<Pin<Box<Sleep>>>,
    pause: AcceptPause,
}

/// Resolves once `drain` turns true (never, if its sender is dropped without that).
fn drained(mut drain: watch::Receiver<bool>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(async move {
        if drain.wait_for(|d| *d).await.is_err() {
            std::future::pending::<()>().await;
        }
    })
}

/// The connections `listener` accepts until `drain` turns true, over TLS when `tls` is
/// given; each must finish its handshake within `handshake_timeout`.
pub fn incoming(
    listener: TcpListener,
    drain: watch::Receiver<bool>,
    handshake_timeout: Duration,
    tls: Option<TlsAcceptor>,
) -> Incoming {
    Incoming {
        listener: Some(listener),
        draining: drained(drain.clone()),
        drain,
        handshake_timeout,
        tls,
        backoff: None,
        pause: AcceptPause::new(""),
    }
}

impl tokio_stream::Stream for Incoming {
    type Item = io::Result<Conn>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if this.listener.is_none() {
                // Drained: no more connections, and the server ends on its own signal.
                return Poll::Pending;
            }
            if this.draining.as_mut().poll(cx).is_ready() {
                this.listener = None;
                tracing::info!("listener closed: draining");
                return Poll::Pending;
            }
            if let Some(sleep) = &mut this.backoff {
                ready!(sleep.as_mut().poll(cx));
                this.backoff = None;
            }
            let Some(listener) = &this.listener else {
                return Poll::Pending;
            };
            match ready!(listener.poll_accept(cx)) {
                Ok((stream, _peer)) => {
                    this.pause.accepted();
                    return Poll::Ready(Some(Ok(Conn::new(stream, this))));
                }
                Err(e) => {
                    if let Some(wait) = this.pause.failed(&e) {
                        this.backoff = Some(Box::pin(tokio::time::sleep(wait)));
                    }
                }
            }
        }
    }
}

/// What a connection carries: TCP, or TLS over it once the handshake (driven by the
/// connection's first reads and writes) is done.
enum Link {
    Plain(TcpStream),
    Accepting(Box<tokio_rustls::Accept<TcpStream>>),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    Failed,
}

/// A byte stream both ways.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

impl Link {
    /// The stream to read and write, once the TLS handshake (if any) is done.
    fn ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<&mut dyn Io>> {
        if let Link::Accepting(accept) = self {
            match ready!(Pin::new(&mut **accept).poll(cx)) {
                Ok(tls) => *self = Link::Tls(Box::new(tls)),
                Err(e) => {
                    *self = Link::Failed;
                    return Poll::Ready(Err(e));
                }
            }
        }
        Poll::Ready(match self {
            Link::Plain(tcp) => Ok(tcp),
            Link::Tls(tls) => Ok(&mut **tls),
            Link::Accepting(_) | Link::Failed => Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the TLS handshake failed",
            )),
        })
    }
}

/// An accepted connection: until its handshake is done it is closed at the handshake
/// deadline or when the drain starts, so a socket that stalls cannot hold a file descriptor
/// or the shutdown.
pub struct Conn {
    link: Link,
    info: TcpConnectInfo,
    handshake: Option<Handshake>,
}

/// A connection's handshake still under way.
struct Handshake {
    deadline: Pin<Box<Sleep>>,
    draining: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// Bytes of the HTTP/2 preface not read yet.
    preface_left: usize,
}

impl Handshake {
    /// Why the connection is closed now, if its time is up.
    fn expired(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        if self.deadline.as_mut().poll(cx).is_ready() {
            return Some(io::Error::new(
                io::ErrorKind::TimedOut,
                "the connection did not finish its handshake within the handshake timeout",
            ));
        }
        if self.draining.as_mut().poll(cx).is_ready() {
            return Some(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the connection had not finished its handshake when the drain started",
            ));
        }
        None
    }
}

impl Conn {
    fn new(stream: TcpStream, incoming: &Incoming) -> Conn {
        // Answers are single small writes, and waiting to coalesce them costs a delayed-ACK
        // round (tens of milliseconds) per call.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::warn!(error = %e, "cannot set TCP_NODELAY");
        }
        let keepalive = socket2::TcpKeepalive::new().with_time(TCP_KEEPALIVE);
        if let Err(e) = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive) {
            tracing::warn!(error = %e, "cannot set TCP keepalive");
        }
        let info = TcpConnectInfo {
            local_addr: stream.local_addr().ok(),
            remote_addr: stream.peer_addr().ok(),
        };
        let link = match &incoming.tls {
            Some(acceptor) => Link::Accepting(Box::new(acceptor.accept(stream))),
            None => Link::Plain(stream),
        };
        Conn {
            link,
            info,
            handshake: Some(Handshake {
                deadline: Box::pin(tokio::time::sleep(incoming.handshake_timeout)),
                draining: drained(incoming.drain.clone()),
                preface_left: HTTP2_PREFACE_BYTES,
            }),
        }
    }

    /// Runs `op` on the stream once it is ready; while the handshake is under way, a call
    /// that would wait fails instead once the handshake's time is up.
    fn poll_io<T>(
        &mut self,
        cx: &mut Context<'_>,
        op: impl FnOnce(Pin<&mut dyn Io>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        let polled = match self.link.ready(cx) {
            Poll::Ready(Ok(io)) => op(Pin::new(io), cx),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        };
        if polled.is_pending()
            && let Some(handshake) = &mut self.handshake
            && let Some(e) = handshake.expired(cx)
        {
            return Poll::Ready(Err(e));
        }
        polled
    }
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let read = this.poll_io(cx, |io, cx| io.poll_read(cx, buf));
        if let (Poll::Ready(Ok(())), Some(handshake)) = (&read, &mut this.handshake) {
            let got = buf.filled().len() - before;
            handshake.preface_left = handshake.preface_left.saturating_sub(got);
            if handshake.preface_left == 0 {
                this.handshake = None;
            }
        }
        read
    }
}

impl AsyncWrite for Conn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_io(cx, |io, cx| io.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_io(cx, |io, cx| io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match &self.link {
            Link::Plain(tcp) => tcp.is_write_vectored(),
            Link::Tls(tls) => tls.is_write_vectored(),
            Link::Accepting(_) | Link::Failed => false,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_io(cx, |io, cx| io.poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.link {
            Link::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Link::Tls(tls) => Pin::new(&mut **tls).poll_shutdown(cx),
            // Nothing was said over TLS: the socket closes when the connection is dropped.
            Link::Accepting(_) | Link::Failed => Poll::Ready(Ok(())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn a_certificate_outside_its_validity_period_is_named_with_its_date() {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let der = CertificateDer::from(cert.der().to_vec());
        let at = |ymd: u64| UNIX_EPOCH + Duration::from_secs(ymd);
        // (now, seconds since the epoch, the problem named)
        let cases = [
            (
                1_546_300_800,
                Some("is not valid until Jan  1 00:00:00 2020 +00:00"),
            ), // 2019-01-01
            (1_593_561_600, None),                                           // 2020-07-01
            (1_640_995_200, Some("expired at Jan  1 00:00:00 2021 +00:00")), // 2022-01-01
        ];
        for (now, want) in cases {
            assert_eq!(validity_problem(&der, at(now)).as_deref(), want, "at {now}");
        }
        assert_eq!(
            validity_problem(&CertificateDer::from(vec![1, 2, 3]), at(0)),
            None
        );
    }
}
