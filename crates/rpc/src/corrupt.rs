//! etcd's corruption checks: members compare HashKV at one revision. With the
//! InitialCorruptCheck gate a restarted member compares its data with every peer's before it
//! serves clients, and refuses to start if one differs; every `--corrupt-check-time` the
//! leader compares its own with its followers' and raises the CORRUPT alarm for the member
//! that differs, which stops every write in the cluster (`apply`'s corrupt rule). Peers answer
//! HashKV on their peer port (`peer_services`), members of this cluster only.

use std::sync::{Arc, Weak};
use std::time::Duration;

use api::etcdserverpb::alarm_request::AlarmAction;
use api::etcdserverpb::maintenance_client::MaintenanceClient;
use api::etcdserverpb::{AlarmRequest, AlarmType, HashKvRequest, HashKvResponse};
use consensus::Member;
use ids::{MemberId, Revision};
use mvcc::KvHash;

use crate::request::Op;
use crate::server::Core;

/// How long a peer has to answer (etcd: its request timeout).
const PEER_TIMEOUT: Duration = Duration::from_secs(5);

/// This member's hash of its history up to `rev` (0: the current revision).
async fn local(core: &Arc<Core>, rev: Revision) -> Result<KvHash, String> {
    let store = core.backend.store();
    tokio::task::spawn_blocking(move || store.hash_kv(rev))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("hashing this member's data: {e}"))
}

/// Peer `m`'s hash up to `rev`, from the first of its peer URLs that answers.
async fn peer(core: &Arc<Core>, m: &Member, rev: Revision) -> Result<HashKvResponse, String> {
    let mut why = String::from("it has no peer URL");
    for url in &m.peer_urls {
        let ch = match core.peer_channel(url, PEER_TIMEOUT) {
            Ok(ch) => ch,
            Err(e) => {
                why = format!("{url}: {}", e.message());
                continue;
            }
        };
        let req = core.to_leader(HashKvRequest { revision: rev.0 });
        match MaintenanceClient::new(ch).hash_kv(req).await {
            Ok(r) => return Ok(r.into_inner()),
            Err(e) => why = format!("{url}: {}", e.message()),
        }
    }
    Err(why)
}

/// Every other member's hash up to `rev`, asked at once.
async fn peers(core: &Arc<Core>, rev: Revision) -> Vec<(MemberId, Result<HashKvResponse, String>)> {
    let asks = core
        .node
        .members()
        .iter()
        .filter(|m| m.id != core.id)
        .map(|m| {
            let (core, m) = (core.clone(), m.clone());
            tokio::spawn(async move { (m.id, peer(&core, &m, rev).await) })
        })
        .collect::<Vec<_>>();
    let mut out = Vec::with_capacity(asks.len());
    for a in asks {
        if let Ok(r) = a.await {
            out.push(r);
        }
    }
    out
}

/// The InitialCorruptCheck gate's check, before a restarted member serves clients: its hash
/// at its own revision against each peer's at the same revision. A peer that cannot answer
/// (down, behind, or compacted past it) is skipped, as etcd skips it; one whose hash differs
/// over the same compaction fails the start.
pub async fn initial_check(core: &Arc<Core>) -> Result<(), String> {
    let h = local(core, Revision(0)).await?;
    tracing::info!(revision = %h.hash_revision, compact_revision = %h.compact_revision, "initial corruption check: comparing this member's data with its peers'");
    let mut differ = Vec::new();
    for (id, r) in peers(core, h.hash_revision).await {
        match r {
            Ok(p) if p.compact_revision != h.compact_revision.0 => {
                tracing::info!(peer = %id, peer_compact_revision = p.compact_revision, "initial corruption check: the peer compacted elsewhere; skipped")
            }
            Ok(p) if p.hash != h.hash => {
                tracing::error!(peer = %id, revision = %h.hash_revision, local_hash = h.hash, peer_hash = p.hash, "found different hash values from remote peer");
                differ.push(id);
            }
            Ok(_) => {
                tracing::info!(peer = %id, "initial corruption check: the peer's hash matches")
            }
            Err(e) => {
                tracing::warn!(peer = %id, "initial corruption check: cannot fetch the peer's hash: {e}")
            }
        }
    }
    if differ.is_empty() {
        tracing::info!("initial corruption check passed");
        return Ok(());
    }
    let ids: Vec<String> = differ.iter().map(MemberId::to_string).collect();
    Err(format!(
        "{} found data inconsistency with peers ({}): refusing to start",
        core.id,
        ids.join(", ")
    ))
}

