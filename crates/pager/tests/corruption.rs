//! Bad input from the disk or the caller: an error value with a clear message, never a panic.

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use pager::{Db, Error, Options};

fn flip(path: &Path, at: u64) {
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    f.seek(SeekFrom::Start(at)).unwrap();
    f.read_exact(&mut b).unwrap();
    b[0] ^= 0x5a;
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(&b).unwrap();
}

fn put(db: &Db, key: &[u8], value: &[u8]) {
    let mut w = db.begin_write().unwrap();
    w.create_bucket_if_missing(b"b")
        .unwrap()
        .put(key, value)
        .unwrap();
    w.commit().unwrap();
}

fn get(db: &Db, key: &[u8]) -> Option<Vec<u8>> {
    let r = db.begin_read().unwrap();
    let v = r
        .bucket(b"b")
        .unwrap()
        .get(key)
        .unwrap()
        .map(<[u8]>::to_vec);
    v
}

/// Which meta slot holds the newest commit: the one with the larger txid.
fn newest_meta_offset(path: &Path) -> u64 {
    let bytes = std::fs::read(path).unwrap();
    let txid = |off: usize| u64::from_le_bytes(bytes[off + 48..off + 56].try_into().unwrap());
    if txid(0) > txid(4096) {
        0
    } else {
        4096
    }
}

#[test]
fn damaged_newest_meta_falls_back_to_the_previous_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let db = Db::open(&path, Options::default()).unwrap();
    put(&db, b"k", b"one");
    put(&db, b"k", b"two");
    drop(db);
    flip(&path, newest_meta_offset(&path) + 20);
    let db = Db::open(&path, Options::default()).unwrap();
    assert_eq!(get(&db, b"k").as_deref(), Some(&b"one"[..]));
    db.check().unwrap();
    // And it goes on working: the next commit replaces the damaged meta.
    put(&db, b"k", b"three");
    drop(db);
    let db = Db::open(&path, Options::default()).unwrap();
    assert_eq!(get(&db, b"k").as_deref(), Some(&b"three"[..]));
    db.check().unwrap();
}

