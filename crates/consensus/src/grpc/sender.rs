//! The sending side: the [`Transport`] that keeps one long-lived stream per peer and writes
//! batches to it, reconnecting with backoff.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use protobuf::Message as _;
use raft::eraftpb::Message;
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

use super::direct::{self, Direct, Published, Slot};
use super::framed::{self, Ended};
use super::pb::Batch;
use super::probe::{probe, Prober};
use super::snapshot::send_snapshot;
use super::wire::{check_hello, connect, refused, request, Ident, OPEN_TIMEOUT, REMOVED};
use crate::dial::{Conn, Dialer};
use crate::idmap::IdMap;
use crate::member::Members;
use crate::transport::{Reporter, SnapshotDone, Transport};
use ids::{ClusterId, MemberId};

/// Messages queued for one peer before raft is told it is unreachable.
pub(super) const QUEUE: usize = 4096;
/// The most bytes of messages in one batch.
pub(super) const BATCH_BYTES: usize = 4 << 20;
pub(super) const BACKOFF_MIN: Duration = Duration::from_millis(50);
pub(super) const BACKOFF_MAX: Duration = Duration::from_secs(2);

#[derive(Debug)]
pub(super) struct PeerLink {
    pub(super) urls: Vec<String>,
    pub(super) tx: mpsc::Sender<Message>,
    /// The link's stream while it is framed over plain TCP: written here, not through `tx`.
    pub(super) direct: Slot,
    pub(super) task: JoinHandle<()>,
}

impl Drop for PeerLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Since when each peer's stream has been up (a peer leaves it when its stream breaks).
pub(super) type Active = Arc<Mutex<IdMap<MemberId, std::time::Instant>>>;

/// The sending side: implements [`Transport`] with one stream per peer.
#[derive(Debug)]
pub struct GrpcTransport {
    pub(super) ident: Ident,
    pub(super) dialer: Dialer,
    pub(super) rt: Handle,
    pub(super) reporter: Option<Reporter>,
    pub(super) peers: IdMap<MemberId, PeerLink>,
    pub(super) errors: Arc<Mutex<HashMap<MemberId, String>>>,
    pub(super) active: Active,
}

impl GrpcTransport {
    /// Sends `msgs`, in order, to peer `to`.
    fn send_to(&self, to: MemberId, msgs: Vec<Message>) {
        let Some(p) = self.peers.get(&to) else {
            tracing::debug!(%to, "message to an unknown peer dropped");
            return;
        };
        let direct = p.direct.lock().clone();
        let sent = match direct {
            Some(d) => d.send(&msgs),
            // Messages past a full queue are dropped; raft resends.
            None => msgs.into_iter().all(|m| p.tx.try_send(m).is_ok()),
        };
        if !sent {
            crate::metrics::PEER_SENT_FAILURES
                .with_label_values(&[&crate::metrics::peer(to)])
                .inc();
            if let Some(r) = &self.reporter {
                r.unreachable(to);
            }
        }
    }

    /// A transport for member `id` of `cluster_id`, dialing its peers with `dialer` and
    /// running its tasks on `rt`.
    pub fn new(id: MemberId, cluster_id: ClusterId, dialer: Dialer, rt: Handle) -> Self {
        GrpcTransport {
            ident: Ident {
                cluster: cluster_id,
                me: id,
            },
            dialer,
            rt,
            reporter: None,
            peers: IdMap::default(),
            errors: Arc::new(Mutex::new(HashMap::new())),
            active: Arc::new(Mutex::new(IdMap::default())),
        }
    }

    /// The last error seen with each peer that currently has one (cleared on success).
    pub fn errors(&self) -> Arc<Mutex<HashMap<MemberId, String>>> {
        self.errors.clone()
    }
}

impl Transport for GrpcTransport {
    fn start(&mut self, reporter: Reporter) {
        self.reporter = Some(reporter);
    }

