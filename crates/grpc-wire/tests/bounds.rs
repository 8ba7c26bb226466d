//! What a connection holds for its client stays within its bounds, through raw frames: the
//! answers of a client that does not read, or gives no flow-control window, stop its calls
//! from running until it catches up (and then every answer comes); streams that never finish
//! their request are refused past the bound; a connection that holds too much while the
//! server as a whole does is held back, and the others go on.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{block, frame, read_until, Frame, BIG};
use tokio::io::{AsyncRead, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(10);
const REFUSED_STREAM: u32 = 0x7;
const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
const WINDOW_UPDATE: u8 = 0x8;

fn cfg(bound: usize) -> Arc<grpc_wire::Config> {
    Arc::new(grpc_wire::Config {
        max_conn_buffer: bound,
        ..grpc_wire::Config::default()
    })
}

/// The preface, with windows large enough for every answer of a test.
fn preface_and_windows() -> Vec<u8> {
    let mut out = common::preface_with(&[(SETTINGS_INITIAL_WINDOW_SIZE, 64 << 20)]);
    out.extend_from_slice(&frame(WINDOW_UPDATE, 0, 0, &0x7fff_0000u32.to_be_bytes()));
    out
}

/// `n` calls for the 1 MiB answer, on streams `first`, `first + 2`, …
fn big_calls(first: u32, n: u32) -> Vec<u8> {
    let msg = common::grpc_message(b"");
    let mut out = Vec::new();
    for i in 0..n {
        let id = first + 2 * i;
        out.extend_from_slice(&frame(common::HEADERS, common::END_HEADERS, id, block::BIG));
        out.extend_from_slice(&frame(common::DATA, common::END_STREAM, id, &msg));
    }
    out
}

/// Waits until the guard's count of held bytes has stayed the same for a while (the server
/// has done what it will with what it was sent); that count.
async fn settled(cfg: &grpc_wire::Config) -> usize {
    let mut last = usize::MAX;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = cfg.guard.stats().held_bytes;
        if now == last {
            return now;
        }
        last = now;
    }
}

/// Reads the answers of streams `ids` (the windows are the test's to give): each must end
/// in trailers after its whole message.
async fn read_answers<R: AsyncRead + Unpin>(rd: &mut R, ids: impl Iterator<Item = u32>) {
    let mut want: std::collections::HashMap<u32, usize> = ids.map(|id| (id, 0)).collect();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !want.is_empty() {
        let f = tokio::time::timeout_at(deadline, common::read_frame(rd))
            .await
            .expect("the answers come in time")
            .expect("the connection stays");
        match f.0 {
            common::DATA => *want.get_mut(&f.2).expect("an answer to a call made") += f.3.len(),
            common::HEADERS if f.1 & common::END_STREAM != 0 => {
                let got = want.remove(&f.2).expect("an answer to a call made");
                assert_eq!(got, 5 + BIG, "stream {}: the whole answer", f.2);
            }
            common::RST_STREAM | common::GOAWAY => panic!("{f:?}"),
            _ => {}
        }
    }
}

#[tokio::test]
async fn answers_a_client_does_not_read_stop_its_calls_until_it_does() {
    let bound = 4 << 20;
    let cfg = cfg(bound);
    let (mut c, conn) = common::connect_shared(cfg.clone(), None);
    c.write_all(&preface_and_windows()).await.unwrap();
    // 200 calls of 1 MiB answers, none read: without the bound the server would hold 200 MiB.
    let calls = big_calls(1, 200);
    let (mut rd, mut wr) = tokio::io::split(c);
    let writer = tokio::spawn(async move {
        wr.write_all(&calls).await.unwrap();
        wr
    });
    let held = settled(&cfg).await;
    // The bound, one answer past it, and the requests read meanwhile.
    assert!(held <= bound + 2 * BIG, "held {held} bytes");
    // Nothing is lost: the client reads, and gets every answer.
    let reading = read_answers(&mut rd, (0..200).map(|i| 1 + 2 * i));
    let (_, wr) = tokio::join!(reading, writer);
    let wr = wr.unwrap();
    drop(wr);
    assert!(!conn.is_finished());
    assert!(cfg.guard.stats().backpressure_pauses > 0);
}

#[tokio::test]
async fn answers_waiting_for_flow_control_count_toward_the_bound() {
    let bound = 4 << 20;
    let cfg = cfg(bound);
    let (mut c, conn) = common::connect_shared(cfg.clone(), None);
    // A one-byte window for every stream, 300 calls for 1 MiB answers.
    let mut out = common::preface_with(&[(SETTINGS_INITIAL_WINDOW_SIZE, 1)]);
    out.extend_from_slice(&frame(WINDOW_UPDATE, 0, 0, &0x7fff_0000u32.to_be_bytes()));
    out.extend_from_slice(&big_calls(1, 300));
    c.write_all(&out).await.unwrap();
    let held = settled(&cfg).await;
    assert!(held <= bound + 2 * BIG, "held {held} bytes");
    // The windows open: every answer comes whole.
    let mut open = Vec::new();
    for i in 0..300u32 {
        open.extend_from_slice(&frame(
            WINDOW_UPDATE,
            0,
            1 + 2 * i,
            &(BIG as u32 + 64).to_be_bytes(),
        ));
    }
    c.write_all(&open).await.unwrap();
    read_answers(&mut c, (0..300).map(|i| 1 + 2 * i)).await;
    assert!(!conn.is_finished());
}

