//! Crash test for the pager: a child process commits in a loop and is killed (SIGKILL) at random
//! moments, or aborted inside a commit by a failpoint (with `--features failpoints`). After every
//! death the file must open, pass `check()`, hold every commit the child acknowledged as durable,
//! and hold exactly one whole commit (never a mix of two).
//!
//! The test binary is its own child: `pager_crash child DIR MODE [FAILPOINT]`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pager::{Db, FreelistKind, Options};
use rand::{Rng, SeedableRng};
use test_support::CrashChild;

const FILLERS: u64 = 50;
const KEEP_MARKERS: u64 = 200;

fn marker(t: u64) -> Vec<u8> {
    [b"m".as_slice(), &t.to_be_bytes()].concat()
}
fn filler(j: u64) -> Vec<u8> {
    [b"f".as_slice(), &j.to_be_bytes()].concat()
}
/// The value commit `t` writes to its filler: its txid and a size that moves pages around.
fn filler_value(t: u64) -> Vec<u8> {
    let len = 8 + (t * 7919 % 13) as usize * 900 + if t.is_multiple_of(17) { 30_000 } else { 0 };
    let mut v = vec![(t % 251) as u8; len];
    v[..8].copy_from_slice(&t.to_le_bytes());
    v
}

fn opts(t: u64) -> Options {
    Options {
        freelist: if t.is_multiple_of(2) {
            FreelistKind::Hashmap
        } else {
            FreelistKind::Array
        },
        ..Options::default()
    }
}

