//! The store's shared state, and opening, closing and defragmenting it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use ids::{RaftIndex, Revision};
use parking_lot::{Condvar, Mutex, RwLock};

use super::compaction::CompactJob;
use super::flush::flush_loop;
use super::layout::{ALARM_BUCKET, CLUSTER_BUCKET, KEY_BUCKET, LEASE_BUCKET, META_BUCKET};
use super::pending::{Pending, View};
use super::read::Snapshot;
use super::recovery::{restore, Recovered};
use super::write::{WriteState, Writer};
use crate::error::{Error, Result};
use crate::index::Index;
use crate::lease::Lessor;
use crate::signal::Signal;
use crate::watch::Hub;

/// How to open a store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// The pager's free-set algorithm.
    pub freelist: pager::FreelistKind,
    /// Flush once this many entries are pending (etcd's `--backend-batch-limit`, 10,000).
    pub batch_limit: usize,
    /// Flush pending entries at least this often (etcd's `--backend-batch-interval`, 100 ms).
    pub batch_interval: Duration,
    /// Whether a flush fsyncs (true) or only publishes, leaving durability to [`Store::sync`]
    /// (what a server whose WAL already holds the entries wants).
    pub durable_flush: bool,
    /// Revisions one physical compaction step deletes (etcd's compaction batch limit, 1000).
    pub compaction_batch: usize,
    /// Pause between physical compaction steps (etcd's compaction sleep interval, 10 ms).
    pub compaction_sleep: Duration,
    /// The smallest lease TTL in seconds (etcd: 1.5 election timeouts rounded up; 2 with the
    /// default 1 s election timeout).
    pub min_lease_ttl: i64,
    /// Bytes of revisions an index rebuild (at open) reads between two releases of the map's
    /// resident pages (256 MiB; a 64th of the file when that is more): a restart's resident
    /// memory stays near the index's instead of growing to the whole file (the pages stay in
    /// the page cache).
    pub rebuild_release_bytes: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            freelist: pager::FreelistKind::default(),
            batch_limit: 10_000,
            batch_interval: Duration::from_millis(100),
            durable_flush: true,
            compaction_batch: 1000,
            compaction_sleep: Duration::from_millis(10),
            min_lease_ttl: 2,
            rebuild_release_bytes: 256 << 20,
        }
    }
}

/// The consensus position the stored data covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Applied {
    pub index: RaftIndex,
    pub term: u64,
}

pub(crate) struct Inner {
    /// The pager file; replaced whole by a defragmentation (readers keep the one they began
    /// on until they finish).
    pub(super) db: RwLock<Arc<pager::Db>>,
    pub(crate) path: PathBuf,
    pub(crate) opts: StoreOptions,
    pub(crate) index: RwLock<Index>,
    pub(super) state: Mutex<WriteState>,
    /// Leases; taken after `state` when both are needed.
    pub(crate) lessor: Mutex<Lessor>,
    /// Alarms; taken after `state` when both are needed.
    pub(crate) alarms: Mutex<crate::alarm::AlarmSet>,
    /// The cluster version and downgrade job; taken after `state` when both are needed.
    pub(crate) cluster: Mutex<crate::cluster::ClusterCell>,
    /// Users, roles and whether auth is on; taken after `state` when both are needed.
    pub(crate) auth: Mutex<crate::auth::AuthSet>,
    /// Whether auth is on, readable without the lock.
    pub(crate) auth_enabled: std::sync::atomic::AtomicBool,
    pub(super) view: RwLock<View>,
    /// Held by the one flush in progress; owns the compaction job.
    pub(super) flushing: Mutex<Option<CompactJob>>,
    /// The hashes the last compactions computed (etcd's `hashStorage`).
    pub(crate) hashes: Mutex<crate::hash::CompactionHashes>,
    /// Held by the one defragmentation in progress.
    pub(super) defragging: Mutex<()>,
    /// Bytes of revisions flushed since the last durable flush.
    pub(super) unsynced: std::sync::atomic::AtomicU64,
    /// The revision the last finished compaction reached, and a condvar for waiters.
    pub(super) finished: (Mutex<i64>, Condvar),
    /// Wakes the flush thread.
    pub(super) wake: Signal,
    /// The watchers.
    pub(crate) hub: Hub,
}

impl Inner {
    pub(crate) fn db(&self) -> Arc<pager::Db> {
        self.db.read().clone()
    }
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// An mvcc store on one pager file.
#[derive(Debug)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
    pub(super) flusher: Option<JoinHandle<()>>,
    pub(super) watcher: Option<JoinHandle<()>>,
}

/// File sizes before and after a defragmentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Defragmented {
    pub before: u64,
    pub after: u64,
}

