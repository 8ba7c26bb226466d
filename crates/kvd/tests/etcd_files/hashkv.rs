//! HashKV: the same on both servers for the same requests.

use super::*;

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
