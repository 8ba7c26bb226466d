//! Keepalive and the limits on what a client may do, through raw frames: a quiet client is
//! pinged and dropped when it does not answer; pings too close together are refused as
//! grpc-go's server (etcd's) refuses them, but not the pings that follow a response (grpc-go
//! clients send one after each, to size their windows).

mod common;

use std::time::Duration;

use common::{block, frame, goaway, read_until, Frame};
use tokio::io::AsyncWriteExt;

const ENHANCE_YOUR_CALM: u32 = 0xb;
const WAIT: Duration = Duration::from_secs(5);

fn cfg(interval: Option<Duration>) -> grpc_wire::Config {
    grpc_wire::Config {
        keepalive_interval: interval,
        keepalive_timeout: Duration::from_millis(200),
        ping_min_interval: Duration::from_millis(300),
        ..grpc_wire::Config::default()
    }
}

fn is(kind: u8) -> impl FnMut(&Frame) -> bool {
    move |f| f.0 == kind
}

/// One unary call on `stream`: its request, then frames up to its trailers.
async fn call(c: &mut tokio::io::DuplexStream, stream: u32) {
    let mut out = frame(common::HEADERS, common::END_HEADERS, stream, block::ECHO);
    let msg = common::grpc_message(b"hello");
    out.extend_from_slice(&frame(common::DATA, common::END_STREAM, stream, &msg));
    c.write_all(&out).await.unwrap();
    let end = |f: &Frame| f.0 == common::HEADERS && f.2 == stream && f.1 & common::END_STREAM != 0;
    read_until(c, true, WAIT, end)
        .await
        .expect("the call is answered");
}

#[tokio::test]
async fn a_quiet_client_that_does_not_answer_pings_is_dropped() {
    let (mut c, conn) = common::connect(cfg(Some(Duration::from_millis(200))));
    c.write_all(&common::preface()).await.unwrap();
    let started = tokio::time::Instant::now();
    let ping = read_until(&mut c, false, WAIT, |f| f.0 == common::PING && f.1 == 0)
        .await
        .expect("the server pings a quiet client");
    assert!(started.elapsed() >= Duration::from_millis(150), "{ping:?}");
    // Not answered: the connection ends.
    assert!(read_until(&mut c, false, WAIT, |_| false).await.is_none());
    let ended = tokio::time::timeout(WAIT, conn).await.unwrap().unwrap();
    assert!(
        matches!(ended, Err(grpc_wire::Error::KeepaliveTimeout(_))),
        "{ended:?}"
    );
}

#[tokio::test]
async fn a_client_that_answers_pings_stays() {
    let (mut c, conn) = common::connect(cfg(Some(Duration::from_millis(100))));
    c.write_all(&common::preface()).await.unwrap();
    // Several keepalive rounds, each answered.
    for _ in 0..4 {
        read_until(&mut c, true, WAIT, |f| f.0 == common::PING && f.1 == 0)
            .await
            .expect("a keepalive ping");
    }
    call(&mut c, 1).await;
    assert!(!conn.is_finished());
}

/// The keepalive timer is looked at, not polled, while it holds the connection's waker: a
/// connection woken by many calls must still be pinged once its client goes quiet, and
/// dropped if that ping goes unanswered.
#[tokio::test]
async fn a_client_quiet_after_calls_is_pinged_and_then_dropped() {
    let (mut c, conn) = common::connect(cfg(Some(Duration::from_millis(200))));
    c.write_all(&common::preface()).await.unwrap();
    for stream in (1..40).step_by(2) {
        call(&mut c, stream).await;
    }
    read_until(&mut c, false, WAIT, |f| f.0 == common::PING && f.1 == 0)
        .await
        .expect("the server pings the client gone quiet");
    assert!(read_until(&mut c, false, WAIT, |_| false).await.is_none());
    let ended = tokio::time::timeout(WAIT, conn).await.unwrap().unwrap();
    assert!(
        matches!(ended, Err(grpc_wire::Error::KeepaliveTimeout(_))),
        "{ended:?}"
    );
}

#[tokio::test]
async fn pings_too_close_together_end_the_connection() {
    let (mut c, conn) = common::connect(cfg(None));
    c.write_all(&common::preface()).await.unwrap();
    // No stream open: the first ping is free, the next three are strikes.
    for _ in 0..4 {
        c.write_all(&frame(common::PING, 0, 0, b"12345678"))
            .await
            .unwrap();
    }
    let g = read_until(&mut c, false, WAIT, is(common::GOAWAY))
        .await
        .expect("GOAWAY");
    assert_eq!(goaway(&g), (ENHANCE_YOUR_CALM, "too_many_pings".into()));
    let ended = tokio::time::timeout(WAIT, conn).await.unwrap().unwrap();
    assert!(ended.is_err());
}

#[tokio::test]
async fn a_ping_after_each_response_is_no_strike() {
    let (mut c, conn) = common::connect(cfg(None));
    c.write_all(&common::preface()).await.unwrap();
    for i in 0..10 {
        call(&mut c, 1 + 2 * i).await;
        // grpc-go's BDP ping, right after the response arrived.
        c.write_all(&frame(common::PING, 0, 0, b"bdp-ping"))
            .await
            .unwrap();
        read_until(&mut c, false, WAIT, |f| f.0 == common::PING && f.1 != 0)
            .await
            .expect("the ping is acknowledged");
    }
    assert!(!conn.is_finished());
}
