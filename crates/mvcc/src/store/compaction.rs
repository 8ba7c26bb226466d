//! The physical part of a compaction, in bounded steps, each inside a flush: first the index is
//! pruned (noting the revisions still needed), then the `key` bucket loses the rest.

use std::collections::HashSet;

use super::layout::{corrupt, KEY_BUCKET};
use super::open::Inner;
use crate::error::Result;
use crate::hash::KvHash;
use crate::revision::Rev;
use ids::Revision;

/// Keys whose index entries one compaction step prunes.
pub(super) const INDEX_COMPACT_CHUNK: usize = 10_000;

/// A compaction whose physical part is under way.
#[derive(Debug)]
pub(super) struct CompactJob {
    pub(super) target: i64,
    /// The compaction revision before this one (-1: none).
    prev: i64,
    pub(super) keep: HashSet<Rev>,
    pub(super) phase: Phase,
    /// etcd's compaction hash of the revisions visited so far.
    hash: u32,
}

#[derive(Debug)]
pub(super) enum Phase {
    /// Pruning the index from this key on.
    Index(Vec<u8>),
    /// Deleting unkept revisions <= target from this revision key on.
    Delete(Vec<u8>),
}

impl CompactJob {
    pub(super) fn new(target: i64, prev: i64) -> CompactJob {
        CompactJob {
            target,
            prev,
            keep: HashSet::new(),
            phase: Phase::Index(Vec::new()),
            hash: crc32c::crc32c(KEY_BUCKET),
        }
    }

    /// What etcd's compaction hashes of a revision it walks over (`kvHasher.WriteKeyValue`
    /// with the previous compaction revision and the revisions this one keeps): everything
    /// after the previous compaction, what it kept before, never a tombstone at it.
    fn hash_entry(&mut self, r: Rev, tombstone: bool, k: &[u8], v: &[u8]) {
        if r.main <= self.prev && !self.keep.is_empty() && !self.keep.contains(&r) {
            return;
        }
        if r.main == self.prev && tombstone {
            return;
        }
        self.hash = crc32c::crc32c_append(self.hash, k);
        self.hash = crc32c::crc32c_append(self.hash, v);
    }

    /// The finished compaction's hash, as etcd keeps it: of the history up to the compaction
    /// revision as it was before, starting after the previous compaction.
    pub(super) fn hash(&self) -> KvHash {
        KvHash {
            hash: self.hash,
            compact_revision: Revision(self.prev),
            hash_revision: Revision(self.target),
            current: Revision(self.target),
        }
    }
}

impl Inner {
    /// One bounded step of a compaction; true when it is complete.
    pub(super) fn compact_step(
        &self,
        j: &mut CompactJob,
        tx: &mut pager::WriteTxn<'_>,
    ) -> Result<bool> {
        match &mut j.phase {
            Phase::Index(from) => {
                let next = self.index.write().compact_chunk(
                    j.target,
                    from,
                    INDEX_COMPACT_CHUNK,
                    &mut j.keep,
                );
                j.phase = match next {
                    Some(k) => Phase::Index(k),
                    None => Phase::Delete(Rev::new(0, 0).to_key(false).as_bytes().to_vec()),
                };
                Ok(false)
            }
            Phase::Delete(from) => {
                let end = Rev::new(j.target + 1, 0).to_key(false);
                let mut keys = tx.bucket(KEY_BUCKET)?;
                let mut doomed = Vec::new();
                let mut last = None;
                let from = from.clone();
                for (seen, e) in keys.range(from.as_slice()..end.as_bytes()).enumerate() {
                    let (k, v) = e?;
                    if seen == self.opts.compaction_batch {
                        last = Some(k.to_vec());
                        break;
                    }
                    let (r, tombstone) = Rev::from_key(k).ok_or_else(|| {
                        corrupt(
                            &self.path,
                            format!("key bucket entry {k:?} is not a revision"),
                        )
                    })?;
                    if !j.keep.contains(&r) {
                        doomed.push(k.to_vec());
                    }
                    j.hash_entry(r, tombstone, k, v);
                }
                for k in &doomed {
                    keys.delete(k)?;
                }
                match last {
                    Some(k) => {
                        j.phase = Phase::Delete(k);
                        Ok(false)
                    }
                    None => Ok(true),
                }
            }
        }
    }
}
