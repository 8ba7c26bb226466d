//! Watch: etcd's watchable store, without its stalls.
//!
//! A watcher is *synced* when it has every event up to the store's revision; each write
//! transaction then hands it the matching events of its revision (one push onto its stream's
//! queue: a shared, reference-counted batch, no copy). A watcher that starts in the past, or
//! whose stream's queue is full when a write comes, is *unsynced* and catches up on the watch
//! thread: from a ring of recent event batches when it is only a little behind, otherwise from
//! the store's history, read from a snapshot with no lock held, so writers never wait for it
//! (etcd reads that history under the store lock writers need). A slow consumer therefore costs
//! writers one failed push and a set move, never a wait, and other watchers nothing.
//!
//! Every revision passes through [`Hub::notify`] in order, under the hub lock, so a watcher
//! moves between the two sets at a revision boundary: it never misses or repeats an event.

mod group;
mod stream;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use prost::Message;

use api::mvccpb::{event::EventType, Event, KeyValue};

use crate::error::{Error, Result};
use crate::index::KeyRange;
use crate::signal::Signal;
use crate::store::{Inner, Reader};
use group::Group;
use stream::Queue;
pub use stream::{WatchResponse, WatchStream};

/// Events the ring of recent batches keeps at most…
const RING_EVENTS: usize = 16_384;
/// …and bytes of keys and values.
const RING_BYTES: usize = 64 << 20;
/// Unsynced watchers one catch-up round serves.
const WATCHERS_PER_ROUND: usize = 1024;
/// Stored entries one catch-up round reads at most (rounded up to a whole revision).
const ENTRIES_PER_ROUND: usize = 10_000;
/// How often the watch thread retries watchers it could not serve (etcd: 100 ms).
const SYNC_INTERVAL: Duration = Duration::from_millis(100);

/// What one watcher asked for; shared by the hub, its stream and the responses queued for it.
#[derive(Debug)]
pub(crate) struct Spec {
    /// The watch id on its stream.
    id: i64,
    key: Vec<u8>,
    /// etcd's range_end conventions: empty = one key, `"\0"` = every key from `key` on.
    end: Vec<u8>,
    start_rev: i64,
    no_put: bool,
    no_delete: bool,
    prev_kv: bool,
    /// Set when the watcher is cancelled: its queued responses are dropped.
    canceled: AtomicBool,
}

impl Spec {
    fn range(&self) -> KeyRange<'_> {
        KeyRange::new(&self.key, &self.end)
    }

    /// Whether `ev` goes to this watcher (its range and filters).
    fn wants(&self, ev: &Event) -> bool {
        let put = ev.r#type == EventType::Put as i32;
        if (put && self.no_put) || (!put && self.no_delete) {
            return false;
        }
        self.range().contains(event_key(ev))
    }

    #[cfg(test)]
    pub(crate) fn for_test(key: &[u8], end: &[u8]) -> Spec {
        Spec {
            id: 0,
            key: key.to_vec(),
            end: end.to_vec(),
            start_rev: 0,
            no_put: false,
            no_delete: false,
            prev_kv: false,
            canceled: AtomicBool::new(false),
        }
    }
}

fn event_key(ev: &Event) -> &[u8] {
    ev.kv.as_ref().map_or(&[], |kv| &kv.key)
}

fn event_rev(ev: &Event) -> i64 {
    ev.kv.as_ref().map_or(0, |kv| kv.mod_revision)
}

/// Events of one or more consecutive revisions, shared by every watcher they go to.
#[derive(Debug)]
pub(crate) struct Batch {
    events: Vec<Event>,
    /// Bytes of keys and values, for the memory bounds.
    bytes: usize,
}

impl Batch {
    fn new(events: Vec<Event>) -> Arc<Batch> {
        let bytes = events
            .iter()
            .filter_map(|e| e.kv.as_ref())
            .map(|kv| kv.key.len() + kv.value.len())
            .sum();
        Arc::new(Batch { events, bytes })
    }
}

#[derive(Debug)]
pub(crate) enum Batches {
    One(Arc<Batch>),
    Many(Vec<Arc<Batch>>),
}

