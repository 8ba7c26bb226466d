//! `mvcc-bench put`: the store's put throughput, measured as etcd's `benchmark mvcc put` measures
//! etcd's own in-process store (same flags, same `Requests/sec` line), so the two compare in one
//! run on one machine:
//!
//! ```text
//! cargo run --release -p mvcc --example mvcc-bench -- put --total 100000 --key-size 64 --value-size 256 --txn-ops 1
//! benchmark mvcc put --total 100000 --key-size 64 --value-size 256 --txn-ops 1
//! ```
//!
//! Like etcd's backend (batch interval 100 ms, batch limit 10,000, each batch committed with an
//! fsync), the store flushes its pending batch durably when it holds `--batch-limit` entries or
//! every `--batch-interval` ms; every put is visible to readers as soon as it returns.

use std::time::{Duration, Instant};

use api::etcdserverpb::{request_op, PutRequest, RequestOp, TxnRequest};
use clap::{Parser, Subcommand};
use mvcc::{Store, StoreOptions};
use rand::RngCore;

#[derive(Parser)]
#[command(about = "Benchmark kvd's mvcc store (etcd's `benchmark mvcc` flags)")]
struct Cli {
    /// Interval of batching (milliseconds).
    #[arg(long, default_value_t = 100, global = true)]
    batch_interval: u64,
    /// A limit of batched transactions.
    #[arg(long, default_value_t = 10_000, global = true)]
    batch_limit: usize,
    /// The database file (default: a fresh temporary directory, removed afterwards).
    #[arg(long, global = true)]
    path: Option<std::path::PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Benchmark put performance of storage.
    Put {
        /// A total number of keys to put.
        #[arg(long, default_value_t = 100)]
        total: usize,
        /// A size of key (bytes).
        #[arg(long, default_value_t = 64)]
        key_size: usize,
        /// A size of value (bytes).
        #[arg(long, default_value_t = 64)]
        value_size: usize,
        /// Put keys in transactions.
        #[arg(long)]
        txn: bool,
        /// A number of keys to put per transaction.
        #[arg(long, default_value_t = 1)]
        txn_ops: usize,
    },
    /// Time opening an existing store (`--path`): the index rebuild from the `key` bucket.
    Open,
}

fn random_bytes(size: usize, n: usize) -> Vec<Vec<u8>> {
    let mut rng = rand::thread_rng();
    (0..n)
        .map(|_| {
            let mut b = vec![0u8; size];
            rng.fill_bytes(&mut b);
            b
        })
        .collect()
}

fn report(lat: &mut [Duration], total: Duration, weight: usize) {
    lat.sort();
    let secs = |d: Duration| d.as_secs_f64();
    let n = lat.len().max(1) as f64;
    let avg = lat.iter().map(|d| secs(*d)).sum::<f64>() / n;
    let var = lat.iter().map(|d| (secs(*d) - avg).powi(2)).sum::<f64>() / n;
    println!("\nSummary:");
    println!("  Total:\t{:.4} secs.", secs(total));
    println!(
        "  Slowest:\t{:.4} secs.",
        lat.last().map_or(0.0, |d| secs(*d))
    );
    println!(
        "  Fastest:\t{:.4} secs.",
        lat.first().map_or(0.0, |d| secs(*d))
    );
    println!("  Average:\t{avg:.4} secs.");
    println!("  Stddev:\t{:.4} secs.", var.sqrt());
    println!(
        "  Requests/sec:\t{:.4}",
        (lat.len() * weight) as f64 / secs(total)
    );
    println!("\nLatency distribution:");
    for p in [10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9] {
        let i = ((p / 100.0 * n) as usize).min(lat.len().saturating_sub(1));
        if let Some(d) = lat.get(i) {
            println!("  {p}% in {:.4} secs.", secs(*d));
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    let tmp = tempfile::tempdir()?;
    let path = cli
        .path
        .clone()
        .unwrap_or_else(|| tmp.path().join("mvcc-bench"));
    let opts = StoreOptions {
        batch_limit: cli.batch_limit,
        batch_interval: Duration::from_millis(cli.batch_interval),
        ..StoreOptions::default()
    };
    let t0 = Instant::now();
    let store = Store::open(&path, opts)?;
    let Cmd::Put {
        total,
        key_size,
        value_size,
        txn,
        txn_ops,
    } = cli.cmd
    else {
        let took = t0.elapsed();
        let mut revisions = 0u64;
        store.read()?.for_each_revision(|_| revisions += 1)?;
        println!(
            "opened {} at revision {}: {revisions} stored revisions indexed in {:.3} secs.",
            path.display(),
            store.rev(),
            took.as_secs_f64()
        );
        return Ok(());
    };
    let per = if txn { txn_ops.max(1) } else { 1 };
    let keys = random_bytes(key_size, total * per);
    let vals = random_bytes(value_size, total * per);
    // Requests are built before the clock starts, as etcd's benchmark prepares its keys.
    let reqs: Vec<PutRequest> = keys
        .into_iter()
        .zip(vals)
        .map(|(key, value)| PutRequest {
            key,
            value,
            ..Default::default()
        })
        .collect();
    let txns: Vec<TxnRequest> = if txn {
        reqs.chunks(per)
            .map(|c| TxnRequest {
                compare: vec![],
                success: c
                    .iter()
                    .map(|p| RequestOp {
                        request: Some(request_op::Request::RequestPut(p.clone())),
                    })
                    .collect(),
                failure: vec![],
            })
            .collect()
    } else {
        Vec::new()
    };
    let mut lat = Vec::with_capacity(total);
    let start = Instant::now();
    for i in 0..total {
        let t0 = Instant::now();
        let mut w = store.write()?;
        if txn {
            w.txn(&txns[i])?;
        } else {
            w.put(&reqs[i])?;
        }
        drop(w);
        lat.push(t0.elapsed());
    }
    let elapsed = start.elapsed();
    report(&mut lat, elapsed, per);
    store.close()?;
    Ok(())
}
