//! The watch thread: unsynced watchers caught up from the ring or from the store's history,
//! read from a snapshot with no lock writers need.

use std::collections::HashMap;
use std::sync::Weak;
use std::time::Duration;

use prost::Message;

use api::mvccpb::{event::EventType, Event, KeyValue};

use super::event::{event_key, event_rev, Batch, Item};
use super::group::Group;
use crate::error::{Error, Result};
use crate::store::{Inner, Reader};

/// Unsynced watchers one catch-up round serves.
pub(super) const WATCHERS_PER_ROUND: usize = 1024;
/// Stored entries one catch-up round reads at most (rounded up to a whole revision).
pub(super) const ENTRIES_PER_ROUND: usize = 10_000;
/// How often the watch thread retries watchers it could not serve (etcd: 100 ms).
pub(super) const SYNC_INTERVAL: Duration = Duration::from_millis(100);

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
pub(super) fn sync_round(inner: &Inner) -> Result<bool> {
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
            if w.queue.push(item, false).is_some() {
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
            let item = Item::events(w.spec.clone(), vec![batch.clone()], from, snap_rev);
            if w.queue.push(item, false).is_none() {
                continue;
            }
            w.growing = None;
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
pub(super) fn read_history(
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
