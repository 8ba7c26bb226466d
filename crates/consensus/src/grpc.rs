//! The peer transport over gRPC (tonic, HTTP/2): kvd's own `proto/kvd/peer.proto`.
//!
//! Sending: one task per peer keeps one long-lived stream open and writes batches — everything
//! queued for that peer since the last write goes in one `Batch`, so a busy leader pipelines
//! many appends per HTTP/2 frame. A broken or refused stream is reopened with exponential
//! backoff; raft is told the peer is unreachable and resends what was lost. Snapshots go in
//! their own call, in 1 MiB chunks that HTTP/2 flow control paces.
//!
//! Receiving: [`PeerService`] checks every stream's cluster id and target member (request
//! metadata) before anything is read; a peer from another cluster is refused with
//! FAILED_PRECONDITION naming both clusters, and the sender records and logs that refusal, so
//! both sides say what is wrong.

use std::collections::HashMap;
use std::io::{self, Read};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use crate::dial::Dialer;
use crate::member::Members;
use crate::node::Inbox;
use crate::transport::{Reporter, SnapshotDone, Transport};

/// Asks the member at `peer_url` for the cluster's id and members (what a joining member
/// needs to learn its own id).
pub async fn fetch_members(dialer: &Dialer, peer_url: &str) -> Result<(u64, Members), String> {
    let ch = dialer
        .connect(peer_url, |e| {
            e.connect_timeout(OPEN_TIMEOUT).timeout(OPEN_TIMEOUT)
        })
        .await?;
    let reply = PeerClient::new(ch)
        .members(MembersRequest {})
        .await
        .map_err(|e| format!("{peer_url}: {}", e.message()))?
        .into_inner();
    let members = Members::new(reply.members.into_iter().map(|m| crate::member::Member {
        id: m.id,
        name: m.name,
        peer_urls: m.peer_urls,
        client_urls: m.client_urls,
        is_learner: m.is_learner,
    }));
    Ok((reply.cluster_id, members))
}

/// The generated protocol code.
#[allow(missing_debug_implementations, clippy::all)]
pub mod pb {
    tonic::include_proto!("kvdpeer");
}

use pb::peer_client::PeerClient;
use pb::peer_server::{Peer, PeerServer};
use pb::{Batch, Hello, MembersReply, MembersRequest, PeerMember, SnapshotChunk};

/// How a peer refuses a removed member (the sender stops on seeing it).
const REMOVED: &str = "the member has been permanently removed from the cluster";
/// The refusal a removed member gets.
fn removed(from: u64, cluster: u64) -> Status {
    Status::failed_precondition(format!(
        "{REMOVED}: member {from:x} was removed from cluster {cluster:x}"
    ))
}

const META_CLUSTER: &str = "kvd-cluster-id";
const META_FROM: &str = "kvd-member-id";
const META_TO: &str = "kvd-to";
/// Messages queued for one peer before raft is told it is unreachable.
const QUEUE: usize = 4096;
/// The most bytes of messages in one batch.
const BATCH_BYTES: usize = 4 << 20;
const CHUNK: usize = 1 << 20;
/// The largest gRPC message either side accepts (a batch, a chunk).
pub const MAX_MESSAGE: usize = 64 << 20;
const OPEN_TIMEOUT: Duration = Duration::from_secs(2);
/// How often a peer's round trip is measured (etcd's prober: 5 s).
const PROBE_INTERVAL: Duration = Duration::from_secs(5);
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

fn request<T>(msg: T, cluster: u64, from: u64, to: u64) -> Request<T> {
    let mut r = Request::new(msg);
    let md = r.metadata_mut();
    for (k, v) in [(META_CLUSTER, cluster), (META_FROM, from), (META_TO, to)] {
        if let Ok(v) = format!("{v:x}").parse() {
            md.insert(k, v);
        }
    }
    r
}

