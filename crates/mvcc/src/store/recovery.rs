//! Opening a store's file: the index rebuilt from the `key` bucket, the leases and their keys,
//! the meta bucket's revisions and consensus position.

use std::collections::HashMap;
use std::path::Path;

use prost::Message;

use api::mvccpb::KeyValue;
use ids::{LeaseId, RaftIndex};

use super::layout::{
    be_i64, corrupt, CONSISTENT_INDEX, FINISHED_COMPACT, KEY_BUCKET, LEASE_BUCKET, META_BUCKET,
    SCHEDULED_COMPACT, TERM,
};
use super::open::Applied;
use crate::error::Result;
use crate::index::Index;
use crate::lease::{Lease, Lessor};
use crate::revision::Rev;

/// What a store's file holds besides its revisions' values.
pub(super) struct Recovered {
    pub(super) index: Index,
    /// The newest revision stored (at least the compaction revisions).
    pub(super) rev: i64,
    /// The revision the last finished compaction reached (-1 before any).
    pub(super) finished_compaction: i64,
    /// The revision of the last compaction scheduled, finished or not (-1 before any).
    pub(super) scheduled_compaction: i64,
    pub(super) applied: Applied,
    /// The leases, with the keys attached to them.
    pub(super) lessor: Lessor,
}

/// Rebuilds the index from the `key` bucket and the leases from theirs; reads the meta bucket.
pub(super) fn restore(db: &pager::Db, path: &Path) -> Result<Recovered> {
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
        index: RaftIndex(read_i64(CONSISTENT_INDEX)?.map_or(0, |v| v as u64)),
        term: read_i64(TERM)?.map_or(0, |v| v as u64),
    };
    let mut lessor = Lessor::new(0);
    for e in tx.bucket(LEASE_BUCKET)?.iter() {
        let (k, v) = e?;
        let id = be_i64(k)
            .map(LeaseId)
            .ok_or_else(|| corrupt(path, format!("lease bucket key {k:?} is not an id")))?;
        let lease =
            Lease::decode(v).ok_or_else(|| corrupt(path, format!("lease {id} is damaged")))?;
        lessor.restore(id, lease);
    }
    let mut key_lease: HashMap<Vec<u8>, LeaseId> = HashMap::new();
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
                key_lease.insert(kv.key, LeaseId(kv.lease));
            } else {
                key_lease.remove(&kv.key);
            }
        }
        rev = r.main;
    }
    for (key, id) in key_lease {
        lessor.attach(id, &key);
    }
    drop(tx);
    index.pack();
    // The scan read every page of values; none is needed in memory for that.
    if let Err(e) = db.release_resident() {
        tracing::debug!("after the index rebuild: {e}");
    }
    let rev = rev.max(compacted).max(scheduled);
    Ok(Recovered {
        index,
        rev,
        finished_compaction: compacted,
        scheduled_compaction: scheduled,
        applied,
        lessor,
    })
}
