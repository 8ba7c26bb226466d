//! Leases: grant, attach, revoke, persistence and expiry reporting (with an explicit clock).

use std::time::{Duration, Instant};

use api::etcdserverpb::{PutRequest, RangeRequest};
use ids::LeaseId;
use mvcc::{Error, Store, StoreOptions};

fn put(k: &str, lease: i64) -> PutRequest {
    PutRequest {
        key: k.into(),
        value: b"v".to_vec(),
        lease,
        ..Default::default()
    }
}

fn keys(store: &Store) -> Vec<String> {
    let all = RangeRequest {
        key: vec![0],
        range_end: vec![0],
        ..Default::default()
    };
    let r = store.read().unwrap().range(&all).unwrap();
    r.kvs
        .into_iter()
        .map(|kv| String::from_utf8(kv.key).unwrap())
        .collect()
}

#[test]
fn grant_attach_revoke() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("db"), StoreOptions::default()).unwrap();
    let mut w = store.write().unwrap();
    assert_eq!(
        w.lease_grant(LeaseId(7), 1).unwrap().ttl,
        2,
        "raised to the minimum TTL"
    );
    assert!(matches!(
        w.lease_grant(LeaseId(7), 10),
        Err(Error::LeaseExists)
    ));
    assert!(matches!(
        w.lease_grant(LeaseId(8), mvcc::lease::MAX_LEASE_TTL + 1),
        Err(Error::LeaseTtlTooLarge)
    ));
    w.lease_grant(LeaseId(9), 60).unwrap();
    w.put(&put("a", 7)).unwrap();
    w.put(&put("b", 7)).unwrap();
    w.put(&put("c", 9)).unwrap();
    w.put(&put("d", 7)).unwrap();
    w.put(&put("d", 0)).unwrap(); // re-put without a lease: detached
    drop(w);
    let ttl = store.lease_time_to_live(LeaseId(7), true, Instant::now());
    assert_eq!(
        (ttl.granted_ttl, ttl.keys),
        (2, vec![b"a".to_vec(), b"b".to_vec()])
    );
    assert_eq!(
        store
            .lease_time_to_live(LeaseId(99), false, Instant::now())
            .ttl,
        -1
    );
    let rev = store.rev().0;
    let resp = store.write().unwrap().lease_revoke(LeaseId(7)).unwrap();
    assert_eq!(
        resp.header.unwrap().revision,
        rev + 1,
        "both keys go in one revision"
    );
    assert_eq!(keys(&store), ["c", "d"]);
    assert!(matches!(
        store.write().unwrap().put(&put("e", 7)),
        Err(Error::LeaseNotFound)
    ));
    assert!(matches!(
        store.write().unwrap().lease_revoke(LeaseId(7)),
        Err(Error::LeaseNotFound)
    ));
    let ids: Vec<i64> = store.leases().leases.iter().map(|l| l.id).collect();
    assert_eq!(ids, [9]);
}

#[test]
fn leases_and_attachments_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let store = Store::open(&path, StoreOptions::default()).unwrap();
    let mut w = store.write().unwrap();
    w.lease_grant(LeaseId(1), 30).unwrap();
    w.lease_grant(LeaseId(2), 30).unwrap();
    w.put(&put("x", 1)).unwrap();
    w.put(&put("y", 2)).unwrap();
    w.lease_revoke(LeaseId(2)).unwrap();
    w.lease_checkpoint(LeaseId(1), 12).unwrap();
    drop(w);
    store.close().unwrap();

    let store = Store::open(&path, StoreOptions::default()).unwrap();
    let ids: Vec<i64> = store.leases().leases.iter().map(|l| l.id).collect();
    assert_eq!(ids, [1]);
    assert_eq!(
        store
            .lease_time_to_live(LeaseId(1), true, Instant::now())
            .keys,
        vec![b"x".to_vec()]
    );
    // A new primary restarts the clock from the checkpointed remaining TTL.
    let now = Instant::now();
    store.lease_promote(now, Duration::ZERO);
    assert_eq!(store.lease_time_to_live(LeaseId(1), false, now).ttl, 12);
    // Renewing restarts from the full TTL and tells the caller to clear the checkpoint.
    let r = store.lease_renew(LeaseId(1), now).unwrap();
    assert_eq!((r.ttl, r.checkpointed), (30, true));
    assert_eq!(store.lease_time_to_live(LeaseId(1), false, now).ttl, 30);
    store
        .write()
        .unwrap()
        .lease_checkpoint(LeaseId(1), 0)
        .unwrap();
    assert!(!store.lease_renew(LeaseId(1), now).unwrap().checkpointed);
    store.write().unwrap().lease_revoke(LeaseId(1)).unwrap();
    assert!(keys(&store).is_empty());
}

#[test]
fn expiry_is_reported_by_the_primary_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("db"), StoreOptions::default()).unwrap();
    store.write().unwrap().lease_grant(LeaseId(5), 10).unwrap();
    store.write().unwrap().lease_grant(LeaseId(6), 100).unwrap();
    let t0 = Instant::now();
    assert!(
        store
            .expired_leases(t0 + Duration::from_secs(1000), 10)
            .is_empty(),
        "not primary"
    );
    store.lease_promote(t0, Duration::from_secs(1));
    assert!(
        store
            .expired_leases(t0 + Duration::from_secs(10), 10)
            .is_empty(),
        "extended by 1 s"
    );
    assert_eq!(
        store.expired_leases(t0 + Duration::from_secs(11), 10),
        [LeaseId(5)]
    );
    // A renewal restarts the clock.
    assert_eq!(
        store
            .lease_renew(LeaseId(6), t0 + Duration::from_secs(50))
            .unwrap(),
        mvcc::lease::Renewed {
            ttl: 100,
            checkpointed: false
        }
    );
    assert_eq!(
        store.expired_leases(t0 + Duration::from_secs(120), 10),
        [LeaseId(5)]
    );
    assert_eq!(
        store.expired_leases(t0 + Duration::from_secs(151), 10),
        [LeaseId(5), LeaseId(6)]
    );
    // An expired lease cannot be renewed; it waits for its revoke.
    assert!(matches!(
        store.lease_renew(LeaseId(5), t0 + Duration::from_secs(12)),
        Err(Error::LeaseNotFound)
    ));
    store.lease_demote();
    assert!(store
        .expired_leases(t0 + Duration::from_secs(1000), 10)
        .is_empty());
}
