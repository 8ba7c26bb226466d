//! Opening a database file, and the state shared by its transactions.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::btree::Snap;
use crate::error::{Error, Result};
use crate::freelist::{self, Freelist, FreelistKind, Run};
use crate::map::Map;
use crate::meta::{self, Meta, META_LEN};
use crate::page::{self, Kind, PageId, TxId, HEADER, LEAF_ELEM, OVERFLOW_REF};
use crate::tx::{ReadTxn, WriteTxn};
use crate::unreached::Unreached;

/// The largest value the pager stores (overflow runs count their pages in 32 bits).
pub const MAX_VALUE_LEN: usize = 1 << 30;

/// How to open a database.
#[derive(Clone, Debug)]
pub struct Options {
    /// Page size for a new file (default 4096). For an existing file, `None` takes the stored
    /// size and `Some` must match it.
    pub page_size: Option<u32>,
    /// The free-set algorithm (not stored in the file: any kind opens any file).
    pub freelist: FreelistKind,
    /// How full a split leaves the left node, 0.1..=1.0 (bbolt's fill percent; default 0.5).
    /// Append-only loads want 1.0: each page is filled before the next is started.
    pub fill_percent: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            page_size: None,
            freelist: FreelistKind::default(),
            fill_percent: 0.5,
        }
    }
}

pub(crate) const DEFAULT_PAGE_SIZE: u32 = 4096;

/// What readers start from: the newest commit (durable or not) and the map that covers it.
#[derive(Debug)]
pub(crate) struct Published {
    pub meta: Meta,
    pub map: Arc<Map>,
    /// The pages `meta`'s commit does not reach.
    pub unreached: Arc<Unreached>,
    /// Open read transactions by the txid they read.
    pub readers: BTreeMap<TxId, usize>,
    /// Pages `meta`'s commit does not reach: free, or freed and waiting to be reusable.
    pub unreachable_pages: u64,
}

/// The space the newest commit occupies, as bbolt reports it to etcd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Space {
    /// Bytes below the high-water mark (the file itself is grown in larger chunks): what etcd
    /// reports as `dbSize` and checks against its quota.
    pub size: u64,
    /// `size` less the pages the newest commit does not reach: etcd's `dbSizeInUse`. (bbolt
    /// counts pages freed but not yet reusable as in use; etcd's durable commits every 100 ms
    /// make them reusable at once, while kvd's pager keeps them until its next sync.)
    pub in_use: u64,
}

/// The writer's state: the only one who allocates pages and writes the file.
#[derive(Debug)]
pub(crate) struct Writer {
    /// The newest commit (it may not be durable yet).
    pub meta: Meta,
    pub map: Arc<Map>,
    pub file_len: u64,
    pub freelist: Freelist,
    /// The pages `meta`'s commit does not reach: the free set and the pending pages.
    pub unreached: Arc<Unreached>,
    /// The run holding the freelist of the newest durable meta.
    pub freelist_run: Option<Run>,
    /// Txid of the newest durable meta and the meta slot (0 or 1) holding it.
    pub durable: TxId,
    pub durable_slot: u64,
    /// Txid of the meta in the other slot: open falls back to it if the newest is damaged, so
    /// pages it can reach are not reused until a newer durable meta replaces it.
    pub durable_prev: TxId,
    /// Set when fdatasync failed: the kernel may have dropped dirty pages, so no further commit
    /// may claim durability.
    pub poisoned: Option<String>,
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub path: Arc<Path>,
    pub file: File,
    pub page_size: usize,
    pub opts: Options,
    pub published: Mutex<Published>,
    pub writer: Mutex<Writer>,
}

impl Shared {
    pub fn snap(&self, meta: &Meta, map: Arc<Map>, unreached: Arc<Unreached>) -> Snap {
        Snap {
            map,
            high_water: meta.high_water,
            unreached,
            page_size: self.page_size,
            path: self.path.clone(),
        }
    }

    pub fn io(&self, op: &'static str, e: std::io::Error) -> Error {
        Error::io(op, &self.path, e)
    }

    pub fn write_at(&self, buf: &[u8], off: u64) -> Result<()> {
        self.file
            .write_all_at(buf, off)
            .map_err(|e| self.io("write", e))
    }
}

/// A database file: one writer at a time, any number of concurrent readers.
///
/// `Db` is `Send + Sync`; share it with an `Arc`. Read transactions own a handle to the file, so
/// they may outlive the `Db` value.
#[derive(Debug)]
pub struct Db {
    pub(crate) shared: Arc<Shared>,
}

