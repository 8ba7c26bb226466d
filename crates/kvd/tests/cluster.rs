//! Three kvd processes on loopback with etcd's cluster flags: the leader is SIGKILLed under
//! write load; a new leader serves writes, nothing acknowledged is lost, and once the killed
//! member restarts from its data directory and catches up, every member's HashKV agrees.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use api::etcdserverpb::alarm_request::AlarmAction;
use api::etcdserverpb::{
    AlarmRequest, AlarmType, HashKvRequest, PutRequest, RangeRequest, StatusRequest,
};
use common::{grpc, Addrs, Proc};

/// The writes acknowledged so far: key → value.
#[derive(Default)]
struct Acked(std::sync::Mutex<BTreeMap<String, String>>);

const FAST: &[&str] = &[
    "--heartbeat-interval",
    "50",
    "--election-timeout",
    "500",
    "--lease-checkpoint-interval",
    "500ms",
];

fn start(m: &Addrs, dir: &std::path::Path, all: &[Addrs]) -> Proc {
    Proc::kvd(m, &dir.join(&m.name), all, "new", FAST)
}

/// (leader id, member id) as `m` reports them.
async fn status(m: &Addrs) -> Option<(u64, u64)> {
    let s = grpc::maintenance(&m.client)
        .status(StatusRequest {})
        .await
        .ok()?
        .into_inner();
    Some((s.leader, s.header?.member_id))
}

