//! The peer port: raft's messages and snapshots (and the calls a member forwards to its
//! leader) over gRPC, in the clear or over TLS with etcd's peer checks.

use std::sync::Arc;

use consensus::grpc::PeerService;
use grpc_wire::Rewind;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use crate::listen::{self, Bound, Stream};

/// TLS on the peer port.
#[derive(Clone)]
pub struct PeerTls {
    pub config: Arc<rustls::ServerConfig>,
    /// etcd's check that a peer's client certificate names the address it connects from.
    pub check_san: bool,
}

/// Serves `routes` on `b` until `stop` turns true, and `raft`'s framed streams (a connection
/// whose first byte is [`consensus::grpc::MAGIC`]'s, which no HTTP/2 connection's is).
pub fn spawn(
    rt: &tokio::runtime::Runtime,
    b: Bound,
    routes: tonic::service::Routes,
    raft: PeerService,
    tls: Option<PeerTls>,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let addr = b.listener.describe();
    tracing::info!(%addr, tls = b.tls, "serving peer traffic");
    let (tx, rx) = mpsc::channel::<std::io::Result<Rewind<Stream>>>(64);
    let tls = tls.filter(|_| b.tls);
    let plain = b.plain;
    let mut accept_stop = stop.clone();
    rt.spawn(async move {
        loop {
            let accepted = tokio::select! {
                r = b.listener.accept() => r,
                _ = accept_stop.wait_for(|s| *s) => return,
            };
            let sock = match accepted {
                Ok(listen::Accepted::Tcp(s, _)) => s,
                // Peer URLs are parsed as TCP only: never reached.
                Ok(listen::Accepted::Unix(_)) => continue,
                Err(e) => {
                    tracing::warn!("accepting a peer connection: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            // Each handshake on its own task: a peer that stalls in it holds up no other.
            let (tx, tls, raft) = (tx.clone(), tls.clone(), raft.clone());
            tokio::spawn(async move {
                let Some(mut s) = accept(sock, tls, plain).await else {
                    return;
                };
                let first =
                    tokio::time::timeout(listen::HANDSHAKE_TIMEOUT, grpc_wire::sniff(&mut s));
                let Ok(Ok((_, first))) = first.await else {
                    return;
                };
                if first.first() == consensus::grpc::MAGIC.first() {
                    raft.serve_framed(first, s).await;
                } else {
                    let _ = tx.send(Ok(Rewind::new(first, s))).await;
                }
            });
        }
    });
    rt.spawn(async move {
        let r = tonic::transport::Server::builder()
            .add_routes(routes)
            .serve_with_incoming_shutdown(ReceiverStream::new(rx), async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await;
        if let Err(e) = r {
            tracing::error!("peer server stopped: {e}");
        }
    })
}

/// One accepted peer connection, through TLS and etcd's checks when the port has TLS.
async fn accept(sock: TcpStream, tls: Option<PeerTls>, plain: bool) -> Option<Stream> {
    // Small frames (heartbeats, appends) must not wait for Nagle's algorithm.
    if let Err(e) = sock.set_nodelay(true) {
        tracing::debug!("TCP_NODELAY: {e}");
    }
    let remote = sock.peer_addr().ok()?;
    let by = listen::open_by(tls.is_some());
    let starts_tls = listen::starts_tls(&sock, by).await.ok()?;
    let Some(tls) = tls else {
        if starts_tls {
            tracing::warn!(peer = %remote, "a peer spoke TLS to a plaintext peer port: refused (is its peer URL https:// where it should be http://?)");
            listen::refuse_tls(sock, "peer").await;
            return None;
        }
        return Some(Stream::Plain(sock));
    };
    if !starts_tls {
        if plain {
            return Some(Stream::Plain(sock));
        }
        tracing::warn!(peer = %remote, "a peer spoke in the clear to a TLS peer port: refused (is its peer URL http:// where it should be https://?)");
        listen::refuse_plaintext(sock, "peer").await;
        return None;
    }
    let s = match listen::handshake(&listen::acceptor(tls.config), sock, by).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(peer = %remote, "peer TLS handshake failed: {e}");
            return None;
        }
    };
    if tls.check_san {
        let leaf = s.get_ref().1.peer_certificates().and_then(|c| c.first());
        if let Some(cert) = leaf {
            if let Err(e) = crate::tls::check_peer_san(cert, remote.ip()).await {
                tracing::warn!(peer = %remote, "peer certificate refused: {e}");
                return None;
            }
        }
    }
    Some(Stream::Tls(Box::new(s)))
}
