//! Whole-file tools: the consistency check and statistics.

use std::collections::BTreeMap;

use crate::btree::Snap;
use crate::db::Db;
use crate::error::{Error, Result};
use crate::page::{self, Kind, NodePage, PageId, RawVal, HEADER};

/// Counts gathered by walking every tree; see [`Db::stats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes per page.
    pub page_size: usize,
    /// Bytes in the file (it grows in chunks, so this exceeds `high_water * page_size`).
    pub file_size: u64,
    /// Pages below the high-water mark: every page id in use or free is below it.
    pub high_water: u64,
    /// Branch pages of all trees.
    pub branch_pages: u64,
    /// Leaf pages of all trees.
    pub leaf_pages: u64,
    /// Pages of overflow runs (large values).
    pub overflow_pages: u64,
    /// Pages holding the persisted freelist.
    pub freelist_pages: u64,
    /// Pages that can be allocated now.
    pub free_pages: u64,
    /// Pages freed by recent commits, waiting for readers or a sync before reuse.
    pub pending_pages: u64,
    /// Free runs: run length → number of runs of that length.
    pub free_runs: BTreeMap<u64, u64>,
    /// Levels of the deepest bucket tree (a lone leaf is 1).
    pub depth: usize,
    /// Number of buckets.
    pub buckets: u64,
    /// Number of keys over all buckets.
    pub keys: u64,
}

const MAX_PROBLEMS: usize = 50;

/// Walks the trees of one state, marking each page it reaches.
struct Walker<'a> {
    snap: &'a Snap,
    verify: bool,
    marks: Vec<u8>,
    problems: Vec<String>,
    stats: Stats,
}

impl Walker<'_> {
    fn problem(&mut self, p: String) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(p);
        }
    }

    /// Marks pages `id..id+n` as used by `what`; false if any was out of range or seen before.
    fn mark(&mut self, id: PageId, n: u64, what: &str) -> bool {
        let hw = self.snap.high_water;
        if id.0 < 2 || id.0.checked_add(n).is_none_or(|e| e > hw) {
            self.problem(format!(
                "{what} at page {id}+{n} lies outside the data pages 2..{hw}"
            ));
            return false;
        }
        let mut ok = true;
        for p in id.0..id.0 + n {
            if self.marks[p as usize] != 0 {
                self.problem(format!("page {p} is reached twice (again as {what})"));
                ok = false;
            }
            self.marks[p as usize] += 1;
        }
        ok
    }

    fn tree(&mut self, root: PageId, is_root_tree: bool) {
        let mut leaf_depth = None;
        self.node(root, None, None, 1, is_root_tree, &mut leaf_depth);
        if !is_root_tree {
            self.stats.depth = self.stats.depth.max(leaf_depth.unwrap_or(0));
        }
    }

    fn node(
        &mut self,
        id: PageId,
        lo: Option<&[u8]>,
        hi: Option<&[u8]>,
        depth: usize,
        is_root_tree: bool,
        leaf_depth: &mut Option<usize>,
    ) {
        if depth > crate::btree::MAX_DEPTH {
            self.problem(format!(
                "page {id}: tree deeper than {} levels",
                crate::btree::MAX_DEPTH
            ));
            return;
        }
        if !self.mark(id, 1, "a tree node") {
            return;
        }
        let snap = self.snap;
        let p = match snap.node(id) {
            Ok(p) => p,
            Err(e) => return self.problem(e.to_string()),
        };
        if self.verify {
            if let Err(b) = page::verify(p.buf, id) {
                self.problem(snap.corrupt(b).to_string());
            }
        }
        if let Err(b) = self.entries(&p, lo, hi, depth, is_root_tree, leaf_depth) {
            self.problem(snap.corrupt(b).to_string());
        }
    }

    fn entries(
        &mut self,
        p: &NodePage<'_>,
        lo: Option<&[u8]>,
        hi: Option<&[u8]>,
        depth: usize,
        is_root_tree: bool,
        leaf_depth: &mut Option<usize>,
    ) -> Result<(), page::Bad> {
        let id = p.id;
        if p.leaf {
            self.stats.leaf_pages += 1;
            match leaf_depth {
                None => *leaf_depth = Some(depth),
                Some(d) if *d != depth => self.problem(format!(
                    "leaf page {id} at depth {depth}, other leaves at depth {d}"
                )),
                _ => {}
            }
        } else {
            self.stats.branch_pages += 1;
        }
        let mut prev: Option<&[u8]> = None;
        for i in 0..p.count {
            let k = p.key(i)?;
            if prev.is_some_and(|pk| pk >= k) {
                self.problem(format!("page {id}: key {i} is not above key {}", i - 1));
            }
            // A branch's first key may lag its subtree's minimum; its other keys are bounds.
            let bounded = p.leaf || i > 0;
            if bounded && (lo.is_some_and(|l| k < l) || hi.is_some_and(|h| k >= h)) {
                self.problem(format!(
                    "page {id}: key {i} lies outside the range its parent gives"
                ));
            }
            prev = Some(k);
            if p.leaf {
                match p.value(i)? {
                    RawVal::Inline(v) if is_root_tree => self.bucket(id, k, v),
                    RawVal::Inline(_) => {}
                    RawVal::Overflow { page: run, len } => self.overflow(run, len),
                }
                if !is_root_tree {
                    self.stats.keys += 1;
                }
            } else {
                let clo = if i == 0 { lo } else { Some(k) };
                let chi = if i + 1 < p.count {
                    Some(p.key(i + 1)?)
                } else {
                    hi
                };
                self.node(p.child(i), clo, chi, depth + 1, is_root_tree, leaf_depth);
            }
        }
        Ok(())
    }

    fn bucket(&mut self, at: PageId, name: &[u8], v: &[u8]) {
        self.stats.buckets += 1;
        match <[u8; 8]>::try_from(v) {
            Ok(b) => self.tree(PageId(u64::from_le_bytes(b)), false),
            Err(_) => self.problem(format!(
                "page {at}: bucket {:?} has a {}-byte root",
                String::from_utf8_lossy(name),
                v.len()
            )),
        }
    }

    fn overflow(&mut self, id: PageId, len: usize) {
        let pages = page::run_pages(len, self.snap.page_size);
        if !self.mark(id, pages, "an overflow run") {
            return;
        }
        self.stats.overflow_pages += pages;
        let buf = match self.snap.run(id, pages) {
            Ok(b) => b,
            Err(e) => return self.problem(e.to_string()),
        };
        let checked = page::header(buf, id).and_then(|h| {
            if h.kind != Kind::Overflow || u64::from(h.overflow) + 1 != pages {
                return Err(page::bad(
                    id,
                    format!(
                        "overflow run of {pages} pages has a {:?} header for {}",
                        h.kind,
                        u64::from(h.overflow) + 1
                    ),
                ));
            }
            if self.verify {
                page::verify(buf, id)?;
            }
            Ok(())
        });
        if let Err(b) = checked {
            self.problem(self.snap.corrupt(b).to_string());
        }
        debug_assert!(buf.len() >= HEADER + len);
    }
}

