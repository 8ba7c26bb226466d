//! etcd's files in and out, with real etcd binaries (3.4 to 3.7) built from the Go module
//! proxy: etcd's snapshots restored by kvd, kvd's snapshots restored by etcdutl and served by
//! etcd, etcdutl's revision bump, a member's db copied while stopped, HashKV equal on both
//! servers for the same history, the offline tools on both servers' directories, and bad files
//! refused with a clear error and nothing left behind.

mod bad_files;
#[path = "../common/mod.rs"]
mod common;
mod hashkv;
mod kubernetes;
mod migrate;
mod offline;
mod snapshots;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub(crate) use common::{ctl, ctl_ok, etcd_tools, json_number, Addrs, Proc};

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
