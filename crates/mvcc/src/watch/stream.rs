//! Watch streams: many watchers sharing one bounded queue of responses (etcd's watchStream,
//! one per gRPC Watch call), read by blocking or by async polling.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use ids::Revision;
use parking_lot::{Condvar, Mutex};

use api::etcdserverpb::watch_create_request::FilterType;
use api::etcdserverpb::WatchCreateRequest;
use api::mvccpb::{event::EventType, Event};

use super::event::{event_rev, Batch, Item, Spec, GROWING_BYTES};
use super::events::WatchEvents;
use crate::error::{Error, Result};
use crate::index::KeyRange;
use crate::store::{Inner, RangeOptions, Store};

/// Responses a stream queues before its watchers fall back to catching up (etcd: 128).
pub const DEFAULT_CAPACITY: usize = 1024;
/// Bytes of keys and values a stream's queue holds before the same fallback.
const MAX_QUEUED_BYTES: usize = 64 << 20;
/// The watch id that asks the stream to choose one (etcd's AutoWatchID).
const AUTO_WATCH_ID: i64 = 0;
/// The watch id of a progress notification for the whole stream (etcd's InvalidWatchID).
pub const STREAM_WATCH_ID: i64 = -1;

/// One response on a watch stream (etcd's mvcc `WatchResponse`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WatchResponse {
    pub watch_id: i64,
    /// In revision order. Empty in a progress notification.
    pub events: WatchEvents,
    /// The store revision the response is current to.
    pub revision: Revision,
    /// Non-zero when the watcher was cancelled because it needed revisions below this,
    /// already compacted.
    pub compact_revision: Revision,
}

#[derive(Debug, Default)]
struct QueueState {
    items: VecDeque<Item>,
    bytes: usize,
    waker: Option<Waker>,
    /// A push failed for lack of room; the consumer wakes the watch thread when it drains.
    stalled: bool,
    closed: bool,
    /// Items popped so far: the item pushed as number `n` is at `items[n - popped]` while
    /// it is queued.
    popped: u64,
}

/// A stream's queue of responses.
#[derive(Debug)]
pub(crate) struct Queue {
    state: Mutex<QueueState>,
    cv: Condvar,
    capacity: usize,
}

/// How [`Queue::pop`] waits for an item.
#[derive(Clone, Copy)]
enum Wait<'a> {
    Not,
    Until(Instant),
    Poll(&'a Waker),
}

enum Popped {
    Item(Item, bool),
    Empty,
    Closed,
}

impl Queue {
    fn new(capacity: usize) -> Queue {
        Queue {
            state: Mutex::new(QueueState::default()),
            cv: Condvar::new(),
            capacity: capacity.max(1),
        }
    }

    fn full(&self, s: &QueueState) -> bool {
        !s.items.is_empty() && (s.items.len() >= self.capacity || s.bytes >= MAX_QUEUED_BYTES)
    }

    pub(super) fn has_room(&self) -> bool {
        !self.full(&self.state.lock())
    }

    /// Queues `item` unless the queue is full. `force` (progress notifications, which a client
    /// asks for) may go past the bound up to twice it, so a client that requests progress and
    /// never reads cannot grow the queue without limit. Its number in the queue, if queued.
    pub(super) fn push(&self, item: Item, force: bool) -> Option<u64> {
        let mut s = self.state.lock();
        let full = if force {
            s.items.len() >= self.capacity.saturating_mul(2)
        } else {
            self.full(&s)
        };
        if full {
            s.stalled = true;
            return None;
        }
        let was_empty = s.items.is_empty();
        let number = s.popped + s.items.len() as u64;
        s.bytes += item.bytes();
        s.items.push_back(item);
        let waker = if was_empty { s.waker.take() } else { None };
        drop(s);
        if was_empty {
            self.cv.notify_one();
        }
        if let Some(w) = waker {
            w.wake();
        }
        Some(number)
    }

