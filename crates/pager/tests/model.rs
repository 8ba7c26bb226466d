//! Model test: the pager against a `BTreeMap` per bucket, under random sequences of puts,
//! deletes, bucket creation and deletion, commits (durable or not), rollbacks, syncs, reopens
//! (clean, or dropping unsynced commits as a crash would), compaction and freelist switches,
//! and online copies (`copy_to`, then `catch_up` to later commits while edits go on, checked
//! against the model as of each catch-up). `check()` runs after every commit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pager::{Db, FreelistKind, Options};
use proptest::prelude::*;

type Model = BTreeMap<Vec<u8>, BTreeMap<Vec<u8>, Vec<u8>>>;

#[derive(Clone, Debug)]
enum Edit {
    Put { bucket: u8, key: u16, len: u16 },
    Delete { bucket: u8, key: u16 },
    DeleteRange { bucket: u8, from: u16, n: u8 },
    CreateBucket(u8),
    DeleteBucket(u8),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum End {
    Commit,
    CommitNosync,
    Rollback,
}

#[derive(Clone, Debug)]
enum Step {
    Txn(Vec<Edit>, End),
    Sync,
    Reopen {
        clean: bool,
        array: bool,
    },
    Compact,
    /// Starts an online copy of the newest commit (abandoning one under way).
    CopyStart,
    /// Brings the copy under way up to the newest commit; with `finish`, closes it and checks
    /// the file against the model.
    CatchUp {
        finish: bool,
    },
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        40 => (0u8..3, 0u16..400, prop_oneof![8 => 0u16..200, 1 => 200u16..3000, 1 => 3000u16..20000])
            .prop_map(|(bucket, key, len)| Edit::Put { bucket, key, len }),
        12 => (0u8..3, 0u16..400).prop_map(|(bucket, key)| Edit::Delete { bucket, key }),
        2 => (0u8..3, 0u16..400, 1u8..120).prop_map(|(bucket, from, n)| Edit::DeleteRange { bucket, from, n }),
        3 => (0u8..3).prop_map(Edit::CreateBucket),
        1 => (0u8..3).prop_map(Edit::DeleteBucket),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    let end =
        prop_oneof![3 => Just(End::Commit), 3 => Just(End::CommitNosync), 1 => Just(End::Rollback)];
    prop_oneof![
        20 => (prop::collection::vec(edit(), 0..40), end).prop_map(|(e, end)| Step::Txn(e, end)),
        1 => Just(Step::Sync),
        1 => (any::<bool>(), any::<bool>()).prop_map(|(clean, array)| Step::Reopen { clean, array }),
        1 => Just(Step::Compact),
        2 => Just(Step::CopyStart),
        3 => any::<bool>().prop_map(|finish| Step::CatchUp { finish }),
    ]
}

fn bucket_name(b: u8) -> Vec<u8> {
    format!("bucket-{b}").into_bytes()
}

/// Keys of varied lengths so that pages hold varied numbers of entries.
fn key(k: u16) -> Vec<u8> {
    let mut v = format!("k{k:05}").into_bytes();
    v.extend(std::iter::repeat_n(b'x', (k % 7) as usize * 9));
    v
}

fn value(key: u16, len: u16, salt: u64) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(31) ^ u64::from(key) ^ salt) as u8)
        .collect()
}

fn opts(kind: FreelistKind, fill_percent: f64) -> Options {
    Options {
        page_size: Some(1024),
        freelist: kind,
        fill_percent,
    }
}

/// `space()` (kept at each commit, without a walk) agrees with what a full walk counts.
fn assert_space(db: &Db) {
    let (st, sp) = (db.stats(), db.space());
    let ps = st.page_size as u64;
    assert_eq!(sp.size, st.high_water * ps, "{st:?}");
    let unreachable = st.free_pages + st.pending_pages;
    assert_eq!(sp.in_use, (st.high_water - unreachable) * ps, "{st:?}");
}

fn assert_matches(db: &Db, model: &Model) -> Result<(), TestCaseError> {
    let r = db.begin_read().unwrap();
    let names = r.buckets().unwrap();
    prop_assert_eq!(names, model.keys().cloned().collect::<Vec<_>>());
    for (name, m) in model {
        let b = r.bucket(name).unwrap();
        let got: Vec<(Vec<u8>, Vec<u8>)> = b
            .iter()
            .map(|e| e.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap())
            .collect();
        let want: Vec<(Vec<u8>, Vec<u8>)> = m.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        prop_assert_eq!(got.len(), want.len());
        prop_assert!(got == want, "bucket contents differ");
        // Backwards too.
        let mut c = b.cursor();
        let mut back = Vec::new();
        let mut e = c.last().unwrap();
        while let Some((k, _)) = e {
            back.push(k.to_vec());
            e = c.prev().unwrap();
        }
        back.reverse();
        prop_assert_eq!(back, m.keys().cloned().collect::<Vec<_>>());
    }
    Ok(())
}

