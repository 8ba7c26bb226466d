//! Store behaviour pinned to etcd 3.6.5: hashes, errors, restart, compaction.

use api::etcdserverpb::{
    compare, request_op, Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp,
    TxnRequest,
};
use ids::{MemberId, RaftIndex, Revision};
use mvcc::{Applied, Error, Store, StoreOptions};

fn put(k: &str, v: &str) -> PutRequest {
    PutRequest {
        key: k.into(),
        value: v.into(),
        ..Default::default()
    }
}

fn get(k: &str) -> RangeRequest {
    RangeRequest {
        key: k.into(),
        ..Default::default()
    }
}

fn all_at(rev: i64) -> RangeRequest {
    RangeRequest {
        key: vec![0],
        range_end: vec![0],
        revision: rev,
        ..Default::default()
    }
}

fn open(dir: &tempfile::TempDir) -> Store {
    Store::open(dir.path().join("db"), StoreOptions::default()).unwrap()
}

/// The expected hashes are what etcd 3.6.5 answered (`etcdctl endpoint hashkv`) after the same
/// requests: put a=1, put b=2, put a=3, del b, txn{put c=x, put d=y}, compaction 4, put a=4,
/// compaction 5. Stored bytes and the hash walk are etcd's, so the values must agree exactly.
#[test]
fn hash_kv_equals_etcds() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let mut w = store.write().unwrap();
    w.put(&put("a", "1")).unwrap();
    w.put(&put("b", "2")).unwrap();
    w.put(&put("a", "3")).unwrap();
    w.delete_range(&DeleteRangeRequest {
        key: "b".into(),
        ..Default::default()
    })
    .unwrap();
    let op = |k: &str, v: &str| RequestOp {
        request: Some(request_op::Request::RequestPut(put(k, v))),
    };
    let t = TxnRequest {
        compare: vec![],
        success: vec![op("c", "x"), op("d", "y")],
        failure: vec![],
    };
    w.txn(&t).unwrap();
    drop(w);
    let h = store.hash_kv(Revision(0)).unwrap();
    assert_eq!(
        (h.hash, h.compact_revision.0, h.hash_revision.0, h.current.0),
        (1848509990, -1, 6, 6)
    );
    assert_eq!(store.hash_kv(Revision(3)).unwrap().hash, 1827592406);
    let at_4 = store.hash_kv(Revision(4)).unwrap();

    store.write().unwrap().compact(Revision(4)).unwrap();
    assert_eq!(store.hash_kv(Revision(0)).unwrap().hash, 3235463707);
    store.wait_compaction(Revision(4)).unwrap();
    assert_eq!(
        store.hash_kv(Revision(0)).unwrap().hash,
        3235463707,
        "physical compaction changes nothing"
    );
    // As etcd's: at a compaction's revision, the hash that compaction took of the history it
    // walked (as it was before, from the previous compaction on) — until a restart.
    assert_eq!(store.hash_kv(Revision(4)).unwrap(), at_4);

    let mut w = store.write().unwrap();
    w.put(&put("a", "4")).unwrap();
    w.compact(Revision(5)).unwrap();
    drop(w);
    let h = store.hash_kv(Revision(0)).unwrap();
    assert_eq!(
        (h.hash, h.compact_revision.0, h.hash_revision.0),
        (440101006, 5, 7)
    );
    assert!(matches!(store.hash_kv(Revision(3)), Err(Error::Compacted)));
    assert!(matches!(store.hash_kv(Revision(8)), Err(Error::FutureRev)));
    store.wait_compaction(Revision(5)).unwrap();
    let kept = store.hash_kv(Revision(4)).unwrap();
    assert_eq!(
        (
            kept.hash,
            kept.compact_revision.0,
            kept.hash_revision.0,
            kept.current.0
        ),
        (at_4.hash, -1, 4, 7),
        "below the compaction revision, a compaction's kept hash still answers"
    );
    store.close().unwrap();
    let store = open(&dir);
    assert!(
        matches!(store.hash_kv(Revision(4)), Err(Error::Compacted)),
        "the kept hashes do not outlive the process"
    );
}

