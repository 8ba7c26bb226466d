//! Watch, coalesced as etcd's proxy does it: the client watchers of one range share one
//! upstream watcher (a *broadcast*), which asks for `prev_kv` and progress notifications and
//! hands each client what it asked for (its filters, `prev_kv` or not, progress or not).
//!
//! - A watcher of the current revision joins the range's broadcast that is under way, from
//!   the revision after the last it delivered (its created response says that revision).
//! - A watcher from revision `r` joins a broadcast that has delivered nothing at or after
//!   `r`; otherwise it gets a broadcast of its own from `r`, which hands its watchers to the
//!   broadcast under way once it has caught up with it (no event missed, none twice: each
//!   client watcher skips what is older than the next revision it expects).
//! - A broadcast remembers the revision after the last event it delivered (not the header's
//!   revision, which may run ahead of the events of a catching-up watcher), and resumes from
//!   there when the upstream stream breaks: the clients see nothing of it.
//!
//! Clients with credentials (auth) share broadcasts only within their own stream: the cluster
//! checks each upstream watcher against the credentials it was made with. Each client stream
//! has a bounded queue; a client that lets it fill is sent away (etcd's proxy does the same
//! after 50 ms), so one slow client never holds the others up.
//!
//! Not served (as etcd's proxy): progress requests (`WatchProgressRequest`) and fragments.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use api::etcdserverpb::watch_create_request::FilterType;
use api::etcdserverpb::watch_request::RequestUnion;
use api::etcdserverpb::*;
use api::mvccpb::event::EventType;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt};
use tonic::Status;

use crate::calls::Calls;
use crate::metrics::Metrics;
use crate::upstream::Creds;
use crate::watchmux::WatchMux;

/// Responses queued per client stream before the client counts as too slow.
const QUEUE: usize = 4096;
/// etcd's error for a watch id a stream uses already.
const DUPLICATE_ID: &str = "mvcc: duplicate watch ID provided on the WatchStream";

/// The Watch service of the proxy.
#[derive(Debug, Clone)]
pub struct WatchProxy {
    calls: Calls,
    shared: Arc<Scope>,
}

/// Where broadcasts are shared: every client without credentials, or one client stream.
#[derive(Debug)]
struct Scope {
    mux: WatchMux,
    up: Arc<crate::upstream::Upstream>,
    ranges: Mutex<HashMap<RangeKey, Arc<Range>>>,
    metrics: Arc<Metrics>,
    next_cast: AtomicU64,
}

/// A watched range: its key and range end.
type RangeKey = (Vec<u8>, Vec<u8>);

/// The broadcasts of one range.
#[derive(Debug, Default)]
struct Range {
    casts: Mutex<HashMap<u64, Cast>>,
}

#[derive(Debug)]
struct Cast {
    /// The revision after the last event delivered (or the start revision asked for; 0:
    /// the current one, not known yet).
    next: i64,
    /// Whether the upstream watcher was created (its created response seen).
    started: bool,
    receivers: Vec<Receiver>,
    task: Option<tokio::task::AbortHandle>,
}

#[derive(Debug)]
struct Receiver {
    stream: Arc<Client>,
    id: i64,
    /// The first revision this watcher expects (0: the current one).
    nextrev: i64,
    prev_kv: bool,
    progress: bool,
    no_put: bool,
    no_delete: bool,
    /// Whether its created response was sent.
    created: bool,
}

/// One client stream: its queue, and whether it was sent away.
#[derive(Debug)]
struct Client {
    out: mpsc::Sender<Result<WatchResponse, Status>>,
    closed: AtomicBool,
}

impl Client {
    fn send(&self, r: WatchResponse) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        if self.out.try_send(Ok(r)).is_err() {
            self.closed.store(true, Ordering::Relaxed);
            let _ = self.out.try_send(Err(Status::unavailable(
                "the proxy's queue for this watch stream is full: the client reads too slowly",
            )));
        }
    }
}

