//! Crash test for the WAL: a child process appends batches of entries, each made durable by
//! one fdatasync and then acknowledged on stdout, and is killed with SIGKILL at random moments
//! (and, with `--features failpoints`, made to die inside a save by a failpoint). After every
//! death the log must open — repairing a torn tail if there is one — and hold every acknowledged
//! entry, contiguous from 1, each with its exact bytes.
//!
//! The test binary is its own child: `wal_crash child DIR [FAILPOINTS]`.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use consensus::wal::{Options, Wal};
use raft::eraftpb::{Entry, HardState};
use rand::{Rng, SeedableRng};
use test_support::CrashChild;

const KILLS: usize = 24;

fn opts() -> Options {
    // Small segments, so kills also land in cuts and preallocation.
    Options {
        segment_size: 256 << 10,
    }
}

/// Entry `i`'s bytes: its index and a length that spans 0 to several disk sectors.
fn data(i: u64) -> Vec<u8> {
    let len = (i * 7919 % 3000) as usize;
    let mut v = vec![(i % 251) as u8; len + 8];
    v[..8].copy_from_slice(&i.to_le_bytes());
    v
}

fn child(dir: &Path) {
    let _fail = fail::FailScenario::setup();
    let (mut wal, next) = match Wal::open(dir, opts()) {
        Ok((w, r)) => {
            let last = r.entries.last().map_or(0, |e| e.index);
            (w, last + 1)
        }
        Err(consensus::wal::Error::NotFound(_)) => {
            (Wal::create(dir, b"crash test", opts()).unwrap(), 1)
        }
        Err(e) => panic!("{e}"),
    };
    let mut rng = rand::rngs::SmallRng::seed_from_u64(next);
    let mut i = next;
    let mut out = std::io::stdout().lock();
    loop {
        let n = rng.gen_range(1..20);
        let batch: Vec<Entry> = (i..i + n)
            .map(|j| Entry {
                index: j,
                term: 1,
                data: data(j).into(),
                ..Default::default()
            })
            .collect();
        let hs = HardState {
            term: 1,
            commit: i + n - 1,
            ..Default::default()
        };
        wal.save(Some(&hs), &batch, true).unwrap();
        i += n;
        writeln!(out, "acked {}", i - 1).unwrap();
        out.flush().unwrap();
    }
}

/// Opens the log and checks it against what the child acknowledged; returns the last index.
fn verify(dir: &Path, acked: u64) -> (u64, bool) {
    let (_, rec) = Wal::open(dir, opts()).unwrap_or_else(|e| panic!("open after a crash: {e}"));
    for (k, e) in rec.entries.iter().enumerate() {
        assert_eq!(e.index, k as u64 + 1, "entries not contiguous");
        assert_eq!(&e.data[..], data(e.index), "entry {} damaged", e.index);
    }
    let last = rec.entries.last().map_or(0, |e| e.index);
    assert!(
        last >= acked,
        "acknowledged {acked}, the log ends at {last}"
    );
    assert!(rec.hard_state.commit <= last);
    (last, rec.repaired.is_some())
}

/// Runs a child until it is killed after `kill_after`, or (with failpoints armed) until it
/// panics; returns what it acknowledged and whether it panicked.
fn run_child(dir: &Path, failpoints: Option<&str>, kill_after: Option<Duration>) -> (u64, bool) {
    let dir = dir.to_str().unwrap();
    let env: Vec<(&str, &str)> = failpoints.map(|f| ("FAILPOINTS", f)).into_iter().collect();
    let child = CrashChild::spawn(&["child", dir], &env, 0u64, |acked, line| {
        if let Some(n) = line.strip_prefix("acked ") {
            *acked = n.parse().unwrap();
        }
    });
    match kill_after {
        Some(d) => (child.kill_after(d).seen, false),
        None => {
            let o = child.wait();
            assert!(
                !o.status.success() && o.stderr.contains("panicked"),
                "{}: {}",
                o.status,
                o.stderr
            );
            (o.seen, true)
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("child") {
        child(Path::new(&args[2]));
        return;
    }
    // `cargo test` passes harness flags (e.g. a name filter); this test takes none.
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0x3a1);
    let (mut repaired, mut last) = (0, 0);
    for round in 0..KILLS {
        let d = Duration::from_millis(rng.gen_range(30..400));
        let (acked, _) = run_child(dir.path(), None, Some(d));
        let (l, r) = verify(dir.path(), acked);
        assert!(
            l >= last,
            "round {round}: the log shrank from {last} to {l}"
        );
        last = l;
        repaired += usize::from(r);
    }
    let mut fired = 0;
    if cfg!(feature = "failpoints") {
        for fp in ["wal_before_save", "wal_after_save"] {
            // Let a few saves through, then die inside one.
            let spec = format!("{fp}=20*off->panic");
            let (acked, panicked) = run_child(dir.path(), Some(&spec), None);
            let (l, _) = verify(dir.path(), acked);
            assert!(l >= last);
            last = l;
            fired += usize::from(panicked);
        }
        assert_eq!(fired, 2);
    }
    println!(
        "wal_crash: {KILLS} SIGKILLs ({repaired} left a torn tail that was repaired), {fired} failpoint deaths; {last} entries, all intact"
    );
}
