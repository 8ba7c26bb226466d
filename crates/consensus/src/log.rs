//! The raft log in memory, as raft-rs reads it (its `Storage`): the entries after the last
//! compaction point, the hard state, and the snapshot offered to followers that are too far
//! behind. The WAL holds the same on disk; only the raft thread touches this.

use std::cell::Cell;

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, StorageError};

#[derive(Debug, Default)]
pub(crate) struct LogStore {
    hard_state: HardState,
    /// The configuration at the compaction point (raft-rs reads it once, at start).
    conf_state: ConfState,
    /// Index and term of the entry just before `entries[0]` (the snapshot or compaction point).
    offset: u64,
    offset_term: u64,
    entries: Vec<Entry>,
    /// The snapshot offered to followers (metadata and the member list; the state machine's data
    /// travels beside it), if one is prepared.
    prepared: Option<Snapshot>,
    /// raft-rs asked for a snapshot newer than the prepared one.
    wanted: Cell<Option<u64>>,
}

impl LogStore {
    /// A log starting after a snapshot at (`index`, `term`) holding `conf_state`.
    pub(crate) fn new(index: u64, term: u64, conf_state: ConfState, hs: HardState) -> Self {
        LogStore {
            hard_state: hs,
            conf_state,
            offset: index,
            offset_term: term,
            ..Default::default()
        }
    }

    pub(crate) fn last(&self) -> u64 {
        self.offset + self.entries.len() as u64
    }

    pub(crate) fn first(&self) -> u64 {
        self.offset + 1
    }

    pub(crate) fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    pub(crate) fn set_hard_state(&mut self, hs: HardState) {
        self.hard_state = hs;
    }

    pub(crate) fn set_commit(&mut self, commit: u64) {
        self.hard_state.commit = commit;
    }

    /// Appends entries, replacing any at or after the first one's index.
    pub(crate) fn append(&mut self, entries: Vec<Entry>) {
        let Some(first) = entries.first() else { return };
        if first.index <= self.offset {
            // raft-rs never sends entries behind its own snapshot; drop what is compacted.
            let skip = (self.offset + 1 - first.index) as usize;
            let rest: Vec<Entry> = entries.into_iter().skip(skip).collect();
            self.entries.clear();
            self.entries.extend(rest);
            return;
        }
        let keep = (first.index - self.offset - 1) as usize;
        self.entries.truncate(keep);
        self.entries.extend(entries);
    }

    /// Replaces the log with a snapshot's position.
    pub(crate) fn apply_snapshot(&mut self, meta: &SnapshotMetadata) {
        self.offset = meta.index;
        self.offset_term = meta.term;
        self.entries.clear();
        self.conf_state = meta.get_conf_state().clone();
        if self.hard_state.commit < meta.index {
            self.hard_state.commit = meta.index;
        }
        if self.hard_state.term < meta.term {
            self.hard_state.term = meta.term;
        }
    }

    /// Drops the entries up to `index` (they live in a snapshot now).
    pub(crate) fn compact(&mut self, index: u64) {
        if index <= self.offset || index > self.last() {
            return;
        }
        let n = (index - self.offset) as usize;
        self.offset_term = self.entries[n - 1].term;
        self.offset = index;
        self.entries.drain(..n);
    }

    pub(crate) fn term_of(&self, idx: u64) -> Option<u64> {
        if idx == self.offset {
            return Some(self.offset_term);
        }
        if idx < self.offset || idx > self.last() {
            return None;
        }
        Some(self.entries[(idx - self.offset - 1) as usize].term)
    }

    /// Entries in `[low, high)` that are still held.
    pub(crate) fn slice(&self, low: u64, high: u64) -> &[Entry] {
        let low = low.max(self.offset + 1);
        let high = high.min(self.last() + 1);
        if low >= high {
            return &[];
        }
        &self.entries[(low - self.offset - 1) as usize..(high - self.offset - 1) as usize]
    }

    pub(crate) fn set_prepared(&mut self, snap: Snapshot) {
        self.prepared = Some(snap);
        self.wanted.set(None);
    }

