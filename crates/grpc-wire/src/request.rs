//! A request's header fields as decoded, checked against HTTP/2's rules for requests
//! (RFC 9113, 8.2 and 8.3), and turned into an `http::Request` when a tower service serves it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::grpc;
use crate::hpack::{self, Decoder};

/// Header fields that belong to HTTP/1.1 connections and are malformed in HTTP/2.
pub(crate) fn is_connection_specific(name: &[u8]) -> bool {
    matches!(
        name,
        b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding" | b"upgrade"
    )
}

/// The header blocks a connection's client repeats, and their fields: a client calling a
/// method again sends the same bytes, every field a reference to the tables, and they decode
/// to the same fields as long as the decoder's dynamic table does not change. Up to
/// [`REPEATED`] blocks, forgotten when the table changes. The fields are shared with the
/// requests that repeat them (one count moved, where a copy moved one for each field's bytes).
#[derive(Debug, Default)]
pub(crate) struct Repeated {
    /// The decoder's table changes when the blocks were decoded.
    table: u64,
    blocks: Vec<(Bytes, Arc<Fields>)>,
    /// The block replaced next when all places are taken.
    next: usize,
}

/// How many blocks [`Repeated`] keeps (a client's methods in turn, each with its headers).
const REPEATED: usize = 4;

/// The largest header list (as SETTINGS_MAX_HEADER_LIST_SIZE counts it) [`Repeated`] keeps: a
/// call's headers are a few hundred bytes; a block of a million one-byte references is not
/// kept past its answer (431, too large).
const REPEATED_SIZE: usize = 8 << 10;

impl Repeated {
    /// `block`'s fields: decoded by `dec`, or the same block's from before.
    pub(crate) fn decode(
        &mut self,
        dec: &mut Decoder,
        block: &Bytes,
    ) -> Result<Arc<Fields>, hpack::Error> {
        if dec.changes() != self.table {
            self.blocks.clear();
            self.table = dec.changes();
        }
        if let Some((_, f)) = self.blocks.iter().find(|(b, _)| b == block) {
            return Ok(f.clone());
        }
        let mut fields = Fields::default();
        let indexed = dec.decode(block, |n, v| fields.add(n, v))?;
        let fields = Arc::new(fields);
        if indexed && !block.is_empty() && fields.size() <= REPEATED_SIZE {
            let kept = (block.clone(), fields.clone());
            if self.blocks.len() < REPEATED {
                self.blocks.push(kept);
            } else {
                self.blocks[self.next] = kept;
                self.next = (self.next + 1) % REPEATED;
            }
        }
        Ok(fields)
    }
}

/// One header block's fields.
#[derive(Debug, Default, Clone)]
pub(crate) struct Fields {
    method: Option<Bytes>,
    scheme: Option<Bytes>,
    authority: Option<Bytes>,
    path: Option<Bytes>,
    regular: Vec<(Bytes, Bytes)>,
    /// The first rule broken, if any.
    malformed: Option<&'static str>,
    /// As SETTINGS_MAX_HEADER_LIST_SIZE counts it.
    size: usize,
    /// Fields with an empty name or value.
    empty: usize,
    /// The content type, when one came.
    content_type: Option<Bytes>,
    grpc: bool,
    encoded: bool,
    timeout: Option<Duration>,
    content_length: Option<u64>,
}