    /// Adds `batch`, of revision `revision`, to the events item pushed as `number`, unless it
    /// was popped, is at its size ([`GROWING_BYTES`]), or the queue is out of bytes; whether
    /// it did.
    pub(super) fn grow(&self, number: u64, batch: &Arc<Batch>, revision: i64) -> bool {
        let mut s = self.state.lock();
        if s.bytes + batch.bytes > MAX_QUEUED_BYTES {
            return false;
        }
        let Some(at) = number.checked_sub(s.popped) else {
            return false;
        };
        let Some(Item::Events {
            batches,
            revision: current,
            bytes,
            ..
        }) = usize::try_from(at).ok().and_then(|at| s.items.get_mut(at))
        else {
            return false;
        };
        if *bytes + batch.bytes > GROWING_BYTES {
            return false;
        }
        *bytes += batch.bytes;
        batches.push(batch.clone());
        *current = revision;
        s.bytes += batch.bytes;
        true
    }

    pub(super) fn close(&self) {
        let mut s = self.state.lock();
        s.closed = true;
        let waker = s.waker.take();
        drop(s);
        self.cv.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// The next item, and whether the watch thread should be woken to refill the queue.
    fn pop(&self, wait: Wait<'_>) -> Popped {
        let mut s = self.state.lock();
        loop {
            if let Some(item) = s.items.pop_front() {
                s.popped += 1;
                s.bytes -= item.bytes();
                let kick = s.stalled && s.items.len() <= self.capacity / 2;
                if kick {
                    s.stalled = false;
                }
                return Popped::Item(item, kick);
            }
            if s.closed {
                return Popped::Closed;
            }
            match wait {
                Wait::Not => return Popped::Empty,
                Wait::Poll(w) => {
                    s.waker = Some(w.clone());
                    return Popped::Empty;
                }
                Wait::Until(t) => {
                    if self.cv.wait_until(&mut s, t).timed_out() && s.items.is_empty() {
                        return Popped::Empty;
                    }
                }
            }
        }
    }
}

#[derive(Debug, Default)]
struct Watchers {
    by_id: HashMap<i64, (u64, Arc<Spec>)>,
    next_id: i64,
}

/// A stream of watchers sharing one bounded queue of responses, in the order they happened
/// per watcher. Dropping it cancels its watchers.
///
/// ```
/// use api::etcdserverpb::{PutRequest, WatchCreateRequest};
/// let dir = tempfile::tempdir().unwrap();
/// let store = mvcc::Store::open(dir.path().join("db"), Default::default()).unwrap();
/// let stream = store.watch_stream();
/// let id = stream.watch(&WatchCreateRequest { key: b"k".to_vec(), ..Default::default() }).unwrap();
/// store.write().unwrap().put(&PutRequest { key: b"k".to_vec(), value: b"v".to_vec(), ..Default::default() }).unwrap();
/// let resp = stream.recv_timeout(std::time::Duration::from_secs(5)).unwrap();
/// assert_eq!((resp.watch_id, resp.revision), (id, ids::Revision(2)));
/// assert_eq!(resp.events[0].kv.as_ref().unwrap().value, b"v");
/// ```
#[derive(Debug)]
pub struct WatchStream {
    inner: Arc<Inner>,
    queue: Arc<Queue>,
    watchers: Mutex<Watchers>,
}

impl Store {
    /// A new watch stream with the default queue bound.
    pub fn watch_stream(&self) -> WatchStream {
        self.watch_stream_with_capacity(DEFAULT_CAPACITY)
    }

