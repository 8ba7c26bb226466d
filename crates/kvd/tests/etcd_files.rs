//! etcd's files in and out, with real etcd binaries (3.4 to 3.7) built from the Go module
//! proxy: etcd's snapshots restored by kvd, kvd's snapshots restored by etcdutl and served by
//! etcd, etcdutl's revision bump, a member's db copied while stopped, HashKV equal on both
//! servers for the same history, the offline tools on both servers' directories, and bad files
//! refused with a clear error and nothing left behind.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{ctl, ctl_ok, etcd_tools, json_number, Addrs, Proc};

const VERSIONS: [&str; 4] = ["v3.4.13", "v3.5.21", "v3.6.5", "v3.7.1"];
const ROOT: &str = "root:rootpw";

/// etcdctl as root (auth is on once [`write_history`] ran).
fn as_root<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["--user", ROOT];
    v.extend_from_slice(args);
    v
}

fn root_ok(ep: &str, args: &[&str]) -> String {
    ctl_ok(ep, &as_root(args))
}

/// The history every test writes: keys put and put again, one deleted, a lease holding two
/// keys, a transaction, a compaction, a user and a role, auth on, and writes after that.
fn write_history(ep: &str) {
    for i in 0..40 {
        ctl_ok(ep, &["put", &format!("k{:02}", i % 25), &format!("v{i}")]);
    }
    ctl_ok(ep, &["del", "k03"]);
    let lease = ctl_ok(ep, &["lease", "grant", "600"]);
    let id = lease.split_whitespace().nth(1).expect("lease ID printed");
    ctl_ok(ep, &["put", "leased-a", "1", "--lease", id]);
    ctl_ok(ep, &["put", "leased-b", "2", "--lease", id]);
    txn(ep, None, &["put t1 x", "put t2 y"]);
    ctl_ok(ep, &["compact", "20"]);
    ctl_ok(ep, &["user", "add", "root", "--new-user-password=rootpw"]);
    ctl_ok(ep, &["user", "grant-role", "root", "root"]);
    ctl_ok(ep, &["role", "add", "reader"]);
    ctl_ok(
        ep,
        &["role", "grant-permission", "reader", "read", "a", "b"],
    );
    ctl_ok(ep, &["auth", "enable"]);
    root_ok(ep, &["put", "after-auth", "z"]);
}

