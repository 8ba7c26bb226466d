//! The client port's plain HTTP endpoints and gRPC health, the limits a client can hit, and a
//! client's concurrent writes sharing the WAL's fsyncs.

mod common;

use api::etcdserverpb::PutRequest;
use common::{grpc, http_get as get, Proc};

#[test]
fn http_endpoints_and_grpc_health_answer_as_etcds() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _kvd) = Proc::single_kvd(dir.path());
    assert_eq!(
        get(&m.client, "/health"),
        (200, r#"{"health":"true","reason":""}"#.into())
    );
    assert_eq!(get(&m.client, "/health?serializable=true").0, 200);
    assert_eq!(get(&m.client, "/livez"), (200, "ok\n".into()));
    assert_eq!(get(&m.client, "/readyz"), (200, "ok\n".into()));
    let (code, v) = get(&m.client, "/version");
    assert_eq!(code, 200);
    assert!(
        v.contains(r#""etcdserver":"3.7.1""#) && v.contains(r#""etcdcluster""#),
        "{v}"
    );
    common::ctl_ok(&m.endpoint(), &["put", "a", "b"]);
    let (code, metrics) = get(&m.client, "/metrics");
    assert_eq!(code, 200);
    for line in [
        "etcd_server_has_leader 1",
        "etcd_server_is_leader 1",
        "etcd_debugging_mvcc_current_revision 2",
        "# TYPE etcd_mvcc_db_total_size_in_bytes gauge",
        "# TYPE etcd_disk_wal_fsync_duration_seconds histogram",
        "# TYPE etcd_disk_backend_commit_duration_seconds histogram",
        "etcd_server_leader_changes_seen_total 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} missing from:\n{metrics}"
        );
    }
    // The put was fsynced to the WAL: the histogram has samples.
    let fsyncs = common::metric_in(&metrics, "etcd_disk_wal_fsync_duration_seconds_count");
    assert!(fsyncs > 0, "{metrics}");
    assert_eq!(get(&m.client, "/nope").0, 404);

    // gRPC health follows the leader (polled every 100 ms): SERVING once there is one.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    let status = || {
        rt.block_on(async {
            let mut h =
                tonic_health::pb::health_client::HealthClient::new(grpc::channel(&m.client));
            let req = tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            };
            h.check(req).await.unwrap().into_inner().status
        })
    };
    common::wait_for("gRPC health to report SERVING", 5, || status() == serving);
}