/// The last commit in the file (`counter`), after verifying the invariants of whole commits.
fn verify(path: &Path) -> Result<Option<u64>, String> {
    let db = Db::open(path, opts(0)).map_err(|e| format!("open: {e}"))?;
    db.check().map_err(|e| e.to_string())?;
    let r = db.begin_read().map_err(|e| e.to_string())?;
    let b = match r.bucket(b"b") {
        Ok(b) => b,
        Err(pager::Error::BucketNotFound(_)) => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let get = |k: &[u8]| b.get(k).map_err(|e| e.to_string());
    let Some(c) = get(b"counter")? else {
        return Ok(None);
    };
    let c = u64::from_le_bytes(c.try_into().map_err(|_| "counter is not 8 bytes")?);
    for t in c.saturating_sub(KEEP_MARKERS + 20)..c + 20 {
        let want = t <= c && t + KEEP_MARKERS > c;
        if get(&marker(t))?.is_some() != want {
            return Err(format!(
                "counter {c}: marker {t} {}",
                if want { "missing" } else { "present" }
            ));
        }
    }
    for j in 0..FILLERS.min(c + 1) {
        // The newest commit ≤ c that wrote filler j.
        let last = c - (c + FILLERS - j) % FILLERS;
        match get(&filler(j))? {
            Some(v) if v == filler_value(last).as_slice() => {}
            Some(v) => {
                return Err(format!(
                    "counter {c}: filler {j} holds {} bytes of commit {:?}, want commit {last}",
                    v.len(),
                    v.get(..8)
                ))
            }
            None => return Err(format!("counter {c}: filler {j} missing")),
        }
    }
    Ok(Some(c))
}

/// The child: commits forever, printing `durable T` once commit T is durable.
fn child(dir: &Path, mode: &str, failpoint: Option<&str>) {
    let path = dir.join("db");
    let start = verify(&path)
        .expect("the parent verified this file")
        .map_or(0, |c| c + 1);
    let db = Db::open(&path, opts(start)).unwrap();
    if let Some(fp) = failpoint {
        arm(fp, start);
    }
    let out = std::io::stdout();
    for t in start.. {
        let mut w = db.begin_write().unwrap();
        let mut b = w.create_bucket_if_missing(b"b").unwrap();
        b.put(&marker(t), &t.to_le_bytes()).unwrap();
        if t >= KEEP_MARKERS {
            b.delete(&marker(t - KEEP_MARKERS)).unwrap();
        }
        b.put(&filler(t % FILLERS), &filler_value(t)).unwrap();
        b.put(b"counter", &t.to_le_bytes()).unwrap();
        if mode == "grow" {
            // Never deleted: the file keeps growing, so every run reaches a remap.
            b.put(
                &[b"g".as_slice(), &t.to_be_bytes()].concat(),
                &vec![1; 64 << 10],
            )
            .unwrap();
        }
        let durable = match mode {
            "sync" => {
                w.commit().unwrap();
                true
            }
            "mixed" | "grow" if t % 3 == 0 => {
                w.commit().unwrap();
                true
            }
            _ => {
                w.commit_nosync().unwrap();
                if t % 5 == 0 {
                    db.sync().unwrap();
                    true
                } else {
                    false
                }
            }
        };
        if durable {
            let mut o = out.lock();
            writeln!(o, "durable {t}").unwrap();
            o.flush().unwrap();
        }
    }
}

#[cfg(feature = "failpoints")]
fn arm(name: &str, seed: u64) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let hits = if name == "pager::grow" {
        1
    } else {
        3 + seed % 40
    };
    let left = AtomicU64::new(hits);
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
fn arm(name: &str, _: u64) {
    panic!("failpoint {name} asked for, but the test was built without --features failpoints");
}

/// What a child ended with: `seen` is the last commit it acknowledged as durable.
type Outcome = test_support::Outcome<Option<u64>>;

/// Runs a child until it dies or `kill_after` passes, then SIGKILLs it.
fn run_child(dir: &Path, mode: &str, failpoint: Option<&str>, kill_after: Duration) -> Outcome {
    let mut args = vec!["child", dir.to_str().unwrap(), mode];
    args.extend(failpoint);
    CrashChild::spawn(&args, &[], None, |last, line| {
        if let Some(t) = line.strip_prefix("durable ") {
            *last = Some(t.parse::<u64>().unwrap());
        }
    })
    .kill_after(kill_after)
}

fn check_after(dir: &Path, what: &str, o: &Outcome, floor: &mut Option<u64>) {
    let found = verify(&dir.join("db")).unwrap_or_else(|e| {
        panic!(
            "{what}: reopen after the crash failed: {e}\nchild stderr:\n{}",
            o.stderr
        )
    });
    // Every acknowledged durable commit survives; nothing goes backwards past one.
    let need = o.seen.max(*floor);
    assert!(
        found >= need,
        "{what}: reopened at commit {found:?}, but commit {need:?} was acknowledged as durable"
    );
    *floor = found;
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("child") {
        return child(
            Path::new(&args[2]),
            &args[3],
            args.get(4).map(String::as_str),
        );
    }
    let seed: u64 = std::env::var("CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("pager crash test, seed {seed} (CRASH_SEED={seed} repeats it)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let tmp = tempfile::tempdir().unwrap();
    let (mut passed, mut failed) = (0, 0);
    let mut run = |name: &str, f: &mut dyn FnMut(&Path) -> Result<(), String>| {
        let dir: PathBuf = tmp.path().join(name.replace([':', ' '], "_"));
        std::fs::create_dir_all(&dir).unwrap();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&dir))) {
            Ok(Ok(())) => {
                println!("test {name} ... ok");
                passed += 1;
            }
            Ok(Err(e)) => {
                println!("test {name} ... FAILED: {e}");
                failed += 1;
            }
            Err(_) => {
                println!("test {name} ... FAILED (panicked)");
                failed += 1;
            }
        }
    };

    for mode in ["sync", "mixed", "nosync"] {
        let kills = 8;
        let delays: Vec<u64> = (0..kills).map(|_| rng.gen_range(5..400)).collect();
        run(&format!("sigkill {mode} x{kills}"), &mut |dir| {
            let mut floor = None;
            for (i, &ms) in delays.iter().enumerate() {
                let o = run_child(dir, mode, None, Duration::from_millis(ms));
                if o.status.code().is_some() {
                    return Err(format!(
                        "kill {i}: the child exited by itself ({}): {}",
                        o.status, o.stderr
                    ));
                }
                check_after(dir, &format!("kill {i} after {ms} ms"), &o, &mut floor);
            }
            if floor.is_none() {
                return Err("no commit reached the disk in any run".into());
            }
            Ok(())
        });
    }

    if cfg!(feature = "failpoints") {
        for fp in [
            "pager::before_data_sync",
            "pager::before_meta_write",
            "pager::before_meta_sync",
            "pager::grow",
        ] {
            run(&format!("failpoint {fp}"), &mut |dir| {
                let mut floor = None;
                for i in 0..3 {
                    let o = run_child(dir, "grow", Some(fp), Duration::from_secs(60));
                    if !o.stderr.contains(&format!("FIRED {fp}"))
                        || std::os::unix::process::ExitStatusExt::signal(&o.status) != Some(6)
                    {
                        return Err(format!(
                            "run {i}: failpoint never fired ({}): {}",
                            o.status, o.stderr
                        ));
                    }
                    check_after(dir, &format!("{fp} run {i}"), &o, &mut floor);
                }
                Ok(())
            });
        }
    } else {
        println!("failpoints not compiled in: run with --features failpoints (the README's test command does)");
    }

    println!(
        "\ntest result: {}. {passed} passed; {failed} failed",
        if failed == 0 { "ok" } else { "FAILED" }
    );
    if failed > 0 {
        std::process::exit(1);
    }
}