    fn send(&mut self, msgs: Vec<Message>) {
        // Each peer's messages in order, in one write where its stream is direct. All for one
        // peer (a follower's, for its leader) go as they are.
        let Some(first) = msgs.first().map(|m| m.to) else {
            return;
        };
        if msgs.iter().all(|m| m.to == first) {
            return self.send_to(MemberId(first), msgs);
        }
        let mut by_peer: Vec<(MemberId, Vec<Message>)> = Vec::new();
        for m in msgs {
            let to = MemberId(m.to);
            match by_peer.iter_mut().find(|(id, _)| *id == to) {
                Some((_, v)) => v.push(m),
                None => by_peer.push((to, vec![m])),
            }
        }
        for (to, msgs) in by_peer {
            self.send_to(to, msgs);
        }
    }

    fn send_snapshot(&mut self, msg: Message, data: PathBuf, done: SnapshotDone) {
        let Some(p) = self.peers.get(&MemberId(msg.to)) else {
            return done.finish(false);
        };
        let urls = p.urls.clone();
        let ident = self.ident;
        let dialer = self.dialer.clone();
        let errors = self.errors.clone();
        self.rt.spawn(async move {
            let to = MemberId(msg.to);
            match send_snapshot(ident, &dialer, &urls, msg, data).await {
                Ok(()) => done.finish(true),
                Err(e) => {
                    tracing::warn!(peer = %to, "snapshot not delivered: {e}");
                    errors.lock().insert(to, e);
                    done.finish(false);
                }
            }
        });
    }

    fn active_since(&self, peer: MemberId) -> Option<std::time::Instant> {
        self.active.lock().get(&peer).copied()
    }

    fn sends_inline(&self) -> bool {
        (self.peers.values()).all(|p| p.direct.lock().is_some())
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
            let direct = Slot::default();
            let peer = PeerTask {
                ident: self.ident,
                dialer: self.dialer.clone(),
                to: m.id,
                urls: m.peer_urls.clone(),
                reporter: reporter.clone(),
                errors: self.errors.clone(),
                active: self.active.clone(),
                direct: direct.clone(),
            };
            let task = self.rt.spawn(run_peer(peer, rx));
            self.peers.insert(
                m.id,
                PeerLink {
                    urls: m.peer_urls.clone(),
                    tx,
                    direct,
                    task,
                },
            );
        }
    }
}

/// What one peer's sending task works with.
pub(super) struct PeerTask {
    pub(super) ident: Ident,
    pub(super) dialer: Dialer,
    pub(super) to: MemberId,
    pub(super) urls: Vec<String>,
    pub(super) reporter: Reporter,
    pub(super) errors: Arc<Mutex<HashMap<MemberId, String>>>,
    pub(super) active: Active,
    /// Where its stream is published while it is direct.
    pub(super) direct: Slot,
}

