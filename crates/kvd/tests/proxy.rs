//! `kvd grpc-proxy start` with real clients (etcdctl), in front of kvd and in front of etcd
//! 3.6.5: the leasing article's walkthrough, answers as the cluster's, watch coalescing, locks
//! and elections, shared leases, the cache's bound, a prefix shared with etcd's own leasing
//! proxy, and bad input. Linearizability under faults is checked by the Go harness
//! (`tests/clients/go`, run from `go_client.rs`).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{ctl, ctl_input, ctl_ok, normalize, LiveCtl, Proc};

const PREFIX: &str = "--experimental-leasing-prefix=_lease/";

/// etcdctl through `p` (a proxy or a member), with a short timeout: whether it succeeded,
/// and its standard output.
fn via(p: &Proc, args: &[&str]) -> (bool, String) {
    let mut all = vec!["--command-timeout=1s"];
    all.extend_from_slice(args);
    let out = ctl(&p.addrs.endpoint(), &all);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn get_value(p: &Proc, key: &str) -> Option<String> {
    let (ok, out) = via(p, &["get", key, "--print-value-only"]);
    ok.then(|| out.trim_end().to_string())
}

/// The cluster's leasing keys (under `_lease/`), with their values.
fn leasing_keys(cluster: &str) -> Vec<(String, String)> {
    let out = ctl_ok(cluster, &["get", "--prefix", "_lease/"]);
    let lines: Vec<&str> = out.lines().collect();
    lines
        .chunks(2)
        .map(|c| (c[0].to_string(), c.get(1).unwrap_or(&"").to_string()))
        .collect()
}

#[test]
fn the_articles_walkthrough_through_a_kvd_proxy_in_front_of_kvd_and_of_etcd() {
    for backend in ["kvd", "etcd"] {
        let dir = tempfile::tempdir().unwrap();
        let (m, mut cluster) = if backend == "kvd" {
            Proc::single_kvd(dir.path())
        } else {
            Proc::single_etcd(dir.path())
        };
        let proxy = Proc::grpc_proxy(
            "proxy",
            dir.path(),
            &m.endpoint(),
            &[PREFIX, "--leasing-ttl=4s"],
        );
        // Put through the cluster, get through the proxy: it takes the key.
        assert_eq!(ctl_ok(&m.endpoint(), &["put", "abc", "123"]), "OK\n");
        proxy.wait_for("the proxy to answer", 20, || {
            get_value(&proxy, "abc").as_deref() == Some("123")
        });
        proxy.wait_for("the key taken", 10, || {
            proxy.metric("kvd_leasing_acquisitions_total") == 1
        });
        let held = leasing_keys(&m.endpoint());
        assert_eq!(held.len(), 1, "{backend}: {held:?}");
        assert_eq!(held[0].0, "_lease/abc");
        let hits = proxy.metric("etcd_grpc_proxy_cache_hits_total");
        // The cluster goes away: the proxy still answers, from its cache…
        let killed = Instant::now();
        cluster.kill();
        assert_eq!(
            get_value(&proxy, "abc").as_deref(),
            Some("123"),
            "{backend}"
        );
        assert!(proxy.metric("etcd_grpc_proxy_cache_hits_total") > hits);
        // …until the lease's time could be up (4 s from the last keep-alive it sent, less 1 %
        // for clock drift), and then never with the old value.
        let mut answered = 0;
        while let Some(v) = get_value(&proxy, "abc") {
            assert_eq!(v, "123");
            answered += 1;
            assert!(
                killed.elapsed() < Duration::from_secs(4 + 3),
                "{backend}: still answering {:?} after the cluster died",
                killed.elapsed()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(answered >= 1, "{backend}");
        for _ in 0..3 {
            let (ok, out) = via(&proxy, &["get", "abc"]);
            assert!(!ok && !out.contains("123"), "{backend}: {out}");
        }
    }
}

/// The same etcdctl commands, revision-agnostic, against a cluster and through a proxy in
/// front of another one just like it: the same answers.
#[test]
fn etcdctl_through_a_leasing_proxy_answers_as_the_cluster_does() {
    let dir = tempfile::tempdir().unwrap();
    let (direct, _a) = Proc::single_kvd(&dir.path().join("a"));
    let (behind, _b) = Proc::single_kvd(&dir.path().join("b"));
    let proxy = Proc::grpc_proxy("proxy", dir.path(), &behind.endpoint(), &[PREFIX]);
    proxy.wait_for("the proxy to answer", 20, || via(&proxy, &["get", "x"]).0);
    let script: Vec<(Vec<&str>, &str)> = vec![
        (vec!["put", "foo", "bar"], ""),
        (vec!["get", "foo"], ""),
        // Again: the proxy answers this one from its cache, once it holds the key.
        (vec!["get", "foo"], ""),
        (vec!["get", "foo", "--keys-only"], ""),
        (vec!["get", "foo", "--count-only", "-w", "json"], ""),
        (vec!["put", "foo", "baz", "--prev-kv"], ""),
        (vec!["get", "foo"], ""),
        (vec!["get", "foo", "--consistency=s"], ""),
        (vec!["put", "foo2", "x"], ""),
        (vec!["get", "foo", "--prefix"], ""),
        (vec!["get", "foo", "--prefix", "--limit=1"], ""),
        (vec!["get", "foo", "foo3"], ""),
        (vec!["del", "foo2", "--prev-kv"], ""),
        (vec!["del", "nothing"], ""),
        (vec!["get", "foo2"], ""),
        (
            vec!["txn"],
            "value(\"foo\") = \"baz\"\n\nput foo qux\nget foo\n\nput foo never\n\n",
        ),
        (vec!["get", "foo"], ""),
        (
            vec!["txn"],
            "value(\"foo\") = \"nope\"\n\nput foo never\n\nget foo\nput t1 a\n\n",
        ),
        (vec!["get", "t1"], ""),
        (vec!["del", "t", "--prefix"], ""),
        (vec!["get", "t1"], ""),
        (vec!["put", "", "empty"], ""),
        (vec!["put", "k", "v", "--lease=1234"], ""),
        (vec!["get", "foo", "--rev=999999"], ""),
        (vec!["lease", "timetolive", "1234"], ""),
        (vec!["lease", "revoke", "1234"], ""),
        (vec!["get", "foo"], ""),
        (vec!["del", "foo"], ""),
        (vec!["get", "foo"], ""),
        (vec!["get", "foo"], ""),
    ];
    let run = |endpoint: &str| -> Vec<String> {
        script
            .iter()
            .map(|(args, input)| {
                // The proxy takes a key after the read that missed: give it the moment.
                std::thread::sleep(Duration::from_millis(50));
                let out = ctl_input(endpoint, args, input);
                let text = format!(
                    "{:?} -> {}\n{}{}",
                    args,
                    out.status.success(),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                // Revisions differ by design: the proxy's leasing keys take some.
                let text = normalize(&text, endpoint);
                common::without_json_field(&text, "revision")
            })
            .collect()
    };
    let want = run(&direct.endpoint());
    let got = run(&proxy.addrs.endpoint());
    common::assert_same_answers(&want, &got);
    assert!(proxy.metric("etcd_grpc_proxy_cache_hits_total") >= 3);
}

#[test]
fn watches_locks_and_elections_through_the_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _kvd) = Proc::single_kvd(dir.path());
    let proxy = Proc::grpc_proxy("proxy", dir.path(), &m.endpoint(), &[PREFIX]);
    let p = proxy.addrs.endpoint();
    proxy.wait_for("the proxy to answer", 20, || via(&proxy, &["get", "x"]).0);
    // Two clients watching one key share one upstream watcher.
    let w1 = LiveCtl::start(&p, &["watch", "w", "--prev-kv"]);
    let w2 = LiveCtl::start(&p, &["watch", "w"]);
    proxy.wait_for("two client watchers", 10, || {
        proxy.metric("kvd_grpc_proxy_watchers") == 2
    });
    assert_eq!(proxy.metric("kvd_grpc_proxy_upstream_watchers"), 1);
    assert_eq!(proxy.metric("etcd_grpc_proxy_watchers_coalescing_total"), 1);
    ctl_ok(&p, &["put", "w", "1"]);
    ctl_ok(&m.endpoint(), &["put", "w", "2"]);
    ctl_ok(&p, &["del", "w"]);
    assert_eq!(w1.next(3), ["PUT", "w", "1"]);
    assert_eq!(w1.next(5), ["PUT", "w", "1", "w", "2"]);
    assert_eq!(w1.next(5), ["DELETE", "w", "2", "w", ""]);
    assert_eq!(
        w2.next(9),
        ["PUT", "w", "1", "PUT", "w", "2", "DELETE", "w", ""]
    );
    drop((w1, w2));
    proxy.wait_for("the watchers gone", 10, || {
        proxy.metric("kvd_grpc_proxy_upstream_watchers") == 0
    });
    // A watch from a past revision gets its history, then what comes.
    let rev =
        common::json_number(&ctl_ok(&p, &["put", "h", "1", "-w", "json"]), "revision").unwrap();
    ctl_ok(&p, &["put", "h", "2"]);
    let w3 = LiveCtl::start(&p, &["watch", "h", &format!("--rev={rev}")]);
    assert_eq!(w3.next(6), ["PUT", "h", "1", "PUT", "h", "2"]);
    ctl_ok(&p, &["put", "h", "3"]);
    assert_eq!(w3.next(3), ["PUT", "h", "3"]);
    // A lock: the second locker waits for the first.
    let first = LiveCtl::start(&p, &["lock", "--ttl=2", "mylock"]);
    let key = first.next(1);
    assert!(key[0].starts_with("mylock/"), "{key:?}");
    let second = LiveCtl::start(&p, &["lock", "--ttl=2", "mylock", "echo", "second"]);
    assert!(second.quiet_for(Duration::from_millis(800)));
    drop(first);
    assert_eq!(second.next(1), ["second"]);
    // An election: an observer through the proxy sees the leader's proclamation.
    let leader = LiveCtl::start(&p, &["elect", "myelection", "p1"]);
    assert!(leader.next(1)[0].starts_with("myelection/"));
    let listener = LiveCtl::start(&p, &["elect", "-l", "myelection"]);
    let l = listener.next(2);
    assert_eq!(l[1], "p1", "{l:?}");
    // MemberList names the proxy, as etcd's proxy does.
    let members = ctl_ok(&p, &["member", "list"]);
    assert!(members.contains(&p), "{members}");
    // Maintenance through the proxy: the member's status, a snapshot stream.
    let status = ctl_ok(&p, &["endpoint", "status", "-w", "json"]);
    assert!(common::json_number(&status, "leader").is_some(), "{status}");
    let snap = dir.path().join("snap.db");
    ctl_ok(&p, &["snapshot", "save", &snap.display().to_string()]);
    assert!(std::fs::metadata(&snap).unwrap().len() > 0);
    // Health, as etcd's proxy answers it.
    let (code, body) = common::http_get(&proxy.addrs.client, "/health");
    assert_eq!(
        (code, body.as_str()),
        (200, r#"{"health":"true","reason":""}"#)
    );
}

/// Reads `key` through `p` until the proxy holds it (its read answered from the cache).
fn until_held(p: &Proc, key: &str) {
    p.wait_for(&format!("{key} held"), 20, || {
        let hits = p.metric("etcd_grpc_proxy_cache_hits_total");
        get_value(p, key);
        p.metric("etcd_grpc_proxy_cache_hits_total") > hits
    });
}

#[test]
fn shared_read_leases_let_two_proxies_serve_one_key_and_a_write_revokes_both() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _kvd) = Proc::single_kvd(dir.path());
    let shared = [PREFIX, "--leasing-shared"];
    let a = Proc::grpc_proxy("a", dir.path(), &m.endpoint(), &shared);
    let b = Proc::grpc_proxy("b", dir.path(), &m.endpoint(), &shared);
    ctl_ok(&m.endpoint(), &["put", "k", "v1"]);
    until_held(&a, "k");
    until_held(&b, "k");
    // Both hold it, each with a shared leasing key of its own.
    let held = leasing_keys(&m.endpoint());
    assert_eq!(held.len(), 2, "{held:?}");
    assert!(held
        .iter()
        .all(|(k, v)| k.starts_with("_lease/k\0") && v == "SHARED"));
    for p in [&a, &b] {
        let hits = p.metric("etcd_grpc_proxy_cache_hits_total");
        for _ in 0..5 {
            assert_eq!(get_value(p, "k").as_deref(), Some("v1"));
        }
        assert_eq!(p.metric("etcd_grpc_proxy_cache_hits_total"), hits + 5);
    }
    // A write through one revokes the other's lease before it commits.
    assert!(via(&a, &["put", "k", "v2"]).0);
    assert_eq!(b.metric("kvd_leasing_revocations_received_total"), 1);
    assert!(a.metric("kvd_leasing_revocations_sent_total") >= 1);
    assert_eq!(get_value(&b, "k").as_deref(), Some("v2"));
    assert_eq!(get_value(&a, "k").as_deref(), Some("v2"));
    // The writer kept its own: its next read is a hit with the new value.
    let hits = a.metric("etcd_grpc_proxy_cache_hits_total");
    assert_eq!(get_value(&a, "k").as_deref(), Some("v2"));
    assert_eq!(a.metric("etcd_grpc_proxy_cache_hits_total"), hits + 1);

    // Without --leasing-shared one proxy holds a key, the other reads through the cluster.
    let c = Proc::grpc_proxy("c", dir.path(), &m.endpoint(), &[PREFIX]);
    let d = Proc::grpc_proxy("d", dir.path(), &m.endpoint(), &[PREFIX]);
    ctl_ok(&m.endpoint(), &["put", "x", "1"]);
    until_held(&c, "x");
    for _ in 0..3 {
        assert_eq!(get_value(&d, "x").as_deref(), Some("1"));
    }
    assert_eq!(d.metric("etcd_grpc_proxy_cache_hits_total"), 0);
    assert_eq!(d.metric("kvd_leasing_acquisitions_total"), 0);
    // An exclusive kvd proxy and shared ones share the prefix: a write through the shared
    // one revokes the exclusive holder.
    assert!(via(&a, &["put", "x", "2"]).0);
    assert_eq!(c.metric("kvd_leasing_revocations_received_total"), 1);
    assert_eq!(get_value(&c, "x").as_deref(), Some("2"));
}

#[test]
fn the_cache_holds_no_more_keys_or_bytes_than_it_may() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _kvd) = Proc::single_kvd(dir.path());
    let p = Proc::grpc_proxy(
        "proxy",
        dir.path(),
        &m.endpoint(),
        &[PREFIX, "--leasing-cache-keys=10"],
    );
    // Ten times more distinct keys than it may hold, each read twice (a miss takes the key).
    for i in 0..100 {
        ctl_ok(&m.endpoint(), &["put", &format!("key{i:03}"), "v"]);
    }
    for round in 0..2 {
        for i in 0..100 {
            assert_eq!(get_value(&p, &format!("key{i:03}")).as_deref(), Some("v"));
            let held = p.metric("etcd_grpc_proxy_cache_keys_total");
            assert!(held <= 10, "round {round}, key {i}: {held} keys held");
        }
    }
    assert!(p.metric("kvd_leasing_acquisitions_total") > 10);
    assert!(
        p.metric("kvd_leasing_evictions_total") >= p.metric("kvd_leasing_acquisitions_total") - 10
    );
    // The keys given up are given back to the cluster too.
    p.wait_for("evicted leasing keys deleted", 10, || {
        leasing_keys(&m.endpoint()).len() <= 10
    });
    // A bound in bytes: 4 KiB values, 20 KiB for the cache.
    let q = Proc::grpc_proxy(
        "bytes",
        dir.path(),
        &m.endpoint(),
        &[PREFIX, "--leasing-cache-bytes=20480"],
    );
    let big = "x".repeat(4096);
    for i in 0..30 {
        ctl_ok(&m.endpoint(), &["put", &format!("big{i}"), &big]);
    }
    for i in 0..30 {
        for _ in 0..2 {
            assert_eq!(
                get_value(&q, &format!("big{i}")).map(|v| v.len()),
                Some(4096)
            );
        }
        // One value over at most: the bound is checked before a key is taken.
        let bytes = q.metric("kvd_leasing_cache_bytes");
        assert!(bytes <= 20480 + 4096 + 512, "{bytes} bytes held");
    }
    assert!(q.metric("kvd_leasing_evictions_total") > 0);
    // A proxy stopped cleanly (SIGTERM) revokes its session lease: its leasing keys go at
    // once, and no writer waits for them to expire.
    let (mut p, mut q) = (p, q);
    assert!(!leasing_keys(&m.endpoint()).is_empty());
    assert!(p.terminate().success());
    assert!(q.terminate().success());
    assert_eq!(leasing_keys(&m.endpoint()), Vec::<(String, String)>::new());
}

