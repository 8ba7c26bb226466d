//! The member's store, replaceable as a whole (a snapshot from the leader swaps it), and the
//! snapshot format: a logical dump of the pager's buckets.
//!
//! A dump is `KVDSNAP1`, then frames — `1 name` opens a bucket, `2 key value` is an entry in
//! it, `3 crc` ends the dump with the CRC-32C of every byte before that frame — where each
//! string is a little-endian `u32` length and its bytes. A dump is read lazily from one pager
//! read transaction, so making one never stops writers; restoring one builds a new pager file
//! beside the live one and renames it into place only once it is complete and its CRC checks.

use std::io::{self, Read};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mvcc::{Applied, Store, StoreOptions};
use parking_lot::RwLock;

const MAGIC: &[u8; 8] = b"KVDSNAP1";
const BUCKET: u8 = 1;
const ENTRY: u8 = 2;
const END: u8 = 3;
/// Bytes a dump reader prepares per refill.
const CHUNK: usize = 256 << 10;
/// Entries per commit while restoring (bounds the restoring writer's memory).
const RESTORE_BATCH: usize = 50_000;

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn storage(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// The store of this member; a restore replaces it.
#[derive(Debug)]
pub struct Backend {
    path: PathBuf,
    opts: StoreOptions,
    store: RwLock<Arc<Store>>,
    /// Bumped by every restore: watch streams on the old store end, so clients re-watch.
    generation: tokio::sync::watch::Sender<u64>,
    /// Held by a restore or a defragmentation: each replaces the file at `path`.
    replacing: parking_lot::Mutex<()>,
}

impl Backend {
    /// Opens the store at `path`.
    pub fn open(path: impl Into<PathBuf>, opts: StoreOptions) -> mvcc::Result<Backend> {
        let path = path.into();
        let store = Store::open(&path, opts.clone())?;
        Ok(Backend {
            path,
            opts,
            store: RwLock::new(Arc::new(store)),
            generation: tokio::sync::watch::Sender::new(0),
            replacing: parking_lot::Mutex::new(()),
        })
    }

    /// The current store.
    pub fn store(&self) -> Arc<Store> {
        self.store.read().clone()
    }

    /// Changes when the store is replaced.
    pub fn generation(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// A dump of the store as it is now (flushed first, so it covers every applied write).
    pub fn dump(&self) -> io::Result<Dump> {
        let store = self.store();
        store.flush().map_err(storage)?;
        Dump::new(&store.db())
    }

    /// Defragments the store's file (see [`Store::defragment`]): reads and writes go on.
    pub fn defragment(&self) -> mvcc::Result<mvcc::Defragmented> {
        let _one = self.replacing.lock();
        self.store().defragment()
    }

    /// Replaces the store with a dump's contents, recorded as applied up to `applied`.
    pub fn restore(&self, data: &mut dyn Read, applied: Applied) -> io::Result<()> {
        let _one = self.replacing.lock();
        let tmp = self.path.with_extension("restore");
        restore_file(data, &tmp, &self.opts)?;
        let mut slot = self.store.write();
        // The old store keeps serving whoever still holds it (they learn of the swap through
        // the generation) but is never written again: this thread is the only writer.
        std::fs::rename(&tmp, &self.path)?;
        sync_dir(&self.path)?;
        let store = Store::open(&self.path, self.opts.clone()).map_err(storage)?;
        {
            let mut w = store.write().map_err(storage)?;
            w.set_applied(applied);
        }
        store.sync().map_err(storage)?;
        *slot = Arc::new(store);
        drop(slot);
        self.generation.send_modify(|g| *g += 1);
        Ok(())
    }
}

fn sync_dir(path: &Path) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// A dump being read: one pager read transaction, walked bucket by bucket.
#[derive(Debug)]
pub struct Dump {
    txn: pager::ReadTxn,
    buckets: Vec<Vec<u8>>,
    /// The bucket being walked, and the last key written from it.
    bucket: usize,
    last: Option<Vec<u8>>,
    opened: bool,
    buf: Vec<u8>,
    pos: usize,
    crc: u32,
    done: bool,
    /// Bytes in the pager file when the dump started: an estimate of the dump's size.
    pub size_hint: u64,
}

fn put_str(buf: &mut Vec<u8>, s: &[u8]) {
    buf.extend_from_slice(&(s.len() as u32).to_le_bytes());
    buf.extend_from_slice(s);
}

impl Dump {
    fn new(db: &pager::Db) -> io::Result<Dump> {
        let txn = db.begin_read().map_err(storage)?;
        let buckets = txn.buckets().map_err(storage)?;
        let size_hint = db.file_size();
        let mut buf = Vec::with_capacity(CHUNK + 4096);
        buf.extend_from_slice(MAGIC);
        Ok(Dump {
            txn,
            buckets,
            bucket: 0,
            last: None,
            opened: false,
            buf,
            pos: 0,
            crc: crc32c::crc32c(MAGIC),
            done: false,
            size_hint,
        })
    }

    /// Prepares the next frames into `buf`.
    fn refill(&mut self) -> io::Result<()> {
        self.buf.clear();
        self.pos = 0;
        while self.buf.len() < CHUNK {
            let Some(name) = self.buckets.get(self.bucket) else {
                self.crc = crc32c::crc32c_append(self.crc, &self.buf);
                self.buf.push(END);
                self.buf.extend_from_slice(&self.crc.to_le_bytes());
                self.done = true;
                return Ok(());
            };
            if !self.opened {
                self.buf.push(BUCKET);
                put_str(&mut self.buf, name);
                self.opened = true;
            }
            let bucket = self.txn.bucket(name).map_err(storage)?;
            let start = match &self.last {
                Some(k) => Bound::Excluded(k.as_slice()),
                None => Bound::Unbounded,
            };
            let mut last = None;
            let mut finished = true;
            for e in bucket.range((start, Bound::Unbounded)) {
                let (k, v) = e.map_err(storage)?;
                self.buf.push(ENTRY);
                put_str(&mut self.buf, k);
                put_str(&mut self.buf, v);
                last = Some(k);
                if self.buf.len() >= CHUNK {
                    finished = false;
                    break;
                }
            }
            if finished {
                self.bucket += 1;
                self.last = None;
                self.opened = false;
            } else {
                self.last = last.map(<[u8]>::to_vec);
            }
        }
        self.crc = crc32c::crc32c_append(self.crc, &self.buf);
        Ok(())
    }
}

impl Read for Dump {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.buf.len() {
            if self.done {
                return Ok(0);
            }
            self.refill()?;
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Reads a dump, checking its CRC as it goes.
struct Frames<'a> {
    r: &'a mut dyn Read,
    crc: u32,
}

impl Frames<'_> {
    fn exact(&mut self, n: usize) -> io::Result<Vec<u8>> {
        let mut v = vec![0; n];
        self.r.read_exact(&mut v).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                invalid("snapshot data ends early: truncated")
            } else {
                e
            }
        })?;
        self.crc = crc32c::crc32c_append(self.crc, &v);
        Ok(v)
    }

    fn u32(&mut self) -> io::Result<u32> {
        let b = self.exact(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn string(&mut self, max: usize) -> io::Result<Vec<u8>> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(invalid(format!(
                "snapshot data is corrupt: a {n}-byte string where at most {max} fit"
            )));
        }
        self.exact(n)
    }
}

