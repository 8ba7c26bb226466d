//! A store written out as etcd's data file and read back in: every revision, lease, user,
//! role, alarm, compaction and the downgrade job kept; what is not etcd's refused; files kvd
//! wrote before it kept etcd's forms still open.

use std::collections::BTreeMap;

use api::authpb::{Permission, Role, User};
use api::etcdserverpb::{DeleteRangeRequest, DowngradeInfo, PutRequest, RangeRequest};
use ids::{LeaseId, MemberId, Revision};
use mvcc::etcd_file::{finish_restore, import, EtcdMeta};
use mvcc::{Store, StoreOptions};

fn put(k: &str, v: &str, lease: i64) -> PutRequest {
    PutRequest {
        key: k.into(),
        value: v.into(),
        lease,
        ..Default::default()
    }
}

fn all() -> RangeRequest {
    RangeRequest {
        key: vec![0],
        range_end: vec![0],
        ..Default::default()
    }
}

/// A store with history, a compaction, leases, auth, an alarm and a downgrade job.
fn busy_store(path: &std::path::Path) -> Store {
    let store = Store::open(path, StoreOptions::default()).unwrap();
    let mut w = store.write().unwrap();
    w.lease_grant(LeaseId(0x1234), 600).unwrap();
    w.lease_checkpoint(LeaseId(0x1234), 300).unwrap();
    w.lease_grant(LeaseId(-5), 60).unwrap();
    for i in 0..300 {
        w.put(&put(&format!("k{:03}", i % 120), &format!("v{i}"), 0))
            .unwrap();
    }
    w.put(&put("leased", "x", 0x1234)).unwrap();
    w.delete_range(&DeleteRangeRequest {
        key: b"k005".to_vec(),
        ..Default::default()
    })
    .unwrap();
    w.compact(Revision(150)).unwrap();
    w.put(&put("big", &"b".repeat(100_000), 0)).unwrap();
    w.auth_put_user(User {
        name: b"root".to_vec(),
        password: b"hash".to_vec(),
        roles: vec!["root".into()],
        ..Default::default()
    });
    w.auth_put_role(Role {
        name: b"reader".to_vec(),
        key_permission: vec![Permission {
            perm_type: 0,
            key: b"a".to_vec(),
            range_end: b"b".to_vec(),
        }],
    });
    w.auth_set_enabled(true);
    w.alarm(MemberId(42), 1, true);
    w.set_downgrade(DowngradeInfo {
        enabled: true,
        target_version: "3.5.0".into(),
    });
    w.set_cluster_version("3.6.0");
    drop(w);
    store.flush().unwrap();
    store
}

fn same_state(a: &Store, b: &Store) {
    assert_eq!(a.rev(), b.rev());
    assert_eq!(a.compacted(), b.compacted());
    assert_eq!(
        a.read().unwrap().range(&all()).unwrap().kvs,
        b.read().unwrap().range(&all()).unwrap().kvs
    );
    let old = RangeRequest {
        revision: 200,
        ..all()
    };
    assert_eq!(
        a.read().unwrap().range(&old).unwrap().kvs,
        b.read().unwrap().range(&old).unwrap().kvs,
        "history kept"
    );
    assert_eq!(a.leases().leases, b.leases().leases);
    for id in [0x1234, -5] {
        let ttl = |s: &Store| {
            let r = s.lease_time_to_live(LeaseId(id), true, std::time::Instant::now());
            (r.granted_ttl, r.keys)
        };
        assert_eq!(ttl(a), ttl(b), "lease {id}");
    }
    assert_eq!(
        a.hash_kv(Revision(0)).unwrap(),
        b.hash_kv(Revision(0)).unwrap()
    );
    assert_eq!(
        a.hash_kv(Revision(200)).unwrap(),
        b.hash_kv(Revision(200)).unwrap()
    );
    assert_eq!(*a.auth(), *b.auth());
    assert_eq!(a.alarms(), b.alarms());
    assert_eq!(a.downgrade(), b.downgrade());
    assert_eq!(a.cluster_version(), b.cluster_version());
}

fn etcd_meta() -> EtcdMeta {
    EtcdMeta {
        members: [(
            b"2a".to_vec(),
            br#"{"id":42,"peerURLs":["http://a:2380"],"name":"a"}"#.to_vec(),
        )]
        .into_iter()
        .collect(),
        conf_state: Some(br#"{"voters":[42],"auto_leave":false}"#.to_vec()),
        storage_version: Some("3.6.0".into()),
        cluster_version: Some("3.6.0".into()),
        ..Default::default()
    }
}

#[test]
fn a_store_goes_out_as_etcds_file_and_back_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let src = busy_store(&dir.path().join("src"));
    let file = src.etcd_file(&etcd_meta()).unwrap();
    let path = dir.path().join("etcd.db");
    let mut out = std::fs::File::create(&path).unwrap();
    file.write_to(&mut out).unwrap();
    drop(out);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), file.size());

    let db = bbolt::Db::open(&path).unwrap();
    db.check().unwrap();
    let names: Vec<String> = db
        .buckets()
        .unwrap()
        .into_iter()
        .map(|(n, _)| String::from_utf8(n).unwrap())
        .collect();
    assert_eq!(
        names,
        mvcc::etcd_file::ETCD_BUCKETS,
        "every bucket etcd has"
    );
    let meta = db.bucket(b"meta").unwrap().unwrap();
    assert_eq!(
        db.get(&meta, b"storageVersion").unwrap(),
        Some(b"3.6.0".to_vec())
    );
    assert_eq!(
        db.get(&meta, b"finishedCompactRev")
            .unwrap()
            .map(|v| v.len()),
        Some(17),
        "a compaction revision is a revision key"
    );

    let dst = dir.path().join("dst");
    let got = import(&db, &dst).unwrap();
    assert_eq!(got.etcd, etcd_meta());
    let back = Store::open(&dst, StoreOptions::default()).unwrap();
    same_state(&src, &back);

    // And out again: the same bytes.
    let again = dir.path().join("again.db");
    back.etcd_file(&etcd_meta())
        .unwrap()
        .write_to(&mut std::fs::File::create(&again).unwrap())
        .unwrap();
    assert_eq!(
        std::fs::read(&path).unwrap(),
        std::fs::read(&again).unwrap()
    );
}

