//! Compaction into a fresh file, online: a copy of one snapshot, then brought up to later
//! commits by copying only what changed since (see `btree::diff`).

use std::path::{Path, PathBuf};

use crate::btree::diff::{diff, Change};
use crate::btree::node::NodeRef;
use crate::btree::Tree;
use crate::db::{Db, Options};
use crate::error::{Error, Result};
use crate::tx::{Bucket, ReadTxn, WriteTxn};

/// Commit the copy every 64 MiB so its writer's arena stays bounded.
const BATCH: usize = 64 << 20;

/// A defragmented copy of a database in the making: a fresh file holding every bucket as of
/// one commit of the source ([`Db::copy_to`]), which [`Copy::catch_up`] brings up to the
/// source's newest commit, and [`Copy::finish`] makes durable.
///
/// The copy holds a read transaction on the source's state it has copied: the pages that state
/// reaches are not reused until the next catch-up (the source's file grows meanwhile by what
/// its writers write).
pub struct Copy {
    out: Db,
    from: ReadTxn,
    dst: PathBuf,
}

impl std::fmt::Debug for Copy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Copy")
            .field("dst", &self.dst)
            .field("copied", &self.from.txid())
            .finish()
    }
}

/// What one [`Copy::catch_up`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaughtUp {
    /// Entries written into the copy (added or changed in the source).
    pub puts: u64,
    /// Entries deleted from the copy.
    pub deletes: u64,
    /// Bytes of keys and values written.
    pub bytes: u64,
    /// Branch and leaf pages of the source read to find the changes.
    pub nodes_read: u64,
}

/// Writes into the copy, committing and starting a new transaction every [`BATCH`], and counts
/// what it wrote.
struct Batcher<'db> {
    out: &'db Db,
    w: Option<WriteTxn<'db>>,
    /// Bytes put since the last commit.
    pending: usize,
    done: CaughtUp,
}

impl<'db> Batcher<'db> {
    fn new(out: &'db Db) -> Batcher<'db> {
        Batcher {
            out,
            w: None,
            pending: 0,
            done: CaughtUp::default(),
        }
    }

    fn txn(&mut self) -> Result<&mut WriteTxn<'db>> {
        if self.pending >= BATCH {
            if let Some(w) = self.w.take() {
                w.commit_nosync()?;
            }
            self.pending = 0;
        }
        let w = match self.w.take() {
            Some(w) => w,
            None => self.out.begin_write()?,
        };
        Ok(self.w.insert(w))
    }

    fn put(&mut self, name: &[u8], k: &[u8], v: &[u8]) -> Result<()> {
        self.txn()?.bucket(name)?.put(k, v)?;
        self.pending += k.len() + v.len();
        self.done.puts += 1;
        self.done.bytes += (k.len() + v.len()) as u64;
        Ok(())
    }

    fn delete(&mut self, name: &[u8], k: &[u8]) -> Result<()> {
        self.txn()?.bucket(name)?.delete(k)?;
        self.done.deletes += 1;
        Ok(())
    }

    /// Creates bucket `name` in the copy with every entry of `src`.
    fn copy_bucket(&mut self, name: &[u8], src: Bucket<'_>) -> Result<()> {
        self.txn()?.create_bucket(name)?;
        for e in src.iter() {
            let (k, v) = e?;
            self.put(name, k, v)?;
        }
        Ok(())
    }

    /// Commits what is left; what was written.
    fn commit(mut self) -> Result<CaughtUp> {
        if let Some(w) = self.w.take() {
            w.commit_nosync()?;
        }
        Ok(self.done)
    }
}

impl Db {
    /// Copies every bucket as of the newest commit into a new, defragmented database at `dst`
    /// (which must not exist), with the same page size and freelist, its pages filled to 90%
    /// as etcd's defragmentation does. Writers go on meanwhile; [`Copy::catch_up`] then
    /// copies what they changed.
    pub fn copy_to(&self, dst: impl AsRef<Path>) -> Result<Copy> {
        let dst = dst.as_ref();
        if dst.exists() {
            return Err(Error::io(
                "compact",
                dst,
                std::io::Error::new(std::io::ErrorKind::AlreadyExists, "destination exists"),
            ));
        }
        let out = Db::open(
            dst,
            Options {
                page_size: Some(self.shared.page_size as u32),
                freelist: self.shared.opts.freelist,
                fill_percent: 0.9,
            },
        )?;
        let from = self.begin_read()?;
        let mut b = Batcher::new(&out);
        for name in from.buckets()? {
            b.copy_bucket(&name, from.bucket(&name)?)?;
        }
        b.commit()?;
        Ok(Copy {
            out,
            from,
            dst: dst.to_path_buf(),
        })
    }

    /// Copies every bucket into a new, defragmented database at `dst` (which must not exist):
    /// [`Db::copy_to`] and [`Copy::finish`], reading one snapshot (writers go on meanwhile,
    /// and what they write is not in the copy).
    pub fn compact_to(&self, dst: impl AsRef<Path>) -> Result<()> {
        self.copy_to(dst)?.finish()
    }
}

impl Copy {
    /// The source's commit the copy holds.
    pub fn copied(&self) -> crate::TxId {
        self.from.txid()
    }

    /// Brings the copy up to `src`'s newest commit (`src` must be the database copied from):
    /// buckets created or deleted since, and in each bucket the entries added, changed or
    /// deleted, found by [`btree::diff`](crate::btree) without reading what the two commits
    /// share — the work follows what changed, not the size of the database.
    pub fn catch_up(&mut self, src: &Db) -> Result<CaughtUp> {
        if !self.from.reads(&src.shared) {
            return Err(Error::io(
                "catch up a copy",
                src.path(),
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "not the database the copy was made from",
                ),
            ));
        }
        let next = src.begin_read()?;
        if next.txid() == self.from.txid() {
            return Ok(CaughtUp::default());
        }
        let (old_names, new_names) = (self.from.buckets()?, next.buckets()?);
        let mut b = Batcher::new(&self.out);
        for name in &old_names {
            if new_names.binary_search(name).is_err() {
                b.txn()?.delete_bucket(name)?;
            }
        }
        let mut nodes_read = 0;
        for name in &new_names {
            let Some(new_root) = next.bucket_root(name)? else {
                continue;
            };
            let Some(old_root) = self.from.bucket_root(name)? else {
                b.copy_bucket(name, next.bucket(name)?)?;
                continue;
            };
            if old_root == new_root {
                continue;
            }
            let values = Tree {
                snap: next.snap(),
                arena: &[],
                root: NodeRef::Page(new_root),
            };
            nodes_read += diff(
                (self.from.snap(), old_root),
                (next.snap(), new_root),
                |c| match c {
                    Change::Put(k, v) => b.put(name, k, values.resolve(v)?),
                    Change::Delete(k) => b.delete(name, k),
                },
            )?;
        }
        let done = CaughtUp {
            nodes_read,
            ..b.commit()?
        };
        self.from = next;
        Ok(done)
    }

    /// Makes what the copy holds so far durable (so that [`Copy::finish`] after a last
    /// catch-up has only that round's pages to write).
    pub fn sync(&self) -> Result<()> {
        self.out.sync()
    }

    /// Makes the copy durable and closes it; the file at the destination is complete.
    pub fn finish(self) -> Result<()> {
        drop(self.from);
        self.out.close()
    }
}
