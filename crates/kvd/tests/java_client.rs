//! jetcd — Java's etcd client, Vert.x gRPC over Netty's HTTP/2 — against kvd and, with the
//! same expectations, against etcd: the JUnit tests of `tests/clients/java` (KV, Txn and
//! etcd's errors, a 1 MiB value, 200 calls at once on one connection, Watch, Lease, Lock and
//! Election), run by Maven with its downloads and build under target/ — in the clear and over
//! mutual TLS.

mod common;

use std::path::Path;
use std::process::Command;

use common::pki::Ca;
use common::{run, Proc};

#[test]
fn jetcd_works_against_kvd_as_against_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let (k, _kvd) = Proc::single_kvd(dir.path());
    let (e, _etcd) = Proc::single_etcd(dir.path());
    let mut ca = Ca::new(&dir.path().join("pki"), "cluster");
    let server = ca.issue("server", "server");
    let client = ca.issue("client", "client");
    let (kt, _kvd_tls) = Proc::single_kvd_tls(dir.path(), &server, &ca.cert, &client);
    let (et, _etcd_tls) = Proc::single_etcd_tls(dir.path(), &server, &ca.cert, &client);
    // jetcd through a kvd leasing proxy in front of kvd too.
    let proxy = Proc::grpc_proxy(
        "proxy",
        dir.path(),
        &k.endpoint(),
        &["--experimental-leasing-prefix=_lease/"],
    );

    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let build = tmp.join("java-client");
    let reports = build.join("surefire-reports");
    let _ = std::fs::remove_dir_all(&reports);
    let pom = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/clients/java/pom.xml");
    run(
        Command::new("mvn")
            .args(["-q", "-B", "test", "-f"])
            .arg(&pom)
            .arg(format!("-Dmaven.repo.local={}", tmp.join("m2").display()))
            .arg(format!("-Dkvd.build.dir={}", build.display()))
            .arg(format!(
                "-Dendpoints=kvd={},etcd={},kvd-tls={},etcd-tls={},kvd-proxy={}",
                k.client, e.client, kt.client, et.client, proxy.addrs.client
            ))
            .arg(format!("-Dtls.cacert={}", ca.cert.display()))
            .arg(format!("-Dtls.cert={}", client.cert.display()))
            .arg(format!("-Dtls.key={}", client.key.display())),
        "mvn test (are Java 17 and Maven installed?)",
    );
    // Every test ran, against the four servers.
    let report = std::fs::read_to_string(reports.join("TEST-kvd.JetcdTest.xml")).unwrap();
    let suite = report.lines().find(|l| l.contains("<testsuite ")).unwrap();
    for want in [
        r#"tests="25""#,
        r#"failures="0""#,
        r#"errors="0""#,
        r#"skipped="0""#,
    ] {
        assert!(suite.contains(want), "{want} not in {suite}");
    }
}
