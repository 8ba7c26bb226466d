//! Edges of a stream's life through raw frames: a request whose header list is too large is
//! answered 431 and ended, and what a client sends on a stream the server already reset is
//! ignored rather than answered with another error.

mod common;

use std::time::Duration;

use common::{block, frame, read_until, Frame};
use tokio::io::AsyncWriteExt;

const WAIT: Duration = Duration::from_secs(5);

fn ends(stream: u32) -> impl FnMut(&Frame) -> bool {
    move |f| f.2 == stream && f.1 & common::END_STREAM != 0 && f.0 == common::HEADERS
}

#[tokio::test]
async fn a_header_list_over_the_limit_is_answered_431_and_ended() {
    let (mut c, conn) = common::connect(grpc_wire::Config {
        max_header_list_size: 16 * 1024,
        ..grpc_wire::Config::default()
    });
    c.write_all(&common::preface()).await.unwrap();
    // Request 1 puts a 4,000-byte field in the table (incremental indexing, a literal name).
    let big = vec![b'v'; 4000];
    let mut b1 = block::GET.to_vec();
    b1.extend_from_slice(b"\x40\x05x-big\x7f");
    // 4000 in a 7-bit prefix: 127, then 3873 = 0x21 | 0x80, 0x1e.
    b1.extend_from_slice(&[0x81 | 0x20, 0x1e]);
    b1.extend_from_slice(&big);
    let end_both = common::END_HEADERS | common::END_STREAM;
    c.write_all(&frame(common::HEADERS, end_both, 1, &b1))
        .await
        .unwrap();
    let ok = read_until(&mut c, false, WAIT, |f| f.0 == common::HEADERS && f.2 == 1)
        .await
        .expect("request 1 is answered");
    assert_eq!(ok.3[0], 0x88, "200, statically indexed: {ok:?}");
    // Request 2 names that entry (index 62) five times: a 6-byte block, 20 KB of fields.
    let mut b2 = block::GET.to_vec();
    b2.extend_from_slice(&[0xbe; 5]);
    c.write_all(&frame(common::HEADERS, end_both, 3, &b2))
        .await
        .unwrap();
    let refused = read_until(&mut c, false, WAIT, ends(3))
        .await
        .expect("431, ending the stream");
    // ":status: 431", a literal with the name of static entry 8.
    assert_eq!(&refused.3[..5], b"\x08\x03431", "{refused:?}");
    // The connection goes on.
    c.write_all(&frame(common::HEADERS, end_both, 5, block::GET))
        .await
        .unwrap();
    read_until(&mut c, false, WAIT, |f| f.0 == common::HEADERS && f.2 == 5)
        .await
        .expect("request 3 is answered");
    assert!(!conn.is_finished());
}

#[tokio::test]
async fn frames_on_a_stream_the_server_reset_are_ignored() {
    let (mut c, conn) = common::connect(grpc_wire::Config {
        max_recv_message: 100,
        ..grpc_wire::Config::default()
    });
    c.write_all(&common::preface()).await.unwrap();
    // A unary call announcing a 1,000-byte message: refused at its first DATA frame.
    let mut out = frame(common::HEADERS, common::END_HEADERS, 1, block::ECHO);
    let mut first = vec![0];
    first.extend_from_slice(&1000u32.to_be_bytes());
    first.extend_from_slice(&[0; 200]);
    out.extend_from_slice(&frame(common::DATA, 0, 1, &first));
    c.write_all(&out).await.unwrap();
    let refused = read_until(&mut c, false, WAIT, |f| f.0 == common::HEADERS && f.2 == 1)
        .await
        .expect("RESOURCE_EXHAUSTED");
    assert_ne!(refused.1 & common::END_STREAM, 0);
    let rst = read_until(&mut c, false, WAIT, |f| f.0 == common::RST_STREAM)
        .await
        .expect("RST_STREAM(NO_ERROR): stop sending");
    assert_eq!((rst.2, rst.3.as_slice()), (1, &[0u8, 0, 0, 0][..]));
    // What the client had already sent: the rest of the message and trailers.
    let mut late = frame(common::DATA, 0, 1, &[0; 500]);
    late.extend_from_slice(&frame(common::DATA, common::END_STREAM, 1, &[0; 300]));
    // Then a call that works, to see everything the server sent in between.
    late.extend_from_slice(&frame(common::HEADERS, common::END_HEADERS, 3, block::ECHO));
    let msg = common::grpc_message(b"hi");
    late.extend_from_slice(&frame(common::DATA, common::END_STREAM, 3, &msg));
    c.write_all(&late).await.unwrap();
    let mut seen = Vec::new();
    read_until(&mut c, false, WAIT, |f| {
        seen.push(f.clone());
        f.0 == common::HEADERS && f.2 == 3 && f.1 & common::END_STREAM != 0
    })
    .await
    .expect("the next call is answered");
    let errors: Vec<_> = seen
        .iter()
        .filter(|f| f.0 == common::RST_STREAM || f.0 == common::GOAWAY)
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    assert!(!conn.is_finished());
}
