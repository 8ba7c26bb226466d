//! Free-page tracking. A [`FreeSet`] holds pages that can be handed out now; [`Freelist`] adds the
//! pages each commit freed, which stay *pending* until no reader can still see them and a sync has
//! made a newer meta durable.
//!
//! Two free sets, chosen at open by [`FreelistKind`]:
//! - [`Array`]: bbolt's original — sorted ids; allocation scans for a run, release merge-sorts.
//! - [`Hashmap`]: runs segregated by length, with start→run and end→run maps so a freed run merges
//!   with both neighbours in O(1); allocation takes an exact-size run or splits the next larger.
//!
//! Both persist as the same sorted list of ids (see [`encode`]), so a file written with one opens
//! with the other.

mod array;
mod hashmap;

use std::collections::BTreeMap;

pub use array::Array;
pub use hashmap::Hashmap;

use crate::page::{self, Bad, Kind, PageId, TxId, HEADER};

/// A run of contiguous pages: its first page and its length.
pub type Run = (PageId, u64);

/// Which free-set algorithm a database uses (chosen at each open; not stored in the file).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FreelistKind {
    /// Sorted array of ids, linear scan for runs (bbolt's `array` freelist).
    Array,
    /// Runs segregated by length with neighbour maps (bbolt's `hashmap` freelist, O(1) paths).
    #[default]
    Hashmap,
}

impl std::str::FromStr for FreelistKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "array" => Ok(FreelistKind::Array),
            "hashmap" | "map" => Ok(FreelistKind::Hashmap),
            _ => Err(format!(
                "unknown freelist type {s:?}: expected array or hashmap"
            )),
        }
    }
}

/// A set of free pages that hands out contiguous runs.
pub trait FreeSet: Send + std::fmt::Debug {
    /// Takes a run of `n` contiguous free pages and returns its first page, or `None` if no run
    /// of `n` is free.
    fn allocate(&mut self, n: u64) -> Option<PageId>;
    /// Adds runs `(first page, length)` to the set. None of their pages may be free already.
    fn release(&mut self, runs: &[Run]);
    /// Number of free pages.
    fn count(&self) -> u64;
    /// The free runs, maximal and in page order.
    fn runs(&self) -> Vec<Run>;
}

/// A new, empty free set of the given kind.
pub fn new_set(kind: FreelistKind) -> Box<dyn FreeSet> {
    match kind {
        FreelistKind::Array => Box::new(Array::default()),
        FreelistKind::Hashmap => Box::new(Hashmap::default()),
    }
}

/// Splits sorted, distinct page ids into maximal runs.
pub fn runs_of(ids: &[u64]) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    for &id in ids {
        match out.last_mut() {
            Some((start, len)) if start.0 + *len == id => *len += 1,
            _ => out.push((PageId(id), 1)),
        }
    }
    out
}

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

/// Pages a persisted freelist of `n` ids occupies.
pub(crate) fn encoded_pages(n: usize, page_size: usize) -> u64 {
    page::run_pages(8 + 8 * n, page_size)
}

/// Serializes sorted ids into a freelist run starting at page `at`: a header, the id count, the
/// ids as little-endian u64.
pub(crate) fn encode(ids: &[u64], at: PageId, pages: u64, page_size: usize) -> Vec<u8> {
    let mut buf = vec![0u8; pages as usize * page_size];
    page::write_header(&mut buf, at, Kind::Freelist, 0, (pages - 1) as u32);
    page::put_u64(&mut buf, HEADER, ids.len() as u64);
    for (i, id) in ids.iter().enumerate() {
        page::put_u64(&mut buf, HEADER + 8 + 8 * i, *id);
    }
    page::seal(&mut buf);
    buf
}

