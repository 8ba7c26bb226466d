//! `etcdserverpb.Watch`: one mvcc watch stream per gRPC stream, with etcd's server-side
//! behaviour (created/cancelled responses, compaction cancels, progress requests and periodic
//! progress notifications, fragmenting of large responses). `wire` serves it, writing each
//! event's encoding once for every watcher it goes to.

mod wire;

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use api::etcdserverpb::watch_request::RequestUnion;
use api::etcdserverpb::{WatchRequest, WatchResponse};
use ids::Revision;
use mvcc::WatchStream;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{Checks, Creds, Need};
use crate::server::Core;
use wire::Outgoing;
pub(crate) use wire::WatchServer;

/// Responses buffered toward one client before the stream waits for it. Small, so that a
/// client falling behind is seen soon (see `HOLD`): 16 gave 2.1–2.4× the events/s of 128 under
/// etcd's `benchmark watch` (docs/measurements.md).
const OUT_BUFFER: usize = 16;
/// How long a stream whose client fell behind (a response found its buffer full) holds its
/// next responses back, so that its watchers' next revisions gather in them: fewer, larger
/// responses for a client that cannot keep up, as etcd's slow watchers ("victims"), retried
/// every 10 ms, get. A client that keeps up is never held.
const HOLD: Duration = Duration::from_millis(10);
/// etcd's `--experimental-watch-progress-notify-interval` default.
pub const PROGRESS_NOTIFY_INTERVAL: Duration = Duration::from_secs(600);
/// How soon a progress request not yet answerable (a watcher still catching up) is retried.
const PROGRESS_RETRY: Duration = Duration::from_millis(100);
/// The metadata key of clientv3's `WithRequireLeader` (its value "true").
const REQUIRE_LEADER: &str = "hasleader";
/// Checks without a leader, an election timeout apart, before a stream that requires a leader
/// ends (etcd's `maxNoLeaderCnt`).
const NO_LEADER_CHECKS: u32 = 3;

/// The Watch service.
#[derive(Debug, Clone)]
pub struct WatchService {
    core: Arc<Core>,
}

impl WatchService {
    pub fn new(core: Arc<Core>) -> Self {
        WatchService { core }
    }
}

/// Per-stream options of the watchers, by watch id.
#[derive(Debug, Default)]
struct Opts {
    progress: HashSet<i64>,
    fragment: HashSet<i64>,
    /// A stream-wide progress request waiting for its watchers to catch up.
    progress_pending: bool,
}

type Out = mpsc::Sender<Result<Outgoing, Status>>;

struct StreamState {
    core: Arc<Core>,
    /// Who the stream is from: each watcher created is checked against it.
    creds: Creds,
    ws: WatchStream,
    opts: Mutex<Opts>,
    /// Set when a response had to wait for room in the client's buffer.
    waited: AtomicBool,
}

