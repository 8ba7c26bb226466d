//! Transactions and the buckets seen through them.

use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use parking_lot::MutexGuard;

use crate::btree::cursor::{Cursor, Range};
use crate::btree::edit::{Editor, Write};
use crate::btree::node::{NewVal, NodeRef};
use crate::btree::{Snap, Tree};
use crate::db::{self, max_entry, Shared, Writer, MAX_VALUE_LEN};
use crate::error::{name_str, Error, Result};
use crate::freelist::{self, Freelist, Run};
use crate::meta::Meta;
use crate::page::{self, PageId, TxId, LEAF_ELEM};

/// Looks up a bucket's root in the root tree.
fn bucket_root(tree: &Tree<'_>, name: &[u8]) -> Result<Option<PageId>> {
    match tree.get(name)? {
        None => Ok(None),
        Some(v) => match <[u8; 8]>::try_from(v) {
            Ok(b) => Ok(Some(PageId(u64::from_le_bytes(b)))),
            Err(_) => Err(tree.snap.corrupt(page::bad(
                PageId(0),
                format!(
                    "root tree entry for bucket {:?} is {} bytes, not a page id",
                    name_str(name),
                    v.len()
                ),
            ))),
        },
    }
}

fn bucket_names(tree: Tree<'_>) -> Result<Vec<Vec<u8>>> {
    Range::new(tree, Bound::Unbounded, Bound::Unbounded)
        .map(|e| e.map(|(k, _)| k.to_vec()))
        .collect()
}

/// A read-only view of one bucket; keys and values borrow from the transaction's map.
#[derive(Clone, Copy)]
pub struct Bucket<'a> {
    tree: Tree<'a>,
}

impl std::fmt::Debug for Bucket<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket")
            .field("root", &self.tree.root)
            .finish()
    }
}

fn bounds<'k, R: RangeBounds<&'k [u8]>>(r: &R) -> (Bound<&'k [u8]>, Bound<&'k [u8]>) {
    (r.start_bound().cloned(), r.end_bound().cloned())
}

impl<'a> Bucket<'a> {
    /// The value of `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<&'a [u8]>> {
        self.tree.get(key)
    }

    /// A cursor, unpositioned until its first move.
    pub fn cursor(&self) -> Cursor<'a> {
        Cursor::new(self.tree)
    }

    /// The entries whose keys fall in `range`, in key order.
    pub fn range<'k, R: RangeBounds<&'k [u8]>>(&self, range: R) -> Range<'a> {
        let (s, e) = bounds(&range);
        Range::new(self.tree, s, e)
    }

    /// All entries in key order.
    pub fn iter(&self) -> Range<'a> {
        Range::new(self.tree, Bound::Unbounded, Bound::Unbounded)
    }
}

/// A read transaction: the snapshot of the newest commit at its start. Any number may be open,
/// alongside the writer; none waits for it.
#[derive(Debug)]
pub struct ReadTxn {
    shared: Arc<Shared>,
    snap: Snap,
    meta: Meta,
}

impl ReadTxn {
    pub(crate) fn new(shared: Arc<Shared>) -> ReadTxn {
        let (meta, map, unreached) = {
            let mut p = shared.published.lock();
            let meta = p.meta;
            *p.readers.entry(meta.txid).or_default() += 1;
            (meta, p.map.clone(), p.unreached.clone())
        };
        let snap = shared.snap(&meta, map, unreached);
        ReadTxn { shared, snap, meta }
    }

    /// The commit this transaction reads.
    pub fn txid(&self) -> TxId {
        self.meta.txid
    }