/// etcd's snapshot files end with padding to a multiple of 512 bytes and the SHA-256 of
/// everything before it (etcdctl refuses a stream without it).
pub const SNAPSHOT_ALIGN: u64 = 512;

/// Checks the SHA-256 trailer of a snapshot file (as `etcdutl snapshot restore` does).
pub fn check_snapshot_file(path: &Path) -> io::Result<()> {
    use sha2::{Digest, Sha256};
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    if len < 32 || len % SNAPSHOT_ALIGN != 32 {
        return Err(invalid(format!(
            "{}: no SHA-256 trailer ({len} bytes is not a multiple of {SNAPSHOT_ALIGN} plus 32)",
            path.display()
        )));
    }
    let mut h = Sha256::new();
    let mut left = len - 32;
    let mut buf = vec![0; 1 << 16];
    while left > 0 {
        let n = (buf.len() as u64).min(left) as usize;
        f.read_exact(&mut buf[..n])?;
        h.update(&buf[..n]);
        left -= n as u64;
    }
    let mut want = [0u8; 32];
    f.read_exact(&mut want)?;
    if h.finalize().as_slice() != want {
        return Err(invalid(format!(
            "{}: snapshot data is corrupt: its SHA-256 does not match the one it ends with",
            path.display()
        )));
    }
    Ok(())
}

/// Builds a pager file at `dst` from a dump (replacing whatever is there), durably. Nothing is
/// left at `dst` if the dump is bad.
pub fn restore_file(data: &mut dyn Read, dst: &Path, opts: &StoreOptions) -> io::Result<()> {
    let _ = std::fs::remove_file(dst);
    let r = build(data, dst, opts);
    if r.is_err() {
        let _ = std::fs::remove_file(dst);
    }
    r
}