impl WatchProxy {
    pub fn new(calls: Calls) -> WatchProxy {
        let shared = Arc::new(Scope::new(&calls, Creds::default()));
        WatchProxy { calls, shared }
    }

    /// Serves one client stream: its requests in, its responses out.
    pub fn open<S>(
        &self,
        input: S,
        creds: Creds,
    ) -> impl Stream<Item = Result<WatchResponse, Status>>
    where
        S: Stream<Item = Result<WatchRequest, Status>> + Send + Unpin + 'static,
    {
        let (tx, rx) = mpsc::channel(QUEUE);
        let client = Arc::new(Client {
            out: tx,
            closed: AtomicBool::new(false),
        });
        let scope = if creds.is_some() {
            Arc::new(Scope::new(&self.calls, creds))
        } else {
            self.shared.clone()
        };
        tokio::spawn(serve_stream(scope, client, input));
        tokio_stream::wrappers::ReceiverStream::new(rx)
    }
}

impl Scope {
    fn new(calls: &Calls, creds: Creds) -> Scope {
        Scope {
            mux: WatchMux::new(calls.clone(), creds),
            up: calls.up.clone(),
            ranges: Mutex::new(HashMap::new()),
            metrics: calls.metrics.clone(),
            next_cast: AtomicU64::new(1),
        }
    }
}

async fn serve_stream<S>(scope: Arc<Scope>, client: Arc<Client>, mut input: S)
where
    S: Stream<Item = Result<WatchRequest, Status>> + Send + Unpin + 'static,
{
    // This stream's watchers: id → their range.
    let mut mine: HashMap<i64, RangeKey> = HashMap::new();
    let mut next_id = 0i64;
    while let Some(Ok(req)) = input.next().await {
        if client.closed.load(Ordering::Relaxed) {
            break;
        }
        match req.request_union {
            Some(RequestUnion::CreateRequest(c)) => {
                let id = if c.watch_id != 0 {
                    c.watch_id
                } else {
                    while mine.contains_key(&next_id) {
                        next_id += 1;
                    }
                    next_id
                };
                if mine.contains_key(&id) {
                    client.send(WatchResponse {
                        header: Some(ResponseHeader::default()),
                        watch_id: id,
                        created: true,
                        canceled: true,
                        cancel_reason: DUPLICATE_ID.into(),
                        ..Default::default()
                    });
                    continue;
                }
                let range = (c.key.clone(), c.range_end.clone());
                mine.insert(id, range);
                scope.metrics.watchers.inc();
                scope.add(&client, id, c);
            }
            Some(RequestUnion::CancelRequest(c)) => {
                if let Some(range) = mine.remove(&c.watch_id) {
                    scope.metrics.watchers.dec();
                    let header = scope.remove(&range, &client, c.watch_id);
                    client.send(WatchResponse {
                        header: Some(header),
                        watch_id: c.watch_id,
                        canceled: true,
                        ..Default::default()
                    });
                }
            }
            // Progress requests are not served through a proxy (etcd's ignores them too).
            Some(RequestUnion::ProgressRequest(_)) | None => {}
        }
    }
    for (id, range) in mine {
        scope.metrics.watchers.dec();
        scope.remove(&range, &client, id);
    }
}

