//! Frames that do no work, through raw frames: resets of streams under way (the "rapid
//! reset" attack), floods of empty DATA and CONTINUATION frames, of SETTINGS, of header
//! blocks of empty fields. A client sending them faster than its budget allows is sent away
//! with GOAWAY(ENHANCE_YOUR_CALM); pairing each reset with a completed call does not reset
//! the budget, nor does reconnecting from the same address; an honest client never meets it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{block, frame, goaway, read_until, Frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

const ENHANCE_YOUR_CALM: u32 = 0xb;
const WAIT: Duration = Duration::from_secs(10);

fn is(kind: u8) -> impl FnMut(&Frame) -> bool {
    move |f| f.0 == kind
}

fn calls_on(stream: u32, n: u32) -> Vec<u8> {
    let msg = common::grpc_message(b"hello");
    let mut out = Vec::new();
    for i in 0..n {
        let id = stream + 2 * i;
        out.extend_from_slice(&frame(
            common::HEADERS,
            common::END_HEADERS,
            id,
            block::ECHO,
        ));
        out.extend_from_slice(&frame(common::DATA, common::END_STREAM, id, &msg));
    }
    out
}

/// `n` unary calls from stream id `stream` on, then frames up to the last one's trailers.
async fn calls(c: &mut DuplexStream, stream: u32, n: u32) {
    c.write_all(&calls_on(stream, n)).await.unwrap();
    let last = stream + 2 * (n - 1);
    let end = |f: &Frame| f.0 == common::HEADERS && f.2 == last && f.1 & common::END_STREAM != 0;
    read_until(c, true, WAIT, end)
        .await
        .expect("the calls are answered");
}

/// A stream opened (its message never comes) and reset at once.
fn opened_and_reset(id: u32) -> Vec<u8> {
    let mut out = frame(common::HEADERS, common::END_HEADERS, id, block::ECHO);
    out.extend_from_slice(&frame(common::RST_STREAM, 0, id, &8u32.to_be_bytes()));
    out
}

/// Reads up to the GOAWAY and the connection's end; the GOAWAY's code and text.
async fn sent_away(
    c: &mut DuplexStream,
    conn: tokio::task::JoinHandle<Result<(), grpc_wire::Error>>,
) -> (u32, String) {
    let g = read_until(c, false, WAIT, is(common::GOAWAY))
        .await
        .expect("GOAWAY");
    let ended = tokio::time::timeout(WAIT, conn).await.unwrap().unwrap();
    assert!(ended.is_err());
    goaway(&g)
}

/// Drains what the server sends, so that it never stops reading for want of a reader.
fn drain(
    c: DuplexStream,
) -> (
    tokio::io::WriteHalf<DuplexStream>,
    tokio::task::JoinHandle<Vec<Frame>>,
) {
    let (mut rd, wr) = tokio::io::split(c);
    let reader = tokio::spawn(async move {
        let mut goaways = Vec::new();
        while let Some(f) = common::read_frame(&mut rd).await {
            if f.0 == common::GOAWAY {
                goaways.push(f);
            }
        }
        goaways
    });
    (wr, reader)
}

#[tokio::test]
async fn a_client_resetting_stream_after_stream_is_sent_away() {
    let (mut c, conn) = common::connect(grpc_wire::Config::default());
    c.write_all(&common::preface()).await.unwrap();
    let out: Vec<u8> = (0..1100u32)
        .flat_map(|i| opened_and_reset(1 + 2 * i))
        .collect();
    // The server may stop reading once it has sent GOAWAY.
    let _ = c.write_all(&out).await;
    assert_eq!(
        sent_away(&mut c, conn).await,
        (ENHANCE_YOUR_CALM, "too_many_resets".into())
    );
}

#[tokio::test]
async fn resets_paired_with_completed_calls_are_still_sent_away() {
    let (mut c, conn) = common::connect(grpc_wire::Config::default());
    c.write_all(&common::preface()).await.unwrap();
    // Each reset follows a completed call: never more than one reset under way, but each
    // still costs more than a call forgives.
    for i in 0..1500u32 {
        if conn.is_finished() {
            break;
        }
        let mut out = calls_on(1 + 4 * i, 1);
        out.extend_from_slice(&opened_and_reset(3 + 4 * i));
        if c.write_all(&out).await.is_err() {
            break;
        }
    }
    assert_eq!(
        sent_away(&mut c, conn).await,
        (ENHANCE_YOUR_CALM, "too_many_resets".into())
    );
}

