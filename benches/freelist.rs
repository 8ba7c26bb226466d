//! Freelist algorithms head to head: bbolt's sorted array against the segregated hashmap.
//!
//! The free set is *fragmented* the way a long-lived database's is: `n` free pages in runs of
//! 1–2 pages (random), each separated from the next by 1–3 used pages, over page ids from 2
//! upwards; above them, the space a recent file growth added: 8 free runs of 8 pages.
//!
//! - `freelist_allocate/{array,hashmap}/n`: allocate a run of 4 pages (as a 16 KiB value needs)
//!   and release it again, so the state is the same before every iteration. The array scans for
//!   4 consecutive ids and only finds them above all the fragments; the hashmap takes a run of 8
//!   from its length index and splits it.
//! - `freelist_release/{array,hashmap}/n`: release what one transaction freed — 16 runs of 3
//!   pages (48 pages: pages of rewritten leaves and branches, an overflow run) spread over the id
//!   space — into the free set. Only the release is timed; between iterations the 16 runs are
//!   allocated back (they are the only runs of 3, so allocation finds exactly them).
//!
//! Run: `cargo bench --bench freelist`.

use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion};
use pager::freelist::{self, FreeSet, FreelistKind, Run};
use pager::PageId;
use rand::{Rng, SeedableRng};

const SIZES: [u64; 3] = [10_000, 100_000, 1_000_000];
const KINDS: [(&str, FreelistKind); 2] = [
    ("array", FreelistKind::Array),
    ("hashmap", FreelistKind::Hashmap),
];

/// Free runs of 1–2 pages separated by used pages, `n` pages in all; every `gap_every` runs one
/// of the separating gaps is 5 pages wide (`used, 3 pages, used`), and the 3 pages in the middle
/// are returned as a pending run. Then the growth runs above.
fn fragmented(n: u64, pending_runs: usize) -> (Vec<Run>, Vec<Run>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(n);
    let mut free = Vec::new();
    let mut pending = Vec::new();
    let runs_estimate = (n as f64 / 1.5) as usize;
    let gap_every = (runs_estimate / (pending_runs + 2)).max(1);
    let (mut at, mut total) = (2u64, 0u64);
    while total < n {
        let len = rng.gen_range(1..=2).min(n - total);
        free.push((PageId(at), len));
        at += len;
        total += len;
        if pending_runs > 0 && free.len() % gap_every == 0 && pending.len() < pending_runs {
            pending.push((PageId(at + 1), 3));
            at += 5;
        } else {
            at += rng.gen_range(1..=3);
        }
    }
    for _ in 0..8 {
        free.push((PageId(at), 8));
        at += 9;
    }
    (free, pending)
}

fn set_of(kind: FreelistKind, runs: &[Run]) -> Box<dyn FreeSet> {
    let mut s = freelist::new_set(kind);
    s.release(runs);
    s
}

/// Both groups: 20 samples, 2 s each — the array at a million pages takes milliseconds an iteration.
fn group<'c>(c: &'c mut Criterion, name: &str) -> BenchmarkGroup<'c, WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    g
}

fn allocate(c: &mut Criterion) {
    let mut g = group(c, "freelist_allocate");
    for n in SIZES {
        let (free, _) = fragmented(n, 0);
        for (name, kind) in KINDS {
            let mut s = set_of(kind, &free);
            g.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
                b.iter(|| {
                    let p = s.allocate(4).expect("the growth runs hold runs of 4");
                    s.release(&[(p, 4)]);
                    p
                })
            });
            assert_eq!(
                s.count(),
                free.iter().map(|r| r.1).sum::<u64>(),
                "{name}: state drifted"
            );
        }
    }
    g.finish();
}

fn release(c: &mut Criterion) {
    let mut g = group(c, "freelist_release");
    for n in SIZES {
        let (free, pending) = fragmented(n, 16);
        assert_eq!(pending.len(), 16);
        for (name, kind) in KINDS {
            let mut s = set_of(kind, &free);
            g.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
                b.iter_custom(|iters| {
                    let mut spent = Duration::ZERO;
                    for _ in 0..iters {
                        let t = Instant::now();
                        s.release(&pending);
                        spent += t.elapsed();
                        for _ in 0..pending.len() {
                            s.allocate(3).expect("the released runs of 3");
                        }
                    }
                    spent
                })
            });
            assert_eq!(
                s.runs().len(),
                set_of(kind, &free).runs().len(),
                "{name}: state drifted"
            );
        }
    }
    g.finish();
}

criterion_group!(benches, allocate, release);
criterion_main!(benches);