/// `etcdctl txn` with no compares, `ops` on success (as `user`, when given).
fn txn(ep: &str, user: Option<&str>, ops: &[&str]) {
    // The compares, a blank line; the success ops, a blank line; no failure ops, a blank line.
    let input = format!("\n{}\n\n\n", ops.join("\n"));
    let args = match user {
        Some(u) => vec!["--user", u, "txn"],
        None => vec!["txn"],
    };
    let out = common::ctl_input(ep, &args, &input);
    assert!(
        out.status.success(),
        "txn: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What two servers holding the same data answer alike (ids, terms and clocks aside).
#[derive(Debug, PartialEq)]
struct State {
    kvs_now: String,
    /// At an older revision, after the compaction.
    kvs_then: String,
    compacted: bool,
    hash_now: (u64, u64, u64),
    hash_then: (u64, u64, u64),
    leases: Vec<(u64, Vec<String>)>,
    auth: String,
    roles: String,
}

fn body(json: &str) -> String {
    json.find("\"kvs\"")
        .map_or_else(String::new, |i| json[i..].to_string())
}

fn hashkv(ep: &str, rev: &str) -> (u64, u64, u64) {
    let out = root_ok(ep, &["endpoint", "hashkv", "--rev", rev, "-w", "json"]);
    let n = |f| json_number(&out, f).unwrap_or(0);
    (n("hash"), n("compact_revision"), n("hash_revision"))
}

fn state(ep: &str) -> State {
    state_at(ep, 30)
}

/// [`State`] with `then` for the older revision.
fn state_at(ep: &str, then: u64) -> State {
    let then = then.to_string();
    let all = |rev: &str| {
        body(&root_ok(
            ep,
            &["get", "", "--from-key", "--rev", rev, "-w", "json"],
        ))
    };
    let old = ctl(ep, &as_root(&["get", "k01", "--rev", "5"]));
    let ids = root_ok(ep, &["lease", "list"]);
    let mut leases = Vec::new();
    for id in ids.lines().skip(1) {
        let t = root_ok(ep, &["lease", "timetolive", id, "--keys", "-w", "json"]);
        let v: serde_json::Value = serde_json::from_str(&t).unwrap();
        let keys = v["keys"]
            .as_array()
            .map(|ks| ks.iter().map(|k| k.as_str().unwrap().to_string()).collect())
            .unwrap_or_default();
        let mut keys: Vec<String> = keys;
        keys.sort();
        leases.push((v["granted-ttl"].as_u64().unwrap(), keys));
    }
    State {
        kvs_now: all("0"),
        kvs_then: all(&then),
        compacted: String::from_utf8_lossy(&old.stderr)
            .contains("required revision has been compacted"),
        hash_now: hashkv(ep, "0"),
        hash_then: hashkv(ep, &then),
        leases,
        // (etcd 3.4 has no AuthStatus: auth is on when a request without a user is refused.)
        auth: format!(
            "{}\n{}",
            String::from_utf8_lossy(&ctl(ep, &["get", "k01"]).stderr)
                .contains("user name is empty"),
            root_ok(ep, &["user", "get", "root"])
        ),
        roles: root_ok(ep, &["role", "get", "reader"]) + &root_ok(ep, &["user", "list"]),
    }
}

fn etcd(version: &str, m: &Addrs, dir: &Path) -> Proc {
    Proc::start(
        &etcd_tools(version).join("etcd"),
        m,
        dir,
        std::slice::from_ref(m),
        "new",
        &[],
    )
}

fn kvd(m: &Addrs, dir: &Path) -> Proc {
    Proc::kvd(m, dir, std::slice::from_ref(m), "new", &[])
}

/// Waits for a server on which auth is on (or not yet).
fn ready(mut p: Proc, auth: bool) -> Proc {
    if auth {
        p.ctl_flags = vec!["--user".into(), ROOT.into()];
    }
    p.wait_ready();
    p
}

fn restore_args(m: &Addrs, file: &Path, data: &Path) -> Vec<String> {
    vec![
        "snapshot".into(),
        "restore".into(),
        file.display().to_string(),
        "--data-dir".into(),
        data.display().to_string(),
        "--name".into(),
        m.name.clone(),
        "--initial-cluster".into(),
        format!("{}={}", m.name, m.peer),
        "--initial-cluster-token".into(),
        "kvd-test".into(),
        "--initial-advertise-peer-urls".into(),
        m.peer.clone(),
    ]
}

fn kvd_tool(args: &[String]) -> Output {
    Command::new(common::kvd_bin()).args(args).output().unwrap()
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn etcdutl(version: &str, args: &[String]) -> Output {
    Command::new(etcd_tools(version).join("etcdutl"))
        .args(args)
        .output()
        .unwrap()
}

/// A snapshot of etcd `version` holding [`write_history`], and what the server answered.
fn etcd_snapshot(version: &str, dir: &Path) -> (PathBuf, State) {
    let m = Addrs::new("etcd");
    let mut p = ready(
        etcd(version, &m, &dir.join(format!("etcd-{version}"))),
        false,
    );
    write_history(&m.endpoint());
    let want = state(&m.endpoint());
    let file = dir.join(format!("etcd-{version}.snap"));
    root_ok(&m.endpoint(), &["snapshot", "save", file.to_str().unwrap()]);
    p.terminate();
    (file, want)
}

#[test]
fn snapshots_of_etcd_3_4_to_3_7_restore_into_kvd_with_everything_kept() {
    let dir = tempfile::tempdir().unwrap();
    for version in VERSIONS {
        let (file, want) = etcd_snapshot(version, dir.path());
        assert!(
            want.compacted && want.leases.len() == 1,
            "{version}: {want:?}"
        );
        if version >= "v3.6" {
            // etcd 3.5's etcdutl counts keys otherwise (3.4 has none); 3.6's and 3.7's as kvd.
            let theirs = ok(
                etcdutl(
                    version,
                    &[
                        "snapshot".into(),
                        "status".into(),
                        file.display().to_string(),
                        "-w".into(),
                        "json".into(),
                    ],
                ),
                "etcdutl status",
            );
            let ours = ok(
                kvd_tool(&[
                    "snapshot".into(),
                    "status".into(),
                    file.display().to_string(),
                    "-w".into(),
                    "json".into(),
                ]),
                "kvd status",
            );
            assert_eq!(ours.trim(), theirs.trim(), "{version}: snapshot status");
        }
        let m = Addrs::new("restored");
        let data = dir.path().join(format!("kvd-from-{version}"));
        ok(
            kvd_tool(&restore_args(&m, &file, &data)),
            "kvd snapshot restore",
        );
        let p = ready(kvd(&m, &data), true);
        let mut got = state(&m.endpoint());
        if version < "v3.6" {
            // etcd 3.4 and 3.5 leave HashKV's hash revision out.
            got.hash_now.2 = 0;
            got.hash_then.2 = 0;
        }
        assert_eq!(got, want, "etcd {version}'s snapshot served by kvd");
        drop(p);
    }
}

#[test]
fn kvds_snapshots_restore_with_etcdutl_3_6_and_3_7_and_serve_in_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let m = Addrs::new("kvd");
    let mut p = ready(kvd(&m, &dir.path().join("kvd")), false);
    write_history(&m.endpoint());
    let want = state(&m.endpoint());
    let file = dir.path().join("kvd.snap");
    root_ok(&m.endpoint(), &["snapshot", "save", file.to_str().unwrap()]);
    p.terminate();
    for version in ["v3.6.5", "v3.7.1"] {
        let status = ok(
            etcdutl(
                version,
                &[
                    "snapshot".into(),
                    "status".into(),
                    file.display().to_string(),
                    "-w".into(),
                    "json".into(),
                ],
            ),
            "etcdutl status",
        );
        let ours = ok(
            kvd_tool(&[
                "snapshot".into(),
                "status".into(),
                file.display().to_string(),
                "-w".into(),
                "json".into(),
            ]),
            "kvd status",
        );
        assert_eq!(ours.trim(), status.trim(), "{version}: snapshot status");
        let e = Addrs::new("etcd");
        let data = dir.path().join(format!("etcd-{version}"));
        ok(
            etcdutl(version, &restore_args(&e, &file, &data)),
            "etcdutl snapshot restore",
        );
        let served = ready(
            Proc::start(
                &etcd_tools(version).join("etcd"),
                &e,
                &data,
                std::slice::from_ref(&e),
                "new",
                &[],
            ),
            true,
        );
        assert_eq!(
            state(&e.endpoint()),
            want,
            "kvd's snapshot served by etcd {version}"
        );
        // And etcd takes writes on top.
        root_ok(&e.endpoint(), &["put", "on-etcd", "1"]);
        drop(served);
    }
    // kvd reads its own snapshot as well.
    let r = Addrs::new("again");
    let data = dir.path().join("kvd-again");
    ok(
        kvd_tool(&restore_args(&r, &file, &data)),
        "kvd snapshot restore",
    );
    let _p = ready(kvd(&r, &data), true);
    assert_eq!(state(&r.endpoint()), want);
}

#[test]
fn bump_revision_and_mark_compacted_give_what_etcdutl_gives() {
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = etcd_snapshot("v3.6.5", dir.path());
    let bump = [
        "--bump-revision".to_string(),
        "1000".into(),
        "--mark-compacted".into(),
    ];
    let e = Addrs::new("etcd");
    let mut args = restore_args(&e, &file, &dir.path().join("etcd-bumped"));
    args.extend(bump.iter().cloned());
    ok(etcdutl("v3.6.5", &args), "etcdutl restore --bump-revision");
    let k = Addrs::new("kvd");
    let mut args = restore_args(&k, &file, &dir.path().join("kvd-bumped"));
    args.extend(bump.iter().cloned());
    ok(kvd_tool(&args), "kvd restore --bump-revision");
    let _e = ready(
        Proc::start(
            &etcd_tools("v3.6.5").join("etcd"),
            &e,
            &dir.path().join("etcd-bumped"),
            std::slice::from_ref(&e),
            "new",
            &[],
        ),
        true,
    );
    let _k = ready(kvd(&k, &dir.path().join("kvd-bumped")), true);
    for ep in [e.endpoint(), k.endpoint()] {
        let old = ctl(&ep, &as_root(&["get", "k01", "--rev", "40"]));
        assert!(
            String::from_utf8_lossy(&old.stderr).contains("required revision has been compacted"),
            "{ep}: every revision before the bump is compacted"
        );
    }
    assert_eq!(hashkv(&k.endpoint(), "0"), hashkv(&e.endpoint(), "0"));
    let rev = |ep: &str| json_number(&root_ok(ep, &["put", "new", "1", "-w", "json"]), "revision");
    assert_eq!(
        rev(&k.endpoint()),
        rev(&e.endpoint()),
        "the next write's revision"
    );
    assert_eq!(
        body(&root_ok(
            &k.endpoint(),
            &["get", "", "--from-key", "-w", "json"]
        )),
        body(&root_ok(
            &e.endpoint(),
            &["get", "", "--from-key", "-w", "json"]
        ))
    );
    // etcdutl's rule: the two flags together or not at all.
    let mut args = restore_args(&k, &file, &dir.path().join("half"));
    args.extend(["--bump-revision".to_string(), "5".into()]);
    let out = kvd_tool(&args);
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("--mark-compacted required")
    );
    assert!(!dir.path().join("half").exists());
}

#[test]
fn a_members_db_copied_while_stopped_restores_with_skip_hash_check() {
    let dir = tempfile::tempdir().unwrap();
    let m = Addrs::new("etcd");
    let data = dir.path().join("etcd");
    let mut p = ready(etcd("v3.6.5", &m, &data), false);
    write_history(&m.endpoint());
    let want = state(&m.endpoint());
    p.terminate();
    let db = data.join("member/snap/db");
    let k = Addrs::new("kvd");
    let out = kvd_tool(&restore_args(&k, &db, &dir.path().join("no-flag")));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--skip-hash-check"),
        "{err}"
    );
    let mut args = restore_args(&k, &db, &dir.path().join("kvd"));
    args.push("--skip-hash-check".into());
    ok(kvd_tool(&args), "restore --skip-hash-check");
    let _p = ready(kvd(&k, &dir.path().join("kvd")), true);
    assert_eq!(state(&k.endpoint()), want);
}

