//! bbolt's on-disk layout (bbolt v1.3 and v1.4, format version 2), little-endian as bbolt writes
//! it on every platform etcd ships for.
//!
//! The file is a sequence of pages of `page_size` bytes; page `n` starts at `n * page_size`. A
//! page may run on into `overflow` pages after it. Every page starts with a header:
//!
//! | offset | size | field                                                        |
//! |-------:|-----:|--------------------------------------------------------------|
//! | 0      | 8    | id: the page's own number                                    |
//! | 8      | 2    | flags: 0x01 branch, 0x02 leaf, 0x04 meta, 0x10 freelist      |
//! | 10     | 2    | count: elements (ids, for a freelist: 0xFFFF = count below)  |
//! | 12     | 4    | overflow: pages after this one that belong to it             |
//!
//! Pages 0 and 1 are meta pages, written alternately; the valid one with the higher txid is
//! current. After the header:
//!
//! | offset | size | field                                                        |
//! |-------:|-----:|--------------------------------------------------------------|
//! | 16     | 4    | magic 0xED0CDAED                                             |
//! | 20     | 4    | version 2                                                    |
//! | 24     | 4    | page size                                                    |
//! | 28     | 4    | flags (unused, 0)                                            |
//! | 32     | 8    | root bucket: page of the tree of top-level buckets          |
//! | 40     | 8    | root bucket: sequence                                        |
//! | 48     | 8    | freelist page (u64::MAX: the freelist is not stored)         |
//! | 56     | 8    | pgid: the high-water mark, pages in use                      |
//! | 64     | 8    | txid                                                         |
//! | 72     | 8    | checksum: FNV-1a 64 of bytes 16..72                          |
//!
//! A branch page holds `count` elements of 16 bytes — `pos u32, ksize u32, pgid u64` — and a leaf
//! page `count` elements of 16 bytes — `flags u32, pos u32, ksize u32, vsize u32` — where `pos`
//! counts from the element's own first byte to its key (the value follows the key). A leaf
//! element with flag 0x01 is a bucket: its value starts with the bucket's header — `root u64,
//! sequence u64` — and a bucket whose root is 0 is *inline*: a leaf page (header and elements)
//! follows the header inside the value. A freelist page holds `count` page ids (u64); when there
//! are 0xFFFF or more, `count` is 0xFFFF and the first u64 is the real count.

pub(crate) const HEADER: usize = 16;
pub(crate) const ELEMENT: usize = 16;
pub(crate) const BUCKET_HEADER: usize = 16;

pub(crate) const BRANCH: u16 = 0x01;
pub(crate) const LEAF: u16 = 0x02;
pub(crate) const META: u16 = 0x04;
pub(crate) const FREELIST: u16 = 0x10;
pub(crate) const BUCKET_LEAF: u32 = 0x01;

pub(crate) const MAGIC: u32 = 0xED0C_DAED;
pub(crate) const VERSION: u32 = 2;
/// The freelist page id that says the freelist is not stored (bbolt's `NoFreelistSync`).
pub const NO_FREELIST: u64 = u64::MAX;
/// The largest key bbolt accepts.
pub const MAX_KEY: usize = 32_768;
/// The largest value bbolt accepts.
pub const MAX_VALUE: usize = (1 << 31) - 2;
/// Meta bytes covered by the checksum: from the magic to the checksum.
const META_SUMMED: usize = 56;

pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// A page's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) id: u64,
    pub(crate) flags: u16,
    pub(crate) count: u16,
    pub(crate) overflow: u32,
}

impl Header {
    /// The header at the start of `b` (at least [`HEADER`] bytes).
    pub(crate) fn parse(b: &[u8]) -> Header {
        Header {
            id: u64_at(b, 0),
            flags: u16_at(b, 8),
            count: u16_at(b, 10),
            overflow: u32_at(b, 12),
        }
    }

    pub(crate) fn write(&self, out: &mut [u8]) {
        out[..8].copy_from_slice(&self.id.to_le_bytes());
        out[8..10].copy_from_slice(&self.flags.to_le_bytes());
        out[10..12].copy_from_slice(&self.count.to_le_bytes());
        out[12..16].copy_from_slice(&self.overflow.to_le_bytes());
    }
}