pub(super) fn open_db(path: &Path, opts: &StoreOptions) -> Result<pager::Db> {
    Ok(pager::Db::open(
        path,
        pager::Options {
            freelist: opts.freelist,
            fill_percent: 0.9,
            ..Default::default()
        },
    )?)
}

/// A new pager file filled in key order (a restore, an import): its pages packed full.
pub(crate) fn open_filled_db(path: &Path, opts: &StoreOptions) -> Result<pager::Db> {
    Ok(pager::Db::open(
        path,
        pager::Options {
            freelist: opts.freelist,
            fill_percent: 1.0,
            ..Default::default()
        },
    )?)
}

impl Store {
    /// Opens (or creates) the store in the pager file at `path`, rebuilding the index from it.
    pub fn open(path: impl AsRef<Path>, opts: StoreOptions) -> Result<Store> {
        let path = path.as_ref().to_path_buf();
        let db = open_db(&path, &opts)?;
        {
            let mut tx = db.begin_write()?;
            for b in [
                KEY_BUCKET,
                META_BUCKET,
                LEASE_BUCKET,
                ALARM_BUCKET,
                CLUSTER_BUCKET,
                crate::auth::AUTH_BUCKET,
                crate::auth::USERS_BUCKET,
                crate::auth::ROLES_BUCKET,
            ] {
                tx.create_bucket_if_missing(b)?;
            }
            tx.commit()?;
        }
        let Recovered {
            mut index,
            rev,
            finished_compaction: finished,
            scheduled_compaction: scheduled,
            applied,
            mut lessor,
        } = restore(&db, &path, opts.rebuild_release_bytes)?;
        let raised = crate::alarm::restore(&db, &path)?;
        let cluster = crate::cluster::restore(&db, &path)?;
        let auth = crate::auth::restore(&db, &path)?;
        lessor.min_ttl = opts.min_lease_ttl;
        let pending = Arc::new(Pending::default());
        // A compaction scheduled but not finished resumes: logically at once, physically in
        // the background.
        let first_job = (scheduled > finished).then_some(scheduled);
        let compacted = finished.max(scheduled);
        index.set_compacted(compacted);
        let inner = Arc::new(Inner {
            db: RwLock::new(Arc::new(db)),
            path,
            index: RwLock::new(index),
            lessor: Mutex::new(lessor),
            alarms: Mutex::new(crate::alarm::AlarmSet {
                raised,
                ..Default::default()
            }),
            cluster: Mutex::new(crate::cluster::ClusterCell {
                state: cluster,
                ..Default::default()
            }),
            auth_enabled: std::sync::atomic::AtomicBool::new(auth.enabled),
            auth: Mutex::new(crate::auth::AuthSet {
                data: Arc::new(auth),
                ..Default::default()
            }),
            state: Mutex::new(WriteState {
                rev,
                compacted,
                pending: pending.clone(),
                pending_len: 0,
                applied,
                persisted: applied,
                new_compaction: None,
                failed: None,
            }),
            view: RwLock::new(View {
                rev,
                pendings: vec![pending],
            }),
            flushing: Mutex::new(first_job.map(|t| CompactJob::new(t, finished))),
            hashes: Mutex::new(crate::hash::CompactionHashes::default()),
            defragging: Mutex::new(()),
            unsynced: std::sync::atomic::AtomicU64::new(0),
            finished: (Mutex::new(finished), Condvar::new()),
            wake: Signal::default(),
            hub: Hub::new(rev),
            opts,
        });
        if first_job.is_some() {
            tracing::info!(path = %inner.path.display(), revision = scheduled, "resuming an interrupted compaction");
        }
        let spawn = |name: &str, f: fn(Weak<Inner>)| {
            let weak = Arc::downgrade(&inner);
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || f(weak))
                .map_err(|e| {
                    Error::Storage(pager::Error::Io {
                        op: "spawn a store thread",
                        path: inner.path.clone(),
                        source: e,
                    })
                })
        };
        let flusher = spawn("mvcc-flush", flush_loop)?;
        let watcher = spawn("mvcc-watch", crate::watch::sync_loop)?;
        Ok(Store {
            inner,
            flusher: Some(flusher),
            watcher: Some(watcher),
        })
    }

    /// The current revision.
    pub fn rev(&self) -> Revision {
        Revision(self.inner.view.read().rev)
    }

    /// Its watchers, and what they were sent.
    pub fn watch_counts(&self) -> crate::WatchCounts {
        self.inner.hub.counts()
    }

    /// The compaction revision (-1 before any compaction).
    pub fn compacted(&self) -> Revision {
        Revision(self.inner.state.lock().compacted)
    }

    /// The consensus position the applied writes reach.
    pub fn applied(&self) -> Applied {
        self.inner.state.lock().applied
    }

    /// The pager file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The pager database (stats, size, snapshots).
    pub fn db(&self) -> Arc<pager::Db> {
        self.inner.db()
    }

    /// etcd's defragmentation, without stopping the world: the live data is copied into a
    /// fresh, compact file that then replaces the store's. Flushes go on into the old file
    /// while the copy is made; then the copy catches up with what they wrote, reading only
    /// the paths to what changed ([`pager::Copy::catch_up`]), in rounds until a round has
    /// little left to copy; the copy is synced, and a last round runs with flushes held off
    /// (writes go on meanwhile, into memory, where reads see them). Reads go on throughout on
    /// the old file, which stays mapped until its last reader finishes. A crash at any point leaves either the old file
    /// or the complete new one at `path`.
    pub fn defragment(&self) -> Result<Defragmented> {
        /// Catch-up rounds with flushes going on, at most.
        const ROUNDS: usize = 8;
        /// A round that copied less than this ends the rounds with flushes going on.
        const LITTLE: u64 = 4 << 20;
        let inner = &self.inner;
        let _one = inner.defragging.lock();
        let old = inner.db();
        let before = old.file_size();
        let tmp = inner.path.with_extension("defrag");
        let io = |op: &'static str, e: std::io::Error| {
            Error::Storage(pager::Error::Io {
                op,
                path: tmp.clone(),
                source: e,
            })
        };
        match std::fs::remove_file(&tmp) {
            Ok(()) => {
                tracing::info!(path = %tmp.display(), "removed an interrupted defragmentation's file")
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("remove a stale defragmentation file", e)),
        }
        let copied = (|| -> Result<_> {
            let mut copy = old.copy_to(&tmp)?;
            let mut caught = Vec::new();
            for _ in 0..ROUNDS {
                let done = copy.catch_up(&old)?;
                caught.push(done.bytes);
                if done.bytes < LITTLE {
                    break;
                }
            }
            // The copy's pages to the disk before flushes are held off: the last round's
            // sync then writes only what that round copied.
            copy.sync()?;
            let no_flush = inner.flushing.lock();
            let last = copy.catch_up(&old)?;
            copy.finish()?;
            Ok((no_flush, caught, last))
        })();
        let (_no_flush, caught, last) = match copied {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        std::fs::rename(&tmp, &inner.path).map_err(|e| io("replace the data file", e))?;
        if let Some(dir) = inner.path.parent() {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io("sync the data directory", e))?;
        }
        let fresh = Arc::new(open_db(&inner.path, &inner.opts)?);
        let after = fresh.file_size();
        *inner.db.write() = fresh;
        tracing::info!(
            path = %inner.path.display(),
            before,
            after,
            caught_up_bytes = ?caught,
            last_round_bytes = last.bytes,
            "defragmented"
        );
        Ok(Defragmented { before, after })
    }

    /// A consistent read view at the current revision.
    pub fn read(&self) -> Result<Snapshot> {
        self.inner.snapshot()
    }

    /// Why the store stopped taking writes (a flush failed: the disk is full, or failed), if
    /// it did: the member must stop.
    pub fn failure(&self) -> Option<String> {
        self.inner.state.lock().failed.clone()
    }

    /// The writer: one at a time; each of its operations is one etcd write transaction.
    pub fn write(&self) -> Result<Writer<'_>> {
        let st = self.inner.state.lock();
        if let Some(f) = &st.failed {
            return Err(Error::Stopped(f.clone()));
        }
        Ok(Writer {
            store: self,
            st: Some(st),
        })
    }

    /// Moves pending writes into the pager now (durably if the store flushes durably).
    pub fn flush(&self) -> Result<()> {
        self.inner.flush()
    }

    /// Flushes and fsyncs: everything written so far survives a crash.
    pub fn sync(&self) -> Result<()> {
        self.inner.flush()?;
        self.inner.db().sync()?;
        Ok(())
    }

    /// Blocks until the physical compaction at `rev` (or a later one) has finished.
    pub fn wait_compaction(&self, rev: Revision) -> Result<()> {
        let (m, cv) = &self.inner.finished;
        let mut done = m.lock();
        while *done < rev.0 {
            if let Some(f) = &self.inner.state.lock().failed {
                return Err(Error::Stopped(f.clone()));
            }
            cv.wait_for(&mut done, Duration::from_millis(50));
        }
        Ok(())
    }

    /// Flushes durably and stops the background flusher.
    pub fn close(mut self) -> Result<()> {
        self.shutdown()
    }

    pub(super) fn shutdown(&mut self) -> Result<()> {
        self.inner.hub.close();
        if let Some(h) = self.watcher.take() {
            let _ = h.join();
        }
        let Some(h) = self.flusher.take() else {
            return Ok(());
        };
        self.inner.wake.stop();
        let _ = h.join();
        self.inner.flush()?;
        self.inner.db().sync()?;
        Ok(())
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::error!(path = %self.inner.path.display(), error = %e, "closing the store failed");
        }
    }
}
