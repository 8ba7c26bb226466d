//! The read-only memory map of the database file: the only `unsafe` in kvd.
//!
//! The file is written with `pwrite` and read through this map. A map is never resized: when the
//! file grows the writer makes a new, longer [`Map`] and publishes it to new transactions, while
//! transactions that hold the old one keep it (an `Arc`) until they end, so a borrowed slice never
//! dangles. The file never shrinks while it is open.
//!
//! Slices are handed out per page or run, never for the whole map: the writer rewrites free pages
//! while readers hold slices of live ones, and a slice must never cover bytes that change under it.
//! [`Map::pages`] hands out only pages the asking commit reaches, checked where the slice is made,
//! so a damaged page id in the file is an error, never a borrow of bytes being rewritten.
#![allow(unsafe_code)]

use std::fs::File;
use std::path::Path;

use crate::error::{Error, Result};
use crate::page::{self, Bad, PageId};
use crate::unreached::Unreached;

/// What one commit reaches: pages `2..high_water` except those marked `unreached`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reach<'a> {
    pub high_water: u64,
    pub unreached: &'a Unreached,
    pub page_size: usize,
}

/// A read-only shared mapping of the first `len` bytes of the database file.
#[derive(Debug)]
pub(crate) struct Map {
    raw: Option<memmap2::MmapRaw>,
    len: usize,
}

impl Map {
    /// The bytes mapped: the file's length when the map was made.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Maps the first `len` bytes of `file` (`len == 0` maps nothing).
    pub fn new(file: &File, len: u64, path: &Path) -> Result<Map> {
        if len == 0 {
            return Ok(Map { raw: None, len: 0 });
        }
        let len_usize = usize::try_from(len).map_err(|_| {
            Error::io(
                "mmap",
                path,
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "file too large for the address space",
                ),
            )
        })?;
        let raw = memmap2::MmapOptions::new()
            .len(len_usize)
            .map_raw_read_only(file)
            .map_err(|e| Error::io("mmap", path, e))?;
        Ok(Map {
            raw: Some(raw),
            len: len_usize,
        })
    }

    /// Unmaps the pages resident in the map from this process (`MADV_DONTNEED`); the next read
    /// of one maps it again, from the page cache or the file.
    pub fn release(&self) -> std::io::Result<()> {
        let Some(raw) = self.raw.as_ref() else {
            return Ok(());
        };
        // SAFETY: `MADV_DONTNEED` on a shared mapping of a file only drops this process's page
        // table entries: the bytes stay the file's, and the next access to a page faults it
        // back in from the page cache or the file, unchanged (the madvise(2) contract for
        // shared file mappings; only private and anonymous mappings come back zeroed). So a
        // slice handed out by `pages` and still borrowed reads the same bytes after this call
        // as before, and the mapping itself stays in place.
        unsafe { raw.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) }
    }

    /// The bytes of pages `id..id + pages` as `commit` reaches them, or why they are refused.
    ///
    /// Every id is checked here, where the slice is made, so no page id — however damaged the
    /// file that named it — yields bytes the writer may change while the slice lives.
    pub fn pages(
        &self,
        commit: &Reach<'_>,
        id: PageId,
        pages: u64,
    ) -> std::result::Result<&[u8], Bad> {
        let end = id.0.checked_add(pages);
        if id.0 < 2 || end.is_none_or(|e| e > commit.high_water) {
            return Err(page::bad(
                id,
                format!(
                    "run of {pages} pages outside the data pages 2..{}",
                    commit.high_water
                ),
            ));
        }
        if let Some(free) = commit.unreached.first_in(id.0, pages) {
            return Err(page::bad(
                id,
                format!(
                    "run of {pages} pages includes page {free}, which this commit does not reach"
                ),
            ));
        }
        let (off, len) = (
            (id.0 as usize).checked_mul(commit.page_size),
            (pages as usize).checked_mul(commit.page_size),
        );
        let range = off.zip(len).and_then(|(o, l)| Some((o, o.checked_add(l)?)));
        let Some((off, end)) = range.filter(|&(_, e)| e <= self.len) else {
            return Err(page::bad(id, "beyond the end of the mapped file"));
        };
        let Some(raw) = self.raw.as_ref() else {
            return Err(page::bad(id, "beyond the end of the mapped file"));
        };
        // SAFETY: `off..end` lies inside the mapping (checked above), which stays mapped while
        // `self` is borrowed: `MmapRaw` unmaps only on drop, and the file is never truncated below
        // a live map's length (it only grows while open, and an exclusive lock keeps other
        // processes out). The bytes do not change while the slice lives. The writer writes only
        // (1) the meta pages 0 and 1, refused above; (2) pages at or past the high-water mark of
        // the newest commit, which is at or past `commit`'s, refused above; (3) pages of its free
        // set. A page enters the free set only once no open reader's commit reaches it, and the
        // caller holds `commit` open while the slice lives (the slice borrows its reader), so a
        // page of (3) is marked in `commit.unreached`: refused above.
        Ok(unsafe { std::slice::from_raw_parts(raw.as_ptr().add(off), end - off) })
    }
}