/// One pass of the leader's check: the member whose data differs, if one does. Its hash
/// before and after the peers answer must agree with itself; a follower may not be past the
/// leader's revision or compaction, and over the same compaction must hash the same.
async fn check(core: &Arc<Core>) -> Result<Option<MemberId>, String> {
    let h = local(core, Revision(0)).await?;
    let answers = peers(core, h.hash_revision).await;
    let h2 = local(core, Revision(0)).await?;
    if h2.hash != h.hash
        && h2.hash_revision == h.hash_revision
        && h2.compact_revision == h.compact_revision
    {
        tracing::error!(revision = %h.hash_revision, "found hash mismatch with this member's own data");
        return Ok(Some(core.id));
    }
    let mut leader_at = (h2.current, h2.compact_revision);
    let mut checked = 0;
    for (id, r) in answers {
        let p = match r {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(peer = %id, "corruption check: no hash from the peer: {e}");
                continue;
            }
        };
        checked += 1;
        let rev = Revision(p.header.as_ref().map_or(0, |h| h.revision));
        let compact = Revision(p.compact_revision);
        if rev > leader_at.0 || compact > leader_at.1 {
            // The follower applied entries this member has not applied yet, or this member
            // no longer leads (cut off or paused, it may not know it yet: its check raised a
            // false CORRUPT alarm in the robustness suite). A ReadIndex round settles both:
            // once it returns, this member has applied all a quorum had committed, which
            // covers what any follower had applied when it answered; if it fails, this
            // member does not lead, and checks nothing.
            if core.linearize().await.is_err() || !core.is_leader() {
                tracing::debug!(peer = %id, "corruption check: leadership not confirmed; skipped");
                return Ok(None);
            }
            let now = local(core, Revision(0)).await?;
            leader_at = (now.current, now.compact_revision);
            if rev > leader_at.0 || compact > leader_at.1 {
                tracing::error!(peer = %id, peer_revision = %rev, peer_compact_revision = %compact, leader_revision = %leader_at.0, leader_compact_revision = %leader_at.1, "a follower's revision or compaction is past its leader's");
                return Ok(Some(id));
            }
        }
        if compact == h.compact_revision && p.hash != h.hash {
            tracing::error!(peer = %id, revision = %h.hash_revision, leader_hash = h.hash, peer_hash = p.hash, "same compact revision then hashes must match");
            return Ok(Some(id));
        }
    }
    tracing::debug!(
        revision = %h.hash_revision,
        checked,
        "corruption check: every member that answered agrees"
    );
    Ok(None)
}

/// The periodic check (`--corrupt-check-time`), on whichever member leads, until the core is
/// dropped.
pub(crate) async fn periodic(core: Weak<Core>, every: Duration) {
    if every.is_zero() {
        return;
    }
    let corrupt = AlarmType::Corrupt as i32;
    loop {
        tokio::time::sleep(every).await;
        let Some(c) = core.upgrade() else {
            return;
        };
        if !c.is_leader() || c.backend.store().has_alarm(corrupt) {
            continue;
        }
        let found = match check(&c).await {
            Ok(Some(id)) => id,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!("corruption check failed: {e}");
                continue;
            }
        };
        tracing::error!(member = %found, "data corruption detected: raising the CORRUPT alarm");
        let raise = AlarmRequest {
            action: AlarmAction::Activate as i32,
            member_id: found.0,
            alarm: corrupt,
        };
        if let Err(e) = c.propose_internal(Op::Alarm(raise)).await {
            tracing::warn!("raising the CORRUPT alarm failed: {}", e.message());
        }
    }
}