fn apply(
    w: &mut pager::WriteTxn<'_>,
    e: &Edit,
    txn: &mut Model,
    salt: u64,
) -> Result<(), TestCaseError> {
    match *e {
        Edit::Put {
            bucket,
            key: k,
            len,
        } => {
            let name = bucket_name(bucket);
            let (kb, vb) = (key(k), value(k, len, salt));
            match w.bucket(&name) {
                Ok(mut b) => {
                    b.put(&kb, &vb).unwrap();
                    prop_assert_eq!(b.get(&kb).unwrap(), Some(&vb[..]));
                    txn.get_mut(&name).unwrap().insert(kb, vb);
                }
                Err(pager::Error::BucketNotFound(_)) => prop_assert!(!txn.contains_key(&name)),
                Err(e) => panic!("{e}"),
            }
        }
        Edit::Delete { bucket, key: k } => {
            let name = bucket_name(bucket);
            if let Ok(mut b) = w.bucket(&name) {
                let had = b.delete(&key(k)).unwrap();
                prop_assert_eq!(had, txn.get_mut(&name).unwrap().remove(&key(k)).is_some());
                prop_assert_eq!(b.get(&key(k)).unwrap(), None);
            }
        }
        Edit::DeleteRange { bucket, from, n } => {
            let name = bucket_name(bucket);
            if let Ok(mut b) = w.bucket(&name) {
                let keys: Vec<Vec<u8>> = b
                    .range(&key(from)[..]..)
                    .take(n as usize)
                    .map(|e| e.unwrap().0.to_vec())
                    .collect();
                let m = txn.get_mut(&name).unwrap();
                let want: Vec<Vec<u8>> = m
                    .range(key(from)..)
                    .take(n as usize)
                    .map(|(k, _)| k.clone())
                    .collect();
                prop_assert_eq!(&keys, &want);
                for k in keys {
                    prop_assert!(b.delete(&k).unwrap());
                    m.remove(&k);
                }
            }
        }
        Edit::CreateBucket(bucket) => {
            let name = bucket_name(bucket);
            let r = w.create_bucket(&name).map(|_| ());
            prop_assert_eq!(r.is_ok(), !txn.contains_key(&name));
            txn.entry(name).or_default();
        }
        Edit::DeleteBucket(bucket) => {
            let name = bucket_name(bucket);
            let r = w.delete_bucket(&name);
            prop_assert_eq!(r.is_ok(), txn.remove(&name).is_some());
        }
    }
    Ok(())
}