/// A kvd proxy and etcd 3.6.5's leasing proxy on one prefix: each sees the other's writes,
/// and revocations go both ways.
#[test]
fn a_kvd_proxy_and_an_etcd_leasing_proxy_share_a_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _kvd) = Proc::single_kvd(dir.path());
    let k = Proc::grpc_proxy("kvd-proxy", dir.path(), &m.endpoint(), &[PREFIX]);
    let e = Proc::etcd_grpc_proxy("etcd-proxy", dir.path(), &m.endpoint(), &[PREFIX]);
    e.wait_for("etcd's proxy to answer", 20, || via(&e, &["get", "x"]).0);
    // The kvd proxy holds a key; a write through etcd's proxy revokes it.
    ctl_ok(&m.endpoint(), &["put", "a", "1"]);
    until_held(&k, "a");
    assert!(via(&e, &["put", "a", "2"]).0);
    assert_eq!(k.metric("kvd_leasing_revocations_received_total"), 1);
    assert_eq!(get_value(&k, "a").as_deref(), Some("2"));
    // etcd's proxy holds a key (its leasing key has an empty value); a write through the kvd
    // proxy revokes it.
    ctl_ok(&m.endpoint(), &["put", "b", "1"]);
    assert_eq!(get_value(&e, "b").as_deref(), Some("1"));
    e.wait_for("etcd's proxy to hold b", 10, || {
        leasing_keys(&m.endpoint())
            .iter()
            .any(|(key, v)| key == "_lease/b" && v.is_empty())
    });
    // A --leasing-shared proxy refuses to start beside it (etcd's writers would not respect
    // shared leases).
    let out = Command::new(common::kvd_bin())
        .args([
            "grpc-proxy",
            "start",
            "--endpoints",
            &m.endpoint(),
            PREFIX,
            "--leasing-shared",
        ])
        .arg(format!("--listen-addr=127.0.0.1:{}", common::free_port()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("an etcd proxy holds a leasing key"),
        "{err}"
    );
    let sent = k.metric("kvd_leasing_revocations_sent_total");
    assert!(via(&k, &["put", "b", "2"]).0);
    assert!(k.metric("kvd_leasing_revocations_sent_total") > sent);
    assert_eq!(get_value(&e, "b").as_deref(), Some("2"));
    // And a write through the kvd proxy of a key no one holds is applied once (etcd's
    // proxy applies such a write twice): one PUT event.
    // From the next revision on: the watch sees the put whenever it starts.
    let next = common::status_number(&m.endpoint(), "revision") + 1;
    let w = LiveCtl::start(
        &m.endpoint(),
        &["watch", "once", "--rev", &next.to_string()],
    );
    assert!(via(&k, &["put", "once", "v"]).0);
    assert!(via(&k, &["put", "once2", "v"]).0);
    assert_eq!(w.next(3), ["PUT", "once", "v"]);
    assert!(w.quiet_for(Duration::from_millis(500)));
    // A delete of a present key answers 1 deleted (etcd's proxy: 0).
    let (ok, out) = via(&k, &["del", "once"]);
    assert!(ok && out.trim() == "1", "{out}");
}

