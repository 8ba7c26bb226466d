//! The store: the index, the pager file, the write path and consistent read views.
//!
//! Writes never wait on the disk. Each write transaction gets its revision, updates the index
//! and appends its entries (revision key → encoded `KeyValue`) to the *pending* batch, which
//! readers see at once. A flush moves the pending batch into the pager in one commit, together
//! with the applied consensus index it covers. The flush thread runs it when the batch is full
//! and on an interval; [`Store::flush`] and close run it too. Flushes hold their own lock, not
//! the writers', so an fsync never stalls a write — etcd's batched backend without its pause.
//! Only when the disk falls several batches behind do writers flush themselves (backpressure).
//!
//! A reader takes (current revision, pending batches, pager snapshot) under one lock; a pending
//! batch leaves that list only after the commit holding it is published, so every revision a
//! reader may need is in one of the two.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};
use prost::Message;

use api::mvccpb::KeyValue;

use crate::error::{Error, Result};
use crate::index::{Index, KeyRange};
use crate::lease::{Lease, Lessor};
use crate::revision::Rev;
use crate::signal::Signal;
use crate::watch::Hub;

pub(crate) const KEY_BUCKET: &[u8] = b"key";
pub(crate) const META_BUCKET: &[u8] = b"meta";
pub(crate) const LEASE_BUCKET: &[u8] = b"lease";
pub(crate) const ALARM_BUCKET: &[u8] = b"alarm";
const CONSISTENT_INDEX: &[u8] = b"consistent_index";
const TERM: &[u8] = b"term";
const SCHEDULED_COMPACT: &[u8] = b"scheduledCompactRev";
const FINISHED_COMPACT: &[u8] = b"finishedCompactRev";
/// Keys whose index entries one compaction step prunes.
const INDEX_COMPACT_CHUNK: usize = 10_000;

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
        }
    }
}

/// The consensus position the stored data covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Applied {
    pub index: u64,
    pub term: u64,
}

/// Entries written since the last flush, in revision order. All values share one buffer, so a
/// batch costs a few allocations, not one per write.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    entries: RwLock<PendingData>,
}

#[derive(Debug, Default)]
struct PendingData {
    /// The encoded values, back to back.
    data: Vec<u8>,
    /// (revision, tombstone, end of its value in `data`); a value starts where the previous ends.
    revs: Vec<(Rev, bool, usize)>,
}

impl PendingData {
    fn value(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.revs[i - 1].2 };
        &self.data[start..self.revs[i].2]
    }

    fn iter(&self) -> impl Iterator<Item = (Rev, bool, &[u8])> {
        self.revs
            .iter()
            .enumerate()
            .map(|(i, &(r, t, _))| (r, t, self.value(i)))
    }
}

impl Pending {
    /// The stored bytes of revision `rev` (not a tombstone), if this batch has it.
    fn with<T>(&self, rev: Rev, f: impl FnOnce(&[u8]) -> T) -> Option<T> {
        let e = self.entries.read();
        let (first, last) = (e.revs.first()?.0, e.revs.last()?.0);
        if rev < first || rev > last {
            return None;
        }
        let i = e.revs.binary_search_by(|(r, _, _)| r.cmp(&rev)).ok()?;
        Some(f(e.value(i)))
    }
}

/// What readers start from.
#[derive(Debug)]
struct View {
    rev: i64,
    /// Pending batches not yet in the pager snapshot a new reader gets; the last is the one
    /// writers append to.
    pendings: Vec<Arc<Pending>>,
}

/// A compaction whose physical part is under way.
#[derive(Debug)]
struct CompactJob {
    target: i64,
    keep: HashSet<Rev>,
    phase: Phase,
}

#[derive(Debug)]
enum Phase {
    /// Pruning the index from this key on.
    Index(Vec<u8>),
    /// Deleting unkept revisions <= target from this revision key on.
    Delete(Vec<u8>),
}

