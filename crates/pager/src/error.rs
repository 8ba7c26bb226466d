//! The pager's error type: every failure from the disk or from a caller is a value, never a panic.

use std::path::PathBuf;

use crate::page::PageId;

/// Result alias for pager operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the pager.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done ("open", "write", "fdatasync", ...).
        op: &'static str,
        /// The database file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// Neither meta page holds a valid meta: the file is not a database or is damaged beyond
    /// what the alternate meta can repair.
    #[error("{path}: no valid meta page (page 0: {meta0}; page 1: {meta1}); the file is not a kvd database or both meta pages are damaged, restore it from a backup or snapshot")]
    NoValidMeta {
        /// The database file.
        path: PathBuf,
        /// Why meta page 0 was rejected.
        meta0: String,
        /// Why meta page 1 was rejected.
        meta1: String,
    },
    /// A page's content contradicts the format (bad header, out-of-range offsets, bad checksum...).
    #[error("{path}: page {page} is corrupt: {reason}; run a consistency check, restore from a backup or snapshot")]
    Corrupt {
        /// The database file.
        path: PathBuf,
        /// The page where the damage was found.
        page: PageId,
        /// What failed.
        reason: String,
    },
    /// The file is shorter than its meta says: it was truncated.
    #[error("{path}: file is {actual} bytes but its meta needs {needed} bytes (page size {page_size}); the file was truncated, restore it from a backup or snapshot")]
    Truncated {
        /// The database file.
        path: PathBuf,
        /// The file's length.
        actual: u64,
        /// The length the meta's high-water mark requires.
        needed: u64,
        /// The page size recorded in the meta.
        page_size: u32,
    },
    /// The requested page size is not a power of two in the supported range.
    #[error("invalid page size {0}: must be a power of two between 1024 and 65536")]
    InvalidPageSize(u32),
    /// `Options::page_size` differs from the page size the existing file was created with.
    #[error("{path}: created with page size {stored}, opened with page size {requested}")]
    PageSizeMismatch {
        /// The database file.
        path: PathBuf,
        /// The page size in the file's meta.
        stored: u32,
        /// The page size asked for at open.
        requested: u32,
    },
    /// Another process (or another `Db` in this one) holds the file.
    #[error("{path}: database is locked by another process")]
    Locked {
        /// The database file.
        path: PathBuf,
    },
    /// A key longer than [`crate::Db::max_key_len`].
    #[error("key of {len} bytes exceeds the maximum of {max} bytes")]
    KeyTooLarge {
        /// The key's length.
        len: usize,
        /// The limit for this database's page size.
        max: usize,
    },
    /// A value longer than [`crate::MAX_VALUE_LEN`].
    #[error("value of {len} bytes exceeds the maximum of {max} bytes")]
    ValueTooLarge {
        /// The value's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A [`crate::Builder`] given a bucket or key out of order.
    #[error("{0}: a build takes buckets and keys in increasing order")]
    Unordered(String),
    /// An empty key: the pager reserves nothing for it, but no caller should store one.
    #[error("key is empty")]
    EmptyKey,
    /// The named bucket does not exist.
    #[error("bucket {0:?} not found")]
    BucketNotFound(String),
    /// `create_bucket` on a name that exists.
    #[error("bucket {0:?} already exists")]
    BucketExists(String),
    /// The consistency check found problems.
    #[error("{path}: consistency check failed: {}", problems.join("; "))]
    Inconsistent {
        /// The database file.
        path: PathBuf,
        /// Every problem found (capped).
        problems: Vec<String>,
    },
}

impl Error {
    pub(crate) fn io(op: &'static str, path: &std::path::Path, source: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Renders a bucket name for messages.
pub(crate) fn name_str(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}
