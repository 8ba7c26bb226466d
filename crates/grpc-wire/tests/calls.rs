//! grpc-wire against a real gRPC client (tonic's, over hyper's HTTP/2 client): unary calls
//! answered by the connection, calls bridged to a tonic service (unary and bidi streaming),
//! flow control with messages larger than the windows, errors, deadlines, cancellation,
//! graceful shutdown and protocol errors.
//!
//! The test API is etcd's KV and Watch (from the `api` crate): Range and Put are answered by
//! the connection (`TestCalls`), Compact and Watch by a tonic service (`Bridged`).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use api::etcdserverpb::kv_client::KvClient;
use api::etcdserverpb::kv_server::{Kv, KvServer};
use api::etcdserverpb::watch_client::WatchClient;
use api::etcdserverpb::watch_server::{Watch, WatchServer};
use api::etcdserverpb::*;
use api::mvccpb::KeyValue;
use bytes::Bytes;
use prost::Message;
use tokio::io::AsyncWriteExt;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};

const LIMIT: usize = 4 << 20;

/// Counts the handler futures alive, to see calls being dropped.
#[derive(Debug, Default)]
struct Alive(AtomicUsize);

struct Guard(Arc<Alive>);

impl Guard {
    fn new(a: &Arc<Alive>) -> Guard {
        a.0.fetch_add(1, Ordering::SeqCst);
        Guard(a.clone())
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Range: `limit` bytes of value under the asked key (or "error", "hang", "slow");
/// Put: the value's length as the revision.
#[derive(Debug)]
struct TestCalls {
    alive: Arc<Alive>,
}

impl grpc_wire::Unary for TestCalls {
    fn route(&self, path: &[u8]) -> Option<usize> {
        match path {
            b"/etcdserverpb.KV/Range" => Some(0),
            b"/etcdserverpb.KV/Put" => Some(1),
            _ => None,
        }
    }

    fn call(
        &self,
        id: usize,
        msg: Bytes,
        _head: grpc_wire::CallHead<'_>,
    ) -> grpc_wire::UnaryFuture {
        let guard = Guard::new(&self.alive);
        Box::pin(async move {
            let _guard = guard;
            let out = if id == 0 {
                let r = RangeRequest::decode(msg).map_err(|e| Status::internal(e.to_string()))?;
                match r.key.as_slice() {
                    b"error" => {
                        return Err(Status::with_details(
                            Code::NotFound,
                            "étcd: kéy not found (100%)",
                            Bytes::from_static(b"\x01\x02details"),
                        ))
                    }
                    b"hang" => std::future::pending().await,
                    b"slow" => tokio::time::sleep(Duration::from_millis(300)).await,
                    b"panic" => panic!("a handler bug"),
                    _ => {}
                }
                RangeResponse {
                    count: r.limit,
                    kvs: vec![KeyValue {
                        key: r.key,
                        value: vec![b'v'; r.limit as usize],
                        ..Default::default()
                    }],
                    ..Default::default()
                }
                .encode_to_vec()
            } else {
                let r = PutRequest::decode(msg).map_err(|e| Status::internal(e.to_string()))?;
                PutResponse {
                    header: Some(ResponseHeader {
                        revision: r.value.len() as i64,
                        ..Default::default()
                    }),
                    ..Default::default()
                }
                .encode_to_vec()
            };
            Ok(Bytes::from(out))
        })
    }
}

/// What tonic serves: Compact (revision echoed) and Watch (one response per request, or
/// `watch_id` responses of 10 KiB each for a create request with that many).
#[derive(Debug, Clone)]
struct Bridged {
    alive: Arc<Alive>,
}

#[tonic::async_trait]
impl Kv for Bridged {
    async fn range(&self, _: Request<RangeRequest>) -> Result<Response<RangeResponse>, Status> {
        Err(Status::unimplemented("answered by the connection"))
    }
    type RangeStreamStream = tonic::codegen::BoxStream<RangeStreamResponse>;
    async fn range_stream(
        &self,
        _: Request<RangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        Err(Status::unimplemented("not served"))
    }
    async fn put(&self, _: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        Err(Status::unimplemented("answered by the connection"))
    }
    async fn delete_range(
        &self,
        _: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        Err(Status::permission_denied("bridged error"))
    }
    async fn txn(&self, _: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        Err(Status::unimplemented(""))
    }
    async fn compact(
        &self,
        r: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        Ok(Response::new(CompactionResponse {
            header: Some(ResponseHeader {
                revision: r.into_inner().revision,
                ..Default::default()
            }),
        }))
    }
}

type WatchStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<WatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Watch for Bridged {
    type WatchStream = WatchStream;

    async fn watch(
        &self,
        req: Request<tonic::Streaming<WatchRequest>>,
    ) -> Result<Response<WatchStream>, Status> {
        let mut inbound = req.into_inner();
        let guard = Guard::new(&self.alive);
        let out = async_stream(move |tx| async move {
            let _guard = guard;
            while let Some(Ok(r)) = inbound.next().await {
                let n = match r.request_union {
                    Some(watch_request::RequestUnion::CreateRequest(c)) => c.watch_id.max(1),
                    _ => 1,
                };
                for i in 0..n {
                    let resp = WatchResponse {
                        watch_id: i,
                        cancel_reason: "x".repeat(if n > 1 { 10 * 1024 } else { 0 }),
                        ..Default::default()
                    };
                    if tx.send(Ok(resp)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(out))
    }
}

use tokio_stream::StreamExt;

/// A stream fed by a task: what the task sends, in order.
fn async_stream<F, Fut>(f: F) -> WatchStream
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<WatchResponse, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(f(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// A grpc-wire server on a free loopback port.
struct Server {
    url: String,
    alive: Arc<Alive>,
    shutdown: tokio::sync::watch::Sender<bool>,
    /// What each connection's `serve` returned.
    ended: tokio::sync::mpsc::UnboundedReceiver<Result<(), grpc_wire::Error>>,
}

async fn server() -> Server {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let alive = Arc::new(Alive::default());
    let unary: Arc<dyn grpc_wire::Unary> = Arc::new(TestCalls {
        alive: alive.clone(),
    });
    let bridged = Bridged {
        alive: alive.clone(),
    };
    let routes = tonic::service::Routes::new(KvServer::new(bridged.clone()))
        .add_service(WatchServer::new(bridged))
        .into_axum_router();
    let cfg = Arc::new(grpc_wire::Config {
        max_recv_message: LIMIT,
        ..grpc_wire::Config::default()
    });
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let (ended_tx, ended) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (mut sock, _) = l.accept().await.unwrap();
            let (unary, cfg, routes, stop, ended_tx) = (
                unary.clone(),
                cfg.clone(),
                routes.clone(),
                stop.clone(),
                ended_tx.clone(),
            );
            tokio::spawn(async move {
                let (p, first) = grpc_wire::sniff(&mut sock).await.unwrap();
                assert_eq!(p, grpc_wire::Protocol::Http2);
                let mut stop = stop;
                let stopped = async move {
                    let _ = stop.wait_for(|s| *s).await;
                };
                let r = grpc_wire::serve(
                    sock,
                    &first,
                    cfg,
                    unary,
                    routes,
                    Default::default(),
                    stopped,
                )
                .await;
                let _ = ended_tx.send(r);
            });
        }
    });
    Server {
        url,
        alive,
        shutdown: stop_tx,
        ended,
    }
}

fn channel(url: &str) -> Channel {
    Endpoint::from_shared(url.to_string())
        .unwrap()
        .connect_lazy()
}

fn kv(url: &str) -> KvClient<Channel> {
    KvClient::new(channel(url))
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20)
}

async fn range(c: &mut KvClient<Channel>, key: &str, limit: i64) -> Result<RangeResponse, Status> {
    c.range(RangeRequest {
        key: key.into(),
        limit,
        ..Default::default()
    })
    .await
    .map(Response::into_inner)
}

/// `f`, or a failure if it takes a minute: a stalled connection must fail the test, not hang it.
async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("stalled: no progress within a minute")
}

async fn wait_alive(s: &Server, n: usize) {
    for _ in 0..200 {
        if s.alive.0.load(Ordering::SeqCst) == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "{} handler futures alive, expected {n}",
        s.alive.0.load(Ordering::SeqCst)
    );
}

/// 400 calls at once, 40 MB of responses through the client's 5 MB connection window: the
/// output fills while the peer's window updates wait unread (a stall this test found).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_unary_calls_at_once_on_one_connection() {
    let s = server().await;
    let c = kv(&s.url);
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..400i64 {
        let mut c = c.clone();
        calls.spawn(async move {
            // Sizes from nothing to well past the 64 KiB windows a client starts with.
            let size = (i * 997) % 200_000;
            let r = range(&mut c, &format!("k{i}"), size).await.unwrap();
            assert_eq!(r.count, size);
            assert_eq!(r.kvs[0].key, format!("k{i}").into_bytes());
            assert_eq!(r.kvs[0].value.len() as i64, size);
        });
    }
    within(async {
        while let Some(r) = calls.join_next().await {
            r.unwrap();
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_both_ways() {
    let s = server().await;
    let mut c = kv(&s.url);
    let value = vec![7u8; 3 << 20];
    let r = within(c.put(PutRequest {
        key: b"big".to_vec(),
        value,
        ..Default::default()
    }))
    .await
    .unwrap()
    .into_inner();
    assert_eq!(r.header.unwrap().revision, 3 << 20);
    let r = within(range(&mut c, "big", 5 << 20)).await.unwrap();
    assert_eq!(r.kvs[0].value.len(), 5 << 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_request_gets_grpc_gos_words_and_the_connection_goes_on() {
    let s = server().await;
    let mut c = kv(&s.url);
    let req = PutRequest {
        key: b"k".to_vec(),
        value: vec![1u8; LIMIT + 10],
        ..Default::default()
    };
    let len = req.encoded_len();
    let e = c.put(req).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert_eq!(
        e.message(),
        format!("grpc: received message larger than max ({len} vs. {LIMIT})")
    );
    assert_eq!(range(&mut c, "after", 3).await.unwrap().count, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_keep_their_code_message_and_details() {
    let s = server().await;
    let mut c = kv(&s.url);
    let e = range(&mut c, "error", 0).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert_eq!(e.message(), "étcd: kéy not found (100%)");
    assert_eq!(e.details(), b"\x01\x02details");
    // Bridged: tonic's own error response (trailers only).
    let e = c
        .delete_range(DeleteRangeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (Code::PermissionDenied, "bridged error")
    );
    // A handler that panics fails its own call only.
    let e = range(&mut c, "panic", 0).await.unwrap_err();
    assert_eq!(e.code(), Code::Internal);
    assert_eq!(range(&mut c, "after", 2).await.unwrap().count, 2);
}

/// The server's own deadline: a raw HTTP/2 client (tonic's would time the call out itself
/// and race the answer) sends `grpc-timeout` and waits for the server's trailers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_ends_a_call_and_drops_it() {
    let s = server().await;
    let addr = s.url.trim_start_matches("http://").to_string();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let req = http::Request::post(format!("{}/etcdserverpb.KV/Range", s.url))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", "200m")
        .body(())
        .unwrap();
    let (resp, mut body) = client.send_request(req, false).unwrap();
    let msg = RangeRequest {
        key: b"hang".to_vec(),
        ..Default::default()
    }
    .encode_to_vec();
    let mut framed = vec![0, 0, 0, 0, msg.len() as u8];
    framed.extend_from_slice(&msg);
    body.send_data(framed.into(), true).unwrap();
    let started = std::time::Instant::now();
    let resp = resp.await.unwrap();
    // A trailers-only answer: the status is in the response head.
    let h = resp.headers();
    assert_eq!(h["grpc-status"], "4", "{h:?}");
    assert_eq!(h["grpc-message"], "context%20deadline%20exceeded");
    assert!(started.elapsed() >= Duration::from_millis(150));
    wait_alive(&s, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_the_client_gives_up_is_dropped_and_the_connection_goes_on() {
    let s = server().await;
    let c = kv(&s.url);
    let mut c2 = c.clone();
    let call = tokio::spawn(async move { range(&mut c2, "hang", 0).await });
    wait_alive(&s, 1).await;
    // Dropping the call resets its stream.
    call.abort();
    wait_alive(&s, 0).await;
    let mut c = c;
    assert_eq!(range(&mut c, "next", 5).await.unwrap().count, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bridged_unary_and_bidi_streaming_calls() {
    let s = server().await;
    let mut c = kv(&s.url);
    let r = c
        .compact(CompactionRequest {
            revision: 42,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.header.unwrap().revision, 42);

    let mut w = WatchClient::new(channel(&s.url));
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let mut inbound = w
        .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    // One answer per request, in order, while the request stream stays open.
    for _ in 0..50 {
        tx.send(WatchRequest::default()).await.unwrap();
        let r = inbound.message().await.unwrap().unwrap();
        assert_eq!(r.watch_id, 0);
    }
    // A burst far larger than every window and buffer, read slowly: all of it, in order.
    let burst = 2_000;
    tx.send(WatchRequest {
        request_union: Some(watch_request::RequestUnion::CreateRequest(
            WatchCreateRequest {
                watch_id: burst,
                ..Default::default()
            },
        )),
    })
    .await
    .unwrap();
    for i in 0..burst {
        if i % 500 == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let r = within(inbound.message()).await.unwrap().unwrap();
        assert_eq!(r.watch_id, i);
        assert_eq!(r.cancel_reason.len(), 10 * 1024);
    }
    // Closing the request stream ends the response stream.
    drop(tx);
    assert!(inbound.message().await.unwrap().is_none());
    wait_alive(&s, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_the_client_drops_stops_its_task() {
    let s = server().await;
    let mut w = WatchClient::new(channel(&s.url));
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let mut inbound = w
        .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    tx.send(WatchRequest::default()).await.unwrap();
    inbound.message().await.unwrap().unwrap();
    wait_alive(&s, 1).await;
    drop(inbound);
    drop(tx);
    wait_alive(&s, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_the_calls_under_way_then_ends_the_connection() {
    let mut s = server().await;
    let mut c = kv(&s.url);
    assert_eq!(range(&mut c, "warm", 1).await.unwrap().count, 1);
    let mut c2 = c.clone();
    let slow = tokio::spawn(async move { range(&mut c2, "slow", 7).await });
    wait_alive(&s, 1).await;
    s.shutdown.send(true).unwrap();
    assert_eq!(slow.await.unwrap().unwrap().count, 7);
    let ended = tokio::time::timeout(Duration::from_secs(5), s.ended.recv())
        .await
        .expect("the connection ends")
        .unwrap();
    assert!(ended.is_ok(), "{ended:?}");
}

/// Raw frames: what a broken client gets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protocol_error_ends_the_connection_with_goaway() {
    let mut s = server().await;
    let addr = s.url.trim_start_matches("http://").to_string();
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut out = common::preface();
    out.extend_from_slice(&common::frame(common::DATA, 0, 0, b"x"));
    sock.write_all(&out).await.unwrap();
    let wait = Duration::from_secs(5);
    let g = common::read_until(&mut sock, false, wait, |f| f.0 == common::GOAWAY)
        .await
        .expect("GOAWAY");
    assert_eq!(common::goaway(&g).0, grpc_wire::Reason::PROTOCOL_ERROR.0);
    assert!(
        common::read_until(&mut sock, false, wait, |_| false)
            .await
            .is_none(),
        "the server closes the connection"
    );
    let ended = s.ended.recv().await.unwrap();
    assert!(
        matches!(ended, Err(grpc_wire::Error::Protocol { reason, .. }) if reason == grpc_wire::Reason::PROTOCOL_ERROR),
        "{ended:?}"
    );
}