/// The same requests against kvd and etcd: HashKV equal at every revision, before and after a
/// compaction (one whose revision is a tombstone's, which etcd versions treat differently).
#[test]
fn hashkv_is_the_same_on_kvd_and_etcd_for_the_same_history() {
    let dir = tempfile::tempdir().unwrap();
    let (e, _ep) = Proc::single_etcd(dir.path());
    let (k, _kp) = Proc::single_kvd(dir.path());
    let both = [e.endpoint(), k.endpoint()];
    let run = |args: &[&str]| {
        for ep in &both {
            ctl_ok(ep, args);
        }
    };
    for i in 0..30 {
        run(&["put", &format!("h{}", i % 7), &format!("{i}")]);
    }
    run(&["del", "h1"]);
    run(&["del", "h", "--prefix"]);
    for i in 0..10 {
        run(&["put", &format!("h{}", i % 4), &"x".repeat(i * 300)]);
    }
    let plain_hashkv = |ep: &str, rev: &str| {
        let out = ctl_ok(ep, &["endpoint", "hashkv", "--rev", rev, "-w", "json"]);
        (
            json_number(&out, "hash").unwrap_or(0),
            json_number(&out, "hash_revision").unwrap_or(0),
        )
    };
    let now = json_number(
        &ctl_ok(&k.endpoint(), &["get", "x", "-w", "json"]),
        "revision",
    )
    .unwrap();
    for r in 1..=now {
        let r = r.to_string();
        assert_eq!(
            plain_hashkv(&k.endpoint(), &r),
            plain_hashkv(&e.endpoint(), &r),
            "revision {r}"
        );
    }
    // Revision 32 deletes the h prefix: a tombstone at the compaction revision.
    // Physical: answered once the compaction is done (and its hash kept).
    run(&["compact", "32", "--physical"]);
    for r in 32..=now {
        let r = r.to_string();
        assert_eq!(
            plain_hashkv(&k.endpoint(), &r),
            plain_hashkv(&e.endpoint(), &r),
            "after compaction, revision {r}"
        );
    }
}

