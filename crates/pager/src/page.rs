//! On-disk page format: the header every page starts with, and the element tables of branch and
//! leaf pages.
//!
//! Every page (and every multi-page run) starts with this 24-byte header, little-endian:
//!
//! | offset | size | field     | meaning                                                        |
//! |--------|------|-----------|----------------------------------------------------------------|
//! | 0      | 8    | id        | the page's own id: catches misdirected writes and bad pointers |
//! | 8      | 1    | kind      | 1 branch, 2 leaf, 3 overflow (a large value), 4 freelist       |
//! | 9      | 1    | reserved  | 0                                                              |
//! | 10     | 2    | count     | number of elements (branch, leaf)                              |
//! | 12     | 4    | overflow  | pages in the run after this one (overflow, freelist)           |
//! | 16     | 4    | checksum  | CRC-32C of the whole page or run with this field zeroed        |
//! | 20     | 4    | reserved  | 0                                                              |
//!
//! Every branch and leaf element starts with the key's first 8 bytes (zero-padded, read as a
//! big-endian integer): a binary search compares integers inside the element array and touches a
//! key elsewhere in the page only when two prefixes are equal.
//!
//! A branch page follows with `count` 24-byte elements, then the keys they point at:
//!
//! | offset | size | field  | meaning                                              |
//! |--------|------|--------|------------------------------------------------------|
//! | 0      | 8    | prefix | the key's first 8 bytes, big-endian, zero-padded     |
//! | 8      | 4    | pos    | offset of the key from the page start                |
//! | 12     | 2    | klen   | key length                                           |
//! | 14     | 2    | -      | 0                                                    |
//! | 16     | 8    | child  | page id of the subtree holding keys ≥ this key       |
//!
//! A leaf page follows with `count` 20-byte elements, then keys and values:
//!
//! | offset | size | field  | meaning                                                           |
//! |--------|------|--------|-------------------------------------------------------------------|
//! | 0      | 8    | prefix | the key's first 8 bytes, big-endian, zero-padded                  |
//! | 8      | 4    | pos    | offset of the key from the page start; the value follows the key  |
//! | 12     | 2    | klen   | key length                                                        |
//! | 14     | 1    | flags  | 0: value inline; 1: value in an overflow run whose 8-byte page id |
//! |        |      |        | is stored in place of the value                                   |
//! | 15     | 1    | -      | 0                                                                 |
//! | 16     | 4    | vlen   | value length (the whole value, also when it overflows)            |
//!
//! An overflow run is a header followed by the value's bytes, over `1 + overflow` pages.

use std::fmt;

/// The id of a page: its offset in the file divided by the page size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PageId(pub u64);

impl fmt::Display for PageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The id of a write transaction; the meta of each commit records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct TxId(pub u64);

impl fmt::Display for TxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

pub(crate) const HEADER: usize = 24;
pub(crate) const BRANCH_ELEM: usize = 24;
pub(crate) const LEAF_ELEM: usize = 20;
/// Offsets inside an element (both kinds).
const E_POS: usize = 8;
const E_KLEN: usize = 12;
const E_FLAGS: usize = 14;
const E_VLEN: usize = 16;
const E_CHILD: usize = 16;
/// Bytes stored in a leaf in place of an overflowing value.
pub(crate) const OVERFLOW_REF: usize = 8;
const CHECKSUM_AT: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Branch = 1,
    Leaf = 2,
    Overflow = 3,
    Freelist = 4,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Branch,
            2 => Kind::Leaf,
            3 => Kind::Overflow,
            4 => Kind::Freelist,
            _ => return None,
        })
    }
}

pub(crate) const FLAG_OVERFLOW: u8 = 1;

