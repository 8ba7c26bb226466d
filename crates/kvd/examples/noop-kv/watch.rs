//! The no-op's Watch: the floor under a server's watch fan-out. A put's event is encoded once
//! and put in every open stream's inbox; the stream's watchers take turns, each handed, in one
//! response, every event of its range it has not had (events gather for a watcher while the
//! client is slow, as in a growing item of kvd's queue), written from the shared encodings as
//! kvd's Watch service writes them (`rpc::watch::wire`). Nothing is stored: no revision
//! history, no index, no catching up, no auth. A watcher gets the events put after it was
//! created whose keys are in its range; every other option of a create request (start
//! revision, filters, previous values, progress, fragmenting) is ignored.
//!
//! Delivery follows kvd's policy (`rpc::watch`): a stream's responses wait in a buffer of 16
//! toward the client, and a response that found the buffer full holds the stream's next one
//! back 10 ms (`NOOP_WATCH_HOLD_MS`), so that a client falling behind gets fewer, larger
//! responses (without the hold the no-op sends about 4 events a response under etcd's
//! `benchmark watch`, and reaches less than half the events/s).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use api::etcdserverpb::watch_request::RequestUnion;
use api::etcdserverpb::{ResponseHeader, WatchRequest, WatchResponse};
use api::mvccpb::{Event, KeyValue};
use bytes::{BufMut, Bytes};
use parking_lot::Mutex;
use prost::encoding::{encode_key, encode_varint, WireType};
use prost::Message;
use tokio::sync::{mpsc, Notify};
use tokio_stream::StreamExt;
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic::codegen::{http, Body, BoxFuture, StdError};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Request, Response, Status, Streaming};

const PATH: &str = "/etcdserverpb.Watch/Watch";
/// The field number of `events` in `etcdserverpb.WatchResponse`.
const EVENTS_FIELD: u32 = 11;
/// Responses buffered toward one client (kvd's `OUT_BUFFER`).
const OUT_BUFFER: usize = 16;
/// What every header carries but the revision (a real server's ids and term).
const CLUSTER_ID: u64 = 0x1c4a_f3b2_6e5d_7a19;
const MEMBER_ID: u64 = 0x8e9e_05c5_2164_694d;
const RAFT_TERM: u64 = 2;

/// The store's revision and every open stream's inbox.
#[derive(Debug)]
pub(crate) struct Hub {
    rev: AtomicI64,
    streams: Mutex<Vec<Arc<Inbox>>>,
    /// How many streams are open: a put with none takes no lock (the put1 floor's puts).
    open: AtomicUsize,
    /// Responses with events sent, and the events in them (printed when the no-op ends).
    responses: AtomicU64,
    events: AtomicU64,
    hold: Duration,
}

/// A stream's events not yet handed to its watchers: each put's key and its event's encoding.
#[derive(Debug, Default)]
struct Inbox {
    events: Mutex<Vec<(Bytes, Bytes)>>,
    notify: Notify,
}