impl Batches {
    fn iter(&self) -> impl Iterator<Item = &Batch> {
        let (one, many) = match self {
            Batches::One(b) => (Some(&**b), &[][..]),
            Batches::Many(v) => (None, &v[..]),
        };
        one.into_iter().chain(many.iter().map(|b| &**b))
    }
}

/// A response waiting in a stream's queue; turned into a [`WatchResponse`] by the consumer.
#[derive(Debug)]
pub(crate) enum Item {
    /// The events of `batches` at or after `from_rev` that the watcher wants.
    Events {
        spec: Arc<Spec>,
        batches: Batches,
        from_rev: i64,
        revision: i64,
    },
    Progress {
        watch_id: i64,
        revision: i64,
    },
    /// The watcher fell behind the compaction revision and is gone.
    Compacted {
        spec: Arc<Spec>,
        compact_revision: i64,
    },
}

impl Item {
    fn bytes(&self) -> usize {
        match self {
            Item::Events { batches, .. } => batches.iter().map(|b| b.bytes).sum(),
            _ => 0,
        }
    }
}

struct Watcher {
    spec: Arc<Spec>,
    queue: Arc<Queue>,
    /// The first revision it has not been sent.
    min_rev: i64,
    synced: bool,
}

struct Slot {
    generation: u32,
    watcher: Option<Watcher>,
}

