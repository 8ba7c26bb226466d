//! Snapshot isolation: readers keep their snapshot while the writer commits, frees and reuses
//! pages, grows the file and remaps it; many reader threads race a writer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use pager::{Db, FreelistKind, Options};

fn opts(kind: FreelistKind) -> Options {
    Options {
        page_size: Some(1024),
        freelist: kind,
        ..Options::default()
    }
}

#[test]
fn reader_keeps_its_snapshot_across_commits_growth_and_remap() {
    for kind in [FreelistKind::Array, FreelistKind::Hashmap] {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path().join("db"), opts(kind)).unwrap();
        let mut w = db.begin_write().unwrap();
        let mut b = w.create_bucket(b"b").unwrap();
        let val = |i: u32, gen: u8| vec![gen; 50 + (i as usize % 7) * 300];
        for i in 0..300u32 {
            b.put(&i.to_be_bytes(), &val(i, 1)).unwrap();
        }
        w.commit().unwrap();

        let r = db.begin_read().unwrap();
        let rb = r.bucket(b"b").unwrap();
        // Borrowed straight from the map; must stay valid and unchanged.
        let held: Vec<&[u8]> = (0..300u32)
            .map(|i| rb.get(&i.to_be_bytes()).unwrap().unwrap())
            .collect();
        let size_before = db.stats().file_size;

        for round in 0..30u8 {
            let mut w = db.begin_write().unwrap();
            let mut b = w.bucket(b"b").unwrap();
            for i in 0..300u32 {
                if (i + u32::from(round)) % 5 == 0 {
                    b.delete(&i.to_be_bytes()).unwrap();
                } else {
                    b.put(&i.to_be_bytes(), &val(i, round + 2)).unwrap();
                }
            }
            // Large values force overflow runs and file growth.
            b.put(&[0xff, round], &vec![round; 40_000]).unwrap();
            if round % 3 == 0 {
                w.commit().unwrap();
            } else {
                w.commit_nosync().unwrap();
                db.sync().unwrap();
            }
            // Pages dropped from the resident set read back the same.
            if round % 4 == 0 {
                db.release_resident().unwrap();
            }
        }
        assert!(
            db.stats().file_size > 4 * size_before,
            "the file did not grow enough to remap"
        );
        for (i, v) in held.iter().enumerate() {
            assert_eq!(
                *v,
                &val(i as u32, 1)[..],
                "{kind:?}: held value {i} changed"
            );
        }
        let snapshot: Vec<(Vec<u8>, Vec<u8>)> = rb
            .iter()
            .map(|e| e.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap())
            .collect();
        assert_eq!(snapshot.len(), 300);
        assert!(snapshot.iter().all(|(_, v)| v.iter().all(|&b| b == 1)));
        drop(r);
        db.check().unwrap();
    }
}

/// Readers on many threads check that every snapshot is one whole commit: the writer rewrites
/// every key with the commit's generation, so a value from any other generation — a page reused
/// too early — fails the check.
#[test]
fn concurrent_readers_always_see_whole_commits() {
    for kind in [FreelistKind::Array, FreelistKind::Hashmap] {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(Db::open(dir.path().join("db"), opts(kind)).unwrap());
        const KEYS: u32 = 200;
        let mut w = db.begin_write().unwrap();
        let mut b = w.create_bucket(b"b").unwrap();
        for i in 0..KEYS {
            b.put(&i.to_be_bytes(), &0u64.to_le_bytes()).unwrap();
        }
        w.commit().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let (db, stop) = (db.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut snapshots = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let r = db.begin_read().unwrap();
                        let b = r.bucket(b"b").unwrap();
                        let mut gen = None;
                        let mut n = 0;
                        for e in b.iter() {
                            let (_, v) = e.unwrap();
                            let g = u64::from_le_bytes(v[..8].try_into().unwrap());
                            assert!(v[8..].iter().all(|&x| x == g as u8), "torn value");
                            assert_eq!(*gen.get_or_insert(g), g, "snapshot mixes generations");
                            n += 1;
                        }
                        assert_eq!(n, KEYS);
                        snapshots += 1;
                    }
                    snapshots
                })
            })
            .collect();
        for gen in 1..=300u64 {
            let mut w = db.begin_write().unwrap();
            let mut b = w.bucket(b"b").unwrap();
            // Varying sizes move entries between pages and grow the file now and then.
            let len = 8 + (gen as usize * 37) % 600;
            let mut v = vec![gen as u8; len];
            v[..8].copy_from_slice(&gen.to_le_bytes());
            for i in 0..KEYS {
                b.put(&i.to_be_bytes(), &v).unwrap();
            }
            if gen % 4 == 0 {
                w.commit().unwrap();
            } else {
                w.commit_nosync().unwrap();
            }
            if gen % 7 == 0 {
                db.sync().unwrap();
            }
        }
        stop.store(true, Ordering::Relaxed);
        let total: u64 = readers.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(total > 0);
        db.check().unwrap();
    }
}