impl Hub {
    pub(crate) fn new() -> Hub {
        let hold_ms = std::env::var("NOOP_WATCH_HOLD_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10);
        Hub {
            rev: AtomicI64::new(1),
            streams: Mutex::new(Vec::new()),
            open: AtomicUsize::new(0),
            responses: AtomicU64::new(0),
            events: AtomicU64::new(0),
            hold: Duration::from_millis(hold_ms),
        }
    }

    pub(crate) fn rev(&self) -> i64 {
        self.rev.load(Ordering::Relaxed)
    }

    /// A put: its revision, and its event in every stream's inbox (in revision order: both
    /// under the streams' lock).
    pub(crate) fn put(&self, key: Vec<u8>, value: Vec<u8>) -> i64 {
        if self.open.load(Ordering::Relaxed) == 0 {
            return self.rev.fetch_add(1, Ordering::Relaxed) + 1;
        }
        let streams = self.streams.lock();
        let rev = self.rev.fetch_add(1, Ordering::Relaxed) + 1;
        if streams.is_empty() {
            return rev;
        }
        let kv = KeyValue {
            key,
            create_revision: rev,
            mod_revision: rev,
            version: 1,
            value,
            lease: 0,
        };
        let event = Event {
            kv: Some(kv),
            ..Default::default()
        };
        let encoded = Bytes::from(event.encode_to_vec());
        let key = Bytes::from(event.kv.map(|kv| kv.key).unwrap_or_default());
        for s in streams.iter() {
            s.events.lock().push((key.clone(), encoded.clone()));
            s.notify.notify_one();
        }
        rev
    }

    /// What the no-op's watchers were sent.
    pub(crate) fn summary(&self) -> String {
        let (r, e) = (
            self.responses.load(Ordering::Relaxed),
            self.events.load(Ordering::Relaxed),
        );
        format!("noop-kv watch: {e} events in {r} responses")
    }

    fn header(&self) -> ResponseHeader {
        ResponseHeader {
            cluster_id: CLUSTER_ID,
            member_id: MEMBER_ID,
            revision: self.rev(),
            raft_term: RAFT_TERM,
        }
    }
}

/// A watcher: its id on its stream, its range (etcd's conventions: an empty end is the key
/// alone, `"\0"` every key from `key` on), and the place in its stream's log of the first
/// event it has not been handed.
struct Watcher {
    id: i64,
    key: Vec<u8>,
    end: Vec<u8>,
    pos: u64,
}

impl Watcher {
    fn wants(&self, key: &[u8]) -> bool {
        match self.end.as_slice() {
            [] => key == self.key,
            [0] => key >= self.key.as_slice(),
            end => key >= self.key.as_slice() && key < end,
        }
    }
}

/// One response on its way: every field but the events, encoded, and the events' encodings.
#[derive(Debug)]
pub(crate) struct Out {
    head: Vec<u8>,
    events: Vec<Bytes>,
}

impl Out {
    fn plain(r: &WatchResponse) -> Out {
        Out {
            head: r.encode_to_vec(),
            events: Vec::new(),
        }
    }
}

type Sender = mpsc::Sender<Result<Out, Status>>;

/// A stream's watchers and the events not yet handed to all of them (`log[0]` is event number
/// `base` of the stream).
#[derive(Default)]
struct Stream {
    inbox: Arc<Inbox>,
    log: VecDeque<(Bytes, Bytes)>,
    base: u64,
    watchers: Vec<Watcher>,
    /// The watcher whose turn is next: they take turns, as the items of kvd's queue do.
    turn: usize,
    next_id: i64,
}

impl Stream {
    /// The inbox's events moved to the log; the number of the next event to come.
    fn end(&mut self) -> u64 {
        self.log.extend(self.inbox.events.lock().drain(..));
        self.base + self.log.len() as u64
    }

    fn behind(&mut self) -> bool {
        let end = self.end();
        if self.watchers.is_empty() {
            // Nobody to hand them to: the log keeps nothing.
            self.trim();
        }
        self.watchers.iter().any(|w| w.pos < end)
    }

    /// The response of the next watcher behind: every event in its range it has not been
    /// handed, up to now (events gather for a watcher while the client is slow, as they gather
    /// in a growing item of kvd's queue).
    fn next_response(&mut self, hub: &Hub) -> Option<Out> {
        let end = self.end();
        for _ in 0..self.watchers.len() {
            if self.turn >= self.watchers.len() {
                self.turn = 0;
                self.trim();
            }
            let w = &mut self.watchers[self.turn];
            self.turn += 1;
            if w.pos >= end {
                continue;
            }
            let from = usize::try_from(w.pos - self.base).unwrap_or(usize::MAX);
            w.pos = end;
            let events: Vec<Bytes> = (self.log.range(from..))
                .filter(|(k, _)| w.wants(k))
                .map(|(_, e)| e.clone())
                .collect();
            if events.is_empty() {
                continue;
            }
            let head = WatchResponse {
                header: Some(hub.header()),
                watch_id: w.id,
                ..Default::default()
            };
            hub.responses.fetch_add(1, Ordering::Relaxed);
            hub.events.fetch_add(events.len() as u64, Ordering::Relaxed);
            return Some(Out {
                head: head.encode_to_vec(),
                events,
            });
        }
        None
    }

    /// Lets go of the events every watcher has been handed.
    fn trim(&mut self) {
        let end = self.base + self.log.len() as u64;
        let low = self.watchers.iter().map(|w| w.pos).min().unwrap_or(end);
        let n = usize::try_from(low - self.base).unwrap_or(usize::MAX);
        self.log.drain(..n.min(self.log.len()));
        self.base = low;
    }

