//! The pages a scan read through the map leave the process's resident set when asked, and
//! read back unchanged. Alone in its test binary: it watches this process's resident memory.
#![cfg(target_os = "linux")]

use pager::{Db, Options};

/// This process's file-backed resident memory, in KiB.
fn rss_file_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("RssFile:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn released_pages_leave_the_resident_set_and_read_back_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path().join("db"), Options::default()).unwrap();
    let val = |i: u32| vec![(i % 251) as u8; 4000];
    const N: u32 = 16_000; // 64 MB of values
    let mut w = db.begin_write().unwrap();
    let mut b = w.create_bucket(b"b").unwrap();
    for i in 0..N {
        b.put(&i.to_be_bytes(), &val(i)).unwrap();
    }
    w.commit().unwrap();
    db.release_resident().unwrap();

    let r = db.begin_read().unwrap();
    let rb = r.bucket(b"b").unwrap();
    let before = rss_file_kib();
    let held: Vec<&[u8]> = (0..N)
        .map(|i| rb.get(&i.to_be_bytes()).unwrap().unwrap())
        .collect();
    let read = rss_file_kib();
    assert!(
        read >= before + 50_000,
        "reading 64 MB through the map: resident file pages {before} → {read} KiB"
    );
    db.release_resident().unwrap();
    let released = rss_file_kib();
    assert!(
        released + 50_000 <= read,
        "after the release: resident file pages {read} → {released} KiB"
    );
    for (i, v) in held.iter().enumerate() {
        assert_eq!(*v, &val(i as u32)[..], "value {i} after the release");
    }
}
