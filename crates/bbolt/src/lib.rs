//! `bbolt`: bbolt's file format — the single-file B+tree etcd keeps its data in — read and
//! written without Go. It knows nothing of etcd: buckets of byte keys and values.
//!
//! - [`Db`] reads a file with `pread`, checking every page before it is used; a truncated,
//!   bit-flipped or lying file is an [`Error`] naming the file and page, never a panic or a
//!   hang. [`Db::check`] is bbolt's `tx.Check()`.
//! - [`plan`] and [`write`] stream a new file front to back from buckets given in key order,
//!   holding one page per tree level in memory.
//!
//! ```
//! # fn main() -> Result<(), bbolt::Error> {
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("db");
//! let mut feed = |s: &mut bbolt::Sink<'_>| -> Result<(), bbolt::Error> {
//!     s.bucket(b"fruit")?;
//!     s.put(b"apple", b"red")?;
//!     s.put(b"banana", b"yellow")
//! };
//! let layout = bbolt::plan(4096, &mut feed)?;
//! let mut file = std::fs::File::create(&path).unwrap();
//! bbolt::write(&layout, &mut file, &mut feed)?;
//!
//! let db = bbolt::Db::open(&path)?;
//! let fruit = db.bucket(b"fruit")?.expect("written");
//! assert_eq!(db.get(&fruit, b"banana")?, Some(b"yellow".to_vec()));
//! db.check()?;
//! # Ok(()) }
//! ```

mod check;
mod error;
mod format;
mod read;
mod write;

pub use check::Checked;
pub use error::{Error, Result};
pub use format::{Meta, MAX_KEY, MAX_VALUE, NO_FREELIST};
pub use read::{BucketRef, Db, Item, Walker};
pub use write::{plan, write, Layout, Sink};

/// Whether `head`, a file's first bytes, starts like a bbolt file (its first meta page's
/// magic); a cheap look before [`Db::open`], which checks everything.
pub fn looks_like_bolt_file(head: &[u8]) -> bool {
    head.get(16..20) == Some(&format::MAGIC.to_le_bytes()[..])
}
