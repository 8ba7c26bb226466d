//! Disk faults on a real kvd process: a full filesystem (a small tmpfs mounted for the test)
//! under the data file and under the WAL, and an fsync of the WAL that fails (a failpoint).
//! Each must be an error to the client and a stop of the member — never an fsync retried as if
//! it had succeeded, never a corrupt file — and a restart once the disk has room must bring back
//! every acknowledged write.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use api::etcdserverpb::{CompactionRequest, PutRequest, RangeRequest};
use common::{grpc, kvd_bin, Addrs, Proc};
use prost::Message;

/// A tmpfs of a given size mounted for the test (the test runs as root, as CI does here);
/// unmounted on drop.
struct Tmpfs {
    at: PathBuf,
}

impl Tmpfs {
    /// None (and why, printed) when this machine does not let the test mount one.
    fn mount(at: &Path, mib: u64) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(at)
            .output()
            .expect("run mount");
        if !out.status.success() {
            eprintln!(
                "SKIPPED: cannot mount a {mib} MiB tmpfs (needs root): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return None;
        }
        Some(Tmpfs {
            at: at.to_path_buf(),
        })
    }

    /// Gives the filesystem room: `mib` in all.
    fn grow(&self, mib: u64) {
        common::run(
            Command::new("mount")
                .args(["-o", &format!("remount,size={mib}m")])
                .arg(&self.at),
            "remounting the tmpfs larger",
        );
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }
}

/// A one-member kvd with its data directory `dir` (its log beside it, not in it).
fn start(m: &Addrs, dir: &Path, env: &[(&str, &str)]) -> Proc {
    // A restart takes its cluster from the data directory.
    let mut p = Proc::start_env(
        Path::new(kvd_bin()),
        m,
        dir,
        std::slice::from_ref(m),
        "new",
        &[],
        env,
    );
    p.wait_ready();
    p
}

/// Waits for the member to stop after a storage failure: a nonzero exit, the log naming the
/// failure and each of `says`.
fn stops(p: &mut Proc, says: &[&str]) -> ExitStatus {
    let (status, log) = p.wait_exit("a storage failure", 30);
    assert!(!status.success(), "{log}");
    assert!(log.contains("stopped after a storage failure"), "{log}");
    for s in says {
        assert!(log.contains(s), "the log does not say {s:?}:\n{log}");
    }
    status
}

/// What a writer saw: each key's acknowledged value, and what it wrote without an answer.
#[derive(Default)]
struct Writes {
    /// Puts acknowledged.
    count: usize,
    acked: BTreeMap<String, String>,
    /// Values written to a key whose put failed: they may or may not be there.
    unsure: BTreeMap<String, Vec<String>>,
}

/// Puts `key(i)` = a `size`-byte value naming `i` until a put fails, doing `between(i)` before
/// each; then checks that no later put succeeds (the member stops, it does not go on).
fn write_until_failure(
    rt: &tokio::runtime::Runtime,
    m: &Addrs,
    size: usize,
    key: impl Fn(usize) -> String,
    mut between: impl FnMut(usize),
) -> (Writes, String) {
    let mut kv = grpc::kv(&m.client);
    let mut w = Writes::default();
    for i in 0.. {
        between(i);
        let value = format!("{i:08}{}", "x".repeat(size));
        let put = PutRequest {
            key: key(i).into_bytes(),
            value: value.clone().into_bytes(),
            ..Default::default()
        };
        match rt.block_on(kv.put(put)) {
            Ok(_) => {
                w.count += 1;
                w.acked.insert(key(i), value);
            }
            Err(e) => {
                w.unsure.entry(key(i)).or_default().push(value);
                let first = format!("{}: {}", e.code(), e.message());
                // Nothing is acknowledged after a failure.
                for j in i + 1..i + 20 {
                    let put = PutRequest {
                        key: key(j).into_bytes(),
                        value: b"after".to_vec(),
                        ..Default::default()
                    };
                    let r = rt.block_on(kv.put(put));
                    assert!(r.is_err(), "a put succeeded after the failure ({first})");
                    w.unsure.entry(key(j)).or_default().push("after".into());
                }
                return (w, first);
            }
        }
        assert!(i < 5000, "the disk never filled");
    }
    unreachable!()
}

