//! The two meta pages (page 0 and page 1). A durable commit writes its meta into the page that
//! does not hold the current one, so a torn meta write always leaves the previous commit intact.
//!
//! | offset | size | field          | meaning                                                  |
//! |--------|------|----------------|----------------------------------------------------------|
//! | 0      | 4    | magic          | `0x4b56_4442` ("KVDB" read as big-endian)                 |
//! | 4      | 4    | version        | format version, 1                                        |
//! | 8      | 4    | page_size      | bytes per page, a power of two in 1024..=65536           |
//! | 12     | 4    | -              | 0                                                        |
//! | 16     | 8    | root           | page id of the root tree (bucket name → bucket root)      |
//! | 24     | 8    | freelist       | first page of the persisted freelist run                 |
//! | 32     | 8    | freelist_pages | pages in that run                                        |
//! | 40     | 8    | high_water     | pages in use: every page id is below it                  |
//! | 48     | 8    | txid           | the commit this meta records                             |
//! | 56     | 4    | checksum       | CRC-32C of bytes 0..56                                   |

use crate::page::{get_u32, get_u64, put_u32, put_u64, PageId, TxId};

pub(crate) const MAGIC: u32 = 0x4b56_4442;
pub(crate) const VERSION: u32 = 1;
pub(crate) const META_LEN: usize = 60;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Meta {
    pub page_size: u32,
    pub root: PageId,
    pub freelist: PageId,
    pub freelist_pages: u64,
    pub high_water: u64,
    pub txid: TxId,
}

/// Writes the metas of a new file into its first two pages of `buf`: txids 0 and 1, the tree
/// of buckets at `root`, no freelist, `high_water` pages in use.
pub(crate) fn write_first(buf: &mut [u8], page_size: u32, root: PageId, high_water: u64) {
    for slot in 0..2u64 {
        let m = Meta {
            page_size,
            root,
            freelist: PageId(0),
            freelist_pages: 0,
            high_water,
            txid: TxId(slot),
        };
        let at = slot as usize * page_size as usize;
        buf[at..at + META_LEN].copy_from_slice(&m.encode());
    }
}

impl Meta {
    pub fn encode(&self) -> [u8; META_LEN] {
        let mut b = [0u8; META_LEN];
        put_u32(&mut b, 0, MAGIC);
        put_u32(&mut b, 4, VERSION);
        put_u32(&mut b, 8, self.page_size);
        put_u64(&mut b, 16, self.root.0);
        put_u64(&mut b, 24, self.freelist.0);
        put_u64(&mut b, 32, self.freelist_pages);
        put_u64(&mut b, 40, self.high_water);
        put_u64(&mut b, 48, self.txid.0);
        let c = crc32c::crc32c(&b[..56]);
        put_u32(&mut b, 56, c);
        b
    }

    /// Decodes and validates a meta; the error says what failed.
    pub fn decode(b: &[u8]) -> Result<Meta, String> {
        if b.len() < META_LEN {
            return Err(format!("only {} bytes, a meta needs {META_LEN}", b.len()));
        }
        let magic = get_u32(b, 0);
        if magic != MAGIC {
            return Err(format!("bad magic {magic:#010x}"));
        }
        let stored = get_u32(b, 56);
        let actual = crc32c::crc32c(&b[..56]);
        if stored != actual {
            return Err(format!(
                "checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"
            ));
        }
        let version = get_u32(b, 4);
        if version != VERSION {
            return Err(format!("unsupported format version {version}"));
        }
        let m = Meta {
            page_size: get_u32(b, 8),
            root: PageId(get_u64(b, 16)),
            freelist: PageId(get_u64(b, 24)),
            freelist_pages: get_u64(b, 32),
            high_water: get_u64(b, 40),
            txid: TxId(get_u64(b, 48)),
        };
        if !valid_page_size(m.page_size) {
            return Err(format!("invalid page size {}", m.page_size));
        }
        if m.high_water.checked_mul(m.page_size as u64).is_none() {
            return Err(format!(
                "high water {} pages of {} bytes is past any file's size",
                m.high_water, m.page_size
            ));
        }
        let in_range = |p: PageId| p.0 >= 2 && p.0 < m.high_water;
        if !in_range(m.root) {
            return Err(format!("root page {} outside 2..{}", m.root, m.high_water));
        }
        if m.freelist_pages > 0
            && (!in_range(m.freelist)
                || m.freelist.0.saturating_add(m.freelist_pages) > m.high_water)
        {
            return Err(format!(
                "freelist run {}+{} outside 2..{}",
                m.freelist, m.freelist_pages, m.high_water
            ));
        }
        Ok(m)
    }
}

pub(crate) fn valid_page_size(ps: u32) -> bool {
    ps.is_power_of_two() && (1024..=65536).contains(&ps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_every_flipped_bit_is_refused() {
        let m = Meta {
            page_size: 4096,
            root: PageId(3),
            freelist: PageId(4),
            freelist_pages: 2,
            high_water: 10,
            txid: TxId(7),
        };
        let b = m.encode();
        assert_eq!(Meta::decode(&b).unwrap(), m);
        for bit in 0..META_LEN * 8 {
            let mut c = b;
            c[bit / 8] ^= 1 << (bit % 8);
            assert!(Meta::decode(&c).is_err(), "flipped bit {bit} accepted");
        }
    }

    /// Found by the `pager_open` fuzz target: a meta whose checksum holds but whose high
    /// water, in bytes, overflows (open multiplied it and panicked).
    #[test]
    fn a_high_water_past_any_file_size_is_refused() {
        let m = Meta {
            page_size: 4096,
            root: PageId(3),
            freelist: PageId(4),
            freelist_pages: 2,
            high_water: u64::MAX / 2048,
            txid: TxId(7),
        };
        let err = Meta::decode(&m.encode()).unwrap_err();
        assert!(err.contains("past any file's size"), "{err}");
    }
}
