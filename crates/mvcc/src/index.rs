//! The in-memory index: key → generations of revisions (etcd's `keyIndex`).
//!
//! A generation is one life of a key, from the put that created it to the delete (tombstone)
//! that ended it. The index answers "which revision of this key is visible at revision r" without
//! touching the disk; values are then read from the `key` bucket by revision.

use std::collections::{BTreeMap, HashSet};
use std::ops::Bound;

use crate::revision::Rev;

/// One life of a key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Generation {
    /// Number of writes in this generation, including any compacted away.
    ver: i64,
    /// Revision of the put that started the generation.
    created: Rev,
    /// Revisions of the writes still in the index; a non-last generation ends with its tombstone.
    revs: Vec<Rev>,
}

/// A generation as the readers see it, whichever way its key holds it.
#[derive(Debug, Clone, Copy)]
struct Gen<'a> {
    ver: i64,
    created: Rev,
    revs: &'a [Rev],
}

/// The revisions of one key. Most keys are live with one revision in the index (written once,
/// or compacted down to their last write): those are held inline, in the map's own node, with
/// no allocation of their own (about 130 bytes a key less); the others hold their generations.
/// `Many` ends with an empty generation when the key is deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
enum KeyIndex {
    One { rev: Rev, created: Rev, ver: i64 },
    Many(Vec<Generation>),
}

/// What the index knows of one key at one revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Visible {
    pub modified: Rev,
    pub created: Rev,
    pub version: i64,
}

impl KeyIndex {
    /// A key created by a put at `rev`.
    fn created(rev: Rev) -> KeyIndex {
        KeyIndex::One {
            rev,
            created: rev,
            ver: 1,
        }
    }

    fn gen_count(&self) -> usize {
        match self {
            KeyIndex::One { .. } => 1,
            KeyIndex::Many(gens) => gens.len(),
        }
    }