#[test]
fn bump_revision_marks_everything_before_compacted() {
    let dir = tempfile::tempdir().unwrap();
    let src = busy_store(&dir.path().join("src"));
    let path = dir.path().join("etcd.db");
    src.etcd_file(&EtcdMeta::default())
        .unwrap()
        .write_to(&mut std::fs::File::create(&path).unwrap())
        .unwrap();
    let db = bbolt::Db::open(&path).unwrap();
    let dst = dir.path().join("dst");
    import(&db, &dst).unwrap();
    assert_eq!(
        finish_restore(&dst, 1000).unwrap(),
        Some(src.rev().0 + 1000)
    );
    let back = Store::open(&dst, StoreOptions::default()).unwrap();
    let want = src.rev().0 + 1000;
    assert_eq!(back.rev(), Revision(want));
    assert_eq!(back.compacted(), Revision(want));
    assert_eq!(
        back.read().unwrap().range(&all()).unwrap().kvs,
        src.read().unwrap().range(&all()).unwrap().kvs,
        "every key as it was"
    );
    let r = back.write().unwrap().put(&put("after", "x", 0)).unwrap();
    assert_eq!(r.header.unwrap().revision, want + 1);
}

#[test]
fn a_bbolt_file_that_is_not_etcds_is_refused_and_nothing_is_left() {
    let dir = tempfile::tempdir().unwrap();
    type Buckets = Vec<(&'static str, Vec<(&'static [u8], &'static [u8])>)>;
    let cases: [(&str, Buckets, &str); 4] = [
        (
            "foreign bucket",
            vec![("key", vec![]), ("zzz", vec![])],
            "bucket \"zzz\"",
        ),
        ("no key bucket", vec![("meta", vec![])], "no key bucket"),
        (
            "odd key",
            vec![("key", vec![(b"not-a-revision", b"")])],
            "is not a revision",
        ),
        (
            "odd meta",
            vec![("key", vec![]), ("meta", vec![(b"mystery", b"1")])],
            "\"mystery\"",
        ),
    ];
    for (what, buckets, says) in cases {
        let path = dir.path().join(format!("{what}.db"));
        let mut feed = |s: &mut bbolt::Sink<'_>| -> Result<(), bbolt::Error> {
            for (name, kvs) in &buckets {
                s.bucket(name.as_bytes())?;
                for (k, v) in kvs {
                    s.put(k, v)?;
                }
            }
            Ok(())
        };
        let layout = bbolt::plan(4096, &mut feed).unwrap();
        bbolt::write(
            &layout,
            &mut std::fs::File::create(&path).unwrap(),
            &mut feed,
        )
        .unwrap();
        let db = bbolt::Db::open(&path).unwrap();
        let dst = dir.path().join(format!("{what}.out"));
        let err = import(&db, &dst).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(says) && msg.contains("not etcd's data"),
            "{what}: {msg}"
        );
        assert!(
            msg.contains(&path.display().to_string()),
            "{what}: names the file: {msg}"
        );
        assert!(!dst.exists(), "{what}: nothing left behind");
    }
}

/// A pager file as kvd wrote it before it kept etcd's forms: leases as 16 bytes, compaction
/// revisions as 8, the downgrade job in the meta bucket.
#[test]
fn a_file_in_kvds_earlier_forms_opens_as_it_did() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let want = busy_store(&path);
    let (rev, compacted, leases, down) = (
        want.rev(),
        want.compacted(),
        want.leases().leases,
        want.downgrade(),
    );
    want.close().unwrap();
    {
        let db = pager::Db::open(&path, pager::Options::default()).unwrap();
        let mut tx = db.begin_write().unwrap();
        let mut old_leases = BTreeMap::new();
        for e in tx
            .bucket(b"lease")
            .unwrap()
            .range::<std::ops::RangeFull>(..)
        {
            let (k, v) = e.unwrap();
            let l: api::leasepb::Lease = prost::Message::decode(v).unwrap();
            let mut b = l.ttl.to_be_bytes().to_vec();
            b.extend_from_slice(&l.remaining_ttl.to_be_bytes());
            old_leases.insert(k.to_vec(), b);
        }
        let mut lb = tx.bucket(b"lease").unwrap();
        for (k, v) in &old_leases {
            lb.put(k, v).unwrap();
        }
        let mut meta = tx.bucket(b"meta").unwrap();
        for k in [&b"finishedCompactRev"[..], b"scheduledCompactRev"] {
            meta.put(k, &compacted.0.to_be_bytes()).unwrap();
        }
        meta.put(b"downgrade", &prost::Message::encode_to_vec(&down))
            .unwrap();
        tx.bucket(b"cluster").unwrap().delete(b"downgrade").unwrap();
        tx.commit().unwrap();
        db.close().unwrap();
    }
    let back = Store::open(&path, StoreOptions::default()).unwrap();
    assert_eq!(back.rev(), rev);
    assert_eq!(back.compacted(), compacted);
    assert_eq!(back.leases().leases, leases);
    assert_eq!(
        back.lease_time_to_live(LeaseId(0x1234), false, std::time::Instant::now())
            .granted_ttl,
        600
    );
    assert_eq!(back.downgrade(), down);
}
