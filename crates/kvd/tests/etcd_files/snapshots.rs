//! etcd's snapshot files into kvd and kvd's into etcd, with etcdutl's options.

use super::*;

/// `kvd snapshot status` prints what etcdutl `version`'s does for `file`.
fn same_status(version: &str, file: &Path) {
    let args: Vec<String> = [
        "snapshot",
        "status",
        &file.display().to_string(),
        "-w",
        "json",
    ]
    .map(String::from)
    .to_vec();
    let theirs = ok(etcdutl(version, &args), "etcdutl snapshot status");
    let ours = ok(kvd_tool(&args), "kvd snapshot status");
    assert_eq!(ours.trim(), theirs.trim(), "{version}: snapshot status");
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
            same_status(version, &file);
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
        same_status(version, &file);
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
