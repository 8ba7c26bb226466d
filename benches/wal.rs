//! `wal_append/{wal,raw}/{1,16,128}`: one durable append of a batch of N entries of 256 bytes
//! (what one raft Ready brings) — `Wal::save(sync)` against the floor of a raw `pwrite` of the
//! same number of bytes into a preallocated file followed by `fdatasync`. The WAL's target is
//! within 1.3× of the raw write.
//!
//! Run: `cargo bench --bench wal` (set `KVD_BENCH_DIR` to bench another disk than the temp dir).

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::time::Duration;

use consensus::wal::{Options, Wal};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use protobuf::Message;
use raft::eraftpb::{Entry, HardState};

fn bench_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(
        std::env::var_os("KVD_BENCH_DIR").unwrap_or_else(|| std::env::temp_dir().into()),
    )
    .unwrap()
}

fn append(c: &mut Criterion) {
    let mut g = c.benchmark_group("wal_append");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    for n in [1u64, 16, 128] {
        let dir = bench_dir();
        let mut wal = Wal::create(dir.path(), b"bench", Options::default()).unwrap();
        let mut next = 1u64;
        let mut batch_bytes = 0;
        g.bench_with_input(BenchmarkId::new("wal", n), &n, |b, &n| {
            b.iter(|| {
                let batch: Vec<Entry> = (next..next + n)
                    .map(|i| Entry {
                        index: i,
                        term: 1,
                        data: vec![0x61; 256].into(),
                        ..Default::default()
                    })
                    .collect();
                batch_bytes = batch
                    .iter()
                    .map(|e| e.compute_size() as usize + 9)
                    .sum::<usize>();
                let hs = HardState {
                    term: 1,
                    commit: next + n - 1,
                    ..Default::default()
                };
                wal.save(Some(&hs), &batch, true).unwrap();
                next += n;
            })
        });
        drop(wal);
        // The same bytes (entries plus the hard state record) with no WAL around them.
        let bytes = vec![0x61u8; batch_bytes + 16];
        let raw = dir.path().join("raw");
        let f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&raw)
            .unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(&vec![0u8; 64 << 20], 0).unwrap();
        f.sync_all().unwrap();
        let mut off = 0u64;
        g.bench_with_input(BenchmarkId::new("raw", n), &n, |b, _| {
            b.iter(|| {
                if off + bytes.len() as u64 > 64 << 20 {
                    off = 0;
                }
                f.write_all_at(&bytes, off).unwrap();
                f.sync_data().unwrap();
                off += bytes.len() as u64;
            })
        });
    }
    g.finish();
}

criterion_group!(benches, append);
criterion_main!(benches);
