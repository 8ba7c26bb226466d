//! Crash test for the raft node: a child process runs a 3-member cluster under proposal load
//! and prints every acknowledged proposal; it is killed with SIGKILL at random moments, and
//! (with `--features failpoints`) made to abort inside apply and inside snapshot save and
//! restore, as etcd's robustness tests do with gofail. After every death the parent restarts
//! all members from their directories and checks: every acknowledged proposal is applied, at
//! the index it was acknowledged at, on every member, in the same order, once. Then the same
//! kills for a one-member cluster, whose proposals take their turns on the proposing thread
//! and whose commit index is written with the entries.
//!
//! The test binary is its own child: `raft_crash child DIR MEMBERS ROUND [FAILPOINT] [lag]`.

mod harness;

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use consensus::Config;
use harness::{fast, Cluster};
use rand::{Rng, SeedableRng};
use test_support::CrashChild;

const KILLS: usize = 6;

fn tune(c: &mut Config) {
    fast(c);
    // Snapshots and log compaction happen often, so kills land in them too.
    c.snapshot_count = 40;
    c.snapshot_catchup_entries = 10;
}

fn child(dir: &Path, members: u64, round: &str, failpoint: Option<&str>, lag: bool) {
    let mut c = Cluster::open(dir, members, tune);
    if lag {
        // Member 3 falls far behind, then must restore the leader's snapshot.
        c.stop(3);
        let l = c.leader();
        for i in 0..200 {
            c.propose(l, format!("{round}-lag-{i}").into_bytes())
                .unwrap();
        }
    }
    if let Some(fp) = failpoint {
        arm(fp);
    }
    if lag {
        c.restart(3);
    }
    let mut out = std::io::stdout().lock();
    let mut i = 0u64;
    loop {
        let l = c.leader();
        let futs: Vec<_> = (i..i + 16)
            .map(|j| {
                let d = format!("{round}-{j}").into_bytes();
                (d.clone(), c.node(l).propose(d))
            })
            .collect();
        for (d, f) in futs {
            if let Ok(index) = c.rt.block_on(f) {
                writeln!(out, "ack {} {index}", String::from_utf8_lossy(&d)).unwrap();
            }
        }
        out.flush().unwrap();
        i += 16;
    }
}

#[cfg(feature = "failpoints")]
fn arm(name: &str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    // Let some hits through, then die in one (abort: no unwinding, no cleanup).
    let left = AtomicU64::new(if name == "raft_snapshot_apply" { 1 } else { 5 });
    let fp = name.to_string();
    fail::cfg_callback(name, move || {
        if left.fetch_sub(1, Ordering::SeqCst) == 1 {
            eprintln!("FIRED {fp}");
            std::process::abort();
        }
    })
    .unwrap();
}

#[cfg(not(feature = "failpoints"))]
fn arm(name: &str) {
    panic!("failpoint {name} asked for, but the test was built without --features failpoints");
}

/// Runs a child until it dies (or is killed after `kill_after`); returns what it acknowledged.
fn run_child(
    dir: &Path,
    members: u64,
    round: usize,
    failpoint: Option<&str>,
    lag: bool,
    kill_after: Option<Duration>,
) -> Vec<(Vec<u8>, u64)> {
    let (members, round) = (members.to_string(), round.to_string());
    let mut args = vec!["child", dir.to_str().unwrap(), &members, &round];
    args.push(failpoint.unwrap_or("-"));
    if lag {
        args.push("lag");
    }
    let child = CrashChild::spawn(&args, &[], Vec::new(), |acked, line| {
        let mut w = line.split(' ');
        if let (Some("ack"), Some(d), Some(i)) = (w.next(), w.next(), w.next()) {
            acked.push((d.as_bytes().to_vec(), i.parse().unwrap()));
        }
    });
    match kill_after {
        Some(d) => child.kill_after(d).seen,
        None => {
            let o = child.wait();
            let fp = failpoint.unwrap_or_default();
            assert!(
                !o.status.success() && o.stderr.contains(&format!("FIRED {fp}")),
                "{fp} did not fire: {}: {}",
                o.status,
                o.stderr
            );
            o.seen
        }
    }
}

/// Restarts the whole cluster from `dir` and checks it against everything acknowledged.
fn verify(dir: &Path, members: u64, acked: &[(Vec<u8>, u64)]) -> usize {
    let c = Cluster::open(dir, members, tune);
    c.leader();
    c.acked.lock().extend(acked.iter().cloned());
    c.check();
    let n = c.states[&1].lock().log.len();
    n
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("child") {
        let fp = Some(args[5].as_str()).filter(|f| *f != "-");
        let members = args[3].parse().unwrap();
        child(
            Path::new(&args[2]),
            members,
            &args[4],
            fp,
            args.get(6).is_some(),
        );
        return;
    }
    // The checks' own members log their warnings (a stuck catch-up says why).
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(std::io::stderr)
        .init();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0x7a1);
    let rounds = [
        ("raft_before_apply", false),
        ("raft_after_apply", false),
        ("raft_snapshot_save", false),
        ("raft_snapshot_apply", true),
    ];
    kill_rounds(3, &mut rng, &rounds);
    // One member cannot lag behind itself.
    kill_rounds(1, &mut rng, &rounds[..3]);
}

/// `KILLS` SIGKILLs of a cluster of `members`, then (with failpoints) one death in each
/// failpoint of `failpoints` (with member 3 lagging, if asked), checking after each.
fn kill_rounds(members: u64, rng: &mut impl Rng, failpoints: &[(&str, bool)]) {
    let dir = tempfile::tempdir().unwrap();
    let mut acked = Vec::new();
    let mut applied = 0;
    for round in 0..KILLS {
        let d = Duration::from_millis(rng.gen_range(300..1200));
        eprintln!("{members} members, round {round}: SIGKILL after {d:?}");
        acked.extend(run_child(dir.path(), members, round, None, false, Some(d)));
        applied = verify(dir.path(), members, &acked);
    }
    let mut fired = 0;
    if cfg!(feature = "failpoints") {
        for (i, &(fp, lag)) in failpoints.iter().enumerate() {
            let lagging = if lag { ", member 3 lagging" } else { "" };
            eprintln!("{members} members, round {}: {fp}{lagging}", KILLS + i);
            acked.extend(run_child(
                dir.path(),
                members,
                KILLS + i,
                Some(fp),
                lag,
                None,
            ));
            applied = verify(dir.path(), members, &acked);
            fired += 1;
        }
    }
    println!(
        "raft_crash: {KILLS} SIGKILLs of a {members}-member cluster, {fired} failpoint deaths; {} acknowledged, {applied} applied on every member in the same order",
        acked.len()
    );
}
