//! Writing a bbolt file from buckets given in key order, as a stream: pages are laid out bottom
//! up (leaves filled in order, each branch page written once its children are), so nothing but
//! one page per tree level is held in memory, and the file is written front to back.
//!
//! The meta pages come first and name the root page and the page count, which are known only
//! once everything is laid out: the data is fed twice — [`plan`] lays the file out from the
//! sizes alone, [`write`] writes it — and the second feed must give what the first did (one
//! read snapshot of a store, read twice).
//!
//! Every bucket gets a root page of its own (no inline buckets); buckets do not nest; the
//! freelist page is stored and empty. bbolt, etcd and `tx.Check()` take such a file as any
//! other.

use std::io::Write;

use crate::error::{Error, Result};
use crate::format::{
    Header, Meta, BRANCH, BUCKET_HEADER, BUCKET_LEAF, ELEMENT, FREELIST, HEADER, LEAF, MAX_KEY,
    MAX_VALUE,
};

/// Where a file's pages fall: what [`plan`] finds and [`write`] follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub page_size: u32,
    /// The page of the tree of buckets.
    pub root: u64,
    pub freelist: u64,
    /// Pages in the file.
    pub pages: u64,
}

impl Layout {
    /// The file's size in bytes.
    pub fn size(&self) -> u64 {
        self.pages * u64::from(self.page_size)
    }
}

