//! How the free pages are stored: one sorted list of page ids on freelist pages, the same for
//! both algorithms, so a file written with one opens with the other.

use crate::page::{self, Bad, Kind, PageId, HEADER};

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