fn build(data: &mut dyn Read, dst: &Path, opts: &StoreOptions) -> io::Result<()> {
    let db = pager::Db::open(
        dst,
        pager::Options {
            freelist: opts.freelist,
            fill_percent: 1.0,
            ..Default::default()
        },
    )
    .map_err(storage)?;
    let max_key = db.max_key_len();
    let max_value = 64 << 20;
    let mut f = Frames { r: data, crc: 0 };
    if f.exact(MAGIC.len())? != MAGIC {
        return Err(invalid(
            "not a kvd snapshot (it does not start with KVDSNAP1)",
        ));
    }
    let mut tx = db.begin_write().map_err(storage)?;
    let mut bucket: Option<Vec<u8>> = None;
    let mut batch = 0;
    loop {
        let before = f.crc;
        let tag = f.exact(1)?[0];
        match tag {
            BUCKET => {
                let name = f.string(max_key)?;
                tx.create_bucket_if_missing(&name).map_err(storage)?;
                bucket = Some(name);
            }
            ENTRY => {
                let Some(name) = &bucket else {
                    return Err(invalid(
                        "snapshot data is corrupt: an entry outside a bucket",
                    ));
                };
                let k = f.string(max_key)?;
                let v = f.string(max_value)?;
                tx.bucket(name)
                    .and_then(|mut b| b.put(&k, &v))
                    .map_err(storage)?;
                batch += 1;
                if batch == RESTORE_BATCH {
                    tx.commit_nosync().map_err(storage)?;
                    tx = db.begin_write().map_err(storage)?;
                    batch = 0;
                }
            }
            END => {
                let want = f.u32()?;
                if want != before {
                    return Err(invalid(format!(
                        "snapshot data is corrupt: CRC-32C {before:08x}, the dump says {want:08x}"
                    )));
                }
                break;
            }
            t => {
                return Err(invalid(format!(
                    "snapshot data is corrupt: unknown frame type {t}"
                )))
            }
        }
    }
    tx.commit().map_err(storage)?;
    db.close().map_err(storage)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::etcdserverpb::{PutRequest, RangeRequest};

    fn put(store: &Store, k: &str, v: &[u8]) {
        let p = PutRequest {
            key: k.as_bytes().to_vec(),
            value: v.to_vec(),
            ..Default::default()
        };
        store.write().unwrap().put(&p).unwrap();
    }

    #[test]
    fn a_dump_restores_every_revision_and_a_damaged_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let src = Backend::open(dir.path().join("a"), StoreOptions::default()).unwrap();
        let big = vec![7u8; 300 << 10];
        for i in 0..3000 {
            put(
                &src.store(),
                &format!("k{i:05}"),
                if i % 500 == 0 { &big } else { b"v" },
            );
        }
        put(&src.store(), "k00001", b"second");
        let mut bytes = Vec::new();
        src.dump().unwrap().read_to_end(&mut bytes).unwrap();
        assert!(bytes.len() > 2 * CHUNK, "the dump spans several refills");

        let dst = Backend::open(dir.path().join("b"), StoreOptions::default()).unwrap();
        let at = Applied { index: 42, term: 3 };
        dst.restore(&mut bytes.as_slice(), at).unwrap();
        let store = dst.store();
        assert_eq!(store.rev(), src.store().rev());
        assert_eq!(store.applied(), at);
        let all = RangeRequest {
            key: b"\0".to_vec(),
            range_end: b"\0".to_vec(),
            ..Default::default()
        };
        let a = src.store().read().unwrap().range(&all).unwrap();
        let b = store.read().unwrap().range(&all).unwrap();
        assert_eq!(a.kvs, b.kvs);
        let old = RangeRequest {
            key: b"k00001".to_vec(),
            revision: 3,
            ..Default::default()
        };
        let got = store.read().unwrap().range(&old).unwrap();
        assert_eq!(got.kvs[0].value, b"v", "history restored too");
        assert_eq!(
            store.hash_kv(0).unwrap().hash,
            src.store().hash_kv(0).unwrap().hash
        );

        for (i, bad) in [
            bytes[..bytes.len() / 2].to_vec(),
            {
                let mut b = bytes.clone();
                let n = b.len();
                b[n / 3] ^= 0x10;
                b
            },
            b"not a snapshot".to_vec(),
        ]
        .into_iter()
        .enumerate()
        {
            let err = dst.restore(&mut bad.as_slice(), at).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "case {i}: {err}");
            // The live store is untouched.
            let b = dst.store().read().unwrap().range(&all).unwrap();
            assert_eq!(a.kvs, b.kvs, "case {i}");
        }
    }
}
