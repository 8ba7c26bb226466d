//! What can be wrong with a bbolt file: every failure is a value naming the file (and the page,
//! where there is one), never a panic.

use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong reading or writing a bbolt file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done ("open", "read", "write").
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Neither meta page is a valid bbolt meta: the file is not a bbolt database, or both of
    /// its meta pages are damaged.
    #[error("{path}: not a bbolt database (page 0: {meta0}; page 1: {meta1})")]
    NotBolt {
        path: PathBuf,
        meta0: String,
        meta1: String,
    },
    /// The file ends before the pages its meta says it has.
    #[error(
        "{path}: truncated: {len} bytes, but its meta counts {pages} pages of {page_size} bytes"
    )]
    Truncated {
        path: PathBuf,
        len: u64,
        pages: u64,
        page_size: u32,
    },
    /// A page contradicts the format or the tree it is part of.
    #[error("{path}: page {page} is corrupt: {reason}")]
    Corrupt {
        path: PathBuf,
        page: u64,
        reason: String,
    },
    /// What a writer was given breaks the format's rules (keys out of order, too large).
    #[error("{0}")]
    Input(String),
}
