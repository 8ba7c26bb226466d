//! The free-set interface both algorithms implement, and the choice between them.

use crate::page::PageId;

use super::array::Array;
use super::hashmap::Hashmap;

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