/// The watchers of a store.
pub(crate) struct Hub {
    state: Mutex<HubState>,
    /// Live watchers, read by writers to decide whether to build events at all.
    watchers: AtomicUsize,
    /// Wakes the watch thread.
    wake: Signal,
    closed: AtomicBool,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("watchers", &self.watchers.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

struct HubState {
    /// The last revision notified.
    rev: i64,
    /// Watchers by handle: the slot index in the low 32 bits, its generation in the high 32.
    slots: Vec<Slot>,
    free: Vec<u32>,
    synced: Group,
    unsynced: BTreeSet<u64>,
    /// The event batches of the revisions from `ring_from` to `rev`, oldest first.
    ring: VecDeque<(i64, Arc<Batch>)>,
    ring_from: i64,
    ring_events: usize,
    ring_bytes: usize,
    /// Every stream's queue, to wake them when the store closes.
    queues: HashMap<usize, Weak<Queue>>,
    scratch: Vec<u64>,
}

/// A watcher's handle: its slot index in the low 32 bits, the slot's generation in the high 32
/// (so a handle to a removed watcher never reaches the slot's next occupant).
fn handle(index: usize, generation: u32) -> u64 {
    (u64::from(generation) << 32) | index as u64
}

fn slot_index(h: u64) -> usize {
    (h & u64::from(u32::MAX)) as usize
}

impl Slot {
    fn holds(&self, h: u64) -> bool {
        u64::from(self.generation) == h >> 32
    }
}

impl HubState {
    fn peek(&self, h: u64) -> Option<&Watcher> {
        let slot = self.slots.get(slot_index(h)).filter(|s| s.holds(h))?;
        slot.watcher.as_ref()
    }

    fn get(&mut self, h: u64) -> Option<&mut Watcher> {
        let slot = self.slots.get_mut(slot_index(h)).filter(|s| s.holds(h))?;
        slot.watcher.as_mut()
    }

    fn insert(&mut self, w: Watcher) -> u64 {
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
    fn take(&mut self, h: u64) -> Option<Watcher> {
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

    fn make_synced(&mut self, h: u64) {
        let Some(w) = self.get(h) else { return };
        if w.synced {
            return;
        }
        w.synced = true;
        let spec = w.spec.clone();
        self.unsynced.remove(&h);
        self.synced.add(h, &spec);
    }

    fn make_unsynced(&mut self, h: u64, min_rev: i64) {
        let Some(w) = self.get(h) else { return };
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
    fn ring_covers(&self, h: u64) -> bool {
        self.peek(h)
            .is_some_and(|w| w.min_rev > self.rev || w.min_rev >= self.ring_from)
    }

    /// Sends the watcher the ring's batches it has not had and makes it synced; false (and
    /// nothing changed) when its queue is full. The caller checked [`HubState::ring_covers`].
    fn catch_up_from_ring(&mut self, h: u64) -> bool {
        let rev = self.rev;
        let Some(min_rev) = self.peek(h).map(|w| w.min_rev) else {
            return false;
        };
        let start = self.ring.partition_point(|(r, _)| *r < min_rev);
        let batches: Vec<Arc<Batch>> = self.ring.range(start..).map(|(_, b)| b.clone()).collect();
        let Some(w) = self.get(h) else { return false };
        if !batches.is_empty() {
            let item = Item::Events {
                spec: w.spec.clone(),
                batches: Batches::Many(batches),
                from_rev: w.min_rev,
                revision: rev,
            };
            if !w.queue.push(item, false) {
                return false;
            }
        }
        w.min_rev = w.min_rev.max(rev + 1);
        self.make_synced(h);
        true
    }

    fn push_ring(&mut self, rev: i64, batch: Arc<Batch>) {
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

    fn clear_ring(&mut self, rev: i64) {
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
        }
    }

    /// Whether writers should build events for [`Hub::notify`].
    pub(crate) fn has_watchers(&self) -> bool {
        self.watchers.load(Ordering::Acquire) > 0
    }

    /// Wakes the watch thread.
    fn kick(&self) {
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
            let item = Item::Events {
                spec: w.spec.clone(),
                batches: Batches::One(batch.clone()),
                from_rev: rev,
                revision: rev,
            };
            if w.queue.push(item, false) {
                w.min_rev = rev + 1;
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
    fn add(&self, spec: Arc<Spec>, queue: Arc<Queue>, compacted: i64) -> u64 {
        let mut st = self.state.lock();
        let start = spec.start_rev;
        let now = start == 0 || start > st.rev;
        let min_rev = if now { start.max(st.rev + 1) } else { start };
        let h = st.insert(Watcher {
            spec,
            queue,
            min_rev,
            synced: false,
        });
        st.unsynced.insert(h);
        self.watchers.fetch_add(1, Ordering::AcqRel);
        if min_rev < compacted || !st.ring_covers(h) || !st.catch_up_from_ring(h) {
            drop(st);
            self.kick();
        }
        h
    }

    fn remove(&self, h: u64) {
        self.forget(&mut self.state.lock(), h);
    }

    /// Removes a watcher and counts it out of [`Hub::has_watchers`].
    fn forget(&self, st: &mut HubState, h: u64) {
        if st.take(h).is_some() {
            self.watchers.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Queues a progress notification (no events, the current revision) for the watchers in
    /// `hs` under `watch_id` if every one of them is synced; etcd's progressIfSync. False if
    /// one is not, or the queue is far over its bound.
    fn progress(&self, hs: &[u64], watch_id: i64, queue: &Queue) -> bool {
        let mut st = self.state.lock();
        let rev = st.rev;
        for &h in hs {
            match st.get(h) {
                Some(w) if w.synced && rev >= w.spec.start_rev => {}
                _ => return false,
            }
        }
        hs.is_empty()
            || queue.push(
                Item::Progress {
                    watch_id,
                    revision: rev,
                },
                true,
            )
    }

    fn rev(&self) -> i64 {
        self.state.lock().rev
    }

    fn register(&self, queue: &Arc<Queue>) {
        let key = Arc::as_ptr(queue) as usize;
        self.state.lock().queues.insert(key, Arc::downgrade(queue));
    }

    fn unregister(&self, queue: &Arc<Queue>) {
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

/// The watch thread: serves unsynced watchers when woken, and every [`SYNC_INTERVAL`].
pub(crate) fn sync_loop(weak: Weak<Inner>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        if !inner.hub.wake.wait(SYNC_INTERVAL) {
            return;
        }
        loop {
            match sync_round(&inner) {
                Ok(true) => continue,
                Ok(false) => break,
                Err(e) => {
                    tracing::error!(path = %inner.path.display(), error = %e, "watch catch-up failed");
                    break;
                }
            }
        }
    }
}

/// One round of catch-up; true if it moved any watcher forward (another round may too).
fn sync_round(inner: &Inner) -> Result<bool> {
    let hub = &inner.hub;
    if hub.state.lock().unsynced.is_empty() {
        return Ok(false);
    }
    // The reader first, then the compaction revision: whatever compaction removed from the
    // reader's view lies below the revision read here.
    let (reader, snap_rev) = inner.reader()?;
    let compacted = inner.index.read().compacted();
    let mut st = hub.state.lock();
    let chosen: Vec<u64> = st
        .unsynced
        .iter()
        .copied()
        .filter(|&h| st.peek(h).is_some_and(|w| w.queue.has_room()))
        .take(WATCHERS_PER_ROUND)
        .collect();
    let mut progressed = false;
    let mut behind = Vec::new();
    for h in chosen {
        let covered = st.ring_covers(h);
        let Some(w) = st.get(h) else { continue };
        if w.min_rev < compacted {
            let item = Item::Compacted {
                spec: w.spec.clone(),
                compact_revision: compacted,
            };
            if w.queue.push(item, false) {
                hub.forget(&mut st, h);
                progressed = true;
            }
        } else if covered {
            progressed |= st.catch_up_from_ring(h);
        } else {
            behind.push((h, w.min_rev, w.spec.clone()));
        }
    }
    if behind.is_empty() {
        return Ok(progressed);
    }
    drop(st);
    let from = behind.iter().map(|b| b.1).min().unwrap_or(i64::MAX);
    if from > snap_rev {
        // Revisions published after the reader was taken; the next round's reader has them.
        return Ok(true);
    }
    let mut group = Group::default();
    for (h, _, spec) in &behind {
        group.add(*h, spec);
    }
    let (events, upto) = read_history(&reader, inner, from, snap_rev, &group)?;
    // The last revision with an event for each watcher.
    let mut wanted: HashMap<u64, i64> = HashMap::new();
    let mut hits = Vec::new();
    for ev in &events {
        group.matches(event_key(ev), &mut hits);
        for h in hits.drain(..) {
            wanted.insert(h, event_rev(ev));
        }
    }
    let batch = Batch::new(events);
    let mut st = hub.state.lock();
    for (h, from, _) in behind {
        let Some(w) = st.get(h) else { continue };
        if w.synced || w.min_rev != from {
            continue;
        }
        if wanted.get(&h).is_some_and(|&last| last >= from) {
            let item = Item::Events {
                spec: w.spec.clone(),
                batches: Batches::One(batch.clone()),
                from_rev: from,
                revision: snap_rev,
            };
            if !w.queue.push(item, false) {
                continue;
            }
        }
        w.min_rev = upto + 1;
        progressed = true;
        if st.ring_covers(h) {
            st.catch_up_from_ring(h);
        }
    }
    Ok(progressed)
}

/// The events in revisions `[from, to]` on keys some watcher of `group` watches, and the last
/// revision read: `to`, or less when the round's entry budget ran out.
fn read_history(
    reader: &Reader,
    inner: &Inner,
    from: i64,
    to: i64,
    group: &Group,
) -> Result<(Vec<Event>, i64)> {
    let mut events = Vec::new();
    let (mut seen, mut last, mut upto) = (0usize, from - 1, to);
    let mut bad = None;
    reader.for_each_entry(&inner.path, from, to, |r, tombstone, v| {
        if seen >= ENTRIES_PER_ROUND && r.main != last {
            upto = last;
            return false;
        }
        seen += 1;
        last = r.main;
        let mut kv = match KeyValue::decode(v) {
            Ok(kv) => kv,
            Err(e) => {
                bad = Some(format!("revision {r:?}: {e}"));
                return false;
            }
        };
        if !group.any(&kv.key) {
            return true;
        }
        let ty = if tombstone {
            // A tombstone stores only its key; its event carries the deleting revision.
            kv.mod_revision = r.main;
            EventType::Delete
        } else {
            EventType::Put
        };
        events.push(Event {
            r#type: ty as i32,
            kv: Some(kv),
            prev_kv: None,
        });
        true
    })?;
    if let Some(reason) = bad {
        return Err(Error::Corrupt {
            path: inner.path.display().to_string(),
            reason,
        });
    }
    Ok((events, upto))
}
