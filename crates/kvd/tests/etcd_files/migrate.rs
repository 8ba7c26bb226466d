//! `kvd migrate`: a stopped etcd cluster's data directories made kvd's, member by member, and
//! started with the same flags; and the directories it must refuse, changing nothing.

use super::*;

/// etcd's flags for the cluster: snapshots every 30 entries (the WAL starts at one), and the
/// data file committed rarely, so that after a crash the last entries are in the WAL alone.
const FLAGS: [&str; 6] = [
    "--snapshot-count",
    "30",
    "--backend-batch-interval",
    "1h",
    "--backend-batch-limit",
    "100000",
];

pub(super) fn cluster(dir: &Path, ms: &[Addrs], bin: &Path) -> Vec<Proc> {
    ms.iter()
        .map(|m| Proc::start(bin, m, &dir.join(&m.name), ms, "new", &FLAGS))
        .collect()
}

pub(super) fn endpoints(ms: &[Addrs]) -> String {
    ms.iter().map(Addrs::endpoint).collect::<Vec<_>>().join(",")
}

/// The members as `member list` prints them, sorted; and the cluster id.
fn members(ep: &str) -> (Vec<String>, u64) {
    // As a user: etcd 3.7 (and kvd) refuse the list to a caller without credentials.
    let out = root_ok(ep, &["member", "list", "-w", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mut ms: Vec<String> = v["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.to_string())
        .collect();
    ms.sort();
    (ms, v["header"]["cluster_id"].as_u64().unwrap())
}

pub(super) fn migrate(data: &Path) -> Output {
    kvd_tool(&[
        "migrate".into(),
        "--data-dir".into(),
        data.display().to_string(),
    ])
}

/// Every file under `dir` with its bytes: what "nothing changed" compares.
fn snapshot_of(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_three_member_etcd_3_6_cluster_migrated_member_by_member_serves_as_kvd() {
    migrated_member_by_member("v3.6.5");
}

#[test]
fn a_three_member_etcd_3_7_cluster_migrated_member_by_member_serves_as_kvd() {
    migrated_member_by_member("v3.7.1");
}

/// A three-member cluster of etcd `version`, killed, each member migrated: the same members,
/// keys, history, hashes, leases and auth, and the cluster version brought to kvd's (3.7).
fn migrated_member_by_member(version: &str) {
    let dir = tempfile::tempdir().unwrap();
    let ms: Vec<Addrs> = (1..=3).map(|i| Addrs::new(&format!("m{i}"))).collect();
    let etcd_bin = etcd_tools(version).join("etcd");
    let mut ps: Vec<Proc> = cluster(dir.path(), &ms, &etcd_bin)
        .into_iter()
        .map(|p| ready(p, false))
        .collect();
    let ep = endpoints(&ms);
    write_history(&ep);
    for i in 0..100 {
        root_ok(&ep, &["put", &format!("bulk{i:03}"), &format!("v{i}")]);
    }
    // The last writes: after the last snapshot, in the WAL but (likely) not in the data file.
    for i in 0..20 {
        root_ok(&ep, &["put", &format!("last{i:02}"), "x"]);
    }
    let want = state(&ep);
    let hashes: Vec<_> = ms.iter().map(|m| hashkv(&m.endpoint(), "0")).collect();
    let want_members = members(&ep);
    // A crash: no member finishes anything.
    for p in &mut ps {
        p.kill();
    }
    let mut carried = 0;
    for m in &ms {
        let out = ok(migrate(&dir.path().join(&m.name)), "kvd migrate");
        assert!(out.contains("etcd's files are kept in"), "{out}");
        let n: usize = out
            .split(" entries of etcd's log carried over")
            .next()
            .and_then(|s| s.rsplit(", ").next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{out}"));
        carried += n;
        assert!(dir
            .path()
            .join(&m.name)
            .join("member.etcd")
            .join("wal")
            .exists());
    }
    eprintln!("entries carried over, all members: {carried}");
    let kvd_bin = PathBuf::from(common::kvd_bin());
    let _kvds: Vec<Proc> = cluster(dir.path(), &ms, &kvd_bin)
        .into_iter()
        .map(|p| ready(p, true))
        .collect();
    assert_eq!(
        members(&ep),
        want_members,
        "the same members and cluster id"
    );
    assert_eq!(
        state(&ep),
        want,
        "the same keys, history, hashes, leases and auth"
    );
    for (m, h) in ms.iter().zip(&hashes) {
        assert_eq!(hashkv(&m.endpoint(), "0"), *h, "{}'s HashKV", m.name);
    }
    // The cluster takes writes, on every member.
    root_ok(&ep, &["put", "after-migration", "1"]);
    for m in &ms {
        let got = root_ok(
            &m.endpoint(),
            &["get", "after-migration", "--consistency", "s"],
        );
        common::wait_for("the write on every member", 10, || {
            root_ok(
                &m.endpoint(),
                &["get", "after-migration", "--consistency", "s"],
            )
            .contains('1')
        });
        let _ = got;
        // etcd's cluster version carried over, then raised to kvd's once every member runs
        // kvd (from 3.6), as etcd's monitor raises it after an upgrade.
        common::wait_for("cluster version 3.7", 30, || {
            common::http_get(&m.client, "/version")
                .1
                .contains(r#""etcdcluster":"3.7.0","storage":"3.7.0""#)
        });
    }
}

/// Writes a stopped one-member etcd cluster in `dir/<name>`; its data directory.
fn stopped_etcd(dir: &Path, name: &str) -> PathBuf {
    let m = Addrs::new(name);
    let data = dir.join(name);
    let mut p = ready(etcd("v3.6.5", &m, &data), false);
    for i in 0..40 {
        ctl_ok(&m.endpoint(), &["put", &format!("k{i}"), "v"]);
    }
    p.terminate();
    data
}

/// Rewrites `data`'s data file with bucket `empty` emptied and a bucket `extra` added.
fn rewrite_db(data: &Path, empty: Option<&[u8]>, extra: Option<&[u8]>) {
    let db = data.join("member/snap/db");
    let src = bbolt::Db::open(&db).unwrap();
    let buckets = src.buckets().unwrap();
    let mut feed = |s: &mut bbolt::Sink<'_>| -> Result<(), bbolt::Error> {
        let mut w = src.walker();
        for (name, b) in &buckets {
            s.bucket(name)?;
            if Some(name.as_slice()) == empty {
                continue;
            }
            let mut kvs = Vec::new();
            w.for_each(b, &mut |k, item| {
                if let bbolt::Item::Value(v) = item {
                    kvs.push((k.to_vec(), v.to_vec()));
                }
                Ok(true)
            })?;
            for (k, v) in kvs {
                s.put(&k, &v)?;
            }
        }
        match extra {
            Some(b) => s.bucket(b),
            None => Ok(()),
        }
    };
    let layout = bbolt::plan(4096, &mut feed).unwrap();
    let mut bytes = Vec::new();
    bbolt::write(&layout, &mut bytes, &mut feed).unwrap();
    drop(src);
    std::fs::write(&db, bytes).unwrap();
}

#[test]
fn directories_kvd_does_not_fully_understand_are_refused_and_left_as_they_were() {
    let dir = tempfile::tempdir().unwrap();
    // kvd started on etcd's directory says to migrate it first.
    let data = stopped_etcd(dir.path(), "plain");
    let m = Addrs::new("plain");
    let mut p = kvd(&m, &data);
    let (status, log) = p.wait_exit("kvd refuses an etcd directory", 20);
    assert!(!status.success());
    assert!(log.contains("kvd migrate --data-dir"), "{log}");

    // etcd still running on it.
    let m = Addrs::new("running");
    let running = dir.path().join("running");
    let _etcd = ready(etcd("v3.6.5", &m, &running), false);
    let out = migrate(&running);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("etcd is running on it"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let wal = |d: &Path| -> PathBuf {
        let w = d.join("member/wal");
        let mut segs: Vec<PathBuf> = std::fs::read_dir(&w)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "wal"))
            .collect();
        segs.sort();
        segs.pop().unwrap()
    };
    type Damage = fn(&Path, &Path);
    let cases: [(&str, Damage, &str); 3] = [
        (
            "an unknown bucket",
            // The data file rewritten with a bucket etcd does not write.
            |data, _| rewrite_db(data, None, Some(b"zz-not-etcds")),
            "bucket \"zz-not-etcds\"",
        ),
        (
            "a WAL record damaged mid-segment",
            |_, wal| {
                let mut b = std::fs::read(wal).unwrap();
                // A byte inside an early record's data: not a torn tail, a damaged log.
                b[200] ^= 0x5a;
                std::fs::write(wal, b).unwrap();
            },
            "CRC",
        ),
        (
            "etcd 3.3's data file (no member in it)",
            // etcd 3.3 kept its members in its v2 store, not in the data file.
            |data, _| rewrite_db(data, Some(b"members"), None),
            "etcd 3.3 or older",
        ),
    ];
    for (what, damage, says) in cases {
        let data = stopped_etcd(dir.path(), &what.replace(' ', "-"));
        damage(&data, &wal(&data));
        let before = snapshot_of(&data);
        let out = migrate(&data);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: migrated");
        assert!(
            err.contains(says) && err.contains("nothing was changed"),
            "{what}: {err}"
        );
        assert!(!err.contains("panicked"), "{what}: {err}");
        assert_eq!(snapshot_of(&data), before, "{what}: nothing changed");
    }

    // A torn write at the end of the last segment is what etcd repairs: migrated.
    let data = stopped_etcd(dir.path(), "torn");
    let seg = wal(&data);
    let b = std::fs::read(&seg).unwrap();
    let used = b.iter().rposition(|&x| x != 0).unwrap() + 1;
    // The last disk sector written zeroed, as a write cut short leaves it.
    let mut torn = b.clone();
    torn[(used - 1) / 512 * 512..used].fill(0);
    std::fs::write(&seg, torn).unwrap();
    let out = ok(migrate(&data), "migrate a torn tail");
    assert!(out.contains("migrated etcd member"), "{out}");
}