impl Db {
    /// Opens the database at `path`, creating it if it does not exist or is empty.
    pub fn open(path: impl AsRef<Path>, opts: Options) -> Result<Db> {
        let path: Arc<Path> = Arc::from(path.as_ref());
        if let Some(ps) = opts.page_size {
            if !meta::valid_page_size(ps) {
                return Err(Error::InvalidPageSize(ps));
            }
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| Error::io("open", &path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::Locked {
                    path: path.to_path_buf(),
                })
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(Error::io("lock", &path, e)),
        }
        let len = file
            .metadata()
            .map_err(|e| Error::io("stat", &path, e))?
            .len();
        if len == 0 {
            init(&file, &path, opts.page_size.unwrap_or(DEFAULT_PAGE_SIZE))?;
        }
        let (meta, slot, prev) = read_metas(&file, &path, opts.page_size)?;
        if let Some(ps) = opts.page_size {
            if ps != meta.page_size {
                return Err(Error::PageSizeMismatch {
                    path: path.to_path_buf(),
                    stored: meta.page_size,
                    requested: ps,
                });
            }
        }
        let page_size = meta.page_size as usize;
        let file_len = file
            .metadata()
            .map_err(|e| Error::io("stat", &path, e))?
            .len();
        let needed = meta.high_water * page_size as u64;
        if file_len < needed {
            return Err(Error::Truncated {
                path: path.to_path_buf(),
                actual: file_len,
                needed,
                page_size: meta.page_size,
            });
        }
        let map = Arc::new(Map::new(&file, file_len, &path)?);
        // The freelist is read before the pages it names are known: nothing is refused for it.
        let snap = Snap {
            map: map.clone(),
            high_water: meta.high_water,
            unreached: Arc::default(),
            page_size,
            path: path.clone(),
        };
        let (ids, freelist_run) = if meta.freelist_pages > 0 {
            let buf = snap.run(meta.freelist, meta.freelist_pages)?;
            let ids = freelist::decode(buf, meta.freelist, meta.high_water)
                .map_err(|b| snap.corrupt(b))?;
            (ids, Some((meta.freelist, meta.freelist_pages)))
        } else {
            (Vec::new(), None)
        };
        let runs = freelist::runs_of(&ids);
        let free = Freelist::new(opts.freelist, &runs);
        let unreached = Arc::new(Unreached::of(&runs));
        let unreachable_pages = free.free_count();
        let writer = Writer {
            meta,
            map: map.clone(),
            file_len,
            freelist: free,
            unreached: unreached.clone(),
            freelist_run,
            durable: meta.txid,
            durable_slot: slot,
            durable_prev: prev.unwrap_or(meta.txid),
            poisoned: None,
        };
        let published = Published {
            meta,
            map,
            unreached,
            readers: BTreeMap::new(),
            unreachable_pages,
        };
        Ok(Db {
            shared: Arc::new(Shared {
                path,
                file,
                page_size,
                opts,
                published: Mutex::new(published),
                writer: Mutex::new(writer),
            }),
        })
    }

    /// The database file's path.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// The file's size as of the newest commit (no system call, no writer lock: cheap enough
    /// for every request's quota check).
    pub fn file_size(&self) -> u64 {
        self.shared.published.lock().map.len() as u64
    }

    /// Drops the file's pages this process has read through the map from its resident set: a
    /// scan of the whole file (the index rebuild at open) leaves every page it read resident
    /// and counted against the process (and a container's limit), though nothing may read it
    /// again soon. The pages stay in the kernel's page cache, which reclaims them when memory
    /// is short; a later read maps them again from there. The contents do not change.
    pub fn release_resident(&self) -> Result<()> {
        let map = self.shared.published.lock().map.clone();
        map.release().map_err(|e| self.shared.io("madvise", e))
    }

    /// The space the newest commit occupies (no system call, no writer lock).
    pub fn space(&self) -> Space {
        let p = self.shared.published.lock();
        let ps = self.shared.page_size as u64;
        Space {
            size: p.meta.high_water * ps,
            in_use: p.meta.high_water.saturating_sub(p.unreachable_pages) * ps,
        }
    }

    /// Bytes per page.
    pub fn page_size(&self) -> usize {
        self.shared.page_size
    }

    /// The longest key this database accepts: a quarter page less the leaf's bookkeeping
    /// (990 bytes with 4096-byte pages), so that every leaf and branch holds at least four entries.
    pub fn max_key_len(&self) -> usize {
        max_key_len(self.shared.page_size)
    }

    /// Starts a read transaction on the newest commit. Never waits for the writer.
    pub fn begin_read(&self) -> Result<ReadTxn> {
        Ok(ReadTxn::new(self.shared.clone()))
    }

    /// Starts the write transaction, waiting for the current one to end.
    pub fn begin_write(&self) -> Result<WriteTxn<'_>> {
        WriteTxn::new(&self.shared)
    }

    /// Makes every `commit_nosync` so far durable (no-op if there is none).
    pub fn sync(&self) -> Result<()> {
        self.begin_write()?.commit()
    }

    /// Syncs and closes the database.
    pub fn close(self) -> Result<()> {
        self.sync()
    }
}

/// The longest key for `page_size`: the largest entry less a leaf element and an overflow reference.
pub(crate) fn max_key_len(page_size: usize) -> usize {
    max_entry(page_size) - LEAF_ELEM - OVERFLOW_REF
}