/// The preface, and all the window a connection may have for the answers (tens of
/// thousands of calls would spend the default 64 KiB).
fn preface_and_window() -> Vec<u8> {
    let mut out = common::preface();
    out.extend_from_slice(&frame(0x8, 0, 0, &0x7fff_0000u32.to_be_bytes()));
    out
}

/// clientv3's KeepAliveOnce cancels its stream once answered, every time: resets of streams
/// whose answer has begun are no waste, however many.
#[tokio::test]
async fn cancelling_calls_once_answered_is_not_sent_away() {
    let (mut c, conn) = common::connect(grpc_wire::Config::default());
    // A small window: each answer of a MiB stops after its head and first KiB, unfinished.
    let mut start = common::preface_with(&[(0x4, 1024)]);
    start.extend_from_slice(&frame(0x8, 0, 0, &0x7fff_0000u32.to_be_bytes()));
    c.write_all(&start).await.unwrap();
    let msg = common::grpc_message(b"big");
    let mut id = 1;
    for _ in 0..1500u32 {
        let mut out = frame(common::HEADERS, common::END_HEADERS, id, block::BIG);
        out.extend_from_slice(&frame(common::DATA, common::END_STREAM, id, &msg));
        c.write_all(&out).await.unwrap();
        let head = |f: &Frame| f.0 == common::HEADERS && f.2 == id;
        read_until(&mut c, true, WAIT, head)
            .await
            .expect("the answer begins");
        c.write_all(&frame(common::RST_STREAM, 0, id, &8u32.to_be_bytes()))
            .await
            .unwrap();
        id += 2;
    }
    // Still served.
    calls(&mut c, id, 1).await;
    drop(c);
    let _ = tokio::time::timeout(WAIT, conn).await;
}

#[tokio::test]
async fn resets_among_many_completed_calls_are_forgiven() {
    let (mut c, conn) = common::connect(grpc_wire::Config::default());
    c.write_all(&preface_and_window()).await.unwrap();
    // 1,500 resets (more than the burst allowed), each after the 16 calls that forgive it.
    let mut id = 1;
    for _ in 0..1500u32 {
        calls(&mut c, id, 16).await;
        c.write_all(&opened_and_reset(id + 32)).await.unwrap();
        id += 34;
    }
    calls(&mut c, id, 1).await;
    assert!(!conn.is_finished());
}

#[tokio::test]
async fn reconnecting_does_not_refill_an_addresses_budget() {
    let cfg = Arc::new(grpc_wire::Config::default());
    // 900 resets a connection, under each connection's budget: the address's runs out.
    let mut verdict = None;
    for _ in 0..10 {
        let (mut c, conn) = common::connect_shared(cfg.clone(), Some("192.0.2.7:4000"));
        c.write_all(&common::preface()).await.unwrap();
        let out: Vec<u8> = (0..900u32)
            .flat_map(|i| opened_and_reset(1 + 2 * i))
            .collect();
        let _ = c.write_all(&out).await;
        // A call shows the resets were all handled (or the GOAWAY comes first).
        let _ = c.write_all(&calls_on(1801, 1)).await;
        let last = |f: &Frame| f.0 == common::GOAWAY || (f.0 == common::HEADERS && f.2 == 1801);
        let f = read_until(&mut c, true, WAIT, last)
            .await
            .expect("an answer");
        if f.0 == common::GOAWAY {
            verdict = Some(goaway(&f));
            break;
        }
        drop(c);
        let _ = tokio::time::timeout(WAIT, conn).await;
    }
    assert_eq!(verdict, Some((ENHANCE_YOUR_CALM, "too_many_resets".into())));
    // Another address is not held to it.
    let (mut c, conn) = common::connect_shared(cfg.clone(), Some("192.0.2.8:4000"));
    c.write_all(&common::preface()).await.unwrap();
    let out: Vec<u8> = (0..900u32)
        .flat_map(|i| opened_and_reset(1 + 2 * i))
        .collect();
    c.write_all(&out).await.unwrap();
    calls(&mut c, 1801, 1).await;
    assert!(!conn.is_finished());
    assert!(cfg
        .guard
        .stats()
        .sent_away
        .contains(&("ENHANCE_YOUR_CALM", 1)));
}

