//! The free set of a database plus the pages recent commits freed, pending until no reader can
//! see them.

use std::collections::BTreeMap;

use crate::page::{PageId, TxId};

use super::set::{new_set, FreeSet, FreelistKind, Run};

/// The free set plus the pages freed by recent commits.
#[derive(Debug)]
pub(crate) struct Freelist {
    set: Box<dyn FreeSet>,
    pending: BTreeMap<TxId, Vec<Run>>,
    pending_count: u64,
}

impl Freelist {
    pub fn new(kind: FreelistKind, runs: &[Run]) -> Self {
        let mut set = new_set(kind);
        set.release(runs);
        Freelist {
            set,
            pending: BTreeMap::new(),
            pending_count: 0,
        }
    }

    pub fn allocate(&mut self, n: u64) -> Option<PageId> {
        self.set.allocate(n)
    }

    /// Returns pages that were allocated but never became visible to anyone.
    pub fn unallocate(&mut self, run: Run) {
        self.set.release(&[run]);
    }

    /// Records pages that commit `txid` stopped using.
    pub fn free(&mut self, txid: TxId, runs: Vec<Run>) {
        if runs.is_empty() {
            return;
        }
        self.pending_count += runs.iter().map(|r| r.1).sum::<u64>();
        self.pending.entry(txid).or_default().extend(runs);
    }

    /// Forgets what commit `txid` freed (it failed).
    pub fn rollback(&mut self, txid: TxId) {
        if let Some(runs) = self.pending.remove(&txid) {
            self.pending_count -= runs.iter().map(|r| r.1).sum::<u64>();
        }
    }

    /// Makes the pages freed by commits up to and including `txid` allocatable.
    pub fn release_upto(&mut self, txid: TxId) {
        while let Some(entry) = self.pending.first_entry() {
            if *entry.key() > txid {
                break;
            }
            let runs = entry.remove();
            self.pending_count -= runs.iter().map(|r| r.1).sum::<u64>();
            self.set.release(&runs);
        }
    }

    pub fn free_count(&self) -> u64 {
        self.set.count()
    }

    pub fn pending_count(&self) -> u64 {
        self.pending_count
    }

    pub fn free_runs(&self) -> Vec<Run> {
        self.set.runs()
    }

    /// Every page that is free or pending, sorted: what a reopen may treat as free.
    pub fn all_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> =
            Vec::with_capacity((self.set.count() + self.pending_count) as usize);
        let runs = self
            .set
            .runs()
            .into_iter()
            .chain(self.pending.values().flatten().copied());
        for (start, len) in runs {
            ids.extend(start.0..start.0 + len);
        }
        ids.sort_unstable();
        ids
    }

    pub fn pending_runs(&self) -> impl Iterator<Item = (TxId, Run)> + '_ {
        self.pending
            .iter()
            .flat_map(|(t, runs)| runs.iter().map(move |r| (*t, *r)))
    }
}