#[test]
fn both_metas_damaged_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    put(&Db::open(&path, Options::default()).unwrap(), b"k", b"v");
    flip(&path, 3);
    flip(&path, 4096 + 40);
    let err = Db::open(&path, Options::default()).unwrap_err();
    assert!(matches!(err, Error::NoValidMeta { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(&path.display().to_string())
            && msg.contains("page 0")
            && msg.contains("page 1"),
        "{msg}"
    );
    assert!(
        msg.contains("bad magic") && msg.contains("checksum mismatch"),
        "{msg}"
    );
}

#[test]
fn truncated_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let db = Db::open(&path, Options::default()).unwrap();
    let mut w = db.begin_write().unwrap();
    let mut b = w.create_bucket(b"b").unwrap();
    for i in 0..2000u32 {
        b.put(&i.to_be_bytes(), &[1; 100]).unwrap();
    }
    w.commit().unwrap();
    drop(db);
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(20 * 4096).unwrap();
    let err = Db::open(&path, Options::default()).unwrap_err();
    assert!(
        matches!(err, Error::Truncated { actual: 81920, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("truncated"), "{err}");
}

#[test]
fn wrong_page_size_and_bad_keys_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let db = Db::open(&path, Options::default()).unwrap();
    assert_eq!(db.max_key_len(), 990);
    let mut w = db.begin_write().unwrap();
    let mut b = w.create_bucket(b"b").unwrap();
    assert!(matches!(b.put(b"", b"v"), Err(Error::EmptyKey)));
    assert!(matches!(
        b.put(&[1; 991], b"v"),
        Err(Error::KeyTooLarge { len: 991, max: 990 })
    ));
    b.put(&[1; 990], b"v").unwrap();
    // etcd's largest request, 1.5 MiB, in one value.
    let big: Vec<u8> = (0..1_572_864u32).map(|i| (i % 251) as u8).collect();
    b.put(b"big", &big).unwrap();
    w.commit().unwrap();
    assert_eq!(get(&db, b"big").as_deref(), Some(&big[..]));
    drop(db);
    let err = Db::open(
        &path,
        Options {
            page_size: Some(8192),
            ..Options::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::PageSizeMismatch {
                stored: 4096,
                requested: 8192,
                ..
            }
        ),
        "{err:?}"
    );
    let err = Db::open(
        &path,
        Options {
            page_size: Some(3000),
            ..Options::default()
        },
    )
    .unwrap_err();
    assert!(matches!(err, Error::InvalidPageSize(3000)), "{err:?}");
    // A second open of a file in use is refused, not shared.
    let db = Db::open(&path, Options::default()).unwrap();
    assert!(matches!(
        Db::open(&path, Options::default()),
        Err(Error::Locked { .. })
    ));
    db.check().unwrap();
}

/// Reads everything; returns the first error. Must never panic, whatever the file holds.
fn read_all(db: &Db) -> pager::Result<usize> {
    let r = db.begin_read()?;
    let mut n = 0;
    for name in r.buckets()? {
        let b = r.bucket(&name)?;
        for e in b.iter() {
            let (k, _) = e?;
            b.get(k)?;
            n += 1;
        }
        let mut c = b.cursor();
        let mut e = c.last()?;
        while e.is_some() {
            e = c.prev()?;
        }
    }
    Ok(n)
}

/// A flipped byte in any page in use is caught: open refuses it (the freelist), or `check()`
/// names it; reads of the damaged file return errors or data, never panic.
#[test]
fn flipped_byte_in_any_used_page_is_detected_and_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let pristine = dir.path().join("pristine");
    let db = Db::open(&pristine, Options::default()).unwrap();
    let mut w = db.begin_write().unwrap();
    for bucket in [&b"a"[..], b"b"] {
        let mut b = w.create_bucket(bucket).unwrap();
        for i in 0..1500u32 {
            let len = if i % 100 == 0 { 9000 } else { 60 };
            b.put(&i.to_be_bytes(), &vec![i as u8; len]).unwrap();
        }
    }
    w.commit().unwrap();
    let stats = db.stats();
    // One commit on a new file: only the initial root (page 2) is free; the rest is in use.
    assert_eq!(stats.free_pages + stats.pending_pages, 1, "{stats:?}");
    drop(db);
    let bytes = std::fs::read(&pristine).unwrap();
    let ps = 4096u64;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut detected_by_open = 0;
    for trial in 0..300u64 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let page = 3 + rng % (stats.high_water - 3);
        let at = page * ps + (rng >> 32) % ps;
        let path = dir.path().join(format!("t{trial}"));
        std::fs::write(&path, &bytes).unwrap();
        flip(&path, at);
        match Db::open(&path, Options::default()) {
            Err(e) => {
                assert!(matches!(e, Error::Corrupt { .. }), "byte {at}: {e:?}");
                detected_by_open += 1;
            }
            Ok(db) => {
                let err = db
                    .check()
                    .expect_err(&format!("flipped byte {at} (page {page}) not detected"));
                // Named by its page, or by the first page of the overflow run it lies in.
                let msg = err.to_string();
                assert!(
                    (page.saturating_sub(2)..=page).any(|p| msg.contains(&format!("page {p}"))),
                    "byte {at}: {msg}"
                );
                let _ = read_all(&db);
            }
        }
        std::fs::remove_file(&path).unwrap();
    }
    assert!(
        detected_by_open < 300,
        "every flip hit the freelist: the test reached no tree page"
    );
}

