//! What the sending and receiving sides share: the request metadata naming cluster, sender and
//! target, the identity check of a peer's answer, the refusal a removed member gets, limits.

use std::time::Duration;

use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

use super::pb::peer_client::PeerClient;
use super::pb::Hello;
use crate::dial::Dialer;
use ids::{ClusterId, MemberId};

/// How a peer refuses a removed member (the sender stops on seeing it).
pub(super) const REMOVED: &str = "the member has been permanently removed from the cluster";
/// The refusal a removed member gets.
pub(super) fn removed(from: MemberId, cluster: ClusterId) -> Status {
    Status::failed_precondition(format!(
        "{REMOVED}: member {from} was removed from cluster {cluster}"
    ))
}

/// The request metadata every call carries: the sender's cluster, its member id, and the member
/// it means to reach (all hex), checked before anything is read.
pub(super) const META_CLUSTER: &str = "kvd-cluster-id";
pub(super) const META_FROM: &str = "kvd-member-id";
pub(super) const META_TO: &str = "kvd-to";
/// The largest gRPC message either side accepts (a batch, a chunk).
pub const MAX_MESSAGE: usize = 64 << 20;
/// How long opening a stream or call (and a join's question) may take.
pub(super) const OPEN_TIMEOUT: Duration = Duration::from_secs(2);

/// A request carrying the sender's identity and its target in metadata.
pub(super) fn request<T>(msg: T, ident: Ident, to: MemberId) -> Request<T> {
    let mut r = Request::new(msg);
    let md = r.metadata_mut();
    let ids = [
        (META_CLUSTER, ident.cluster.to_string()),
        (META_FROM, ident.me.to_string()),
        (META_TO, to.to_string()),
    ];
    for (k, v) in ids {
        if let Ok(v) = v.parse() {
            md.insert(k, v);
        }
    }
    r
}

/// A member or cluster id from a request's metadata (hex, as the ids print).
pub(super) fn meta_id<T: std::str::FromStr>(md: &MetadataMap, key: &str) -> Result<T, Status> {
    md.get(key)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Status::invalid_argument(format!("missing or bad {key} header")))
}

/// Who this member is: its cluster and its id.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ident {
    pub(super) cluster: ClusterId,
    pub(super) me: MemberId,
}

/// A client for the peer at `url`, with keepalive and the message limit.
pub(super) async fn connect(
    dialer: &Dialer,
    url: &str,
) -> Result<PeerClient<tonic::transport::Channel>, String> {
    let ch = dialer
        .connect(url, |e| {
            e.connect_timeout(Duration::from_secs(1))
                .http2_keep_alive_interval(Duration::from_secs(5))
                .keep_alive_timeout(Duration::from_secs(5))
        })
        .await
        .map_err(|e| e.to_string())?;
    Ok(PeerClient::new(ch)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE))
}

/// Checks the identity a peer answered with.
pub(super) fn check_hello(ident: Ident, to: MemberId, url: &str, h: &Hello) -> Result<(), String> {
    let (member, cluster) = (MemberId(h.member_id), ClusterId(h.cluster_id));
    if cluster != ident.cluster || member != to {
        return Err(format!(
            "peer at {url} is member {member} of cluster {cluster}; expected member {to} of \
             cluster {}",
            ident.cluster
        ));
    }
    Ok(())
}

/// The error of a call or stream the peer refused.
pub(super) fn refused(url: &str, s: Status) -> String {
    format!("{url} refused the stream: {}", s.message())
}
