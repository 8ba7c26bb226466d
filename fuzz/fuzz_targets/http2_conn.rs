//! The client port's HTTP/2 connection (frames, HPACK, gRPC message framing, its limits and
//! counters) fed arbitrary bytes after the connection preface: it answers, refuses with a
//! GOAWAY, or closes — and once its client is gone, it ends; never a panic, never a hang.
#![no_main]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Answers every unary call with its own request message.
#[derive(Debug)]
struct Echo;

impl grpc_wire::Unary for Echo {
    fn route(&self, path: &[u8]) -> Option<usize> {
        path.starts_with(b"/echo").then_some(0)
    }

    fn call(
        &self,
        _id: usize,
        msg: Bytes,
        _head: grpc_wire::CallHead<'_>,
    ) -> grpc_wire::UnaryFuture {
        Box::pin(std::future::ready(Ok(msg)))
    }
}

fuzz_target!(|data: &[u8]| {
    kvd_fuzz::runtime().block_on(async {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let cfg = Arc::new(grpc_wire::Config {
            max_recv_message: 1 << 16,
            ..grpc_wire::Config::default()
        });
        let conn = grpc_wire::serve(
            server,
            b"",
            cfg,
            Arc::new(Echo),
            axum::Router::new(),
            http::Extensions::new(),
            std::future::pending(),
        );
        let input = data.to_vec();
        let talk = async move {
            let (mut rd, mut wr) = tokio::io::split(&mut client);
            let send = async {
                let _ = wr.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
                let _ = wr.write_all(&input).await;
                let _ = wr.shutdown().await;
            };
            let recv = async {
                let mut sink = Vec::new();
                let _ = rd.read_to_end(&mut sink).await;
            };
            tokio::join!(send, recv);
        };
        let both = async {
            let (r, ()) = tokio::join!(conn, talk);
            r
        };
        // Generous: a connection whose client has gone must end on its own.
        if tokio::time::timeout(Duration::from_secs(10), both)
            .await
            .is_err()
        {
            panic!("the connection did not end after its client closed");
        }
    });
});
