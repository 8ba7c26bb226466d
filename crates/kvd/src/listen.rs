//! Listening: the URLs of etcd's `--listen-*-urls` flags (`http://` and `https://`, and for
//! clients `unix://` and `unixs://`, as etcd 3.7), one socket per address, and the accepted
//! connection in the clear or over TLS.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::time::Instant;

type Result<T, E = String> = std::result::Result<T, E>;

/// How long a connection to a TLS listener has to open and finish its TLS handshake, from
/// when it is accepted (etcd 3.7.1's TLS listener: 10 s).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long any connection has to send its first request bytes (the HTTP/2 preface) from
/// when it is accepted: grpc-go's connection timeout, under which etcd serves gRPC.
pub const PREFACE_TIMEOUT: Duration = Duration::from_secs(120);

/// When a connection accepted now must have opened: its TLS handshake done (a TLS listener)
/// or its first byte sent (in the clear). A silent socket holds a descriptor only this long.
pub fn open_by(tls: bool) -> Instant {
    Instant::now()
        + if tls {
            HANDSHAKE_TIMEOUT
        } else {
            PREFACE_TIMEOUT
        }
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, format!("{what} timed out"))
}

/// Where a listen URL listens: a TCP `host:port`, or a unix socket's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addr {
    Tcp(String),
    Unix(PathBuf),
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Tcp(h) => f.write_str(h),
            Addr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// One URL of a `--listen-*` flag: where, and whether TLS (`https://`, `unixs://`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenUrl {
    pub addr: Addr,
    pub tls: bool,
}

/// A listener and what it speaks.
#[derive(Debug)]
pub struct Bound {
    pub listener: Listener,
    /// Some of its URLs are `https://` (`unixs://`).
    pub tls: bool,
    /// Some of its URLs are `http://` (`unix://`; with `tls` too, a connection's first byte
    /// decides, as etcd serves an address given both ways).
    pub plain: bool,
}

/// A TCP listener, or a unix socket's, whose file goes when it is dropped.
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

/// An accepted connection: over TCP (with its client's address), or a unix socket.
pub enum Accepted {
    Tcp(TcpStream, SocketAddr),
    Unix(UnixStream),
}

impl Listener {
    pub async fn accept(&self) -> io::Result<Accepted> {
        match self {
            Listener::Tcp(l) => l.accept().await.map(|(s, a)| Accepted::Tcp(s, a)),
            Listener::Unix(l, _) => l.accept().await.map(|(s, _)| Accepted::Unix(s)),
        }
    }

