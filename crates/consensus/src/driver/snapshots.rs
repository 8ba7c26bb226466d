//! Snapshots: installing one from the leader, recording one where the state machine is
//! durable (and compacting the log behind it), offering a spooled one to followers.

use raft::eraftpb::Snapshot;

use crate::apply::ApplyTask;
use crate::member::Members;
use crate::node::Result;
use crate::snap::SnapMeta;
use crate::wal::SnapshotMark;
use ids::RaftIndex;

use super::open::Driver;

impl<O: Send + 'static> Driver<O> {
    /// A snapshot from the leader, in a Ready: record it, then restore the state machine.
    pub(super) fn install_snapshot(&mut self, snap: Snapshot) -> Result<()> {
        let meta = snap.get_metadata().clone();
        let members = Members::decode(&snap.data).unwrap_or_else(|e| {
            tracing::error!("snapshot {}: {e}; keeping the member list", meta.index);
            self.members().clone()
        });
        let cs = meta.get_conf_state().clone();
        self.shared.snapshotter.save(&SnapMeta {
            index: meta.index,
            term: meta.term,
            conf_state: cs.clone(),
            members: members.clone(),
        })?;
        fail::fail_point!("raft_snapshot_save");
        self.wal.save_snapshot(SnapshotMark {
            index: RaftIndex(meta.index),
            term: meta.term,
        })?;
        self.raw.mut_store().apply_snapshot(&meta);
        self.set_members(meta.index, cs, members);
        let last = self.history.len() - 1;
        self.history.drain(..last);
        self.snapshot_index = meta.index;
        tracing::info!(
            index = meta.index,
            term = meta.term,
            "installing the leader's snapshot"
        );
        self.apply.send(ApplyTask::Restore {
            index: meta.index,
            term: meta.term,
        })
    }

    /// The state machine is durable up to `index`: record a snapshot there and drop the log
    /// behind it (keeping some entries in memory for followers that are a little behind).
    pub(super) fn record_snapshot(&mut self, index: u64) -> Result<()> {
        let Some(term) = self.raw.store().term_of(index) else {
            tracing::warn!(index, "no term for the snapshot index; skipped");
            return Ok(());
        };
        let Some((conf_state, members)) = self.conf_at(index) else {
            tracing::warn!(
                index,
                "no configuration known at the snapshot index; skipped"
            );
            return Ok(());
        };
        self.shared.snapshotter.save(&SnapMeta {
            index,
            term,
            conf_state,
            members,
        })?;
        fail::fail_point!("raft_snapshot_save");
        self.wal.save_snapshot(SnapshotMark {
            index: RaftIndex(index),
            term,
        })?;
        let keep_from = index.saturating_sub(self.cfg.snapshot_catchup_entries);
        self.raw.mut_store().compact(keep_from);
        let purged = self.wal.purge(RaftIndex(index), self.cfg.max_wals)?;
        let wals = purged.len();
        if !purged.is_empty() {
            // Off this thread: the deletes would hold every proposal and commit up.
            let removed = std::thread::Builder::new()
                .name("wal-purge".into())
                .spawn(move || {
                    if let Err(e) = purged.remove() {
                        tracing::warn!("cannot delete purged WAL segments: {e}");
                    }
                });
            if let Err(e) = removed {
                tracing::warn!("cannot start a thread to delete purged WAL segments: {e}");
            }
        }
        let prepared = self.raw.store().prepared_index();
        let snaps = self
            .shared
            .snapshotter
            .purge(self.cfg.max_snapshots, (prepared > 0).then_some(prepared))?;
        self.purge_received(index);
        // Keep the last configuration at or before the snapshot and every later one.
        let first = self.history.iter().rposition(|h| h.0 <= index).unwrap_or(0);
        self.history.drain(..first);
        self.snapshot_index = index;
        tracing::info!(index, term, wals, snaps, "snapshot saved; log compacted");
        Ok(())
    }

    /// Deletes snapshot data received for positions before `index` (the state machine is
    /// durable at `index`, so anything older was restored already or refused by raft as stale;
    /// a restore still queued is always for a later position).
    pub(super) fn purge_received(&self, index: u64) {
        if let Err(e) = self.shared.snapshotter.purge_received(index) {
            tracing::warn!("cannot purge received snapshots: {e}");
        }
    }

    /// The state machine's data at `index` is spooled: offer it to followers.
    pub(super) fn prepare_snapshot(&mut self, index: Option<u64>) {
        self.spooling = false;
        let Some(index) = index else { return };
        if !self.shared.snapshotter.spool_path(index).exists() {
            // Purged by a snapshot recorded before this news arrived: raft-rs asks again.
            tracing::warn!(index, "spooled snapshot data is gone; another will be made");
            return;
        }
        let (Some(term), Some((cs, members))) =
            (self.raw.store().term_of(index), self.conf_at(index))
        else {
            tracing::warn!(
                index,
                "spooled snapshot is behind the log; another will be made"
            );
            return;
        };
        let mut snap = Snapshot::default();
        let meta = snap.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(cs);
        snap.data = SnapMeta::envelope(&members).into();
        self.raw.mut_store().set_prepared(snap);
        if let Err(e) = self
            .shared
            .snapshotter
            .purge(self.cfg.max_snapshots, Some(index))
        {
            tracing::warn!("cannot purge old snapshots: {e}");
        }
    }
}