    fn gen(&self, i: usize) -> Gen<'_> {
        match self {
            KeyIndex::One { rev, created, ver } => Gen {
                ver: *ver,
                created: *created,
                revs: std::slice::from_ref(rev),
            },
            KeyIndex::Many(gens) => Gen {
                ver: gens[i].ver,
                created: gens[i].created,
                revs: &gens[i].revs,
            },
        }
    }

    /// The generations, to change them.
    fn many(&mut self) -> &mut Vec<Generation> {
        if let KeyIndex::One { rev, created, ver } = *self {
            *self = KeyIndex::Many(vec![Generation {
                ver,
                created,
                revs: vec![rev],
            }]);
        }
        match self {
            KeyIndex::Many(gens) => gens,
            KeyIndex::One { .. } => unreachable!("made Many above"),
        }
    }

    /// Back inline if it is one live generation of one revision.
    fn shrink(&mut self) {
        if let KeyIndex::Many(gens) = self {
            if let [g] = &gens[..] {
                if let [rev] = g.revs[..] {
                    *self = KeyIndex::One {
                        rev,
                        created: g.created,
                        ver: g.ver,
                    };
                }
            }
        }
    }

    fn is_empty(&self) -> bool {
        matches!(self, KeyIndex::Many(gens) if gens.len() == 1 && gens[0].revs.is_empty())
    }

    fn put(&mut self, rev: Rev) {
        let gens = self.many();
        if gens.is_empty() {
            gens.push(Generation::default());
        }
        let g = gens.last_mut().expect("a generation exists");
        if g.revs.is_empty() {
            g.created = rev;
        }
        g.revs.push(rev);
        g.ver += 1;
    }

    /// Ends the current generation at `rev`; false if the key is not live.
    fn tombstone(&mut self, rev: Rev) -> bool {
        if self.gen(self.gen_count() - 1).revs.is_empty() {
            return false;
        }
        self.put(rev);
        self.many().push(Generation::default());
        true
    }

    /// The generation holding the key's version visible at `at`, if the key is live then.
    fn find_generation(&self, at: i64) -> Option<Gen<'_>> {
        let last = self.gen_count().checked_sub(1)?;
        for i in (0..=last).rev() {
            let g = self.gen(i);
            let Some(first) = g.revs.first() else {
                continue;
            };
            if i != last {
                let tomb = g.revs.last().expect("non-empty").main;
                if tomb <= at {
                    return None;
                }
            }
            if first.main <= at {
                return Some(g);
            }
        }
        None
    }

    fn get(&self, at: i64) -> Option<Visible> {
        let g = self.find_generation(at)?;
        let n = g.revs.iter().rposition(|r| r.main <= at)?;
        Some(Visible {
            modified: g.revs[n],
            created: g.created,
            version: g.ver - (g.revs.len() - n - 1) as i64,
        })
    }

    /// etcd's doCompact: the first generation that still matters at `at` and the index in it of
    /// the newest revision <= `at` (recorded in `keep`), if any.
    fn do_compact(&self, at: i64, keep: &mut HashSet<Rev>) -> (usize, Option<usize>) {
        let mut gi = 0;
        while gi + 1 < self.gen_count() {
            let tomb = self.gen(gi).revs.last().map_or(i64::MAX, |r| r.main);
            // A key deleted and put again within revision `at` (one txn: a delete of a range
            // holding it, then a put) has its newest revision <= `at` in the next
            // generation, not at the tombstone. etcd stops at the tombstone here, drops the
            // put's revision from the store and keeps it in the index: its next read of the
            // key at `at` or later is fatal ("range failed to find revision pair").
            let recreated = self.gen(gi + 1).revs.first().is_some_and(|r| r.main <= at);
            if tomb >= at && !recreated {
                break;
            }
            gi += 1;
        }
        let revs = self.gen(gi).revs;
        let ri = revs.iter().rposition(|r| r.main <= at);
        if let Some(ri) = ri {
            keep.insert(revs[ri]);
        }
        (gi, ri)
    }

    fn compact(&mut self, at: i64, keep: &mut HashSet<Rev>) {
        let (gi, ri) = self.do_compact(at, keep);
        if gi == 0 && ri.is_none_or(|ri| ri == 0) {
            return; // nothing to drop (and a key held inline stays so)
        }
        let gens = self.many();
        if let Some(ri) = ri {
            gens[gi].revs.drain(..ri);
        }
        gens.drain(..gi);
        self.shrink();
    }

    /// The revisions compaction at `at` would keep, minus a tombstone that ends its generation
    /// (etcd's `keep`, used by the hash so members that did or did not delete it agree).
    fn keep(&self, at: i64, keep: &mut HashSet<Rev>) {
        if self.is_empty() {
            return;
        }
        let (gi, ri) = self.do_compact(at, keep);
        let revs = self.gen(gi).revs;
        if let Some(ri) = ri {
            if ri == revs.len() - 1 && gi != self.gen_count() - 1 {
                keep.remove(&revs[ri]);
            }
        }
    }
}

type Bounds<'a> = (Bound<&'a [u8]>, Bound<&'a [u8]>);

/// Which keys a request covers, from its `key` and `range_end` (etcd's conventions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRange<'a> {
    /// `range_end` empty: the one key.
    One(&'a [u8]),
    /// `range_end` = `"\0"`: every key >= key.
    From(&'a [u8]),
    /// `[key, range_end)`; empty when range_end <= key.
    Between(&'a [u8], &'a [u8]),
}

impl<'a> KeyRange<'a> {
    pub fn new(key: &'a [u8], range_end: &'a [u8]) -> KeyRange<'a> {
        match range_end {
            [] => KeyRange::One(key),
            [0] => KeyRange::From(key),
            end => KeyRange::Between(key, end),
        }
    }

    pub fn contains(&self, k: &[u8]) -> bool {
        match *self {
            KeyRange::One(key) => k == key,
            KeyRange::From(key) => k >= key,
            KeyRange::Between(key, end) => k >= key && k < end,
        }
    }

    fn bounds(&self) -> Option<Bounds<'a>> {
        match *self {
            KeyRange::One(key) => Some((Bound::Included(key), Bound::Included(key))),
            KeyRange::From(key) => Some((Bound::Included(key), Bound::Unbounded)),
            KeyRange::Between(key, end) if key < end => {
                Some((Bound::Included(key), Bound::Excluded(end)))
            }
            KeyRange::Between(..) => None,
        }
    }
}

