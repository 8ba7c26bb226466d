//! `pager_commit_fragmented/{array,hashmap}`: the cost of a commit in a large, fragmented database
//! — where etcd's bbolt stalls with its array freelist.
//!
//! Scenario (built once per run, in a temporary directory; it takes a minute and ~3.5 GB):
//! - 840,000 keys, each with a 2,048-byte value, which the pager stores as a one-page overflow run,
//!   inserted in key order, so value pages lie in key order in the file.
//! - Then 3 of every 5 keys are deleted (pattern keep-1, delete-2, keep-1, delete-1): ≈ 504,000
//!   free pages in runs of 1 and 2 pages between live ones, in a ≈ 3.4 GiB file. Two durable
//!   commits make all of them allocatable.
//! - Each measured transaction overwrites one of 64 keys with a 16 KiB value (a run of 5 pages)
//!   and commits with `commit_nosync` — the commit kvd's apply loop makes (the raft WAL holds
//!   durability). The measured time covers `begin_write` (where freed pages are released into the
//!   free set), the put and the commit. Every 16 transactions an untimed `sync()` makes a new
//!   durable meta so that the pages those transactions freed are reused from then on, as in a
//!   running server.
//!
//! The array freelist scans all ≈ 500,000 ids for a run of 5 (none exists among the fragments)
//! and merge-sorts released pages into its array; the hashmap finds runs by length in O(1).
//! Both kinds run on the same file, array first, then reopened with the hashmap.
//!
//! Run: `cargo bench --bench pager`.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use pager::{Db, FreelistKind, Options};

const KEYS: u32 = 840_000;
const BATCH: u32 = 20_000;

fn build(path: &std::path::Path) {
    let db = Db::open(
        path,
        Options {
            fill_percent: 1.0,
            ..Options::default()
        },
    )
    .unwrap();
    let value = vec![0xabu8; 2048];
    for start in (0..KEYS).step_by(BATCH as usize) {
        let mut w = db.begin_write().unwrap();
        let mut b = w.create_bucket_if_missing(b"b").unwrap();
        for i in start..start + BATCH {
            b.put(&i.to_be_bytes(), &value).unwrap();
        }
        w.commit_nosync().unwrap();
    }
    db.sync().unwrap();
    for start in (0..KEYS).step_by(BATCH as usize * 4) {
        let mut w = db.begin_write().unwrap();
        let mut b = w.bucket(b"b").unwrap();
        for i in start..(start + BATCH * 4).min(KEYS) {
            if matches!(i % 5, 1 | 2 | 4) {
                b.delete(&i.to_be_bytes()).unwrap();
            }
        }
        w.commit_nosync().unwrap();
    }
    db.sync().unwrap();
    db.sync().unwrap();
    // Two more durable commits: every page freed above is now allocatable.
    for _ in 0..2 {
        let mut w = db.begin_write().unwrap();
        w.bucket(b"b").unwrap().put(b"\xff", b"x").unwrap();
        w.commit().unwrap();
    }
    db.close().unwrap();
}

fn commit_fragmented(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(
        std::env::var_os("KVD_BENCH_DIR").unwrap_or_else(|| std::env::temp_dir().into()),
    )
    .unwrap();
    let path = dir.path().join("fragmented.db");
    let t = Instant::now();
    build(&path);
    let mut g = c.benchmark_group("pager_commit_fragmented");
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    for (name, kind) in [
        ("array", FreelistKind::Array),
        ("hashmap", FreelistKind::Hashmap),
    ] {
        let db = Db::open(
            &path,
            Options {
                freelist: kind,
                ..Options::default()
            },
        )
        .unwrap();
        if kind == FreelistKind::Array {
            let s = db.stats();
            let short: u64 = s
                .free_runs
                .iter()
                .filter(|(len, _)| **len <= 2)
                .map(|(len, n)| len * n)
                .sum();
            eprintln!(
                "scenario built in {:.0?}: file {:.2} GiB, {} free pages, {} of them in runs of 1-2, depth {}",
                t.elapsed(),
                s.file_size as f64 / (1u64 << 30) as f64,
                s.free_pages,
                short,
                s.depth
            );
            assert!(
                s.file_size >= 2 << 30 && s.free_pages >= 500_000 && short * 10 >= s.free_pages * 9,
                "{s:?}"
            );
        }
        let value = vec![0x5au8; 16 << 10];
        let mut n = 0u64;
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    n += 1;
                    let t = Instant::now();
                    let mut w = db.begin_write().unwrap();
                    w.bucket(b"b")
                        .unwrap()
                        .put(&[0xfe, (n % 64) as u8], &value)
                        .unwrap();
                    w.commit_nosync().unwrap();
                    spent += t.elapsed();
                    if n.is_multiple_of(16) {
                        db.sync().unwrap();
                    }
                }
                spent
            })
        });
        db.close().unwrap();
    }
    g.finish();
}

criterion_group!(benches, commit_fragmented);
criterion_main!(benches);
