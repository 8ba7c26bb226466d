//! The offline tools on stopped etcd and kvd data directories.

use super::*;

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