impl Db {
    fn walk(&self, verify: bool) -> (Stats, Vec<String>) {
        let w = self.shared.writer.lock();
        let snap = self
            .shared
            .snap(&w.meta, w.map.clone(), w.unreached.clone());
        let mut walker = Walker {
            snap: &snap,
            verify,
            marks: vec![0; w.meta.high_water as usize],
            problems: Vec::new(),
            stats: Stats {
                page_size: self.shared.page_size,
                file_size: w.file_len,
                high_water: w.meta.high_water,
                free_pages: w.freelist.free_count(),
                pending_pages: w.freelist.pending_count(),
                ..Stats::default()
            },
        };
        walker.marks[0] = 1;
        walker.marks[1] = 1;
        walker.tree(w.meta.root, true);
        if let Some((run, n)) = w.freelist_run {
            walker.stats.freelist_pages = n;
            walker.mark(run, n, "the persisted freelist");
        }
        for (start, n) in w.freelist.free_runs() {
            *walker.stats.free_runs.entry(n).or_default() += 1;
            walker.mark(start, n, "a free run");
        }
        for (txid, (start, n)) in w.freelist.pending_runs() {
            walker.mark(start, n, &format!("a run freed by commit {txid}"));
        }
        if verify {
            let mut unreached = vec![false; w.meta.high_water as usize];
            let pending = w.freelist.pending_runs().map(|(_, r)| r);
            for (start, n) in w.freelist.free_runs().into_iter().chain(pending) {
                for p in start.0..(start.0 + n).min(w.meta.high_water) {
                    unreached[p as usize] = true;
                }
            }
            let differs = (0..w.meta.high_water)
                .find(|&p| w.unreached.first_in(p, 1).is_some() != unreached[p as usize]);
            if let Some(p) = differs {
                let (among, marked) = if unreached[p as usize] {
                    ("among", "not marked")
                } else {
                    ("not among", "marked")
                };
                walker.problem(format!(
                    "page {p} is {among} the free and pending pages but {marked} as unreachable"
                ));
            }
            let leaked: Vec<usize> = (0..walker.marks.len())
                .filter(|&p| walker.marks[p] == 0)
                .collect();
            if let Some(&first) = leaked.first() {
                walker.problem(format!(
                    "{} pages are neither reachable nor free (first: page {first})",
                    leaked.len()
                ));
            }
        }
        (walker.stats, walker.problems)
    }

    /// Checks the newest commit: every page below the high-water mark is reachable from exactly
    /// one place or free exactly once; every node's keys are ordered and within its parent's
    /// bounds; all leaves are at one depth; every checksum and overflow run is intact.
    ///
    /// Holds the writer lock while it runs (readers go on).
    pub fn check(&self) -> Result<()> {
        let (_, problems) = self.walk(true);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::Inconsistent {
                path: self.path().to_path_buf(),
                problems,
            })
        }
    }

    /// Page and key counts of the newest commit (walks every tree; holds the writer lock).
    pub fn stats(&self) -> Stats {
        self.walk(false).0
    }
}