/// The data file is whole: it opens and every stored revision reads.
fn file_is_whole(dir: &Path) {
    let db = pager::Db::open(dir.join("member/snap/db"), pager::Options::default())
        .expect("the data file opens after the failure");
    let tx = db.begin_read().unwrap();
    let mut n = 0;
    for e in tx.bucket(b"key").unwrap().iter() {
        let (_, v) = e.expect("a stored revision reads");
        api::mvccpb::KeyValue::decode(v).expect("a stored revision decodes");
        n += 1;
    }
    assert!(n > 0);
}

/// After a restart: every acknowledged write is there (or a later write of the same key that
/// failed without an answer, which may have been applied).
fn all_there(rt: &tokio::runtime::Runtime, m: &Addrs, w: &Writes) {
    let mut kv = grpc::kv(&m.client);
    for (key, value) in &w.acked {
        let r = RangeRequest {
            key: key.clone().into_bytes(),
            ..Default::default()
        };
        let got = rt.block_on(kv.range(r)).unwrap().into_inner();
        let got = got
            .kvs
            .first()
            .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
            .unwrap_or_else(|| panic!("acknowledged {key} is gone"));
        let later = w.unsure.get(key).is_some_and(|v| v.contains(&got));
        assert!(
            got == *value || later,
            "{key} holds {}…, acknowledged {}…",
            &got[..8.min(got.len())],
            &value[..8]
        );
    }
}

/// Fills a 100 MiB filesystem under a one-member kvd with 100 KB values (to `key(i)`, one
/// key or many, compacting every 20 puts if asked) until a put fails; the member must stop
/// saying `says`, leave a whole data file, and, restarted with room, hold every acknowledged
/// write.
fn fill_the_disk(key: fn(usize) -> String, compact: bool, says: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let Some(fs) = Tmpfs::mount(&dir, 100) else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in_rt = rt.enter();
    let m = Addrs::new("default");
    let mut p = start(&m, &dir, &[]);
    let mut kv = grpc::kv(&m.client);
    let between = |i: usize| {
        if compact && i > 0 && i.is_multiple_of(20) {
            // Keeps the data file small; refused once the member is failing, which the put
            // right after shows.
            let c = CompactionRequest {
                revision: i as i64,
                physical: true,
            };
            let _ = rt.block_on(kv.compact(c));
        }
    };
    let (w, err) = write_until_failure(&rt, &m, 100_000, key, between);
    let status = stops(&mut p, says);
    assert!(
        w.count > 100,
        "the disk filled after {} puts: {err}",
        w.count
    );
    eprintln!(
        "{} puts acknowledged; then {err}; the member stopped ({status})",
        w.count
    );
    file_is_whole(&dir);
    fs.grow(300);
    let _restarted = start(&m, &dir, &[]);
    all_there(&rt, &m, &w);
}

/// Distinct keys: the data file grows until the disk is full.
#[test]
fn a_full_disk_under_the_data_file_stops_the_member_and_loses_nothing() {
    fill_the_disk(
        |i| format!("k{i:05}"),
        false,
        &["No space left on device", "member/snap/db"],
    );
}

/// One key rewritten and compacted away (the data file stays small) until the WAL needs a
/// segment the disk has no room for.
#[test]
fn a_full_disk_under_the_wal_stops_the_member_and_loses_nothing() {
    fill_the_disk(
        |_| "k".to_string(),
        true,
        &["No space left on device", "member/wal/"],
    );
}

/// An fsync of the WAL that fails (the 40th; a failpoint, as a failing disk would): the put
/// waiting on it fails, the member stops, and a restart holds every acknowledged write.
#[test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs kvd built with --features failpoints (cargo test --all-features)"
)]
fn a_failed_wal_fsync_stops_the_member_and_is_never_taken_for_success() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in_rt = rt.enter();
    let m = Addrs::new("default");
    let mut p = start(&m, &dir, &[("FAILPOINTS", "wal_fsync=40*off->return")]);
    let (w, err) = write_until_failure(&rt, &m, 100, |i| format!("k{i:05}"), |_| {});
    let status = stops(&mut p, &["fdatasync", "injected by failpoint wal_fsync"]);
    assert!(w.count > 0 && w.count < 40, "{}", w.count);
    eprintln!(
        "{} puts acknowledged; then {err}; the member stopped ({status})",
        w.count
    );
    let _restarted = start(&m, &dir, &[]);
    all_there(&rt, &m, &w);
}
