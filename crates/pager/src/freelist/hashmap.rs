//! The segregated freelist: free runs grouped by length, with maps from each run's first and last
//! page so that freeing merges with both neighbours in O(1).

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use super::{FreeSet, Run};
use crate::page::PageId;

/// A multiplicative hash for page ids: they are dense integers, SipHash's DoS resistance buys
/// nothing here and costs a third of an allocation.
#[derive(Default, Clone, Copy, Debug)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (n ^ (n >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        self.0 ^= self.0 >> 32;
    }
}

type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// Free runs segregated by length.
///
/// - `by_len`: run length → the first pages of the free runs of that length (a vector, so that
///   taking any run is O(1); `at` keeps each run's index in it for O(1) removal).
/// - `start`: first page → (length, index in `by_len[length]`).
/// - `end`: last page → first page.
///
/// Allocating n takes any run of exactly n, else splits the shortest longer run (best fit; the
/// ordered map finds it in O(log distinct lengths)). Releasing a page checks `end[p-1]` and
/// `start[p+n]` to merge with its neighbours.
#[derive(Debug, Default, Clone)]
pub struct Hashmap {
    by_len: BTreeMap<u64, Vec<u64>>,
    start: IdMap<(u64, usize)>,
    end: IdMap<u64>,
    count: u64,
}

impl Hashmap {
    fn insert(&mut self, s: u64, n: u64) {
        let v = self.by_len.entry(n).or_default();
        v.push(s);
        self.start.insert(s, (n, v.len() - 1));
        self.end.insert(s + n - 1, s);
        self.count += n;
    }

    fn remove(&mut self, s: u64) -> u64 {
        let (n, at) = self
            .start
            .remove(&s)
            .expect("removed run is in the start map");
        self.end.remove(&(s + n - 1));
        let v = self.by_len.get_mut(&n).expect("run length is indexed");
        v.swap_remove(at);
        if let Some(&moved) = v.get(at) {
            self.start
                .get_mut(&moved)
                .expect("moved run is in the start map")
                .1 = at;
        }
        if v.is_empty() {
            self.by_len.remove(&n);
        }
        self.count -= n;
        n
    }
}

impl FreeSet for Hashmap {
    fn allocate(&mut self, n: u64) -> Option<PageId> {
        if n == 0 {
            return None;
        }
        if let Some(&s) = self.by_len.get(&n).and_then(|v| v.last()) {
            self.remove(s);
            return Some(PageId(s));
        }
        let (&len, v) = self.by_len.range(n + 1..).next()?;
        let s = *v.last().expect("indexed lengths have runs");
        self.remove(s);
        self.insert(s + n, len - n);
        Some(PageId(s))
    }

    fn release(&mut self, runs: &[Run]) {
        for &(s, n) in runs {
            if n == 0 {
                continue;
            }
            let (mut s, mut n) = (s.0, n);
            debug_assert!(
                !self.start.contains_key(&s) && !self.end.contains_key(&(s + n - 1)),
                "run {s}+{n} freed twice"
            );
            if let Some(&prev) = s.checked_sub(1).and_then(|p| self.end.get(&p)) {
                n += self.remove(prev);
                s = prev;
            }
            if self.start.contains_key(&(s + n)) {
                n += self.remove(s + n);
            }
            self.insert(s, n);
        }
    }

    fn count(&self) -> u64 {
        self.count
    }

    fn runs(&self) -> Vec<Run> {
        let mut r: Vec<Run> = self
            .start
            .iter()
            .map(|(&s, &(n, _))| (PageId(s), n))
            .collect();
        r.sort_unstable();
        r
    }
}