/// What a meta page records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub page_size: u32,
    /// The page of the tree of top-level buckets.
    pub root: u64,
    pub root_sequence: u64,
    /// The freelist's page, or [`NO_FREELIST`].
    pub freelist: u64,
    /// The high-water mark: pages `0..pgid` are in use or free.
    pub pgid: u64,
    pub txid: u64,
}

fn fnv1a64(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &c in b {
        h ^= u64::from(c);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl Meta {
    /// The meta in page `page` (a whole page read from the file), or why it is not one.
    pub(crate) fn parse(page: &[u8], expect_id: u64) -> Result<Meta, String> {
        if page.len() < HEADER + META_SUMMED + 8 {
            return Err("the file is too short for a meta page".into());
        }
        let h = Header::parse(page);
        let m = &page[HEADER..];
        if u32_at(m, 0) != MAGIC {
            return Err("no bbolt magic".into());
        }
        if u32_at(m, 4) != VERSION {
            return Err(format!("format version {}, not 2", u32_at(m, 4)));
        }
        if fnv1a64(&m[..META_SUMMED]) != u64_at(m, META_SUMMED) {
            return Err("checksum mismatch".into());
        }
        if h.flags != META || h.id != expect_id {
            return Err(format!(
                "the page says it is page {} with flags {:#x}, not meta page {expect_id}",
                h.id, h.flags
            ));
        }
        let meta = Meta {
            page_size: u32_at(m, 8),
            root: u64_at(m, 16),
            root_sequence: u64_at(m, 24),
            freelist: u64_at(m, 32),
            pgid: u64_at(m, 40),
            txid: u64_at(m, 48),
        };
        if !meta.page_size.is_power_of_two() || !(512..=65536).contains(&meta.page_size) {
            return Err(format!(
                "page size {} is not one bbolt writes",
                meta.page_size
            ));
        }
        if meta.pgid < 3 || meta.root < 2 || meta.root >= meta.pgid {
            return Err(format!(
                "root page {} is not below its high-water mark {}",
                meta.root, meta.pgid
            ));
        }
        if meta.freelist != NO_FREELIST && (meta.freelist < 2 || meta.freelist >= meta.pgid) {
            return Err(format!(
                "freelist page {} is not below its high-water mark {}",
                meta.freelist, meta.pgid
            ));
        }
        Ok(meta)
    }

    /// Meta page `id` (0 or 1), a whole page of `page_size` bytes.
    pub(crate) fn page(&self, id: u64) -> Vec<u8> {
        let mut p = vec![0; self.page_size as usize];
        Header {
            id,
            flags: META,
            count: 0,
            overflow: 0,
        }
        .write(&mut p);
        let m = &mut p[HEADER..];
        m[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        m[4..8].copy_from_slice(&VERSION.to_le_bytes());
        m[8..12].copy_from_slice(&self.page_size.to_le_bytes());
        m[16..24].copy_from_slice(&self.root.to_le_bytes());
        m[24..32].copy_from_slice(&self.root_sequence.to_le_bytes());
        m[32..40].copy_from_slice(&self.freelist.to_le_bytes());
        m[40..48].copy_from_slice(&self.pgid.to_le_bytes());
        m[48..56].copy_from_slice(&self.txid.to_le_bytes());
        let sum = fnv1a64(&m[..META_SUMMED]);
        m[META_SUMMED..META_SUMMED + 8].copy_from_slice(&sum.to_le_bytes());
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_meta_page_reads_back_and_any_flipped_bit_is_caught() {
        let m = Meta {
            page_size: 4096,
            root: 3,
            root_sequence: 0,
            freelist: 2,
            pgid: 9,
            txid: 7,
        };
        let p = m.page(1);
        assert_eq!(Meta::parse(&p, 1), Ok(m));
        assert!(Meta::parse(&p, 0).is_err(), "page 1 read as page 0");
        // Every bit but those of the header's count and overflow, which a meta page ignores.
        for bit in (0..80 * 8).filter(|b| !(80..128).contains(b)) {
            let mut bad = p.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(Meta::parse(&bad, 1).is_err(), "bit {bit} flipped");
        }
    }
}