#[test]
fn offline_defrag_and_hashkv_work_on_stopped_etcd_and_kvd_directories() {
    let dir = tempfile::tempdir().unwrap();
    for server in ["etcd", "kvd"] {
        let m = Addrs::new(server);
        let data = dir.path().join(server);
        let start = |m: &Addrs| match server {
            "etcd" => etcd("v3.6.5", m, &data),
            _ => kvd(m, &data),
        };
        let mut p = ready(start(&m), false);
        write_history(&m.endpoint());
        let value = "b".repeat(2000);
        for c in 0..3 {
            let ops: Vec<String> = (0..100)
                .map(|i| format!("put bulk{c}-{i} {value}"))
                .collect();
            let ops: Vec<&str> = ops.iter().map(String::as_str).collect();
            txn(&m.endpoint(), Some(ROOT), &ops);
        }
        root_ok(&m.endpoint(), &["del", "bulk", "--prefix"]);
        let rev =
            |ep: &str| json_number(&root_ok(ep, &["get", "x", "-w", "json"]), "revision").unwrap();
        root_ok(
            &m.endpoint(),
            &["compact", &rev(&m.endpoint()).to_string(), "--physical"],
        );
        // Past the compaction's revision, whose HashKV a running etcd answers from memory.
        root_ok(&m.endpoint(), &["put", "after", "1"]);
        let then = rev(&m.endpoint());
        let want = state_at(&m.endpoint(), then);
        p.terminate();
        let hash = ok(
            kvd_tool(&[
                "hashkv".into(),
                "--data-dir".into(),
                data.display().to_string(),
                "--rev".into(),
                then.to_string(),
            ]),
            "kvd hashkv",
        );
        assert_eq!(
            hash.trim(),
            format!(
                "{}, {}, {}",
                want.hash_then.0, want.hash_then.2, want.hash_then.1
            ),
            "{server}: offline hashkv at {then}"
        );
        let db = data.join("member/snap/db");
        let before = std::fs::metadata(&db).unwrap().len();
        ok(
            kvd_tool(&[
                "defrag".into(),
                "--data-dir".into(),
                data.display().to_string(),
            ]),
            "kvd defrag",
        );
        let after = std::fs::metadata(&db).unwrap().len();
        assert!(after < before, "{server}: {before} -> {after} bytes");
        let _p = ready(start(&m), true);
        assert_eq!(
            state_at(&m.endpoint(), then),
            want,
            "{server} after an offline defrag"
        );
    }
}

