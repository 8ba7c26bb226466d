//! The client port: gRPC (HTTP/2) and the JSON gateway, `/health`, `/metrics`… (HTTP/1.1) on
//! one listener, in the clear or over TLS, as etcd serves them.
//!
//! Over TLS, ALPN tells HTTP/2 (`h2`) from HTTP/1.1; in the clear (or with no ALPN), a
//! connection's first bytes do. HTTP/2 goes to `grpc-wire`, which answers etcd's KV calls
//! itself and hands every other stream to the router; HTTP/1.1 is served by hyper with the
//! same router. A verified client certificate's CN travels with every request of its
//! connection ([`rpc::ClientCert`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use grpc_wire::Protocol;
use std::net::SocketAddr;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::listen::{self, Accepted, Listener, Socket, Stream};

/// What a listener serves (etcd splits gRPC from HTTP with `--listen-client-http-urls`, and
/// serves metrics alone on `--listen-metrics-urls`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Traffic {
    Both,
    Grpc,
    Http,
    Metrics,
}

/// One listener's configuration.
#[derive(Clone)]
pub struct Mode {
    pub traffic: Traffic,
    /// TLS, when some of the listener's URLs are `https://`.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// Some of its URLs are `http://` (with TLS too: the first byte decides).
    pub plain: bool,
}

/// The routers and calls a listener chooses from: a member's client port, or a proxy's.
#[derive(Debug, Clone)]
pub struct Port {
    /// Every gRPC service and every HTTP route.
    pub router: axum::Router,
    /// The gRPC services alone, and the HTTP routes alone (etcd splits them with
    /// `--listen-client-http-urls`).
    pub grpc_router: axum::Router,
    pub http_router: axum::Router,
    /// `/metrics` and the health endpoints (`--listen-metrics-urls`, `--metrics-addr`).
    pub metrics: axum::Router,
    /// The unary calls the connection answers itself.
    pub unary: Arc<dyn grpc_wire::Unary>,
    pub config: Arc<grpc_wire::Config>,
}

impl Port {
    /// A member's client port.
    pub fn member(client: rpc::ClientPort, metrics: axum::Router) -> Port {
        Port {
            router: client.router,
            grpc_router: client.grpc_router,
            http_router: client.http_router,
            metrics,
            unary: client.unary,
            config: client.config,
        }
    }

    fn router(&self, t: Traffic) -> axum::Router {
        match t {
            Traffic::Both => self.router.clone(),
            Traffic::Grpc => self.grpc_router.clone(),
            Traffic::Http => self.http_router.clone(),
            Traffic::Metrics => self.metrics.clone(),
        }
    }

    fn unary(&self, t: Traffic) -> Arc<dyn grpc_wire::Unary> {
        match t {
            Traffic::Both | Traffic::Grpc => self.unary.clone(),
            Traffic::Http | Traffic::Metrics => Arc::new(listen::Refuse(None)),
        }
    }
}

/// Serves each listener of `listeners` with what its traffic asks of `port`, TLS from
/// `acceptor` where its URLs are `https://`, on `rt`, until `stop` turns true.
pub fn serve_all(
    rt: &tokio::runtime::Handle,
    listeners: Vec<(Vec<listen::Bound>, Traffic)>,
    port: &Port,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    stop: &watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut servers = Vec::new();
    for (ls, traffic) in listeners {
        for b in ls {
            let addr = b.listener.describe();
            tracing::info!(%addr, tls = b.tls, ?traffic, "serving client traffic");
            let mode = Mode {
                traffic,
                tls: acceptor.clone().filter(|_| b.tls),
                plain: b.plain,
            };
            servers.push(rt.spawn(serve(b.listener, port.clone(), mode, stop.clone())));
        }
    }
    servers
}