impl Scope {
    /// Adds client watcher `id` of `client`, as `c` asks.
    fn add(self: &Arc<Self>, client: &Arc<Client>, id: i64, c: WatchCreateRequest) {
        let r = Receiver {
            stream: client.clone(),
            id,
            nextrev: c.start_revision.max(0),
            prev_kv: c.prev_kv,
            progress: c.progress_notify,
            no_put: c.filters.contains(&(FilterType::Noput as i32)),
            no_delete: c.filters.contains(&(FilterType::Nodelete as i32)),
            created: false,
        };
        let key = (c.key.clone(), c.range_end.clone());
        // Held until the watcher is in a broadcast, so that `remove` cannot drop the range
        // from the map meanwhile (the same order as `remove`: the ranges, then the casts).
        let mut ranges = self.ranges.lock();
        let range = ranges.entry(key.clone()).or_default().clone();
        let mut casts = range.casts.lock();
        // A broadcast this watcher can join without missing an event.
        let fit = casts.iter_mut().find(|(_, b)| {
            if r.nextrev == 0 {
                // Under way, or being made from the current revision too.
                (b.started && b.next > 0) || (!b.started && b.next == 0)
            } else {
                b.next != 0 && b.next <= r.nextrev
            }
        });
        if let Some((_, b)) = fit {
            let mut r = r;
            if r.nextrev == 0 {
                r.nextrev = b.next;
            }
            if b.started {
                r.created = true;
                r.stream.send(WatchResponse {
                    header: Some(self.header(b.next - 1)),
                    watch_id: r.id,
                    created: true,
                    ..Default::default()
                });
            }
            b.receivers.push(r);
            return;
        }
        let no = self.next_cast.fetch_add(1, Ordering::Relaxed);
        self.metrics.upstream_watchers.inc();
        let from = r.nextrev;
        casts.insert(
            no,
            Cast {
                next: from,
                started: false,
                receivers: vec![r],
                task: None,
            },
        );
        let task = tokio::spawn(run_cast(self.clone(), range.clone(), key, no, from));
        if let Some(b) = casts.get_mut(&no) {
            b.task = Some(task.abort_handle());
        }
    }

    /// Removes client watcher `id` of `client` from `range`: the header of its last response.
    fn remove(&self, key: &RangeKey, client: &Arc<Client>, id: i64) -> ResponseHeader {
        let mut ranges = self.ranges.lock();
        let Some(range) = ranges.get(key).cloned() else {
            return ResponseHeader::default();
        };
        let mut casts = range.casts.lock();
        let mut header = ResponseHeader::default();
        let mut empty = None;
        for (no, b) in casts.iter_mut() {
            let before = b.receivers.len();
            b.receivers
                .retain(|r| !(r.id == id && Arc::ptr_eq(&r.stream, client)));
            if b.receivers.len() != before {
                header = self.header(b.next - 1);
                if b.receivers.is_empty() {
                    empty = Some(*no);
                }
                break;
            }
        }
        if let Some(no) = empty {
            if let Some(b) = casts.remove(&no) {
                self.metrics.upstream_watchers.dec();
                if let Some(t) = b.task {
                    t.abort();
                }
            }
        }
        if casts.is_empty() {
            drop(casts);
            ranges.remove(key);
        }
        header
    }

    fn header(&self, revision: i64) -> ResponseHeader {
        ResponseHeader {
            revision: revision.max(0),
            ..self.up.header()
        }
    }
}

