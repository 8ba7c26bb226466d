//! The pages one commit does not reach, as a bitmap that commits share copy-on-write.
//!
//! The writer rewrites only pages past the high-water mark and pages from the free set; a page in
//! the free set is unreachable from every commit a reader still holds. So a reader that refuses
//! the pages its commit does not reach — whatever a damaged child id or overflow reference names
//! — never borrows bytes the writer may be rewriting (see [`crate::map::Map::bytes`]).
//!
//! ```text
//!   chunks:  [ Some(Arc) ][ None ][ Some(Arc) ] …   one per 32,768 pages (128 MiB of 4 KiB pages)
//!               │                     │
//!               ▼                     ▼
//!            512 × u64 bits       512 × u64 bits     bit set = page unreachable (free or pending)
//! ```
//!
//! A commit clones the chunk list (a few hundred `Arc`s for tens of GB) and copies only the chunks
//! it changes that an older commit still shares; a test is one shift, one load and one mask.

use std::sync::Arc;

use crate::freelist::Run;

const WORDS: usize = 512;
const CHUNK_PAGES: u64 = (WORDS * 64) as u64;

type Chunk = [u64; WORDS];

/// Pages a commit does not reach; every page not marked (including any past the map) is reached.
#[derive(Clone, Debug, Default)]
pub(crate) struct Unreached {
    chunks: Vec<Option<Arc<Chunk>>>,
}

impl Unreached {
    /// The set holding exactly `runs`.
    pub fn of(runs: &[Run]) -> Unreached {
        let mut u = Unreached::default();
        for &r in runs {
            u.mark(r, true);
        }
        u
    }

    /// Marks (`on`) or clears the pages of `run`.
    pub fn mark(&mut self, (start, n): Run, on: bool) {
        let (mut id, end) = (start.0, start.0.saturating_add(n));
        while id < end {
            let c = (id / CHUNK_PAGES) as usize;
            let stop = end.min((c as u64 + 1) * CHUNK_PAGES);
            if self.chunks.len() <= c {
                if !on {
                    return;
                }
                self.chunks.resize(c + 1, None);
            }
            let slot = &mut self.chunks[c];
            if slot.is_none() && !on {
                id = stop;
                continue;
            }
            let chunk = Arc::make_mut(slot.get_or_insert_with(|| Arc::new([0; WORDS])));
            for p in id..stop {
                let bit = p % CHUNK_PAGES;
                let (w, m) = ((bit / 64) as usize, 1u64 << (bit % 64));
                if on {
                    chunk[w] |= m;
                } else {
                    chunk[w] &= !m;
                }
            }
            id = stop;
        }
    }

    /// The first page of `start..start + n` that is marked, if any.
    pub fn first_in(&self, start: u64, n: u64) -> Option<u64> {
        let end = start.saturating_add(n);
        let mut id = start;
        while id < end {
            let c = (id / CHUNK_PAGES) as usize;
            let stop = end.min((c as u64 + 1) * CHUNK_PAGES);
            match self.chunks.get(c) {
                None => return None,
                Some(None) => {}
                Some(Some(chunk)) => {
                    for p in id..stop {
                        let bit = p % CHUNK_PAGES;
                        if chunk[(bit / 64) as usize] & (1 << (bit % 64)) != 0 {
                            return Some(p);
                        }
                    }
                }
            }
            id = stop;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page::PageId;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        /// Against a set of page ids: any sequence of marks and clears, across chunk borders,
        /// answers `first_in` as the set does, and an older clone never sees a later change.
        #[test]
        fn behaves_as_a_set(ops in proptest::collection::vec(
            (0u64..3 * CHUNK_PAGES, 1u64..200, any::<bool>()), 1..60,
        ), probes in proptest::collection::vec((0u64..3 * CHUNK_PAGES, 1u64..300), 1..40)) {
            let mut u = Unreached::default();
            let mut model = BTreeSet::new();
            let mut old: Option<(Unreached, BTreeSet<u64>)> = None;
            for (i, (start, n, on)) in ops.into_iter().enumerate() {
                u.mark((PageId(start), n), on);
                for p in start..start + n {
                    if on { model.insert(p); } else { model.remove(&p); }
                }
                if i == 3 {
                    old = Some((u.clone(), model.clone()));
                }
            }
            for &(s, n) in &probes {
                prop_assert_eq!(u.first_in(s, n), model.range(s..s + n).next().copied());
                if let Some((ou, om)) = &old {
                    prop_assert_eq!(ou.first_in(s, n), om.range(s..s + n).next().copied());
                }
            }
        }
    }
}