    /// A new watch stream queueing at most `capacity` responses; past that its watchers wait
    /// and catch up when the consumer has drained it, without holding up writes.
    pub fn watch_stream_with_capacity(&self, capacity: usize) -> WatchStream {
        let queue = Arc::new(Queue::new(capacity));
        self.inner.hub.register(&queue);
        if self.inner.hub.closed.load(Ordering::Acquire) {
            queue.close();
        }
        WatchStream {
            inner: self.inner.clone(),
            queue,
            watchers: Mutex::new(Watchers::default()),
        }
    }
}

impl WatchStream {
    /// Creates a watcher (etcd's `WatchCreateRequest`, after the server's conversions: an
    /// empty key means `"\0"`, range_end `"\0"` every key from `key` on). `start_revision` 0
    /// watches from the next revision; an older one replays history from it first (or is
    /// cancelled with the compaction revision if that history is gone). `watch_id` 0 lets the
    /// stream choose. `progress_notify` and `fragment` are the server's business.
    pub fn watch(&self, req: &WatchCreateRequest) -> Result<i64> {
        let key = if req.key.is_empty() {
            vec![0]
        } else {
            req.key.clone()
        };
        if let KeyRange::Between(k, e) = KeyRange::new(&key, &req.range_end) {
            if k >= e {
                return Err(Error::EmptyWatcherRange);
            }
        }
        let filters = |f: FilterType| req.filters.contains(&(f as i32));
        let mut ws = self.watchers.lock();
        let id = if req.watch_id == AUTO_WATCH_ID {
            while ws.by_id.contains_key(&ws.next_id) {
                ws.next_id += 1;
            }
            ws.next_id += 1;
            ws.next_id - 1
        } else if ws.by_id.contains_key(&req.watch_id) {
            return Err(Error::DuplicateWatchId);
        } else {
            req.watch_id
        };
        let spec = Arc::new(Spec {
            id,
            key,
            end: req.range_end.clone(),
            start_rev: req.start_revision,
            no_put: filters(FilterType::Noput),
            no_delete: filters(FilterType::Nodelete),
            prev_kv: req.prev_kv,
            canceled: Default::default(),
        });
        let compacted = self.inner.index.read().compacted();
        let h = self
            .inner
            .hub
            .add(spec.clone(), self.queue.clone(), compacted);
        ws.by_id.insert(id, (h, spec));
        Ok(id)
    }

    /// Cancels a watcher: no response for it is received after this returns.
    pub fn cancel(&self, id: i64) -> Result<()> {
        let (h, spec) = self
            .watchers
            .lock()
            .by_id
            .remove(&id)
            .ok_or(Error::WatcherNotExist)?;
        spec.canceled.store(true, Ordering::Release);
        self.inner.hub.remove(h);
        Ok(())
    }

    /// Queues a progress notification for watcher `id` if it is synced (etcd's RequestProgress;
    /// the server calls it on its progress-notify interval for watchers that asked).
    pub fn request_progress(&self, id: i64) -> bool {
        let Some(&(h, _)) = self.watchers.lock().by_id.get(&id) else {
            return false;
        };
        self.inner.hub.progress(&[h], id, &self.queue)
    }

    /// Queues one progress notification for the stream (watch id -1) if all its watchers are
    /// synced; false if not (the caller retries later), as etcd's RequestProgressAll.
    pub fn request_progress_all(&self) -> bool {
        let hs: Vec<u64> = self.watchers.lock().by_id.values().map(|v| v.0).collect();
        self.inner.hub.progress(&hs, STREAM_WATCH_ID, &self.queue)
    }

    /// The revision the store's watchers have been notified up to.
    pub fn rev(&self) -> Revision {
        Revision(self.inner.hub.rev())
    }

    /// The next response, waiting until one comes; `None` once the store is closed and the
    /// queue drained.
    pub fn recv(&self) -> impl Future<Output = Option<WatchResponse>> + '_ {
        std::future::poll_fn(move |cx| self.poll_recv(cx))
    }

    /// Polls for the next response (registers `cx`'s waker when there is none).
    pub fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<Option<WatchResponse>> {
        self.next(Wait::Poll(cx.waker()))
    }

