//! What watchers are sent: a watcher's request, the event batches of a revision shared by every
//! watcher that wants them, and the items queued on a stream.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

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

/// Keys and values one events item holds at most while it grows (see [`Item::Events`]) before
/// the watcher's next revisions go in an item of their own.
pub(super) const GROWING_BYTES: usize = 1 << 20;

/// A response waiting in a stream's queue; turned into a [`WatchResponse`] by the consumer.
#[derive(Debug)]
pub(crate) enum Item {
    /// The events of `batches` at or after `from_rev` that the watcher wants; `bytes`, the
    /// batches' keys and values, which the queue counts.
    ///
    /// While it is in its queue the writer may add the watcher's next revisions' batches to it
    /// instead of queueing another item (the watcher remembers its place in the queue,
    /// [`super::stream::Queue::grow`]), so a consumer that keeps up gets one revision per
    /// response and one that falls behind gets each watcher's pending revisions in one
    /// response (etcd batches a watcher that fell behind the same way): the client handles a
    /// fraction of the messages for the same events. It grows only under its queue's lock,
    /// which the consumer holds to take it.
    Events {
        spec: Arc<Spec>,
        batches: Vec<Arc<Batch>>,
        from_rev: i64,
        revision: i64,
        bytes: usize,
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
    /// The events of `batches` at or after `from_rev`, current to `revision`.
    pub(super) fn events(
        spec: Arc<Spec>,
        batches: Vec<Arc<Batch>>,
        from_rev: i64,
        revision: i64,
    ) -> Item {
        let bytes = batches.iter().map(|b| b.bytes).sum();
        Item::Events {
            spec,
            batches,
            from_rev,
            revision,
            bytes,
        }
    }

    /// The bytes of keys and values it holds, which its queue counts.
    pub(super) fn bytes(&self) -> usize {
        match self {
            Item::Events { bytes, .. } => *bytes,
            _ => 0,
        }
    }
}
