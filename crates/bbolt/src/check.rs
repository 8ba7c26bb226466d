//! A whole file's consistency, as bbolt's `tx.Check()` sees it: every bucket walked (each page
//! reached once, keys in order), the freelist read, and every page in use either reached or
//! free (without a stored freelist, as in etcd's snapshots, the pages no tree reaches are the
//! free ones).

use crate::error::Result;
use crate::read::{BucketRef, Db, Item, Walker};

/// What a check counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Checked {
    /// Top-level buckets.
    pub buckets: u64,
    /// Values in every bucket (nested buckets not counted).
    pub values: u64,
    /// Pages reached from the root (with their overflow pages).
    pub reached: u64,
    /// Pages the freelist holds.
    pub free: u64,
}

impl Db {
    /// Checks the whole file; an error names the first page found wrong.
    pub fn check(&self) -> Result<Checked> {
        let mut w = self.walker();
        let mut c = Checked::default();
        let mut top = Vec::new();
        w.for_each(&self.root(), &mut |_, item| {
            if let Item::Bucket(b) = item {
                top.push(b);
            }
            Ok(true)
        })?;
        c.buckets = top.len() as u64;
        for b in top {
            walk(&mut w, &b, &mut c)?;
        }
        let pgid = self.meta().pgid;
        let mut reached = 2; // the meta pages
        for id in 2..pgid {
            if w.reached.contains(id) {
                reached += 1;
            }
        }
        c.reached = reached;
        let free = self.free_pages()?;
        let mut freelist_pages = 0;
        if self.meta().freelist != crate::format::NO_FREELIST {
            let mut buf = Vec::new();
            let id = self.meta().freelist;
            let h = self.read_page(id, &mut buf)?;
            for p in id..=id + u64::from(h.overflow) {
                if !w.reached.insert(p) {
                    return Err(self.corrupt(p, "the freelist's page is also in a tree"));
                }
                freelist_pages += 1;
            }
        }
        for &f in &free {
            if !w.reached.insert(f) {
                return Err(self.corrupt(f, "it is free, yet in a tree (or freed twice)"));
            }
        }
        c.free = free.len() as u64;
        let unreached = (2..pgid).filter(|&id| !w.reached.contains(id));
        if self.meta().freelist == crate::format::NO_FREELIST {
            // Without a stored freelist, bbolt takes every page no tree reaches for free.
            c.free = unreached.count() as u64;
        } else if let Some(lost) = unreached.into_iter().next() {
            return Err(self.corrupt(lost, "it is neither reached from the root nor free"));
        }
        debug_assert_eq!(c.reached + c.free + freelist_pages, pgid);
        Ok(c)
    }
}

fn walk(w: &mut Walker<'_>, b: &BucketRef, c: &mut Checked) -> Result<()> {
    let mut nested = Vec::new();
    w.for_each(b, &mut |_, item| {
        match item {
            Item::Value(_) => c.values += 1,
            Item::Bucket(b) => nested.push(b),
        }
        Ok(true)
    })?;
    for n in nested {
        walk(w, &n, c)?;
    }
    Ok(())
}
