//! bbolt's original freelist: a sorted array of free page ids.

use super::{FreeSet, Run};
use crate::page::PageId;

/// Sorted free ids. Allocating a run of n scans from the start for n consecutive ids (O(free
/// pages)); releasing sorts the new ids and merges them into a new array (O(free pages)).
#[derive(Debug, Default, Clone)]
pub struct Array {
    ids: Vec<u64>,
}

impl FreeSet for Array {
    fn allocate(&mut self, n: u64) -> Option<PageId> {
        if n == 0 {
            return None;
        }
        let (mut initial, mut prev) = (0u64, 0u64);
        for (i, &id) in self.ids.iter().enumerate() {
            if prev == 0 || id - prev != 1 {
                initial = id;
            }
            if id - initial + 1 == n {
                let first = i + 1 - n as usize;
                self.ids.drain(first..=i);
                return Some(PageId(initial));
            }
            prev = id;
        }
        None
    }

    fn release(&mut self, runs: &[Run]) {
        let mut new: Vec<u64> = runs.iter().flat_map(|&(s, n)| s.0..s.0 + n).collect();
        if new.is_empty() {
            return;
        }
        new.sort_unstable();
        // Merge into a fresh array, as bbolt's mergepgids does.
        let mut merged = Vec::with_capacity(self.ids.len() + new.len());
        let (mut a, mut b) = (self.ids.iter().peekable(), new.iter().peekable());
        while let (Some(&&x), Some(&&y)) = (a.peek(), b.peek()) {
            debug_assert_ne!(x, y, "page {x} freed twice");
            if x < y {
                merged.push(x);
                a.next();
            } else {
                merged.push(y);
                b.next();
            }
        }
        merged.extend(a);
        merged.extend(b);
        self.ids = merged;
    }

    fn count(&self) -> u64 {
        self.ids.len() as u64
    }

    fn runs(&self) -> Vec<Run> {
        super::runs_of(&self.ids)
    }
}
