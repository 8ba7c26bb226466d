//! Go's clientv3 and its concurrency package (mutex, election, STM) against kvd: runs the Go
//! test module in `tests/clients/go` with a kvd process's endpoint — in the clear, over
//! mutual TLS as a user of an auth-enabled kvd, and through a kvd leasing proxy in front of
//! kvd and of etcd. The same module holds the leasing proxy's linearizability harness and the
//! robustness suite's short profile.

mod common;

use std::path::Path;
use std::process::Command;

use common::pki::Ca;
use common::{Addrs, Proc};

/// `go test` of the module with `env`; its output, asserting that every test in `tests` passed.
fn go_test(env: &[(&str, String)], tests: &[&str]) -> String {
    go_test_in("./...", env, tests)
}

/// `go test` of the module's packages `pkgs`, as [`go_test`].
fn go_test_in(pkgs: &str, env: &[(&str, String)], tests: &[&str]) -> String {
    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/clients/go");
    let out = Command::new("go")
        .args(["test", "-count=1", "-timeout=20m", "-v", pkgs])
        .current_dir(&module)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("GOFLAGS", "-mod=mod")
        .output()
        .expect("run go test (is Go installed?)");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    // What failed and why first: a report cut short in the middle (as CI's is) keeps them.
    let why: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("--- FAIL") || l.contains("_test.go:"))
        .collect();
    assert!(
        out.status.success(),
        "go test failed:\n{}\n\nits output:\n{stdout}\n{}",
        why.join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
    // Every test ran (none skipped for want of the endpoint).
    for t in tests {
        assert!(
            stdout.contains(&format!("--- PASS: {t}")),
            "{t} did not pass:\n{stdout}"
        );
    }
    stdout
}

const ALL: &[&str] = &[
    "TestKVTxnAndErrors",
    "TestWatchAndLease",
    "TestLeaseExpires",
    "TestMutexExcludes",
    "TestElection",
    "TestSTMTransfersConserveTheTotal",
];

#[test]
fn go_clientv3_and_concurrency_work_against_kvd() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _kvd) = Proc::single_kvd(dir.path());
    let out = go_test(&[("KVD_ENDPOINTS", m.endpoint())], ALL);
    assert!(out.contains("--- SKIP: TestAuthTypedErrors"), "{out}");
}

