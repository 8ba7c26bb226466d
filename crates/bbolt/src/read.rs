//! Reading a bbolt file: the meta pages, then buckets walked page by page with `pread`, every
//! page checked before it is used — its header against its position, its elements against its
//! bounds, its children against the high-water mark, keys in order, and no page reached twice
//! (so a file whose pages lie, or form a cycle, is an error, never a hang or a panic).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::format::{
    u32_at, u64_at, Header, Meta, BRANCH, BUCKET_HEADER, BUCKET_LEAF, ELEMENT, FREELIST, HEADER,
    LEAF, NO_FREELIST,
};

/// Trees deeper than this are taken for corrupt (a real one with two keys a page and 2^40
/// pages is 40 levels deep).
const MAX_DEPTH: usize = 64;

/// Where a bucket's tree is: a root page, or an inline leaf page carried in its parent's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketRef {
    root: u64,
    pub sequence: u64,
    /// The inline page's bytes (header and elements), when `root` is 0.
    inline: Option<Vec<u8>>,
}

impl BucketRef {
    /// The page of the bucket's tree (none for an inline bucket, kept in its parent's page).
    pub fn root_page(&self) -> Option<u64> {
        self.inline.is_none().then_some(self.root)
    }

    /// The bucket whose header is `value` (a bucket element's value), as found in `page`.
    fn parse(db: &Db, value: &[u8], page: u64) -> Result<BucketRef> {
        if value.len() < BUCKET_HEADER {
            return Err(db.corrupt(page, "a bucket's header is shorter than 16 bytes"));
        }
        let root = u64_at(value, 0);
        let sequence = u64_at(value, 8);
        if root == 0 {
            let inline = &value[BUCKET_HEADER..];
            if inline.len() < HEADER || Header::parse(inline).flags != LEAF {
                return Err(db.corrupt(page, "an inline bucket holds no leaf page"));
            }
            return Ok(BucketRef {
                root,
                sequence,
                inline: Some(inline.to_vec()),
            });
        }
        db.check_id(root, page, "a bucket's root")?;
        Ok(BucketRef {
            root,
            sequence,
            inline: None,
        })
    }
}

/// One element of a bucket: a value, or a nested bucket.
#[derive(Debug)]
pub enum Item<'a> {
    Value(&'a [u8]),
    Bucket(BucketRef),
}

/// An open bbolt file (read-only).
#[derive(Debug)]
pub struct Db {
    file: File,
    path: PathBuf,
    meta: Meta,
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |source| Error::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

impl Db {
    /// Opens the bbolt file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Db> {
        let path = path.as_ref();
        let len = std::fs::metadata(path).map_err(io("stat", path))?.len();
        Db::open_prefix(path, len)
    }

