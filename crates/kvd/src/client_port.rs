//! The client port: gRPC (HTTP/2) and the JSON gateway, `/health`, `/metrics`… (HTTP/1.1) on
//! one listener, as etcd serves them.
//!
//! A connection's first bytes tell which: HTTP/2's preface goes to `grpc-wire`, which answers
//! etcd's KV calls itself and hands every other stream to the router; anything else is
//! HTTP/1.1, served by hyper with the same router.

use std::time::Duration;

use grpc_wire::Protocol;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Accepts connections on `l` until `stop` turns true, then waits for those under way to
/// finish (each is told to stop taking requests).
pub async fn serve(l: TcpListener, port: rpc::ClientPort, stop: watch::Receiver<bool>) {
    let mut conns = JoinSet::new();
    let mut stopping = std::pin::pin!(stopped(stop.clone()));
    loop {
        tokio::select! {
            r = l.accept() => match r {
                Ok((sock, _)) => {
                    conns.spawn(connection(sock, port.clone(), stop.clone()));
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

/// Resolves once `stop` turns true.
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

async fn connection(mut sock: TcpStream, port: rpc::ClientPort, stop: watch::Receiver<bool>) {
    // Small responses must not wait for Nagle's algorithm (a ~40 ms stall otherwise), as in
    // etcd (Go's default).
    if let Err(e) = sock.set_nodelay(true) {
        tracing::debug!("TCP_NODELAY: {e}");
    }
    let (proto, first) = match grpc_wire::sniff(&mut sock).await {
        Ok(x) => x,
        Err(e) => {
            tracing::debug!("client connection: {e}");
            return;
        }
    };
    let r = match proto {
        Protocol::Http2 => grpc_wire::serve(
            sock,
            &first,
            port.config,
            port.unary,
            port.router,
            stopped(stop),
        )
        .await
        .map_err(|e| e.to_string()),
        Protocol::Http1 => http1(grpc_wire::Rewind::new(first, sock), port.router, stop).await,
    };
    if let Err(e) = r {
        tracing::debug!("client connection ended: {e}");
    }
}

async fn http1(
    io: grpc_wire::Rewind<TcpStream>,
    router: axum::Router,
    stop: watch::Receiver<bool>,
) -> Result<(), String> {
    let svc = hyper_util::service::TowerToHyperService::new(router);
    let conn = hyper::server::conn::http1::Builder::new()
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