#[test]
fn bad_input_gets_etcds_errors_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    store.write().unwrap().put(&put("a", "1")).unwrap();
    store.write().unwrap().put(&put("c", "3")).unwrap();
    let before = store.hash_kv(Revision(0)).unwrap();
    let mut w = store.write().unwrap();
    assert!(matches!(w.put(&put("", "x")), Err(Error::EmptyKey)));
    assert!(matches!(w.range(&get("")), Err(Error::EmptyKey)));
    assert!(matches!(
        w.delete_range(&DeleteRangeRequest::default()),
        Err(Error::EmptyKey)
    ));
    let ignore = PutRequest {
        key: "zz".into(),
        ignore_value: true,
        ..Default::default()
    };
    assert!(matches!(w.put(&ignore), Err(Error::KeyNotFound)));
    let leased = PutRequest {
        key: "a".into(),
        lease: 42,
        ..Default::default()
    };
    assert!(matches!(w.put(&leased), Err(Error::LeaseNotFound)));
    let empty_compare = TxnRequest {
        compare: vec![Compare {
            key: vec![],
            ..Default::default()
        }],
        ..Default::default()
    };
    assert!(matches!(w.txn(&empty_compare), Err(Error::EmptyKey)));
    // A put with a missing lease inside a txn fails the whole txn before anything is written.
    let t = TxnRequest {
        success: vec![
            RequestOp {
                request: Some(request_op::Request::RequestPut(put("b", "2"))),
            },
            RequestOp {
                request: Some(request_op::Request::RequestPut(leased.clone())),
            },
        ],
        ..Default::default()
    };
    assert!(matches!(w.txn(&t), Err(Error::LeaseNotFound)));
    // range_end below key: an empty answer (etcd: `get c a` and `del c a` answer nothing).
    let backwards = RangeRequest {
        key: "c".into(),
        range_end: "a".into(),
        ..Default::default()
    };
    let r = w.range(&backwards).unwrap();
    assert_eq!(
        (r.kvs.len(), r.count, r.header.unwrap().revision),
        (0, 0, 3)
    );
    let d = w
        .delete_range(&DeleteRangeRequest {
            key: "c".into(),
            range_end: "a".into(),
            ..Default::default()
        })
        .unwrap();
    assert_eq!((d.deleted, d.header.unwrap().revision), (0, 3));
    drop(w);
    let mut snap = store.read().unwrap();
    assert!(matches!(
        snap.range(&RangeRequest {
            revision: 9,
            ..get("a")
        }),
        Err(Error::FutureRev)
    ));
    assert!(matches!(
        store.write().unwrap().compact(Revision(9)),
        Err(Error::FutureRev)
    ));
    assert_eq!(
        store.hash_kv(Revision(0)).unwrap(),
        before,
        "nothing changed"
    );
    store.write().unwrap().compact(Revision(3)).unwrap();
    assert!(matches!(
        store.write().unwrap().compact(Revision(3)),
        Err(Error::Compacted)
    ));
    let mut snap = store.read().unwrap();
    assert!(matches!(
        snap.range(&RangeRequest {
            revision: 2,
            ..get("a")
        }),
        Err(Error::Compacted)
    ));
    assert_eq!(
        snap.range(&RangeRequest {
            revision: 3,
            ..get("a")
        })
        .unwrap()
        .kvs
        .len(),
        1
    );
}

#[test]
fn compare_semantics_on_missing_keys() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let cmp = |target: compare::CompareTarget,
               result: compare::CompareResult,
               u: compare::TargetUnion| Compare {
        key: "missing".into(),
        target: target as i32,
        result: result as i32,
        target_union: Some(u),
        ..Default::default()
    };
    let run = |c: Compare| {
        store
            .write()
            .unwrap()
            .txn(&TxnRequest {
                compare: vec![c],
                ..Default::default()
            })
            .unwrap()
            .succeeded
    };
    use compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
    // A missing key has version, create and mod revision 0 ...
    assert!(run(cmp(T::Version, R::Equal, U::Version(0))));
    assert!(run(cmp(T::Create, R::Equal, U::CreateRevision(0))));
    // ... but any value compare on it fails, even `!= "x"`.
    assert!(!run(cmp(T::Value, R::NotEqual, U::Value(b"x".to_vec()))));
    assert!(!run(cmp(T::Value, R::Equal, U::Value(vec![]))));
}