pub(crate) fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
pub(crate) fn get_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}
pub(crate) fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}
pub(crate) fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// A key's first 8 bytes as a big-endian integer, zero-padded: comparing prefixes orders keys
/// as comparing the keys does, except that equal prefixes need the full keys.
pub(crate) fn prefix(key: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = key.len().min(8);
    b[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(b)
}

/// Writes one element's prefix, key position and key length.
pub(crate) fn put_elem_key(buf: &mut [u8], e: usize, key: &[u8], pos: usize) {
    put_u64(buf, e, prefix(key));
    put_u32(buf, e + E_POS, pos as u32);
    put_u16(buf, e + E_KLEN, key.len() as u16);
}

/// Writes a leaf element's value fields.
pub(crate) fn put_leaf_val(buf: &mut [u8], e: usize, overflow: bool, vlen: usize) {
    buf[e + E_FLAGS] = if overflow { FLAG_OVERFLOW } else { 0 };
    put_u32(buf, e + E_VLEN, vlen as u32);
}

/// Writes a branch element's child.
pub(crate) fn put_branch_child(buf: &mut [u8], e: usize, child: PageId) {
    put_u64(buf, e + E_CHILD, child.0);
}

/// Writes a page header (checksum left zero; see [`seal`]).
pub(crate) fn write_header(buf: &mut [u8], id: PageId, kind: Kind, count: u16, overflow: u32) {
    buf[..HEADER].fill(0);
    put_u64(buf, 0, id.0);
    buf[8] = kind as u8;
    put_u16(buf, 10, count);
    put_u32(buf, 12, overflow);
}

/// CRC-32C of a page or run with the checksum field taken as zero.
pub(crate) fn checksum(buf: &[u8]) -> u32 {
    let c = crc32c::crc32c(&buf[..CHECKSUM_AT]);
    let c = crc32c::crc32c_append(c, &[0u8; 4]);
    crc32c::crc32c_append(c, &buf[CHECKSUM_AT + 4..])
}

/// Stores the checksum of a fully written page or run in its header.
pub(crate) fn seal(buf: &mut [u8]) {
    let c = checksum(buf);
    put_u32(buf, CHECKSUM_AT, c);
}

/// Writes `value` as overflow run `id` into `run`: zeroed, and exactly the run's pages long.
pub(crate) fn write_overflow(run: &mut [u8], id: PageId, pages: u64, value: &[u8]) {
    write_header(run, id, Kind::Overflow, 0, (pages - 1) as u32);
    run[HEADER..HEADER + value.len()].copy_from_slice(value);
    seal(run);
}

/// Pages needed for a run holding a header and `body` bytes.
pub(crate) fn run_pages(body: usize, page_size: usize) -> u64 {
    (HEADER + body).div_ceil(page_size) as u64
}

/// A checked view of one page's header. Construction validates what later accessors rely on.
#[derive(Clone, Copy)]
pub(crate) struct Header {
    pub kind: Kind,
    pub count: u16,
    pub overflow: u32,
}

/// Why a page was rejected (the caller adds the file path).
#[derive(Debug)]
pub(crate) struct Bad {
    pub page: PageId,
    pub reason: String,
}

pub(crate) fn bad(page: PageId, reason: impl Into<String>) -> Bad {
    Bad {
        page,
        reason: reason.into(),
    }
}

/// Parses the header of `buf`, which was read at page `id`.
pub(crate) fn header(buf: &[u8], id: PageId) -> Result<Header, Bad> {
    if buf.len() < HEADER {
        return Err(bad(id, "page shorter than its header"));
    }
    let stored = get_u64(buf, 0);
    if stored != id.0 {
        return Err(bad(id, format!("header names page {stored}")));
    }
    let kind =
        Kind::from_u8(buf[8]).ok_or_else(|| bad(id, format!("unknown page kind {}", buf[8])))?;
    Ok(Header {
        kind,
        count: get_u16(buf, 10),
        overflow: get_u32(buf, 12),
    })
}

/// Verifies the stored checksum of a page or run.
pub(crate) fn verify(buf: &[u8], id: PageId) -> Result<(), Bad> {
    let stored = get_u32(buf, CHECKSUM_AT);
    let actual = checksum(buf);
    if stored != actual {
        return Err(bad(
            id,
            format!("checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"),
        ));
    }
    Ok(())
}

/// A value as a leaf stores it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RawVal<'a> {
    Inline(&'a [u8]),
    Overflow { page: PageId, len: usize },
}

/// A validated branch or leaf page. Element accessors re-check bounds, so a damaged page yields
/// errors, never a panic.
#[derive(Clone, Copy)]
pub(crate) struct NodePage<'a> {
    pub id: PageId,
    pub buf: &'a [u8],
    pub leaf: bool,
    pub count: usize,
}

impl<'a> NodePage<'a> {
    pub fn parse(buf: &'a [u8], id: PageId) -> Result<Self, Bad> {
        let h = header(buf, id)?;
        let leaf = match h.kind {
            Kind::Leaf => true,
            Kind::Branch => false,
            k => {
                return Err(bad(
                    id,
                    format!("expected a branch or leaf page, found {k:?}"),
                ))
            }
        };
        let count = h.count as usize;
        let elem = if leaf { LEAF_ELEM } else { BRANCH_ELEM };
        if HEADER + count * elem > buf.len() {
            return Err(bad(id, format!("{count} elements do not fit the page")));
        }
        if !leaf && count == 0 {
            return Err(bad(id, "branch page without children"));
        }
        Ok(NodePage {
            id,
            buf,
            leaf,
            count,
        })
    }

