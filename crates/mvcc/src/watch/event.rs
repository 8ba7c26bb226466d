//! What watchers are sent: a watcher's request, the event batches of a revision shared by every
//! watcher that wants them, and the items queued on a stream.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use api::mvccpb::{event::EventType, Event};

use crate::index::KeyRange;

/// What one watcher asked for; shared by the hub, its stream and the responses queued for it.
#[derive(Debug)]
pub(crate) struct Spec {
    /// The watch id on its stream.
    pub(super) id: i64,
    pub(super) key: Vec<u8>,
    /// etcd's range_end conventions: empty = one key, `"\0"` = every key from `key` on.
    pub(super) end: Vec<u8>,
    pub(super) start_rev: i64,
    pub(super) no_put: bool,
    pub(super) no_delete: bool,
    pub(super) prev_kv: bool,
    /// Set when the watcher is cancelled: its queued responses are dropped.
    pub(super) canceled: AtomicBool,
}

impl Spec {
    pub(super) fn range(&self) -> KeyRange<'_> {
        KeyRange::new(&self.key, &self.end)
    }

    /// Whether `ev` goes to this watcher (its range and filters).
    pub(super) fn wants(&self, ev: &Event) -> bool {
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

pub(super) fn event_key(ev: &Event) -> &[u8] {
    ev.kv.as_ref().map_or(&[], |kv| &kv.key)
}

pub(super) fn event_rev(ev: &Event) -> i64 {
    ev.kv.as_ref().map_or(0, |kv| kv.mod_revision)
}

/// Events of one or more consecutive revisions, shared by every watcher they go to.
#[derive(Debug)]
pub(crate) struct Batch {
    pub(super) events: Vec<Event>,
    /// Bytes of keys and values, for the memory bounds.
    pub(super) bytes: usize,
    /// Each event's protobuf encoding, made once, by the first response sent with it, for
    /// every watcher it goes to (see [`super::WatchEvents`]).
    encoded: OnceLock<Vec<Vec<u8>>>,
}

impl Batch {
    pub(super) fn new(events: Vec<Event>) -> Arc<Batch> {
        let bytes = events
            .iter()
            .filter_map(|e| e.kv.as_ref())
            .map(|kv| kv.key.len() + kv.value.len())
            .sum();
        Arc::new(Batch {
            events,
            bytes,
            encoded: OnceLock::new(),
        })
    }

    /// Event `i`'s protobuf encoding.
    pub(super) fn encoded(&self, i: usize) -> &[u8] {
        let all = self.encoded.get_or_init(|| {
            self.events
                .iter()
                .map(prost::Message::encode_to_vec)
                .collect()
        });
        &all[i]
    }
}

/// Keys and values one growing item holds at most before the watcher's next revisions go in
/// an item of their own.
const GROWING_BYTES: usize = 1 << 20;

/// A watcher's events item that is still in its queue: the writer adds the next revisions'
/// batches to it instead of queueing another item, until the consumer takes it. A consumer
/// that keeps up gets one revision per response; one that falls behind gets each watcher's
/// pending revisions in one response (etcd batches a watcher that fell behind the same way),
/// so the client handles a fraction of the messages for the same events.
///
/// The queue holding it counts its bytes: it adds a batch only under the queue's lock
/// ([`super::stream::Queue::grow`]), and seals it under that lock when the consumer pops it,
/// so what the queue adds and what it takes away when popping are the same.
#[derive(Debug)]
pub(crate) struct Growing {
    state: Mutex<GrowingState>,
}

#[derive(Debug)]
struct GrowingState {
    batches: Vec<Arc<Batch>>,
    /// The revision the item is current to.
    revision: i64,
    bytes: usize,
    sealed: bool,
}

impl Growing {
    pub(super) fn new(batch: Arc<Batch>, revision: i64) -> Arc<Growing> {
        Arc::new(Growing {
            state: Mutex::new(GrowingState {
                bytes: batch.bytes,
                batches: vec![batch],
                revision,
                sealed: false,
            }),
        })
    }

    /// Adds `batch`, of revision `revision`, unless the item is sealed or would pass
    /// [`GROWING_BYTES`]; whether it did.
    pub(super) fn add(&self, batch: &Arc<Batch>, revision: i64) -> bool {
        let mut st = self.state.lock();
        if st.sealed || st.bytes + batch.bytes > GROWING_BYTES {
            return false;
        }
        st.bytes += batch.bytes;
        st.batches.push(batch.clone());
        st.revision = revision;
        true
    }

    /// The bytes it holds.
    fn bytes(&self) -> usize {
        self.state.lock().bytes
    }

    /// Nothing is added after this; the bytes it holds.
    fn seal(&self) -> usize {
        let mut st = self.state.lock();
        st.sealed = true;
        st.bytes
    }

    /// The consumer takes the batches and the revision they reach.
    pub(super) fn take(&self) -> (Vec<Arc<Batch>>, i64) {
        let mut st = self.state.lock();
        st.sealed = true;
        (std::mem::take(&mut st.batches), st.revision)
    }
}

/// A response waiting in a stream's queue; turned into a [`WatchResponse`] by the consumer.
#[derive(Debug)]
pub(crate) enum Item {
    /// The events of `batches` at or after `from_rev` that the watcher wants.
    Events {
        spec: Arc<Spec>,
        batches: Vec<Arc<Batch>>,
        from_rev: i64,
        revision: i64,
    },
    /// The events of a [`Growing`] item at or after `from_rev` that the watcher wants.
    Growing {
        spec: Arc<Spec>,
        growing: Arc<Growing>,
        from_rev: i64,
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
    /// The bytes of keys and values it holds, which its queue counts.
    pub(super) fn bytes(&self) -> usize {
        match self {
            Item::Events { batches, .. } => batches.iter().map(|b| b.bytes).sum(),
            Item::Growing { growing, .. } => growing.bytes(),
            _ => 0,
        }
    }

    /// Leaves its queue: a growing item takes nothing more. The bytes it holds.
    pub(super) fn leave(&self) -> usize {
        match self {
            Item::Growing { growing, .. } => growing.seal(),
            _ => self.bytes(),
        }
    }
}
