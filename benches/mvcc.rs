//! mvcc benches.
//!
//! - `mvcc_range/{1,100,10000}`: a Range over that many consecutive keys, each in a fresh read
//!   snapshot, in a store of 100,000 keys (64-byte keys, 256-byte values, flushed to the pager
//!   file, as the store of a running server mostly is). Throughput is in keys returned.
//! - `mvcc_watch_fanout/10000`: puts to one key that 10,000 watchers watch — 10 streams of 1,000
//!   watchers (10 clients), each stream drained by its own consumer thread — timed from the first
//!   put until every watcher has received every put. Throughput is in events delivered. The
//!   streams keep the default queue bound, so when the consumers fall behind the writer the
//!   watchers go through the slow-consumer path (catch-up from the ring of recent batches) as
//!   they would in a server.
//!
//! Run: `cargo bench --bench mvcc`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use api::etcdserverpb::{PutRequest, RangeRequest, WatchCreateRequest};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mvcc::{Store, StoreOptions};

const KEYS: usize = 100_000;

fn key(i: usize) -> Vec<u8> {
    format!("{i:064}").into_bytes()
}

fn range(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("db"), StoreOptions::default()).unwrap();
    let value = vec![0x61u8; 256];
    for i in 0..KEYS {
        store
            .write()
            .unwrap()
            .put(&PutRequest {
                key: key(i),
                value: value.clone(),
                ..Default::default()
            })
            .unwrap();
    }
    store.flush().unwrap();
    let mut g = c.benchmark_group("mvcc_range");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    for n in [1usize, 100, 10_000] {
        g.throughput(Throughput::Elements(n as u64));
        let mut start = 0;
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter(|| {
                start = (start + 7919) % (KEYS - n);
                let r = store
                    .read()
                    .unwrap()
                    .range(&RangeRequest {
                        key: key(start),
                        range_end: if n == 1 { Vec::new() } else { key(start + n) },
                        ..Default::default()
                    })
                    .unwrap();
                assert_eq!(r.kvs.len(), n);
                r
            })
        });
    }
    g.finish();
}

fn watch_fanout(c: &mut Criterion) {
    const STREAMS: usize = 10;
    const PER_STREAM: usize = 1_000;
    const WATCHERS: u64 = (STREAMS * PER_STREAM) as u64;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("db"), StoreOptions::default()).unwrap();
    let received = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let consumers: Vec<_> = (0..STREAMS)
        .map(|_| {
            let s = store.watch_stream();
            for _ in 0..PER_STREAM {
                s.watch(&WatchCreateRequest {
                    key: b"hot".to_vec(),
                    ..Default::default()
                })
                .unwrap();
            }
            let (received, stop) = (received.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(r) = s.recv_timeout(Duration::from_millis(50)) {
                        received.fetch_add(r.events.len() as u64, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let mut g = c.benchmark_group("mvcc_watch_fanout");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(WATCHERS));
    g.bench_function(BenchmarkId::from_parameter(WATCHERS), |b| {
        b.iter_custom(|iters| {
            let target = received.load(Ordering::Relaxed) + iters * WATCHERS;
            let t = Instant::now();
            for i in 0..iters {
                store
                    .write()
                    .unwrap()
                    .put(&PutRequest {
                        key: b"hot".to_vec(),
                        value: i.to_le_bytes().to_vec(),
                        ..Default::default()
                    })
                    .unwrap();
            }
            while received.load(Ordering::Relaxed) < target {
                std::thread::yield_now();
            }
            t.elapsed()
        })
    });
    g.finish();
    stop.store(true, Ordering::Relaxed);
    for c in consumers {
        c.join().unwrap();
    }
}

criterion_group!(benches, range, watch_fanout);
criterion_main!(benches);