#[test]
fn bad_input_and_faults_get_clear_errors_and_leave_the_proxy_serving() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut kvd) = Proc::single_kvd(dir.path());
    let p = Proc::grpc_proxy(
        "proxy",
        dir.path(),
        &m.endpoint(),
        &[PREFIX, "--leasing-ttl=5s"],
    );
    p.wait_for("the proxy to answer", 20, || via(&p, &["get", "x"]).0);
    // A REVOKE on a leasing key the proxy does not hold (no lease, nobody's): ignored.
    ctl_ok(&m.endpoint(), &["put", "_lease/stray", "REVOKE"]);
    ctl_ok(&m.endpoint(), &["put", "stray", "1"]);
    assert_eq!(get_value(&p, "stray").as_deref(), Some("1"));
    ctl_ok(&m.endpoint(), &["put", "stray", "2"]);
    assert_eq!(get_value(&p, "stray").as_deref(), Some("2"));
    // Its leasing key deleted by a third party: the key is let go, and a write straight to
    // the cluster afterwards is seen.
    ctl_ok(&m.endpoint(), &["put", "k", "1"]);
    until_held(&p, "k");
    ctl_ok(&m.endpoint(), &["del", "_lease/k"]);
    p.wait_for("the key let go", 10, || {
        p.metric("etcd_grpc_proxy_cache_keys_total") == 1
    });
    ctl_ok(&m.endpoint(), &["put", "k", "2"]);
    assert_eq!(get_value(&p, "k").as_deref(), Some("2"));
    // A write straight to the cluster of a held key: the watch sees it, the next read asks
    // the cluster.
    until_held(&p, "k");
    ctl_ok(&m.endpoint(), &["put", "k", "3"]);
    p.wait_for("the bypassing write seen", 10, || {
        get_value(&p, "k").as_deref() == Some("3")
    });
    // A 1 MiB value through the proxy, both ways, from the cache too.
    let big = "v".repeat(1 << 20);
    let file = dir.path().join("big");
    std::fs::write(&file, &big).unwrap();
    let out = ctl_input(&p.addrs.endpoint(), &["put", "big"], &big);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for _ in 0..3 {
        assert_eq!(get_value(&p, "big").map(|v| v.len()), Some(1 << 20));
    }
    // Over the proxy's send limit to the cluster: grpc-go's error, as etcd's proxy.
    let huge = "v".repeat(2 << 20);
    let out = ctl_input(
        &p.addrs.endpoint(),
        &["put", "huge", "--max-request-bytes=4194304"],
        &huge,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("trying to send message larger than max"),
        "{err}"
    );
    // The cluster down, and up again: errors meanwhile, answers after.
    kvd.kill();
    let (ok, _) = via(&p, &["put", "k", "4"]);
    assert!(!ok);
    let _ = std::fs::remove_file(&file);
    let mut again = Proc::kvd(
        &m,
        &dir.path().join("kvd"),
        std::slice::from_ref(&m),
        "new",
        &[],
    );
    again.wait_ready();
    p.wait_for("the proxy to answer again", 30, || {
        via(&p, &["put", "k", "5"]).0
    });
    assert_eq!(get_value(&p, "k").as_deref(), Some("5"));
    // A client that gives up on a write waiting for a holder that does not answer: the
    // proxy serves on. (A second proxy holds the key, paused.)
    let q = Proc::grpc_proxy(
        "paused",
        dir.path(),
        &m.endpoint(),
        &[PREFIX, "--leasing-ttl=5s"],
    );
    ctl_ok(&m.endpoint(), &["put", "held", "1"]);
    until_held(&q, "held");
    q.signal("-STOP");
    let (ok, _) = via(&p, &["put", "held", "2"]);
    assert!(!ok, "the write waits for the paused holder");
    assert_eq!(get_value(&p, "k").as_deref(), Some("5"));
    q.signal("-CONT");
    p.wait_for("the write through", 20, || via(&p, &["put", "held", "3"]).0);
    assert_eq!(get_value(&q, "held").as_deref(), Some("3"));
    // Unknown and unsupported flags fail clearly.
    for (flag, want) in [
        ("--no-such-flag", "unexpected argument"),
        ("--resolver-prefix=x", "not supported"),
        ("--leasing-shared", "needs --experimental-leasing-prefix"),
    ] {
        let out = Command::new(common::kvd_bin())
            .args(["grpc-proxy", "start", flag])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{flag}: {err}");
    }
}

