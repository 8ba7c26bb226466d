//! etcd's `v3lockpb.Lock` and `v3electionpb.Election` services: one scenario of locks and
//! elections (waiting, unlocking, cancelled and expired waiters, proclaiming, resigning,
//! observing) run against etcd v3.6.5 and against kvd, through kvd's generated clients. Every
//! answer — keys, revisions, values, error codes and messages — must be the same.

mod common;

use std::time::Duration;

use api::etcdserverpb::kv_client::KvClient;
use api::etcdserverpb::lease_client::LeaseClient;
use api::etcdserverpb::{
    LeaseGrantRequest, LeaseRevokeRequest, LeaseTimeToLiveRequest, RangeRequest,
};
use api::v3electionpb::election_client::ElectionClient;
use api::v3electionpb::{
    CampaignRequest, LeaderKey, LeaderRequest, ProclaimRequest, ResignRequest,
};
use api::v3lockpb::lock_client::LockClient;
use api::v3lockpb::{LockRequest, UnlockRequest};
use common::grpc::channel;
use common::Proc;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// Leases the scenario grants with ids of its own choosing, so keys are alike on both servers.
const A: i64 = 0x1a;
const B: i64 = 0x1b;
const C: i64 = 0x1c;
const D: i64 = 0x1d;

fn status(s: &tonic::Status) -> String {
    format!("error {:?}: {}", s.code(), s.message())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Whether a spawned call is still waiting after a moment.
async fn still_waiting<T>(h: &JoinHandle<T>) -> bool {
    tokio::time::sleep(Duration::from_millis(400)).await;
    !h.is_finished()
}

struct Clients {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    lock: LockClient<Channel>,
    election: ElectionClient<Channel>,
}

impl Clients {
    fn new(url: &str) -> Clients {
        let ch = || {
            tonic::transport::Endpoint::from_shared(url.to_string())
                .unwrap()
                .connect_lazy()
        };
        Clients {
            kv: KvClient::new(channel(url)),
            lease: LeaseClient::new(channel(url)),
            // No client-side timeout: these calls wait for as long as the lock is held.
            lock: LockClient::new(ch()),
            election: ElectionClient::new(ch()),
        }
    }

    async fn grant(&mut self, id: i64) {
        self.lease
            .lease_grant(LeaseGrantRequest { ttl: 60, id })
            .await
            .unwrap();
    }

    fn lock(&self, name: &str, lease: i64) -> JoinHandle<String> {
        let mut c = self.lock.clone();
        let req = LockRequest {
            name: name.into(),
            lease,
        };
        tokio::spawn(async move {
            match c.lock(req).await {
                Ok(r) => {
                    let r = r.into_inner();
                    format!("locked {} at {}", text(&r.key), r.header.unwrap().revision)
                }
                Err(s) => status(&s),
            }
        })
    }

    async fn unlock(&mut self, key: &str) -> String {
        match self.lock.unlock(UnlockRequest { key: key.into() }).await {
            Ok(r) => format!("unlocked at {}", r.into_inner().header.unwrap().revision),
            Err(s) => status(&s),
        }
    }

    /// The keys under `pfx`.
    async fn keys(&mut self, pfx: &str) -> Vec<String> {
        let mut end = pfx.as_bytes().to_vec();
        *end.last_mut().unwrap() += 1;
        let r = RangeRequest {
            key: pfx.into(),
            range_end: end,
            keys_only: true,
            ..Default::default()
        };
        let r = self.kv.range(r).await.unwrap().into_inner();
        r.kvs.iter().map(|kv| text(&kv.key)).collect()
    }

    fn campaign(
        &self,
        name: &str,
        lease: i64,
        value: &str,
    ) -> JoinHandle<Result<LeaderKey, String>> {
        let mut c = self.election.clone();
        let req = CampaignRequest {
            name: name.into(),
            lease,
            value: value.into(),
        };
        tokio::spawn(async move {
            match c.campaign(req).await {
                Ok(r) => {
                    let r = r.into_inner();
                    let mut l = r.leader.unwrap();
                    // Carries the header's revision in `name` for the transcript.
                    l.name = format!("{}@{}", text(&l.name), r.header.unwrap().revision).into();
                    Ok(l)
                }
                Err(s) => Err(status(&s)),
            }
        })
    }

    async fn proclaim(&mut self, leader: Option<LeaderKey>, value: &str) -> String {
        let req = ProclaimRequest {
            leader,
            value: value.into(),
        };
        match self.election.proclaim(req).await {
            Ok(r) => format!("proclaimed at {}", r.into_inner().header.unwrap().revision),
            Err(s) => status(&s),
        }
    }

    async fn resign(&mut self, leader: Option<LeaderKey>) -> String {
        match self.election.resign(ResignRequest { leader }).await {
            Ok(r) => format!("resigned at {}", r.into_inner().header.unwrap().revision),
            Err(s) => status(&s),
        }
    }

    async fn leader(&mut self, name: &str) -> String {
        match self
            .election
            .leader(LeaderRequest { name: name.into() })
            .await
        {
            Ok(r) => {
                let r = r.into_inner();
                let kv = r.kv.unwrap();
                format!(
                    "leader {}={} created {} at {}",
                    text(&kv.key),
                    text(&kv.value),
                    kv.create_revision,
                    r.header.unwrap().revision
                )
            }
            Err(s) => status(&s),
        }
    }
}

/// Records one answer (and shows it, for a scenario that stalls).
fn note(t: &mut Vec<String>, s: String) {
    eprintln!("{s}");
    t.push(s);
}

fn leader_key(l: &Result<LeaderKey, String>) -> String {
    match l {
        Ok(l) => format!(
            "campaign won: {} key {} rev {} lease {:x}",
            text(&l.name),
            text(&l.key),
            l.rev,
            l.lease
        ),
        Err(e) => e.clone(),
    }
}

/// The scenario; every line of the transcript is one answer.
async fn scenario(url: &str) -> Vec<String> {
    let mut c = Clients::new(url);
    let mut t = Vec::new();
    for id in [A, B, C, D] {
        c.grant(id).await;
    }

    // Lock: the first holder gets it at once; locking again with the same lease is the same
    // hold; a second lease waits until the first unlocks.
    note(&mut t, c.lock("lk", A).await.unwrap());
    note(&mut t, c.lock("lk", A).await.unwrap());
    let b = c.lock("lk", B);
    note(&mut t, format!("B waits: {}", still_waiting(&b).await));
    note(&mut t, c.unlock("lk/1a").await);
    note(&mut t, b.await.unwrap());

    // A waiter that gives up (its client cancels) leaves no key behind.
    let mut cancelled = c.lock.clone();
    let r = tokio::time::timeout(
        Duration::from_millis(400),
        cancelled.lock(LockRequest {
            name: "lk".into(),
            lease: C,
        }),
    )
    .await;
    note(&mut t, format!("C gave up: {}", r.is_err()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while c.keys("lk/").await.len() > 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    note(
        &mut t,
        format!("keys after C gave up: {:?}", c.keys("lk/").await),
    );

    // A waiter whose lease is revoked learns its hold is gone once it would have the lock.
    let d = c.lock("lk", D);
    note(&mut t, format!("D waits: {}", still_waiting(&d).await));
    c.lease
        .lease_revoke(LeaseRevokeRequest { id: D })
        .await
        .unwrap();
    note(
        &mut t,
        format!("D still waits: {}", still_waiting(&d).await),
    );
    note(&mut t, c.unlock("lk/1b").await);
    note(&mut t, format!("D: {}", d.await.unwrap()));

    // Bad requests.
    note(
        &mut t,
        format!("unknown lease: {}", c.lock("lk", 0x77).await.unwrap()),
    );
    note(&mut t, format!("empty key: {}", c.unlock("").await));

    // Lease 0: a fresh 60-second lease holds the lock.
    let fresh = c.lock("lk0", 0).await.unwrap();
    let lease = fresh
        .split_whitespace()
        .nth(1)
        .and_then(|k| k.strip_prefix("lk0/"))
        .and_then(|h| i64::from_str_radix(h, 16).ok())
        .expect("a key lk0/<lease>");
    let ttl = c
        .lease
        .lease_time_to_live(LeaseTimeToLiveRequest {
            id: lease,
            keys: true,
        })
        .await
        .unwrap()
        .into_inner();
    note(
        &mut t,
        format!(
            "lease 0: granted {} holding {:?}",
            ttl.granted_ttl,
            ttl.keys
                .iter()
                .map(|k| text(k).replace(&format!("{lease:x}"), "<lease>"))
                .collect::<Vec<_>>()
        ),
    );

    // Election.
    note(&mut t, c.leader("el").await);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    let mut observer = c.election.clone();
    let observed = tokio::spawn(async move {
        // etcd sends the stream's headers with its first message: the call itself waits.
        let req = LeaderRequest { name: "el".into() };
        let mut observe = observer.observe(req).await.unwrap().into_inner();
        while let Ok(Some(r)) = observe.message().await {
            let kv = r.kv.unwrap();
            sink.lock().unwrap().push(format!(
                "observed {}={} mod {} at {}",
                text(&kv.key),
                text(&kv.value),
                kv.mod_revision,
                r.header.unwrap().revision
            ));
        }
    });
    let a = c.campaign("el", A, "a").await.unwrap();
    note(&mut t, leader_key(&a));
    let a = a.unwrap();
    let a_key = LeaderKey {
        name: b"el".to_vec(),
        ..a.clone()
    };
    let b = c.campaign("el", B, "b");
    note(&mut t, format!("B campaigns: {}", still_waiting(&b).await));
    note(&mut t, c.proclaim(Some(a_key.clone()), "a2").await);
    note(&mut t, c.leader("el").await);
    let stale = LeaderKey {
        rev: a_key.rev + 100,
        ..a_key.clone()
    };
    note(
        &mut t,
        format!("stale proclaim: {}", c.proclaim(Some(stale), "x").await),
    );
    note(
        &mut t,
        format!("no leader field: {}", c.proclaim(None, "x").await),
    );
    note(&mut t, format!("no leader field: {}", c.resign(None).await));
    // Campaigning again with the leader's lease and a new value proclaims it.
    note(
        &mut t,
        leader_key(&c.campaign("el", A, "a3").await.unwrap()),
    );
    note(&mut t, c.leader("el").await);
    note(&mut t, c.resign(Some(a_key.clone())).await);
    let b = b.await.unwrap();
    note(&mut t, leader_key(&b));
    note(
        &mut t,
        format!("resign again: {}", c.resign(Some(a_key)).await),
    );
    note(&mut t, c.leader("el").await);
    // The observer's last word is B leading; wait for it rather than for a while.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !seen
        .lock()
        .unwrap()
        .last()
        .is_some_and(|o| o.contains("=b mod"))
    {
        let so_far = seen.lock().unwrap().clone();
        assert!(
            std::time::Instant::now() < deadline,
            "the observer never saw B lead: {so_far:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    observed.abort();
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() >= 3, "the observer saw {seen:?}");
    for o in seen {
        note(&mut t, o);
    }
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_election_answer_as_etcds() {
    let dir = tempfile::tempdir().unwrap();
    let (k, _kvd) = Proc::single_kvd(dir.path());
    let (e, _etcd) = Proc::single_etcd(dir.path());

    let want = scenario(&e.client).await;
    let got = scenario(&k.client).await;
    common::assert_same_answers(&want, &got);
}

/// Leases granted with no id of the client's: increasing ids under the member's low 16 bits
/// (the sign bit cleared), as etcd's request-id generator makes them, so the lock keys named
/// by them list in the order the leases were granted. (etcd's ids skip the ones its other
/// requests took from the same generator; kvd's count up by one.)
async fn server_chosen_ids(url: &str) -> Vec<String> {
    let mut c = Clients::new(url);
    let mut ids = Vec::new();
    let mut member = 0;
    for _ in 0..5 {
        let r = c
            .lease
            .lease_grant(LeaseGrantRequest { ttl: 60, id: 0 })
            .await
            .unwrap()
            .into_inner();
        member = r.header.unwrap().member_id;
        ids.push(r.id);
    }
    let mut t = Vec::new();
    let top = |id: i64| (id as u64) >> 48;
    note(
        &mut t,
        format!("ids increase: {}", ids.windows(2).all(|w| w[1] > w[0])),
    );
    note(
        &mut t,
        format!(
            "ids under the member's low bits: {}",
            ids.iter().all(|id| top(*id) == member & 0x7fff)
        ),
    );
    // Three waiters for one lock, in grant order of their leases: the lock's keys list so.
    let held = c.lock("order", ids[0]).await.unwrap();
    note(&mut t, held.replace(&format!("{:x}", ids[0]), "<first>"));
    let waiting: Vec<_> = ids[1..3].iter().map(|id| c.lock("order", *id)).collect();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let keys = c.keys("order/").await;
    let named: Vec<String> = ids[..3].iter().map(|id| format!("order/{id:x}")).collect();
    note(
        &mut t,
        format!("lock keys in grant order: {}", keys == named),
    );
    for w in waiting {
        w.abort();
    }
    for id in ids {
        c.lease
            .lease_revoke(LeaseRevokeRequest { id })
            .await
            .unwrap();
    }
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_chosen_lease_ids_are_etcds() {
    let dir = tempfile::tempdir().unwrap();
    let (k, _kvd) = Proc::single_kvd(dir.path());
    let (e, _etcd) = Proc::single_etcd(dir.path());

    let want = server_chosen_ids(&e.client).await;
    let got = server_chosen_ids(&k.client).await;
    common::assert_same_answers(&want, &got);
    assert!(got.iter().all(|l| !l.ends_with("false")), "{got:?}");
}
