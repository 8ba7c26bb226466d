//! Bad snapshot files: a clear error, no panic, nothing left behind.

use super::*;

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