    fn slice(&self, pos: usize, len: usize) -> Result<&'a [u8], Bad> {
        pos.checked_add(len)
            .and_then(|end| self.buf.get(pos..end))
            .ok_or_else(|| {
                bad(
                    self.id,
                    format!("element at {pos}+{len} runs past the page end"),
                )
            })
    }

    fn elem(&self, i: usize) -> usize {
        HEADER + i * if self.leaf { LEAF_ELEM } else { BRANCH_ELEM }
    }

    pub fn key(&self, i: usize) -> Result<&'a [u8], Bad> {
        let e = self.elem(i);
        let pos = get_u32(self.buf, e + E_POS) as usize;
        let klen = get_u16(self.buf, e + E_KLEN) as usize;
        self.slice(pos, klen)
    }

    pub fn child(&self, i: usize) -> PageId {
        PageId(get_u64(self.buf, self.elem(i) + E_CHILD))
    }

    pub fn value(&self, i: usize) -> Result<RawVal<'a>, Bad> {
        let e = self.elem(i);
        let pos = get_u32(self.buf, e + E_POS) as usize + get_u16(self.buf, e + E_KLEN) as usize;
        let flags = self.buf[e + E_FLAGS];
        let vlen = get_u32(self.buf, e + E_VLEN) as usize;
        if flags & FLAG_OVERFLOW != 0 {
            let r = self.slice(pos, OVERFLOW_REF)?;
            Ok(RawVal::Overflow {
                page: PageId(get_u64(r, 0)),
                len: vlen,
            })
        } else {
            Ok(RawVal::Inline(self.slice(pos, vlen)?))
        }
    }

    fn prefix_at(&self, i: usize) -> u64 {
        get_u64(self.buf, self.elem(i))
    }

    /// The first index in `from..count` whose prefix is ≥ `want` (`> want` if `strict`).
    ///
    /// Scans every 16th element, then one block of 16, instead of a binary search: the loads of
    /// one scan do not depend on each other, so the CPU issues them together and a search costs
    /// about two cache-miss latencies instead of one per probe.
    fn scan(&self, from: usize, want: u64, strict: bool) -> usize {
        const BLOCK: usize = 16;
        let before = |p: u64| if strict { p <= want } else { p < want };
        let mut at = from;
        while at + BLOCK < self.count && before(self.prefix_at(at + BLOCK)) {
            at += BLOCK;
        }
        while at < self.count && before(self.prefix_at(at)) {
            at += 1;
        }
        at
    }

    /// Index of the first key ≥ `key`, and whether it equals `key`.
    pub fn search(&self, key: &[u8]) -> Result<(usize, bool), Bad> {
        let want = prefix(key);
        let lo = self.scan(0, want, false);
        if lo == self.count || self.prefix_at(lo) != want {
            return Ok((lo, false));
        }
        // Keys sharing the 8-byte prefix: binary search on the full keys.
        let (mut lo, mut hi) = (lo, self.scan(lo, want, true));
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.key(mid)?.cmp(key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Equal => return Ok((mid, true)),
                std::cmp::Ordering::Greater => hi = mid,
            }
        }
        Ok((lo, false))
    }
}

/// Index of the child of a branch with sorted `keys` that may hold `key`: the last key ≤ `key`,
/// or 0 when `key` sorts before all of them.
pub(crate) fn child_index(found: (usize, bool)) -> usize {
    match found {
        (i, true) => i,
        (0, false) => 0,
        (i, false) => i - 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::btree::node::{NewVal, Node};
    use proptest::prelude::*;

    fn leaf(keys: &[Vec<u8>]) -> Vec<u8> {
        let mut n = Node::empty_leaf();
        for (i, k) in keys.iter().enumerate() {
            n.insert(i, k, NewVal::Inline(&[1]));
        }
        let mut buf = vec![0u8; 65536];
        n.write(&mut buf, PageId(9));
        buf
    }

    proptest! {
        /// `search` agrees with a binary search over the sorted keys, for keys that share 8-byte
        /// prefixes in long runs (as mvcc's revision keys do) and pages of every fill.
        #[test]
        fn search_matches_sorted_vec(
            raw in prop::collection::btree_set((0u8..4, 0u8..3, prop::collection::vec(0u8..3, 0..4)), 0..300),
            probes in prop::collection::vec((0u8..5, 0u8..4, prop::collection::vec(0u8..4, 0..5)), 1..50),
        ) {
            let key = |(a, b, tail): &(u8, u8, Vec<u8>)| {
                let mut k = vec![b'r', 0, 0, 0, 0, 0, *a, *b];
                k.truncate(if *b == 2 { 7 } else { 8 });
                k.extend(tail);
                k
            };
            let mut keys: Vec<Vec<u8>> = raw.iter().map(key).collect();
            keys.sort();
            keys.dedup();
            let buf = leaf(&keys);
            let p = NodePage::parse(&buf, PageId(9)).unwrap();
            for probe in keys.iter().cloned().chain(probes.iter().map(key)) {
                let want = match keys.binary_search(&probe) {
                    Ok(i) => (i, true),
                    Err(i) => (i, false),
                };
                prop_assert_eq!(p.search(&probe).unwrap(), want, "probe {:?}", probe);
            }
        }
    }
}
