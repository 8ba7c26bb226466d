//! The physical part of a compaction, in bounded steps, each inside a flush: first the index is
//! pruned (noting the revisions still needed), then the `key` bucket loses the rest.

use std::collections::HashSet;

use super::layout::{corrupt, KEY_BUCKET};
use super::open::Inner;
use crate::error::Result;
use crate::revision::Rev;

/// Keys whose index entries one compaction step prunes.
pub(super) const INDEX_COMPACT_CHUNK: usize = 10_000;

/// A compaction whose physical part is under way.
#[derive(Debug)]
pub(super) struct CompactJob {
    pub(super) target: i64,
    pub(super) keep: HashSet<Rev>,
    pub(super) phase: Phase,
}

#[derive(Debug)]
pub(super) enum Phase {
    /// Pruning the index from this key on.
    Index(Vec<u8>),
    /// Deleting unkept revisions <= target from this revision key on.
    Delete(Vec<u8>),
}

impl CompactJob {
    pub(super) fn new(target: i64) -> CompactJob {
        CompactJob {
            target,
            keep: HashSet::new(),
            phase: Phase::Index(Vec::new()),
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
                for (seen, e) in keys.range(from.as_slice()..end.as_bytes()).enumerate() {
                    let (k, _) = e?;
                    if seen == self.opts.compaction_batch {
                        last = Some(k.to_vec());
                        break;
                    }
                    let (r, _) = Rev::from_key(k).ok_or_else(|| {
                        corrupt(
                            &self.path,
                            format!("key bucket entry {k:?} is not a revision"),
                        )
                    })?;
                    if !j.keep.contains(&r) {
                        doomed.push(k.to_vec());
                    }
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