/// One peer's sender: connect, stream batches, reconnect with backoff.
pub(super) async fn run_peer(peer: PeerTask, mut rx: mpsc::Receiver<Message>) {
    let PeerTask {
        ident,
        dialer,
        to,
        urls,
        reporter,
        errors,
        active,
        direct,
    } = peer;
    let mut backoff = BACKOFF_MIN;
    let mut attempt = 0usize;
    loop {
        let url = &urls[attempt % urls.len()];
        attempt += 1;
        let link = LinkTo {
            ident,
            dialer: &dialer,
            to,
            url,
            errors: &errors,
            active: &active,
            direct: &direct,
        };
        match link.stream(&mut rx).await {
            Ok(()) => return, // the node dropped this peer
            Err(e) if e.contains(REMOVED) => {
                tracing::warn!(peer = %to, "{e}");
                reporter.removed_by(to);
                return;
            }
            Err(e) => {
                let first = errors.lock().insert(to, e.clone()).as_ref() != Some(&e);
                if first {
                    tracing::warn!(peer = %to, "{e}");
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

/// One attempt at a link to peer `to` at `url`.
struct LinkTo<'a> {
    ident: Ident,
    dialer: &'a Dialer,
    to: MemberId,
    url: &'a str,
    errors: &'a Mutex<HashMap<MemberId, String>>,
    active: &'a Mutex<IdMap<MemberId, std::time::Instant>>,
    direct: &'a Slot,
}

/// What holds while a peer's stream is up: it counts as active (etcd's `ActiveSince`), its
/// error is cleared, its round trip is probed; `sent` counts the bytes sent to it.
struct Opened<'a> {
    _up: Up<'a>,
    _prober: Prober,
    sent: prometheus::IntCounter,
}

impl<'a> LinkTo<'a> {
    /// The framed stream, or the gRPC stream where the peer does not speak it, until the node
    /// drops the link (`Ok`) or the stream fails.
    async fn stream(&self, rx: &mut mpsc::Receiver<Message>) -> Result<(), String> {
        match framed::open(self.ident, self.dialer, self.to, self.url).await {
            Ok(Conn::Plain(tcp)) => {
                let up = self.opened("framed");
                let d = Arc::new(Direct::new(tcp.into_tcp(), up.sent.clone()));
                // What was queued before goes first; a message queued while the stream is
                // published may still go after later ones (raft takes messages in any order).
                let mut queued = Vec::new();
                while let Ok(m) = rx.try_recv() {
                    queued.push(m);
                }
                d.send(&queued);
                let _published = Published::new(self.direct, d.clone());
                direct::pump(&d, self.url, rx).await
            }
            Ok(tls) => {
                let up = self.opened("framed");
                framed::pump(tls, self.url, rx, &up.sent).await
            }
            Err(Ended::NotFramed) => self.grpc_stream(rx).await,
            Err(Ended::Failed(e)) => Err(e),
        }
    }

    /// The stream is up (`stream` names its kind, for the log).
    fn opened(&self, stream: &'static str) -> Opened<'a> {
        let (ident, to, url) = (self.ident, self.to, self.url);
        // As etcd's "peer became active", once per link that comes up.
        if self.errors.lock().remove(&to).is_some() || !self.active.lock().contains_key(&to) {
            tracing::info!(peer = %to, %url, stream, "peer became active");
        }
        let since = std::time::Instant::now();
        self.active.lock().insert(to, since);
        Up::gauge(ident.me, to).set(1);
        Opened {
            _up: Up {
                active: self.active,
                me: ident.me,
                to,
                since,
            },
            _prober: Prober(tokio::spawn(probe(
                ident,
                self.dialer.clone(),
                to,
                url.to_string(),
            ))),
            sent: crate::metrics::PEER_SENT_BYTES.with_label_values(&[&crate::metrics::peer(to)]),
        }
    }

    /// The gRPC stream (what members from before the framed stream serve).
    async fn grpc_stream(&self, rx: &mut mpsc::Receiver<Message>) -> Result<(), String> {
        let (ident, dialer, to, url) = (self.ident, self.dialer, self.to, self.url);
        // A peer that accepts connections but never answers must not hold the link forever.
        let open = async {
            let mut client = connect(dialer, url).await?;
            let (btx, brx) = mpsc::channel::<Batch>(16);
            let req = request(ReceiverStream::new(brx), ident, to);
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
        let up = self.opened("grpc");
        let sent = &up.sent;
        loop {
            tokio::select! {
                m = rx.recv() => {
                    let Some(m) = m else { return Ok(()) };
                    let mut batch = Batch {
                        cluster_id: ident.cluster.0,
                        from: ident.me.0,
                        to: to.0,
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
}

/// Marks a peer's stream down when it ends, however it ends (unless a newer stream to the
/// same peer, after a change of its URLs, is up by then).
pub(super) struct Up<'a> {
    pub(super) active: &'a Mutex<IdMap<MemberId, std::time::Instant>>,
    pub(super) me: MemberId,
    pub(super) to: MemberId,
    pub(super) since: std::time::Instant,
}

impl Up<'_> {
    fn gauge(me: MemberId, to: MemberId) -> prometheus::IntGauge {
        crate::metrics::ACTIVE_PEERS
            .with_label_values(&[&crate::metrics::peer(me), &crate::metrics::peer(to)])
    }
}

impl Drop for Up<'_> {
    fn drop(&mut self) {
        let mut active = self.active.lock();
        if active.get(&self.to) == Some(&self.since) {
            active.remove(&self.to);
            Up::gauge(self.me, self.to).set(0);
        }
    }
}
