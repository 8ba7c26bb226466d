//! How a member opens gRPC connections to its peers' URLs: plain TCP for `http://`, TLS with
//! the member's peer client configuration for `https://`.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// Why a peer URL could not be dialed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DialError {
    #[error("bad URL {url}: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("{url}: an https URL, but this member has no TLS for it")]
    NoTls { url: String },
    #[error("{url}: want an http:// or https:// URL")]
    Scheme { url: String },
    #[error("cannot connect to {url}: {reason}")]
    Connect { url: String, reason: String },
}

/// Dials peer URLs. Cheap to clone.
#[derive(Clone, Default)]
pub struct Dialer {
    tls: Option<tokio_rustls::TlsConnector>,
    /// grpc-go's reconnection back-off, per address, shared by the clones (None: every dial
    /// tries at once).
    backoff: Option<Arc<Backoffs>>,
}

/// grpc-go's connection back-off (`google.golang.org/grpc/backoff.DefaultConfig`): after a
/// failed attempt, wait 1 s, then 1.6 times longer each time, ±20 %, at most 120 s; a
/// connection that delivers bytes resets it. A dial while the wait runs fails at once.
#[derive(Debug, Default)]
struct Backoffs {
    by_addr: parking_lot::Mutex<std::collections::HashMap<String, Backoff>>,
}

#[derive(Debug, Clone, Copy)]
struct Backoff {
    /// Attempts since the last connection that delivered bytes.
    failures: u32,
    /// No attempt before this.
    next: std::time::Instant,
}

impl Backoffs {
    const BASE: f64 = 1.0;
    const MULTIPLIER: f64 = 1.6;
    const JITTER: f64 = 0.2;
    const MAX: f64 = 120.0;

    /// The wait after `failures` failed attempts, before jitter, in seconds.
    fn wait(failures: u32) -> f64 {
        let n = failures.saturating_sub(1).min(64) as i32;
        (Self::BASE * Self::MULTIPLIER.powi(n)).min(Self::MAX)
    }

    /// May `addr` be dialed now? If so the attempt counts as failed until its connection
    /// delivers bytes ([`Backoffs::worked`]).
    fn attempt(&self, addr: &str) -> Result<(), std::time::Duration> {
        let now = std::time::Instant::now();
        let mut by_addr = self.by_addr.lock();
        let b = by_addr.entry(addr.to_string()).or_insert(Backoff {
            failures: 0,
            next: now,
        });
        if b.next > now {
            return Err(b.next - now);
        }
        b.failures = b.failures.saturating_add(1);
        // Jitter from the clock's nanoseconds: spread, not secret.
        let spread = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.5, |d| f64::from(d.subsec_nanos()) / 1e9);
        let jitter = 1.0 + Self::JITTER * (spread * 2.0 - 1.0);
        b.next = now + std::time::Duration::from_secs_f64(Self::wait(b.failures) * jitter);
        Ok(())
    }

    /// A connection to `addr` delivered bytes: the next failure waits from the start.
    fn worked(&self, addr: &str) {
        self.by_addr.lock().remove(addr);
    }
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dialer")
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Dialer {
    /// Plain connections only (`https://` URLs are refused).
    pub fn plain() -> Dialer {
        Dialer::default()
    }

    /// `https://` URLs with `tls` (its ALPN should offer `h2`), `http://` ones in the clear.
    pub fn with_tls(tls: Arc<rustls::ClientConfig>) -> Dialer {
        Dialer {
            tls: Some(tokio_rustls::TlsConnector::from(tls)),
            backoff: None,
        }
    }

    /// The same, redialing an address that failed only after grpc-go's back-off (what a gRPC
    /// client of the cluster does; raft's links to peers keep redialing at once).
    pub fn with_backoff(self) -> Dialer {
        Dialer {
            backoff: Some(Arc::default()),
            ..self
        }
    }

    /// A channel to `url` (connected lazily, reconnecting as tonic's are), with `ep`'s settings
    /// applied to the endpoint.
    pub fn channel(
        &self,
        url: &str,
        ep: impl FnOnce(Endpoint) -> Endpoint,
    ) -> Result<Channel, DialError> {
        let e = self.endpoint(url, ep)?;
        Ok(e.connect_with_connector_lazy(Connector(self.clone())))
    }

    /// Connects to `url` now.
    pub async fn connect(
        &self,
        url: &str,
        ep: impl FnOnce(Endpoint) -> Endpoint,
    ) -> Result<Channel, DialError> {
        let e = self.endpoint(url, ep)?;
        e.connect_with_connector(Connector(self.clone()))
            .await
            .map_err(|e| DialError::Connect {
                url: url.to_string(),
                reason: source_chain(&e),
            })
    }

    fn endpoint(
        &self,
        url: &str,
        ep: impl FnOnce(Endpoint) -> Endpoint,
    ) -> Result<Endpoint, DialError> {
        let e = Endpoint::from_shared(url.to_string()).map_err(|e| DialError::BadUrl {
            url: url.to_string(),
            reason: e.to_string(),
        })?;
        let url = url.to_string();
        match e.uri().scheme_str() {
            Some("http") => {}
            Some("https") if self.tls.is_some() => {}
            Some("https") => return Err(DialError::NoTls { url }),
            _ => return Err(DialError::Scheme { url }),
        }
        Ok(ep(e))
    }

    /// A byte stream to `url` (`http://` or `https://`), for a client of its own.
    pub async fn stream(&self, url: &str) -> io::Result<PeerStream> {
        let uri: Uri = url
            .parse()
            .map_err(|e| io::Error::other(format!("bad URL {url}: {e}")))?;
        Ok(self.dial(uri).await?.into_inner())
    }

    async fn dial(&self, uri: Uri) -> io::Result<TokioIo<PeerStream>> {
        let host = uri
            .host()
            .ok_or_else(|| io::Error::other(format!("{uri}: no host")))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let tls = uri.scheme_str() == Some("https");
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let addr = format!("{host}:{port}");
        if let Some(b) = &self.backoff {
            b.attempt(&addr).map_err(|wait| {
                io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!("{addr}: failing; redialing in {wait:.1?} (back-off)"),
                )
            })?;
        }
        let tcp = TcpStream::connect((host.as_str(), port)).await?;
        // Small frames (heartbeats, appends) must not wait for Nagle's algorithm.
        tcp.set_nodelay(true)?;
        let watch = self.backoff.clone().map(|b| (b, addr));
        if !tls {
            return Ok(TokioIo::new(Conn::Plain(Watched::new(tcp, watch))));
        }
        let Some(c) = &self.tls else {
            return Err(io::Error::other(format!("{uri}: no TLS configured")));
        };
        let name = rustls_pki_types::ServerName::try_from(host.clone())
            .map_err(|e| io::Error::other(format!("{host}: {e}")))?;
        let s = c.connect(name, Watched::new(tcp, watch)).await?;
        Ok(TokioIo::new(Conn::Tls(Box::new(s))))
    }
}

