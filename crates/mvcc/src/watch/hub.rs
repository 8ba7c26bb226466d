//! The hub: every watcher of a store by handle, the synced set writers push to, the unsynced set
//! the watch thread serves, and the ring of recent event batches.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use api::mvccpb::Event;

use super::event::{event_key, Batch, Item, Spec};
use super::group::Group;
use super::stream::Queue;
use crate::signal::Signal;

/// Events the ring of recent batches keeps at most…
pub(super) const RING_EVENTS: usize = 16_384;
/// …and bytes of keys and values (a batch a response was sent from holds their encoding too,
/// about as many bytes again).
pub(super) const RING_BYTES: usize = 64 << 20;

pub(super) struct Watcher {
    pub(super) spec: Arc<Spec>,
    pub(super) queue: Arc<Queue>,
    /// The first revision it has not been sent.
    pub(super) min_rev: i64,
    pub(super) synced: bool,
    /// The number in its queue of its events item, which the next revisions may join while
    /// it is queued: set only while nothing else of this watcher has been queued after it.
    pub(super) growing: Option<u64>,
}

pub(super) struct Slot {
    pub(super) generation: u32,
    pub(super) watcher: Option<Watcher>,
}

/// A store's watch figures (etcd's `etcd_debugging_mvcc_watcher_total` and
/// `etcd_debugging_mvcc_events_total`, and the responses those events went in).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatchCounts {
    /// Watchers now.
    pub watchers: u64,
    /// Responses with events sent since the store opened.
    pub responses: u64,
    /// Events sent since the store opened.
    pub events: u64,
}

/// The watchers of a store.
pub(crate) struct Hub {
    pub(super) state: Mutex<HubState>,
    /// Live watchers, read by writers to decide whether to build events at all.
    pub(super) watchers: AtomicUsize,
    /// Wakes the watch thread.
    pub(super) wake: Signal,
    pub(super) closed: AtomicBool,
    /// Responses with events sent, and the events in them.
    pub(super) responses_sent: AtomicU64,
    pub(super) events_sent: AtomicU64,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("watchers", &self.watchers.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

pub(super) struct HubState {
    /// The last revision notified.
    pub(super) rev: i64,
    /// Watchers by handle: the slot index in the low 32 bits, its generation in the high 32.
    pub(super) slots: Vec<Slot>,
    pub(super) free: Vec<u32>,
    pub(super) synced: Group,
    pub(super) unsynced: BTreeSet<u64>,
    /// The event batches of the revisions from `ring_from` to `rev`, oldest first.
    pub(super) ring: VecDeque<(i64, Arc<Batch>)>,
    pub(super) ring_from: i64,
    pub(super) ring_events: usize,
    pub(super) ring_bytes: usize,
    /// Every stream's queue, to wake them when the store closes.
    pub(super) queues: HashMap<usize, Weak<Queue>>,
    pub(super) scratch: Vec<u64>,
}

/// A watcher's handle: its slot index in the low 32 bits, the slot's generation in the high 32
/// (so a handle to a removed watcher never reaches the slot's next occupant).
pub(super) fn handle(index: usize, generation: u32) -> u64 {
    (u64::from(generation) << 32) | index as u64
}

pub(super) fn slot_index(h: u64) -> usize {
    (h & u64::from(u32::MAX)) as usize
}

impl Slot {
    pub(super) fn holds(&self, h: u64) -> bool {
        u64::from(self.generation) == h >> 32
    }
}

impl HubState {
    pub(super) fn peek(&self, h: u64) -> Option<&Watcher> {
        let slot = self.slots.get(slot_index(h)).filter(|s| s.holds(h))?;
        slot.watcher.as_ref()
    }

    pub(super) fn get(&mut self, h: u64) -> Option<&mut Watcher> {
        let slot = self.slots.get_mut(slot_index(h)).filter(|s| s.holds(h))?;
        slot.watcher.as_mut()
    }

    pub(super) fn insert(&mut self, w: Watcher) -> u64 {
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    watcher: None,
                });
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[i as usize];
        slot.watcher = Some(w);
        handle(i as usize, slot.generation)
    }

    /// Removes the watcher from the hub and from whichever set holds it.
    pub(super) fn take(&mut self, h: u64) -> Option<Watcher> {
        self.get(h)?;
        let i = slot_index(h);
        let slot = &mut self.slots[i];
        let w = slot.watcher.take()?;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(i as u32);
        if w.synced {
            self.synced.remove(h, &w.spec);
        } else {
            self.unsynced.remove(&h);
        }
        Some(w)
    }

