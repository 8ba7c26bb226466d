//! `bbolt bench` for the pager: the same flags, the same workload and the same output lines, so
//! the two engines can be compared run for run.
//!
//! Writes `--count` keys in transactions of `--batch-size` (each a durable commit unless
//! `--no-sync`); keys are a 4-byte big-endian counter (`seq`) or random u32 (`rnd`), zero-padded
//! to `--key-size`; values are `--value-size` zero bytes. Then reads for at least a second in one
//! read transaction: a cursor over everything (`seq`) or a get of every written key in shuffled
//! order (`rnd`), repeated. Prints, as bbolt does, two tab-separated lines:
//! `# Write`, `N(ops)`, the duration, `(D/op)`, `(R op/sec)`, then the same for `# Read`.
//!
//! `cargo run --release -p pager --example pager-bench -- --count 300000 --batch-size 1000 --value-size 256 --write-mode rnd --read-mode rnd`

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use pager::{Db, FreelistKind, Options};
use rand::seq::SliceRandom;
use rand::Rng;

#[derive(Parser, Debug)]
#[command(about = "bbolt bench, against kvd's pager")]
struct Args {
    /// Number of keys to write.
    #[arg(long, default_value_t = 1000)]
    count: u64,
    /// Keys per write transaction (default: all in one).
    #[arg(long, default_value_t = 0)]
    batch_size: u64,
    /// Key size in bytes (at least 4).
    #[arg(long, default_value_t = 8)]
    key_size: usize,
    /// Value size in bytes.
    #[arg(long, default_value_t = 32)]
    value_size: usize,
    /// seq or rnd.
    #[arg(long, default_value = "seq")]
    write_mode: String,
    /// seq or rnd.
    #[arg(long, default_value = "seq")]
    read_mode: String,
    /// How full splits leave pages (0.1–1.0).
    #[arg(long, default_value_t = 0.5)]
    fill_percent: f64,
    /// Commit without fsync.
    #[arg(long)]
    no_sync: bool,
    /// Database file (default: a temporary file, removed afterwards).
    #[arg(long)]
    path: Option<PathBuf>,
    /// Keep the database file.
    #[arg(long)]
    work: bool,
    /// array or hashmap.
    #[arg(long, default_value = "hashmap")]
    freelist_type: FreelistKind,
}

/// Formats like Go's `time.Duration.String()`, which bbolt prints.
fn go_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    let trim = |whole: u128, frac: u128, digits: usize, unit: &str| {
        let f = format!("{frac:0digits$}");
        let f = f.trim_end_matches('0');
        if f.is_empty() {
            format!("{whole}{unit}")
        } else {
            format!("{whole}.{f}{unit}")
        }
    };
    match ns {
        0 => "0s".into(),
        n if n < 1_000 => format!("{n}ns"),
        n if n < 1_000_000 => trim(n / 1_000, n % 1_000, 3, "µs"),
        n if n < 1_000_000_000 => trim(n / 1_000_000, n % 1_000_000, 6, "ms"),
        n => {
            let (m, s) = (n / 60_000_000_000, n % 60_000_000_000);
            let secs = trim(s / 1_000_000_000, s % 1_000_000_000, 9, "s");
            if m == 0 {
                secs
            } else if m < 60 {
                format!("{m}m{secs}")
            } else {
                format!("{}h{}m{secs}", m / 60, m % 60)
            }
        }
    }
}

fn report(name: &str, ops: u64, d: Duration) {
    let per_op = if ops > 0 {
        d / ops as u32
    } else {
        Duration::ZERO
    };
    let per_sec = if d.as_secs_f64() > 0.0 {
        (ops as f64 / d.as_secs_f64()) as u64
    } else {
        0
    };
    println!(
        "# {name}\t{ops}(ops)\t{}\t({}/op)\t({per_sec} op/sec)",
        go_duration(d),
        go_duration(per_op)
    );
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = Args::parse();
    if a.key_size < 4 {
        return Err("--key-size must be at least 4 (keys are a 4-byte counter)".into());
    }
    for (flag, mode) in [
        ("--write-mode", &a.write_mode),
        ("--read-mode", &a.read_mode),
    ] {
        if mode != "seq" && mode != "rnd" {
            return Err(format!("invalid {flag} {mode:?}: seq or rnd").into());
        }
    }
    let batch = if a.batch_size == 0 {
        a.count.max(1)
    } else {
        a.batch_size
    };
    let tmp = tempfile::tempdir()?;
    let path = a
        .path
        .clone()
        .unwrap_or_else(|| tmp.path().join("bench.db"));
    if a.work {
        eprintln!("work: {}", path.display());
    }
    let db = Db::open(
        &path,
        Options {
            freelist: a.freelist_type,
            fill_percent: a.fill_percent,
            ..Options::default()
        },
    )?;

    eprintln!("starting write benchmark.");
    let mut rng = rand::thread_rng();
    let mut keys: Vec<Vec<u8>> = Vec::new();
    let value = vec![0u8; a.value_size];
    let (mut counter, mut written) = (0u32, 0u64);
    let t = Instant::now();
    let mut i = 0;
    while i < a.count {
        let mut w = db.begin_write()?;
        let mut b = w.create_bucket_if_missing(b"bench")?;
        for _ in 0..batch {
            let mut key = vec![0u8; a.key_size];
            let k = if a.write_mode == "seq" {
                counter += 1;
                counter
            } else {
                rng.gen::<u32>()
            };
            key[..4].copy_from_slice(&k.to_be_bytes());
            b.put(&key, &value)?;
            if a.read_mode == "rnd" {
                keys.push(key);
            }
            written += 1;
        }
        if a.no_sync {
            w.commit_nosync()?;
        } else {
            w.commit()?;
        }
        i += batch;
    }
    let write_time = t.elapsed();
    keys.shuffle(&mut rng);

    eprintln!("starting read benchmark.");
    let mut reads = 0u64;
    let t = Instant::now();
    {
        let r = db.begin_read()?;
        let b = r.bucket(b"bench")?;
        loop {
            if a.read_mode == "seq" {
                let mut c = b.cursor();
                let mut e = c.first()?;
                while e.is_some() {
                    reads += 1;
                    e = c.next()?;
                }
            } else {
                for k in &keys {
                    if b.get(k)?.is_none() {
                        return Err(format!("key {k:?} not found").into());
                    }
                    reads += 1;
                }
            }
            if t.elapsed() >= Duration::from_secs(1) {
                break;
            }
        }
    }
    let read_time = t.elapsed();
    report("Write", written, write_time);
    report("Read", reads, read_time);
    if a.work {
        db.close()?;
    } else if a.path.is_some() {
        drop(db);
        std::fs::remove_file(&path)?;
    }
    Ok(())
}
