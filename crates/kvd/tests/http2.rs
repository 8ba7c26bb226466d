//! HTTP/2 on the client port: conformance (h2spec, every case of RFC 7540/9113 and RFC 7541,
//! strict ones included, against a running kvd) and etcd's gRPC flags.
//!
//! One case is expected to fail, and only that one: h2spec sends garbage instead of the
//! connection preface and wants the connection closed, but kvd's client port also speaks
//! HTTP/1.1 (the JSON gateway, `/health`, `/metrics`), as etcd's does, so anything that is
//! not HTTP/2's preface is answered as HTTP/1.1 ("400 Bad Request").

mod common;

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use common::Proc;

/// The h2spec case allowed to fail, as its JUnit report names it.
const HTTP1_ON_THE_SAME_PORT: (&str, &str) = ("http2/3.5", "Sends invalid connection preface");

/// (package, case, message) of every case an h2spec JUnit report marks failed.
fn failures(report: &str) -> Vec<(String, String, String)> {
    let attr = |tag: &str, name: &str| -> String {
        let key = format!("{name}=\"");
        tag.find(&key)
            .map(|i| {
                let rest = &tag[i + key.len()..];
                rest[..rest.find('"').unwrap_or(rest.len())].to_string()
            })
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for case in report.split("<testcase ").skip(1) {
        let tag = &case[..case.find('>').unwrap_or(case.len())];
        let body = &case[..case.find("</testcase>").unwrap_or(case.len())];
        // h2spec reports a wrong answer as <failure> and a broken exchange as <error>.
        if let Some(i) = body.find("<failure").or_else(|| body.find("<error")) {
            out.push((
                attr(tag, "package"),
                attr(tag, "classname"),
                body[i..].chars().take(400).collect(),
            ));
        }
    }
    out
}

#[test]
fn the_client_port_passes_h2spec() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _kvd) = Proc::single_kvd(dir.path());
    let report = dir.path().join("h2spec.xml");
    let port = m.endpoint().rsplit(':').next().unwrap().to_string();
    let out = Command::new(common::tools().join("h2spec"))
        .args(["--strict", "-h", "127.0.0.1", "-p", &port, "-o", "5", "-j"])
        .arg(&report)
        .output()
        .expect("run h2spec");
    let xml = std::fs::read_to_string(&report).unwrap_or_else(|e| {
        panic!(
            "h2spec wrote no report ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let cases = xml.matches("<testcase ").count();
    assert!(cases >= 140, "h2spec ran only {cases} cases:\n{xml}");
    let failed = failures(&xml);
    let unexpected: Vec<_> = failed
        .iter()
        .filter(|(p, c, _)| (p.as_str(), c.as_str()) != HTTP1_ON_THE_SAME_PORT)
        .collect();
    assert!(
        unexpected.is_empty(),
        "h2spec failures on kvd's client port: {unexpected:#?}"
    );
    // The one expected failure is still there: the report is read right.
    assert_eq!(failed.len(), 1, "{failed:?}");
}

#[test]
fn a_junit_report_is_read_right() {
    let xml = r#"<testsuites><testsuite name="x" package="http2/3.5">
        <testcase package="http2/3.5" classname="Sends client connection preface" time="0.1"></testcase>
        <testcase package="http2/3.5" classname="Sends invalid connection preface" time="0.1"><error>boom</error></testcase>
        <testcase package="http2/4.2" classname="Sends a DATA frame" time="0.1"/>
        <testcase package="http2/4.3" classname="Sends invalid header block" time="0.1"><failure message="">x</failure></testcase>
        </testsuite></testsuites>"#;
    let f = failures(xml);
    assert_eq!(f.len(), 2, "{f:?}");
    assert_eq!((f[0].0.as_str(), f[0].1.as_str()), HTTP1_ON_THE_SAME_PORT);
    assert_eq!(f[1].0, "http2/4.3");
}

/// `--max-concurrent-streams` is announced in the port's SETTINGS, and with
/// `--grpc-keepalive-interval`/`--grpc-keepalive-timeout` a client that does not answer pings
/// is dropped.
#[test]
fn etcds_grpc_flags_reach_the_client_port() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _kvd) = Proc::single_kvd_with(
        dir.path(),
        &[
            "--max-concurrent-streams",
            "7",
            "--grpc-keepalive-interval",
            "300ms",
            "--grpc-keepalive-timeout",
            "300ms",
        ],
    );
    let mut sock = std::net::TcpStream::connect(m.endpoint()).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    sock.write_all(&hello).unwrap();
    let started = Instant::now();
    let mut frames = Vec::new();
    let mut head = [0u8; 9];
    // Frames until the server closes the connection (it must: the pings go unanswered).
    while sock.read_exact(&mut head).is_ok() {
        let len = (head[0] as usize) << 16 | (head[1] as usize) << 8 | head[2] as usize;
        let mut payload = vec![0; len];
        sock.read_exact(&mut payload).unwrap();
        frames.push((head[3], head[4], payload));
    }
    let closed_after = started.elapsed();
    let settings = &frames[0];
    assert_eq!((settings.0, settings.1), (4, 0), "{frames:?}");
    let max_streams = settings
        .2
        .chunks_exact(6)
        .find(|p| p[..2] == [0, 3])
        .map(|p| u32::from_be_bytes([p[2], p[3], p[4], p[5]]));
    assert_eq!(max_streams, Some(7));
    assert!(
        frames.iter().any(|f| f.0 == 6 && f.1 == 0),
        "no keepalive ping: {frames:?}"
    );
    assert!(
        closed_after >= Duration::from_millis(500) && closed_after < Duration::from_secs(5),
        "closed after {closed_after:?}"
    );
}