#[tokio::test]
async fn streams_whose_request_never_ends_are_refused_past_the_bound() {
    let bound = 1 << 20;
    let cfg = cfg(bound);
    let (c, conn) = common::connect_shared(cfg.clone(), None);
    let (mut rd, mut wr) = tokio::io::split(c);
    wr.write_all(&common::preface()).await.unwrap();
    // Stream after stream whose message never comes whole (3 of its 5 prefix bytes).
    let mut out = Vec::new();
    for i in 0..20_000u32 {
        let id = 1 + 2 * i;
        out.extend_from_slice(&frame(
            common::HEADERS,
            common::END_HEADERS,
            id,
            block::ECHO,
        ));
        out.extend_from_slice(&frame(common::DATA, 0, id, &[0, 0, 0]));
    }
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&out).await;
        wr
    });
    let refused = loop {
        let f = tokio::time::timeout(WAIT, common::read_frame(&mut rd))
            .await
            .expect("a stream is refused in time")
            .expect("the connection stays");
        if f.0 == common::RST_STREAM
            && u32::from_be_bytes(f.3[..4].try_into().unwrap()) == REFUSED_STREAM
        {
            break f;
        }
    };
    assert!(refused.2 > 1000, "stream {} refused", refused.2);
    let held = settled(&cfg).await;
    assert!(held <= bound + 64 * 1024, "held {held} bytes");
    assert!(cfg.guard.stats().refused_streams > 0);
    drop(writer);
    drop(conn);
}

#[tokio::test]
async fn only_the_oldest_unfinished_request_may_grow_past_the_bound() {
    let bound = 1 << 20;
    let cfg = Arc::new(grpc_wire::Config {
        max_conn_buffer: bound,
        max_recv_message: 4 << 20,
        ..grpc_wire::Config::default()
    });
    let (mut c, conn) = common::connect_shared(cfg.clone(), None);
    c.write_all(&preface_and_windows()).await.unwrap();
    // Eight requests of 600 KiB, sent a 16 KiB frame each in turn: together past the bound.
    let size = 600 * 1024;
    let mut msg = vec![0u8, 0, 0, 0, 0];
    msg[1..5].copy_from_slice(&(size as u32).to_be_bytes());
    msg.resize(5 + size, b'x');
    let ids: Vec<u32> = (0..8).map(|i| 1 + 2 * i).collect();
    for &id in &ids {
        c.write_all(&frame(
            common::HEADERS,
            common::END_HEADERS,
            id,
            block::ECHO,
        ))
        .await
        .unwrap();
    }
    let (mut rd, mut wr) = tokio::io::split(c);
    let chunks: Vec<&[u8]> = msg.chunks(16 * 1024).collect();
    let n = chunks.len();
    let mut frames = Vec::new();
    for (k, chunk) in chunks.iter().enumerate() {
        for &id in &ids {
            let end = if k == n - 1 { common::END_STREAM } else { 0 };
            frames.extend_from_slice(&frame(common::DATA, end, id, chunk));
        }
    }
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&frames).await;
        wr
    });
    // The oldest request is answered; some newer ones are refused, none is reset otherwise.
    let mut answered = Vec::new();
    let mut refused = Vec::new();
    while answered.len() + refused.len() < ids.len() {
        let f = tokio::time::timeout(WAIT, common::read_frame(&mut rd))
            .await
            .expect("in time")
            .expect("the connection stays");
        match f.0 {
            common::HEADERS if f.1 & common::END_STREAM != 0 => answered.push(f.2),
            common::RST_STREAM => {
                assert_eq!(
                    u32::from_be_bytes(f.3[..4].try_into().unwrap()),
                    REFUSED_STREAM
                );
                refused.push(f.2);
            }
            common::GOAWAY => panic!("{f:?}"),
            _ => {}
        }
    }
    assert!(
        answered.contains(&1),
        "answered {answered:?}, refused {refused:?}"
    );
    assert!(!refused.is_empty() && !refused.contains(&1));
    drop(writer);
    drop(conn);
}

#[tokio::test]
async fn over_the_total_bound_a_hog_is_held_back_and_others_are_served() {
    let cfg = Arc::new(grpc_wire::Config {
        max_conn_buffer: 64 << 20,
        max_total_buffer: 8 << 20,
        ..grpc_wire::Config::default()
    });
    // A hog: answers it does not read.
    let (mut hog, _hog_conn) = common::connect_shared(cfg.clone(), None);
    let mut out = common::preface();
    out.extend_from_slice(&frame(WINDOW_UPDATE, 0, 0, &0x7fff_0000u32.to_be_bytes()));
    hog.write_all(&out).await.unwrap();
    let (_hog_rd, mut hog_wr) = tokio::io::split(hog);
    let calls = big_calls(1, 100);
    let hog_writer = tokio::spawn(async move {
        let _ = hog_wr.write_all(&calls).await;
        hog_wr
    });
    let held = settled(&cfg).await;
    assert!(
        held <= (8 << 20) + 2 * BIG + grpc_wire::FAIR_SHARE,
        "held {held} bytes"
    );
    // Another client's calls are answered.
    let (mut c, conn) = common::connect_shared(cfg.clone(), None);
    c.write_all(&common::preface()).await.unwrap();
    let msg = common::grpc_message(b"hello");
    for i in 0..10u32 {
        let id = 1 + 2 * i;
        let mut out = frame(common::HEADERS, common::END_HEADERS, id, block::ECHO);
        out.extend_from_slice(&frame(common::DATA, common::END_STREAM, id, &msg));
        c.write_all(&out).await.unwrap();
        let end = |f: &Frame| f.0 == common::HEADERS && f.2 == id && f.1 & common::END_STREAM != 0;
        read_until(&mut c, true, WAIT, end).await.expect("answered");
    }
    assert!(!conn.is_finished());
    drop(hog_writer);
}
