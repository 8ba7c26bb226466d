//! The cluster behind the proxy, reached only through etcd's public API: one gRPC channel per
//! endpoint; calls go to the current one, and a call that finds it unreachable moves the
//! proxy to the next endpoint for the calls after it (as etcd's proxy, which sticks to one
//! endpoint until it fails). Writes are never retried here: a write that failed in flight may
//! have been applied, and retrying could apply it twice.

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use api::etcdserverpb::ResponseHeader;
use tonic::metadata::MetadataMap;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::h2call::{Dial, H2Calls};

/// Builds a tonic channel to an endpoint URL.
pub type ChannelFn = Arc<dyn Fn(&str) -> Result<Channel, String> + Send + Sync>;

/// How the proxy reaches an endpoint URL (plain or TLS: the binary decides): a tonic
/// channel, and a byte stream for [`H2Calls`].
#[derive(Clone)]
pub struct Connect {
    pub channel: ChannelFn,
    pub dial: Dial,
}

impl std::fmt::Debug for Connect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connect")
    }
}

/// The upstream cluster.
pub struct Upstream {
    endpoints: Vec<(String, Channel)>,
    /// The hot unary calls, over HTTP/2 directly.
    pub h2: H2Calls,
    current: AtomicUsize,
    /// The newest revision any upstream answer showed, and the ids of the last header.
    revision: AtomicI64,
    cluster_id: AtomicU64,
    member_id: AtomicU64,
    raft_term: AtomicU64,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field(
                "endpoints",
                &self.endpoints.iter().map(|e| &e.0).collect::<Vec<_>>(),
            )
            .field("current", &self.current.load(Ordering::Relaxed))
            .finish()
    }
}

impl Upstream {
    pub fn new(
        endpoints: &[String],
        connect: &Connect,
        dial_timeout: Duration,
        max_recv: usize,
    ) -> Result<Upstream, crate::StartError> {
        if endpoints.is_empty() {
            return Err(crate::StartError::NoEndpoints);
        }
        let h2 = H2Calls::new(endpoints, connect.dial.clone(), dial_timeout, max_recv);
        let endpoints = endpoints
            .iter()
            .map(|e| {
                let ch = (connect.channel)(e).map_err(|reason| crate::StartError::Endpoint {
                    endpoint: e.clone(),
                    reason,
                })?;
                Ok((e.clone(), ch))
            })
            .collect::<Result<Vec<_>, crate::StartError>>()?;
        Ok(Upstream {
            h2,
            endpoints,
            current: AtomicUsize::new(0),
            revision: AtomicI64::new(0),
            cluster_id: AtomicU64::new(0),
            member_id: AtomicU64::new(0),
            raft_term: AtomicU64::new(0),
        })
    }

    /// The channel calls go to now, and its index (for [`Upstream::failed`]).
    pub fn channel(&self) -> (usize, Channel) {
        let i = self.current.load(Ordering::Relaxed) % self.endpoints.len();
        (i, self.endpoints[i].1.clone())
    }

    /// A call on channel `i` failed with `s`: if the endpoint looks unreachable, the next calls
    /// go to the next endpoint.
    pub fn failed(&self, i: usize, s: &Status) {
        if !unreachable(s) || self.endpoints.len() < 2 {
            return;
        }
        let next = (i + 1) % self.endpoints.len();
        if self
            .current
            .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            tracing::warn!(
                from = %self.endpoints[i].0,
                to = %self.endpoints[next].0,
                "upstream endpoint unreachable ({}): switching",
                s.message()
            );
        }
    }

    /// Records what an upstream header says (the newest revision seen, the ids answered with).
    pub fn saw(&self, h: Option<&ResponseHeader>) {
        let Some(h) = h else { return };
        self.revision.fetch_max(h.revision, Ordering::AcqRel);
        if h.cluster_id != 0 {
            self.cluster_id.store(h.cluster_id, Ordering::Relaxed);
            self.member_id.store(h.member_id, Ordering::Relaxed);
            self.raft_term.store(h.raft_term, Ordering::Relaxed);
        }
    }

    /// Notes a revision seen elsewhere (a watch event).
    pub fn saw_revision(&self, rev: i64) {
        self.revision.fetch_max(rev, Ordering::AcqRel);
    }

    /// A header for an answer the proxy makes itself: the cluster's ids as last seen, and the
    /// newest revision the proxy knows (the cluster's may be ahead).
    pub fn header(&self) -> ResponseHeader {
        ResponseHeader {
            cluster_id: self.cluster_id.load(Ordering::Relaxed),
            member_id: self.member_id.load(Ordering::Relaxed),
            revision: self.revision.load(Ordering::Acquire),
            raft_term: self.raft_term.load(Ordering::Relaxed),
        }
    }
}

/// Whether a call failed for want of reaching the endpoint (rather than an answer of it).
pub fn unreachable(s: &Status) -> bool {
    matches!(s.code(), Code::Unavailable | Code::Unknown) && !s.message().starts_with("etcdserver:")
}

/// The credential metadata of a client's call (etcd's `token`, or the gateway's
/// `authorization`), carried onto the calls the proxy makes for it: the cluster checks them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Creds(
    Option<(
        &'static str,
        tonic::metadata::MetadataValue<tonic::metadata::Ascii>,
    )>,
);

impl Creds {
    pub fn from_metadata(md: &MetadataMap) -> Creds {
        for k in ["token", "authorization"] {
            if let Some(v) = md.get(k) {
                return Creds(Some((k, v.clone())));
            }
        }
        Creds(None)
    }

    /// From a raw header value (a call the connection answers itself).
    pub fn from_header(name: &'static str, value: &[u8]) -> Creds {
        match tonic::metadata::MetadataValue::try_from(value) {
            Ok(v) => Creds(Some((name, v))),
            Err(_) => Creds(None),
        }
    }

    pub fn is_some(&self) -> bool {
        self.0.is_some()
    }

    /// The credential header, as a name and value.
    pub fn header(&self) -> Option<(&'static str, &[u8])> {
        self.0.as_ref().map(|(k, v)| (*k, v.as_bytes()))
    }

    /// `msg` as a request carrying these credentials.
    pub fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Some((k, v)) = &self.0 {
            r.metadata_mut().insert(*k, v.clone());
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_of_the_cluster_is_not_unreachability() {
        assert!(unreachable(&Status::unavailable("tcp connect error")));
        assert!(!unreachable(&Status::unavailable(
            "etcdserver: leader changed"
        )));
        assert!(!unreachable(&Status::invalid_argument("x")));
    }

    #[test]
    fn credentials_travel_onto_the_proxys_calls() {
        let mut md = MetadataMap::new();
        md.insert("token", "abc.1".parse().unwrap());
        let c = Creds::from_metadata(&md);
        assert!(c.is_some());
        let r = c.request(());
        assert_eq!(r.metadata().get("token").unwrap(), "abc.1");
        assert!(!Creds::from_metadata(&MetadataMap::new()).is_some());
        let g = Creds::from_header("authorization", b"tok");
        assert_eq!(
            g.request(()).metadata().get("authorization").unwrap(),
            "tok"
        );
    }
}