    fn root(&self) -> Tree<'_> {
        Tree {
            snap: &self.snap,
            arena: &[],
            root: NodeRef::Page(self.meta.root),
        }
    }

    /// The bucket `name`.
    pub fn bucket(&self, name: &[u8]) -> Result<Bucket<'_>> {
        let root = bucket_root(&self.root(), name)?
            .ok_or_else(|| Error::BucketNotFound(name_str(name)))?;
        Ok(Bucket {
            tree: Tree {
                snap: &self.snap,
                arena: &[],
                root: NodeRef::Page(root),
            },
        })
    }

    /// The names of all buckets, in order.
    pub fn buckets(&self) -> Result<Vec<Vec<u8>>> {
        bucket_names(self.root())
    }

    /// The snapshot this transaction reads.
    pub(crate) fn snap(&self) -> &Snap {
        &self.snap
    }

    /// The root page of bucket `name`, if there is one.
    pub(crate) fn bucket_root(&self, name: &[u8]) -> Result<Option<PageId>> {
        bucket_root(&self.root(), name)
    }

    /// Whether this transaction reads `db`.
    pub(crate) fn reads(&self, db: &Arc<Shared>) -> bool {
        Arc::ptr_eq(&self.shared, db)
    }
}

impl Drop for ReadTxn {
    fn drop(&mut self) {
        let mut p = self.shared.published.lock();
        if let Some(n) = p.readers.get_mut(&self.meta.txid) {
            *n -= 1;
            if *n == 0 {
                p.readers.remove(&self.meta.txid);
            }
        }
    }
}

/// The write transaction. Dropping it without committing rolls it back.
pub struct WriteTxn<'db> {
    shared: &'db Shared,
    w: MutexGuard<'db, Writer>,
    snap: Snap,
    root: NodeRef,
    /// Buckets opened or created in this transaction, with their current roots.
    open: Vec<(Vec<u8>, NodeRef)>,
    ed: Editor,
}

impl std::fmt::Debug for WriteTxn<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteTxn")
            .field("base", &self.w.meta.txid)
            .finish()
    }
}

/// A bucket open for writing; borrows its write transaction.
pub struct BucketMut<'t> {
    snap: &'t Snap,
    ed: &'t mut Editor,
    root: &'t mut NodeRef,
}

impl std::fmt::Debug for BucketMut<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BucketMut")
            .field("root", &self.root)
            .finish()
    }
}

impl BucketMut<'_> {
    fn tree(&self) -> Tree<'_> {
        Tree {
            snap: self.snap,
            arena: &self.ed.arena,
            root: *self.root,
        }
    }

    /// Inserts `key` or replaces its value.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        let val = if check_entry(key, value, self.snap.page_size)? {
            NewVal::Inline(value)
        } else {
            NewVal::Big(value.to_vec())
        };
        self.ed.put(self.snap, self.root, key, val)
    }

    /// Removes `key`; returns whether it was there.
    pub fn delete(&mut self, key: &[u8]) -> Result<bool> {
        self.ed.delete(self.snap, self.root, key)
    }

    /// The value of `key`, as of this transaction's edits.
    pub fn get(&self, key: &[u8]) -> Result<Option<&[u8]>> {
        self.tree().get(key)
    }

    /// A cursor over this transaction's view of the bucket.
    pub fn cursor(&self) -> Cursor<'_> {
        Cursor::new(self.tree())
    }

    /// The entries whose keys fall in `range`, as of this transaction's edits.
    pub fn range<'k, R: RangeBounds<&'k [u8]>>(&self, range: R) -> Range<'_> {
        let (s, e) = bounds(&range);
        Range::new(self.tree(), s, e)
    }
}

/// Checks an entry to be stored; whether its value goes in its leaf (else in an overflow run
/// of its own).
pub(crate) fn check_entry(key: &[u8], value: &[u8], page_size: usize) -> Result<bool> {
    check_key(key, page_size)?;
    if value.len() > MAX_VALUE_LEN {
        return Err(Error::ValueTooLarge {
            len: value.len(),
            max: MAX_VALUE_LEN,
        });
    }
    Ok(LEAF_ELEM + key.len() + value.len() <= max_entry(page_size))
}

