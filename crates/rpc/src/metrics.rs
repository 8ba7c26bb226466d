//! etcd 3.7's `etcd_server_request_duration_seconds`: how long each request took, by etcd's
//! request type and whether it succeeded — proposals from their proposal to their answer,
//! linearizable and serializable Ranges and read-only Txns from their start.

use std::sync::LazyLock;
use std::time::Instant;

use prometheus::{exponential_buckets, Histogram, HistogramOpts, HistogramVec};

use crate::request::Op;

static REQUEST_DURATION: LazyLock<HistogramVec> = LazyLock::new(|| {
    // etcd's buckets: 1 ms, doubling, to 8.192 s.
    let buckets = exponential_buckets(0.001, 2.0, 14).expect("valid buckets");
    let opts = HistogramOpts::new(
        "etcd_server_request_duration_seconds",
        "Response latency distribution in seconds for each type.",
    )
    .buckets(buckets);
    let h = HistogramVec::new(opts, &["type", "success"]).expect("a valid metric");
    if let Err(e) = prometheus::register(Box::new(h.clone())) {
        tracing::warn!("etcd_server_request_duration_seconds: {e}");
    }
    h
});

/// The reads' series, looked up once (reads are the hot path).
static READS: LazyLock<[Histogram; 4]> = LazyLock::new(|| {
    let h = |t: &str, ok: &str| REQUEST_DURATION.with_label_values(&[t, ok]);
    [
        h("Range", "true"),
        h("Range", "false"),
        h("ReadonlyTxn", "true"),
        h("ReadonlyTxn", "false"),
    ]
});

/// Registers the metric now, so `/metrics` lists it before its first request.
pub(crate) fn init() {
    LazyLock::force(&READS);
}

/// A read-only request (a Range; `txn`: a read-only Txn) begun at `start` ended, `ok` or not.
pub(crate) fn read(txn: bool, ok: bool, start: Instant) {
    let i = usize::from(txn) * 2 + usize::from(!ok);
    READS[i].observe(start.elapsed().as_secs_f64());
}

/// A proposal of type `kind` ([`request_type`]) begun at `start` ended, `ok` or not.
pub(crate) fn proposal(kind: &'static str, ok: bool, start: Instant) {
    let ok = if ok { "true" } else { "false" };
    REQUEST_DURATION
        .with_label_values(&[kind, ok])
        .observe(start.elapsed().as_secs_f64());
}

/// etcd's name of a request's type (`getRequestType`).
pub(crate) fn request_type(op: Option<&Op>) -> &'static str {
    match op {
        Some(Op::Put(_)) => "Put",
        Some(Op::DeleteRange(_)) => "DeleteRange",
        Some(Op::Txn(_)) => "Txn",
        Some(Op::Compaction(_)) => "Compaction",
        Some(Op::LeaseGrant(_)) => "LeaseGrant",
        Some(Op::LeaseRevoke(_)) => "LeaseRevoke",
        Some(Op::LeaseCheckpoint(_)) => "LeaseCheckpoint",
        Some(Op::Alarm(_)) => "Alarm",
        Some(Op::AuthEnable(_)) => "AuthEnable",
        Some(Op::AuthDisable(_)) => "AuthDisable",
        Some(Op::Authenticate(_)) => "Authenticate",
        Some(Op::UserAdd(_)) => "AuthUserAdd",
        Some(Op::UserDelete(_)) => "AuthUserDelete",
        Some(Op::UserChangePassword(_)) => "AuthUserChangePassword",
        Some(Op::UserGrantRole(_)) => "AuthUserGrantRole",
        Some(Op::UserRevokeRole(_)) => "AuthUserRevokeRole",
        Some(Op::RoleAdd(_)) => "AuthRoleAdd",
        Some(Op::RoleDelete(_)) => "AuthRoleDelete",
        Some(Op::RoleGrantPermission(_)) => "AuthRoleGrantPermission",
        Some(Op::RoleRevokePermission(_)) => "AuthRoleRevokePermission",
        Some(Op::DowngradeInfoSet(_)) => "DowngradeInfoSet",
        Some(Op::ClusterVersionSet(_)) => "ClusterVersionSet",
        None => "Unknown",
    }
}
