//! Arbitrary frames from a client: the connection answers or ends with an error, never
//! panics, and always ends once the client has closed its side.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body::Body;
use proptest::collection::vec;
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Answers every unary call with its request message.
#[derive(Debug)]
struct Echo;

impl grpc_wire::Unary for Echo {
    fn route(&self, path: &[u8]) -> Option<usize> {
        (path == b"/t.S/Echo").then_some(0)
    }

    fn call(&self, _: usize, msg: Bytes) -> grpc_wire::UnaryFuture {
        Box::pin(std::future::ready(Ok(msg)))
    }
}

/// Reads the whole request body, then answers 200 with its length.
#[derive(Debug, Clone)]
struct Drain;

impl tower_service::Service<http::Request<grpc_wire::RecvBody>> for Drain {
    type Response = http::Response<String>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<http::Response<String>, Infallible>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<grpc_wire::RecvBody>) -> Self::Future {
        Box::pin(async move {
            let mut body = std::pin::pin!(req.into_body());
            let mut n = 0;
            while let Some(Ok(f)) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
                n += f.data_ref().map_or(0, |d| d.len());
            }
            Ok(http::Response::new(n.to_string()))
        })
    }
}

/// Header blocks worth sending whole: a unary call, a bridged request, trailers, and a
/// block that adds to the dynamic table and one that refers to it.
const BLOCKS: [&[u8]; 5] = [
    // :method POST, :scheme http, :path /t.S/Echo, content-type: application/grpc
    b"\x83\x86\x04\x09/t.S/Echo\x0f\x10\x10application/grpc",
    // :method GET, :scheme http, :path /
    b"\x82\x86\x84",
    // grpc-status: 0 (trailers)
    b"\x00\x0bgrpc-status\x010",
    // :method POST, :scheme http, :path / , x-a: b with incremental indexing
    b"\x83\x86\x84\x40\x03x-a\x01b",
    // :method POST, :scheme http, :path /, then dynamic entry 62
    b"\x83\x86\x84\xbe",
];

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// One client frame: mostly well-formed headers and DATA on a few streams, with arbitrary
/// types, flags and payloads mixed in.
fn client_frame() -> impl Strategy<Value = Vec<u8>> {
    let stream = prop_oneof![Just(0u32), Just(1), Just(3), Just(5), Just(2), 0u32..10];
    prop_oneof![
        (0usize..BLOCKS.len(), any::<bool>(), stream.clone())
            .prop_map(|(b, end, s)| { frame(1, 0x4 | end as u8, s, BLOCKS[b]) }),
        (vec(any::<u8>(), 0..20), any::<bool>(), stream.clone()).prop_map(|(d, end, s)| {
            let mut p = vec![0, 0, 0, 0, d.len() as u8];
            p.extend_from_slice(&d);
            frame(0, end as u8, s, &p)
        }),
        (0u8..12, any::<u8>(), stream, vec(any::<u8>(), 0..24))
            .prop_map(|(k, f, s, p)| frame(k, f, s, &p)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_frames_never_panic_and_the_connection_ends(frames in vec(client_frame(), 0..24)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (mut client, server) = tokio::io::duplex(1 << 20);
            let cfg = Arc::new(grpc_wire::Config::default());
            let conn = tokio::spawn(grpc_wire::serve(
                server,
                b"",
                cfg,
                Arc::new(Echo),
                Drain,
                std::future::pending(),
            ));
            let mut out = grpc_wire::frame::PREFACE.to_vec();
            out.extend_from_slice(&frame(4, 0, 0, &[]));
            for f in &frames {
                out.extend_from_slice(f);
            }
            // The server may close first (a connection error): then writing fails, which is fine.
            let _ = client.write_all(&out).await;
            let _ = client.shutdown().await;
            let mut sink = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut sink)).await;
            let ended = tokio::time::timeout(Duration::from_secs(5), conn).await;
            let joined = ended.expect("the connection ends once the client has closed");
            assert!(joined.is_ok(), "the connection task panicked: {joined:?}");
        });
    }
}
