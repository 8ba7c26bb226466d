//! Listening: the URLs of etcd's `--listen-*-urls` flags (`http://` and `https://`), one
//! socket per address, and the accepted connection in the clear or over TLS.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
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

/// A listener and what it speaks.
#[derive(Debug)]
pub struct Bound {
    pub listener: TcpListener,
    /// Some of its URLs are `https://`.
    pub tls: bool,
    /// Some of its URLs are `http://` (with `tls` too, a connection's first byte decides, as
    /// etcd serves an address given both ways).
    pub plain: bool,
}

/// The `host:port` and whether TLS, of each URL; anything but `http://` and `https://` is
/// refused with `what` (the flag) named.
pub fn parse(urls: &[String], what: &str) -> Result<Vec<(String, bool)>> {
    urls.iter()
        .map(|u| {
            let (tls, hostport) = match u.split_once("://") {
                Some(("http", h)) => (false, h),
                Some(("https", h)) => (true, h),
                Some(("unix" | "unixs", _)) => {
                    return Err(format!("{what} {u:?}: unix sockets are not supported"))
                }
                _ => {
                    return Err(format!(
                        "{what} {u:?}: want an http://host:port or https://host:port URL"
                    ))
                }
            };
            let hostport = hostport.trim_end_matches('/');
            if hostport.contains('/') {
                return Err(format!("{what} {u:?}: a listen URL has no path"));
            }
            Ok((hostport.to_string(), tls))
        })
        .collect()
}

/// Binds one socket per address of `urls` (parsed by [`parse`]).
pub async fn bind(urls: &[(String, bool)], what: &str) -> Result<Vec<Bound>> {
    let mut out: Vec<(String, Bound)> = Vec::new();
    for (hostport, tls) in urls {
        if let Some((_, b)) = out.iter_mut().find(|(h, _)| h == hostport) {
            b.tls |= tls;
            b.plain |= !tls;
            continue;
        }
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host(hostport.as_str())
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
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("{what} {hostport}: cannot listen on {addr}: {e}"))?;
        out.push((
            hostport.clone(),
            Bound {
                listener,
                tls: *tls,
                plain: !tls,
            },
        ));
    }
    Ok(out.into_iter().map(|(_, b)| b).collect())
}

/// Whether a connection's first byte, sent by `by`, opens a TLS handshake (a TLS record of
/// type handshake).
pub async fn starts_tls(sock: &TcpStream, by: Instant) -> io::Result<bool> {
    let mut first = [0u8; 1];
    let n = tokio::time::timeout_at(by, sock.peek(&mut first))
        .await
        .map_err(|_| timed_out("waiting for the first byte"))??;
    Ok(n == 1 && first[0] == 0x16)
}

/// The TLS handshake of an accepted connection, done by `by`. A refused client (another
/// CA, no certificate) has been sent the alert saying why; its socket is closed only once
/// the client has read it, or a closing with its bytes unread would reset the connection and
/// the client would see "broken pipe" rather than the reason.
pub async fn handshake(
    acceptor: &tokio_rustls::TlsAcceptor,
    sock: TcpStream,
    by: Instant,
) -> io::Result<tokio_rustls::server::TlsStream<TcpStream>> {
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
async fn drain(mut sock: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = sock.shutdown().await;
        let mut sink = [0u8; 4096];
        while matches!(sock.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// An accepted connection, in the clear or over TLS.
pub type Stream = consensus::dial::Conn<tokio_rustls::server::TlsStream<TcpStream>>;

/// The client's certificate chain, if it presented one (only over TLS, and only when the
/// port asks for certificates: then it has been verified).
pub fn peer_certificates(s: &Stream) -> Option<&[rustls_pki_types::CertificateDer<'static>]> {
    match s {
        Stream::Plain(_) => None,
        Stream::Tls(s) => s.get_ref().1.peer_certificates(),
    }
}

/// The protocol agreed by ALPN, if any.
pub fn alpn(s: &Stream) -> Option<&[u8]> {
    match s {
        Stream::Plain(_) => None,
        Stream::Tls(s) => s.get_ref().1.alpn_protocol(),
    }
}

/// Answers a client that speaks in the clear to a TLS-only port, so that it sees why it fails
/// rather than a reset: each gRPC call gets FAILED_PRECONDITION saying TLS is needed, an
/// HTTP/1.1 request Go's 400 reply (what etcd's Go server sends).
pub async fn refuse_plaintext(mut sock: TcpStream, port: &str) {
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
                    Stream::Plain(sock),
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
pub async fn refuse_tls(mut sock: TcpStream, port: &str) {
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
