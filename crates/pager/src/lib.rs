//! `pager`: kvd's storage engine — a single-file, memory-mapped, copy-on-write B+tree in the
//! spirit of bbolt and LMDB.
//!
//! - Named **buckets**, each an independent B+tree of byte keys and values. Values too large for
//!   a quarter page live in contiguous overflow runs, so even a 1.5 MiB value reads as one slice.
//! - **One writer, many readers.** A [`ReadTxn`] sees the commit that was newest when it began,
//!   never waits for the writer, and borrows keys and values straight from the memory map.
//! - **Commits** are atomic. [`WriteTxn::commit`] is durable (data fsynced, then the meta page);
//!   [`WriteTxn::commit_nosync`] is visible at once and durable at the next [`Db::sync`]. After a
//!   crash the file opens at one whole commit, never older than the last durable one.
//! - **Free pages** are tracked by one of two [`freelist`] algorithms chosen at open: bbolt's
//!   sorted array, or runs segregated by length with O(1) allocation and merging.
//! - **Tools**: [`Db::check`] (consistency), [`Db::stats`], [`Db::compact_to`] (defragment),
//!   and [`Db::copy_to`] with [`Copy::catch_up`]: a defragmentation that writers do not wait for.
//!
//! ```
//! # fn main() -> pager::Result<()> {
//! let dir = tempfile::tempdir().unwrap();
//! let db = pager::Db::open(dir.path().join("data.db"), pager::Options::default())?;
//!
//! let mut w = db.begin_write()?;
//! w.create_bucket(b"fruit")?.put(b"apple", b"red")?;
//! w.commit()?;
//!
//! let r = db.begin_read()?;
//! assert_eq!(r.bucket(b"fruit")?.get(b"apple")?, Some(&b"red"[..]));
//! let keys: Vec<&[u8]> = r.bucket(b"fruit")?.iter().map(|e| e.map(|(k, _)| k)).collect::<pager::Result<_>>()?;
//! assert_eq!(keys, vec![&b"apple"[..]]);
//! # Ok(()) }
//! ```

mod btree;
mod build;
mod check;
mod copy;
mod db;
mod error;
pub mod freelist;
mod map;
mod meta;
mod page;
mod tx;
mod unreached;

pub use btree::cursor::{Cursor, Entry, Range};
pub use build::Builder;
pub use check::Stats;
pub use copy::{CaughtUp, Copy};
pub use db::{Db, Options, Space, MAX_VALUE_LEN};
pub use error::{Error, Result};
pub use freelist::FreelistKind;
pub use page::{PageId, TxId};
pub use tx::{Bucket, BucketMut, ReadTxn, WriteTxn};

/// Whether `head`, a file's first bytes, starts like a pager file (its first meta page's magic);
/// a cheap look before [`Db::open`], which checks everything.
pub fn looks_like_pager_file(head: &[u8]) -> bool {
    head.get(..4) == Some(&meta::MAGIC.to_le_bytes()[..])
}
