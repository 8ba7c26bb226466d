//! The read-only memory map of the database file: the only `unsafe` in kvd.
//!
//! The file is written with `pwrite` and read through this map. A map is never resized: when the
//! file grows the writer makes a new, longer [`Map`] and publishes it to new transactions, while
//! transactions that hold the old one keep it (an `Arc`) until they end, so a borrowed slice never
//! dangles. The file never shrinks while it is open.
//!
//! Slices are handed out per page or run, never for the whole map: the writer rewrites free pages
//! while readers hold slices of live ones, and a slice must never cover bytes that change under it.
#![allow(unsafe_code)]

use std::fs::File;
use std::path::Path;

use crate::error::{Error, Result};

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

    /// The bytes `off..off + len` of the file, or `None` when they are not all mapped.
    ///
    /// Callers only ask for pages that are reachable from the snapshot they read (or that they
    /// are about to validate as such): the pager never writes such a page while a transaction
    /// that can reach it is open (see `Freelist` and `WriteTxn::commit`).
    pub fn bytes(&self, off: usize, len: usize) -> Option<&[u8]> {
        let end = off.checked_add(len)?;
        if end > self.len {
            return None;
        }
        let raw = self.raw.as_ref()?;
        // SAFETY: `off..end` lies inside the mapping (checked above), which stays mapped while
        // `self` is borrowed: `MmapRaw` unmaps only on drop, and the file is never truncated below
        // a live map's length (it only grows while open, and an exclusive lock keeps other
        // processes out). The bytes do not change while the slice lives: the pager only writes
        // pages that are free, and a page is free only when no open transaction can reach it —
        // the slice is borrowed from such a transaction, which keeps its pages from being freed.
        Some(unsafe { std::slice::from_raw_parts(raw.as_ptr().add(off), len) })
    }
}