#[test]
fn restart_preserves_history_compaction_and_applied_index() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let mut w = store.write().unwrap();
    for i in 0..50 {
        w.put(&put(&format!("k{}", i % 7), &i.to_string())).unwrap();
        if i % 9 == 0 {
            w.delete_range(&DeleteRangeRequest {
                key: "k3".into(),
                ..Default::default()
            })
            .unwrap();
        }
    }
    w.compact(Revision(20)).unwrap();
    w.set_applied(Applied {
        index: RaftIndex(77),
        term: 3,
    });
    drop(w);
    let rev = store.rev().0;
    let reads: Vec<_> = (20..=rev)
        .map(|r| store.read().unwrap().range(&all_at(r)).unwrap())
        .collect();
    let hash = store.hash_kv(Revision(0)).unwrap();
    store.close().unwrap();

    let store = open(&dir);
    assert_eq!(store.rev().0, rev);
    assert_eq!(store.compacted(), Revision(20));
    assert_eq!(
        store.applied(),
        Applied {
            index: RaftIndex(77),
            term: 3
        }
    );
    assert_eq!(store.hash_kv(Revision(0)).unwrap(), hash);
    for (r, want) in (20..=rev).zip(reads) {
        assert_eq!(
            store.read().unwrap().range(&all_at(r)).unwrap(),
            want,
            "revision {r}"
        );
    }
    assert!(matches!(
        store.read().unwrap().range(&all_at(19)),
        Err(Error::Compacted)
    ));
}

/// A compaction whose physical part was cut short by a close resumes on open and completes,
/// removing exactly what it should.
#[test]
fn interrupted_compaction_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        compaction_batch: 1,
        ..Default::default()
    };
    let path = dir.path().join("db");
    let store = Store::open(&path, opts.clone()).unwrap();
    let mut w = store.write().unwrap();
    for i in 0..200 {
        w.put(&put(&format!("k{}", i % 10), &i.to_string()))
            .unwrap();
    }
    w.compact(Revision(150)).unwrap();
    drop(w);
    let want: Vec<_> = (150..=201)
        .map(|r| store.read().unwrap().range(&all_at(r)).unwrap())
        .collect();
    store.close().unwrap(); // one flush: the compaction is scheduled, one step done at most
    let store = Store::open(&path, opts).unwrap();
    store.wait_compaction(Revision(150)).unwrap();
    store.flush().unwrap();
    for (r, want) in (150..=201).zip(want) {
        assert_eq!(
            store.read().unwrap().range(&all_at(r)).unwrap(),
            want,
            "revision {r}"
        );
    }
    let hash = store.hash_kv(Revision(0)).unwrap();
    store.close().unwrap();
    // After a reopen the index is rebuilt from what physical compaction left: 10 kept
    // revisions at or below 150 plus the 51 after it.
    let store = Store::open(&path, StoreOptions::default()).unwrap();
    assert_eq!(store.hash_kv(Revision(0)).unwrap(), hash);
    let mut n = 0;
    store.read().unwrap().for_each_revision(|_| n += 1).unwrap();
    assert_eq!(n, 10 + 51);
}

/// etcd 3.6.5 answered 4172735989 (`etcdctl endpoint hashkv`, at revision 11) after these
/// requests and `compaction 3`, whether or not its compaction had finished; so must kvd, before
/// and after its own (background) compaction has run.
#[test]
fn hash_kv_right_after_compaction_equals_etcds() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let mut w = store.write().unwrap();
    let del = |k: &str, end: &str| DeleteRangeRequest {
        key: k.into(),
        range_end: end.into(),
        ..Default::default()
    };
    for (k, v) in [
        ("foo", "bar"),
        ("foo", "baz"),
        ("foo1", "one"),
        ("foo2", "two"),
        ("zed", "last"),
    ] {
        w.put(&put(k, v)).unwrap();
    }
    w.put(&PutRequest {
        key: "foo1".into(),
        ignore_value: true,
        ..Default::default()
    })
    .unwrap();
    w.delete_range(&del("foo2", "")).unwrap();
    w.delete_range(&del("foo", "fop")).unwrap();
    w.put(&put("zed", "new")).unwrap();
    w.delete_range(&del("zed", "")).unwrap();
    drop(w);
    assert_eq!(store.rev(), Revision(11));
    store.write().unwrap().compact(Revision(3)).unwrap();
    assert_eq!(
        store.hash_kv(Revision(0)).unwrap().hash,
        4172735989,
        "before the compaction ran"
    );
    store.wait_compaction(Revision(3)).unwrap();
    assert_eq!(
        store.hash_kv(Revision(0)).unwrap().hash,
        4172735989,
        "after it ran"
    );
}

