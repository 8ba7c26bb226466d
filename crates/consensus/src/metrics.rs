//! The consensus layer's Prometheus metrics, with etcd's names, in the process-wide default
//! registry (the server's `/metrics` serves them).

use std::sync::LazyLock;

use prometheus::{
    exponential_buckets, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGaugeVec, Opts,
};

/// Registers `m` in the default registry. Registration fails only for a name registered twice,
/// which these fixed names never are; a failure is logged, and the metric still counts.
fn registered<M: prometheus::core::Collector + Clone + 'static>(m: M) -> M {
    if let Err(e) = prometheus::register(Box::new(m.clone())) {
        tracing::warn!("registering a metric: {e}");
    }
    m
}

/// The latency of the WAL's fdatasync calls (etcd: 1 ms to 8 s, doubling).
pub static WAL_FSYNC: LazyLock<Histogram> = LazyLock::new(|| {
    let buckets = exponential_buckets(0.001, 2.0, 14).unwrap_or_default();
    let opts = HistogramOpts::new(
        "etcd_disk_wal_fsync_duration_seconds",
        "The latency distributions of fsync called by WAL.",
    )
    .buckets(buckets);
    registered(Histogram::with_opts(opts).expect("a valid metric"))
});

/// Round trips of a probe to each peer (etcd: 0.1 ms to 3.3 s, doubling), by peer id.
pub static PEER_RTT: LazyLock<HistogramVec> = LazyLock::new(|| {
    let buckets = exponential_buckets(0.0001, 2.0, 16).unwrap_or_default();
    let opts = HistogramOpts::new(
        "etcd_network_peer_round_trip_time_seconds",
        "Round-Trip-Time histogram between peers",
    )
    .buckets(buckets);
    registered(HistogramVec::new(opts, &["To"]).expect("a valid metric"))
});

/// Bytes of raft messages sent to each peer.
pub static PEER_SENT_BYTES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    let opts = Opts::new(
        "etcd_network_peer_sent_bytes_total",
        "The total number of bytes sent to peers.",
    );
    registered(IntCounterVec::new(opts, &["To"]).expect("a valid metric"))
});

/// Bytes of raft messages received from each peer.
pub static PEER_RECEIVED_BYTES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    let opts = Opts::new(
        "etcd_network_peer_received_bytes_total",
        "The total number of bytes received from peers.",
    );
    registered(IntCounterVec::new(opts, &["From"]).expect("a valid metric"))
});

/// Sends to a peer that failed (the link was down or full).
pub static PEER_SENT_FAILURES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    let opts = Opts::new(
        "etcd_network_peer_sent_failures_total",
        "The total number of send failures from peers.",
    );
    registered(IntCounterVec::new(opts, &["To"]).expect("a valid metric"))
});

/// Whether the stream to each peer is up (1) or not (0), by this member and the peer: etcd's
/// gauge of active peer connections.
pub static ACTIVE_PEERS: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    let opts = Opts::new(
        "etcd_network_active_peers",
        "The current number of active peer connections.",
    );
    registered(IntGaugeVec::new(opts, &["Local", "Remote"]).expect("a valid metric"))
});

/// Leader changes this member has seen.
pub static LEADER_CHANGES: LazyLock<IntCounter> = LazyLock::new(|| {
    registered(
        IntCounter::new(
            "etcd_server_leader_changes_seen_total",
            "The number of leader changes seen.",
        )
        .expect("a valid metric"),
    )
});

/// A peer id as etcd labels it (hex).
pub(crate) fn peer(id: crate::MemberId) -> String {
    id.to_string()
}

/// Registers every metric now, so `/metrics` lists them before their first sample.
pub fn init() {
    LazyLock::force(&WAL_FSYNC);
    LazyLock::force(&PEER_RTT);
    LazyLock::force(&PEER_SENT_BYTES);
    LazyLock::force(&PEER_RECEIVED_BYTES);
    LazyLock::force(&PEER_SENT_FAILURES);
    LazyLock::force(&LEADER_CHANGES);
    LazyLock::force(&ACTIVE_PEERS);
}
