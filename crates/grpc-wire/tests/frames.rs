//! Arbitrary frames from a client: the connection answers or ends with an error, never
//! panics, and always ends once the client has closed its side.

mod common;

use std::time::Duration;

use common::{block, frame};
use proptest::collection::vec;
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Header blocks worth sending whole: a unary call, a bridged request, trailers, and a
/// block that adds to the dynamic table and one that refers to it.
const BLOCKS: [&[u8]; 5] = [
    block::ECHO,
    block::GET,
    // grpc-status: 0 (trailers)
    b"\x00\x0bgrpc-status\x010",
    // :method POST, :scheme http, :path / , x-a: b with incremental indexing
    b"\x83\x86\x84\x40\x03x-a\x01b",
    // :method POST, :scheme http, :path /, then dynamic entry 62
    b"\x83\x86\x84\xbe",
];

/// One client frame: mostly well-formed headers and DATA on a few streams, with arbitrary
/// types, flags and payloads mixed in.
fn client_frame() -> impl Strategy<Value = Vec<u8>> {
    let stream = prop_oneof![Just(0u32), Just(1), Just(3), Just(5), Just(2), 0u32..10];
    prop_oneof![
        (0usize..BLOCKS.len(), any::<bool>(), stream.clone())
            .prop_map(|(b, end, s)| { frame(1, 0x4 | end as u8, s, BLOCKS[b]) }),
        (vec(any::<u8>(), 0..20), any::<bool>(), stream.clone()).prop_map(|(d, end, s)| frame(
            0,
            end as u8,
            s,
            &common::grpc_message(&d)
        )),
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
            let (mut client, conn) = common::connect(grpc_wire::Config::default());
            let mut out = common::preface();
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