    pub(super) fn make_synced(&mut self, h: u64) {
        let Some(w) = self.get(h) else { return };
        if w.synced {
            return;
        }
        w.synced = true;
        let spec = w.spec.clone();
        self.unsynced.remove(&h);
        self.synced.add(h, &spec);
    }

    pub(super) fn make_unsynced(&mut self, h: u64, min_rev: i64) {
        let Some(w) = self.get(h) else { return };
        w.growing = None;
        w.min_rev = w.min_rev.max(min_rev);
        if !w.synced {
            return;
        }
        w.synced = false;
        let spec = w.spec.clone();
        self.synced.remove(h, &spec);
        self.unsynced.insert(h);
    }

    /// Whether the watcher can join the synced set from the ring alone.
    pub(super) fn ring_covers(&self, h: u64) -> bool {
        self.peek(h)
            .is_some_and(|w| w.min_rev > self.rev || w.min_rev >= self.ring_from)
    }

    /// Sends the watcher the ring's batches it has not had and makes it synced; false (and
    /// nothing changed) when its queue is full. The caller checked [`HubState::ring_covers`].
    pub(super) fn catch_up_from_ring(&mut self, h: u64) -> bool {
        let rev = self.rev;
        let Some(min_rev) = self.peek(h).map(|w| w.min_rev) else {
            return false;
        };
        let start = self.ring.partition_point(|(r, _)| *r < min_rev);
        let batches: Vec<Arc<Batch>> = self.ring.range(start..).map(|(_, b)| b.clone()).collect();
        let Some(w) = self.get(h) else { return false };
        if !batches.is_empty() {
            let item = Item::events(w.spec.clone(), batches, w.min_rev, rev);
            if w.queue.push(item, false).is_none() {
                return false;
            }
            w.growing = None;
        }
        w.min_rev = w.min_rev.max(rev + 1);
        self.make_synced(h);
        true
    }

    pub(super) fn push_ring(&mut self, rev: i64, batch: Arc<Batch>) {
        self.ring_events += batch.events.len();
        self.ring_bytes += batch.bytes;
        self.ring.push_back((rev, batch));
        while self.ring_events > RING_EVENTS || self.ring_bytes > RING_BYTES {
            let Some((r, b)) = self.ring.pop_front() else {
                break;
            };
            self.ring_events -= b.events.len();
            self.ring_bytes -= b.bytes;
            self.ring_from = r + 1;
        }
    }

    pub(super) fn clear_ring(&mut self, rev: i64) {
        self.ring.clear();
        self.ring_events = 0;
        self.ring_bytes = 0;
        self.ring_from = rev + 1;
    }
}

impl Hub {
    pub(crate) fn new(rev: i64) -> Hub {
        Hub {
            state: Mutex::new(HubState {
                rev,
                slots: Vec::new(),
                free: Vec::new(),
                synced: Group::default(),
                unsynced: BTreeSet::new(),
                ring: VecDeque::new(),
                ring_from: rev + 1,
                ring_events: 0,
                ring_bytes: 0,
                queues: HashMap::new(),
                scratch: Vec::new(),
            }),
            watchers: AtomicUsize::new(0),
            wake: Signal::default(),
            closed: AtomicBool::new(false),
            responses_sent: AtomicU64::new(0),
            events_sent: AtomicU64::new(0),
        }
    }

    /// What the store's watchers were sent, and how many there are.
    pub(crate) fn counts(&self) -> WatchCounts {
        WatchCounts {
            watchers: self.watchers.load(Ordering::Relaxed) as u64,
            responses: self.responses_sent.load(Ordering::Relaxed),
            events: self.events_sent.load(Ordering::Relaxed),
        }
    }

    /// Whether writers should build events for [`Hub::notify`].
    pub(crate) fn has_watchers(&self) -> bool {
        self.watchers.load(Ordering::Acquire) > 0
    }

    /// Wakes the watch thread.
    pub(super) fn kick(&self) {
        self.wake.kick();
    }