/// Defragmentation shrinks the file while a reader holds an older view and a writer keeps
/// writing; afterwards every revision reads as before, the writes made meanwhile are there, and
/// a reopen finds the same store.
#[test]
fn defragment_shrinks_the_file_while_reads_and_writes_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(open(&dir));
    let big = "v".repeat(2000);
    {
        let mut w = store.write().unwrap();
        for i in 0..3000 {
            w.put(&put(&format!("k{i:05}"), &big)).unwrap();
        }
        for i in 0..3000 {
            if i % 10 != 0 {
                w.delete_range(&DeleteRangeRequest {
                    key: format!("k{i:05}").into(),
                    ..Default::default()
                })
                .unwrap();
            }
        }
        // 3000 puts and 2700 deletes after revision 1: compact all of it.
        w.compact(Revision(5701)).unwrap();
    }
    store.sync().unwrap();
    store.wait_compaction(Revision(5701)).unwrap();
    // A write past the compaction: the hash compared below is then one computed from what the
    // store holds (at the compacted revision itself HashKV answers, as etcd's does, the hash
    // the compaction kept in memory, which a reopen forgets).
    store.write().unwrap().put(&put("after", "x")).unwrap();
    store.sync().unwrap();
    let rev = store.rev().0;
    assert_eq!(rev, 5702);
    let before_reads = store.read().unwrap().range(&all_at(rev)).unwrap().kvs;
    let hash = store.hash_kv(Revision(rev)).unwrap();
    let mut held = store.read().unwrap();

    let writer = {
        let store = store.clone();
        std::thread::spawn(move || {
            for i in 0..500 {
                let mut w = store.write().unwrap();
                w.put(&put(&format!("during{i:03}"), "x")).unwrap();
            }
        })
    };
    let d = store.defragment().unwrap();
    writer.join().unwrap();
    assert!(
        d.after * 3 < d.before,
        "defragmenting {} bytes left {}",
        d.before,
        d.after
    );
    assert_eq!(store.db().file_size(), d.after);

    // The view taken before reads on, from the old file.
    // (Compared without printing: the values are large.)
    assert!(held.range(&all_at(rev)).unwrap().kvs == before_reads);
    drop(held);
    assert!(store.read().unwrap().range(&all_at(rev)).unwrap().kvs == before_reads);
    assert_eq!(store.hash_kv(Revision(rev)).unwrap().hash, hash.hash);
    let during = RangeRequest {
        key: "during".into(),
        range_end: "durinh".into(),
        count_only: true,
        ..Default::default()
    };
    assert_eq!(store.read().unwrap().range(&during).unwrap().count, 500);
    store.sync().unwrap();
    let after_rev = store.rev().0;
    let all = store.read().unwrap().range(&all_at(after_rev)).unwrap().kvs;
    drop(store);

    let store = open(&dir);
    assert_eq!(store.rev().0, after_rev);
    assert!(store.read().unwrap().range(&all_at(after_rev)).unwrap().kvs == all);
    assert_eq!(store.hash_kv(Revision(rev)).unwrap().hash, hash.hash);
    assert!(!dir.path().join("db.defrag").exists());
}

/// The copy of a defragmentation does not hold flushes off: a writer flushing after each put
/// gets flushes done while it runs, and every write made meanwhile is in the new file.
#[test]
fn flushes_go_on_while_a_defragmentation_copies() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(open(&dir));
    let big = "v".repeat(4000);
    {
        let mut w = store.write().unwrap();
        for i in 0..6000 {
            w.put(&put(&format!("k{i:05}"), &big)).unwrap();
        }
    }
    store.sync().unwrap();
    let copying = std::sync::Arc::new(AtomicBool::new(true));
    let flushed_during = std::sync::Arc::new(AtomicUsize::new(0));
    let writer = {
        let (store, copying, flushed_during) =
            (store.clone(), copying.clone(), flushed_during.clone());
        std::thread::spawn(move || {
            let mut i = 0;
            while copying.load(Ordering::SeqCst) {
                store
                    .write()
                    .unwrap()
                    .put(&put(&format!("during{i:05}"), "x"))
                    .unwrap();
                store.flush().unwrap();
                if copying.load(Ordering::SeqCst) {
                    flushed_during.fetch_add(1, Ordering::SeqCst);
                }
                i += 1;
            }
            i
        })
    };
    store.defragment().unwrap();
    copying.store(false, Ordering::SeqCst);
    let puts = writer.join().unwrap();
    let flushed = flushed_during.load(Ordering::SeqCst);
    assert!(
        flushed >= 3,
        "{flushed} flushes finished during the defragmentation"
    );
    store.sync().unwrap();
    let rev = store.rev().0;
    let all = store.read().unwrap().range(&all_at(rev)).unwrap().kvs;
    assert_eq!(all.len(), 6000 + puts);
    drop(store);
    let store = open(&dir);
    assert!(store.read().unwrap().range(&all_at(rev)).unwrap().kvs == all);
}

