//! HTTP/2 conformance of the client port: h2spec (every case of RFC 7540/9113 and RFC 7541,
//! strict ones included) against a running kvd.
//!
//! One case is expected to fail, and only that one: h2spec sends garbage instead of the
//! connection preface and wants the connection closed, but kvd's client port also speaks
//! HTTP/1.1 (the JSON gateway, `/health`, `/metrics`), as etcd's does, so anything that is
//! not HTTP/2's preface is answered as HTTP/1.1 ("400 Bad Request").

mod common;

use std::process::Command;

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
