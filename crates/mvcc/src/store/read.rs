//! Reading: consistent views, and the range reads run in them (pending batches first, then
//! the pager snapshot).

use std::path::Path;
use std::sync::Arc;

use prost::Message;

use api::mvccpb::KeyValue;

use super::layout::{corrupt, KEY_BUCKET};
use super::open::Inner;
use super::pending::Pending;
use crate::error::{Error, Result};
use crate::index::KeyRange;
use crate::revision::Rev;
use ids::Revision;

/// The result of a range read at one revision (etcd's `RangeResult`).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RangeResult {
    pub kvs: Vec<KeyValue>,
    /// Keys in the range at the read revision, ignoring the limit.
    pub count: i64,
    /// The revision of the view the read ran in.
    pub rev: Revision,
}

/// Options of a range read.
#[derive(Debug, Default, Clone, Copy)]
pub struct RangeOptions {
    /// At most this many keys (0 = all).
    pub limit: i64,
    /// Read at this revision (<= 0 = the view's).
    pub rev: Revision,
    /// Count only.
    pub count: bool,
    /// Keys only, read from the index alone (etcd 3.7's fast keys-only range): each key with
    /// its revisions and version, no value and no lease.
    pub keys_only: bool,
    /// Stop at the limit: `count` is then the keys returned, not every key in the range.
    pub stop_at_limit: bool,
}

impl Inner {
    pub(crate) fn snapshot(self: &Arc<Self>) -> Result<Snapshot> {
        let (reader, rev) = self.reader()?;
        Ok(Snapshot {
            inner: self.clone(),
            reader,
            rev,
        })
    }

    /// A reader of everything written so far, and the revision it was taken at: both under the
    /// view lock, so the pending batches and the pager snapshot cover every revision up to it.
    pub(crate) fn reader(&self) -> Result<(Reader, i64)> {
        let v = self.view.read();
        let txn = self.db().begin_read()?;
        let reader = Reader {
            pendings: v.pendings.clone(),
            txn,
        };
        Ok((reader, v.rev))
    }
}

/// Reads stored revisions: from the pending batches first, then the pager snapshot.
pub(crate) struct Reader {
    pub(super) pendings: Vec<Arc<Pending>>,
    pub(super) txn: pager::ReadTxn,
}

impl Reader {
    /// The `KeyValue` stored at `rev` (a live revision the index returned).
    pub(crate) fn kv(&self, path: &Path, rev: Rev) -> Result<KeyValue> {
        let decode = |b: &[u8]| {
            KeyValue::decode(b).map_err(|e| corrupt(path, format!("revision {rev:?}: {e}")))
        };
        for p in self.pendings.iter().rev() {
            if let Some(r) = p.with(rev, decode) {
                return r;
            }
        }
        let bucket = self.txn.bucket(KEY_BUCKET)?;
        match bucket.get(rev.to_key(false).as_bytes())? {
            Some(b) => decode(b),
            None => Err(corrupt(
                path,
                format!("revision {rev:?} is in the index but not stored"),
            )),
        }
    }

    /// etcd's rangeKeys: the keys of `range` visible at `ro.rev` in a view at `cur_rev`.
    pub(crate) fn range_keys(
        &self,
        inner: &Inner,
        range: KeyRange<'_>,
        cur_rev: i64,
        ro: RangeOptions,
    ) -> Result<RangeResult> {
        let rev = ro.rev.0;
        if rev > cur_rev {
            return Err(Error::FutureRev);
        }
        let at = if rev <= 0 { cur_rev } else { rev };
        let ix = inner.index.read();
        if at < ix.compacted() {
            return Err(Error::Compacted);
        }
        if ro.count {
            let count = ix.count(range, at) as i64;
            return Ok(RangeResult {
                kvs: Vec::new(),
                count,
                rev: Revision(cur_rev),
            });
        }
        let limit = if ro.limit <= 0 {
            usize::MAX
        } else {
            ro.limit as usize
        };
        let mut found = Vec::new();
        let mut total = 0i64;
        ix.visit(range, at, |k, v| {
            if found.len() < limit {
                found.push((ro.keys_only.then(|| k.to_vec()), v));
            } else if ro.stop_at_limit {
                return false;
            }
            total += 1;
            true
        });
        drop(ix);
        let kvs = found
            .into_iter()
            .map(|(key, v)| match key {
                Some(key) => Ok(KeyValue {
                    key,
                    create_revision: v.created.main,
                    mod_revision: v.modified.main,
                    version: v.version,
                    ..Default::default()
                }),
                None => self.kv(&inner.path, v.modified),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(RangeResult {
            kvs,
            count: total,
            rev: Revision(cur_rev),
        })
    }

    /// Every stored entry (revision, tombstone, value) whose main revision is in `[from, to]`,
    /// in revision order — the pager's, then pending ones — until `f` returns false.
    pub(crate) fn for_each_entry(
        &self,
        path: &Path,
        from: i64,
        to: i64,
        mut f: impl FnMut(Rev, bool, &[u8]) -> bool,
    ) -> Result<()> {
        let lo = Rev::new(from.max(0), 0).to_key(false);
        let hi = Rev::new(to.saturating_add(1), 0).to_key(false);
        let bucket = self.txn.bucket(KEY_BUCKET)?;
        let mut last = None;
        for e in bucket.range(lo.as_bytes()..hi.as_bytes()) {
            let (k, v) = e?;
            let (r, tomb) = Rev::from_key(k).ok_or_else(|| {
                corrupt(path, format!("key bucket entry {k:?} is not a revision"))
            })?;
            if !f(r, tomb, v) {
                return Ok(());
            }
            last = Some(r);
        }
        for p in &self.pendings {
            for (r, tomb, v) in p.entries.read().iter() {
                // Entries the pager snapshot already holds (a flush committed but not yet
                // retired the batch) were seen above.
                if r.main < from || r.main > to || last.is_some_and(|l| r <= l) {
                    continue;
                }
                if !f(r, tomb, v) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

/// A consistent read view at one revision; holding it pins its pager pages, not the writer.
pub struct Snapshot {
    pub(crate) inner: Arc<Inner>,
    pub(crate) reader: Reader,
    pub(crate) rev: i64,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("rev", &self.rev)
            .finish_non_exhaustive()
    }
}

impl Snapshot {
    /// The revision this view reads at.
    pub fn rev(&self) -> Revision {
        Revision(self.rev)
    }

    /// Calls `f` with every stored revision (live, historical or tombstone) in order: what
    /// compaction has not removed yet.
    pub fn for_each_revision(&self, mut f: impl FnMut(Rev)) -> Result<()> {
        self.reader
            .for_each_entry(&self.inner.path, 0, i64::MAX, |r, _, _| {
                f(r);
                true
            })
    }
}
