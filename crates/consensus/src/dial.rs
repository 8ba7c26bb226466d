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
        let tcp = TcpStream::connect((host.as_str(), port)).await?;
        // Small frames (heartbeats, appends) must not wait for Nagle's algorithm.
        tcp.set_nodelay(true)?;
        if !tls {
            return Ok(TokioIo::new(Conn::Plain(tcp)));
        }
        let Some(c) = &self.tls else {
            return Err(io::Error::other(format!("{uri}: no TLS configured")));
        };
        let name = rustls_pki_types::ServerName::try_from(host.clone())
            .map_err(|e| io::Error::other(format!("{host}: {e}")))?;
        let s = c.connect(name, tcp).await?;
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
pub type PeerStream = Conn<tokio_rustls::client::TlsStream<TcpStream>>;

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
