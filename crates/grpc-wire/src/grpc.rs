//! gRPC over HTTP/2: the message prefix, timeouts and statuses as trailers.

use std::time::Duration;

use bytes::Bytes;
use tonic::Status;

/// The prefix of a gRPC message: a compression flag and a big-endian length.
pub(crate) const PREFIX_LEN: usize = 5;

pub(crate) fn prefix(len: usize) -> [u8; PREFIX_LEN] {
    let l = (len as u32).to_be_bytes();
    [0, l[0], l[1], l[2], l[3]]
}

/// `grpc-timeout` (gRPC's PROTOCOL-HTTP2: up to eight digits and a unit).
pub(crate) fn parse_timeout(v: &[u8]) -> Option<Duration> {
    let (&unit, digits) = v.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The request message of a unary call: its first uncompressed message (grpc-go reads no
/// further, so bytes after it are ignored). Where the body ends before it, grpc-go's server
/// (etcd's) answers UNKNOWN with the reader's error: "EOF" when nothing came, "unexpected
/// EOF" when part of it did.
pub(crate) fn unary_message(body: &[u8]) -> Result<Bytes, Status> {
    if body.is_empty() {
        return Err(Status::unknown("EOF"));
    }
    if body.len() < PREFIX_LEN {
        return Err(Status::unknown("unexpected EOF"));
    }
    if body[0] != 0 {
        return Err(Status::internal(
            "grpc: compressed flag set with identity or empty encoding",
        ));
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    match body[PREFIX_LEN..].get(..len) {
        Some(msg) => Ok(Bytes::copy_from_slice(msg)),
        None => Err(Status::unknown("unexpected EOF")),
    }
}

/// Whether a content type is gRPC's: `application/grpc`, alone or with a subtype after `+`
/// or parameters after `;` (as grpc-go checks it; `application/grpc-web` is not).
pub(crate) fn is_content_type(v: &[u8]) -> bool {
    v.strip_prefix(b"application/grpc")
        .is_some_and(|rest| rest.is_empty() || rest[0] == b'+' || rest[0] == b';')
}

/// The service and method of a gRPC path (`/service/method`), if it is one.
pub(crate) fn method_of(path: &[u8]) -> Option<(&[u8], &[u8])> {
    let p = path.strip_prefix(b"/")?;
    let slash = p.iter().position(|&b| b == b'/')?;
    let (service, method) = (&p[..slash], &p[slash + 1..]);
    let ok = !service.is_empty() && !method.is_empty() && !method.contains(&b'/');
    ok.then_some((service, method))
}

/// grpc-go's (etcd's) answer to a gRPC request whose content type is not gRPC's: HTTP 415
/// with INVALID_ARGUMENT.
pub(crate) fn wrong_content_type(content_type: &[u8]) -> Status {
    Status::invalid_argument(format!(
        "invalid gRPC request content-type {:?}",
        String::from_utf8_lossy(content_type)
    ))
}

/// The length a message prefix announces, once the prefix has arrived.
pub(crate) fn announced_len(body: &[u8]) -> Option<usize> {
    (body.len() >= PREFIX_LEN)
        .then(|| u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize)
}

/// grpc-go's (etcd's) answer to a message over the receive limit.
pub fn too_large(found: usize, limit: usize) -> Status {
    Status::resource_exhausted(format!(
        "grpc: received message larger than max ({found} vs. {limit})"
    ))
}

/// A response of a gRPC service as grpc-go's server (etcd's) would give it: tonic's status
/// for a message over the receive limit rewritten (see [`rewrite_limit_status`]), and its
/// UNIMPLEMENTED without a message for a method a known service lacks given grpc-go's "unknown
/// method M for service S". `path` is the request's.
pub fn rewrite_status(path: &str, headers: &mut http::HeaderMap) {
    rewrite_limit_status(headers);
    let bare_unimplemented = headers.get("grpc-status").is_some_and(|v| v == "12")
        && !headers.contains_key("grpc-message");
    if !bare_unimplemented {
        return;
    }
    let status = match method_of(path.as_bytes()) {
        Some((service, method)) => Status::unimplemented(format!(
            "unknown method {} for service {}",
            String::from_utf8_lossy(method),
            String::from_utf8_lossy(service)
        )),
        None => unknown_service(path),
    };
    for (name, v) in status_fields(&status).iter() {
        headers.insert(name, v.clone());
    }
}

/// tonic's status for a message over its receive limit ("Error, decoded message length too
/// large: found N bytes, the limit is: M bytes"), rewritten in a response's `headers` to
/// grpc-go's (etcd's) code and text, so clients see the same from every service.
pub(crate) fn rewrite_limit_status(headers: &mut http::HeaderMap) {
    const TONIC: &str = "Error, decoded message length too large: found ";
    let msg = match headers.get("grpc-message").and_then(|v| v.to_str().ok()) {
        Some(m) if headers.get("grpc-status").is_some_and(|v| v == "11") => m
            .replace("%20", " ")
            .replace("%3A", ":")
            .replace("%2C", ","),
        _ => return,
    };
    if !msg.starts_with(TONIC) {
        return;
    }
    // "found N bytes, the limit is: M bytes" → "(N vs. M)".
    let nums: Vec<&str> = msg
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .collect();
    let status = match nums.as_slice() {
        [found, limit] => found.parse().ok().zip(limit.parse().ok()),
        _ => None,
    }
    .map_or_else(
        || Status::resource_exhausted("grpc: received message larger than max"),
        |(found, limit)| too_large(found, limit),
    );
    headers.remove("grpc-message");
    headers.remove("grpc-status");
    for (name, v) in status_fields(&status).iter() {
        headers.insert(name, v.clone());
    }
}

/// grpc-go's (etcd's) UNIMPLEMENTED for a gRPC path no service answers: "unknown service",
/// or "malformed method name" for a path that is not `/service/method`.
fn unknown_service(path: &str) -> Status {
    let p = path.strip_prefix('/').unwrap_or(path);
    match p.rfind('/') {
        Some(slash) => Status::unimplemented(format!("unknown service {}", &p[..slash])),
        None => Status::unimplemented(format!("malformed method name: {path:?}")),
    }
}

/// What a server answers a request no route has: a gRPC call (by its content type) gets
/// grpc-go's UNIMPLEMENTED "unknown service", anything else HTTP 404 (as Go's HTTP server).
pub fn fallback<B: Default + From<&'static str>>(
    headers: &http::HeaderMap,
    path: &str,
) -> http::Response<B> {
    let grpc = headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| is_content_type(v.as_bytes()));
    if grpc {
        return unknown_service(path).into_http::<B>();
    }
    let mut r = http::Response::new(B::from("404 page not found\n"));
    *r.status_mut() = http::StatusCode::NOT_FOUND;
    r
}

/// A status as trailer fields: grpc-status, grpc-message (percent-encoded) and whatever
/// details and metadata it carries, as tonic writes them.
pub(crate) fn status_fields(status: &Status) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    if let Err(bad) = status.add_header(&mut h) {
        h.clear();
        // A message that cannot be a header value: say so rather than lose the code.
        let _ = Status::new(status.code(), bad.message().to_owned()).add_header(&mut h);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tonics_limit_status_reads_as_grpc_gos() {
        let mut h = http::HeaderMap::new();
        h.insert("grpc-status", "11".parse().unwrap());
        h.insert(
            "grpc-message",
            "Error,%20decoded%20message%20length%20too%20large:%20found%2010%20bytes,%20the%20limit%20is:%204%20bytes"
                .parse()
                .unwrap(),
        );
        rewrite_limit_status(&mut h);
        assert_eq!(h["grpc-status"], "8");
        let m = h["grpc-message"].to_str().unwrap().replace("%20", " ");
        assert_eq!(m, "grpc: received message larger than max (10 vs. 4)");
        let mut other = http::HeaderMap::new();
        other.insert("grpc-status", "11".parse().unwrap());
        other.insert("grpc-message", "out%20of%20range".parse().unwrap());
        rewrite_limit_status(&mut other);
        assert_eq!(other["grpc-status"], "11");
        let mut ct = http::HeaderMap::new();
        ct.insert(
            http::header::CONTENT_TYPE,
            "application/grpc+proto".parse().unwrap(),
        );
        let r: http::Response<String> = fallback(&ct, "/x.Y/Z");
        assert_eq!(r.headers()["grpc-status"], "12");
        let r: http::Response<String> = fallback(&http::HeaderMap::new(), "/x");
        assert_eq!(r.status(), http::StatusCode::NOT_FOUND);
    }

    #[test]
    fn timeouts() {
        assert_eq!(parse_timeout(b"5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_timeout(b"250m"), Some(Duration::from_millis(250)));
        assert_eq!(
            parse_timeout(b"99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        assert_eq!(parse_timeout(b"2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_timeout(b"123456789S"), None);
        assert_eq!(parse_timeout(b"S"), None);
        assert_eq!(parse_timeout(b"5s"), None);
        assert_eq!(parse_timeout(b"-5S"), None);
        assert_eq!(parse_timeout(b""), None);
    }

    #[test]
    fn unary_messages_as_grpc_go_reads_them() {
        let mut body = prefix(3).to_vec();
        body.extend_from_slice(b"abc");
        assert_eq!(unary_message(&body).unwrap().as_ref(), b"abc");
        assert_eq!(announced_len(&body), Some(3));
        assert_eq!(announced_len(&body[..4]), None);
        let eof = |b: &[u8]| {
            let e = unary_message(b).unwrap_err();
            (e.code(), e.message().to_owned())
        };
        assert_eq!(eof(b""), (tonic::Code::Unknown, "EOF".into()));
        assert_eq!(
            eof(&body[..3]),
            (tonic::Code::Unknown, "unexpected EOF".into())
        );
        assert_eq!(
            eof(&body[..6]),
            (tonic::Code::Unknown, "unexpected EOF".into())
        );
        // What follows the first message is not read.
        let mut two = body.clone();
        two.extend_from_slice(&body);
        assert_eq!(unary_message(&two).unwrap().as_ref(), b"abc");
        body[0] = 1;
        assert_eq!(
            unary_message(&body).unwrap_err().code(),
            tonic::Code::Internal
        );
    }

    #[test]
    fn content_types_and_paths() {
        assert!(is_content_type(b"application/grpc"));
        assert!(is_content_type(b"application/grpc+proto"));
        assert!(is_content_type(b"application/grpc;charset=utf-8"));
        assert!(!is_content_type(b"application/grpc-web"));
        assert!(!is_content_type(b"text/plain"));
        assert_eq!(
            method_of(b"/etcdserverpb.KV/Range"),
            Some((&b"etcdserverpb.KV"[..], &b"Range"[..]))
        );
        assert_eq!(method_of(b"/v3/kv/range"), None);
        assert_eq!(method_of(b"/health"), None);
        assert_eq!(method_of(b"/x/"), None);
        let m = wrong_content_type(b"text/plain");
        assert_eq!(m.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            m.message(),
            "invalid gRPC request content-type \"text/plain\""
        );
    }

    /// A grpc-message as a client reads it (percent-decoded).
    fn decoded(v: &http::HeaderValue) -> String {
        let b = v.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' && i + 2 < b.len() {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 3;
            } else {
                out.push(b[i]);
                i += 1;
            }
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn unknown_services_and_methods_read_as_grpc_gos() {
        let mut grpc = http::HeaderMap::new();
        grpc.insert(
            http::header::CONTENT_TYPE,
            "application/grpc".parse().unwrap(),
        );
        let msg = |r: http::Response<String>| decoded(&r.headers()["grpc-message"]);
        assert_eq!(msg(fallback(&grpc, "/a.B/C")), "unknown service a.B");
        assert_eq!(
            msg(fallback(&grpc, "/a.B.C")),
            "malformed method name: \"/a.B.C\""
        );
        let mut h = http::HeaderMap::new();
        h.insert("grpc-status", "12".parse().unwrap());
        rewrite_status("/etcdserverpb.KV/Nosuch", &mut h);
        assert_eq!(
            decoded(&h["grpc-message"]),
            "unknown method Nosuch for service etcdserverpb.KV"
        );
        // A message of its own is kept.
        let mut h = http::HeaderMap::new();
        h.insert("grpc-status", "12".parse().unwrap());
        h.insert("grpc-message", "mine".parse().unwrap());
        rewrite_status("/a.B/C", &mut h);
        assert_eq!(h["grpc-message"], "mine");
    }

    #[test]
    fn status_trailers() {
        let h = status_fields(&Status::not_found("etcdserver: key not found"));
        assert_eq!(h["grpc-status"], "5");
        assert_eq!(h["grpc-message"], "etcdserver:%20key%20not%20found");
        let h = status_fields(&too_large(10, 5));
        assert_eq!(h["grpc-status"], "8");
    }
}