/// TLS on both sides, with etcd's grpc-proxy flags: `--cacert`/`--cert`/`--key` to a cluster
/// that requires client certificates, `--cert-file`/`--key-file`/`--trusted-ca-file` to the
/// proxy's own clients.
#[test]
fn the_proxy_speaks_tls_to_its_clients_and_to_its_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let mut ca = common::pki::Ca::new(&dir.path().join("pki"), "cluster");
    let server = ca.issue("server", "server");
    let client = ca.issue("client", "client");
    let (m, _kvd) = Proc::single_kvd_tls(dir.path(), &server, &ca.cert, &client);
    let path = |p: &std::path::Path| p.display().to_string();
    let metrics = format!("http://127.0.0.1:{}", common::free_port());
    let flags = [
        PREFIX.to_string(),
        format!("--metrics-addr={metrics}"),
        format!("--cacert={}", path(&ca.cert)),
        format!("--cert={}", path(&client.cert)),
        format!("--key={}", path(&client.key)),
        format!("--cert-file={}", path(&server.cert)),
        format!("--key-file={}", path(&server.key)),
        format!("--trusted-ca-file={}", path(&ca.cert)),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let p = Proc::grpc_proxy("proxy", dir.path(), &m.client_hostport(), &flags);
    let tls = client.ctl_flags(&ca.cert);
    let ctl_tls = |args: &[&str]| {
        let mut all: Vec<&str> = tls.iter().map(String::as_str).collect();
        all.extend_from_slice(args);
        ctl(&p.addrs.endpoint(), &all)
    };
    p.wait_for("the proxy to answer over TLS", 20, || {
        ctl_tls(&["put", "k", "v"]).status.success()
    });
    for _ in 0..3 {
        let out = ctl_tls(&["get", "k", "--print-value-only"]);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "v\n");
    }
    // Its metrics on --metrics-addr, in the clear.
    let (code, body) = common::http_get(&metrics, "/metrics");
    assert_eq!(code, 200);
    let hits = common::metric_in(&body, "etcd_grpc_proxy_cache_hits_total");
    assert!(hits >= 1, "{body}");
    // A client in the clear, or without a certificate, is refused.
    assert!(!via(&p, &["get", "k"]).0);
}