/// Reads a persisted freelist run, checking its checksum and that the ids are sorted, distinct and
/// below `high_water`.
pub(crate) fn decode(buf: &[u8], at: PageId, high_water: u64) -> Result<Vec<u64>, Bad> {
    let h = page::header(buf, at)?;
    if h.kind != Kind::Freelist {
        return Err(page::bad(
            at,
            format!("expected a freelist page, found {:?}", h.kind),
        ));
    }
    page::verify(buf, at)?;
    let n = page::get_u64(buf, HEADER) as usize;
    if n > (buf.len() - HEADER - 8) / 8 {
        return Err(page::bad(
            at,
            format!("freelist of {n} ids does not fit its run"),
        ));
    }
    let mut ids = Vec::with_capacity(n);
    let mut prev = 1u64;
    for i in 0..n {
        let id = page::get_u64(buf, HEADER + 8 + 8 * i);
        if id <= prev || id >= high_water {
            return Err(page::bad(
                at,
                format!("freelist id {id} out of order or outside 2..{high_water}"),
            ));
        }
        ids.push(id);
        prev = id;
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kinds() -> [FreelistKind; 2] {
        [FreelistKind::Array, FreelistKind::Hashmap]
    }

    #[test]
    fn allocate_splits_and_release_merges_neighbours() {
        for kind in kinds() {
            let mut s = new_set(kind);
            s.release(&[(PageId(10), 3), (PageId(20), 1)]);
            assert_eq!(s.allocate(2), Some(PageId(10)), "{kind:?}");
            assert_eq!(s.runs(), vec![(PageId(12), 1), (PageId(20), 1)], "{kind:?}");
            assert_eq!(s.allocate(2), None, "{kind:?}");
            s.release(&[(PageId(10), 2), (PageId(13), 7)]);
            assert_eq!(s.runs(), vec![(PageId(10), 11)], "{kind:?}");
            assert_eq!(s.count(), 11);
            assert_eq!(s.allocate(11), Some(PageId(10)));
            assert_eq!(s.count(), 0);
        }
    }

    #[test]
    fn encode_decode_roundtrip_and_rejects_damage() {
        let ids = vec![2, 3, 9, 100];
        let pages = encoded_pages(ids.len(), 1024);
        let mut buf = encode(&ids, PageId(5), pages, 1024);
        assert_eq!(decode(&buf, PageId(5), 101).unwrap(), ids);
        assert!(
            decode(&buf, PageId(5), 100).is_err(),
            "id beyond high water accepted"
        );
        assert!(
            decode(&buf, PageId(6), 101).is_err(),
            "misdirected page accepted"
        );
        buf[HEADER + 8] ^= 1;
        assert!(
            decode(&buf, PageId(5), 101).is_err(),
            "flipped byte accepted"
        );
    }

    proptest! {
        /// Both sets agree with a model (a sorted set of ids) under any allocate/release sequence.
        #[test]
        fn sets_match_model(ops in prop::collection::vec((any::<bool>(), 1u64..6, 0u64..200), 1..200)) {
            for kind in kinds() {
                let mut s = new_set(kind);
                let mut model = std::collections::BTreeSet::new();
                for &(alloc, n, at) in &ops {
                    if alloc {
                        let got = s.allocate(n);
                        match got {
                            Some(p) => {
                                for id in p.0..p.0 + n {
                                    prop_assert!(model.remove(&id), "{kind:?} handed out non-free page {id}");
                                }
                            }
                            None => {
                                let ids: Vec<u64> = model.iter().copied().collect();
                                prop_assert!(runs_of(&ids).iter().all(|r| r.1 < n), "{kind:?} missed a run of {n}");
                            }
                        }
                    } else {
                        let run: Vec<u64> = (at + 2..at + 2 + n).filter(|id| !model.contains(id)).collect();
                        let runs = runs_of(&run);
                        s.release(&runs);
                        model.extend(run);
                    }
                    let ids: Vec<u64> = model.iter().copied().collect();
                    prop_assert_eq!(s.runs(), runs_of(&ids), "{:?}", kind);
                    prop_assert_eq!(s.count(), model.len() as u64);
                }
            }
        }
    }
}
