//! The store's snapshot format: a logical dump of its pager file's buckets, what a leader sends
//! a member that is too far behind and what `etcdctl snapshot save` writes.
//!
//! A dump is `KVDSNAP1`, then frames — `1 name` opens a bucket, `2 key value` is an entry in
//! it, `3 crc` ends the dump with the CRC-32C of every byte before that frame — where each
//! string is a little-endian `u32` length and its bytes. A dump is read lazily from one pager
//! read transaction, so making one never stops writers; [`restore_file`] builds a new pager
//! file from one, and leaves nothing behind unless the dump is complete and its CRC checks.

use std::io::{self, Read};
use std::ops::Bound;
use std::path::Path;

use crate::store::{Store, StoreOptions};

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

impl Store {
    /// A dump of the store as it is now (flushed first, so it covers every applied write).
    pub fn dump(&self) -> io::Result<Dump> {
        self.flush().map_err(io::Error::other)?;
        Dump::new(&self.db())
    }
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
        let txn = db.begin_read().map_err(io::Error::other)?;
        let buckets = txn.buckets().map_err(io::Error::other)?;
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
            let bucket = self.txn.bucket(name).map_err(io::Error::other)?;
            let start = match &self.last {
                Some(k) => Bound::Excluded(k.as_slice()),
                None => Bound::Unbounded,
            };
            let mut last = None;
            let mut finished = true;
            for e in bucket.range((start, Bound::Unbounded)) {
                let (k, v) = e.map_err(io::Error::other)?;
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
    let db = crate::store::open_filled_db(dst, opts).map_err(io::Error::other)?;
    let max_key = db.max_key_len();
    let max_value = 64 << 20;
    let mut f = Frames { r: data, crc: 0 };
    if f.exact(MAGIC.len())? != MAGIC {
        return Err(invalid(
            "not a kvd snapshot (it does not start with KVDSNAP1)",
        ));
    }
    let mut tx = db.begin_write().map_err(io::Error::other)?;
    let mut bucket: Option<Vec<u8>> = None;
    let mut batch = 0;
    loop {
        let before = f.crc;
        let tag = f.exact(1)?[0];
        match tag {
            BUCKET => {
                let name = f.string(max_key)?;
                tx.create_bucket_if_missing(&name)
                    .map_err(io::Error::other)?;
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
                    .map_err(io::Error::other)?;
                batch += 1;
                if batch == RESTORE_BATCH {
                    tx.commit_nosync().map_err(io::Error::other)?;
                    tx = db.begin_write().map_err(io::Error::other)?;
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
    tx.commit().map_err(io::Error::other)?;
    db.close().map_err(io::Error::other)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::etcdserverpb::{PutRequest, RangeRequest};
    use ids::Revision;

    #[test]
    fn a_dump_spans_refills_and_restores_every_revision() {
        let dir = tempfile::tempdir().unwrap();
        let src = Store::open(dir.path().join("a"), StoreOptions::default()).unwrap();
        let big = vec![7u8; 300 << 10];
        for i in 0..3000 {
            let p = PutRequest {
                key: format!("k{i:05}").into_bytes(),
                value: if i % 500 == 0 {
                    big.clone()
                } else {
                    b"v".to_vec()
                },
                ..Default::default()
            };
            src.write().unwrap().put(&p).unwrap();
        }
        let mut bytes = Vec::new();
        src.dump().unwrap().read_to_end(&mut bytes).unwrap();
        assert!(bytes.len() > 2 * CHUNK, "the dump spans several refills");
        let dst = dir.path().join("b");
        restore_file(&mut bytes.as_slice(), &dst, &StoreOptions::default()).unwrap();
        let restored = Store::open(&dst, StoreOptions::default()).unwrap();
        assert_eq!(restored.rev(), src.rev());
        let all = RangeRequest {
            key: b"\0".to_vec(),
            range_end: b"\0".to_vec(),
            ..Default::default()
        };
        let a = src.read().unwrap().range(&all).unwrap();
        let b = restored.read().unwrap().range(&all).unwrap();
        assert_eq!(a.kvs, b.kvs);
        assert_eq!(
            restored.hash_kv(Revision(0)).unwrap().hash,
            src.hash_kv(Revision(0)).unwrap().hash
        );

        let mut wrong_tag = bytes.clone();
        wrong_tag[MAGIC.len()] = 9;
        for (what, bad) in [
            ("truncated", bytes[..bytes.len() - 1].to_vec()),
            ("unknown frame type", wrong_tag),
            ("KVDSNAP1", b"KVDSNAQ1".to_vec()),
        ] {
            let dst = dir.path().join("c");
            let err =
                restore_file(&mut bad.as_slice(), &dst, &StoreOptions::default()).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{what}: {err}");
            assert!(err.to_string().contains(what), "{what}: {err}");
            assert!(!dst.exists(), "{what}: nothing is left behind");
        }
    }
}
