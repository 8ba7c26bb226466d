//! A new database file built front to back from buckets given in key order — what a restore
//! writes. Leaves are packed full and each branch page is written once its children are
//! (bottom up, no tree descents), a large value's overflow run as the value comes; the pages
//! go out in large sequential writes. Nothing is held in memory but one page per tree level.
//! The meta pages are written last, after the rest is synced: a build cut short leaves no
//! database, and [`Builder::finish`] leaves a durable one.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::btree::node::{NewVal, Node, NodeRef};
use crate::db::DEFAULT_PAGE_SIZE;
use crate::error::{Error, Result};
use crate::meta::{self, valid_page_size};
use crate::page::{self, PageId, LEAF_ELEM};
use crate::tx::{check_entry, check_key};

/// Bytes gathered before they are written.
const WRITE_CHUNK: usize = 4 << 20;

/// A database file being built (see the module's documentation).
#[derive(Debug)]
pub struct Builder {
    file: File,
    path: PathBuf,
    ps: usize,
    /// The next page id to give out.
    next: u64,
    /// Pages given out but not yet written, from page `written`.
    out: Vec<u8>,
    written: u64,
    /// The bucket being filled: `levels[0]` its leaf, above it its branches, and how many
    /// pages each level has written.
    levels: Vec<(Node, u64)>,
    bucket: Option<Vec<u8>>,
    last_key: Option<Vec<u8>>,
    /// Buckets finished: name and root page.
    done: Vec<(Vec<u8>, PageId)>,
}

impl Builder {
    /// Starts a new database at `path`, which must not exist, with pages of `page_size` bytes
    /// (default 4096).
    pub fn create(path: impl AsRef<Path>, page_size: Option<u32>) -> Result<Builder> {
        let path = path.as_ref().to_path_buf();
        let ps = page_size.unwrap_or(DEFAULT_PAGE_SIZE);
        if !valid_page_size(ps) {
            return Err(Error::InvalidPageSize(ps));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| Error::io("create", &path, e))?;
        let ps = ps as usize;
        Ok(Builder {
            file,
            path,
            ps,
            next: 2,
            // The meta pages' place, written last.
            out: Vec::with_capacity(WRITE_CHUNK + ps),
            written: 2,
            levels: Vec::new(),
            bucket: None,
            last_key: None,
            done: Vec::new(),
        })
    }

    /// Starts bucket `name` (names in increasing order); its entries follow.
    pub fn bucket(&mut self, name: &[u8]) -> Result<()> {
        self.end_bucket()?;
        if self.done.last().is_some_and(|(n, _)| n.as_slice() >= name) {
            return Err(Error::Unordered(format!(
                "bucket {:?} after {:?}",
                String::from_utf8_lossy(name),
                String::from_utf8_lossy(&self.done.last().expect("checked").0)
            )));
        }
        check_key(name, self.ps)?;
        self.bucket = Some(name.to_vec());
        self.levels = vec![(Node::empty_leaf(), 0)];
        self.last_key = None;
        Ok(())
    }