pub(crate) fn check_key(key: &[u8], page_size: usize) -> Result<()> {
    if key.is_empty() {
        return Err(Error::EmptyKey);
    }
    let max = db::max_key_len(page_size);
    if key.len() > max {
        return Err(Error::KeyTooLarge {
            len: key.len(),
            max,
        });
    }
    Ok(())
}

/// Hands out pages for a commit: from the free set, else past the high-water mark; and frees the
/// pages the commit no longer reaches. `taken` and `freed` are what changes in what it reaches.
struct Alloc<'a> {
    freelist: &'a mut Freelist,
    high_water: u64,
    taken: Vec<Run>,
    freed: Vec<Run>,
}

impl Alloc<'_> {
    fn take(&mut self, n: u64) -> PageId {
        match self.freelist.allocate(n) {
            Some(p) => {
                self.taken.push((p, n));
                p
            }
            None => {
                let p = PageId(self.high_water);
                self.high_water += n;
                p
            }
        }
    }

    fn free(&mut self, txid: TxId, runs: Vec<Run>) {
        self.freed.extend_from_slice(&runs);
        self.freelist.free(txid, runs);
    }
}

impl<'db> WriteTxn<'db> {
    pub(crate) fn new(shared: &'db Shared) -> Result<WriteTxn<'db>> {
        let mut w = shared.writer.lock();
        if let Some(why) = &w.poisoned {
            return Err(shared.io("write", std::io::Error::other(why.clone())));
        }
        // Pages freed by commit T are reusable once no reader reads a commit before T and the
        // meta open could fall back to is at least T.
        let oldest_reader = shared.published.lock().readers.keys().next().copied();
        let upto = oldest_reader.map_or(w.durable_prev, |r| r.min(w.durable_prev));
        w.freelist.release_upto(upto);
        let snap = shared.snap(&w.meta, w.map.clone(), w.unreached.clone());
        let root = NodeRef::Page(w.meta.root);
        Ok(WriteTxn {
            shared,
            w,
            snap,
            root,
            open: Vec::new(),
            ed: Editor::new(shared.page_size, shared.opts.fill_percent),
        })
    }

    fn root_tree(&self) -> Tree<'_> {
        Tree {
            snap: &self.snap,
            arena: &self.ed.arena,
            root: self.root,
        }
    }

    fn find_open(&mut self, name: &[u8]) -> Result<Option<usize>> {
        if let Some(i) = self.open.iter().position(|(n, _)| n == name) {
            return Ok(Some(i));
        }
        match bucket_root(&self.root_tree(), name)? {
            None => Ok(None),
            Some(root) => {
                self.open.push((name.to_vec(), NodeRef::Page(root)));
                Ok(Some(self.open.len() - 1))
            }
        }
    }

