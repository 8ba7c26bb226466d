//! etcd's data file read from arbitrary bytes: bbolt's meta pages, branch and leaf pages,
//! overflow, inline buckets, the freelist — opened, walked, checked, and imported into a store
//! as `kvd snapshot restore` does. An error or a working store, never a panic or a hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("db");
    std::fs::write(&path, data).expect("write the input file");
    let Ok(db) = bbolt::Db::open(&path) else {
        return;
    };
    let _ = db.check();
    let _ = db.free_pages();
    if let Ok(buckets) = db.buckets() {
        let mut w = db.walker();
        for (_, b) in buckets {
            let _ = w.for_each(&b, &mut |_, _| Ok(true));
        }
    }
    let dst = dir.path().join("store");
    if mvcc::etcd_file::import(&db, &dst).is_ok() {
        if let Ok(store) = mvcc::Store::open(&dst, mvcc::StoreOptions::default()) {
            let _ = store.hash_kv(ids::Revision(0));
            let _ = store.close();
        }
    } else {
        assert!(!dst.exists(), "a failed import leaves nothing behind");
    }
});