fn meta_id(md: &MetadataMap, key: &str) -> Result<u64, Status> {
    md.get(key)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| u64::from_str_radix(v, 16).ok())
        .ok_or_else(|| Status::invalid_argument(format!("missing or bad {key} header")))
}

/// The receiving side: raft messages from peers into the local node.
#[derive(Clone)]
pub struct PeerService {
    cluster_id: u64,
    id: u64,
    inbox: Inbox,
    members: Option<MembersFn>,
}

/// Where [`PeerService`] reads the member list it tells joining members.
pub type MembersFn = Arc<dyn Fn() -> Members + Send + Sync>;

impl std::fmt::Debug for PeerService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerService")
            .field("cluster_id", &self.cluster_id)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl PeerService {
    pub fn new(cluster_id: u64, id: u64, inbox: Inbox) -> Self {
        PeerService {
            cluster_id,
            id,
            inbox,
            members: None,
        }
    }

    /// Answers `Members` (for joining members) from `members`.
    pub fn with_members(mut self, members: MembersFn) -> Self {
        self.members = Some(members);
        self
    }

    /// The tonic service, to add to a server on the peer listener.
    pub fn into_server(self) -> PeerServer<PeerService> {
        PeerServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE)
    }

    /// Refuses a peer of another cluster, or a request meant for another member.
    fn admit(&self, md: &MetadataMap) -> Result<u64, Status> {
        let cluster = meta_id(md, META_CLUSTER)?;
        let from = meta_id(md, META_FROM)?;
        let to = meta_id(md, META_TO)?;
        if cluster != self.cluster_id {
            tracing::error!(
                peer = %format!("{from:x}"),
                "refused a peer of cluster {cluster:x}: this member is in cluster {:x}",
                self.cluster_id
            );
            return Err(Status::failed_precondition(format!(
                "cluster id mismatch: member {:x} is in cluster {:x}, the sender ({from:x}) in cluster {cluster:x}",
                self.id, self.cluster_id
            )));
        }
        if self.inbox.is_removed(from) {
            return Err(removed(from, self.cluster_id));
        }
        if to != self.id {
            return Err(Status::failed_precondition(format!(
                "member id mismatch: this is member {:x}, the sender ({from:x}) wanted {to:x}",
                self.id
            )));
        }
        Ok(from)
    }

    fn hello(&self) -> Hello {
        Hello {
            cluster_id: self.cluster_id,
            member_id: self.id,
        }
    }
}

type HelloStream = Pin<Box<dyn Stream<Item = Result<Hello, Status>> + Send>>;

#[tonic::async_trait]
impl Peer for PeerService {
    type StreamStream = HelloStream;