    fn bucket_at(&mut self, i: usize) -> BucketMut<'_> {
        BucketMut {
            snap: &self.snap,
            ed: &mut self.ed,
            root: &mut self.open[i].1,
        }
    }

    /// The bucket `name`, for reading and writing.
    pub fn bucket(&mut self, name: &[u8]) -> Result<BucketMut<'_>> {
        let i = self
            .find_open(name)?
            .ok_or_else(|| Error::BucketNotFound(name_str(name)))?;
        Ok(self.bucket_at(i))
    }

    /// Creates the bucket `name`; an error if it exists.
    pub fn create_bucket(&mut self, name: &[u8]) -> Result<BucketMut<'_>> {
        if self.find_open(name)?.is_some() {
            return Err(Error::BucketExists(name_str(name)));
        }
        check_key(name, self.snap.page_size)?;
        // The entry's value (the root page) is filled in at commit.
        self.ed
            .put(&self.snap, &mut self.root, name, NewVal::Inline(&[0; 8]))?;
        let root = self.ed.new_leaf();
        self.open.push((name.to_vec(), root));
        Ok(self.bucket_at(self.open.len() - 1))
    }

    /// The bucket `name`, created if missing.
    pub fn create_bucket_if_missing(&mut self, name: &[u8]) -> Result<BucketMut<'_>> {
        match self.find_open(name)? {
            Some(i) => Ok(self.bucket_at(i)),
            None => self.create_bucket(name),
        }
    }

    /// Deletes the bucket `name` and everything in it.
    pub fn delete_bucket(&mut self, name: &[u8]) -> Result<()> {
        let i = self
            .find_open(name)?
            .ok_or_else(|| Error::BucketNotFound(name_str(name)))?;
        let (_, root) = self.open.remove(i);
        self.ed.free_tree(&self.snap, root, 0)?;
        self.ed.delete(&self.snap, &mut self.root, name)?;
        Ok(())
    }

    /// The names of all buckets, in order, as of this transaction.
    pub fn buckets(&self) -> Result<Vec<Vec<u8>>> {
        bucket_names(self.root_tree())
    }

    /// Commits durably: data pages are fsynced, then the meta is written and fsynced. Also makes
    /// every earlier `commit_nosync` durable.
    pub fn commit(self) -> Result<()> {
        self.finish(true)
    }

    /// Commits atomically but not durably: new transactions see the commit at once, but after a
    /// crash the database opens at the last durable commit until [`crate::Db::sync`] or a
    /// durable [`WriteTxn::commit`] follows. Pages this commit frees are not reused before then.
    pub fn commit_nosync(self) -> Result<()> {
        self.finish(false)
    }

    fn finish(mut self, durable: bool) -> Result<()> {
        let needs_sync = durable && self.w.durable < self.w.meta.txid;
        if !self.ed.is_dirty() && !needs_sync {
            return Ok(());
        }
        let txid = TxId(self.w.meta.txid.0 + 1);
        let w = &mut *self.w;
        let mut alloc = Alloc {
            freelist: &mut w.freelist,
            high_water: w.meta.high_water,
            taken: Vec::new(),
            freed: Vec::new(),
        };
        let spilled = write_commit(
            self.shared,
            &self.snap,
            &mut self.ed,
            &mut self.root,
            &mut self.open,
            &mut alloc,
            txid,
            durable,
            w.freelist_run,
        );
        let Alloc {
            high_water,
            taken,
            freed,
            ..
        } = alloc;
        let outcome = spilled.and_then(|(writes, new_run)| {
            let NodeRef::Page(root) = self.root else {
                unreachable!("spill leaves the root on a page")
            };
            let (freelist, freelist_pages) = new_run.or(w.freelist_run).unwrap_or((PageId(0), 0));
            let meta = Meta {
                page_size: w.meta.page_size,
                root,
                freelist,
                freelist_pages,
                high_water,
                txid,
            };
            persist(self.shared, w, &writes, &meta, durable)?;
            Ok((meta, new_run))
        });
        match outcome {
            Ok((meta, new_run)) => {
                if durable {
                    w.freelist_run = new_run;
                }
                w.meta = meta;
                let unreached = Arc::make_mut(&mut w.unreached);
                for &run in &taken {
                    unreached.mark(run, false);
                }
                for &run in &freed {
                    unreached.mark(run, true);
                }
                let mut p = self.shared.published.lock();
                p.meta = meta;
                p.unreached = w.unreached.clone();
                p.unreachable_pages = w.freelist.free_count() + w.freelist.pending_count();
                p.map = w.map.clone();
                Ok(())
            }
            Err(e) => {
                for run in taken {
                    w.freelist.unallocate(run);
                }
                w.freelist.rollback(txid);
                Err(e)
            }
        }
    }
}

/// The pages a commit writes, and the run of its persisted freelist (durable commits only).
type Spilled = (Vec<Write>, Option<Run>);