/// One broadcast: its upstream watcher, made again from where it was when the stream breaks.
async fn run_cast(scope: Arc<Scope>, range: Arc<Range>, key: RangeKey, no: u64, from: i64) {
    let mut from = from;
    loop {
        let req = WatchCreateRequest {
            key: key.0.clone(),
            range_end: key.1.clone(),
            start_revision: from,
            prev_kv: true,
            progress_notify: true,
            ..Default::default()
        };
        let mut w = match scope.mux.watch(req).await {
            Ok(w) => w,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        {
            let mut casts = range.casts.lock();
            let Some(b) = casts.get_mut(&no) else { return };
            let created = &w.created;
            if created.canceled {
                // Refused (a compacted revision, a permission): every watcher is told.
                for r in &b.receivers {
                    r.stream.send(WatchResponse {
                        header: created.header,
                        watch_id: r.id,
                        created: !r.created,
                        canceled: true,
                        compact_revision: created.compact_revision,
                        cancel_reason: created.cancel_reason.clone(),
                        ..Default::default()
                    });
                }
                b.receivers.clear();
                casts.remove(&no);
                scope.metrics.upstream_watchers.dec();
                return;
            }
            if b.next == 0 {
                b.next = created.header.as_ref().map_or(0, |h| h.revision) + 1;
            }
            b.started = true;
            let next = b.next;
            for r in &mut b.receivers {
                if r.nextrev == 0 {
                    r.nextrev = next;
                }
                if !r.created {
                    r.created = true;
                    r.stream.send(WatchResponse {
                        header: created.header.map(|h| ResponseHeader {
                            revision: h.revision.max(next - 1),
                            ..h
                        }),
                        watch_id: r.id,
                        created: true,
                        ..Default::default()
                    });
                }
            }
        }
        while let Some(resp) = w.rx.recv().await {
            let mut casts = range.casts.lock();
            let Some(b) = casts.get_mut(&no) else { return };
            deliver(&scope.metrics, b, &resp);
            if resp.canceled {
                // Compacted while it caught up: its watchers were told.
                b.receivers.clear();
                casts.remove(&no);
                scope.metrics.upstream_watchers.dec();
                return;
            }
            from = b.next;
            if merge(&mut casts, no) {
                scope.metrics.upstream_watchers.dec();
                return;
            }
        }
        // The upstream stream broke: again from the next revision expected.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Hands an upstream response to each watcher of broadcast `b`, as each asked.
fn deliver(metrics: &Metrics, b: &mut Cast, resp: &WatchResponse) {
    let progress = resp.events.is_empty() && resp.compact_revision == 0 && !resp.canceled;
    if let Some(last) = resp.events.last().and_then(|e| e.kv.as_ref()) {
        b.next = b.next.max(last.mod_revision + 1);
    } else if progress {
        // Every event up to the header's revision was delivered.
        if let Some(h) = &resp.header {
            b.next = b.next.max(h.revision + 1);
        }
    }
    let mut sent = 0;
    for r in &mut b.receivers {
        if resp.canceled {
            r.stream.send(WatchResponse {
                header: resp.header,
                watch_id: r.id,
                canceled: true,
                compact_revision: resp.compact_revision,
                cancel_reason: resp.cancel_reason.clone(),
                ..Default::default()
            });
            continue;
        }
        if progress {
            if r.progress {
                r.stream.send(WatchResponse {
                    header: resp.header,
                    watch_id: r.id,
                    ..Default::default()
                });
            }
            continue;
        }
        let mut events = Vec::with_capacity(resp.events.len());
        let mut last = 0;
        for ev in &resp.events {
            let rev = ev.kv.as_ref().map_or(0, |kv| kv.mod_revision);
            if rev < r.nextrev {
                continue;
            }
            last = rev;
            let put = ev.r#type == EventType::Put as i32;
            if (put && r.no_put) || (!put && r.no_delete) {
                continue;
            }
            let mut ev = ev.clone();
            if !r.prev_kv {
                ev.prev_kv = None;
            }
            events.push(ev);
        }
        if last >= r.nextrev {
            r.nextrev = last + 1;
        }
        if events.is_empty() {
            continue;
        }
        sent += 1;
        r.stream.send(WatchResponse {
            header: resp.header,
            watch_id: r.id,
            events,
            ..Default::default()
        });
    }
    if sent > 1 {
        metrics.events_coalescing.inc_by(sent - 1);
    }
}

/// Hands the watchers of broadcast `no` to another of the range that is no further on (so
/// none of its watchers misses an event): true if it did, and `no` is to stop.
fn merge(casts: &mut HashMap<u64, Cast>, no: u64) -> bool {
    let Some(b) = casts.get(&no) else {
        return false;
    };
    let next = b.next;
    let into = casts
        .iter()
        .filter(|(n, o)| **n != no && o.started && o.next > 0 && o.next <= next)
        .map(|(n, _)| *n)
        .next();
    let Some(into) = into else { return false };
    let Some(b) = casts.remove(&no) else {
        return false;
    };
    if let Some(o) = casts.get_mut(&into) {
        o.receivers.extend(b.receivers);
    }
    true
}