/// An error with its sources ("transport error: tls handshake: ..."): tonic's own message
/// names only the outermost.
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// tonic's connector over a [`Dialer`].
#[derive(Clone)]
struct Connector(Dialer);

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<PeerStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let d = self.0.clone();
        Box::pin(async move { d.dial(uri).await })
    }
}

/// A connection in the clear or over TLS (`T`: tokio-rustls's client or server stream, over
/// `P`: TCP, or a unix socket).
#[derive(Debug)]
pub enum Conn<T, P = TcpStream> {
    Plain(P),
    Tls(Box<T>),
}

/// A connection to a peer.
pub type PeerStream = Conn<tokio_rustls::client::TlsStream<Watched>, Watched>;

impl<T, P> tonic::transport::server::Connected for Conn<T, P> {
    type ConnectInfo = ();

    fn connect_info(&self) {}
}

impl<T: AsyncRead + Unpin, P: AsyncRead + Unpin> AsyncRead for Conn<T, P> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<T: AsyncWrite + Unpin, P: AsyncWrite + Unpin> AsyncWrite for Conn<T, P> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A dialed TCP stream that tells its dialer's back-off when the server first sends bytes.
#[derive(Debug)]
pub struct Watched {
    tcp: TcpStream,
    watch: Option<(Arc<Backoffs>, String)>,
}

impl Watched {
    fn new(tcp: TcpStream, watch: Option<(Arc<Backoffs>, String)>) -> Watched {
        Watched { tcp, watch }
    }

    /// The TCP stream underneath.
    pub fn into_tcp(self) -> TcpStream {
        self.tcp
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.tcp).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            if let Some((b, addr)) = this.watch.take() {
                b.worked(&addr);
            }
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod backoff_tests {
    use super::Backoffs;

    #[test]
    fn waits_grow_as_grpc_gos_and_stop_at_two_minutes() {
        let w: Vec<f64> = (1..=12).map(Backoffs::wait).collect();
        assert_eq!(w[0], 1.0);
        assert!((w[1] - 1.6).abs() < 1e-9 && (w[2] - 2.56).abs() < 1e-9);
        assert!(w.windows(2).all(|p| p[1] >= p[0]));
        assert_eq!(Backoffs::wait(50), 120.0);
    }

    #[test]
    fn an_address_is_redialed_only_after_its_wait_and_at_once_once_it_worked() {
        let b = Backoffs::default();
        assert!(b.attempt("a:1").is_ok());
        let wait = b.attempt("a:1").unwrap_err();
        assert!(
            wait.as_secs_f64() > 0.7 && wait.as_secs_f64() <= 1.2,
            "{wait:?}"
        );
        assert!(
            b.attempt("b:1").is_ok(),
            "another address waits for nothing"
        );
        b.worked("a:1");
        assert!(b.attempt("a:1").is_ok());
    }
}