    /// Forgets the prepared snapshot (its data is gone): the next one raft-rs asks for is made
    /// anew.
    pub(crate) fn clear_prepared(&mut self) {
        self.prepared = None;
    }

    pub(crate) fn prepared_index(&self) -> u64 {
        self.prepared.as_ref().map_or(0, |s| s.get_metadata().index)
    }

    /// The index raft-rs wanted a snapshot at (at least), once; the caller prepares one.
    pub(crate) fn take_wanted(&self) -> Option<u64> {
        self.wanted.take()
    }
}

impl raft::Storage for LogStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState {
            hard_state: self.hard_state.clone(),
            conf_state: self.conf_state.clone(),
        })
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low <= self.offset {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last() + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let mut out = self.slice(low, high).to_vec();
        raft::util::limit_size(&mut out, max_size.into());
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx < self.offset {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        self.term_of(idx)
            .ok_or(raft::Error::Store(StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        match &self.prepared {
            // Only a snapshot the log continues from (the follower needs the entries after
            // it) and whose configuration holds the follower: raft-rs ignores one that does
            // not, so a member added after it was made would be sent it again and again, and
            // never catch up. One made now holds it: raft-rs sends to a member only once its
            // addition is applied.
            Some(s)
                if s.get_metadata().index >= request_index.max(self.offset)
                    && holds(s.get_metadata().get_conf_state(), to) =>
            {
                Ok(s.clone())
            }
            _ => {
                let want = self.wanted.get().unwrap_or(0).max(request_index);
                self.wanted.set(Some(want));
                Err(raft::Error::Store(
                    StorageError::SnapshotTemporarilyUnavailable,
                ))
            }
        }
    }
}

/// Whether member `id` is in configuration `cs`, as a voter or a learner, now or joint.
fn holds(cs: &ConfState, id: u64) -> bool {
    [
        &cs.voters,
        &cs.learners,
        &cs.voters_outgoing,
        &cs.learners_next,
    ]
    .iter()
    .any(|set| set.contains(&id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::Storage;

    fn e(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            ..Default::default()
        }
    }

    #[test]
    fn append_overwrites_compacts_and_answers_like_raft_expects() {
        let mut s = LogStore::new(5, 2, ConfState::default(), HardState::default());
        assert_eq!((s.first(), s.last()), (6, 5));
        s.append((6..=10).map(|i| e(i, 2)).collect());
        s.append(vec![e(8, 3), e(9, 3)]);
        assert_eq!(s.last(), 9);
        assert_eq!(s.term(8).unwrap(), 3);
        assert_eq!(s.term(5).unwrap(), 2);
        assert!(s.term(4).is_err() && s.term(10).is_err());
        s.compact(7);
        assert_eq!((s.first(), s.term(7).unwrap()), (8, 2));
        let got = s.entries(8, 10, None, GetEntriesContext::empty(false));
        assert_eq!(got.unwrap().len(), 2);
        assert!(s
            .entries(7, 9, None, GetEntriesContext::empty(false))
            .is_err());
        assert!(s
            .entries(8, 12, None, GetEntriesContext::empty(false))
            .is_err());
        assert!(s.snapshot(9, 2).is_err());
        assert_eq!(s.take_wanted(), Some(9));
        assert_eq!(s.take_wanted(), None);
    }

    /// A member added after the prepared snapshot was made is not offered it (raft-rs would
    /// ignore it): another is asked for.
    #[test]
    fn a_snapshot_is_offered_only_to_members_it_holds() {
        let mut s = LogStore::new(5, 2, ConfState::default(), HardState::default());
        s.append((6..=10).map(|i| e(i, 2)).collect());
        let mut snap = Snapshot::default();
        snap.mut_metadata().index = 8;
        snap.mut_metadata().term = 2;
        snap.mut_metadata().mut_conf_state().voters = vec![1, 2, 3];
        snap.mut_metadata().mut_conf_state().learners = vec![4];
        s.set_prepared(snap);
        for held in [2, 4] {
            assert_eq!(s.snapshot(0, held).unwrap().get_metadata().index, 8);
        }
        assert_eq!(s.take_wanted(), None);
        assert!(s.snapshot(0, 5).is_err());
        assert_eq!(s.take_wanted(), Some(0));
    }
}
