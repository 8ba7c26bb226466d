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