/// etcd's JSON gateway on the proxy's port (etcd's proxy has none): writes through the
/// leasing protocol, reads from the cache, a lease, and errors as the gateway writes them.
#[test]
fn the_json_gateway_works_through_the_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _kvd) = Proc::single_kvd(dir.path());
    let p = Proc::grpc_proxy("proxy", dir.path(), &m.endpoint(), &[PREFIX]);
    p.wait_for("the proxy to answer", 20, || via(&p, &["get", "x"]).0);
    let post =
        |path: &str, body: &str| common::http_request(&p.addrs.client, "POST", path, &[], body);
    // base64: "gk" = Z2s=, "v1" = djE=
    let (code, body) = post("/v3/kv/put", r#"{"key":"Z2s=","value":"djE="}"#);
    assert_eq!(code, 200, "{body}");
    for _ in 0..3 {
        let (code, body) = post("/v3/kv/range", r#"{"key":"Z2s="}"#);
        assert_eq!(code, 200, "{body}");
        assert!(body.contains(r#""value":"djE=""#), "{body}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(p.metric("etcd_grpc_proxy_cache_hits_total") >= 1);
    let (code, body) = post("/v3/lease/grant", r#"{"TTL":"30"}"#);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(r#""TTL":"30""#), "{body}");
    let (code, body) = post("/v3/kv/put", r#"{"key":"","value":"djE="}"#);
    assert_eq!(
        (code, body.as_str()),
        (
            400,
            r#"{"code":3,"message":"etcdserver: key is not provided"}"#
        )
    );
    assert_eq!(
        ctl_ok(&m.endpoint(), &["get", "gk", "--print-value-only"]),
        "v1\n"
    );
}

/// Cut off from its cluster, a leasing proxy redials after grpc-go's back-off (1 s, ×1.6, ±20 %,
/// to 120 s) while its clients keep calling, as etcd's proxy does, not at once each time; once
/// healed it serves again. etcd 3.6.5's proxy, in front of the same cut, is counted beside it.
#[test]
fn a_proxy_cut_off_from_its_cluster_redials_after_a_back_off() {
    use std::sync::atomic::Ordering;
    const CUT: Duration = Duration::from_secs(20);
    let dir = tempfile::tempdir().unwrap();
    let (m, _kvd) = Proc::single_kvd(dir.path());
    let mut dials = Vec::new();
    for (name, etcds) in [("kvd", false), ("etcd", true)] {
        let cut = common::Proxy::start(m.client_hostport());
        let p = if etcds {
            Proc::etcd_grpc_proxy(name, dir.path(), &cut.addr, &[PREFIX])
        } else {
            Proc::grpc_proxy(name, dir.path(), &cut.addr, &[PREFIX])
        };
        p.wait_for("the proxy to answer", 20, || via(&p, &["get", "x"]).0);
        cut.cut();
        let before = cut.accepted.load(Ordering::Relaxed);
        let until = Instant::now() + CUT;
        while Instant::now() < until {
            // A client that keeps asking.
            let _ = via(&p, &["get", "x"]);
            std::thread::sleep(Duration::from_millis(200));
        }
        let during = cut.accepted.load(Ordering::Relaxed) - before;
        cut.heal();
        p.wait_for("the proxy to serve again", 60, || via(&p, &["get", "x"]).0);
        dials.push((name, during));
    }
    println!("connections to the cluster in {CUT:?} cut off: {dials:?}");
    // Two addresses' back-offs (the gRPC channel's and the direct calls'), each 1 + 1 + 1.6 +
    // 2.56 + 4.1 + 6.55 s ≈ 6 attempts in 20 s, jitter aside.
    assert!(dials[0].1 <= 20, "kvd's proxy dialed {} times", dials[0].1);
}
