//! Flushing: the pending batch, the applied consensus position, lease, alarm, auth and
//! cluster bucket changes, and one step of a compaction under way, in one pager commit.

use std::sync::{Arc, Weak};

use super::compaction::CompactJob;
use super::layout::{
    compact_rev_value, ALARM_BUCKET, CLUSTER_BUCKET, CONSISTENT_INDEX, FINISHED_COMPACT,
    KEY_BUCKET, LEASE_BUCKET, META_BUCKET, SCHEDULED_COMPACT, TERM,
};
use super::open::{Applied, Inner};
use super::pending::Pending;
use crate::error::{Error, Result};

/// The latency of the pager commits that flush writes (etcd's name; 1 ms to 8 s, doubling).
pub(super) static BACKEND_COMMIT: std::sync::LazyLock<prometheus::Histogram> =
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

/// A flush that is not durable by choice (the log holds what it writes) still syncs once this
/// many bytes of revisions were flushed since the last sync. Unsynced, the file's dirty pages
/// grow until something syncs them: the next fsync of the file — or of the log, on a
/// filesystem whose journal commit writes them first — then waits behind all of them (with
/// 16 KiB values at 2,000 puts/s, 160 MB by each raft snapshot: the log's fsync stalled for
/// 0.3–0.5 s), and pages the flushes freed wait for that sync before they are reused.
const SYNC_BYTES: u64 = 8 << 20;

/// Registers the store's metrics now, so `/metrics` lists them before their first sample.
pub fn init_metrics() {
    std::sync::LazyLock::force(&BACKEND_COMMIT);
}

/// What a flush writes besides revisions: lease, alarm, auth and cluster bucket changes.
#[derive(Clone, Copy)]
pub(super) struct Side<'a> {
    pub(super) leases: &'a std::collections::BTreeMap<ids::LeaseId, Option<Vec<u8>>>,
    pub(super) alarms: &'a std::collections::BTreeMap<(ids::MemberId, i32), bool>,
    pub(super) auth: (&'a crate::auth::AuthDirty, &'a crate::auth::AuthData),
    pub(super) cluster: Option<&'a crate::cluster::ClusterChanges>,
}

pub(super) fn flush_loop(weak: Weak<Inner>) {
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
            // A store stopped by the failure fails every flush the same way: no more to do
            // (or to log).
            if inner.state.lock().failed.is_some() {
                return;
            }
        }
    }
}

impl Inner {
    /// One flush: the pending batch, the applied index, and one step of a compaction under way.
    pub(super) fn flush(&self) -> Result<()> {
        let mut job = self.flushing.lock();
        let (taken, applied, new_compaction, leases, alarms, auth, cluster) = {
            let mut st = self.state.lock();
            if let Some(f) = &st.failed {
                return Err(Error::Stopped(f.clone()));
            }
            let leases = std::mem::take(&mut self.lessor.lock().dirty);
            let alarms = std::mem::take(&mut self.alarms.lock().dirty);
            let cluster = self.cluster.lock().take_changes();
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
                && cluster.is_none()
            {
                return Ok(());
            }
            let fresh = Arc::new(Pending::sized_like(&st.pending));
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
                cluster,
            )
        };
        let side = Side {
            leases: &leases,
            alarms: &alarms,
            auth: (&auth.0, &auth.1),
            cluster: cluster.as_ref(),
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

    pub(super) fn write_flush(
        &self,
        taken: &Pending,
        applied: Applied,
        new_compaction: Option<(i64, i64)>,
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
                    Some(v) => b.put(&id.0.to_be_bytes(), v)?,
                    None => {
                        b.delete(&id.0.to_be_bytes())?;
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
            meta.put(CONSISTENT_INDEX, &(applied.index.0 as i64).to_be_bytes())?;
            meta.put(TERM, &(applied.term as i64).to_be_bytes())?;
            if side.cluster.is_some_and(|c| c.downgrade.is_some()) {
                // Kept in the cluster bucket now (below).
                meta.delete(crate::cluster::DOWNGRADE)?;
            }
            if let Some((t, prev)) = new_compaction {
                meta.put(SCHEDULED_COMPACT, compact_rev_value(t).as_bytes())?;
                *job = Some(CompactJob::new(t, prev));
            }
        }
        if let Some(c) = side.cluster {
            let mut bucket = tx.bucket(CLUSTER_BUCKET)?;
            if let Some(d) = &c.downgrade {
                bucket.put(
                    crate::cluster::DOWNGRADE,
                    &crate::cluster::encode_downgrade(d),
                )?;
            }
            if let Some(v) = &c.version {
                bucket.put(crate::cluster::VERSION, v.as_bytes())?;
            }
        }
        let mut finished = None;
        if let Some(j) = job.as_mut() {
            if self.compact_step(j, &mut tx)? {
                tx.bucket(META_BUCKET)?
                    .put(FINISHED_COMPACT, compact_rev_value(j.target).as_bytes())?;
                finished = Some(j.target);
            }
        }
        let t = std::time::Instant::now();
        let flushed = taken.entries.read().data.len() as u64;
        let unsynced = self
            .unsynced
            .fetch_add(flushed, std::sync::atomic::Ordering::Relaxed)
            + flushed;
        if self.opts.durable_flush || unsynced >= SYNC_BYTES {
            tx.commit()?;
            self.unsynced.store(0, std::sync::atomic::Ordering::Relaxed);
        } else {
            tx.commit_nosync()?;
        }
        BACKEND_COMMIT.observe(t.elapsed().as_secs_f64());
        if let Some(t) = finished {
            if let Some(j) = job.take() {
                self.hashes.lock().keep(j.hash());
            }
            tracing::info!(path = %self.path.display(), revision = t, "finished scheduled compaction");
            let (m, cv) = &self.finished;
            *m.lock() = t;
            cv.notify_all();
        }
        Ok(())
    }
}
