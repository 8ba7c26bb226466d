//! The member's store, replaceable as a whole (a snapshot from the leader, mvcc's dump
//! ([`mvcc::dump`]), swaps it).

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mvcc::dump::{restore_file, Dump};
use mvcc::{Applied, Store, StoreOptions};
use parking_lot::RwLock;

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
        self.store().dump()
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
        let store = Store::open(&self.path, self.opts.clone()).map_err(io::Error::other)?;
        {
            let mut w = store.write().map_err(io::Error::other)?;
            w.set_applied(applied);
        }
        store.sync().map_err(io::Error::other)?;
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
    fn a_restore_swaps_the_store_and_a_damaged_dump_leaves_it_serving() {
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

        let dst = Backend::open(dir.path().join("b"), StoreOptions::default()).unwrap();
        let at = Applied {
            index: ids::RaftIndex(42),
            term: 3,
        };
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
            store.hash_kv(ids::Revision(0)).unwrap().hash,
            src.store().hash_kv(ids::Revision(0)).unwrap().hash
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