/// Flushes that are not durable by choice still sync every few MiB, so the pages compaction
/// frees are reused: 64 MiB of overwrites of 2 MiB of live data, compacted as they go, leave a
/// file smaller than what was written (41 MiB here; without the periodic sync nothing freed
/// is reused until a snapshot syncs the store, and the file grew to 82 MiB).
#[test]
fn unsynced_flushes_still_let_freed_pages_be_reused() {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        durable_flush: false,
        ..Default::default()
    };
    let store = Store::open(dir.path().join("db"), opts).unwrap();
    let value = "v".repeat(16 << 10);
    for round in 0..32 {
        let rev = {
            let mut w = store.write().unwrap();
            for i in 0..128 {
                w.put(&put(&format!("k{i:03}"), &value)).unwrap();
            }
            let rev = store.rev();
            if round > 0 {
                w.compact(rev).unwrap();
            }
            rev
        };
        store.flush().unwrap();
        if round > 0 {
            store.wait_compaction(rev).unwrap();
            store.flush().unwrap();
        }
    }
    let size = store.db().file_size();
    assert!(
        size < 60 << 20,
        "the file grew to {size} bytes for 2 MiB of live data"
    );
}

/// Alarms persist with the flush that carries them: raised ones survive a reopen, cleared ones
/// stay cleared.
#[test]
fn alarms_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    {
        let mut w = store.write().unwrap();
        assert!(w.alarm(MemberId(7), 1, true));
        assert!(!w.alarm(MemberId(7), 1, true), "already raised");
        assert!(w.alarm(MemberId(9), 2, true));
        assert!(!w.alarm(MemberId(9), 1, false), "never raised");
    }
    store.close().unwrap();
    let store = open(&dir);
    assert_eq!(store.alarms(), [(MemberId(7), 1), (MemberId(9), 2)]);
    assert!(store.write().unwrap().alarm(MemberId(7), 1, false));
    store.close().unwrap();
    assert_eq!(open(&dir).alarms(), [(MemberId(9), 2)]);
}

/// Found by the `store_model` fuzz target: a txn deletes a range holding key `d` and puts `d`
/// again (revision 3: the tombstone 3.0, the put 3.2), then a compaction at 3. The compaction
/// kept the tombstone's generation and dropped the put's revision from the store while the
/// index still pointed at it ("revision 3.2 is in the index but not stored"). etcd 3.6.5 does
/// the same and dies on its next read of `d` ("range failed to find revision pair"). The put
/// is the newest revision of `d` at 3: it must survive the compaction, a flush and a reopen.
#[test]
fn a_key_deleted_and_put_again_in_one_txn_survives_compaction_at_that_revision() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let opts = StoreOptions {
        compaction_batch: 2,
        ..Default::default()
    };
    let store = Store::open(&path, opts.clone()).unwrap();
    let mut w = store.write().unwrap();
    w.put(&put("d", "old")).unwrap();
    let op = |r| RequestOp { request: Some(r) };
    w.txn(&TxnRequest {
        compare: vec![],
        success: vec![
            op(request_op::Request::RequestDeleteRange(
                DeleteRangeRequest {
                    key: b"a".to_vec(),
                    range_end: vec![0],
                    prev_kv: false,
                },
            )),
            op(request_op::Request::RequestPut(put("a", ""))),
            op(request_op::Request::RequestPut(put("d", "new"))),
        ],
        failure: vec![],
    })
    .unwrap();
    w.compact(Revision(3)).unwrap();
    for _ in 0..30 {
        w.put(&put("a", "")).unwrap();
    }
    drop(w);
    let read = |s: &Store| {
        let r = s.read().unwrap().range(&get("d")).unwrap();
        assert_eq!(r.kvs.len(), 1);
        (
            r.kvs[0].value.clone(),
            r.kvs[0].mod_revision,
            r.kvs[0].version,
        )
    };
    store.wait_compaction(Revision(3)).unwrap();
    store.flush().unwrap();
    assert_eq!(read(&store), (b"new".to_vec(), 3, 1));
    let at3 = store.read().unwrap().range(&all_at(3)).unwrap();
    assert_eq!(at3.kvs.len(), 2, "a and d live at 3");
    store.close().unwrap();
    let store = Store::open(&path, opts).unwrap();
    assert_eq!(read(&store), (b"new".to_vec(), 3, 1));
    store.close().unwrap();
}