/// The largest leaf or branch entry: a quarter of what a page holds after its header.
pub(crate) fn max_entry(page_size: usize) -> usize {
    (page_size - HEADER) / 4
}

/// Writes a new database: metas for txids 0 and 1, an empty root leaf at page 2.
fn init(file: &File, path: &Path, page_size: u32) -> Result<()> {
    let ps = page_size as usize;
    let mut buf = vec![0u8; 3 * ps];
    let root = PageId(2);
    page::write_header(&mut buf[2 * ps..], root, Kind::Leaf, 0, 0);
    page::seal(&mut buf[2 * ps..]);
    meta::write_first(&mut buf, page_size, root, 3);
    file.write_all_at(&buf, 0)
        .map_err(|e| Error::io("write", path, e))?;
    file.sync_all().map_err(|e| Error::io("fsync", path, e))
}

/// Reads both metas: the newest valid one, its slot, and the other's txid if it is valid too.
fn read_metas(
    file: &File,
    path: &Path,
    requested: Option<u32>,
) -> Result<(Meta, u64, Option<TxId>)> {
    let read = |off: u64| -> Result<Vec<u8>> {
        let mut b = vec![0u8; META_LEN];
        match file.read_exact_at(&mut b, off) {
            Ok(()) => Ok(b),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(Vec::new()),
            Err(e) => Err(Error::io("read", path, e)),
        }
    };
    let m0 = Meta::decode(&read(0)?);
    // Meta 1 sits one page in: take the page size from meta 0, else the requested one, else try
    // every valid size.
    let sizes: Vec<u32> = match (&m0, requested) {
        (Ok(m), _) => vec![m.page_size],
        (Err(_), Some(ps)) => vec![ps],
        (Err(_), None) => (10..=16).map(|s| 1u32 << s).collect(),
    };
    // Report the offset that held something like a meta (not a bad magic), else the first.
    let mut found = None;
    let mut why: Option<String> = None;
    for ps in sizes {
        let m = Meta::decode(&read(u64::from(ps))?).and_then(|m| {
            if m.page_size == ps {
                Ok(m)
            } else {
                Err(format!(
                    "records page size {} but sits at offset {ps}",
                    m.page_size
                ))
            }
        });
        match m {
            Ok(m) => {
                found = Some(m);
                break;
            }
            Err(e) => {
                let e = format!("at offset {ps}: {e}");
                if why
                    .as_ref()
                    .is_none_or(|w| w.contains("bad magic") && !e.contains("bad magic"))
                {
                    why = Some(e);
                }
            }
        }
    }
    let m1 = found.ok_or_else(|| why.unwrap_or_default());
    match (m0, m1) {
        (Ok(a), Ok(b)) if a.page_size == b.page_size => {
            if a.txid >= b.txid {
                Ok((a, 0, Some(b.txid)))
            } else {
                Ok((b, 1, Some(a.txid)))
            }
        }
        (Ok(a), Ok(b)) => Err(Error::NoValidMeta {
            path: path.to_path_buf(),
            meta0: format!("page size {} disagrees with meta 1", a.page_size),
            meta1: format!("page size {} disagrees with meta 0", b.page_size),
        }),
        (Ok(a), Err(e)) => {
            tracing::warn!(path = %path.display(), reason = %e, "meta page 1 is invalid; opening at meta page 0");
            Ok((a, 0, None))
        }
        (Err(e), Ok(b)) => {
            tracing::warn!(path = %path.display(), reason = %e, "meta page 0 is invalid; opening at meta page 1");
            Ok((b, 1, None))
        }
        (Err(meta0), Err(meta1)) => Err(Error::NoValidMeta {
            path: path.to_path_buf(),
            meta0,
            meta1,
        }),
    }
}

/// Grows `w`'s file to hold `high_water` pages, remapping when it does.
pub(crate) fn ensure_len(shared: &Shared, w: &mut Writer, high_water: u64) -> Result<()> {
    let needed = high_water * shared.page_size as u64;
    if needed <= w.file_len {
        return Ok(());
    }
    // Double up to 1 GiB, then grow 1 GiB at a time (as bbolt): few remaps, bounded slack.
    const GIB: u64 = 1 << 30;
    let step = if w.file_len < GIB {
        w.file_len.max(1 << 20)
    } else {
        GIB
    };
    let ps = shared.page_size as u64;
    let new_len = needed.max(w.file_len + step).div_ceil(ps) * ps;
    shared
        .file
        .set_len(new_len)
        .map_err(|e| shared.io("grow", e))?;
    fail::fail_point!("pager::grow", |_| Err(
        shared.io("grow", std::io::Error::other("failpoint pager::grow"))
    ));
    w.map = Arc::new(Map::new(&shared.file, new_len, &shared.path)?);
    w.file_len = new_len;
    Ok(())
}