    /// Adds `key` → `value` to the bucket begun last (keys in strictly increasing order).
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        let Some(bucket) = &self.bucket else {
            return Err(Error::Unordered("an entry before any bucket".into()));
        };
        if self.last_key.as_deref().is_some_and(|l| l >= key) {
            return Err(Error::Unordered(format!(
                "bucket {:?}: keys must strictly increase",
                String::from_utf8_lossy(bucket)
            )));
        }
        let inline = check_entry(key, value, self.ps)?;
        match &mut self.last_key {
            Some(l) => {
                l.clear();
                l.extend_from_slice(key);
            }
            None => self.last_key = Some(key.to_vec()),
        }
        // As a write transaction stores it: inline, or in an overflow run of its own.
        let val = if inline {
            NewVal::Inline(value)
        } else {
            let pages = page::run_pages(value.len(), self.ps);
            let id = self.take(pages);
            let at = self.out.len() - pages as usize * self.ps;
            page::write_overflow(&mut self.out[at..], id, pages, value);
            NewVal::Stored {
                page: id,
                len: value.len(),
            }
        };
        self.add_entry(key, val)
    }

    /// Gives out `pages` zeroed pages at the end of the pending output; their first id.
    fn take(&mut self, pages: u64) -> PageId {
        let id = PageId(self.next);
        self.next += pages;
        self.out
            .resize(self.out.len() + pages as usize * self.ps, 0);
        id
    }

    /// Adds a leaf entry, writing the leaf first if the entry would not fit.
    fn add_entry(&mut self, key: &[u8], val: NewVal<'_>) -> Result<()> {
        let n = &self.levels[0].0;
        let entry = LEAF_ELEM + key.len() + val.stored_len();
        if n.len() > 0 && (n.size + entry > self.ps || n.len() == u16::MAX as usize) {
            self.write_level(0)?;
        }
        let n = &mut self.levels[0].0;
        let at = n.len();
        n.insert(at, key, val);
        Ok(())
    }

    /// Adds a child's first key to the branch at `level`, writing the branch first if it
    /// would not fit.
    fn add_child(&mut self, level: usize, key: &[u8], child: PageId) -> Result<()> {
        if self.levels.len() <= level {
            self.levels.push((Node::branch(&[], &[]), 0));
        }
        let n = &self.levels[level].0;
        if n.len() > 0
            && (n.size + page::BRANCH_ELEM + key.len() > self.ps || n.len() == u16::MAX as usize)
        {
            self.write_level(level)?;
        }
        let (n, _) = &mut self.levels[level];
        let at = n.len();
        n.insert_kid(at, key, NodeRef::Page(child));
        Ok(())
    }

    /// Writes the page at `level` and adds it to its parent.
    fn write_level(&mut self, level: usize) -> Result<()> {
        let leaf = level == 0;
        let fresh = if leaf {
            Node::empty_leaf()
        } else {
            Node::branch(&[], &[])
        };
        let (n, count) = &mut self.levels[level];
        let n = std::mem::replace(n, fresh);
        *count += 1;
        let first = if n.len() > 0 {
            n.key(0).to_vec()
        } else {
            Vec::new()
        };
        let id = self.take(1);
        let at = self.out.len() - self.ps;
        n.write(&mut self.out[at..], id);
        self.spill()?;
        self.add_child(level + 1, &first, id)
    }

    /// Writes the pending output once it is large.
    fn spill(&mut self) -> Result<()> {
        if self.out.len() >= WRITE_CHUNK {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        self.file
            .write_all_at(&self.out, self.written * self.ps as u64)
            .map_err(|e| Error::io("write", &self.path, e))?;
        self.written += (self.out.len() / self.ps) as u64;
        self.out.clear();
        Ok(())
    }

    /// Writes what is left of the tree being filled; its root page.
    fn end_tree(&mut self) -> Result<PageId> {
        // An empty tree is one empty leaf.
        if self.levels[0].0.len() > 0 || self.levels[0].1 == 0 {
            self.write_level(0)?;
        }
        let mut level = 1;
        loop {
            let (n, written) = &self.levels[level];
            if *written == 0 && n.len() == 1 {
                let NodeRef::Page(root) = n.kids[0] else {
                    unreachable!("a built branch holds written children")
                };
                self.levels.truncate(1);
                return Ok(root);
            }
            self.write_level(level)?;
            level += 1;
        }
    }

    fn end_bucket(&mut self) -> Result<()> {
        if let Some(name) = self.bucket.take() {
            let root = self.end_tree()?;
            self.done.push((name, root));
        }
        Ok(())
    }

    /// Writes the tree of buckets, syncs the pages, then writes and syncs the meta pages.
    pub fn finish(mut self) -> Result<()> {
        self.end_bucket()?;
        self.levels = vec![(Node::empty_leaf(), 0)];
        for (name, root) in std::mem::take(&mut self.done) {
            self.add_entry(&name, NewVal::Inline(&root.0.to_le_bytes()))?;
        }
        let root = self.end_tree()?;
        self.flush()?;
        let sync = |f: &File, path: &Path| f.sync_all().map_err(|e| Error::io("fsync", path, e));
        sync(&self.file, &self.path)?;
        let mut metas = vec![0u8; 2 * self.ps];
        meta::write_first(&mut metas, self.ps as u32, root, self.next);
        self.file
            .write_all_at(&metas, 0)
            .map_err(|e| Error::io("write", &self.path, e))?;
        sync(&self.file, &self.path)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::{Db, Options};

    type Buckets = BTreeMap<Vec<u8>, BTreeMap<Vec<u8>, Vec<u8>>>;

    fn buckets() -> impl Strategy<Value = Buckets> {
        let value = prop_oneof![
            8 => proptest::collection::vec(any::<u8>(), 0..200),
            1 => proptest::collection::vec(any::<u8>(), 900..20_000),
        ];
        let kvs = proptest::collection::btree_map(
            proptest::collection::vec(any::<u8>(), 1..60),
            value,
            0..600,
        );
        proptest::collection::btree_map(proptest::collection::vec(b'a'..=b'z', 1..12), kvs, 0..5)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// What a build writes opens as a database that checks out and holds exactly what was
        /// given, and takes writes afterwards.
        #[test]
        fn a_built_file_opens_checks_and_reads_back(data in buckets(), small in any::<bool>()) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("db");
            let ps = if small { 1024 } else { 4096 };
            let mut b = Builder::create(&path, Some(ps)).unwrap();
            for (name, kvs) in &data {
                b.bucket(name).unwrap();
                for (k, v) in kvs {
                    b.put(k, v).unwrap();
                }
            }
            b.finish().unwrap();
            let db = Db::open(&path, Options::default()).unwrap();
            db.check().unwrap();
            let r = db.begin_read().unwrap();
            prop_assert_eq!(r.buckets().unwrap(), data.keys().cloned().collect::<Vec<_>>());
            for (name, kvs) in &data {
                let got: BTreeMap<Vec<u8>, Vec<u8>> = r
                    .bucket(name)
                    .unwrap()
                    .iter()
                    .map(|e| e.map(|(k, v)| (k.to_vec(), v.to_vec())))
                    .collect::<Result<_>>()
                    .unwrap();
                prop_assert_eq!(&got, kvs);
            }
            drop(r);
            let mut w = db.begin_write().unwrap();
            w.create_bucket_if_missing(b"after").unwrap().put(b"k", &[1; 3000]).unwrap();
            w.commit().unwrap();
            db.check().unwrap();
        }
    }

    #[test]
    fn out_of_order_input_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut b = Builder::create(dir.path().join("db"), None).unwrap();
        assert!(matches!(b.put(b"k", b"v"), Err(Error::Unordered(_))));
        b.bucket(b"m").unwrap();
        b.put(b"b", b"v").unwrap();
        assert!(matches!(b.put(b"a", b"v"), Err(Error::Unordered(_))));
        assert!(matches!(b.bucket(b"a"), Err(Error::Unordered(_))));
        assert!(
            Builder::create(dir.path().join("db"), None).is_err(),
            "the file exists"
        );
    }
}
