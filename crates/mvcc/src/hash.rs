//! HashKV: a CRC-32C over the stored history up to a revision, computed exactly as etcd does, so
//! members (and a kvd member next to an etcd one) holding the same history agree.

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

impl Store {
    /// Hashes the history up to `rev` (0 = the current revision): every stored revision in
    /// (compacted, rev], plus those at or below the compaction revision that compaction keeps.
    pub fn hash_kv(&self, rev: Revision) -> Result<KvHash> {
        let rev = rev.0;
        let snap = self.read()?;
        let current = snap.rev().0;
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