/// A snapshot saved from etcd with enough keys for branch pages.
fn big_etcd_snapshot(dir: &Path) -> PathBuf {
    let m = Addrs::new("etcd");
    let mut p = ready(etcd("v3.6.5", &m, &dir.join("etcd-big")), false);
    let ops: String = (0..1500)
        .map(|i| format!("put key{i:05} {}\n", "v".repeat(100)))
        .collect();
    for chunk in ops.lines().collect::<Vec<_>>().chunks(100) {
        txn(&m.endpoint(), None, chunk);
    }
    ctl_ok(&m.endpoint(), &["put", "big", &"B".repeat(20_000)]);
    let file = dir.join("big.snap");
    ctl_ok(&m.endpoint(), &["snapshot", "save", file.to_str().unwrap()]);
    p.terminate();
    file
}

fn page_flags(b: &[u8], id: usize) -> u16 {
    u16::from_le_bytes([b[id * 4096 + 8], b[id * 4096 + 9]])
}

#[test]
fn bad_snapshot_files_get_a_clear_error_and_leave_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(big_etcd_snapshot(dir.path())).unwrap();
    let n = good.len();
    // The key bucket's root: a branch page (etcd's file also holds stale pages no tree reaches).
    let db = bbolt::Db::open(dir.path().join("big.snap")).unwrap();
    let branch = db.bucket(b"key").unwrap().unwrap().root_page().unwrap() as usize;
    assert_eq!(
        page_flags(&good, branch),
        0x01,
        "the key bucket's root is a branch"
    );
    let mut leaf = branch;
    while page_flags(&good, leaf) == 0x01 {
        let at = leaf * 4096 + 16 + 8;
        leaf = u64::from_le_bytes(good[at..at + 8].try_into().unwrap()) as usize;
    }
    let set = |b: &mut Vec<u8>, at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
    // (name, bytes, --skip-hash-check, what the error says)
    let mut cases: Vec<(&str, Vec<u8>, bool, &str)> = vec![
        (
            "truncated",
            good[..n / 2 / 512 * 512 + 32].to_vec(),
            false,
            "SHA-256 does not match",
        ),
        (
            "truncated, no trailer",
            good[..n / 2 / 512 * 512].to_vec(),
            false,
            "snapshot missing hash",
        ),
        (
            "truncated, skip the check",
            good[..n / 2 / 4096 * 4096].to_vec(),
            true,
            "truncated",
        ),
        ("empty", Vec::new(), true, "not a snapshot or data file"),
        (
            "bit flipped",
            {
                let mut b = good.clone();
                b[n / 3] ^= 0x08;
                b
            },
            false,
            "SHA-256 does not match",
        ),
        (
            "wrong trailer",
            {
                let mut b = good.clone();
                b[n - 1] ^= 1;
                b
            },
            false,
            "SHA-256 does not match",
        ),
        (
            "not a snapshot",
            b"KVD? no, just text".repeat(100),
            true,
            "not a snapshot or data file",
        ),
    ];
    let mut cycle = good.clone();
    set(
        &mut cycle,
        branch * 4096 + 16 + 8,
        &(branch as u64).to_le_bytes(),
    );
    cases.push(("a cycle", cycle, true, "reached twice"));
    let mut far = good.clone();
    set(
        &mut far,
        branch * 4096 + 16 + 8,
        &(1u64 << 40).to_le_bytes(),
    );
    cases.push((
        "a page id past the end",
        far,
        true,
        "outside the pages in use",
    ));
    let mut overflow = good.clone();
    set(&mut overflow, leaf * 4096 + 12, &u32::MAX.to_le_bytes());
    cases.push((
        "overflow past the end",
        overflow,
        true,
        "past the pages in use",
    ));
    // A bbolt file that is not etcd's.
    let foreign = dir.path().join("foreign.db");
    {
        let mut feed = |s: &mut bbolt::Sink<'_>| -> Result<(), bbolt::Error> {
            s.bucket(b"key")?;
            s.bucket(b"widgets")?;
            s.put(b"w1", b"blue")
        };
        let layout = bbolt::plan(4096, &mut feed).unwrap();
        bbolt::write(
            &layout,
            &mut std::fs::File::create(&foreign).unwrap(),
            &mut feed,
        )
        .unwrap();
    }
    cases.push((
        "not etcd's",
        std::fs::read(&foreign).unwrap(),
        true,
        "bucket \"widgets\", which etcd does not write",
    ));
    for (what, bytes, skip, says) in cases {
        let file = dir.path().join(format!("{what}.snap"));
        std::fs::write(&file, &bytes).unwrap();
        let m = Addrs::new("r");
        let data = dir.path().join(format!("{what}.restored"));
        let mut args = restore_args(&m, &file, &data);
        if skip {
            args.push("--skip-hash-check".into());
        }
        let out = kvd_tool(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: restored");
        assert!(err.contains(says), "{what}: {err}");
        assert!(
            err.contains(&file.display().to_string()),
            "{what}: names the file: {err}"
        );
        assert!(!err.contains("panicked"), "{what}: {err}");
        assert!(!data.exists(), "{what}: nothing left behind");
        let status = kvd_tool(&[
            "snapshot".into(),
            "status".into(),
            file.display().to_string(),
        ]);
        assert!(
            !String::from_utf8_lossy(&status.stderr).contains("panicked"),
            "{what}: status"
        );
    }
}
