//! etcd's JSON gateway (`POST /v3/...`) against kvd and against etcd v3.6.5: the same requests
//! get the same HTTP status and the same JSON (once the ids, terms and clocks that differ
//! between two servers by design are taken out), streams included.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::Proc;
use serde_json::Value;

/// An HTTP/1.1 request; (status, body). A streamed answer is read for `stream_for` and its
/// lines returned one per line.
fn http(
    url: &str,
    method: &str,
    path: &str,
    body: &str,
    stream_for: Option<Duration>,
) -> (u16, String) {
    http_watching(url, method, path, body, stream_for, |_| {})
}

/// As [`http`], showing `seen` all that a streamed answer has brought so far at each read.
fn http_watching(
    url: &str,
    method: &str,
    path: &str,
    body: &str,
    stream_for: Option<Duration>,
    mut seen: impl FnMut(&[u8]),
) -> (u16, String) {
    let mut s = send(url, method, path, body);
    let mut raw = Vec::new();
    match stream_for {
        None => {
            s.read_to_end(&mut raw)
                .unwrap_or_else(|e| panic!("{method} {path} {body:.100} at {url}: {e}"));
        }
        Some(d) => {
            let deadline = Instant::now() + d;
            s.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            let mut buf = [0u8; 4096];
            while Instant::now() < deadline {
                match s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        raw.extend_from_slice(&buf[..n]);
                        seen(&raw);
                    }
                    Err(_) => {}
                }
            }
        }
    }
    parse(&raw)
}

/// A connection with the request written on it.
fn send(url: &str, method: &str, path: &str, body: &str) -> TcpStream {
    let addr = url.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

/// As [`http`] (no stream), for the reference server: a request whose connection was reset is
/// made again. etcd sometimes resets the connection of a request it answers 404 without
/// reading its body; that is not what is compared.
fn http_reference(url: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    for _ in 0..5 {
        let mut raw = Vec::new();
        match send(url, method, path, body).read_to_end(&mut raw) {
            Ok(_) => return parse(&raw),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("{method} {path} {body:.100} at {url}: {e}"),
        }
    }
    panic!("{method} {path} {body:.100} at {url}: reset five times")
}

/// (status, body) of a raw HTTP/1.1 answer; a chunked body's JSON lines one per line.
fn parse(raw: &[u8]) -> (u16, String) {
    let resp = String::from_utf8_lossy(raw).to_string();
    let code = resp.split_whitespace().nth(1).unwrap().parse().unwrap();
    let (head, rest) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        // Each JSON line of a chunked body (chunk sizes dropped).
        rest.split("\r\n")
            .flat_map(|p| p.lines())
            .filter(|l| l.starts_with('{'))
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        rest.to_string()
    };
    (code, body)
}

/// Takes out what differs between two servers by design: ids, terms, URLs, remaining TTLs and
/// the status fields that describe the implementation.
fn scrub(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for k in [
                "cluster_id",
                "member_id",
                "raft_term",
                "peerURLs",
                "clientURLs",
                "TTL_left",
            ] {
                m.remove(k);
            }
            if m.contains_key("grantedTTL") {
                m.remove("TTL");
            }
            if m.get("name").is_some() && m.contains_key("ID") && m.contains_key("name") {
                m.remove("ID");
            }
            for v in m.values_mut() {
                scrub(v);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(scrub),
        _ => {}
    }
}

