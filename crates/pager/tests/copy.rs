//! The online copy: `copy_to` while writers go on, `catch_up` to what they wrote, reading only
//! the paths to what changed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use pager::{Db, Options};

/// Every bucket's name and entries.
type Contents = Vec<(Vec<u8>, Vec<(Vec<u8>, Vec<u8>)>)>;

fn contents(db: &Db) -> Contents {
    let r = db.begin_read().unwrap();
    r.buckets()
        .unwrap()
        .into_iter()
        .map(|name| {
            let entries = r
                .bucket(&name)
                .unwrap()
                .iter()
                .map(|e| e.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap())
                .collect();
            (name, entries)
        })
        .collect()
}

fn key(i: u32) -> [u8; 4] {
    i.to_be_bytes()
}

#[test]
fn a_catch_up_reads_only_the_paths_to_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path().join("db"), Options::default()).unwrap();
    let mut w = db.begin_write().unwrap();
    let mut b = w.create_bucket(b"b").unwrap();
    for i in 0..20_000 {
        b.put(&key(i), &[i as u8; 100]).unwrap();
    }
    w.commit().unwrap();
    let leaves = db.stats().leaf_pages;
    assert!(leaves > 500, "{leaves} leaves");

    let mut copy = db.copy_to(dir.path().join("copy")).unwrap();
    let mut w = db.begin_write().unwrap();
    let mut b = w.bucket(b"b").unwrap();
    b.put(&key(7), b"changed").unwrap();
    assert!(b.delete(&key(12_345)).unwrap());
    b.put(&key(30_000), b"added").unwrap();
    w.commit().unwrap();

    let done = copy.catch_up(&db).unwrap();
    assert_eq!((done.puts, done.deletes), (2, 1), "{done:?}");
    // Three root-to-leaf paths on each side (and each side's height measured once), not the
    // hundreds of leaves the tree has.
    assert!(done.nodes_read <= 30, "{done:?}, {leaves} leaves");
    // Caught up: a second round finds nothing.
    assert_eq!(copy.catch_up(&db).unwrap(), pager::CaughtUp::default());
    copy.finish().unwrap();
    let out = Db::open(dir.path().join("copy"), Options::default()).unwrap();
    out.check().unwrap();
    assert_eq!(contents(&out), contents(&db));
}

#[test]
fn writers_go_on_while_a_copy_is_made_and_caught_up() {
    let dir = tempfile::tempdir().unwrap();
    let db = Arc::new(Db::open(dir.path().join("db"), Options::default()).unwrap());
    let mut w = db.begin_write().unwrap();
    for name in [&b"small"[..], b"large", b"doomed"] {
        let mut b = w.create_bucket(name).unwrap();
        for i in 0..3_000 {
            let len = if name == b"large" { 6_000 } else { 50 };
            b.put(&key(i), &vec![i as u8; len]).unwrap();
        }
    }
    w.commit().unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (db, stop) = (db.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let mut w = db.begin_write().unwrap();
                for i in 0..50 {
                    let k = key((n.wrapping_mul(7919) + i * 13) % 5_000);
                    let mut b = w.bucket(b"small").unwrap();
                    if n.is_multiple_of(3) {
                        b.delete(&k).unwrap();
                    } else {
                        b.put(&k, &n.to_le_bytes()).unwrap();
                    }
                    let len = 4_000 + (n % 5_000) as usize;
                    w.bucket(b"large")
                        .unwrap()
                        .put(&k, &vec![n as u8; len])
                        .unwrap();
                }
                if n == 20 {
                    w.delete_bucket(b"doomed").unwrap();
                    w.create_bucket(b"new").unwrap().put(b"k", b"v").unwrap();
                }
                w.commit_nosync().unwrap();
                n += 1;
            }
            n
        })
    };
    let mut copy = db.copy_to(dir.path().join("copy")).unwrap();
    let mut rounds = Vec::new();
    for _ in 0..3 {
        rounds.push(copy.catch_up(&db).unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    let commits = writer.join().unwrap();
    rounds.push(copy.catch_up(&db).unwrap());
    copy.finish().unwrap();
    assert!(commits > 20, "the writer made {commits} commits");
    assert!(rounds.iter().any(|r| r.puts > 0), "{rounds:?}");

    let out = Db::open(dir.path().join("copy"), Options::default()).unwrap();
    out.check().unwrap();
    assert_eq!(contents(&out), contents(&db));
    let names: Vec<Vec<u8>> = contents(&out).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        vec![b"large".to_vec(), b"new".to_vec(), b"small".to_vec()]
    );
}

#[test]
fn a_copy_is_caught_up_only_from_its_own_source() {
    let dir = tempfile::tempdir().unwrap();
    let a = Db::open(dir.path().join("a"), Options::default()).unwrap();
    let b = Db::open(dir.path().join("b"), Options::default()).unwrap();
    let mut copy = a.copy_to(dir.path().join("copy")).unwrap();
    let err = copy.catch_up(&b).unwrap_err();
    assert!(
        err.to_string()
            .contains("not the database the copy was made from"),
        "{err}"
    );
    assert!(
        a.copy_to(dir.path().join("copy")).is_err(),
        "the destination exists"
    );
}