#[test]
fn go_clientv3_works_over_mutual_tls_as_a_user_of_an_auth_enabled_kvd() {
    let dir = tempfile::tempdir().unwrap();
    let mut ca = Ca::new(&dir.path().join("pki"), "cluster");
    let server = ca.issue("server", "server");
    let client = ca.issue("client", "client");
    let m = Addrs::new_tls("default");
    let m = Addrs {
        peer: m.peer.replacen("https", "http", 1),
        peer_listen: m.peer_listen.replacen("https", "http", 1),
        ..m
    };
    let flags = [
        format!("--cert-file={}", server.cert.display()),
        format!("--key-file={}", server.key.display()),
        format!("--trusted-ca-file={}", ca.cert.display()),
        "--client-cert-auth".to_string(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut kvd = Proc::kvd(
        &m,
        &dir.path().join("kvd"),
        std::slice::from_ref(&m),
        "new",
        &flags,
    );
    kvd.ctl_flags = client.ctl_flags(&ca.cert);
    kvd.ctl_flags
        .extend(["--user".to_string(), "root:rootpw".to_string()]);
    kvd.wait_ready();
    let tls = client.ctl_flags(&ca.cert);
    for cmd in [
        "user add root --new-user-password=rootpw",
        "role add root",
        "user grant-role root root",
        "user add guest --new-user-password=guestpw",
        "auth enable",
    ] {
        let mut args: Vec<&str> = tls.iter().map(String::as_str).collect();
        args.extend(cmd.split_whitespace());
        common::ctl_ok(&m.endpoint(), &args);
    }
    let mut tests = ALL.to_vec();
    tests.push("TestAuthTypedErrors");
    go_test(
        &[
            ("KVD_ENDPOINTS", m.endpoint()),
            ("KVD_CACERT", ca.cert.display().to_string()),
            ("KVD_CERT", client.cert.display().to_string()),
            ("KVD_KEY", client.key.display().to_string()),
            ("KVD_USER", "root".into()),
            ("KVD_PASSWORD", "rootpw".into()),
            ("KVD_OTHER_USER", "guest:guestpw".into()),
        ],
        &tests,
    );
}

/// The whole suite through a kvd leasing proxy, in front of kvd and in front of etcd 3.6.5:
/// clientv3 (KV, Txn, Watch, Lease, the concurrency package's mutex, election and STM) sees a
/// working etcd.
#[test]
fn go_clientv3_and_concurrency_work_through_a_kvd_leasing_proxy_in_front_of_kvd_and_of_etcd() {
    for backend in ["kvd", "etcd"] {
        let dir = tempfile::tempdir().unwrap();
        let (m, _cluster) = if backend == "kvd" {
            Proc::single_kvd(dir.path())
        } else {
            Proc::single_etcd(dir.path())
        };
        let proxy = Proc::grpc_proxy(
            "proxy",
            dir.path(),
            &m.endpoint(),
            &["--experimental-leasing-prefix=_lease/"],
        );
        go_test(&[("KVD_ENDPOINTS", proxy.addrs.endpoint())], ALL);
        // The suite's single-key reads are of keys with leases (never held) or serializable:
        // the proxy's cache is seen at work with a read of its own.
        let p = proxy.addrs.endpoint();
        common::ctl_ok(&p, &["put", "go/cached", "v"]);
        proxy.wait_for("a read answered from the cache", 10, || {
            common::ctl_ok(&p, &["get", "go/cached"]);
            proxy.metric("etcd_grpc_proxy_cache_hits_total") > 0
        });
    }
}

/// The leasing proxy's linearizability under faults (porcupine over recorded histories,
/// `tests/clients/go/leasing`), and the checker seen to fail on a stale read.
#[test]
fn leasing_proxies_stay_linearizable_under_faults() {
    go_test(
        &[("KVD_LEASING_BIN", common::kvd_bin().to_string())],
        &[
            "TestLeasingProxiesAreLinearizableUnderFaults/no-fault",
            "TestLeasingProxiesAreLinearizableUnderFaults/slow-link",
            "TestLeasingProxiesAreLinearizableUnderFaults/kill-proxy",
            "TestLeasingProxiesAreLinearizableUnderFaults/pause-proxy-past-ttl",
            "TestLeasingProxiesAreLinearizableUnderFaults/pause-proxy-within-ttl",
            "TestLeasingProxiesAreLinearizableUnderFaults/cut-proxy-past-ttl",
            "TestLeasingProxiesAreLinearizableUnderFaults/cut-proxy-within-ttl",
            "TestLeasingProxiesAreLinearizableUnderFaults/kill-leader",
            "TestLeasingProxiesAreLinearizableUnderFaults/cut-a-proxy-and-pause-the-other",
            "TestTheCheckerCatchesAStaleReadFromAProxy",
        ],
    );
}

/// The robustness suite's short profile (`tests/clients/go/robustness`): three kvd members
/// behind forwarders, randomized traffic with every fault kind injected one at a time (the
/// failpoints too: the test command builds kvd with them) — 90 s of the etcd traffic, 60 s of
/// Kubernetes' —, the KV history checked by porcupine, every watcher's events, leases that
/// expire, the members' final state and alarms, and every list at a past revision; then each
/// validator fed the etcd run's records with a stale read, a dropped and a duplicated watch
/// event, a lost write, a wrong list and leases renewed after they expired, and seen to fail.
/// Also: a watch requiring a
/// leader ends on a member cut off from the cluster, as etcd's does (kvd's went on waiting
/// there); the checker takes no deletion of part of a lease's keys for its expiry. The long
/// profile is `tests/tools/robustness.sh`.
#[test]
fn a_cluster_under_random_faults_keeps_every_guarantee() {
    let out = go_test_in(
        "./robustness/",
        &[("KVD_ROBUSTNESS_BIN", common::kvd_bin().to_string())],
        &[
            "TestIsolationPartitionsAMember",
            "TestWatchRequiringALeaderEndsOnAnIsolatedMember",
            "TestShortProfileUnderFaults",
            "TestShortProfileUnderFaults/validators",
            "TestKubernetesProfileUnderFaults",
            "TestPatchTakesNoPartOfALeasesKeysForItsExpiry",
        ],
    );
    // The run's report, for the test's output.
    for line in out
        .lines()
        .filter(|l| l.contains("robustness_test.go") || l.starts_with("        "))
    {
        println!("{line}");
    }
}