/// Floods `unit` (after `start`) until the server sends GOAWAY; its code and text.
async fn flood(start: Vec<u8>, unit: Vec<u8>) -> (u32, String) {
    let (c, conn) = common::connect(grpc_wire::Config::default());
    let (mut wr, reader) = drain(c);
    wr.write_all(&common::preface()).await.unwrap();
    wr.write_all(&start).await.unwrap();
    let batch = unit.repeat(256);
    for _ in 0..100_000 {
        if conn.is_finished() || wr.write_all(&batch).await.is_err() {
            break;
        }
    }
    let ended = tokio::time::timeout(WAIT, conn).await.unwrap().unwrap();
    assert!(ended.is_err(), "the flood was not stopped");
    drop(wr);
    let goaways = tokio::time::timeout(WAIT, reader).await.unwrap().unwrap();
    goaway(goaways.last().expect("a GOAWAY"))
}

#[tokio::test]
async fn a_flood_of_empty_data_frames_is_sent_away() {
    let open = frame(common::HEADERS, common::END_HEADERS, 1, block::ECHO);
    let empty = frame(common::DATA, 0, 1, &[]);
    assert_eq!(
        flood(open, empty).await,
        (ENHANCE_YOUR_CALM, "too_many_empty_frames".into())
    );
}

#[tokio::test]
async fn a_flood_of_empty_continuation_frames_is_sent_away() {
    // A header block that never ends.
    let open = frame(common::HEADERS, 0, 1, block::ECHO);
    let empty = frame(0x9, 0, 1, &[]);
    assert_eq!(
        flood(open, empty).await,
        (ENHANCE_YOUR_CALM, "too_many_empty_frames".into())
    );
}

#[tokio::test]
async fn a_flood_of_settings_is_sent_away() {
    let settings = frame(common::SETTINGS, 0, 0, &[]);
    assert_eq!(
        flood(Vec::new(), settings).await,
        (ENHANCE_YOUR_CALM, "too_many_settings".into())
    );
}

#[tokio::test]
async fn streams_of_empty_header_fields_are_sent_away() {
    // 1,200 literal fields with an empty name and value each (malformed, so each stream is
    // reset too), on stream after stream.
    let mut fields = block::ECHO.to_vec();
    for _ in 0..1200 {
        fields.extend_from_slice(&[0x00, 0x00, 0x00]);
    }
    let (c, conn) = common::connect(grpc_wire::Config::default());
    let (mut wr, reader) = drain(c);
    wr.write_all(&common::preface()).await.unwrap();
    for i in 0..10_000u32 {
        let f = frame(
            common::HEADERS,
            common::END_HEADERS | common::END_STREAM,
            1 + 2 * i,
            &fields,
        );
        if conn.is_finished() || wr.write_all(&f).await.is_err() {
            break;
        }
    }
    let ended = tokio::time::timeout(WAIT, conn).await.unwrap().unwrap();
    assert!(ended.is_err());
    drop(wr);
    let goaways = tokio::time::timeout(WAIT, reader).await.unwrap().unwrap();
    assert_eq!(
        goaway(goaways.last().expect("a GOAWAY")),
        (ENHANCE_YOUR_CALM, "too_many_empty_header_fields".into())
    );
}

#[tokio::test]
async fn an_honest_clients_calls_never_spend_the_budget() {
    let (mut c, conn) = common::connect(grpc_wire::Config::default());
    c.write_all(&preface_and_window()).await.unwrap();
    // 20,000 calls, each ending its request with an empty DATA frame carrying END_STREAM
    // (as grpc-go does when a client closes its side), a few cancelled.
    let msg = common::grpc_message(b"hello");
    let mut id = 1;
    for round in 0..200u32 {
        let mut out = Vec::new();
        for _ in 0..100 {
            out.extend_from_slice(&frame(
                common::HEADERS,
                common::END_HEADERS,
                id,
                block::ECHO,
            ));
            out.extend_from_slice(&frame(common::DATA, 0, id, &msg));
            out.extend_from_slice(&frame(common::DATA, common::END_STREAM, id, &[]));
            id += 2;
        }
        if round % 10 == 0 {
            out.extend_from_slice(&opened_and_reset(id));
            id += 2;
        }
        c.write_all(&out).await.unwrap();
        let last = id - if round % 10 == 0 { 4 } else { 2 };
        let end =
            |f: &Frame| f.0 == common::HEADERS && f.2 == last && f.1 & common::END_STREAM != 0;
        read_until(&mut c, true, WAIT, end).await.expect("answered");
    }
    assert!(!conn.is_finished());
    let mut rest = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_millis(100), c.read(&mut rest))
            .await
            .is_err(),
        "nothing more (no GOAWAY) is sent"
    );
}