    /// Where it listens, for logs.
    pub fn describe(&self) -> String {
        match self {
            Listener::Tcp(l) => l.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            Listener::Unix(_, p) => format!("unix:{}", p.display()),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // As etcd's: the socket file goes with the listener (a member that stops cleanly
        // leaves none behind; one that was killed leaves one its restart replaces).
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// An accepted socket: what the first byte is (peeked, left unread).
pub trait Socket: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static {
    fn peek_byte(&self) -> impl std::future::Future<Output = io::Result<Option<u8>>> + Send;
}

impl Socket for TcpStream {
    async fn peek_byte(&self) -> io::Result<Option<u8>> {
        let mut first = [0u8; 1];
        let n = self.peek(&mut first).await?;
        Ok((n == 1).then_some(first[0]))
    }
}

impl Socket for UnixStream {
    async fn peek_byte(&self) -> io::Result<Option<u8>> {
        loop {
            self.readable().await?;
            let mut first = [0u8; 1];
            // tokio has no peek for unix streams: MSG_PEEK through rustix's safe recv.
            let peeked = self.try_io(tokio::io::Interest::READABLE, || {
                rustix::net::recv(self, &mut first, rustix::net::RecvFlags::PEEK)
                    .map(|(n, _)| n)
                    .map_err(io::Error::from)
            });
            match peeked {
                Ok(n) => return Ok((n == 1).then_some(first[0])),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Each URL's address and whether TLS; a scheme other than `http`, `https` (and, where
/// `unix_ok`, `unix`, `unixs`) is refused with `what` (the flag) named.
pub fn parse(urls: &[String], what: &str) -> Result<Vec<ListenUrl>> {
    parse_with(urls, what, true)
}

/// [`parse`] for the peer port, which listens on TCP only.
pub fn parse_tcp(urls: &[String], what: &str) -> Result<Vec<ListenUrl>> {
    parse_with(urls, what, false)
}

fn parse_with(urls: &[String], what: &str, unix_ok: bool) -> Result<Vec<ListenUrl>> {
    urls.iter()
        .map(|u| {
            let (scheme, rest) = u.split_once("://").unwrap_or(("", u));
            let tls = matches!(scheme, "https" | "unixs");
            match scheme {
                "http" | "https" => {
                    let hostport = rest.trim_end_matches('/');
                    if hostport.contains('/') {
                        return Err(format!("{what} {u:?}: a listen URL has no path"));
                    }
                    Ok(ListenUrl {
                        addr: Addr::Tcp(hostport.to_string()),
                        tls,
                    })
                }
                "unix" | "unixs" if unix_ok => {
                    // etcd's: the host and the path together name the socket file
                    // (`unix:///run/kvd.sock`, or `unix://localhost:2379` in the working
                    // directory).
                    if rest.is_empty() {
                        return Err(format!("{what} {u:?}: no socket path"));
                    }
                    Ok(ListenUrl {
                        addr: Addr::Unix(PathBuf::from(rest)),
                        tls,
                    })
                }
                "unix" | "unixs" => Err(format!(
                    "{what} {u:?}: this port listens on TCP only (unix sockets are for client URLs)"
                )),
                _ => Err(format!(
                    "{what} {u:?}: want an http://host:port, https://host:port, unix://path or unixs://path URL"
                )),
            }
        })
        .collect()
}

/// Binds one socket per address of `urls` (parsed by [`parse`]).
pub async fn bind(urls: &[ListenUrl], what: &str) -> Result<Vec<Bound>> {
    let mut out: Vec<(Addr, Bound)> = Vec::new();
    for u in urls {
        if let Some((_, b)) = out.iter_mut().find(|(a, _)| *a == u.addr) {
            b.tls |= u.tls;
            b.plain |= !u.tls;
            continue;
        }
        let listener = match &u.addr {
            Addr::Tcp(hostport) => Listener::Tcp(bind_tcp(hostport, what).await?),
            Addr::Unix(path) => Listener::Unix(bind_unix(path, what)?, path.clone()),
        };
        out.push((
            u.addr.clone(),
            Bound {
                listener,
                tls: u.tls,
                plain: !u.tls,
            },
        ));
    }
    Ok(out.into_iter().map(|(_, b)| b).collect())
}

async fn bind_tcp(hostport: &str, what: &str) -> Result<TcpListener> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(hostport)
        .await
        .map_err(|e| format!("{what} {hostport}: {e}"))?
        .collect();
    // localhost resolves to both families; etcd listens on the first.
    let addr = addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("{what} {hostport}: resolves to no address"))?;
    TcpListener::bind(addr)
        .await
        .map_err(|e| format!("{what} {hostport}: cannot listen on {addr}: {e}"))
}

/// A unix socket at `path`. A socket left there (by a member that was killed) is replaced,
/// as etcd replaces it; any other file is refused, where etcd would delete it.
fn bind_unix(path: &Path, what: &str) -> Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path).map_err(|e| {
            format!(
                "{what} {}: cannot replace the old socket: {e}",
                path.display()
            )
        })?,
        Ok(_) => {
            return Err(format!(
                "{what} {}: the file exists and is not a socket",
                path.display()
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{what} {}: {e}", path.display())),
    }
    UnixListener::bind(path).map_err(|e| format!("{what} {}: cannot listen: {e}", path.display()))
}

/// Whether a connection's first byte, sent by `by`, opens a TLS handshake (a TLS record of
/// type handshake).
pub async fn starts_tls<S: Socket>(sock: &S, by: Instant) -> io::Result<bool> {
    let first = tokio::time::timeout_at(by, sock.peek_byte())
        .await
        .map_err(|_| timed_out("waiting for the first byte"))??;
    Ok(first == Some(0x16))
}

/// The TLS handshake of an accepted connection, done by `by`. A refused client (another
/// CA, no certificate) has been sent the alert saying why; its socket is closed only once
/// the client has read it, or a closing with its bytes unread would reset the connection and
/// the client would see "broken pipe" rather than the reason.
pub async fn handshake<S: Socket>(
    acceptor: &tokio_rustls::TlsAcceptor,
    sock: S,
    by: Instant,
) -> io::Result<tokio_rustls::server::TlsStream<S>> {
    let accept = acceptor.accept(sock).into_fallible();
    match tokio::time::timeout_at(by, accept).await {
        Err(_) => Err(timed_out("TLS handshake")),
        Ok(Ok(s)) => Ok(s),
        Ok(Err((e, sock))) => {
            drain(sock).await;
            Err(e)
        }
    }
}

/// Closes our side of `sock` and reads what the client still sends until it closes (or a
/// second passes), so that what we wrote last reaches it.
async fn drain<S: Socket>(mut sock: S) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = sock.shutdown().await;
        let mut sink = [0u8; 4096];
        while matches!(sock.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// An accepted connection, in the clear or over TLS, over TCP or (`S`) a unix socket.
pub type Stream<S = TcpStream> = consensus::dial::Conn<tokio_rustls::server::TlsStream<S>, S>;

/// The client's certificate chain, if it presented one (only over TLS, and only when the
/// port asks for certificates: then it has been verified).
pub fn peer_certificates<S>(s: &Stream<S>) -> Option<&[rustls_pki_types::CertificateDer<'static>]> {
    match s {
        Stream::Plain(_) => None,
        Stream::Tls(s) => s.get_ref().1.peer_certificates(),
    }
}

/// The protocol agreed by ALPN, if any.
pub fn alpn<S>(s: &Stream<S>) -> Option<&[u8]> {
    match s {
        Stream::Plain(_) => None,
        Stream::Tls(s) => s.get_ref().1.alpn_protocol(),
    }
}

/// Answers a client that speaks in the clear to a TLS-only port, so that it sees why it fails
/// rather than a reset: each gRPC call gets FAILED_PRECONDITION saying TLS is needed, an
/// HTTP/1.1 request Go's 400 reply (what etcd's Go server sends).
pub async fn refuse_plaintext<S: Socket>(mut sock: S, port: &str) {
    tracing::debug!(port, "a client spoke in the clear to a TLS port: refused");
    let Ok(Ok((proto, first))) =
        tokio::time::timeout(HANDSHAKE_TIMEOUT, grpc_wire::sniff(&mut sock)).await
    else {
        return;
    };
    let why = format!("this {port} URL requires TLS: connect with https:// and the cluster's CA");
    let served = async {
        match proto {
            grpc_wire::Protocol::Http2 => {
                let refuse = Refuse(Some(why));
                let router = axum::Router::new().fallback(|| async {
                    (http::StatusCode::BAD_REQUEST, "this port requires TLS\n")
                });
                let _ = grpc_wire::serve(
                    sock,
                    &first,
                    Arc::new(grpc_wire::Config::default()),
                    Arc::new(refuse),
                    router,
                    http::Extensions::new(),
                    std::future::pending(),
                )
                .await;
            }
            grpc_wire::Protocol::Http1 => {
                use tokio::io::AsyncWriteExt;
                let reply = b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n";
                let _ = sock.write_all(reply).await;
                drain(sock).await;
            }
        }
    };
    // A client that keeps the refused connection open gets a few seconds.
    let _ = tokio::time::timeout(Duration::from_secs(5), served).await;
}

/// The unary calls of a connection that serves no gRPC: none (`None`: each goes to the
/// router), or every one refused with FAILED_PRECONDITION and the reason.
#[derive(Debug)]
pub struct Refuse(pub Option<String>);

impl grpc_wire::Unary for Refuse {
    fn route(&self, _path: &[u8]) -> Option<usize> {
        self.0.as_ref().map(|_| 0)
    }

    fn call(
        &self,
        _id: usize,
        _msg: bytes::Bytes,
        _head: grpc_wire::CallHead<'_>,
    ) -> grpc_wire::UnaryFuture {
        let status = tonic::Status::failed_precondition(self.0.clone().unwrap_or_default());
        Box::pin(std::future::ready(Err(status)))
    }
}

/// Answers a TLS client on a plaintext port as Go's HTTP server does (etcd's): with a 400
/// reply, which a Go client reports as "first record does not look like a TLS handshake".
pub async fn refuse_tls<S: Socket>(mut sock: S, port: &str) {
    use tokio::io::AsyncWriteExt;
    tracing::debug!(port, "a TLS client on a plaintext port: refused");
    let reply = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request";
    let _ = sock.write_all(reply).await;
    drain(sock).await;
}

/// A TLS acceptor over `cfg`.
pub fn acceptor(cfg: Arc<rustls::ServerConfig>) -> tokio_rustls::TlsAcceptor {
    tokio_rustls::TlsAcceptor::from(cfg)
}