/// Accepts connections on `l` until `stop` turns true, then waits for those under way to
/// finish (each is told to stop taking requests).
pub async fn serve(l: Listener, port: Port, mode: Mode, stop: watch::Receiver<bool>) {
    let mut conns = JoinSet::new();
    let mut stopping = std::pin::pin!(stopped(stop.clone()));
    loop {
        tokio::select! {
            r = l.accept() => match r {
                Ok(Accepted::Tcp(sock, peer)) => {
                    // Small responses must not wait for Nagle's algorithm (a ~40 ms stall
                    // otherwise), as in etcd (Go's default).
                    if let Err(e) = sock.set_nodelay(true) {
                        tracing::debug!("TCP_NODELAY: {e}");
                    }
                    let (port, mode, stop) = (port.clone(), mode.clone(), stop.clone());
                    conns.spawn(connection(sock, Some(peer), port, mode, stop));
                }
                Ok(Accepted::Unix(sock)) => {
                    let (port, mode, stop) = (port.clone(), mode.clone(), stop.clone());
                    conns.spawn(connection(sock, None, port, mode, stop));
                }
                Err(e) => {
                    // Out of descriptors, or a connection reset before it was accepted: go
                    // on after a breath rather than spin.
                    tracing::warn!("accepting a client connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = stopping.as_mut() => break,
        }
        while conns.try_join_next().is_some() {}
    }
    drop(l);
    while conns.join_next().await.is_some() {}
}

/// Resolves once `stop` turns true (or its sender is gone).
fn stopped(stop: watch::Receiver<bool>) -> Stopped {
    let seen = stop.clone();
    let mut stop = stop;
    Stopped {
        waiting: Box::pin(async move {
            let _ = stop.wait_for(|s| *s).await;
        }),
        seen,
        waker: None,
    }
}

/// A connection polls its stop each time it is woken, several times a request. Between sends
/// on the channel a poll costs one atomic load: the wait registered with the same waker
/// before still stands, and a send wakes it.
struct Stopped {
    waiting: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// A receiver that saw what `waiting`'s saw when it began: `has_changed` tells a send since.
    seen: watch::Receiver<bool>,
    /// The waker `waiting` was last polled with.
    waker: Option<Waker>,
}

impl Future for Stopped {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let quiet = matches!(this.seen.has_changed(), Ok(false));
        if quiet && this.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            return Poll::Pending;
        }
        this.waker = Some(cx.waker().clone());
        this.waiting.as_mut().poll(cx)
    }
}

/// Serves one accepted connection (`peer`: the client's address, over TCP).
async fn connection<S: Socket>(
    sock: S,
    peer: Option<SocketAddr>,
    port: Port,
    mode: Mode,
    stop: watch::Receiver<bool>,
) {
    // A silent connection holds a descriptor only so long: the handshake by etcd's TLS
    // listener's bound, the first request bytes by grpc-go's.
    let preface_by = listen::open_by(false);
    let by = listen::open_by(mode.tls.is_some());
    let Some(stream) = open(sock, peer, &mode, by).await else {
        return;
    };
    let mut ext = http::Extensions::new();
    if let Some(p) = peer {
        ext.insert(grpc_wire::RemoteAddr(p));
    }
    if let Some(cn) = listen::peer_certificates(&stream)
        .and_then(|c| c.first())
        .and_then(crate::tls::common_name)
    {
        ext.insert(rpc::ClientCert { common_name: cn });
    }
    let mut stream = stream;
    // HTTP/1.1 agreed by ALPN: hyper bounds the wait for the request's head. Otherwise the
    // first bytes tell HTTP/2's preface from HTTP/1.1.
    let (proto, first) = if listen::alpn(&stream) == Some(b"http/1.1") {
        (Protocol::Http1, Vec::new())
    } else {
        match tokio::time::timeout_at(preface_by, grpc_wire::sniff(&mut stream)).await {
            Ok(Ok(x)) => x,
            Ok(Err(e)) => {
                tracing::debug!("client connection: {e}");
                return;
            }
            Err(_) => {
                tracing::debug!(client = ?peer, "client connection closed: no request within {:?}", listen::PREFACE_TIMEOUT);
                return;
            }
        }
    };
    let r = match proto {
        Protocol::Http2 => grpc_wire::serve(
            stream,
            &first,
            port.config.clone(),
            port.unary(mode.traffic),
            port.router(mode.traffic),
            ext,
            stopped(stop),
        )
        .await
        .map_err(|e| e.to_string()),
        // The JSON gateway takes its user from a token only (etcd ignores the CN there).
        Protocol::Http1 => {
            http1(
                grpc_wire::Rewind::new(first, stream),
                port.router(mode.traffic),
                stop,
            )
            .await
        }
    };
    if let Err(e) = r {
        tracing::debug!("client connection ended: {e}");
    }
}

/// The accepted `sock` in the clear, or through TLS, opened by `by`; `None` when refused or
/// late (the client is told why where it can be).
async fn open<S: Socket>(
    sock: S,
    peer: Option<SocketAddr>,
    mode: &Mode,
    by: tokio::time::Instant,
) -> Option<Stream<S>> {
    let tls = match listen::starts_tls(&sock, by).await {
        Ok(t) => t,
        Err(e) => {
            tracing::debug!(client = ?peer, "client connection: {e}");
            return None;
        }
    };
    match (&mode.tls, tls) {
        (None, false) => Some(Stream::Plain(sock)),
        (None, true) => {
            listen::refuse_tls(sock, "client").await;
            None
        }
        (Some(_), false) if mode.plain => Some(Stream::Plain(sock)),
        (Some(_), false) => {
            listen::refuse_plaintext(sock, "client").await;
            None
        }
        (Some(acceptor), true) => match listen::handshake(acceptor, sock, by).await {
            Ok(s) => Some(Stream::Tls(Box::new(s))),
            Err(e) => {
                // A client with a certificate of another CA, revoked, or none: the client is
                // told by the TLS alert; this is only worth a debug line.
                tracing::debug!(client = ?peer, "client TLS handshake failed: {e}");
                None
            }
        },
    }
}

/// etcd 3.7.1's `ReadHeaderTimeout` of its client HTTP server.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(300);

async fn http1<S: Socket>(
    io: grpc_wire::Rewind<Stream<S>>,
    router: axum::Router,
    stop: watch::Receiver<bool>,
) -> Result<(), String> {
    let svc = hyper_util::service::TowerToHyperService::new(router);
    // As etcd 3.7.1's HTTP server: a request's head must arrive within five minutes.
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(hyper_util::rt::TokioIo::new(io), svc);
    let mut conn = std::pin::pin!(conn);
    let mut stop = std::pin::pin!(stopped(stop));
    tokio::select! {
        r = conn.as_mut() => return r.map_err(|e| e.to_string()),
        _ = stop.as_mut() => {}
    }
    // Finish the request under way, then close.
    conn.as_mut().graceful_shutdown();
    conn.await.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls `f` once with `cx`'s waker and says whether it finished.
    async fn ready(f: &mut Stopped) -> bool {
        std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *f).poll(cx).is_ready())).await
    }

    #[tokio::test]
    async fn a_stop_wakes_its_connection_once_sent_true_and_not_before() {
        let (tx, rx) = watch::channel(false);
        let mut s = stopped(rx);
        for _ in 0..3 {
            assert!(!ready(&mut s).await);
        }
        // A send that does not stop: polled again, still waiting.
        tx.send(false).unwrap();
        assert!(!ready(&mut s).await);
        // Waiting in a task of its own (a new waker): the send must wake it.
        let waiting = tokio::spawn(s);
        tokio::task::yield_now().await;
        tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("woken by the stop")
            .unwrap();
        // Already stopped when it began: done at its first poll.
        assert!(ready(&mut stopped(tx.subscribe())).await);
    }

    #[tokio::test]
    async fn a_stop_whose_sender_is_gone_is_done() {
        let (tx, rx) = watch::channel(false);
        let mut s = stopped(rx);
        assert!(!ready(&mut s).await);
        drop(tx);
        assert!(ready(&mut s).await);
    }
}