#[test]
fn oversized_requests_are_refused_with_etcds_errors_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _kvd) = Proc::single_kvd_with(dir.path(), &["--max-request-bytes", "100000"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut kv = grpc::kv(&m.client);
        let put = |n: usize| PutRequest {
            key: b"big".to_vec(),
            value: vec![b'x'; n],
            ..Default::default()
        };
        // Over --max-request-bytes: etcd's own refusal.
        let e = kv.put(put(150_000)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert_eq!(e.message(), "etcdserver: request is too large");
        // Over the gRPC limit (--max-request-bytes + 512 KiB): refused by gRPC, as etcd's.
        let e = kv.put(put(700_000)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
        assert!(
            e.message()
                .starts_with("grpc: received message larger than max ("),
            "{e:?}"
        );
        assert!(e.message().ends_with(" vs. 624288)"), "{e:?}");
        // Under it: fine (tonic's own 4 MiB default does not apply either way).
        kv.put(put(90_000)).await.unwrap();
        let e = kv
            .put(PutRequest {
                key: vec![],
                value: b"v".to_vec(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.message(), "etcdserver: key is not provided");
    });
    // Nothing but the one good put happened.
    let status = common::ctl_ok(&m.endpoint(), &["get", "big", "-w", "json"]);
    assert!(
        status.contains("\"version\":1") && status.contains("\"revision\":2"),
        "{status}"
    );
}

#[test]
fn writes_past_the_quota_raise_nospace_and_are_refused_reads_and_deletes_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let m = common::Addrs::new("default");
    let quota = (4u64 << 20).to_string();
    let start = || {
        let mut p = Proc::kvd(
            &m,
            &dir.path().join("kvd"),
            std::slice::from_ref(&m),
            "new",
            &["--quota-backend-bytes", &quota],
        );
        p.wait_ready();
        p
    };
    let mut p = start();
    let ep = m.endpoint();
    let value = "x".repeat(200_000);
    let mut refused = None;
    for i in 0..200 {
        // The value on stdin: one argument may not exceed 128 KiB.
        let out = common::ctl_input(&ep, &["put", &format!("k{i:03}")], &value);
        if !out.status.success() {
            refused = Some((i, String::from_utf8_lossy(&out.stderr).to_string()));
            break;
        }
    }
    let (at, err) = refused.expect("200 puts of 200 KB fit a 4 MiB quota");
    assert!(at > 0, "the first put was refused");
    assert!(
        err.contains("etcdserver: mvcc: database space exceeded"),
        "{err}"
    );
    let alarms = common::ctl_ok(&ep, &["alarm", "list"]);
    assert!(alarms.contains("alarm:NOSPACE"), "{alarms}");
    // Every later write is refused while the alarm stands; reads and deletes work.
    assert!(!common::ctl(&ep, &["put", "small", "v"]).status.success());
    assert_eq!(
        common::ctl_ok(&ep, &["get", "k000", "--print-value-only"]).len(),
        200_001
    );
    assert_eq!(common::ctl_ok(&ep, &["del", "k000"]), "1\n");
    let (code, body) = get(&m.client, "/health");
    assert_eq!(code, 503);
    assert!(body.contains("NOSPACE"), "{body}");

    // The alarm is stored: it stands after a clean restart (which replays nothing).
    assert!(p.terminate().success(), "{}", p.log_tail());
    let _p = start();
    let alarms = common::ctl_ok(&ep, &["alarm", "list"]);
    assert!(alarms.contains("alarm:NOSPACE"), "after restart: {alarms}");
    assert!(!common::ctl(&ep, &["put", "small", "v"]).status.success());

    // etcd's way out: delete, compact, defragment, disarm; then writes work again.
    common::ctl_ok(&ep, &["del", "k", "--prefix"]);
    let rev = common::ctl_ok(&ep, &["get", "k", "-w", "json"]);
    let rev = rev
        .split("\"revision\":")
        .nth(1)
        .and_then(|r| r.split([',', '}']).next())
        .unwrap()
        .to_string();
    common::ctl_ok(&ep, &["compaction", &rev, "--physical"]);
    common::ctl_ok(&ep, &["defrag"]);
    let disarmed = common::ctl_ok(&ep, &["alarm", "disarm"]);
    assert!(disarmed.contains("alarm:NOSPACE"), "{disarmed}");
    assert_eq!(common::ctl_ok(&ep, &["alarm", "list"]), "");
    common::ctl_ok(&ep, &["put", "small", "v"]);
    assert_eq!(get(&m.client, "/health").0, 200);
}

#[test]
fn a_clients_concurrent_puts_share_fsyncs_after_lone_ones() {
    let dir = tempfile::tempdir().unwrap();
    let (m, kvd) = Proc::single_kvd(dir.path());
    let wal_fsyncs = || kvd.metric("etcd_disk_wal_fsync_duration_seconds_count");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in_rt = rt.enter();
    let kv = grpc::kv(&m.client);
    let put = |key: String| {
        let mut kv = kv.clone();
        async move {
            kv.put(PutRequest {
                key: key.into_bytes(),
                value: b"v".to_vec(),
                ..Default::default()
            })
            .await
            .map(|_| ())
        }
    };
    // One at a time, as a lone client writes: each call's turn is taken at once.
    rt.block_on(async {
        for i in 0..20 {
            put(format!("lone-{i}")).await.unwrap();
        }
    });
    // Then 200 at once over the same connection: the calls of one read of it wait for each
    // other and share a turn of the WAL (one fsync each turn), lone ones before or not.
    let before = wal_fsyncs();
    rt.block_on(async {
        let mut puts = tokio::task::JoinSet::new();
        for i in 0..200 {
            puts.spawn(put(format!("together-{i}")));
        }
        while let Some(r) = puts.join_next().await {
            r.unwrap().unwrap();
        }
    });
    let fsyncs = wal_fsyncs() - before;
    assert!(fsyncs < 100, "200 concurrent puts took {fsyncs} fsyncs");
}
