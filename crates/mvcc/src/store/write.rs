//! The writer: one at a time, each of its operations one etcd write transaction, appended to
//! the pending batch.

use std::sync::Arc;

use ids::Revision;
use parking_lot::MutexGuard;

use super::open::{Applied, Inner, Store};
use super::pending::Pending;
use crate::error::{Error, Result};
use crate::revision::Rev;

/// The writers' state, behind the writer lock.
#[derive(Debug)]
pub(crate) struct WriteState {
    pub(crate) rev: i64,
    /// The compaction revision (etcd's compactMainRev; -1 before any).
    pub(crate) compacted: i64,
    pub(super) pending: Arc<Pending>,
    pub(super) pending_len: usize,
    pub(super) applied: Applied,
    /// The applied position the pager holds (a flush with nothing else to write still records
    /// a newer one: entries without data advance it too).
    pub(super) persisted: Applied,
    /// A compaction scheduled since the last flush: (its revision, the one before it).
    pub(super) new_compaction: Option<(i64, i64)>,
    pub(super) failed: Option<String>,
}

/// The writer. Dropping it flushes when the pending batch is full.
pub struct Writer<'s> {
    pub(crate) store: &'s Store,
    pub(crate) st: Option<MutexGuard<'s, WriteState>>,
}

impl std::fmt::Debug for Writer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}

impl Writer<'_> {
    pub(crate) fn state(&mut self) -> &mut WriteState {
        self.st
            .as_mut()
            .expect("the writer holds the state until dropped")
    }

    pub(crate) fn inner(&self) -> &Inner {
        &self.store.inner
    }

    /// Records the consensus position the writes so far cover; the next flush persists it with
    /// them.
    pub fn set_applied(&mut self, applied: Applied) {
        self.state().applied = applied;
    }

    /// Appends one stored entry to the pending batch.
    pub(crate) fn append(&mut self, rev: Rev, tombstone: bool, encode: impl FnOnce(&mut Vec<u8>)) {
        let st = self.state();
        let mut e = st.pending.entries.write();
        encode(&mut e.data);
        let end = e.data.len();
        e.revs.push((rev, tombstone, end));
        drop(e);
        st.pending_len += 1;
    }

    /// Stops the store: later writes fail with `msg`.
    pub(crate) fn fail(&mut self, msg: String) {
        tracing::error!("{msg}");
        self.state().failed = Some(msg);
    }

    /// Hands a finished write transaction's revision and events (if it built them) to the
    /// watchers; called in revision order, with the writer held.
    pub(crate) fn notify(&mut self, rev: i64, events: Option<Vec<api::mvccpb::Event>>) {
        self.store.inner.hub.notify(rev, events);
    }

    /// Publishes a finished write transaction's revision to readers.
    pub(crate) fn publish_rev(&mut self, rev: i64) {
        self.state().rev = rev;
        self.store.inner.view.write().rev = rev;
    }

    /// Schedules compaction at `rev`: reads below it fail from now on; the history is removed
    /// in the background, in bounded steps.
    pub fn compact(&mut self, rev: Revision) -> Result<Revision> {
        let rev = rev.0;
        let st = self.state();
        if rev <= st.compacted {
            return Err(Error::Compacted);
        }
        if rev > st.rev {
            return Err(Error::FutureRev);
        }
        let prev = st.compacted;
        st.compacted = rev;
        st.new_compaction = Some((rev, prev));
        let cur = st.rev;
        self.store.inner.index.write().set_compacted(rev);
        Ok(Revision(cur))
    }
}

/// Pending entries, in batches, beyond which writers flush themselves instead of leaving it to
/// the flush thread: backpressure when the disk cannot keep up.
pub(super) const MAX_PENDING_BATCHES: usize = 4;

impl Drop for Writer<'_> {
    fn drop(&mut self) {
        let limit = self.store.inner.opts.batch_limit;
        let pending = self.st.as_ref().map_or(0, |s| s.pending_len);
        self.st = None;
        if pending >= limit.saturating_mul(MAX_PENDING_BATCHES) {
            if let Err(e) = self.store.inner.flush() {
                tracing::error!(error = %e, "flush failed");
            }
        } else if pending >= limit {
            self.store.inner.wake.kick();
        }
    }
}