/// Lays out the file the buckets `feed` gives would make (with pages of `page_size` bytes).
pub fn plan<E: From<Error>>(
    page_size: u32,
    feed: &mut dyn FnMut(&mut Sink<'_>) -> Result<(), E>,
) -> Result<Layout, E> {
    if !page_size.is_power_of_two() || !(1024..=65536).contains(&page_size) {
        return Err(Error::Input(format!(
            "page size {page_size}: want a power of two from 1024 to 65536"
        ))
        .into());
    }
    let mut sink = Sink::new(page_size, None);
    feed(&mut sink)?;
    Ok(sink.finish()?)
}

/// Writes the file `layout` planned into `out`, from the same buckets `feed` gives again.
pub fn write<E: From<Error>>(
    layout: &Layout,
    out: &mut dyn Write,
    feed: &mut dyn FnMut(&mut Sink<'_>) -> Result<(), E>,
) -> Result<(), E> {
    let meta = Meta {
        page_size: layout.page_size,
        root: layout.root,
        root_sequence: 0,
        freelist: layout.freelist,
        pgid: layout.pages,
        txid: 0,
    };
    // As a new bbolt file: meta page n with txid n.
    for id in 0..2 {
        let m = Meta { txid: id, ..meta };
        out.write_all(&m.page(id)).map_err(out_err)?;
    }
    let mut sink = Sink::new(layout.page_size, Some(out));
    feed(&mut sink)?;
    let got = sink.finish()?;
    if got != *layout {
        return Err(Error::Input(format!(
            "the data changed between laying the file out ({layout:?}) and writing it ({got:?})"
        ))
        .into());
    }
    Ok(())
}

fn out_err(source: std::io::Error) -> Error {
    Error::Io {
        op: "write",
        path: "(bbolt output)".into(),
        source,
    }
}

/// One page being filled: its elements' headers (flags or child page, key size, value size)
/// and bytes (only when writing).
#[derive(Debug, Default)]
struct Level {
    elems: Vec<(u64, u32, u32)>,
    data: Vec<u8>,
    /// Bytes the page takes so far: header, element headers, keys and values.
    size: usize,
    first_key: Vec<u8>,
    /// Pages this level has written.
    written: u64,
}

/// Receives buckets and their entries in order, and lays them out as pages.
pub struct Sink<'a> {
    ps: usize,
    out: Option<&'a mut dyn Write>,
    next: u64,
    /// The bucket being filled: `levels[0]` its leaf, above it its branches.
    levels: Vec<Level>,
    bucket: Option<Vec<u8>>,
    last_key: Option<Vec<u8>>,
    /// Buckets finished: name and root page.
    done: Vec<(Vec<u8>, u64)>,
    page: Vec<u8>,
}

impl std::fmt::Debug for Sink<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("writing", &self.out.is_some())
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl<'a> Sink<'a> {
    fn new(page_size: u32, out: Option<&'a mut dyn Write>) -> Sink<'a> {
        Sink {
            ps: page_size as usize,
            out,
            next: 2,
            levels: Vec::new(),
            bucket: None,
            last_key: None,
            done: Vec::new(),
            page: Vec::new(),
        }
    }

    /// Starts top-level bucket `name` (names in increasing order); its entries follow.
    pub fn bucket(&mut self, name: &[u8]) -> Result<()> {
        self.end_bucket()?;
        if self.done.last().is_some_and(|(n, _)| n.as_slice() >= name) {
            return Err(Error::Input(format!(
                "bucket {:?} after {:?}: buckets must come in order",
                String::from_utf8_lossy(name),
                String::from_utf8_lossy(&self.done.last().expect("checked").0)
            )));
        }
        check_sizes(name, &[])?;
        self.bucket = Some(name.to_vec());
        self.levels = vec![Level::default()];
        self.last_key = None;
        Ok(())
    }

    /// Adds `key` → `value` to the bucket begun last (keys in strictly increasing order).
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        let Some(bucket) = &self.bucket else {
            return Err(Error::Input("an entry before any bucket".into()));
        };
        if self.last_key.as_deref().is_some_and(|l| l >= key) {
            return Err(Error::Input(format!(
                "bucket {:?}: keys must strictly increase",
                String::from_utf8_lossy(bucket)
            )));
        }
        check_sizes(key, value)?;
        self.last_key = Some(key.to_vec());
        self.add(0, 0, key, value)
    }

    /// Adds an element to the page at `level` (a leaf element with `flags`, or at a branch
    /// level a child's first key with the child page in `tag`), writing the page first if the
    /// element would not fit.
    fn add(&mut self, level: usize, tag: u64, key: &[u8], value: &[u8]) -> Result<()> {
        if self.levels.len() <= level {
            self.levels.push(Level::default());
        }
        let need = ELEMENT + key.len() + value.len();
        let l = &self.levels[level];
        if !l.elems.is_empty() && (l.size + need > self.ps || l.elems.len() == 0xFFFF) {
            self.flush(level)?;
        }
        let writing = self.out.is_some();
        let l = &mut self.levels[level];
        if l.elems.is_empty() {
            l.size = HEADER;
            l.first_key.clear();
            l.first_key.extend_from_slice(key);
        }
        l.elems.push((tag, key.len() as u32, value.len() as u32));
        l.size += need;
        if writing {
            l.data.extend_from_slice(key);
            l.data.extend_from_slice(value);
        }
        Ok(())
    }

    /// Writes the page at `level` and adds it to its parent.
    fn flush(&mut self, level: usize) -> Result<()> {
        let ps = self.ps;
        let id = self.next;
        let mut l = std::mem::take(&mut self.levels[level]);
        let pages = l.size.div_ceil(ps).max(1);
        self.next += pages as u64;
        if let Some(out) = self.out.as_mut() {
            let p = &mut self.page;
            p.clear();
            p.resize(pages * ps, 0);
            Header {
                id,
                flags: if level == 0 { LEAF } else { BRANCH },
                count: l.elems.len() as u16,
                overflow: (pages - 1) as u32,
            }
            .write(p);
            let mut pos = HEADER + l.elems.len() * ELEMENT;
            p[pos..pos + l.data.len()].copy_from_slice(&l.data);
            for (i, &(tag, ksize, vsize)) in l.elems.iter().enumerate() {
                let e = &mut p[HEADER + i * ELEMENT..HEADER + (i + 1) * ELEMENT];
                let rel = (pos - (HEADER + i * ELEMENT)) as u32;
                if level == 0 {
                    e[0..4].copy_from_slice(&(tag as u32).to_le_bytes());
                    e[4..8].copy_from_slice(&rel.to_le_bytes());
                    e[8..12].copy_from_slice(&ksize.to_le_bytes());
                    e[12..16].copy_from_slice(&vsize.to_le_bytes());
                } else {
                    e[0..4].copy_from_slice(&rel.to_le_bytes());
                    e[4..8].copy_from_slice(&ksize.to_le_bytes());
                    e[8..16].copy_from_slice(&tag.to_le_bytes());
                }
                pos += (ksize + vsize) as usize;
            }
            out.write_all(p).map_err(out_err)?;
        }
        let first = std::mem::take(&mut l.first_key);
        l.elems.clear();
        l.data.clear();
        l.size = HEADER;
        l.written += 1;
        self.levels[level] = l;
        self.add(level + 1, id, &first, &[])?;
        // The key buffer goes back for the level's next page.
        self.levels[level].first_key = first;
        Ok(())
    }

    /// Writes what is left of the bucket being filled; returns its root page.
    fn end_tree(&mut self) -> Result<u64> {
        // An empty tree is one empty leaf.
        if !self.levels[0].elems.is_empty() || self.levels[0].written == 0 {
            self.flush(0)?;
        }
        let mut level = 1;
        loop {
            let l = &self.levels[level];
            if l.written == 0 && l.elems.len() == 1 {
                let root = l.elems[0].0;
                self.levels.truncate(1);
                return Ok(root);
            }
            self.flush(level)?;
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

    /// Writes the tree of buckets and the freelist; returns where everything fell.
    fn finish(mut self) -> Result<Layout> {
        self.end_bucket()?;
        self.levels = vec![Level::default()];
        let done = std::mem::take(&mut self.done);
        let mut header = [0u8; BUCKET_HEADER];
        for (name, root) in &done {
            header[..8].copy_from_slice(&root.to_le_bytes());
            self.add(0, u64::from(BUCKET_LEAF), name, &header)?;
        }
        let root = self.end_tree()?;
        let freelist = self.next;
        self.next += 1;
        if let Some(out) = self.out.as_mut() {
            let mut p = vec![0; self.ps];
            Header {
                id: freelist,
                flags: FREELIST,
                count: 0,
                overflow: 0,
            }
            .write(&mut p);
            out.write_all(&p).map_err(out_err)?;
        }
        Ok(Layout {
            page_size: self.ps as u32,
            root,
            freelist,
            pages: self.next,
        })
    }
}

fn check_sizes(key: &[u8], value: &[u8]) -> Result<()> {
    if key.is_empty() || key.len() > MAX_KEY {
        return Err(Error::Input(format!(
            "a key of {} bytes: bbolt takes 1 to {MAX_KEY}",
            key.len()
        )));
    }
    if value.len() > MAX_VALUE {
        return Err(Error::Input(format!(
            "a value of {} bytes: bbolt takes at most {MAX_VALUE}",
            value.len()
        )));
    }
    Ok(())
}
