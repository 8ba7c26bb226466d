//! HashKV: a CRC-32C over the stored history up to a revision, computed exactly as etcd does, so
//! members (and a kvd member next to an etcd one) holding the same history agree. As etcd's,
//! a compaction hashes the history it walks over, and HashKV at one of the last ten compaction
//! revisions answers that hash (what etcd's compaction hash check compares), until a restart.

use ids::Revision;

use crate::error::{Error, Result};
use crate::store::{Store, KEY_BUCKET};

/// The answer to HashKV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvHash {
    pub hash: u32,
    /// The compaction revision the hash starts after.
    pub compact_revision: Revision,
    /// The revision the hash covers up to.
    pub hash_revision: Revision,
    /// The store's current revision.
    pub current: Revision,
}

/// The hashes of the last compactions (etcd's `hashStorage`, which keeps ten).
#[derive(Debug, Default)]
pub(crate) struct CompactionHashes(Vec<KvHash>);

impl CompactionHashes {
    const KEPT: usize = 10;

    pub(crate) fn keep(&mut self, h: KvHash) {
        self.0.push(h);
        self.0.sort_by_key(|h| h.hash_revision);
        if self.0.len() > Self::KEPT {
            self.0.remove(0);
        }
    }
}

impl Store {
    /// Hashes the history up to `rev` (0 = the current revision): every stored revision in
    /// (compacted, rev], plus those at or below the compaction revision that compaction keeps.
    /// At the revision of one of the last compactions, that compaction's hash.
    pub fn hash_kv(&self, rev: Revision) -> Result<KvHash> {
        let snap = self.read()?;
        let current = snap.rev().0;
        let kept = self
            .inner
            .hashes
            .lock()
            .0
            .iter()
            .copied()
            .find(|h| h.hash_revision == rev);
        if let Some(h) = kept {
            return Ok(KvHash {
                current: Revision(current),
                ..h
            });
        }
        let rev = rev.0;
        let (compacted, keep, kept, rev) = {
            let ix = self.inner.index.read();
            let compacted = ix.compacted();
            if rev > 0 && rev < compacted {
                return Err(Error::Compacted);
            }
            if rev > current {
                return Err(Error::FutureRev);
            }
            let rev = if rev <= 0 { current } else { rev };
            let (keep, kept) = ix.hash_keeps(rev);
            (compacted, keep, kept, rev)
        };
        let mut h = crc32c::crc32c(KEY_BUCKET);
        snap.reader
            .for_each_entry(&self.inner.path, 0, rev, |r, tombstone, v| {
                // Revisions the compaction deletes count as deleted, finished or not.
                if r.main <= compacted && !kept.contains(&r) {
                    return true;
                }
                // Of the rest at or below it, etcd's Keep; all of them if it keeps none.
                if r.main <= compacted && !keep.is_empty() && !keep.contains(&r) {
                    return true;
                }
                // Some etcd versions delete a tombstone at the compaction revision, others keep it.
                if r.main == compacted && tombstone {
                    return true;
                }
                h = crc32c::crc32c_append(h, r.to_key(tombstone).as_bytes());
                h = crc32c::crc32c_append(h, v);
                true
            })?;
        Ok(KvHash {
            hash: h,
            compact_revision: Revision(compacted),
            hash_revision: Revision(rev),
            current: Revision(current),
        })
    }
}
