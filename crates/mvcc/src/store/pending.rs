//! Writes not yet flushed into the pager: one batch per flush, readable by every view taken
//! while it is pending.

use std::sync::Arc;

use parking_lot::RwLock;

use crate::revision::Rev;

/// Entries written since the last flush, in revision order. All values share one buffer, so a
/// batch costs a few allocations, not one per write.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    pub(super) entries: RwLock<PendingData>,
}

#[derive(Debug, Default)]
pub(super) struct PendingData {
    /// The encoded values, back to back.
    pub(super) data: Vec<u8>,
    /// (revision, tombstone, end of its value in `data`); a value starts where the previous ends.
    pub(super) revs: Vec<(Rev, bool, usize)>,
}

impl PendingData {
    pub(super) fn value(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.revs[i - 1].2 };
        &self.data[start..self.revs[i].2]
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (Rev, bool, &[u8])> {
        self.revs
            .iter()
            .enumerate()
            .map(|(i, &(r, t, _))| (r, t, self.value(i)))
    }
}

/// The most a new batch reserves up front, for its values (and 1/32 of it for its revisions).
const MAX_RESERVED: usize = 1 << 20;

impl Pending {
    /// An empty batch with room for what `last` came to hold (up to [`MAX_RESERVED`]): a
    /// steady write rate fills the next one without regrowing (and copying) it write by write.
    pub(super) fn sized_like(last: &Pending) -> Pending {
        let last = last.entries.read();
        let data = last.data.len().min(MAX_RESERVED);
        let revs = last.revs.len().min(MAX_RESERVED / 32);
        Pending {
            entries: RwLock::new(PendingData {
                data: Vec::with_capacity(data),
                revs: Vec::with_capacity(revs),
            }),
        }
    }

    /// The stored bytes of revision `rev` (not a tombstone), if this batch has it.
    pub(super) fn with<T>(&self, rev: Rev, f: impl FnOnce(&[u8]) -> T) -> Option<T> {
        let e = self.entries.read();
        let (first, last) = (e.revs.first()?.0, e.revs.last()?.0);
        if rev < first || rev > last {
            return None;
        }
        let i = e.revs.binary_search_by(|(r, _, _)| r.cmp(&rev)).ok()?;
        Some(f(e.value(i)))
    }
}

/// What readers start from.
#[derive(Debug)]
pub(super) struct View {
    pub(super) rev: i64,
    /// Pending batches not yet in the pager snapshot a new reader gets; the last is the one
    /// writers append to.
    pub(super) pendings: Vec<Arc<Pending>>,
}