impl Fields {
    pub(crate) fn add(&mut self, name: Bytes, value: Bytes) {
        self.size += name.len() + value.len() + 32;
        self.empty += usize::from(name.is_empty() || value.is_empty());
        if self.malformed.is_some() {
            return;
        }
        if let Some(pseudo) = name.strip_prefix(b":") {
            if !self.regular.is_empty() {
                self.malformed = Some("a pseudo-header after a regular one");
                return;
            }
            let slot = match pseudo {
                b"method" => &mut self.method,
                b"scheme" => &mut self.scheme,
                b"authority" => &mut self.authority,
                b"path" => &mut self.path,
                _ => {
                    self.malformed = Some("an unknown pseudo-header");
                    return;
                }
            };
            if slot.is_some() {
                self.malformed = Some("a repeated pseudo-header");
                return;
            }
            *slot = Some(value);
            return;
        }
        if name.is_empty() || name.iter().any(u8::is_ascii_uppercase) {
            self.malformed = Some("a header name that is empty or not lowercase");
            return;
        }
        if is_connection_specific(&name) {
            self.malformed = Some("a connection-specific header");
            return;
        }
        match name.as_ref() {
            b"te" if value.as_ref() != b"trailers" => {
                self.malformed = Some("te other than \"trailers\"");
                return;
            }
            b"content-type" => {
                self.grpc = grpc::is_content_type(&value);
                self.content_type = Some(value.clone());
            }
            b"grpc-encoding" => self.encoded = value.as_ref() != b"identity",
            b"grpc-timeout" => self.timeout = grpc::parse_timeout(&value),
            b"content-length" => {
                let n = std::str::from_utf8(&value)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok());
                if n.is_none() || self.content_length.is_some_and(|c| Some(c) != n) {
                    self.malformed = Some("an invalid content-length");
                    return;
                }
                self.content_length = n;
            }
            _ => {}
        }
        self.regular.push((name, value));
    }

    pub(crate) fn malformed(&self) -> Option<&'static str> {
        self.malformed
    }

    pub(crate) fn has_pseudo(&self) -> bool {
        self.method.is_some()
            || self.scheme.is_some()
            || self.authority.is_some()
            || self.path.is_some()
    }

    /// What a request's pseudo-headers lack, if anything (CONNECT is not served).
    pub(crate) fn request_error(&self) -> Option<&'static str> {
        match (&self.method, &self.scheme, &self.path) {
            (None, _, _) => Some("no :method"),
            (_, None, _) => Some("no :scheme"),
            (_, _, None) => Some("no :path"),
            (_, _, Some(p)) if p.is_empty() => Some("an empty :path"),
            _ => None,
        }
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// How many fields had an empty name or value.
    pub(crate) fn empty(&self) -> usize {
        self.empty
    }

    pub(crate) fn content_length(&self) -> Option<u64> {
        self.content_length
    }

    pub(crate) fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    pub(crate) fn path(&self) -> &[u8] {
        self.path.as_deref().unwrap_or_default()
    }

    /// A request for a gRPC method (its path `/service/method`) whose content type is not
    /// gRPC's: that content type (empty when none came).
    pub(crate) fn wrong_content_type(&self) -> Option<&[u8]> {
        let method = grpc::method_of(self.path()).is_some();
        (method && !self.grpc).then(|| self.content_type.as_deref().unwrap_or_default())
    }

    /// A gRPC call the connection may answer itself: POST, gRPC's content type, and an
    /// uncompressed message.
    pub(crate) fn is_plain_grpc(&self) -> bool {
        self.grpc && !self.encoded && self.method.as_deref() == Some(b"POST")
    }

    /// The regular fields, as they came.
    pub(crate) fn regular(&self) -> &[(Bytes, Bytes)] {
        &self.regular
    }

    /// The regular fields as a header map (trailers, or a request's headers).
    pub(crate) fn into_header_map(self) -> Result<HeaderMap, &'static str> {
        let mut h = HeaderMap::with_capacity(self.regular.len());
        for (n, v) in self.regular {
            let name = HeaderName::from_bytes(&n).map_err(|_| "an invalid header name")?;
            let value = HeaderValue::from_maybe_shared(v).map_err(|_| "an invalid header value")?;
            h.append(name, value);
        }
        Ok(h)
    }

    /// The request head for a tower service.
    pub(crate) fn into_request(mut self) -> Result<http::Request<()>, &'static str> {
        let method = http::Method::from_bytes(self.method.as_deref().unwrap_or_default())
            .map_err(|_| "an invalid :method")?;
        let path = self.path.take().unwrap_or_default();
        let path = http::uri::PathAndQuery::from_maybe_shared(path);
        let uri = match (self.scheme.take(), self.authority.take()) {
            (Some(s), Some(a)) if !a.is_empty() => {
                let a = http::uri::Authority::from_maybe_shared(a);
                match (a, path) {
                    (Ok(a), Ok(p)) => http::Uri::builder()
                        .scheme(s.as_ref())
                        .authority(a)
                        .path_and_query(p)
                        .build()
                        .ok(),
                    _ => None,
                }
            }
            _ => path
                .ok()
                .and_then(|p| http::Uri::builder().path_and_query(p).build().ok()),
        }
        .ok_or("an invalid :path, :scheme or :authority")?;
        let headers = self.into_header_map()?;
        let mut req = http::Request::new(());
        *req.method_mut() = method;
        *req.uri_mut() = uri;
        *req.version_mut() = http::Version::HTTP_2;
        *req.headers_mut() = headers;
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(list: &[(&str, &str)]) -> Fields {
        let mut f = Fields::default();
        for (n, v) in list {
            f.add(
                Bytes::copy_from_slice(n.as_bytes()),
                Bytes::copy_from_slice(v.as_bytes()),
            );
        }
        f
    }

    const GRPC: [(&str, &str); 6] = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/etcdserverpb.KV/Range"),
        (":authority", "127.0.0.1:2379"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ];

    #[test]
    fn a_grpc_request() {
        let mut list = GRPC.to_vec();
        list.push(("grpc-timeout", "4999m"));
        let f = fields(&list);
        assert_eq!(f.malformed(), None);
        assert_eq!(f.request_error(), None);
        assert!(f.is_plain_grpc());
        assert_eq!(f.path(), b"/etcdserverpb.KV/Range");
        assert_eq!(f.timeout(), Some(Duration::from_millis(4999)));
        let req = f.into_request().unwrap();
        assert_eq!(req.uri(), "http://127.0.0.1:2379/etcdserverpb.KV/Range");
        assert_eq!(req.headers()["te"], "trailers");
        assert_eq!(req.method(), http::Method::POST);
    }

    #[test]
    fn compressed_or_not_post_is_not_plain() {
        let mut list = GRPC.to_vec();
        list.push(("grpc-encoding", "gzip"));
        assert!(!fields(&list).is_plain_grpc());
        let mut list = GRPC.to_vec();
        list[0] = (":method", "GET");
        assert!(!fields(&list).is_plain_grpc());
        let mut list = GRPC.to_vec();
        list.push(("grpc-encoding", "identity"));
        assert!(fields(&list).is_plain_grpc());
    }

    #[test]
    fn malformed_requests() {
        let cases: [&[(&str, &str)]; 9] = [
            &[("content-type", "x"), (":method", "POST")],
            &[(":method", "POST"), (":method", "GET")],
            &[(":status", "200")],
            &[("Content-Type", "x")],
            &[("connection", "keep-alive")],
            &[("te", "gzip")],
            &[("content-length", "12x")],
            &[("content-length", "1"), ("content-length", "2")],
            &[("", "x")],
        ];
        for c in cases {
            assert!(fields(c).malformed().is_some(), "{c:?}");
        }
        assert_eq!(
            fields(&[(":method", "GET"), (":scheme", "http")]).request_error(),
            Some("no :path")
        );
        assert_eq!(
            fields(&[(":method", "GET"), (":scheme", "http"), (":path", "")]).request_error(),
            Some("an empty :path")
        );
        assert_eq!(
            fields(&[(":path", "/")]).request_error(),
            Some("no :method")
        );
    }

    /// A block the client repeats is decoded once while the table stays as it was; once the
    /// table changed, the same bytes are decoded again, to what they mean then. A decoder
    /// without the cache, fed the same blocks, agrees at every step.
    #[test]
    fn repeated_blocks_decode_as_without_the_cache() {
        let mut enc = crate::hpack::Encoder::new();
        let mut block = |list: &[(&str, &str)]| {
            let mut out = Vec::new();
            enc.begin(&mut out);
            for (n, v) in list {
                enc.field(&mut out, n.as_bytes(), v.as_bytes(), true);
            }
            Bytes::from(out)
        };
        let range = block(&GRPC); // literals, added to the table
        let again = block(&GRPC); // references only
        let mut put = GRPC.to_vec();
        put[2] = (":path", "/etcdserverpb.KV/Put");
        let put = block(&put); // a new entry: `again`'s references now name other entries
        let (mut plain, mut dec) = (Decoder::new(4096), Decoder::new(4096));
        let mut rep = Repeated::default();
        let mut paths = Vec::new();
        for (i, b) in [&range, &again, &again, &put, &again, &again]
            .into_iter()
            .enumerate()
        {
            let mut want = Fields::default();
            plain.decode(b, |n, v| want.add(n, v)).unwrap();
            let got = rep.decode(&mut dec, b).unwrap();
            assert_eq!(format!("{got:?}"), format!("{want:?}"), "block {i}");
            paths.push(String::from_utf8_lossy(got.path()).into_owned());
        }
        assert_eq!(paths[2], "/etcdserverpb.KV/Range");
        assert_ne!(paths[4], paths[2], "the same bytes mean other fields now");
        assert_eq!(rep.blocks.len(), 1, "the references-only block is kept");
    }

    /// A references-only block whose header list is larger than any call's is decoded every
    /// time, not kept: a client cannot make a connection hold its fields.
    #[test]
    fn a_large_repeated_block_is_not_kept() {
        let mut dec = Decoder::new(4096);
        let mut rep = Repeated::default();
        let block = Bytes::from(vec![0x82; 1000]); // `:method: GET` a thousand times
        for _ in 0..2 {
            let f = rep.decode(&mut dec, &block).unwrap();
            assert!(f.size() > REPEATED_SIZE);
        }
        assert!(rep.blocks.is_empty());
        let small = Bytes::from(vec![0x82; 10]);
        rep.decode(&mut dec, &small).unwrap();
        assert_eq!(rep.blocks.len(), 1);
    }

    #[test]
    fn header_list_size_counts_every_field() {
        let f = fields(&[("a", "bc"), ("d", "")]);
        assert_eq!(f.size(), 3 + 32 + 1 + 32);
    }
}
