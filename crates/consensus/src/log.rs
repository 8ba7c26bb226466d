//! The raft log in memory, as raft-rs reads it (its `Storage`): the entries after the last
//! compaction point (on a sole voter, after the last applied one), the hard state, and the
//! snapshot offered to followers that are too far behind. The WAL holds the same on disk; only
//! the raft thread touches this.

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
    /// The terms of entries a sole voter dropped once applied ([`LogStore::trim`]) that no
    /// snapshot covers yet: (first index, term) of each run of one term, oldest first. The next
    /// snapshot is recorded at one of them and needs its term.
    trimmed: Vec<(u64, u64)>,
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
        self.trimmed.clear();
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
        if index <= self.offset {
            // Trimmed past it already: forget the terms the snapshot now covers.
            let covered = self.runs_through(index);
            self.trimmed.drain(..covered.saturating_sub(1));
            if let Some(first) = self.trimmed.first_mut() {
                first.0 = first.0.max(index);
            }
            return;
        }
        if index > self.last() {
            return;
        }
        self.trimmed.clear();
        self.drop_through(index);
    }

    /// Drops the entries up to `applied`, keeping their terms for the next snapshot: a sole
    /// voter's log in memory serves no follower, and held until a snapshot it was most of a
    /// busy member's heap (up to `snapshot_count` + `snapshot_catchup_entries` entries). A
    /// member added later catches up by snapshot.
    pub(crate) fn trim(&mut self, applied: u64) {
        if applied <= self.offset || applied > self.last() {
            return;
        }
        for e in &self.entries[..(applied - self.offset) as usize] {
            if self.trimmed.last().is_none_or(|r| r.1 != e.term) {
                self.trimmed.push((e.index, e.term));
            }
        }
        self.drop_through(applied);
    }

    /// How many of the trimmed entries' term runs start at or before `index` (the last of them
    /// holds it).
    fn runs_through(&self, index: u64) -> usize {
        self.trimmed.partition_point(|r| r.0 <= index)
    }

    /// Drops the held entries up to `index` (`offset < index <= last`).
    fn drop_through(&mut self, index: u64) {
        let n = (index - self.offset) as usize;
        self.offset_term = self.entries[n - 1].term;
        self.offset = index;
        self.entries.drain(..n);
    }

    pub(crate) fn term_of(&self, idx: u64) -> Option<u64> {
        if idx == self.offset {
            return Some(self.offset_term);
        }
        if idx < self.offset {
            // A trimmed entry: the run it falls in, if one still covers it.
            return self
                .runs_through(idx)
                .checked_sub(1)
                .map(|i| self.trimmed[i].1);
        }
        if idx > self.last() {
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

    /// A sole voter's applied entries go, their terms stay for the snapshot recorded at one of
    /// them, and raft-rs sees them as compacted.
    #[test]
    fn trimmed_entries_keep_their_terms_until_a_snapshot_covers_them() {
        let mut s = LogStore::new(5, 2, ConfState::default(), HardState::default());
        s.append(
            (6..=8)
                .map(|i| e(i, 2))
                .chain((9..=12).map(|i| e(i, 3)))
                .collect(),
        );
        s.trim(10);
        assert_eq!((s.first(), s.last()), (11, 12));
        assert!(
            s.term(9).is_err(),
            "raft-rs sees a trimmed entry as compacted"
        );
        let terms: Vec<_> = (5..=12).map(|i| s.term_of(i)).collect();
        let want = [
            None,
            Some(2),
            Some(2),
            Some(2),
            Some(3),
            Some(3),
            Some(3),
            Some(3),
        ];
        assert_eq!(terms, want);
        // Trimming again continues the last run; nothing is trimmed past the log's end.
        s.trim(11);
        s.trim(20);
        assert_eq!(
            (s.first(), s.term_of(11), s.term_of(7)),
            (12, Some(3), Some(2))
        );
        // A snapshot that keeps the log from 8 on: their terms are still asked for.
        s.compact(8);
        assert_eq!(
            (s.term_of(7), s.term_of(8), s.term_of(9)),
            (None, Some(2), Some(3))
        );
        s.compact(10);
        assert_eq!(
            (s.term_of(9), s.term_of(10), s.term_of(11)),
            (None, Some(3), Some(3))
        );
        // Compacting past the trimmed point forgets them all.
        s.compact(12);
        assert_eq!(
            (s.first(), s.term_of(11), s.term_of(12)),
            (13, None, Some(3))
        );
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