    /// A write transaction produced revision `rev` with `events` (`None` if it did not build
    /// them because no watcher existed when it began).
    pub(crate) fn notify(&self, rev: i64, events: Option<Vec<Event>>) {
        let mut st = self.state.lock();
        st.rev = rev;
        let Some(events) = events else {
            st.clear_ring(rev);
            // Watchers that joined during the transaction catch up from the store.
            if st.synced.len() > 0 {
                let synced: Vec<u64> = (0..st.slots.len())
                    .filter_map(|i| {
                        let s = &st.slots[i];
                        let w = s.watcher.as_ref()?;
                        w.synced.then_some(handle(i, s.generation))
                    })
                    .collect();
                for h in synced {
                    st.make_unsynced(h, rev);
                }
                drop(st);
                self.kick();
            }
            return;
        };
        let batch = Batch::new(events);
        let mut matched = std::mem::take(&mut st.scratch);
        for ev in &batch.events {
            st.synced.matches(event_key(ev), &mut matched);
        }
        for &h in &matched {
            let Some(w) = st.get(h) else { continue };
            // A range watcher matches each of the revision's events on its keys: it takes the
            // batch once (and a watcher made unsynced just now takes it when it catches up).
            if !w.synced || w.min_rev > rev {
                continue;
            }
            if w.growing.is_some_and(|n| w.queue.grow(n, &batch, rev)) {
                w.min_rev = rev + 1;
                continue;
            }
            let item = Item::events(w.spec.clone(), vec![batch.clone()], rev, rev);
            if let Some(n) = w.queue.push(item, false) {
                w.min_rev = rev + 1;
                w.growing = Some(n);
            } else {
                // Its stream is full: it catches up once the consumer drains it.
                st.make_unsynced(h, rev);
            }
        }
        matched.clear();
        st.scratch = matched;
        st.push_ring(rev, batch);
    }

    /// Adds a watcher; one from a past revision catches up first. `compacted` is the store's
    /// compaction revision: a watcher starting below it is cancelled.
    pub(super) fn add(&self, spec: Arc<Spec>, queue: Arc<Queue>, compacted: i64) -> u64 {
        let mut st = self.state.lock();
        let start = spec.start_rev;
        let now = start == 0 || start > st.rev;
        let min_rev = if now { start.max(st.rev + 1) } else { start };
        let h = st.insert(Watcher {
            spec,
            queue,
            min_rev,
            synced: false,
            growing: None,
        });
        st.unsynced.insert(h);
        self.watchers.fetch_add(1, Ordering::AcqRel);
        if min_rev < compacted || !st.ring_covers(h) || !st.catch_up_from_ring(h) {
            drop(st);
            self.kick();
        }
        h
    }

    pub(super) fn remove(&self, h: u64) {
        self.forget(&mut self.state.lock(), h);
    }

    /// Removes a watcher and counts it out of [`Hub::has_watchers`].
    pub(super) fn forget(&self, st: &mut HubState, h: u64) {
        if st.take(h).is_some() {
            self.watchers.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Queues a progress notification (no events, the current revision) for the watchers in
    /// `hs` under `watch_id` if every one of them is synced; etcd's progressIfSync. False if
    /// one is not, or the queue is far over its bound.
    pub(super) fn progress(&self, hs: &[u64], watch_id: i64, queue: &Queue) -> bool {
        let mut st = self.state.lock();
        let rev = st.rev;
        for &h in hs {
            match st.get(h) {
                Some(w) if w.synced && rev >= w.spec.start_rev => {}
                _ => return false,
            }
        }
        if hs.is_empty() {
            return true;
        }
        let item = Item::Progress {
            watch_id,
            revision: rev,
        };
        if queue.push(item, true).is_none() {
            return false;
        }
        // Events after the notification go after it: no growing item before it takes them.
        for &h in hs {
            if let Some(w) = st.get(h) {
                w.growing = None;
            }
        }
        true
    }

    pub(super) fn rev(&self) -> i64 {
        self.state.lock().rev
    }

    pub(super) fn register(&self, queue: &Arc<Queue>) {
        let key = Arc::as_ptr(queue) as usize;
        self.state.lock().queues.insert(key, Arc::downgrade(queue));
    }

    pub(super) fn unregister(&self, queue: &Arc<Queue>) {
        let key = Arc::as_ptr(queue) as usize;
        self.state.lock().queues.remove(&key);
    }

    /// Stops the watch thread; streams end once drained.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake.stop();
        let queues: Vec<_> = self.state.lock().queues.values().cloned().collect();
        for q in queues.iter().filter_map(Weak::upgrade) {
            q.close();
        }
    }
}