    /// Opens the bbolt database in the first `len` bytes of the file at `path` (a snapshot file
    /// ends with a SHA-256 that is not part of it).
    pub fn open_prefix(path: impl AsRef<Path>, len: u64) -> Result<Db> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(io("open", &path))?;
        let meta = read_meta(&file, &path, len)?;
        let pages = len / u64::from(meta.page_size);
        if meta.pgid > pages {
            return Err(Error::Truncated {
                path,
                len,
                pages: meta.pgid,
                page_size: meta.page_size,
            });
        }
        Ok(Db { file, path, meta })
    }

    /// The current meta page's fields.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The bytes the database's pages take (`pgid × page size`): what `tx.Size()` reports.
    pub fn size(&self) -> u64 {
        self.meta.pgid * u64::from(self.meta.page_size)
    }

    /// The tree of top-level buckets.
    pub fn root(&self) -> BucketRef {
        BucketRef {
            root: self.meta.root,
            sequence: self.meta.root_sequence,
            inline: None,
        }
    }

    /// The top-level buckets, by name, in order.
    pub fn buckets(&self) -> Result<Vec<(Vec<u8>, BucketRef)>> {
        let mut out = Vec::new();
        self.walker().for_each(&self.root(), &mut |k, item| {
            match item {
                Item::Bucket(b) => out.push((k.to_vec(), b)),
                Item::Value(_) => {}
            }
            Ok(true)
        })?;
        Ok(out)
    }

    /// The top-level bucket `name`.
    pub fn bucket(&self, name: &[u8]) -> Result<Option<BucketRef>> {
        Ok(self
            .buckets()?
            .into_iter()
            .find_map(|(n, b)| (n == name).then_some(b)))
    }

    /// The value of `key` in bucket `b` (a scan: meant for small buckets).
    pub fn get(&self, b: &BucketRef, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut found = None;
        self.walker().for_each(b, &mut |k, item| {
            if k == key {
                if let Item::Value(v) = item {
                    found = Some(v.to_vec());
                }
                return Ok(false);
            }
            Ok(k < key)
        })?;
        Ok(found)
    }

    /// A walk that reaches each page at most once, across every bucket it is given.
    pub fn walker(&self) -> Walker<'_> {
        Walker {
            db: self,
            reached: Bits::new(self.meta.pgid),
            bufs: Vec::new(),
        }
    }

    pub(crate) fn corrupt(&self, page: u64, reason: impl Into<String>) -> Error {
        Error::Corrupt {
            path: self.path.clone(),
            page,
            reason: reason.into(),
        }
    }

    /// Checks that `id`, which page `from` names as `what`, is a page in use.
    fn check_id(&self, id: u64, from: u64, what: &str) -> Result<()> {
        if id < 2 || id >= self.meta.pgid {
            return Err(self.corrupt(
                from,
                format!(
                    "{what} is page {id}, outside the pages in use (2..{})",
                    self.meta.pgid
                ),
            ));
        }
        Ok(())
    }

    /// Reads page `id` and the pages it overflows into into `buf`; returns its header.
    pub(crate) fn read_page(&self, id: u64, buf: &mut Vec<u8>) -> Result<Header> {
        let ps = self.meta.page_size as usize;
        buf.resize(ps, 0);
        self.file
            .read_exact_at(buf, id * ps as u64)
            .map_err(io("read", &self.path))?;
        let h = Header::parse(buf);
        if h.id != id {
            return Err(self.corrupt(id, format!("it says it is page {}", h.id)));
        }
        if h.overflow > 0 {
            let end = id.checked_add(u64::from(h.overflow));
            if end.is_none_or(|e| e >= self.meta.pgid) {
                return Err(self.corrupt(
                    id,
                    format!(
                        "it runs on into {} more pages, past the pages in use ({})",
                        h.overflow, self.meta.pgid
                    ),
                ));
            }
            buf.resize(ps * (1 + h.overflow as usize), 0);
            self.file
                .read_exact_at(&mut buf[ps..], (id + 1) * ps as u64)
                .map_err(io("read", &self.path))?;
        }
        Ok(h)
    }

    /// The free pages the freelist page records (none when it is not stored).
    pub fn free_pages(&self) -> Result<Vec<u64>> {
        let id = self.meta.freelist;
        if id == NO_FREELIST {
            return Ok(Vec::new());
        }
        let mut buf = Vec::new();
        let h = self.read_page(id, &mut buf)?;
        if h.flags != FREELIST {
            return Err(self.corrupt(id, format!("the freelist page has flags {:#x}", h.flags)));
        }
        let (start, count) = if h.count == 0xFFFF {
            (HEADER + 8, u64_at(&buf, HEADER))
        } else {
            (HEADER, u64::from(h.count))
        };
        if count > ((buf.len() - start) / 8) as u64 {
            return Err(self.corrupt(id, format!("{count} free page ids do not fit in it")));
        }
        let ids: Vec<u64> = (0..count as usize)
            .map(|i| u64_at(&buf, start + 8 * i))
            .collect();
        for &f in &ids {
            self.check_id(f, id, "a free page")?;
        }
        Ok(ids)
    }
}