fn normalized(body: &str) -> String {
    body.lines()
        .map(|l| match serde_json::from_str::<Value>(l) {
            Ok(mut v) => {
                scrub(&mut v);
                v.to_string()
            }
            Err(_) => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// (path, body) posted in order; bodies use base64 keys: Zm9v = "foo", YmFy = "bar".
const SCRIPT: &[(&str, &str)] = &[
    ("/v3/kv/put", r#"{"key":"Zm9v","value":"YmFy"}"#),
    ("/v3/kv/range", r#"{"key":"Zm9v"}"#),
    ("/v3/kv/range", r#"{"key":"Zm9v","countOnly":true}"#),
    (
        "/v3/kv/range",
        r#"{"key":"Zm9v","sort_order":"DESCEND","revision":"2","bogus":[1]}"#,
    ),
    (
        "/v3/kv/range",
        r#"{"key":"Zm9v","sort_order":2,"revision":2}"#,
    ),
    ("/v3/kv/range", ""),
    ("/v3/kv/put", r#"{"key":"","value":"YmFy"}"#),
    ("/v3/kv/range", r#"{"key":"Zm9v","revision":"100"}"#),
    (
        "/v3/kv/txn",
        r#"{"compare":[{"key":"Zm9v","result":"EQUAL","target":"VALUE","value":"YmFy"}],"success":[{"request_range":{"key":"Zm9v"}},{"request_put":{"key":"Zm9v","value":"YmF6","prev_kv":true}}],"failure":[]}"#,
    ),
    ("/v3/kv/deleterange", r#"{"key":"Zm9v","prev_kv":true}"#),
    ("/v3/kv/deleterange", r#"{"key":"bm8="}"#),
    ("/v3/lease/grant", r#"{"TTL":30,"ID":77}"#),
    (
        "/v3/kv/put",
        r#"{"key":"bGVhc2Vk","value":"dg==","lease":"77"}"#,
    ),
    ("/v3/lease/timetolive", r#"{"ID":77,"keys":true}"#),
    ("/v3/kv/lease/timetolive", r#"{"ID":78}"#),
    ("/v3/lease/leases", "{}"),
    ("/v3/lease/revoke", r#"{"ID":78}"#),
    ("/v3/kv/lease/revoke", r#"{"ID":"77"}"#),
    ("/v3/kv/range", r#"{"key":"AA==","range_end":"AA=="}"#),
    ("/v3/kv/compaction", r#"{"revision":3}"#),
    ("/v3/kv/compaction", r#"{"revision":3}"#),
    ("/v3/kv/range", r#"{"key":"Zm9v","revision":2}"#),
    ("/v3/cluster/member/list", "{}"),
    ("/v3/auth/status", "{}"),
    ("/v3/auth/user/list", "{}"),
    ("/v3/auth/role/list", "{}"),
    ("/v3/auth/user/get", r#"{"name":"nobody"}"#),
    ("/v3/maintenance/alarm", "{}"),
    ("/v3/lease/grant", r#"{"TTL":60,"ID":79}"#),
    ("/v3/lock/lock", r#"{"name":"bGs=","lease":"79"}"#),
    ("/v3/lock/unlock", r#"{"key":"bGsvNGY="}"#),
    ("/v3/election/leader", r#"{"name":"ZWw="}"#),
    (
        "/v3/election/campaign",
        r#"{"name":"ZWw=","lease":"79","value":"djE="}"#,
    ),
    ("/v3/election/leader", r#"{"name":"ZWw="}"#),
    ("/v3/nosuch", "{}"),
];

/// Bodies etcd's gateway refuses (or takes, though they look wrong).
const MALFORMED: &[(&str, &str)] = &[
    ("/v3/kv/put", "garbage"),
    ("/v3/kv/range", "{"),
    ("/v3/kv/range", "  x"),
    ("/v3/kv/range", r#"{"key":"Zm9v",}"#),
    ("/v3/kv/range", r#"{"key" "Zm9v"}"#),
    ("/v3/kv/range", r#"{"key": 5}"#),
    ("/v3/kv/range", r#"{"key":"!!!"}"#),
    ("/v3/kv/range", r#"{"key":"Zm9v","limit":"x"}"#),
    ("/v3/kv/range", "[]"),
    ("/v3/kv/range", r#""str""#),
    ("/v3/kv/range", r#"{"key":"Zm9v","sort_order":{}}"#),
    ("/v3/kv/range", r#"{"key":"Zm9v","keys_only":"true"}"#),
    ("/v3/kv/range", r#"{"key":"Zm9v","key":"Zm9v"}"#),
    ("/v3/kv/range", r#"{"key":"Zm9v","revision":1.5}"#),
    (
        "/v3/kv/range",
        r#"{"key":"Zm9v","limit":1e2,"sort_order":"BAD"}"#,
    ),
    ("/v3/kv/range", r#"{"key":"Zm9v"} trailing"#),
    ("/v3/kv/range", "{\n\"key\":\n5}"),
    (
        "/v3/kv/txn",
        r#"{"success":[{"request_put":{"key":"Zm9v"},"request_range":{}}]}"#,
    ),
    ("/v3/kv/txn", r#"{"compare":{}}"#),
    ("/v3/cluster/member/add", r#"{"peerURLs":[5]}"#),
    ("/v3/lease/grant", r#"{"TTL":"x"}"#),
];

/// The script's answers from the server at `url`; `reference`: it is etcd (see
/// [`http_reference`]).
fn run(url: &str, reference: bool) -> Vec<String> {
    let mut out = Vec::new();
    for (path, body) in SCRIPT {
        let (code, resp) = if reference {
            http_reference(url, "POST", path, body)
        } else {
            http(url, "POST", path, body, None)
        };
        out.push(format!("POST {path} {body}\n{code} {}", normalized(&resp)));
    }
    // Values over --max-request-bytes (etcd's refusal) and over gRPC's receive limit
    // (grpc-go's, with the encoded size): "x" * n is "eHh4" * n/3 in base64.
    for n in [1_650_000, 2_250_000] {
        let body = format!(r#"{{"key":"Ymln","value":"{}"}}"#, "eHh4".repeat(n / 3));
        let (code, resp) = http(url, "POST", "/v3/kv/put", &body, None);
        out.push(format!("put {n} bytes\n{code} {}", normalized(&resp)));
    }
    // Bodies that do not parse, or not as the request: etcd's words (Go's JSON syntax errors,
    // protojson's), what follows the first value ignored.
    for (path, body) in MALFORMED {
        let (code, resp) = http(url, "POST", path, body, None);
        // protojson writes "proto:" and a space or a no-break space, by the binary's hash,
        // so that nobody relies on its text: either is taken as the other.
        let resp = normalized(&resp).replace('\u{a0}', " ");
        out.push(format!("POST {path} {body}\n{code} {resp}"));
    }
    // Not POST.
    let (code, resp) = http(url, "GET", "/v3/kv/range", "", None);
    out.push(format!("GET /v3/kv/range\n{code} {}", normalized(&resp)));

    // Streams: two watchers on one stream, then a put; keep-alives for a live and a gone lease.
    let (up, both_created) = std::sync::mpsc::channel();
    let watch = std::thread::spawn({
        let url = url.to_string();
        move || {
            let body = r#"{"create_request":{"key":"d2F0Y2hlZA==","prev_kv":true}} {"create_request":{"key":"Zm9v","start_revision":1}}"#;
            http_watching(
                &url,
                "POST",
                "/v3/watch",
                body,
                Some(Duration::from_millis(2000)),
                |raw| {
                    let raw = String::from_utf8_lossy(raw);
                    let created = raw.matches(r#""created":true"#).count();
                    if created == 2 && raw.contains(r#""canceled":true"#) {
                        let _ = up.send(());
                    }
                },
            )
        }
    });
    // Both watchers are created, and the one below the compaction canceled, before the puts
    // the other must see.
    both_created
        .recv_timeout(Duration::from_secs(10))
        .expect("both watchers created, one canceled");
    http(
        url,
        "POST",
        "/v3/kv/put",
        r#"{"key":"d2F0Y2hlZA==","value":"MQ=="}"#,
        None,
    );
    http(
        url,
        "POST",
        "/v3/kv/put",
        r#"{"key":"d2F0Y2hlZA==","value":"Mg=="}"#,
        None,
    );
    let (code, resp) = watch.join().unwrap();
    out.push(format!("watch\n{code} {}", normalized(&resp)));
    let body = r#"{"ID":79} {"ID":80}"#;
    let (code, resp) = http(
        url,
        "POST",
        "/v3/lease/keepalive",
        body,
        Some(Duration::from_millis(1000)),
    );
    out.push(format!("keepalive\n{code} {}", normalized(&resp)));
    out
}

#[test]
fn the_json_gateway_answers_as_etcds() {
    let dir = tempfile::tempdir().unwrap();
    let (k, _kvd) = Proc::single_kvd(dir.path());
    let (e, _etcd) = Proc::single_etcd(dir.path());
    println!("kvd at {}, etcd at {}", k.client, e.client);
    let want = run(&e.client, true);
    let got = run(&k.client, false);
    common::assert_same_answers(&want, &got);
    // Not vacuous: both size limits answered (etcd's text, then grpc-go's with the sizes)...
    let all = want.join("\n");
    assert!(
        all.contains(r#"400 {"code":3,"message":"etcdserver: request is too large"}"#),
        "{all}"
    );
    assert!(
        all.contains(r#"429 {"code":8,"message":"grpc: received message larger than max ("#),
        "{all}"
    );
    // ...the malformed bodies refused in Go's words and protojson's...
    assert!(
        all.contains("invalid character 'g' looking for beginning of value"),
        "{all}"
    );
    assert!(
        all.contains("proto: (line 1:9): invalid value for bytes field key: 5"),
        "{all}"
    );
    // ...and the watch saw both puts, with the previous value on the second.
    let watch = want.iter().find(|l| l.starts_with("watch")).unwrap();
    assert!(watch.contains(r#""prev_kv":{"#), "{watch}");
}
