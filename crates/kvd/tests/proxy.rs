//! `kvd grpc-proxy start` with real clients (etcdctl), in front of kvd and in front of etcd
//! 3.6.5: the leasing article's walkthrough, answers as the cluster's, watch coalescing, locks
//! and elections, shared leases, the cache's bound, a prefix shared with etcd's own leasing
//! proxy, and bad input. Linearizability under faults is checked by the Go harness
//! (`tests/clients/go`, run from `go_client.rs`).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{ctl, ctl_input, ctl_ok, normalize, Proc};

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

/// A line-by-line reader of a spawned etcdctl.
struct Spawned {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Spawned {
    fn start(endpoint: &str, args: &[&str]) -> Spawned {
        let mut child = Command::new(common::tools().join("etcdctl"))
            .args(["--endpoints", endpoint])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        Spawned { child, lines }
    }

    /// The next `n` lines, within 10 s.
    fn next(&self, n: usize) -> Vec<String> {
        (0..n)
            .map(|_| {
                self.lines
                    .recv_timeout(Duration::from_secs(10))
                    .expect("a line from etcdctl")
            })
            .collect()
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn watches_locks_and_elections_through_the_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _kvd) = Proc::single_kvd(dir.path());
    let proxy = Proc::grpc_proxy("proxy", dir.path(), &m.endpoint(), &[PREFIX]);
    let p = proxy.addrs.endpoint();
    proxy.wait_for("the proxy to answer", 20, || via(&proxy, &["get", "x"]).0);
    // Two clients watching one key share one upstream watcher.
    let w1 = Spawned::start(&p, &["watch", "w", "--prev-kv"]);
    let w2 = Spawned::start(&p, &["watch", "w"]);
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
    let w3 = Spawned::start(&p, &["watch", "h", &format!("--rev={rev}")]);
    assert_eq!(w3.next(6), ["PUT", "h", "1", "PUT", "h", "2"]);
    ctl_ok(&p, &["put", "h", "3"]);
    assert_eq!(w3.next(3), ["PUT", "h", "3"]);
    // A lock: the second locker waits for the first.
    let first = Spawned::start(&p, &["lock", "--ttl=2", "mylock"]);
    let key = first.next(1);
    assert!(key[0].starts_with("mylock/"), "{key:?}");
    let second = Spawned::start(&p, &["lock", "--ttl=2", "mylock", "echo", "second"]);
    assert!(second
        .lines
        .recv_timeout(Duration::from_millis(800))
        .is_err());
    drop(first);
    assert_eq!(second.next(1), ["second"]);
    // An election: an observer through the proxy sees the leader's proclamation.
    let leader = Spawned::start(&p, &["elect", "myelection", "p1"]);
    assert!(leader.next(1)[0].starts_with("myelection/"));
    let listener = Spawned::start(&p, &["elect", "-l", "myelection"]);
    let l = listener.next(2);
    assert_eq!(l[1], "p1", "{l:?}");
    // MemberList names the proxy, as etcd's proxy does.
    let members = ctl_ok(&p, &["member", "list"]);
    assert!(members.contains(&p), "{members}");
}