/// Reads both meta pages and returns the current one: the valid one with the higher txid.
fn read_meta(file: &File, path: &Path, len: u64) -> Result<Meta> {
    let read = |off: u64, n: usize| -> Option<Vec<u8>> {
        let mut b = vec![0; n];
        (off + n as u64 <= len && file.read_exact_at(&mut b, off).is_ok()).then_some(b)
    };
    let short = || "the file is too short for it".to_string();
    // Page 0 gives the page size; if it is damaged, page 1 is looked for where each page size
    // bbolt writes would put it (as bbolt does).
    let m0 = read(0, 4096)
        .or_else(|| read(0, 1024))
        .ok_or_else(short)
        .and_then(|b| Meta::parse(&b, 0));
    let sizes: Vec<u32> = match &m0 {
        Ok(m) => vec![m.page_size],
        Err(_) => (0..=6).map(|i| 1024u32 << i).collect(),
    };
    let mut m1 = Err(short());
    for ps in sizes {
        m1 = read(u64::from(ps), ps as usize)
            .ok_or_else(short)
            .and_then(|b| Meta::parse(&b, 1))
            .and_then(|m| {
                if m.page_size == ps {
                    Ok(m)
                } else {
                    Err(format!(
                        "page size {} where it was found at {ps}",
                        m.page_size
                    ))
                }
            });
        if m1.is_ok() {
            break;
        }
    }
    match (m0, m1) {
        (Ok(a), Ok(b)) if a.page_size != b.page_size => Err(Error::NotBolt {
            path: path.to_path_buf(),
            meta0: format!("page size {}", a.page_size),
            meta1: format!("page size {}", b.page_size),
        }),
        (Ok(a), Ok(b)) => Ok(if b.txid > a.txid { b } else { a }),
        (Ok(m), Err(_)) | (Err(_), Ok(m)) => Ok(m),
        (Err(meta0), Err(meta1)) => Err(Error::NotBolt {
            path: path.to_path_buf(),
            meta0,
            meta1,
        }),
    }
}

/// A set of page ids below the high-water mark.
#[derive(Debug)]
pub(crate) struct Bits(Vec<u64>);

impl Bits {
    pub(crate) fn new(n: u64) -> Bits {
        Bits(vec![0; n.div_ceil(64) as usize])
    }

    /// Adds `id`; false if it was there already.
    pub(crate) fn insert(&mut self, id: u64) -> bool {
        let (w, b) = ((id / 64) as usize, id % 64);
        let had = self.0[w] & (1 << b) != 0;
        self.0[w] |= 1 << b;
        !had
    }

    pub(crate) fn contains(&self, id: u64) -> bool {
        self.0[(id / 64) as usize] & (1 << (id % 64)) != 0
    }
}

/// A walk over buckets that reaches each page at most once (a second time is corruption: a
/// cycle, or a page shared by two trees).
#[derive(Debug)]
pub struct Walker<'db> {
    db: &'db Db,
    pub(crate) reached: Bits,
    /// A page buffer per level of the tree being walked.
    bufs: Vec<Vec<u8>>,
}

/// The last key seen in a bucket's walk: keys must strictly increase.
struct Order {
    last: Vec<u8>,
    any: bool,
}