/// The writers' state, behind the writer lock.
#[derive(Debug)]
pub(crate) struct WriteState {
    pub(crate) rev: i64,
    /// The compaction revision (etcd's compactMainRev; -1 before any).
    pub(crate) compacted: i64,
    pending: Arc<Pending>,
    pending_len: usize,
    applied: Applied,
    /// The applied position the pager holds (a flush with nothing else to write still records
    /// a newer one: entries without data advance it too).
    persisted: Applied,
    /// A compaction scheduled since the last flush.
    new_compaction: Option<i64>,
    failed: Option<String>,
}

pub(crate) struct Inner {
    /// The pager file; replaced whole by a defragmentation (readers keep the one they began
    /// on until they finish).
    db: RwLock<Arc<pager::Db>>,
    pub(crate) path: PathBuf,
    pub(crate) opts: StoreOptions,
    pub(crate) index: RwLock<Index>,
    state: Mutex<WriteState>,
    /// Leases; taken after `state` when both are needed.
    pub(crate) lessor: Mutex<Lessor>,
    /// Alarms; taken after `state` when both are needed.
    pub(crate) alarms: Mutex<crate::alarm::AlarmSet>,
    /// The downgrade job; taken after `state` when both are needed.
    pub(crate) downgrade: Mutex<crate::downgrade::DowngradeState>,
    /// Users, roles and whether auth is on; taken after `state` when both are needed.
    pub(crate) auth: Mutex<crate::auth::AuthSet>,
    /// Whether auth is on, readable without the lock.
    pub(crate) auth_enabled: std::sync::atomic::AtomicBool,
    view: RwLock<View>,
    /// Held by the one flush in progress; owns the compaction job.
    flushing: Mutex<Option<CompactJob>>,
    /// The revision the last finished compaction reached, and a condvar for waiters.
    finished: (Mutex<i64>, Condvar),
    /// Wakes the flush thread.
    wake: Signal,
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
    flusher: Option<JoinHandle<()>>,
    watcher: Option<JoinHandle<()>>,
}

/// The result of a range read at one revision (etcd's `RangeResult`).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RangeResult {
    pub kvs: Vec<KeyValue>,
    /// Keys in the range at the read revision, ignoring the limit.
    pub count: i64,
    /// The revision of the view the read ran in.
    pub rev: i64,
}

/// Options of a range read.
#[derive(Debug, Default, Clone, Copy)]
pub struct RangeOptions {
    /// At most this many keys (0 = all).
    pub limit: i64,
    /// Read at this revision (<= 0 = the view's).
    pub rev: i64,
    /// Count only.
    pub count: bool,
}

fn corrupt(path: &Path, reason: String) -> Error {
    Error::Corrupt {
        path: path.display().to_string(),
        reason,
    }
}

/// The latency of the pager commits that flush writes (etcd's name; 1 ms to 8 s, doubling).
static BACKEND_COMMIT: std::sync::LazyLock<prometheus::Histogram> =
    std::sync::LazyLock::new(|| {
        let opts = prometheus::HistogramOpts::new(
            "etcd_disk_backend_commit_duration_seconds",
            "The latency distributions of commit called by backend.",
        )
        .buckets(prometheus::exponential_buckets(0.001, 2.0, 14).unwrap_or_default());
        let h = prometheus::Histogram::with_opts(opts).expect("a valid metric");
        if let Err(e) = prometheus::register(Box::new(h.clone())) {
            tracing::warn!("registering a metric: {e}");
        }
        h
    });

/// Registers the store's metrics now, so `/metrics` lists them before their first sample.
pub fn init_metrics() {
    std::sync::LazyLock::force(&BACKEND_COMMIT);
}

/// What a flush writes besides revisions: lease, alarm, auth and downgrade changes.
#[derive(Clone, Copy)]
struct Side<'a> {
    leases: &'a std::collections::BTreeMap<i64, Option<[u8; 16]>>,
    alarms: &'a std::collections::BTreeMap<(u64, i32), bool>,
    auth: (&'a crate::auth::AuthDirty, &'a crate::auth::AuthData),
    downgrade: Option<&'a api::etcdserverpb::DowngradeInfo>,
}

/// File sizes before and after a defragmentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Defragmented {
    pub before: u64,
    pub after: u64,
}

fn open_db(path: &Path, opts: &StoreOptions) -> Result<pager::Db> {
    Ok(pager::Db::open(
        path,
        pager::Options {
            freelist: opts.freelist,
            fill_percent: 0.9,
            ..Default::default()
        },
    )?)
}

