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

/// The request message of a unary call: exactly one uncompressed message.
pub(crate) fn unary_message(body: &[u8]) -> Result<Bytes, Status> {
    if body.len() < PREFIX_LEN {
        // grpc-go's words for a request without its message.
        return Err(Status::internal(
            "grpc: error while marshaling: unexpected EOF",
        ));
    }
    if body[0] != 0 {
        return Err(Status::internal(
            "grpc: compressed flag set with identity or empty encoding",
        ));
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if body.len() - PREFIX_LEN != len {
        return Err(Status::internal(
            "grpc: error while marshaling: unexpected EOF",
        ));
    }
    Ok(Bytes::copy_from_slice(&body[PREFIX_LEN..]))
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

/// tonic's status for a message over its receive limit ("Error, decoded message length too
/// large: found N bytes, the limit is: M bytes"), rewritten in a response's `headers` to
/// grpc-go's (etcd's) code and text, so clients see the same from every service.
pub fn rewrite_limit_status(headers: &mut http::HeaderMap) {
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

/// What a server answers a request no route has: a gRPC call (by its content type) gets
/// grpc-go's UNIMPLEMENTED "unknown service", anything else HTTP 404 (as Go's HTTP server).
pub fn fallback<B: Default + From<&'static str>>(
    headers: &http::HeaderMap,
    path: &str,
) -> http::Response<B> {
    let grpc = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if grpc {
        return Status::unimplemented(format!("unknown service {path}")).into_http::<B>();
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
    fn unary_messages() {
        let mut body = prefix(3).to_vec();
        body.extend_from_slice(b"abc");
        assert_eq!(unary_message(&body).unwrap().as_ref(), b"abc");
        assert_eq!(announced_len(&body), Some(3));
        assert_eq!(announced_len(&body[..4]), None);
        assert!(unary_message(&body[..6]).is_err());
        assert!(unary_message(b"").is_err());
        body[0] = 1;
        assert!(unary_message(&body).is_err());
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