/// The index of every key. `compacted` is the compaction revision it answers for: reads below it
/// must fail, since the revisions they need may be gone.
///
/// Keys are boxed slices (no spare capacity, 8 bytes less than a `Vec` in every node).
#[derive(Debug, Default)]
pub struct Index {
    tree: BTreeMap<Box<[u8]>, KeyIndex>,
    compacted: i64,
}

impl Index {
    pub fn new() -> Index {
        Index {
            tree: BTreeMap::new(),
            compacted: -1,
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.tree.len()
    }

    pub fn compacted(&self) -> i64 {
        self.compacted
    }

    pub fn set_compacted(&mut self, rev: i64) {
        self.compacted = self.compacted.max(rev);
    }

    #[cfg(test)]
    pub fn get(&self, key: &[u8], at: i64) -> Option<Visible> {
        self.tree.get(key)?.get(at)
    }

    #[cfg(test)]
    pub fn put(&mut self, key: &[u8], rev: Rev) {
        self.put_after(key, rev, rev.main);
    }

    /// Records a put of `key` at `rev` and returns what was visible at `at` before it, in one
    /// lookup.
    pub fn put_after(&mut self, key: &[u8], rev: Rev, at: i64) -> Option<Visible> {
        match self.tree.get_mut(key) {
            Some(ki) => {
                let prev = ki.get(at);
                ki.put(rev);
                prev
            }
            None => {
                self.tree.insert(key.into(), KeyIndex::created(rev));
                None
            }
        }
    }

    /// Marks `key` deleted at `rev`; false if it was not live.
    pub fn tombstone(&mut self, key: &[u8], rev: Rev) -> bool {
        self.tree.get_mut(key).is_some_and(|ki| ki.tombstone(rev))
    }

    /// Rebuild: a put found in the `key` bucket. The first one seen for a key may follow a
    /// compaction, so it takes the stored create revision and version.
    pub fn restore_put(&mut self, key: &[u8], rev: Rev, created: i64, version: i64) {
        match self.tree.get_mut(key) {
            Some(ki) => ki.put(rev),
            None => {
                let ki = KeyIndex::One {
                    rev,
                    created: Rev::new(created, 0),
                    ver: version,
                };
                self.tree.insert(key.into(), ki);
            }
        }
    }

    /// Rebuild: a tombstone found in the `key` bucket.
    pub fn restore_tombstone(&mut self, key: &[u8], rev: Rev) {
        // A tombstone whose put was compacted away: the generation is just it.
        let lone = || Generation {
            ver: 1,
            created: Rev::default(),
            revs: vec![rev],
        };
        match self.tree.get_mut(key) {
            Some(ki) => {
                if !ki.tombstone(rev) {
                    let gens = ki.many();
                    gens.pop();
                    gens.push(lone());
                    gens.push(Generation::default());
                }
            }
            None => {
                let ki = KeyIndex::Many(vec![lone(), Generation::default()]);
                self.tree.insert(key.into(), ki);
            }
        }
    }

    /// Rebuilds the map with its nodes full: a map grown by inserts in key order leaves its
    /// nodes about half full. Done once the index is rebuilt from the file (the keys come in
    /// revision order there, often near key order); it holds a second copy of the entries, not
    /// of the keys, while it runs.
    pub fn pack(&mut self) {
        let entries: Vec<(Box<[u8]>, KeyIndex)> =
            std::mem::take(&mut self.tree).into_iter().collect();
        self.tree = entries.into_iter().collect();
    }

    /// Calls `f(key, visible)` for each key in `range` live at `at`, in key order, until it
    /// returns false.
    pub fn visit(&self, range: KeyRange<'_>, at: i64, mut f: impl FnMut(&[u8], Visible) -> bool) {
        let Some(bounds) = range.bounds() else { return };
        for (k, ki) in self.tree.range::<[u8], _>(bounds) {
            if let Some(v) = ki.get(at) {
                if !f(k, v) {
                    return;
                }
            }
        }
    }

    /// Number of keys in `range` live at `at`.
    pub fn count(&self, range: KeyRange<'_>, at: i64) -> usize {
        let mut n = 0;
        self.visit(range, at, |_, _| {
            n += 1;
            true
        });
        n
    }

    /// Compacts the keys from `from` (inclusive) on, at most `max_keys` of them, recording the
    /// revisions to keep. Returns the key to continue from, or None when done.
    pub fn compact_chunk(
        &mut self,
        at: i64,
        from: &[u8],
        max_keys: usize,
        keep: &mut HashSet<Rev>,
    ) -> Option<Vec<u8>> {
        let mut emptied = Vec::new();
        let mut next = None;
        for (n, (k, ki)) in self
            .tree
            .range_mut::<[u8], _>((Bound::Included(from), Bound::Unbounded))
            .enumerate()
        {
            if n == max_keys {
                next = Some(k.to_vec());
                break;
            }
            ki.compact(at, keep);
            if ki.is_empty() {
                emptied.push(k.clone());
            }
        }
        for k in emptied {
            self.tree.remove(&k);
        }
        next
    }

    /// For the hash at `at`: (etcd's `Keep(at)`, the revisions the compaction at `compacted`
    /// keeps). etcd compacts its index, and in practice its data, as soon as a compaction is
    /// scheduled; this index and data are compacted in the background afterwards, so each key is
    /// asked as it will be once compacted, and the hash treats revisions the compaction will
    /// delete as gone already.
    pub fn hash_keeps(&self, at: i64) -> (HashSet<Rev>, HashSet<Rev>) {
        let mut keep = HashSet::new();
        let mut kept = HashSet::new();
        for ki in self.tree.values() {
            if self.compacted > 0 {
                let mut done = ki.clone();
                done.compact(self.compacted, &mut kept);
                if !done.is_empty() {
                    done.keep(at, &mut keep);
                }
            } else {
                ki.keep(at, &mut keep);
            }
        }
        (keep, kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(main: i64) -> Rev {
        Rev::new(main, 0)
    }

    fn vis(modified: i64, created: i64, version: i64) -> Option<Visible> {
        Some(Visible {
            modified: r(modified),
            created: r(created),
            version,
        })
    }

    #[test]
    fn generations_versions_and_tombstones() {
        let mut ix = Index::new();
        ix.put(b"a", r(2));
        ix.put(b"a", r(3));
        assert!(ix.tombstone(b"a", r(4)));
        assert!(
            !ix.tombstone(b"a", r(5)),
            "a deleted key cannot be deleted again"
        );
        ix.put(b"a", r(6));
        assert_eq!(ix.get(b"a", 1), None);
        assert_eq!(ix.get(b"a", 2), vis(2, 2, 1));
        assert_eq!(ix.get(b"a", 3), vis(3, 2, 2));
        assert_eq!(ix.get(b"a", 4), None);
        assert_eq!(ix.get(b"a", 5), None);
        assert_eq!(ix.get(b"a", 6), vis(6, 6, 1));
    }

    #[test]
    fn compaction_keeps_the_newest_revision_at_or_below() {
        let mut ix = Index::new();
        ix.put(b"a", r(2));
        ix.put(b"a", r(3));
        ix.put(b"b", r(4));
        assert!(ix.tombstone(b"b", r(5)));
        ix.put(b"a", r(6));
        let mut keep = HashSet::new();
        assert_eq!(ix.compact_chunk(5, b"", usize::MAX, &mut keep), None);
        // a: 3 is the newest <= 5; b's tombstone at 5 is kept (etcd 3.6 keeps it).
        assert_eq!(keep, HashSet::from([r(3), r(5)]));
        assert_eq!(ix.get(b"a", 5).map(|v| v.version), Some(2));
        assert_eq!(ix.get(b"a", 6).map(|v| v.version), Some(3));
        assert_eq!(ix.get(b"b", 5), None);
        assert_eq!(ix.len(), 2);
        // Compacting past the tombstone drops the key.
        let mut keep = HashSet::new();
        ix.compact_chunk(6, b"", usize::MAX, &mut keep);
        assert_eq!(keep, HashSet::from([r(6)]));
        assert_eq!(ix.len(), 1);
        // The hash's keep leaves out a tombstone that ends its generation.
        let mut ix = Index::new();
        ix.put(b"b", r(4));
        assert!(ix.tombstone(b"b", r(5)));
        assert!(ix.hash_keeps(5).0.is_empty());
    }

    #[test]
    fn a_key_with_one_revision_is_held_inline_and_compaction_brings_it_back() {
        let inline = |ix: &Index, k: &[u8]| matches!(ix.tree.get(k), Some(KeyIndex::One { .. }));
        assert!(std::mem::size_of::<KeyIndex>() <= 48);
        let mut ix = Index::new();
        ix.put(b"a", r(2));
        assert!(inline(&ix, b"a"));
        ix.put(b"a", r(3));
        ix.put(b"a", r(4));
        assert!(!inline(&ix, b"a"));
        // Compacting below its newest write keeps two revisions: still spilled.
        ix.compact_chunk(3, b"", usize::MAX, &mut HashSet::new());
        assert!(!inline(&ix, b"a"));
        assert_eq!(ix.get(b"a", 3), vis(3, 2, 2));
        ix.compact_chunk(4, b"", usize::MAX, &mut HashSet::new());
        assert!(inline(&ix, b"a"));
        assert_eq!(ix.get(b"a", 4), vis(4, 2, 3));
        assert_eq!(ix.get(b"a", 3), None);
        // Deleted: its generations again, and the tombstone ends the one it was in.
        assert!(ix.tombstone(b"a", r(5)));
        assert!(!inline(&ix, b"a"));
        assert_eq!(ix.get(b"a", 5), None);
        ix.put(b"a", r(6));
        ix.compact_chunk(6, b"", usize::MAX, &mut HashSet::new());
        assert!(inline(&ix, b"a"));
        assert_eq!(ix.get(b"a", 6), vis(6, 6, 1));
        // Packing keeps every entry as it was.
        for i in 0..1000 {
            ix.put(format!("k{i:04}").as_bytes(), r(10 + i));
        }
        let entries = |ix: &Index| -> Vec<_> { ix.tree.clone().into_iter().collect() };
        let before = entries(&ix);
        ix.pack();
        assert_eq!(entries(&ix), before);
    }

    #[test]
    fn ranges_follow_etcd_conventions() {
        let mut ix = Index::new();
        for (i, k) in [&b"a"[..], b"b", b"c"].iter().enumerate() {
            ix.put(k, r(i as i64 + 2));
        }
        let keys = |range| {
            let mut v = Vec::new();
            ix.visit(range, 10, |k, _| {
                v.push(k.to_vec());
                true
            });
            v
        };
        assert_eq!(keys(KeyRange::new(b"b", b"")), vec![b"b".to_vec()]);
        assert_eq!(
            keys(KeyRange::new(b"b", b"\0")),
            vec![b"b".to_vec(), b"c".to_vec()]
        );
        assert_eq!(
            keys(KeyRange::new(b"a", b"c")),
            vec![b"a".to_vec(), b"b".to_vec()]
        );
        assert!(keys(KeyRange::new(b"c", b"a")).is_empty());
        assert!(keys(KeyRange::new(b"b", b"b")).is_empty());
        assert_eq!(ix.count(KeyRange::new(b"\0", b"\0"), 10), 3);
        assert_eq!(ix.count(KeyRange::new(b"\0", b"\0"), 3), 2);
    }
}