/// Found by the `pager_open` fuzz target (fuzz/fuzz_targets/pager_open.rs): an 87-byte file
/// whose first meta page checks out but claims more pages than a file can hold. Opening it
/// multiplied past u64 and panicked; it is refused as a file with no valid meta.
#[test]
fn a_meta_claiming_more_pages_than_a_file_can_hold_is_refused() {
    const FILE: [u8; 87] = [
        66, 68, 86, 75, 1, 0, 0, 0, 0, 16, 0, 0, 107, 48, 49, 55, 53, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 255, 255, 255, 255, 255, 255,
        255, 255, 255, 255, 204, 230, 137, 204, 255, 255, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        97, 0, 72, 183, 0, 0, 83, 0, 0, 38, 0,
    ];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    std::fs::write(&path, FILE).unwrap();
    for freelist in [pager::FreelistKind::Array, pager::FreelistKind::Hashmap] {
        let opts = pager::Options {
            freelist,
            ..pager::Options::default()
        };
        let Err(err) = Db::open(&path, opts) else {
            panic!("a meta past any file's size was taken");
        };
        assert!(matches!(err, Error::NoValidMeta { .. }), "{err:?}");
    }
}

/// A page id that checks out everywhere but names a page its commit does not reach — here the
/// root tree's pointer to a bucket, re-sealed with a valid checksum, naming the bucket's old
/// leaf, now free. The old leaf is a real page with its own id and checksum, so nothing in the
/// page tells it apart; without the commit's set of unreached pages a reader would return its
/// stale value, and could borrow bytes the writer is rewriting. It is refused as corrupt.
#[test]
fn a_page_id_naming_a_free_page_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let db = Db::open(&path, Options::default()).unwrap();
    put(&db, b"k", b"old-value");
    put(&db, b"k", b"new-value");
    put(&db, b"other", b"x");
    let stats = db.stats();
    assert!(stats.free_pages + stats.pending_pages > 0, "{stats:?}");
    drop(db);

    let mut bytes = std::fs::read(&path).unwrap();
    let ps = 4096usize;
    let u64_at = |b: &[u8], off: usize| u64::from_le_bytes(b[off..off + 8].try_into().unwrap());
    let meta = newest_meta_offset(&path) as usize;
    let (root, freelist) = (u64_at(&bytes, meta + 16), u64_at(&bytes, meta + 24));
    let ids_at = freelist as usize * ps + 24;
    let free: Vec<u64> = (0..u64_at(&bytes, ids_at) as usize)
        .map(|i| u64_at(&bytes, ids_at + 8 + 8 * i))
        .collect();
    // The bucket's leaf as the first commit wrote it: free now, its bytes intact.
    let stale = *free
        .iter()
        .find(|&&p| {
            let page = &bytes[p as usize * ps..(p as usize + 1) * ps];
            page[8] == 2 && page.windows(10).any(|w| w == b"kold-value")
        })
        .expect("the old leaf is among the free pages");
    // The root tree is one leaf: one element, key "b", its value the bucket's root page id.
    let r = root as usize * ps;
    assert_eq!(
        (bytes[r + 8], bytes[r + 10]),
        (2, 1),
        "root is a one-element leaf"
    );
    let pos = u32::from_le_bytes(bytes[r + 24 + 8..r + 24 + 12].try_into().unwrap()) as usize;
    assert_eq!(&bytes[r + pos..r + pos + 1], b"b");
    bytes[r + pos + 1..r + pos + 9].copy_from_slice(&stale.to_le_bytes());
    bytes[r + 16..r + 20].fill(0);
    let crc = crc32c::crc32c(&bytes[r..r + ps]);
    bytes[r + 16..r + 20].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();

    let db = Db::open(&path, Options::default()).unwrap();
    let r = db.begin_read().unwrap();
    let err = r
        .bucket(b"b")
        .and_then(|b| b.get(b"k").map(|v| v.map(<[u8]>::to_vec)))
        .expect_err("the stale leaf was read");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&format!(
            "includes page {stale}, which this commit does not reach"
        )),
        "{err}"
    );
    drop(r);
    db.check().expect_err("check names the damaged pointer");
}