    async fn stream(
        &self,
        req: Request<Streaming<Batch>>,
    ) -> Result<Response<HelloStream>, Status> {
        let from = self.admit(req.metadata())?;
        let mut incoming = req.into_inner();
        let (tx, rx) = mpsc::channel(1);
        let _ = tx.send(Ok(self.hello())).await;
        let me = self.clone();
        let received =
            crate::metrics::PEER_RECEIVED_BYTES.with_label_values(&[&crate::metrics::peer(from)]);
        tokio::spawn(async move {
            loop {
                let batch = match incoming.message().await {
                    Ok(Some(b)) => b,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(peer = %format!("{from:x}"), "peer stream ended: {e}");
                        break;
                    }
                };
                if me.inbox.is_removed(from) {
                    let _ = tx.send(Err(removed(from, me.cluster_id))).await;
                    break;
                }
                if batch.cluster_id != me.cluster_id || batch.to != me.id {
                    let _ = tx
                        .send(Err(Status::failed_precondition(
                            "cluster or member id mismatch",
                        )))
                        .await;
                    break;
                }
                let bytes: usize = batch.messages.iter().map(Vec::len).sum();
                received.inc_by(bytes as u64);
                for raw in &batch.messages {
                    match Message::parse_from_bytes(raw) {
                        Ok(m) if m.to == me.id && m.get_msg_type() != MessageType::MsgSnapshot => {
                            if me.inbox.step(m).is_err() {
                                return;
                            }
                        }
                        Ok(m) => tracing::warn!(
                            to = m.to,
                            "peer message not for this member or a bare snapshot; dropped"
                        ),
                        Err(e) => {
                            let _ = tx
                                .send(Err(Status::invalid_argument(format!(
                                    "bad raft message: {e}"
                                ))))
                                .await;
                            return;
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn members(
        &self,
        _req: Request<MembersRequest>,
    ) -> Result<Response<MembersReply>, Status> {
        let Some(f) = &self.members else {
            return Err(Status::unimplemented(
                "this member does not publish its member list",
            ));
        };
        let members = f()
            .iter()
            .map(|m| PeerMember {
                id: m.id,
                name: m.name.clone(),
                peer_urls: m.peer_urls.clone(),
                client_urls: m.client_urls.clone(),
                is_learner: m.is_learner,
            })
            .collect();
        Ok(Response::new(MembersReply {
            cluster_id: self.cluster_id,
            members,
        }))
    }

    async fn probe(&self, req: Request<Hello>) -> Result<Response<Hello>, Status> {
        self.admit(req.metadata())?;
        Ok(Response::new(self.hello()))
    }

    async fn snapshot(
        &self,
        req: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<Hello>, Status> {
        let from = self.admit(req.metadata())?;
        let mut incoming = req.into_inner();
        let first = incoming
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("empty snapshot stream"))?;
        let msg = Message::parse_from_bytes(&first.message)
            .map_err(|e| Status::invalid_argument(format!("bad snapshot message: {e}")))?;
        if msg.get_msg_type() != MessageType::MsgSnapshot || msg.to != self.id {
            return Err(Status::invalid_argument(
                "not a snapshot message for this member",
            ));
        }
        let index = msg.get_snapshot().get_metadata().index;
        tracing::info!(peer = %format!("{from:x}"), index, "receiving a snapshot");
        // The node reads the data on a blocking thread; chunks reach it through a small
        // channel, so a slow disk slows the sender (HTTP/2 flow control) instead of buffering.
        let (tx, rx) = mpsc::channel::<io::Result<Vec<u8>>>(4);
        let inbox = self.inbox.clone();
        let writer = tokio::task::spawn_blocking(move || {
            let mut r = ChunkReader {
                rx,
                cur: Vec::new(),
                pos: 0,
            };
            inbox.receive_snapshot(msg, &mut r)
        });
        if !first.data.is_empty() {
            let _ = tx.send(Ok(first.data)).await;
        }
        loop {
            match incoming.message().await {
                Ok(Some(c)) => {
                    if tx.send(Ok(c.data)).await.is_err() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    // A cut-off transfer must not look complete.
                    let _ = tx.send(Err(io::Error::other(e.to_string()))).await;
                    break;
                }
            }
        }
        drop(tx);
        match writer.await {
            Ok(Ok(())) => Ok(Response::new(self.hello())),
            Ok(Err(e)) => Err(Status::internal(format!("snapshot not saved: {e}"))),
            Err(e) => Err(Status::internal(format!("snapshot not saved: {e}"))),
        }
    }
}

/// Reads chunks from the async side on a blocking thread.
struct ChunkReader {
    rx: mpsc::Receiver<io::Result<Vec<u8>>>,
    cur: Vec<u8>,
    pos: usize,
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.cur.len() {
            match self.rx.blocking_recv() {
                Some(Ok(c)) => {
                    self.cur = c;
                    self.pos = 0;
                }
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len() - self.pos);
        buf[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[derive(Debug)]
struct PeerLink {
    urls: Vec<String>,
    tx: mpsc::Sender<Message>,
    task: JoinHandle<()>,
}

impl Drop for PeerLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Debug, Clone, Copy)]
struct Ident {
    cluster: u64,
    me: u64,
}

/// Since when each peer's stream has been up (a peer leaves it when its stream breaks).
type Active = Arc<Mutex<HashMap<u64, std::time::Instant>>>;

/// The sending side: implements [`Transport`] with one stream per peer.
#[derive(Debug)]
pub struct GrpcTransport {
    ident: Ident,
    dialer: Dialer,
    rt: Handle,
    reporter: Option<Reporter>,
    peers: HashMap<u64, PeerLink>,
    errors: Arc<Mutex<HashMap<u64, String>>>,
    active: Active,
}

impl GrpcTransport {
    /// A transport for member `id` of `cluster_id`, dialing its peers with `dialer` and
    /// running its tasks on `rt`.
    pub fn new(cluster_id: u64, id: u64, dialer: Dialer, rt: Handle) -> Self {
        GrpcTransport {
            ident: Ident {
                cluster: cluster_id,
                me: id,
            },
            dialer,
            rt,
            reporter: None,
            peers: HashMap::new(),
            errors: Arc::new(Mutex::new(HashMap::new())),
            active: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The last error seen with each peer that currently has one (cleared on success).
    pub fn errors(&self) -> Arc<Mutex<HashMap<u64, String>>> {
        self.errors.clone()
    }
}

impl Transport for GrpcTransport {
    fn start(&mut self, reporter: Reporter) {
        self.reporter = Some(reporter);
    }

    fn send(&mut self, msgs: Vec<Message>) {
        for m in msgs {
            let to = m.to;
            let Some(p) = self.peers.get(&to) else {
                tracing::debug!(to, "message to an unknown peer dropped");
                continue;
            };
            if p.tx.try_send(m).is_err() {
                crate::metrics::PEER_SENT_FAILURES
                    .with_label_values(&[&crate::metrics::peer(to)])
                    .inc();
                if let Some(r) = &self.reporter {
                    r.unreachable(to);
                }
            }
        }
    }

    fn send_snapshot(&mut self, msg: Message, data: PathBuf, done: SnapshotDone) {
        let Some(p) = self.peers.get(&msg.to) else {
            return done.finish(false);
        };
        let urls = p.urls.clone();
        let ident = self.ident;
        let dialer = self.dialer.clone();
        let errors = self.errors.clone();
        self.rt.spawn(async move {
            let to = msg.to;
            match send_snapshot(ident, &dialer, &urls, msg, data).await {
                Ok(()) => done.finish(true),
                Err(e) => {
                    tracing::warn!(peer = %format!("{to:x}"), "snapshot not delivered: {e}");
                    errors.lock().insert(to, e);
                    done.finish(false);
                }
            }
        });
    }

    fn active_since(&self, peer: u64) -> Option<std::time::Instant> {
        self.active.lock().get(&peer).copied()
    }

    fn update_members(&mut self, members: &Members) {
        self.peers
            .retain(|id, p| members.get(*id).is_some_and(|m| m.peer_urls == p.urls));
        let Some(reporter) = self.reporter.clone() else {
            return;
        };
        for m in members.iter() {
            if m.id == self.ident.me || self.peers.contains_key(&m.id) || m.peer_urls.is_empty() {
                continue;
            }
            let (tx, rx) = mpsc::channel(QUEUE);
            let task = self.rt.spawn(run_peer(
                (self.ident, self.dialer.clone()),
                m.id,
                m.peer_urls.clone(),
                rx,
                reporter.clone(),
                self.errors.clone(),
                self.active.clone(),
            ));
            self.peers.insert(
                m.id,
                PeerLink {
                    urls: m.peer_urls.clone(),
                    tx,
                    task,
                },
            );
        }
    }
}

async fn connect(
    dialer: &Dialer,
    url: &str,
) -> Result<PeerClient<tonic::transport::Channel>, String> {
    let ch = dialer
        .connect(url, |e| {
            e.connect_timeout(Duration::from_secs(1))
                .http2_keep_alive_interval(Duration::from_secs(5))
                .keep_alive_timeout(Duration::from_secs(5))
        })
        .await?;
    Ok(PeerClient::new(ch)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE))
}

/// Checks the identity a peer answered with.
fn check_hello(ident: Ident, to: u64, url: &str, h: &Hello) -> Result<(), String> {
    if h.cluster_id != ident.cluster || h.member_id != to {
        return Err(format!(
            "peer at {url} is member {:x} of cluster {:x}; expected member {to:x} of cluster {:x}",
            h.member_id, h.cluster_id, ident.cluster
        ));
    }
    Ok(())
}

fn refused(url: &str, s: Status) -> String {
    format!("{url} refused the stream: {}", s.message())
}

/// One peer's sender: connect, stream batches, reconnect with backoff.
async fn run_peer(
    (ident, dialer): (Ident, Dialer),
    to: u64,
    urls: Vec<String>,
    mut rx: mpsc::Receiver<Message>,
    reporter: Reporter,
    errors: Arc<Mutex<HashMap<u64, String>>>,
    active: Active,
) {
    let mut backoff = BACKOFF_MIN;
    let mut attempt = 0usize;
    loop {
        let url = &urls[attempt % urls.len()];
        attempt += 1;
        match stream_to(ident, &dialer, to, url, &mut rx, &errors, &active).await {
            Ok(()) => return, // the node dropped this peer
            Err(e) if e.contains(REMOVED) => {
                tracing::warn!(peer = %format!("{to:x}"), "{e}");
                reporter.removed_by(to);
                return;
            }
            Err(e) => {
                let first = errors.lock().insert(to, e.clone()).as_ref() != Some(&e);
                if first {
                    tracing::warn!(peer = %format!("{to:x}"), "{e}");
                }
                reporter.unreachable(to);
            }
        }
        // What was queued while the link was down is stale; raft resends what matters.
        while rx.try_recv().is_ok() {}
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

async fn stream_to(
    ident: Ident,
    dialer: &Dialer,
    to: u64,
    url: &str,
    rx: &mut mpsc::Receiver<Message>,
    errors: &Mutex<HashMap<u64, String>>,
    active: &Mutex<HashMap<u64, std::time::Instant>>,
) -> Result<(), String> {
    // A peer that accepts connections but never answers must not hold the link forever.
    let open = async {
        let mut client = connect(dialer, url).await?;
        let (btx, brx) = mpsc::channel::<Batch>(16);
        let req = request(ReceiverStream::new(brx), ident.cluster, ident.me, to);
        let mut resp = client
            .stream(req)
            .await
            .map_err(|s| refused(url, s))?
            .into_inner();
        match resp.message().await {
            Ok(Some(h)) => check_hello(ident, to, url, &h)?,
            Ok(None) => return Err(format!("{url} closed the stream")),
            Err(s) => return Err(refused(url, s)),
        }
        Ok((btx, resp))
    };
    let (btx, mut resp) = tokio::time::timeout(OPEN_TIMEOUT, open)
        .await
        .map_err(|_| format!("{url} did not answer within {OPEN_TIMEOUT:?}"))??;
    errors.lock().remove(&to);
    let since = std::time::Instant::now();
    active.lock().insert(to, since);
    let _up = Up { active, to, since };
    let sent = crate::metrics::PEER_SENT_BYTES.with_label_values(&[&crate::metrics::peer(to)]);
    let _prober = Prober(tokio::spawn(probe(
        ident,
        dialer.clone(),
        to,
        url.to_string(),
    )));
    loop {
        tokio::select! {
            m = rx.recv() => {
                let Some(m) = m else { return Ok(()) };
                let mut batch = Batch {
                    cluster_id: ident.cluster,
                    from: ident.me,
                    to,
                    messages: Vec::new(),
                };
                let mut bytes = 0;
                let mut next = Some(m);
                while let Some(m) = next {
                    let b = m.write_to_bytes().map_err(|e| format!("encode: {e}"))?;
                    bytes += b.len();
                    batch.messages.push(b);
                    next = if bytes < BATCH_BYTES { rx.try_recv().ok() } else { None };
                }
                btx.send(batch).await.map_err(|_| format!("stream to {url} closed"))?;
                sent.inc_by(bytes as u64);
            }
            r = resp.message() => {
                return Err(match r {
                    Ok(_) => format!("{url} ended the stream"),
                    Err(s) => refused(url, s),
                });
            }
        }
    }
}

/// Marks a peer's stream down when it ends, however it ends (unless a newer stream to the
/// same peer, after a change of its URLs, is up by then).
struct Up<'a> {
    active: &'a Mutex<HashMap<u64, std::time::Instant>>,
    to: u64,
    since: std::time::Instant,
}

impl Drop for Up<'_> {
    fn drop(&mut self) {
        let mut active = self.active.lock();
        if active.get(&self.to) == Some(&self.since) {
            active.remove(&self.to);
        }
    }
}

/// Stops a peer's prober when its stream ends.
struct Prober(tokio::task::JoinHandle<()>);

impl Drop for Prober {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// etcd's peer prober: every few seconds, the round trip of a small request on a connection of
/// its own, into `etcd_network_peer_round_trip_time_seconds`.
async fn probe(ident: Ident, dialer: Dialer, to: u64, url: String) {
    let rtt = crate::metrics::PEER_RTT.with_label_values(&[&crate::metrics::peer(to)]);
    let mut tick = tokio::time::interval(PROBE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut client = None;
    loop {
        tick.tick().await;
        if client.is_none() {
            client = connect(&dialer, &url).await.ok();
        }
        let Some(c) = client.as_mut() else { continue };
        let t = std::time::Instant::now();
        let req = request(Hello::default(), ident.cluster, ident.me, to);
        match tokio::time::timeout(OPEN_TIMEOUT, c.probe(req)).await {
            Ok(Ok(_)) => rtt.observe(t.elapsed().as_secs_f64()),
            _ => client = None,
        }
    }
}

async fn send_snapshot(
    ident: Ident,
    dialer: &Dialer,
    urls: &[String],
    msg: Message,
    data: PathBuf,
) -> Result<(), String> {
    let to = msg.to;
    // The first of the peer's URLs that takes a connection (as the message stream goes round
    // them): one that is down must not keep a lagging member from ever catching up.
    let mut tried = Err(String::from("no peer URL"));
    for url in urls {
        tried = connect(dialer, url).await.map(|c| (url, c));
        if tried.is_ok() {
            break;
        }
    }
    let (url, mut client) = tried?;
    let encoded = msg.write_to_bytes().map_err(|e| format!("encode: {e}"))?;
    let (tx, rx) = mpsc::channel::<SnapshotChunk>(4);
    let reader = tokio::task::spawn_blocking(move || -> io::Result<u64> {
        let mut f = std::fs::File::open(&data)?;
        let mut first = Some(encoded);
        let mut total = 0;
        loop {
            let mut buf = vec![0; CHUNK];
            let mut n = 0;
            while n < CHUNK {
                let k = f.read(&mut buf[n..])?;
                if k == 0 {
                    break;
                }
                n += k;
            }
            buf.truncate(n);
            total += n as u64;
            let last = n < CHUNK;
            let chunk = SnapshotChunk {
                cluster_id: ident.cluster,
                from: ident.me,
                to,
                message: first.take().unwrap_or_default(),
                data: buf,
            };
            if tx.blocking_send(chunk).is_err() || last {
                return Ok(total);
            }
        }
    });
    let req = request(ReceiverStream::new(rx), ident.cluster, ident.me, to);
    let resp = client.snapshot(req).await.map_err(|s| refused(url, s))?;
    check_hello(ident, to, url, resp.get_ref())?;
    let bytes = reader
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("reading the snapshot: {e}"))?;
    tracing::info!(peer = %format!("{to:x}"), bytes, "snapshot sent");
    Ok(())
}
