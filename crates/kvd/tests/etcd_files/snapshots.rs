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

/// Waits until `/version` on `client_url` reports cluster version `want` (`3.6.0`).
fn wait_cluster_version(p: &Proc, want: &str) {
    let needle = format!(r#""etcdcluster":"{want}""#);
    p.wait_for(&format!("cluster version {want}"), 30, || {
        common::http_get(&p.addrs.client, "/version")
            .1
            .contains(&needle)
    });
}

/// etcd `version` started on `file` restored by its etcdutl: its state once ready, or the
/// line it died with.
fn served_by_etcd(version: &str, file: &Path, dir: &Path) -> Result<State, String> {
    let e = Addrs::new("etcd");
    let data = dir.join(format!(
        "etcd-{version}-{}",
        file.file_stem().unwrap().to_string_lossy()
    ));
    ok(
        etcdutl(version, &restore_args(&e, file, &data)),
        "etcdutl snapshot restore",
    );
    let mut p = etcd(version, &e, &data);
    p.ctl_flags = vec!["--user".into(), ROOT.into()];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Some(code) = p.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
            let log = p.log_tail();
            let fatal = log.lines().find(|l| l.contains(r#""level":"fatal""#));
            return Err(format!("exited ({code}): {}", fatal.unwrap_or(&log)));
        }
        if ctl(&e.endpoint(), &as_root(&["get", "x"])).status.success() {
            let st = state(&e.endpoint());
            // And etcd takes writes on top.
            root_ok(&e.endpoint(), &["put", "on-etcd", "1"]);
            return Ok(st);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "etcd {version} neither served nor died"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// kvd's snapshots are etcd's files: restored by etcdutl 3.6 and 3.7 and served by etcd as
/// etcd's own of the same cluster version are — a 3.7 cluster's by etcd 3.7 only (etcd 3.6
/// refuses storage version 3.7.0, as it refuses etcd 3.7.1's snapshots), a cluster's
/// downgraded to 3.6 (`downgrade enable 3.6`) by etcd 3.6 too; cancelled, it is 3.7's again.
#[test]
fn kvds_snapshots_restore_with_etcdutl_3_6_and_3_7_and_serve_in_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let m = Addrs::new("kvd");
    let mut p = ready(kvd(&m, &dir.path().join("kvd")), false);
    write_history(&m.endpoint());
    let want = state(&m.endpoint());
    let save = |name: &str| {
        let file = dir.path().join(format!("{name}.snap"));
        root_ok(&m.endpoint(), &["snapshot", "save", file.to_str().unwrap()]);
        file
    };
    wait_cluster_version(&p, "3.7.0");
    let file = save("kvd37");
    root_ok(&m.endpoint(), &["downgrade", "enable", "3.6"]);
    wait_cluster_version(&p, "3.6.0");
    let file36 = save("kvd36");
    root_ok(&m.endpoint(), &["downgrade", "cancel"]);
    wait_cluster_version(&p, "3.7.0");
    let again37 = save("kvd37-again");
    p.terminate();
    for (version, f) in [("v3.6.5", &file36), ("v3.7.1", &file), ("v3.7.1", &file36)] {
        same_status(version, f);
        let got = served_by_etcd(version, f, dir.path());
        assert_eq!(
            got.as_ref(),
            Ok(&want),
            "kvd's snapshot {f:?} served by etcd {version}"
        );
    }
    for f in [&file, &again37] {
        let refused = served_by_etcd("v3.6.5", f, dir.path()).unwrap_err();
        assert!(
            refused.contains(r#"version \"3.7.0\" is not supported"#),
            "etcd 3.6.5 on {f:?}: {refused}"
        );
    }
    // As it refuses etcd 3.7.1's own.
    let (etcd37, _) = etcd_snapshot("v3.7.1", dir.path());
    let refused = served_by_etcd("v3.6.5", &etcd37, dir.path()).unwrap_err();
    assert!(refused.contains("is not supported"), "{refused}");
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