    /// The next response, waiting at most `timeout`; `None` on timeout or once closed.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<WatchResponse> {
        match self.next(Wait::Until(Instant::now() + timeout)) {
            Poll::Ready(r) => r,
            Poll::Pending => None,
        }
    }

    /// The next response if one is queued.
    pub fn try_recv(&self) -> Option<WatchResponse> {
        match self.next(Wait::Not) {
            Poll::Ready(r) => r,
            Poll::Pending => None,
        }
    }

    /// The next response to hand out (skipping items that turn into none); pending when the
    /// queue stays empty as `wait` allows, `None` once closed and drained.
    fn next(&self, wait: Wait<'_>) -> Poll<Option<WatchResponse>> {
        loop {
            match self.queue.pop(wait) {
                Popped::Item(item, kick) => {
                    if let Some(r) = self.respond(item, kick) {
                        return Poll::Ready(Some(r));
                    }
                }
                Popped::Empty => return Poll::Pending,
                Popped::Closed => return Poll::Ready(None),
            }
        }
    }

    /// Turns a queued item into the response the watcher gets; `None` when it gets nothing
    /// (cancelled since, or every event filtered out — etcd sends nothing then either).
    fn respond(&self, item: Item, kick: bool) -> Option<WatchResponse> {
        if kick {
            self.inner.hub.kick();
        }
        match item {
            Item::Progress { watch_id, revision } => Some(WatchResponse {
                watch_id,
                revision: Revision(revision),
                ..Default::default()
            }),
            Item::Compacted {
                spec,
                compact_revision,
            } => (!spec.canceled.load(Ordering::Acquire)).then(|| WatchResponse {
                watch_id: spec.id,
                compact_revision: Revision(compact_revision),
                ..Default::default()
            }),
            Item::Events {
                spec,
                batches,
                from_rev,
                revision,
                ..
            } => self.events(&spec, batches, from_rev, revision),
        }
    }

    /// The response carrying the events of `batches` at or after `from_rev` that the watcher
    /// wants; `None` if none is left, or the watcher was cancelled.
    fn events(
        &self,
        spec: &Spec,
        batches: Vec<Arc<Batch>>,
        from_rev: i64,
        revision: i64,
    ) -> Option<WatchResponse> {
        if spec.canceled.load(Ordering::Acquire) {
            return None;
        }
        let events = WatchEvents::pick(batches, |ev| event_rev(ev) >= from_rev && spec.wants(ev))?;
        let events = if spec.prev_kv {
            let mut own = events.into_vec();
            self.fill_prev_kv(&mut own);
            WatchEvents::from(own)
        } else {
            events
        };
        let hub = &self.inner.hub;
        hub.responses_sent.fetch_add(1, Ordering::Relaxed);
        (hub.events_sent).fetch_add(events.len() as u64, Ordering::Relaxed);
        Some(WatchResponse {
            watch_id: spec.id,
            events,
            revision: Revision(revision),
            compact_revision: Revision(0),
        })
    }

    /// Sets each event's previous version, read at the revision before it (as etcd's server
    /// does; none for a key's creation, or when that revision is compacted).
    fn fill_prev_kv(&self, events: &mut [Event]) {
        let Ok(mut snap) = self.inner.snapshot() else {
            return;
        };
        for ev in events {
            let Some(kv) = &ev.kv else { continue };
            if ev.r#type == EventType::Put as i32 && kv.create_revision == kv.mod_revision {
                continue;
            }
            let ro = RangeOptions {
                rev: Revision(kv.mod_revision - 1),
                ..Default::default()
            };
            if let Ok(r) = snap.range_keys(&kv.key, &[], ro) {
                ev.prev_kv = r.kvs.into_iter().next();
            }
        }
    }
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        let ws = std::mem::take(&mut *self.watchers.lock());
        for (h, spec) in ws.by_id.into_values() {
            spec.canceled.store(true, Ordering::Release);
            self.inner.hub.remove(h);
        }
        self.inner.hub.unregister(&self.queue);
    }
}
