//! `raft_propose/{1,3}`: proposals through a raft cluster of 1 or 3 in-process members, each
//! with its own WAL (on the same disk), etcd's default timing, and a state machine that only
//! records what it applied. One iteration proposes 256 values of 256 bytes concurrently on the
//! leader and waits until the leader has applied all of them: each costs one WAL fsync per
//! Ready shared by the batch (group commit), on every member.
//!
//! Run: `cargo bench --bench raft`.

#[path = "../crates/consensus/tests/harness/mod.rs"]
mod harness;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use harness::Cluster;

const BATCH: u64 = 256;

fn tune(c: &mut consensus::Config) {
    // etcd's defaults (100 ms heartbeat, 1 s election timeout, 10,000-entry snapshots).
    c.wal.segment_size = 64 << 20;
}

fn propose(c: &mut Criterion) {
    let mut g = c.benchmark_group("raft_propose");
    g.warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8))
        .throughput(Throughput::Elements(BATCH));
    for n in [1u64, 3] {
        let cluster = Cluster::new_light(n, tune);
        let leader = cluster.leader();
        let value = vec![b'v'; 256];
        g.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| {
                let futs: Vec<_> = (0..BATCH)
                    .map(|_| cluster.node(leader).propose(value.clone()))
                    .collect();
                cluster.rt.block_on(async move {
                    for f in futs {
                        f.await.expect("proposal");
                    }
                });
            })
        });
    }
    g.finish();
}

criterion_group!(benches, propose);
criterion_main!(benches);