fn be_i64(v: &[u8]) -> Option<i64> {
    Some(i64::from_be_bytes(v.try_into().ok()?))
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
                crate::auth::AUTH_BUCKET,
                crate::auth::USERS_BUCKET,
                crate::auth::ROLES_BUCKET,
            ] {
                tx.create_bucket_if_missing(b)?;
            }
            tx.commit()?;
        }
        let (mut index, rev, finished, scheduled, applied, mut lessor) = restore(&db, &path)?;
        let raised = crate::alarm::restore(&db, &path)?;
        let downgrade = crate::downgrade::restore(&db, &path)?;
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
            downgrade: Mutex::new(crate::downgrade::DowngradeState {
                info: downgrade,
                dirty: false,
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
            flushing: Mutex::new(first_job.map(CompactJob::new)),
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
    pub fn rev(&self) -> i64 {
        self.inner.view.read().rev
    }

    /// The compaction revision (-1 before any compaction).
    pub fn compacted(&self) -> i64 {
        self.inner.state.lock().compacted
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
    /// fresh, compact file that then replaces the store's. Only the flush of pending writes
    /// into the pager waits meanwhile; writes go on (into memory, where reads see them) and
    /// reads go on (on the old file, which stays mapped until its last reader finishes). The
    /// one bound: once four batches are pending, a writer flushes itself (the store's
    /// backpressure) and so waits for the copy to finish. A crash at any point leaves either
    /// the old file or the complete new one at `path`.
    pub fn defragment(&self) -> Result<Defragmented> {
        let inner = &self.inner;
        let _no_flush = inner.flushing.lock();
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
        let copied = old.compact_to(&tmp);
        if let Err(e) = copied {
            let _ = std::fs::remove_file(&tmp);
            return Err(e.into());
        }
        std::fs::rename(&tmp, &inner.path).map_err(|e| io("replace the data file", e))?;
        if let Some(dir) = inner.path.parent() {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io("sync the data directory", e))?;
        }
        let fresh = Arc::new(open_db(&inner.path, &inner.opts)?);
        let after = fresh.file_size();
        *inner.db.write() = fresh;
        tracing::info!(path = %inner.path.display(), before, after, "defragmented");
        Ok(Defragmented { before, after })
    }

    /// A consistent read view at the current revision.
    pub fn read(&self) -> Result<Snapshot> {
        self.inner.snapshot()
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
    pub fn wait_compaction(&self, rev: i64) -> Result<()> {
        let (m, cv) = &self.inner.finished;
        let mut done = m.lock();
        while *done < rev {
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

    fn shutdown(&mut self) -> Result<()> {
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

fn flush_loop(weak: Weak<Inner>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let wait = if inner.flushing.lock().is_some() {
            inner.opts.compaction_sleep
        } else {
            inner.opts.batch_interval
        };
        if !inner.wake.wait(wait) {
            return;
        }
        if let Err(e) = inner.flush() {
            tracing::error!(path = %inner.path.display(), error = %e, "background flush failed");
        }
    }
}

/// Rebuilds the index from the `key` bucket; reads the meta bucket.
#[allow(clippy::type_complexity)]
fn restore(db: &pager::Db, path: &Path) -> Result<(Index, i64, i64, i64, Applied, Lessor)> {
    let tx = db.begin_read()?;
    let meta = tx.bucket(META_BUCKET)?;
    let read_i64 = |k: &[u8]| -> Result<Option<i64>> {
        match meta.get(k)? {
            None => Ok(None),
            Some(v) => be_i64(v).map(Some).ok_or_else(|| {
                corrupt(
                    path,
                    format!("meta value {} is not 8 bytes", String::from_utf8_lossy(k)),
                )
            }),
        }
    };
    let compacted = read_i64(FINISHED_COMPACT)?.unwrap_or(-1);
    let scheduled = read_i64(SCHEDULED_COMPACT)?.unwrap_or(-1);
    let applied = Applied {
        index: read_i64(CONSISTENT_INDEX)?.map_or(0, |v| v as u64),
        term: read_i64(TERM)?.map_or(0, |v| v as u64),
    };
    let mut lessor = Lessor::new(0);
    for e in tx.bucket(LEASE_BUCKET)?.iter() {
        let (k, v) = e?;
        let id = be_i64(k)
            .ok_or_else(|| corrupt(path, format!("lease bucket key {k:?} is not an id")))?;
        let lease =
            Lease::decode(v).ok_or_else(|| corrupt(path, format!("lease {id:x} is damaged")))?;
        lessor.restore(id, lease);
    }
    let mut key_lease: HashMap<Vec<u8>, i64> = HashMap::new();
    let mut index = Index::new();
    let mut rev = 1;
    for e in tx.bucket(KEY_BUCKET)?.iter() {
        let (k, v) = e?;
        let (r, tomb) = Rev::from_key(k)
            .ok_or_else(|| corrupt(path, format!("key bucket entry {k:?} is not a revision")))?;
        let kv = KeyValue::decode(v).map_err(|e| {
            corrupt(
                path,
                format!("revision {r:?} does not hold a KeyValue: {e}"),
            )
        })?;
        if tomb {
            index.restore_tombstone(&kv.key, r);
            key_lease.remove(&kv.key);
        } else {
            index.restore_put(&kv.key, r, kv.create_revision, kv.version);
            if kv.lease != 0 {
                key_lease.insert(kv.key, kv.lease);
            } else {
                key_lease.remove(&kv.key);
            }
        }
        rev = r.main;
    }
    for (key, id) in key_lease {
        lessor.attach(id, &key);
    }
    let rev = rev.max(compacted).max(scheduled);
    Ok((index, rev, compacted, scheduled, applied, lessor))
}

impl CompactJob {
    fn new(target: i64) -> CompactJob {
        CompactJob {
            target,
            keep: HashSet::new(),
            phase: Phase::Index(Vec::new()),
        }
    }
}

impl Inner {
    pub(crate) fn snapshot(self: &Arc<Self>) -> Result<Snapshot> {
        let (reader, rev) = self.reader()?;
        Ok(Snapshot {
            inner: self.clone(),
            reader,
            rev,
        })
    }

    /// A reader of everything written so far, and the revision it was taken at: both under the
    /// view lock, so the pending batches and the pager snapshot cover every revision up to it.
    pub(crate) fn reader(&self) -> Result<(Reader, i64)> {
        let v = self.view.read();
        let txn = self.db().begin_read()?;
        let reader = Reader {
            pendings: v.pendings.clone(),
            txn,
        };
        Ok((reader, v.rev))
    }

    /// One flush: the pending batch, the applied index, and one step of a compaction under way.
    fn flush(&self) -> Result<()> {
        let mut job = self.flushing.lock();
        let (taken, applied, new_compaction, leases, alarms, auth, downgrade) = {
            let mut st = self.state.lock();
            if let Some(f) = &st.failed {
                return Err(Error::Stopped(f.clone()));
            }
            let leases = std::mem::take(&mut self.lessor.lock().dirty);
            let alarms = std::mem::take(&mut self.alarms.lock().dirty);
            let downgrade = {
                let mut d = self.downgrade.lock();
                std::mem::take(&mut d.dirty).then(|| d.info.clone())
            };
            let auth = {
                let mut a = self.auth.lock();
                (std::mem::take(&mut a.dirty), a.data.clone())
            };
            if st.pending_len == 0
                && st.applied == st.persisted
                && st.new_compaction.is_none()
                && job.is_none()
                && leases.is_empty()
                && alarms.is_empty()
                && auth.0.is_empty()
                && downgrade.is_none()
            {
                return Ok(());
            }
            let fresh = Arc::new(Pending::default());
            let taken = std::mem::replace(&mut st.pending, fresh.clone());
            st.pending_len = 0;
            self.view.write().pendings.push(fresh);
            (
                taken,
                st.applied,
                st.new_compaction.take(),
                leases,
                alarms,
                auth,
                downgrade,
            )
        };
        let side = Side {
            leases: &leases,
            alarms: &alarms,
            auth: (&auth.0, &auth.1),
            downgrade: downgrade.as_ref(),
        };
        let result = self.write_flush(&taken, applied, new_compaction, side, &mut job);
        match result {
            Ok(()) => {
                self.view
                    .write()
                    .pendings
                    .retain(|p| !Arc::ptr_eq(p, &taken));
                let mut st = self.state.lock();
                if applied.index > st.persisted.index {
                    st.persisted = applied;
                }
                Ok(())
            }
            Err(e) => {
                let msg = format!("flush to {} failed: {e}", self.path.display());
                tracing::error!("{msg}");
                self.state.lock().failed = Some(msg);
                Err(e)
            }
        }
    }

    fn write_flush(
        &self,
        taken: &Pending,
        applied: Applied,
        new_compaction: Option<i64>,
        side: Side<'_>,
        job: &mut Option<CompactJob>,
    ) -> Result<()> {
        let db = self.db();
        let mut tx = db.begin_write()?;
        let leases = side.leases;
        if !side.auth.0.is_empty() {
            side.auth.0.write(side.auth.1, &mut tx)?;
        }
        if !side.alarms.is_empty() {
            let mut b = tx.bucket(ALARM_BUCKET)?;
            for (&(member, alarm), &raised) in side.alarms {
                let k = crate::alarm::key(member, alarm);
                if raised {
                    b.put(&k, &[])?;
                } else {
                    b.delete(&k)?;
                }
            }
        }
        if !leases.is_empty() {
            let mut b = tx.bucket(LEASE_BUCKET)?;
            for (id, v) in leases {
                match v {
                    Some(v) => b.put(&id.to_be_bytes(), v)?,
                    None => {
                        b.delete(&id.to_be_bytes())?;
                    }
                }
            }
        }
        {
            let mut keys = tx.bucket(KEY_BUCKET)?;
            for (rev, tomb, v) in taken.entries.read().iter() {
                keys.put(rev.to_key(tomb).as_bytes(), v)?;
            }
        }
        {
            let mut meta = tx.bucket(META_BUCKET)?;
            meta.put(CONSISTENT_INDEX, &(applied.index as i64).to_be_bytes())?;
            meta.put(TERM, &(applied.term as i64).to_be_bytes())?;
            if let Some(d) = side.downgrade {
                meta.put(crate::downgrade::KEY, &prost::Message::encode_to_vec(d))?;
            }
            if let Some(t) = new_compaction {
                meta.put(SCHEDULED_COMPACT, &t.to_be_bytes())?;
                *job = Some(CompactJob::new(t));
            }
        }
        let mut finished = None;
        if let Some(j) = job.as_mut() {
            if self.compact_step(j, &mut tx)? {
                tx.bucket(META_BUCKET)?
                    .put(FINISHED_COMPACT, &j.target.to_be_bytes())?;
                finished = Some(j.target);
            }
        }
        let t = std::time::Instant::now();
        if self.opts.durable_flush {
            tx.commit()?;
        } else {
            tx.commit_nosync()?;
        }
        BACKEND_COMMIT.observe(t.elapsed().as_secs_f64());
        if let Some(t) = finished {
            *job = None;
            tracing::info!(path = %self.path.display(), revision = t, "finished scheduled compaction");
            let (m, cv) = &self.finished;
            *m.lock() = t;
            cv.notify_all();
        }
        Ok(())
    }

    /// One bounded step of a compaction; true when it is complete.
    fn compact_step(&self, j: &mut CompactJob, tx: &mut pager::WriteTxn<'_>) -> Result<bool> {
        match &mut j.phase {
            Phase::Index(from) => {
                let next = self.index.write().compact_chunk(
                    j.target,
                    from,
                    INDEX_COMPACT_CHUNK,
                    &mut j.keep,
                );
                j.phase = match next {
                    Some(k) => Phase::Index(k),
                    None => Phase::Delete(Rev::new(0, 0).to_key(false).as_bytes().to_vec()),
                };
                Ok(false)
            }
            Phase::Delete(from) => {
                let end = Rev::new(j.target + 1, 0).to_key(false);
                let mut keys = tx.bucket(KEY_BUCKET)?;
                let mut doomed = Vec::new();
                let mut last = None;
                for (seen, e) in keys.range(from.as_slice()..end.as_bytes()).enumerate() {
                    let (k, _) = e?;
                    if seen == self.opts.compaction_batch {
                        last = Some(k.to_vec());
                        break;
                    }
                    let (r, _) = Rev::from_key(k).ok_or_else(|| {
                        corrupt(
                            &self.path,
                            format!("key bucket entry {k:?} is not a revision"),
                        )
                    })?;
                    if !j.keep.contains(&r) {
                        doomed.push(k.to_vec());
                    }
                }
                for k in &doomed {
                    keys.delete(k)?;
                }
                match last {
                    Some(k) => {
                        j.phase = Phase::Delete(k);
                        Ok(false)
                    }
                    None => Ok(true),
                }
            }
        }
    }
}

/// Reads stored revisions: from the pending batches first, then the pager snapshot.
pub(crate) struct Reader {
    pendings: Vec<Arc<Pending>>,
    txn: pager::ReadTxn,
}

impl Reader {
    /// The `KeyValue` stored at `rev` (a live revision the index returned).
    pub(crate) fn kv(&self, path: &Path, rev: Rev) -> Result<KeyValue> {
        let decode = |b: &[u8]| {
            KeyValue::decode(b).map_err(|e| corrupt(path, format!("revision {rev:?}: {e}")))
        };
        for p in self.pendings.iter().rev() {
            if let Some(r) = p.with(rev, decode) {
                return r;
            }
        }
        let bucket = self.txn.bucket(KEY_BUCKET)?;
        match bucket.get(rev.to_key(false).as_bytes())? {
            Some(b) => decode(b),
            None => Err(corrupt(
                path,
                format!("revision {rev:?} is in the index but not stored"),
            )),
        }
    }

    /// etcd's rangeKeys: the keys of `range` visible at `ro.rev` in a view at `cur_rev`.
    pub(crate) fn range_keys(
        &self,
        inner: &Inner,
        range: KeyRange<'_>,
        cur_rev: i64,
        ro: RangeOptions,
    ) -> Result<RangeResult> {
        if ro.rev > cur_rev {
            return Err(Error::FutureRev);
        }
        let at = if ro.rev <= 0 { cur_rev } else { ro.rev };
        let ix = inner.index.read();
        if at < ix.compacted() {
            return Err(Error::Compacted);
        }
        if ro.count {
            let count = ix.count(range, at) as i64;
            return Ok(RangeResult {
                kvs: Vec::new(),
                count,
                rev: cur_rev,
            });
        }
        let limit = if ro.limit <= 0 {
            usize::MAX
        } else {
            ro.limit as usize
        };
        let mut revs = Vec::new();
        let mut total = 0i64;
        ix.visit(range, at, |_, v| {
            if revs.len() < limit {
                revs.push(v.modified);
            }
            total += 1;
            true
        });
        drop(ix);
        let kvs = revs
            .into_iter()
            .map(|r| self.kv(&inner.path, r))
            .collect::<Result<Vec<_>>>()?;
        Ok(RangeResult {
            kvs,
            count: total,
            rev: cur_rev,
        })
    }

    /// Every stored entry (revision, tombstone, value) whose main revision is in `[from, to]`,
    /// in revision order — the pager's, then pending ones — until `f` returns false.
    pub(crate) fn for_each_entry(
        &self,
        path: &Path,
        from: i64,
        to: i64,
        mut f: impl FnMut(Rev, bool, &[u8]) -> bool,
    ) -> Result<()> {
        let lo = Rev::new(from.max(0), 0).to_key(false);
        let hi = Rev::new(to.saturating_add(1), 0).to_key(false);
        let bucket = self.txn.bucket(KEY_BUCKET)?;
        let mut last = None;
        for e in bucket.range(lo.as_bytes()..hi.as_bytes()) {
            let (k, v) = e?;
            let (r, tomb) = Rev::from_key(k).ok_or_else(|| {
                corrupt(path, format!("key bucket entry {k:?} is not a revision"))
            })?;
            if !f(r, tomb, v) {
                return Ok(());
            }
            last = Some(r);
        }
        for p in &self.pendings {
            for (r, tomb, v) in p.entries.read().iter() {
                // Entries the pager snapshot already holds (a flush committed but not yet
                // retired the batch) were seen above.
                if r.main < from || r.main > to || last.is_some_and(|l| r <= l) {
                    continue;
                }
                if !f(r, tomb, v) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

/// A consistent read view at one revision; holding it pins its pager pages, not the writer.
pub struct Snapshot {
    pub(crate) inner: Arc<Inner>,
    pub(crate) reader: Reader,
    pub(crate) rev: i64,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("rev", &self.rev)
            .finish_non_exhaustive()
    }
}

impl Snapshot {
    /// The revision this view reads at.
    pub fn rev(&self) -> i64 {
        self.rev
    }

    /// Calls `f` with every stored revision (live, historical or tombstone) in order: what
    /// compaction has not removed yet.
    pub fn for_each_revision(&self, mut f: impl FnMut(Rev)) -> Result<()> {
        self.reader
            .for_each_entry(&self.inner.path, 0, i64::MAX, |r, _, _| {
                f(r);
                true
            })
    }
}

/// The writer. Dropping it flushes when the pending batch is full.
pub struct Writer<'s> {
    pub(crate) store: &'s Store,
    pub(crate) st: Option<MutexGuard<'s, WriteState>>,
}

impl std::fmt::Debug for Writer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}

impl Writer<'_> {
    pub(crate) fn state(&mut self) -> &mut WriteState {
        self.st
            .as_mut()
            .expect("the writer holds the state until dropped")
    }

    pub(crate) fn inner(&self) -> &Inner {
        &self.store.inner
    }

    /// Records the consensus position the writes so far cover; the next flush persists it with
    /// them.
    pub fn set_applied(&mut self, applied: Applied) {
        self.state().applied = applied;
    }

    /// Appends one stored entry to the pending batch.
    pub(crate) fn append(&mut self, rev: Rev, tombstone: bool, encode: impl FnOnce(&mut Vec<u8>)) {
        let st = self.state();
        let mut e = st.pending.entries.write();
        encode(&mut e.data);
        let end = e.data.len();
        e.revs.push((rev, tombstone, end));
        drop(e);
        st.pending_len += 1;
    }

    /// Stops the store: later writes fail with `msg`.
    pub(crate) fn fail(&mut self, msg: String) {
        tracing::error!("{msg}");
        self.state().failed = Some(msg);
    }

    /// Hands a finished write transaction's revision and events (if it built them) to the
    /// watchers; called in revision order, with the writer held.
    pub(crate) fn notify(&mut self, rev: i64, events: Option<Vec<api::mvccpb::Event>>) {
        self.store.inner.hub.notify(rev, events);
    }

    /// Publishes a finished write transaction's revision to readers.
    pub(crate) fn publish_rev(&mut self, rev: i64) {
        self.state().rev = rev;
        self.store.inner.view.write().rev = rev;
    }

    /// Schedules compaction at `rev`: reads below it fail from now on; the history is removed
    /// in the background, in bounded steps.
    pub fn compact(&mut self, rev: i64) -> Result<i64> {
        let st = self.state();
        if rev <= st.compacted {
            return Err(Error::Compacted);
        }
        if rev > st.rev {
            return Err(Error::FutureRev);
        }
        st.compacted = rev;
        st.new_compaction = Some(rev);
        let cur = st.rev;
        self.store.inner.index.write().set_compacted(rev);
        Ok(cur)
    }
}

/// Pending entries, in batches, beyond which writers flush themselves instead of leaving it to
/// the flush thread: backpressure when the disk cannot keep up.
const MAX_PENDING_BATCHES: usize = 4;

impl Drop for Writer<'_> {
    fn drop(&mut self) {
        let limit = self.store.inner.opts.batch_limit;
        let pending = self.st.as_ref().map_or(0, |s| s.pending_len);
        self.st = None;
        if pending >= limit.saturating_mul(MAX_PENDING_BATCHES) {
            if let Err(e) = self.store.inner.flush() {
                tracing::error!(error = %e, "flush failed");
            }
        } else if pending >= limit {
            self.store.inner.wake.kick();
        }
    }
}
