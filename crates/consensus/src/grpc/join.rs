//! Asking a member for the cluster: what a joining member needs to learn its own id.

use super::pb::peer_client::PeerClient;
use super::pb::MembersRequest;
use super::wire::OPEN_TIMEOUT;
use crate::dial::Dialer;
use crate::member::Members;

/// Asks the member at `peer_url` for the cluster's id and members (what a joining member
/// needs to learn its own id).
pub async fn fetch_members(dialer: &Dialer, peer_url: &str) -> Result<(u64, Members), String> {
    let ch = dialer
        .connect(peer_url, |e| {
            e.connect_timeout(OPEN_TIMEOUT).timeout(OPEN_TIMEOUT)
        })
        .await?;
    let reply = PeerClient::new(ch)
        .members(MembersRequest {})
        .await
        .map_err(|e| format!("{peer_url}: {}", e.message()))?
        .into_inner();
    let members = Members::new(reply.members.into_iter().map(|m| crate::member::Member {
        id: m.id,
        name: m.name,
        peer_urls: m.peer_urls,
        client_urls: m.client_urls,
        is_learner: m.is_learner,
    }));
    Ok((reply.cluster_id, members))
}
