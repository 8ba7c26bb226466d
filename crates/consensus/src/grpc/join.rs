//! Asking a member for the cluster: what a joining member needs to learn its own id.

use super::pb::peer_client::PeerClient;
use super::pb::MembersRequest;
use super::wire::OPEN_TIMEOUT;
use crate::dial::{DialError, Dialer};
use crate::member::Members;
use ids::{ClusterId, MemberId};

/// Why a member could not tell the cluster.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(transparent)]
    Dial(#[from] DialError),
    /// The member answered with an error.
    #[error("{url}: {message}")]
    Refused { url: String, message: String },
}

/// Asks the member at `peer_url` for the cluster's id and members (what a joining member
/// needs to learn its own id).
pub async fn fetch_members(
    dialer: &Dialer,
    peer_url: &str,
) -> Result<(ClusterId, Members), FetchError> {
    let ch = dialer
        .connect(peer_url, |e| {
            e.connect_timeout(OPEN_TIMEOUT).timeout(OPEN_TIMEOUT)
        })
        .await?;
    let reply = PeerClient::new(ch)
        .members(MembersRequest {})
        .await
        .map_err(|e| FetchError::Refused {
            url: peer_url.to_string(),
            message: e.message().to_string(),
        })?
        .into_inner();
    let members = Members::new(reply.members.into_iter().map(|m| crate::member::Member {
        id: MemberId(m.id),
        name: m.name,
        peer_urls: m.peer_urls,
        client_urls: m.client_urls,
        is_learner: m.is_learner,
    }));
    Ok((ClusterId(reply.cluster_id), members))
}