/// Spills every edited tree and, for a durable commit, the freelist; returns the pages to write
/// and the new freelist run.
#[allow(clippy::too_many_arguments)]
fn write_commit(
    shared: &Shared,
    snap: &Snap,
    ed: &mut Editor,
    root: &mut NodeRef,
    open: &mut [(Vec<u8>, NodeRef)],
    alloc: &mut Alloc<'_>,
    txid: TxId,
    durable: bool,
    old_run: Option<Run>,
) -> Result<Spilled> {
    let mut writes = Vec::new();
    for (name, broot) in open.iter_mut() {
        if let NodeRef::Mem(_) = broot {
            let id = ed.spill(*broot, &mut |n| alloc.take(n), &mut writes);
            *broot = NodeRef::Page(id);
            ed.put(snap, root, name, NewVal::Inline(&id.0.to_le_bytes()))?;
        }
    }
    *root = NodeRef::Page(ed.spill(*root, &mut |n| alloc.take(n), &mut writes));
    alloc.free(txid, std::mem::take(&mut ed.freed));
    let mut new_run = None;
    if durable {
        if let Some(run) = old_run {
            alloc.free(txid, vec![run]);
        }
        let upper = alloc.freelist.free_count() + alloc.freelist.pending_count();
        let pages = freelist::encoded_pages(upper as usize, shared.page_size);
        let at = alloc.take(pages);
        let ids = alloc.freelist.all_ids();
        writes.push(Write {
            id: at,
            buf: freelist::encode(&ids, at, pages, shared.page_size),
        });
        new_run = Some((at, pages));
    }
    Ok((writes, new_run))
}

/// Writes a commit's pages and, if durable, syncs them and writes and syncs its meta.
fn persist(
    shared: &Shared,
    w: &mut Writer,
    writes: &[Write],
    meta: &Meta,
    durable: bool,
) -> Result<()> {
    db::ensure_len(shared, w, meta.high_water)?;
    write_pages(shared, writes)?;
    if !durable {
        return Ok(());
    }
    fail::fail_point!("pager::before_data_sync", |_| Err(failpoint(
        shared,
        "before_data_sync"
    )));
    sync(shared, w)?;
    fail::fail_point!("pager::before_meta_write", |_| Err(failpoint(
        shared,
        "before_meta_write"
    )));
    let slot = 1 - w.durable_slot;
    shared.write_at(&meta.encode(), slot * shared.page_size as u64)?;
    fail::fail_point!("pager::before_meta_sync", |_| Err(failpoint(
        shared,
        "before_meta_sync"
    )));
    sync(shared, w)?;
    w.durable_prev = w.durable;
    w.durable = meta.txid;
    w.durable_slot = slot;
    Ok(())
}

#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
fn failpoint(shared: &Shared, name: &str) -> Error {
    shared.io(
        "commit",
        std::io::Error::other(format!("failpoint pager::{name}")),
    )
}

fn sync(shared: &Shared, w: &mut Writer) -> Result<()> {
    shared.file.sync_data().map_err(|e| {
        w.poisoned = Some(format!(
            "an earlier fdatasync failed ({e}); reopen the database"
        ));
        shared.io("fdatasync", e)
    })
}

/// Writes pages in id order, one `pwrite` per contiguous stretch.
fn write_pages(shared: &Shared, writes: &[Write]) -> Result<()> {
    let ps = shared.page_size as u64;
    let mut order: Vec<&Write> = writes.iter().collect();
    order.sort_unstable_by_key(|w| w.id);
    let mut buf: Vec<u8> = Vec::new();
    let mut start = PageId(0);
    for w in order {
        if buf.is_empty() || start.0 * ps + buf.len() as u64 != w.id.0 * ps {
            if !buf.is_empty() {
                shared.write_at(&buf, start.0 * ps)?;
            }
            buf.clear();
            start = w.id;
        }
        buf.extend_from_slice(&w.buf);
    }
    if !buf.is_empty() {
        shared.write_at(&buf, start.0 * ps)?;
    }
    Ok(())
}
