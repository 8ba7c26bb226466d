//! The pager opening arbitrary file bytes (meta pages, branches, leaves, overflow runs, the
//! freelist), with each free-set algorithm: an error or a working database, never a panic.
//! A file that passes the consistency check also takes a write and checks out again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pager::{Db, FreelistKind, Options};

fn open_and_use(path: &std::path::Path, freelist: FreelistKind) {
    let opts = Options {
        freelist,
        ..Options::default()
    };
    let Ok(db) = Db::open(path, opts) else {
        return;
    };
    let checked = db.check().is_ok();
    let _ = db.stats();
    if let Ok(r) = db.begin_read() {
        for name in r.buckets().unwrap_or_default() {
            if let Ok(b) = r.bucket(&name) {
                for e in b.iter() {
                    if e.is_err() {
                        break;
                    }
                }
            }
        }
    }
    if checked {
        if let Ok(mut w) = db.begin_write() {
            let wrote = w
                .create_bucket_if_missing(b"fuzz")
                .and_then(|mut b| b.put(b"key", &[7u8; 5000]));
            if wrote.is_ok() && w.commit().is_ok() {
                assert!(
                    db.check().is_ok(),
                    "a file that checked out broke on a write"
                );
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("db");
    for kind in [FreelistKind::Array, FreelistKind::Hashmap] {
        std::fs::write(&path, data).expect("write the input file");
        open_and_use(&path, kind);
    }
});