/// Waits until the live members agree on a leader among them; its index in `ms`.
async fn leader(ms: &[Addrs], live: &[bool]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut ids = BTreeMap::new();
        let mut leaders = Vec::new();
        for (i, m) in ms.iter().enumerate().filter(|(i, _)| live[*i]) {
            if let Some((leader, me)) = status(m).await {
                ids.insert(me, i);
                leaders.push(leader);
            }
        }
        if leaders.len() == live.iter().filter(|l| **l).count()
            && leaders.windows(2).all(|w| w[0] == w[1])
        {
            if let Some(&i) = ids.get(&leaders[0]) {
                return i;
            }
        }
        assert!(Instant::now() < deadline, "no agreed leader: {leaders:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Writes distinct keys through every member in turn until `stop`, recording acknowledged ones.
async fn writer(
    t: usize,
    ms: Vec<Addrs>,
    acked: Arc<Acked>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> usize {
    let clients: Vec<_> = ms.iter().map(|m| grpc::kv(&m.client)).collect();
    let mut failures = 0;
    let mut i = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let key = format!("w{t}-{i:06}");
        let value = format!("v{i}");
        let mut c = clients[i % clients.len()].clone();
        let put = PutRequest {
            key: key.clone().into_bytes(),
            value: value.clone().into_bytes(),
            ..Default::default()
        };
        match c.put(put).await {
            Ok(_) => {
                acked.0.lock().unwrap().insert(key, value);
            }
            Err(_) => {
                failures += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        i += 1;
    }
    failures
}

/// Grants lease `id` of `ttl` seconds at `m`.
async fn grant(m: &Addrs, id: i64, ttl: i64) {
    let req = api::etcdserverpb::LeaseGrantRequest { ttl, id };
    api::etcdserverpb::lease_client::LeaseClient::new(grpc::channel(&m.client))
        .lease_grant(req)
        .await
        .unwrap();
}

/// The lease's (remaining, granted) TTL as `m` answers it.
async fn lease_ttl(m: &Addrs, id: i64) -> (i64, i64) {
    let req = api::etcdserverpb::LeaseTimeToLiveRequest { id, keys: false };
    let r = api::etcdserverpb::lease_client::LeaseClient::new(grpc::channel(&m.client))
        .lease_time_to_live(req)
        .await
        .unwrap()
        .into_inner();
    (r.ttl, r.granted_ttl)
}

/// (raft index, raft applied index) as `m` reports them.
async fn raft_indexes(m: &Addrs) -> (u64, u64) {
    let s = grpc::maintenance(&m.client)
        .status(StatusRequest {})
        .await
        .unwrap()
        .into_inner();
    (s.raft_index, s.raft_applied_index)
}

/// Waits until the leader's clock has run lease `id` down to `left` seconds (so it has proposed
/// several checkpoints, one per 500 ms), then until every member has applied all the leader
/// had committed by then: each holds a checkpoint of at most about `left + 1` seconds.
async fn checkpointed(ms: &[Addrs], leader: usize, id: i64, left: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while lease_ttl(&ms[leader], id).await.0 > left {
        assert!(Instant::now() < deadline, "the lease's clock does not run");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (committed, _) = raft_indexes(&ms[leader]).await;
    for m in ms {
        while raft_indexes(m).await.1 < committed {
            assert!(
                Instant::now() < deadline,
                "{} did not apply {committed}",
                m.name
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Three members, each behind a proxy for its inbound peer traffic (to cut it off), ready.
fn behind_proxies(dir: &std::path::Path) -> (Vec<Addrs>, Vec<common::Proxy>, Vec<Proc>) {
    let (ms, proxies): (Vec<Addrs>, Vec<common::Proxy>) = ["a", "b", "c"]
        .iter()
        .map(|n| Addrs::behind_proxy(n))
        .unzip();
    let mut procs: Vec<Proc> = ms.iter().map(|m| start(m, dir, &ms)).collect();
    for p in &mut procs {
        p.wait_ready();
    }
    (ms, proxies, procs)
}

async fn revision(m: &Addrs) -> Option<i64> {
    let r = RangeRequest {
        key: b"x".to_vec(),
        serializable: true,
        ..Default::default()
    };
    Some(
        grpc::kv(&m.client)
            .range(r)
            .await
            .ok()?
            .into_inner()
            .header?
            .revision,
    )
}

#[test]
fn leader_killed_under_load_loses_nothing_and_members_agree() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ms: Vec<Addrs> = ["a", "b", "c"].iter().map(|n| Addrs::new(n)).collect();
    let mut procs: Vec<Proc> = ms.iter().map(|m| start(m, dir.path(), &ms)).collect();
    for p in &mut procs {
        p.wait_ready();
    }
    let mut live = vec![true; 3];
    let old = rt.block_on(leader(&ms, &live));
    // A 60 s lease, checkpointed every 500 ms while its clock runs on this leader.
    const LEASE: i64 = 0x60;
    rt.block_on(grant(&ms[old], LEASE, 60));
    rt.block_on(checkpointed(&ms, old, LEASE, 57));

    let acked = Arc::new(Acked::default());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|t| rt.spawn(writer(t, ms.clone(), acked.clone(), stop.clone())))
        .collect();
    common::wait_for("writes acknowledged before the kill", 30, || {
        acked.0.lock().unwrap().len() >= 200
    });
    let before_kill = acked.0.lock().unwrap().len();
    procs[old].kill();
    live[old] = false;
    let new = rt.block_on(leader(&ms, &live));
    assert_ne!(new, old);
    // The new leader restarts the lease from its last checkpoint (at most 58 s left, plus an
    // election timeout), not from the full 60 s.
    let (ttl, granted) = rt.block_on(lease_ttl(&ms[new], LEASE));
    assert_eq!(granted, 60);
    assert!(
        ttl > 30 && ttl <= 58,
        "remaining TTL after the leader change: {ttl}"
    );
    // The new leader serves writes: acknowledgements keep coming (a writer whose request was
    // in flight at the dead leader waits out its timeout first).
    let at_election = acked.0.lock().unwrap().len();
    common::wait_for(
        "writes acknowledged after the new leader's election",
        30,
        || acked.0.lock().unwrap().len() > at_election + 100,
    );

    procs[old] = start(&ms[old], dir.path(), &ms);
    live[old] = true;
    // Writes go on while the old leader restarts and catches up.
    let at_restart = acked.0.lock().unwrap().len();
    common::wait_for(
        "writes acknowledged while the old leader restarts",
        30,
        || acked.0.lock().unwrap().len() > at_restart + 100,
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let failures: usize = writers.into_iter().map(|w| rt.block_on(w).unwrap()).sum();
    procs[old].wait_ready();

    let acked = acked.0.lock().unwrap().clone();
    rt.block_on(async {
        // Every member reaches the leader's revision; HashKV at it agrees everywhere.
        let l = leader(&ms, &live).await;
        let rev = revision(&ms[l]).await.unwrap();
        let mut hashes = Vec::new();
        for m in &ms {
            let deadline = Instant::now() + Duration::from_secs(30);
            while revision(m).await.unwrap_or(0) < rev {
                assert!(
                    Instant::now() < deadline,
                    "{} did not catch up to {rev}",
                    m.name
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let h = grpc::maintenance(&m.client)
                .hash_kv(HashKvRequest { revision: rev })
                .await
                .unwrap()
                .into_inner();
            hashes.push((m.name.clone(), h.hash));
        }
        assert!(
            hashes.windows(2).all(|w| w[0].1 == w[1].1),
            "HashKV at {rev} differs: {hashes:?}"
        );
        // Every acknowledged write is there, on every member.
        for m in &ms {
            let all = RangeRequest {
                key: b"w".to_vec(),
                range_end: b"x".to_vec(),
                serializable: true,
                revision: rev,
                ..Default::default()
            };
            let got: BTreeMap<String, String> = grpc::kv(&m.client)
                .range(all)
                .await
                .unwrap()
                .into_inner()
                .kvs
                .into_iter()
                .map(|kv| {
                    (
                        String::from_utf8(kv.key).unwrap(),
                        String::from_utf8(kv.value).unwrap(),
                    )
                })
                .collect();
            for (k, v) in &acked {
                assert_eq!(got.get(k), Some(v), "{}: acknowledged {k} lost", m.name);
            }
        }
    });
    eprintln!(
        "{} writes acknowledged ({before_kill} before the kill), {failures} failed during the election",
        acked.len()
    );
    // Each member measures its peers (etcd's prober) and counts the bytes it sends them.
    let list = common::ctl_ok(&ms[new].endpoint(), &["member", "list"]);
    let id_of = |name: &str| {
        list.lines()
            .find(|l| l.split(", ").nth(2) == Some(name))
            .and_then(|l| l.split(',').next())
            .expect("every member listed")
            .to_string()
    };
    let (code, metrics) = common::http_get(&ms[new].client, "/metrics");
    assert_eq!(code, 200);
    for (i, other) in ms.iter().enumerate() {
        if i == new {
            continue;
        }
        let id = id_of(&other.name);
        for name in [
            "etcd_network_peer_round_trip_time_seconds_count",
            "etcd_network_peer_sent_bytes_total",
        ] {
            let sample = format!("{name}{{To=\"{id}\"}} ");
            let value: f64 = metrics
                .lines()
                .find_map(|l| l.strip_prefix(&sample))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            assert!(value > 0.0, "{sample} in:\n{metrics}");
        }
    }
}

#[test]
fn a_fourth_member_joins_as_a_learner_is_promoted_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let mut ms: Vec<Addrs> = ["a", "b", "c"].iter().map(|n| Addrs::new(n)).collect();
    let mut procs: Vec<Proc> = ms.iter().map(|m| start(m, dir.path(), &ms)).collect();
    for p in &mut procs {
        p.wait_ready();
    }
    let ep = ms[0].endpoint();
    for i in 0..50 {
        common::ctl_ok(&ep, &["put", &format!("j{i:02}"), "v"]);
    }
    let d = Addrs::new("d");
    // As etcd's strict reconfiguration check: refused as an "unhealthy cluster" until the
    // leader has replicated to every voter for 5 s.
    let mut added = String::new();
    common::wait_for("the cluster to accept a member", 20, || {
        let out = common::ctl(
            &ep,
            &["member", "add", "d", "--learner", "--peer-urls", &d.peer],
        );
        added = String::from_utf8_lossy(&out.stdout).to_string();
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("etcdserver: unhealthy cluster"), "{err}");
        }
        out.status.success()
    });
    assert!(added.contains("added as learner to cluster"), "{added}");
    assert!(
        added.contains("ETCD_INITIAL_CLUSTER_STATE=\"existing\""),
        "{added}"
    );
    let id = added.split_whitespace().nth(1).unwrap().to_string();
    ms.push(d.clone());
    let mut pd = Proc::kvd(&d, &dir.path().join("d"), &ms, "existing", FAST);
    // The learner catches up: a serializable read there sees the keys.
    pd.wait_for("the learner to catch up", 30, || {
        let out = common::ctl(
            &d.endpoint(),
            &["get", "j49", "--consistency=s", "--print-value-only"],
        );
        out.stdout == b"v\n"
    });
    // A learner refuses linearizable requests, as etcd's.
    // It serves serializable reads and Status only (etcd's interceptor rule): writes, leases,
    // member and alarm calls are refused; status answers.
    for args in [
        &["put", "x", "y"][..],
        &["lease", "grant", "10"],
        &["member", "list"],
        &["alarm", "list"],
    ] {
        let refused = common::ctl(&d.endpoint(), args);
        assert!(
            String::from_utf8_lossy(&refused.stderr).contains("rpc not supported for learner"),
            "{args:?}: {}",
            String::from_utf8_lossy(&refused.stderr)
        );
    }
    let status = common::ctl_ok(&d.endpoint(), &["endpoint", "status", "-w", "json"]);
    assert!(status.contains("\"isLearner\":true"), "{status}");
    // It publishes its name and client URLs once started; every member sees one list.
    let want = format!("{id}, started, d, {}, {}, true", d.peer, d.client);
    pd.wait_for("the learner's attributes", 10, || {
        common::ctl_ok(&ep, &["member", "list"]).contains(&want)
    });
    let list = common::ctl_ok(&ms[2].endpoint(), &["member", "list"]);
    for m in &ms {
        let started = format!("started, {}, {}, {}", m.name, m.peer, m.client);
        assert!(list.contains(&started), "{list}");
    }

    // Leadership cannot move to a learner (etcd's error); it moves to a voter, and etcdctl
    // prints etcd's line.
    let eps: Vec<String> = ms.iter().map(Addrs::endpoint).collect();
    let eps = eps.join(",");
    let refused = common::ctl(&eps, &["move-leader", &id]);
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("etcdserver: bad leader transferee"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let leader_of = |ep: &str| common::status_number(ep, "leader");
    let before = leader_of(&ep);
    let voters = common::ctl_ok(&ep, &["member", "list"]);
    let target = voters
        .lines()
        .filter(|l| l.ends_with(", false"))
        .filter_map(|l| l.split(',').next())
        .find(|hex| u64::from_str_radix(hex, 16).ok() != Some(before))
        .expect("a voter that does not lead")
        .to_string();
    let moved = common::ctl_ok(&eps, &["move-leader", &target]);
    assert_eq!(
        moved,
        format!("Leadership transferred from {before:x} to {target}\n")
    );
    assert_eq!(format!("{:x}", leader_of(&ep)), target);

    // Promoted through a follower, which forwards the promotion to the leader and answers
    // under its own header, as etcd's members fill every header themselves.
    let follower = ms[..3]
        .iter()
        .map(Addrs::endpoint)
        .find(|ep| format!("{:x}", common::status_number(ep, "member_id")) != target)
        .unwrap();
    let promoted = common::ctl_ok(&follower, &["member", "promote", &id, "-w", "json"]);
    assert_eq!(
        common::json_number(&promoted, "member_id"),
        Some(common::status_number(&follower, "member_id")),
        "{promoted}"
    );
    pd.wait_ready();
    common::ctl_ok(&d.endpoint(), &["put", "from-d", "ok"]);
    assert_eq!(
        common::ctl_ok(&ep, &["get", "from-d", "--print-value-only"]),
        "ok\n"
    );

    let removed = common::ctl_ok(&ep, &["member", "remove", &id]);
    assert!(removed.contains("removed from cluster"), "{removed}");
    let list = common::ctl_ok(&ep, &["member", "list"]);
    assert!(!list.contains(&id) && list.lines().count() == 3, "{list}");
    // The removed member stops by itself.
    common::wait_for("the removed member to exit", 30, || {
        pd.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_some())
    });
    // The cluster goes on without it.
    common::ctl_ok(&ep, &["put", "after", "removal"]);
}

#[test]
fn a_member_cut_off_serves_no_linearizable_read_and_catches_up_when_healed() {
    let dir = tempfile::tempdir().unwrap();
    let (ms, proxies, procs) = behind_proxies(dir.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let live = vec![true; 3];
    let l = rt.block_on(leader(&ms, &live));
    // Cut off a follower: nothing reaches it, so no answer gets back to it either.
    let f = (l + 1) % 3;
    let (fe, le) = (ms[f].endpoint(), ms[l].endpoint());
    common::ctl_ok(&le, &["put", "k", "before"]);
    procs[f].wait_for("the follower to have the first write", 10, || {
        common::ctl(&fe, &["get", "k", "--consistency=s", "--print-value-only"]).stdout
            == b"before\n"
    });
    proxies[f].cut();
    common::ctl_ok(&le, &["put", "k", "after"]);
    // The majority goes on; the cut-off member answers no linearizable read and takes no write…
    let read = common::ctl(&fe, &["get", "k", "--command-timeout", "3s"]);
    assert!(
        !read.status.success(),
        "a partitioned member served a linearizable read: {}",
        String::from_utf8_lossy(&read.stdout)
    );
    let write = common::ctl(&fe, &["put", "x", "y", "--command-timeout", "3s"]);
    assert!(!write.status.success());
    // Nor does it list alarms from its own state (etcd lists them through its log): an alarm
    // raised meanwhile would go unseen, and a disarm, which lists first, would leave it raised.
    let (_, fid) = rt.block_on(status(&ms[f])).unwrap();
    let raise = AlarmRequest {
        action: AlarmAction::Activate as i32,
        member_id: fid,
        alarm: AlarmType::Nospace as i32,
    };
    rt.block_on(async { grpc::maintenance(&ms[l].client).alarm(raise).await })
        .unwrap();
    let list = common::ctl(&fe, &["alarm", "list", "--command-timeout", "3s"]);
    assert!(
        !list.status.success(),
        "a partitioned member listed alarms: {:?}",
        String::from_utf8_lossy(&list.stdout)
    );
    // …while a serializable read there answers from its own (stale) state.
    assert_eq!(
        common::ctl_ok(&fe, &["get", "k", "--consistency=s", "--print-value-only"]),
        "before\n"
    );
    proxies[f].heal();
    procs[f].wait_for("the healed member to serve the newest value", 30, || {
        let out = common::ctl(&fe, &["get", "k", "--print-value-only"]);
        out.stdout == b"after\n"
    });
    assert_eq!(
        common::ctl_ok(&fe, &["alarm", "list"]),
        format!("memberID:{fid} alarm:NOSPACE \n")
    );
    common::ctl_ok(&fe, &["alarm", "disarm"]);
    assert_eq!(common::ctl_ok(&le, &["alarm", "list"]), "");
}

/// One keep-alive of lease `id` at `m`: the TTL it answers, or why it did not renew (an error,
/// or no answer in 15 s).
async fn keep_alive_once(m: &Addrs, id: i64) -> Result<i64, String> {
    let req = api::etcdserverpb::LeaseKeepAliveRequest { id };
    let mut client = api::etcdserverpb::lease_client::LeaseClient::new(grpc::channel(&m.client));
    let answer = async {
        let mut stream = client
            .lease_keep_alive(tokio_stream::iter([req]))
            .await?
            .into_inner();
        stream.message().await
    };
    match tokio::time::timeout(Duration::from_secs(15), answer).await {
        Ok(Ok(Some(r))) => Ok(r.ttl),
        Ok(Ok(None)) => Err("the stream ended".into()),
        Ok(Err(s)) => Err(format!("{:?} {}", s.code(), s.message())),
        Err(_) => Err("no answer in 15 s".into()),
    }
}

/// A leader cut off from the others renews no lease, even before it learns it no longer leads:
/// the others elect a leader whose clock for the lease starts at its election, so a renewal
/// the old one granted would let the lease expire before its holder's TTL ran out (the
/// robustness suite saw a lease expire 0.4 s early so). It renews once a quorum confirms it.
#[test]
fn a_leader_cut_off_renews_no_lease() {
    let dir = tempfile::tempdir().unwrap();
    let (ms, proxies, procs) = behind_proxies(dir.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let l = rt.block_on(leader(&ms, &[true; 3]));
    const LEASE: i64 = 0x1ea5e;
    rt.block_on(async {
        grant(&ms[l], LEASE, 30).await;
        assert_eq!(keep_alive_once(&ms[l], LEASE).await, Ok(30));
    });
    // Nothing reaches the leader from the others now; it still thinks it leads.
    proxies[l].cut();
    let renewed = rt.block_on(keep_alive_once(&ms[l], LEASE));
    assert!(
        renewed.is_err(),
        "a leader cut off from the cluster renewed the lease: TTL {renewed:?}"
    );
    proxies[l].heal();
    // Healed, the cluster renews it again, wherever the client asks.
    procs[l].wait_for("the lease to be renewed again", 30, || {
        rt.block_on(keep_alive_once(&ms[l], LEASE)) == Ok(30)
    });
}