impl Walker<'_> {
    /// Calls `f` with each element of bucket `b`, in key order, while it returns `Ok(true)`.
    pub fn for_each(
        &mut self,
        b: &BucketRef,
        f: &mut dyn FnMut(&[u8], Item<'_>) -> Result<bool>,
    ) -> Result<()> {
        let mut order = Order {
            last: Vec::new(),
            any: false,
        };
        match &b.inline {
            Some(page) => {
                let h = Header::parse(page);
                // An inline page is part of its parent's page: errors name the parent's root.
                self.leaf(page, h.count, 0, &mut order, f)?;
            }
            None => {
                self.page(b.root, 0, &mut order, f)?;
            }
        }
        Ok(())
    }

    /// Walks the tree under page `id`; false once `f` asked to stop.
    fn page(
        &mut self,
        id: u64,
        depth: usize,
        order: &mut Order,
        f: &mut dyn FnMut(&[u8], Item<'_>) -> Result<bool>,
    ) -> Result<bool> {
        let db = self.db;
        if depth >= MAX_DEPTH {
            return Err(db.corrupt(id, format!("the tree is deeper than {MAX_DEPTH} levels")));
        }
        if !self.reached.insert(id) {
            return Err(db.corrupt(
                id,
                "it is reached twice (a cycle, or a page shared by two trees)",
            ));
        }
        if self.bufs.len() <= depth {
            self.bufs.push(Vec::new());
        }
        let mut buf = std::mem::take(&mut self.bufs[depth]);
        let h = db.read_page(id, &mut buf)?;
        for extra in 1..=u64::from(h.overflow) {
            if !self.reached.insert(id + extra) {
                return Err(db.corrupt(
                    id,
                    format!("its overflow page {} is reached twice", id + extra),
                ));
            }
        }
        let go_on = match h.flags {
            LEAF => self.leaf(&buf, h.count, id, order, f)?,
            BRANCH => self.branch(&buf, h.count, id, depth, order, f)?,
            other => {
                return Err(db.corrupt(
                    id,
                    format!("flags {other:#x} where a branch or leaf page should be"),
                ))
            }
        };
        self.bufs[depth] = buf;
        Ok(go_on)
    }

    fn branch(
        &mut self,
        buf: &[u8],
        count: u16,
        id: u64,
        depth: usize,
        order: &mut Order,
        f: &mut dyn FnMut(&[u8], Item<'_>) -> Result<bool>,
    ) -> Result<bool> {
        let db = self.db;
        if count == 0 {
            return Err(db.corrupt(id, "a branch page with no elements"));
        }
        let mut children = Vec::with_capacity(count as usize);
        let mut prev: Option<&[u8]> = None;
        for i in 0..count as usize {
            let at = HEADER + i * ELEMENT;
            let e = buf
                .get(at..at + ELEMENT)
                .ok_or_else(|| db.corrupt(id, format!("element {i} lies past the page's end")))?;
            let (pos, ksize, child) = (u32_at(e, 0) as usize, u32_at(e, 4) as usize, u64_at(e, 8));
            let key = at
                .checked_add(pos)
                .and_then(|s| Some(s..s.checked_add(ksize)?))
                .and_then(|r| buf.get(r))
                .ok_or_else(|| {
                    db.corrupt(id, format!("element {i}'s key lies past the page's end"))
                })?;
            if prev.is_some_and(|p| p >= key) {
                return Err(db.corrupt(id, format!("branch keys out of order at element {i}")));
            }
            prev = Some(key);
            db.check_id(child, id, &format!("element {i}'s child"))?;
            children.push(child);
        }
        for child in children {
            if !self.page(child, depth + 1, order, f)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The elements of a leaf page (`buf`: its bytes; `id`: the page, for errors).
    fn leaf(
        &mut self,
        buf: &[u8],
        count: u16,
        id: u64,
        order: &mut Order,
        f: &mut dyn FnMut(&[u8], Item<'_>) -> Result<bool>,
    ) -> Result<bool> {
        let db = self.db;
        for i in 0..count as usize {
            let at = HEADER + i * ELEMENT;
            let e = buf
                .get(at..at + ELEMENT)
                .ok_or_else(|| db.corrupt(id, format!("element {i} lies past the page's end")))?;
            let flags = u32_at(e, 0);
            let (pos, ksize, vsize) = (
                u32_at(e, 4) as usize,
                u32_at(e, 8) as usize,
                u32_at(e, 12) as usize,
            );
            let kv = at
                .checked_add(pos)
                .and_then(|s| Some(s..s.checked_add(ksize)?.checked_add(vsize)?))
                .and_then(|r| buf.get(r))
                .ok_or_else(|| {
                    db.corrupt(
                        id,
                        format!("element {i}'s key and value lie past the page's end"),
                    )
                })?;
            let (key, value) = kv.split_at(ksize);
            if order.any && order.last.as_slice() >= key {
                return Err(db.corrupt(id, format!("keys out of order at element {i}")));
            }
            order.last.clear();
            order.last.extend_from_slice(key);
            order.any = true;
            let item = if flags & BUCKET_LEAF != 0 {
                Item::Bucket(BucketRef::parse(db, value, id)?)
            } else {
                Item::Value(value)
            };
            if !f(key, item)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}
