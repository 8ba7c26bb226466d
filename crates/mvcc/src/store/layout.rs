//! Where the store keeps things in its pager file: the buckets, the meta bucket's keys, and
//! how a damaged entry is reported.

use std::path::Path;

use crate::error::Error;
use crate::revision::Rev;

pub(crate) const KEY_BUCKET: &[u8] = b"key";
pub(crate) const META_BUCKET: &[u8] = b"meta";
pub(crate) const LEASE_BUCKET: &[u8] = b"lease";
pub(crate) const ALARM_BUCKET: &[u8] = b"alarm";
pub(crate) const CLUSTER_BUCKET: &[u8] = b"cluster";
pub(super) const CONSISTENT_INDEX: &[u8] = b"consistent_index";
pub(super) const TERM: &[u8] = b"term";
pub(super) const SCHEDULED_COMPACT: &[u8] = b"scheduledCompactRev";
pub(super) const FINISHED_COMPACT: &[u8] = b"finishedCompactRev";

pub(super) fn corrupt(path: &Path, reason: String) -> Error {
    Error::Corrupt {
        path: path.display().to_string(),
        reason,
    }
}

pub(super) fn be_i64(v: &[u8]) -> Option<i64> {
    Some(i64::from_be_bytes(v.try_into().ok()?))
}

/// A compaction revision as etcd keeps it in the meta bucket: the revision key of (rev, 0).
pub(crate) fn compact_rev_value(rev: i64) -> crate::revision::RevKey {
    Rev::new(rev, 0).to_key(false)
}

/// A compaction revision read back: etcd's revision key, or the 8-byte big-endian number kvd
/// wrote before it kept etcd's form.
pub(super) fn compact_rev(v: &[u8]) -> Option<i64> {
    match Rev::from_key(v) {
        Some((r, false)) => Some(r.main),
        _ => be_i64(v),
    }
}
