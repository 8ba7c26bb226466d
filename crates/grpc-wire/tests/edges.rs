//! Edges of a stream's life through raw frames: a request whose header list is too large is
//! answered 431 and ended, what a client sends on a stream the server already reset is ignored
//! rather than answered with another error, and a call that wakes itself once is answered in
//! the same write as what its request brought about.

mod common;

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use common::{block, frame, read_until, Frame};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

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

/// Answers with the request message after waking itself once (as a proposal does so that the
/// calls polled with it share its turn).
#[derive(Debug)]
struct YieldsOnce;

impl grpc_wire::Unary for YieldsOnce {
    fn route(&self, path: &[u8]) -> Option<usize> {
        (path == b"/t.S/Echo").then_some(0)
    }

    fn call(
        &self,
        _: usize,
        msg: bytes::Bytes,
        _: grpc_wire::CallHead<'_>,
    ) -> grpc_wire::UnaryFuture {
        let mut yielded = false;
        let mut msg = Some(msg);
        Box::pin(std::future::poll_fn(move |cx| {
            if !std::mem::replace(&mut yielded, true) {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Poll::Ready(Ok(msg.take().unwrap_or_default()))
        }))
    }
}

/// The server's end of a pipe, keeping each write it is given.
struct Recorded {
    io: tokio::io::DuplexStream,
    writes: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl AsyncRead for Recorded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Recorded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let n = std::task::ready!(Pin::new(&mut self.io).poll_write(cx, buf))?;
        self.writes.lock().unwrap().push(buf[..n].to_vec());
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The frames in one write: (type, flags, stream).
fn frames_in(mut b: &[u8]) -> Vec<(u8, u8, u32)> {
    let mut out = Vec::new();
    while b.len() >= 9 {
        let len = (b[0] as usize) << 16 | (b[1] as usize) << 8 | b[2] as usize;
        let stream = u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff;
        out.push((b[3], b[4], stream));
        b = &b[(9 + len).min(b.len())..];
    }
    out
}

#[tokio::test]
async fn a_call_that_yields_once_is_answered_in_the_write_of_its_pings_ack_ahead_of_it() {
    let (mut c, server) = tokio::io::duplex(1 << 20);
    let writes = Arc::new(Mutex::new(Vec::new()));
    let io = Recorded {
        io: server,
        writes: writes.clone(),
    };
    let conn = tokio::spawn(grpc_wire::serve(
        io,
        b"",
        Arc::new(grpc_wire::Config::default()),
        Arc::new(YieldsOnce),
        common::Drain,
        Default::default(),
        std::future::pending(),
    ));
    c.write_all(&common::preface()).await.unwrap();
    read_until(&mut c, false, WAIT, |f| {
        f.0 == common::SETTINGS && f.1 & common::ACK != 0
    })
    .await
    .expect("the server acknowledges the client's settings");
    // As grpc-go sends a request after a response: a PING (its BDP probe), then the call.
    let mut req = frame(common::PING, 0, 0, &[7; 8]);
    req.extend(frame(common::HEADERS, common::END_HEADERS, 1, block::ECHO));
    req.extend(frame(
        common::DATA,
        common::END_STREAM,
        1,
        &common::grpc_message(b"hi"),
    ));
    c.write_all(&req).await.unwrap();
    read_until(&mut c, false, WAIT, ends(1))
        .await
        .expect("the call is answered");
    let writes = writes.lock().unwrap().clone();
    let with_ack = writes
        .iter()
        .map(|w| frames_in(w))
        .find(|fs| fs.contains(&(common::PING, common::ACK, 0)))
        .expect("the PING is acknowledged");
    assert!(
        with_ack.contains(&(common::HEADERS, common::END_HEADERS, 1)),
        "the answer is not in the write of the PING's ACK: {with_ack:?}"
    );
    // The ACK follows the answer's DATA: grpc-go then reads its DATA with the probe still
    // unanswered and does not send another.
    let at = |f: &dyn Fn(&(u8, u8, u32)) -> bool| with_ack.iter().position(f);
    let data = at(&|f| f.0 == common::DATA && f.2 == 1).expect("the answer has DATA");
    let ack = at(&|f| f.0 == common::PING).expect("the ACK");
    assert!(
        data < ack,
        "the PING's ACK comes before the answer's DATA: {with_ack:?}"
    );
    assert!(!conn.is_finished());
}