impl StreamState {
    async fn send(&self, out: &Out, r: impl Into<Outgoing>, rev: Revision) -> bool {
        let mut r = r.into();
        r.head.header = Some(self.core.header(rev));
        match out.try_send(Ok(r)) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(r)) => {
                self.waited.store(true, Ordering::Relaxed);
                out.send(r).await.is_ok()
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// Handles one client request; false when the client is gone.
    async fn handle(&self, req: WatchRequest, out: &Out) -> bool {
        let rev = self.ws.rev();
        match req.request_union {
            Some(RequestUnion::CreateRequest(c)) => {
                if let Err(s) = self.permitted(&c).await {
                    // etcd's refusal: a created-and-canceled response with grpc-go's text.
                    let resp = WatchResponse {
                        watch_id: -1,
                        created: true,
                        canceled: true,
                        cancel_reason: format!(
                            "rpc error: code = {:?} desc = {}",
                            s.code(),
                            s.message()
                        ),
                        ..Default::default()
                    };
                    return self.send(out, resp, rev).await;
                }
                let r = self.ws.watch(&c);
                let mut resp = WatchResponse {
                    created: true,
                    ..Default::default()
                };
                match r {
                    Ok(id) => {
                        let mut o = self.opts.lock();
                        if c.progress_notify {
                            o.progress.insert(id);
                        }
                        if c.fragment {
                            o.fragment.insert(id);
                        }
                        resp.watch_id = id;
                    }
                    Err(e) => {
                        resp.watch_id = -1;
                        resp.canceled = true;
                        resp.cancel_reason = e.to_string();
                    }
                }
                self.send(out, resp, rev).await
            }
            Some(RequestUnion::CancelRequest(c)) => {
                if self.ws.cancel(c.watch_id).is_err() {
                    return true;
                }
                {
                    let mut o = self.opts.lock();
                    o.progress.remove(&c.watch_id);
                    o.fragment.remove(&c.watch_id);
                }
                let resp = WatchResponse {
                    watch_id: c.watch_id,
                    canceled: true,
                    ..Default::default()
                };
                self.send(out, resp, rev).await
            }
            Some(RequestUnion::ProgressRequest(_)) => {
                if !self.ws.request_progress_all() {
                    self.opts.lock().progress_pending = true;
                }
                true
            }
            None => true,
        }
    }

    /// Whether the stream's caller may read what watcher `c` would see.
    async fn permitted(&self, c: &api::etcdserverpb::WatchCreateRequest) -> Result<(), Status> {
        let who = self.core.identify(&self.creds).await?;
        // As etcd: an empty key is the smallest one.
        let key: &[u8] = if c.key.is_empty() { &[0] } else { &c.key };
        self.core
            .permitted(who.as_ref(), |chk| chk.need(Need::Read, key, &c.range_end))
    }

    /// Sends one mvcc response, fragmented when the watcher asked and it is large.
    async fn forward(&self, r: mvcc::WatchResponse, out: &Out) -> bool {
        let resp = Outgoing {
            head: WatchResponse {
                watch_id: r.watch_id,
                compact_revision: r.compact_revision.0,
                canceled: r.compact_revision.0 != 0,
                ..Default::default()
            },
            events: r.events,
        };
        if resp.head.canceled {
            let mut o = self.opts.lock();
            o.progress.remove(&r.watch_id);
            o.fragment.remove(&r.watch_id);
        }
        let limit = self.core.cfg.max_request_bytes;
        let fragment = self.opts.lock().fragment.contains(&r.watch_id);
        if !fragment || resp.events.len() < 2 || resp.encoded_len() <= limit {
            return self.send(out, resp, r.revision).await;
        }
        // etcd's fragmenting: as many events as fit the limit per response (at least one),
        // every response but the last marked `fragment`.
        let mut events = resp.events.into_iter().peekable();
        while events.peek().is_some() {
            let mut part = WatchResponse {
                watch_id: r.watch_id,
                ..Default::default()
            };
            let mut size = 0;
            while let Some(ev) = events.peek() {
                let n = prost::Message::encoded_len(ev);
                if !part.events.is_empty() && size + n > limit {
                    break;
                }
                size += n;
                part.events.extend(events.next());
            }
            part.fragment = events.peek().is_some();
            if !self.send(out, part, r.revision).await {
                return false;
            }
        }
        true
    }

    /// A stream-wide progress request waits for its watchers to catch up.
    fn progress_pending(&self) -> bool {
        self.opts.lock().progress_pending
    }

    /// Periodic and deferred progress notifications.
    fn progress_tick(&self, periodic: bool) {
        let mut o = self.opts.lock();
        if o.progress_pending && self.ws.request_progress_all() {
            o.progress_pending = false;
        }
        if periodic {
            for &id in &o.progress {
                self.ws.request_progress(id);
            }
        }
    }
}

pub(crate) type WatchOut = Pin<Box<dyn Stream<Item = Result<Outgoing, Status>> + Send>>;

impl WatchService {
    /// A gRPC Watch call.
    fn watch(&self, req: Request<Streaming<WatchRequest>>) -> Result<Response<WatchOut>, Status> {
        let creds = Creds::of(&req);
        // clientv3's WithRequireLeader (Kubernetes watches with it): refused without a
        // leader, and ended when the member loses its leader for long.
        let require_leader = req
            .metadata()
            .get(REQUIRE_LEADER)
            .is_some_and(|v| v == "true");
        if require_leader {
            self.core.leader()?;
        }
        Ok(Response::new(self.open(
            req.into_inner(),
            creds,
            require_leader,
        )))
    }
}

impl WatchService {
    /// Serves one watch stream whose requests come from `input` (a gRPC stream, or the JSON
    /// gateway's). As etcd, the stream goes on after the client closes its side, until the
    /// client drops the responses.
    ///
    /// With `require_leader`, as etcd's stream interceptor: once the member has had no leader
    /// at [`NO_LEADER_CHECKS`] checks an election timeout apart, the stream ends with etcd's
    /// "no leader", so that the client watches again through another member.
    pub(crate) fn open<S>(&self, mut input: S, creds: Creds, require_leader: bool) -> WatchOut
    where
        S: Stream<Item = Result<WatchRequest, Status>> + Send + Unpin + 'static,
    {
        let (tx, rx) = mpsc::channel(OUT_BUFFER);
        let store = self.core.backend.store();
        let mut generation = self.core.backend.generation();
        generation.mark_unchanged();
        let st = Arc::new(StreamState {
            core: self.core.clone(),
            creds,
            ws: store.watch_stream(),
            opts: Mutex::new(Opts::default()),
            waited: AtomicBool::new(false),
        });
        let interval = self.core.cfg.watch_progress_notify_interval;
        let election = self.core.cfg.election_timeout;
        tokio::spawn(async move {
            let mut periodic = tokio::time::interval(interval);
            periodic.tick().await;
            let mut leader_check = tokio::time::interval(election);
            leader_check.tick().await;
            let mut leaderless = 0;
            // Ticks only while a progress request waits (thousands of streams must not wake
            // ten times a second each for nothing).
            let mut retry = tokio::time::interval(PROGRESS_RETRY);
            retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut sending = true;
            // Made once, not at every pass of the loop: each registers with what it waits on.
            let closed = tx.closed();
            tokio::pin!(closed);
            let replaced = generation.changed();
            tokio::pin!(replaced);
            // Responses held back while the client catches up (see `HOLD`).
            let hold = tokio::time::sleep(Duration::ZERO);
            tokio::pin!(hold);
            let mut holding = false;
            loop {
                tokio::select! {
                    r = input.next(), if sending => match r {
                        Some(Ok(req)) => {
                            if !st.handle(req, &tx).await {
                                return;
                            }
                        }
                        // The client closed its side: its watchers go on.
                        None => sending = false,
                        // The connection failed.
                        Some(Err(_)) => return,
                    },
                    () = &mut closed => return,
                    () = &mut hold, if holding => holding = false,
                    r = st.ws.recv(), if !holding => match r {
                        Some(r) => {
                            if !st.forward(r, &tx).await {
                                return;
                            }
                            if st.waited.swap(false, Ordering::Relaxed) {
                                hold.as_mut().reset(tokio::time::Instant::now() + HOLD);
                                holding = true;
                            }
                        }
                        None => {
                            let _ = tx.send(Err(Status::unavailable("etcdserver: server stopped"))).await;
                            return;
                        }
                    },
                    _ = leader_check.tick(), if require_leader => {
                        match st.core.leader() {
                            Ok(_) => leaderless = 0,
                            Err(no_leader) => {
                                leaderless += 1;
                                if leaderless >= NO_LEADER_CHECKS {
                                    let _ = tx.send(Err(no_leader)).await;
                                    return;
                                }
                            }
                        }
                    }
                    _ = periodic.tick() => st.progress_tick(true),
                    _ = retry.tick(), if st.progress_pending() => st.progress_tick(false),
                    _ = &mut replaced => {
                        // The store was replaced by a snapshot from the leader: the client
                        // watches again from its last revision, on the new store.
                        let _ = tx.send(Err(Status::unavailable(
                            "etcdserver: the member restored a snapshot; watch again",
                        ))).await;
                        return;
                    }
                }
            }
        });
        Box::pin(ReceiverStream::new(rx))
    }
}