fn run(steps: Vec<Step>, dir: &Path, fill: f64) -> Result<(), TestCaseError> {
    let mut path: PathBuf = dir.join("db");
    let mut kind = FreelistKind::Hashmap;
    let mut db = Db::open(&path, opts(kind, fill)).unwrap();
    let mut committed = Model::new();
    let mut durable = Model::new();
    let mut salt = 0u64;
    let mut gen = 0;
    // The online copy under way: it, its file, and the model as of its last catch-up.
    let mut copy: Option<(pager::Copy, PathBuf, Model)> = None;
    for step in steps {
        if matches!(step, Step::Reopen { .. } | Step::Compact) {
            copy = None;
        }
        match step {
            Step::Txn(edits, end) => {
                let mut txn = committed.clone();
                let mut w = db.begin_write().unwrap();
                for e in &edits {
                    salt += 1;
                    apply(&mut w, e, &mut txn, salt)?;
                }
                match end {
                    End::Rollback => drop(w),
                    End::Commit => {
                        w.commit().unwrap();
                        committed = txn;
                        durable = committed.clone();
                    }
                    End::CommitNosync => {
                        w.commit_nosync().unwrap();
                        committed = txn;
                    }
                }
                db.check().unwrap();
                assert_space(&db);
                assert_matches(&db, &committed)?;
            }
            Step::Sync => {
                db.sync().unwrap();
                durable = committed.clone();
            }
            Step::Reopen { clean, array } => {
                if clean {
                    db.close().unwrap();
                    durable = committed.clone();
                } else {
                    // As after a crash: the unsynced commits are gone.
                    drop(db);
                    committed = durable.clone();
                }
                kind = if array {
                    FreelistKind::Array
                } else {
                    FreelistKind::Hashmap
                };
                db = Db::open(&path, opts(kind, fill)).unwrap();
                db.check().unwrap();
                assert_space(&db);
                assert_matches(&db, &committed)?;
            }
            Step::Compact => {
                gen += 1;
                let dst = dir.join(format!("compacted-{gen}"));
                db.compact_to(&dst).unwrap();
                let c = Db::open(&dst, opts(kind, fill)).unwrap();
                c.check().unwrap();
                assert_matches(&c, &committed)?;
                let (before, after) = (db.stats(), c.stats());
                prop_assert_eq!(before.keys, after.keys);
                // Defragmented: next to no free pages, and data packed at least about as densely
                // (the copy fills pages to 90%, the source may be fuller in places).
                prop_assert!(
                    after.free_pages + after.pending_pages <= 4,
                    "compacted file has free pages: {:?}",
                    after
                );
                let data = |s: &pager::Stats| s.leaf_pages + s.branch_pages + s.overflow_pages;
                prop_assert!(
                    data(&after) <= data(&before) * 12 / 10 + 2,
                    "{:?} -> {:?}",
                    before,
                    after
                );
                db = c;
                path = dst;
                durable = committed.clone();
            }
            Step::CopyStart => {
                gen += 1;
                let dst = dir.join(format!("copy-{gen}"));
                copy = Some((db.copy_to(&dst).unwrap(), dst, committed.clone()));
            }
            Step::CatchUp { finish } => {
                if let Some((mut c, dst, _)) = copy.take() {
                    let unchanged = c.copied() == db.begin_read().unwrap().txid();
                    let done = c.catch_up(&db).unwrap();
                    if unchanged {
                        prop_assert_eq!(done, pager::CaughtUp::default());
                    }
                    let at = committed.clone();
                    if finish {
                        c.finish().unwrap();
                        let out = Db::open(&dst, opts(kind, fill)).unwrap();
                        out.check().unwrap();
                        assert_matches(&out, &at)?;
                    } else {
                        copy = Some((c, dst, at));
                    }
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]
    #[test]
    fn pager_matches_btreemap(steps in prop::collection::vec(step(), 1..60), fill in prop::sample::select(vec![0.1, 0.5, 0.9, 1.0])) {
        let dir = tempfile::tempdir().unwrap();
        run(steps, dir.path(), fill)?;
    }
}

/// A long fixed sequence that grows deep trees and many free runs, for both freelist kinds.
#[test]
fn deep_trees_and_many_commits() {
    for kind in [FreelistKind::Array, FreelistKind::Hashmap] {
        let mut steps = vec![Step::Txn(
            vec![Edit::CreateBucket(0), Edit::CreateBucket(1)],
            End::Commit,
        )];
        let mut edits = Vec::new();
        for i in 0..3000u16 {
            edits.push(Edit::Put {
                bucket: (i % 2) as u8,
                key: i.wrapping_mul(7919) % 3000,
                len: i % 300,
            });
            if i % 97 == 0 {
                let end = if i % 2 == 0 {
                    End::Commit
                } else {
                    End::CommitNosync
                };
                steps.push(Step::Txn(std::mem::take(&mut edits), end));
            }
        }
        for i in 0..2500u16 {
            edits.push(Edit::Delete {
                bucket: (i % 2) as u8,
                key: i,
            });
            if i % 113 == 0 {
                steps.push(Step::Txn(std::mem::take(&mut edits), End::Commit));
            }
        }
        steps.push(Step::Txn(edits, End::Commit));
        steps.push(Step::Reopen {
            clean: true,
            array: kind == FreelistKind::Array,
        });
        steps.push(Step::Compact);
        for fill in [0.5, 1.0] {
            let dir = tempfile::tempdir().unwrap();
            run(steps.clone(), dir.path(), fill).unwrap();
        }
    }
}

/// Compaction of a file whose keys were mostly deleted gives a much smaller file.
#[test]
fn compaction_shrinks_a_fragmented_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path().join("db"), Options::default()).unwrap();
    let mut w = db.begin_write().unwrap();
    let mut b = w.create_bucket(b"b").unwrap();
    for i in 0..20_000u32 {
        b.put(&i.to_be_bytes(), &[7u8; 200]).unwrap();
    }
    w.commit().unwrap();
    let mut w = db.begin_write().unwrap();
    let mut b = w.bucket(b"b").unwrap();
    for i in (0..20_000u32).filter(|i| i % 10 != 0) {
        assert!(b.delete(&i.to_be_bytes()).unwrap());
    }
    w.commit().unwrap();
    db.check().unwrap();
    let dst = dir.path().join("compacted");
    db.compact_to(&dst).unwrap();
    let c = Db::open(&dst, Options::default()).unwrap();
    c.check().unwrap();
    let (before, after) = (db.stats(), c.stats());
    assert_eq!(after.keys, 2_000);
    assert!(
        after.high_water * 5 < before.high_water,
        "{before:?} -> {after:?}"
    );
    assert!(
        before.free_pages + before.pending_pages > 1000,
        "the source was not fragmented: {before:?}"
    );
}

/// Many overwrites of the same keys in one transaction: an edited node reclaims the bytes of
/// replaced values, and what it keeps is the last value of each key.
#[test]
fn repeated_overwrites_in_one_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path().join("db"), Options::default()).unwrap();
    let mut w = db.begin_write().unwrap();
    let mut b = w.create_bucket(b"b").unwrap();
    // The value `round` writes to key `k`: its size varies, so replaced bytes never fit in place.
    let value = |round: u32, k: u8| {
        vec![(round % 251) as u8; 100 + (round as usize * 13 + k as usize) % 800]
    };
    for round in 0..5_000u32 {
        for k in 0..4u8 {
            let v = value(round, k);
            b.put(&[k], &v).unwrap();
            assert_eq!(b.get(&[k]).unwrap(), Some(&v[..]));
        }
    }
    w.commit().unwrap();
    db.check().unwrap();
    let r = db.begin_read().unwrap();
    let b = r.bucket(b"b").unwrap();
    for k in 0..4u8 {
        let want = value(4_999, k);
        assert_eq!(b.get(&[k]).unwrap(), Some(&want[..]));
    }
}