    /// Answers a create or cancel request with its response.
    fn answer(&mut self, hub: &Hub, req: WatchRequest) -> Option<Out> {
        let mut resp = WatchResponse {
            header: Some(hub.header()),
            ..Default::default()
        };
        match req.request_union {
            Some(RequestUnion::CreateRequest(c)) => {
                resp.watch_id = self.next_id;
                resp.created = true;
                let pos = self.end();
                self.watchers.push(Watcher {
                    id: self.next_id,
                    key: c.key,
                    end: c.range_end,
                    pos,
                });
                self.next_id += 1;
            }
            Some(RequestUnion::CancelRequest(c)) => {
                self.watchers.retain(|w| w.id != c.watch_id);
                resp.watch_id = c.watch_id;
                resp.canceled = true;
            }
            _ => return None,
        }
        Some(Out::plain(&resp))
    }
}

/// Sends `out`: whether it waited for room, or `None` when the client is gone.
async fn send(tx: &Sender, out: Out) -> Option<bool> {
    match tx.try_send(Ok(out)) {
        Ok(()) => Some(false),
        Err(mpsc::error::TrySendError::Full(out)) => tx.send(out).await.ok().map(|()| true),
        Err(mpsc::error::TrySendError::Closed(_)) => None,
    }
}

/// Serves one Watch stream until the client drops it.
async fn serve(hub: Arc<Hub>, mut input: Streaming<WatchRequest>, tx: Sender) {
    let mut st = Stream::default();
    let inbox = st.inbox.clone();
    hub.streams.lock().push(inbox.clone());
    hub.open.fetch_add(1, Ordering::Relaxed);
    let mut reading = true;
    loop {
        let behind = st.behind();
        tokio::select! {
            r = input.next(), if reading => match r {
                Some(Ok(req)) => {
                    let answered = st.answer(&hub, req);
                    if let Some(out) = answered {
                        if send(&tx, out).await.is_none() {
                            break;
                        }
                    }
                }
                // The client closed its side: its watchers go on.
                None => reading = false,
                Some(Err(_)) => break,
            },
            () = inbox.notify.notified(), if !behind => {}
            () = std::future::ready(()), if behind => {
                let Some(out) = st.next_response(&hub) else { continue };
                match send(&tx, out).await {
                    None => break,
                    Some(true) if !hub.hold.is_zero() => tokio::time::sleep(hub.hold).await,
                    Some(_) => {}
                }
            }
            () = tx.closed() => break,
        }
    }
    hub.streams.lock().retain(|s| !Arc::ptr_eq(s, &inbox));
    hub.open.fetch_sub(1, Ordering::Relaxed);
}

/// Requests decode as prost decodes them; a response is its head and then each event as field
/// 11 (the bytes prost writes for the same `WatchResponse`).
#[derive(Debug, Default, Clone, Copy)]
struct WatchCodec;

impl Codec for WatchCodec {
    type Encode = Out;
    type Decode = WatchRequest;
    type Encoder = WatchCodec;
    type Decoder = tonic_prost::ProstDecoder<WatchRequest>;

    fn encoder(&mut self) -> WatchCodec {
        WatchCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        Default::default()
    }
}

impl Encoder for WatchCodec {
    type Item = Out;
    type Error = Status;

    fn encode(&mut self, item: Out, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item.head);
        for e in &item.events {
            encode_key(EVENTS_FIELD, WireType::LengthDelimited, dst);
            encode_varint(e.len() as u64, dst);
            dst.put_slice(e);
        }
        Ok(())
    }
}

/// The `etcdserverpb.Watch` service; every other path is UNIMPLEMENTED.
#[derive(Debug, Clone)]
pub(crate) struct WatchServer(pub(crate) Arc<Hub>);

impl NamedService for WatchServer {
    const NAME: &'static str = "etcdserverpb.Watch";
}

impl<B> tower_service::Service<http::Request<B>> for WatchServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != PATH {
            return Box::pin(async { Ok(Status::unimplemented("noop").into_http()) });
        }
        let hub = self.0.clone();
        Box::pin(async move { Ok(Grpc::new(WatchCodec).streaming(Method(hub), req).await) })
    }
}

struct Method(Arc<Hub>);

type OutStream = tokio_stream::wrappers::ReceiverStream<Result<Out, Status>>;

impl StreamingService<WatchRequest> for Method {
    type Response = Out;
    type ResponseStream = OutStream;
    type Future = BoxFuture<Response<OutStream>, Status>;

    fn call(&mut self, req: Request<Streaming<WatchRequest>>) -> Self::Future {
        let (tx, rx) = mpsc::channel(OUT_BUFFER);
        tokio::spawn(serve(self.0.clone(), req.into_inner(), tx));
        Box::pin(async move { Ok(Response::new(OutStream::new(rx))) })
    }
}
