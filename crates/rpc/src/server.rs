//! The server core every service shares: the raft member, the store, the limits, and what runs
//! beside the requests (lease expiry on the leader, publishing this member's attributes).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use api::etcdserverpb::{LeaseRevokeRequest, ResponseHeader};
use consensus::{Change, Company, Member, RaftNode, Role};
use ids::{ClusterId, LeaseId, MemberId, Revision};
use prost::Message;
use tonic::Status;

use crate::auth::{Auth, AuthInfo};
use crate::backend::Backend;
use crate::error;
use crate::request::{Applied, InternalRequest, Op, RequestHeader, Response};

/// etcd's defaults for the limits a client can hit.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1536 * 1024;
pub const DEFAULT_QUOTA_BACKEND_BYTES: u64 = 2 << 30;
/// Apply may trail commit by this many entries before new requests are refused (etcd's
/// maxGapBetweenApplyAndCommitIndex).
const MAX_APPLY_GAP: u64 = 5000;
/// How often the leader looks for expired leases (etcd: 500 ms).
const EXPIRY_INTERVAL: Duration = Duration::from_millis(500);
/// Expired leases revoked per round (etcd's leaseRevokeRate is 1000/s).
const REVOKES_PER_ROUND: usize = 500;

/// etcd's lease checkpoint interval.
pub const LEASE_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(300);
/// Leases per checkpoint proposal (etcd's maxLeaseCheckpointBatchSize).
const CHECKPOINT_BATCH: usize = 1000;

/// What the services need to know beyond the raft member and the store.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// `--name`.
    pub name: String,
    /// `--max-request-bytes`.
    pub max_request_bytes: usize,
    /// `--max-txn-ops`.
    pub max_txn_ops: usize,
    /// `--quota-backend-bytes` as given (0 = etcd's default, 2 GiB; see [`ServerConfig::quota`]).
    pub quota_backend_bytes: u64,
    /// `--initial-cluster-token`: mixed into the ids of members added later.
    pub cluster_token: String,
    /// This member's client URLs as advertised (`--advertise-client-urls`).
    pub client_urls: Vec<String>,
    /// The election timeout, for lease timing.
    pub election_timeout: Duration,
    /// `--experimental-watch-progress-notify-interval`.
    pub watch_progress_notify_interval: Duration,
    /// `--auto-compaction-mode` and `--auto-compaction-retention`.
    pub auto_compaction: crate::AutoCompaction,
    /// How often the leader checkpoints leases' remaining TTLs (None: never), so a leader
    /// change does not restart them from their full TTL (etcd's LeaseCheckpoint feature).
    pub lease_checkpoint_interval: Option<Duration>,
    /// `--strict-reconfig-check`: refuse membership changes that could cost the quorum.
    pub strict_reconfig_check: bool,
    /// `--corrupt-check-time`: how often the leader compares the members' data (0: never).
    pub corrupt_check_time: Duration,
    /// `--feature-gates=PriorityRequest=true`: a LeaseRevoke is proposed while the applied
    /// index lags by up to twice [`MAX_APPLY_GAP`].
    pub priority_request: bool,
    /// `--feature-gates=FastLeaseKeepAlive` (etcd 3.7's default: on): the leader renews a
    /// lease it has without waiting to apply what is committed (a lease it lacks may be one
    /// granted but not yet applied: for that one it waits).
    pub fast_lease_keep_alive: bool,
    /// `--metrics=extensive`: the gRPC handling-time histograms too.
    pub metrics_extensive: bool,
}

impl ServerConfig {
    /// The backend quota in force: `--quota-backend-bytes`, or 2 GiB when it is 0.
    pub fn quota(&self) -> u64 {
        match self.quota_backend_bytes {
            0 => DEFAULT_QUOTA_BACKEND_BYTES,
            q => q,
        }
    }

    pub fn new(name: impl Into<String>) -> Self {
        ServerConfig {
            name: name.into(),
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_txn_ops: mvcc::validate::DEFAULT_MAX_TXN_OPS,
            quota_backend_bytes: 0,
            cluster_token: "etcd-cluster".into(),
            client_urls: Vec::new(),
            election_timeout: Duration::from_secs(1),
            watch_progress_notify_interval: crate::watch::PROGRESS_NOTIFY_INTERVAL,
            auto_compaction: crate::AutoCompaction::Off,
            lease_checkpoint_interval: Some(LEASE_CHECKPOINT_INTERVAL),
            strict_reconfig_check: true,
            corrupt_check_time: Duration::ZERO,
            priority_request: false,
            fast_lease_keep_alive: true,
            metrics_extensive: false,
        }
    }
}

/// Whether the applied index lags the commit index too far to take `req` (etcd's "too many
/// requests"): by [`MAX_APPLY_GAP`], or twice it for a LeaseRevoke with `priority` (etcd 3.7's
/// PriorityRequest gate), so expired leases still go under a backlog.
fn too_far_behind(commit: u64, applied: u64, req: &InternalRequest, priority: bool) -> bool {
    let revoke = matches!(req.op, Some(Op::LeaseRevoke(_)));
    let gap = if priority && revoke {
        2 * MAX_APPLY_GAP
    } else {
        MAX_APPLY_GAP
    };
    commit > applied.saturating_add(gap)
}

/// The server core.
#[derive(Debug)]
pub struct Core {
    pub node: RaftNode<Applied>,
    pub backend: Arc<Backend>,
    pub cfg: ServerConfig,
    pub id: MemberId,
    pub cluster_id: ClusterId,
    /// Tokens, passwords and permissions (the users and roles are in the store).
    pub auth: Arc<Auth>,
    /// How this member dials its peers (the leader, for requests only it serves).
    dialer: consensus::Dialer,
    /// A connection to the leader's peer port, for requests only it serves: (leader, channel).
    to_leader: parking_lot::Mutex<Option<(MemberId, tonic::transport::Channel)>>,
    /// What the client port's connections hold together and what they were refused
    /// (served on `/metrics`).
    pub client_guard: Arc<grpc_wire::Guard>,
    /// grpc-go's server metrics of the client port's calls (served on `/metrics`).
    pub grpc_calls: Arc<grpc_wire::CallMetrics>,
    /// Proposals that failed (not committed in time, or refused by consensus), as etcd's
    /// `etcd_server_proposals_failed_total` counts them.
    pub proposals_failed: std::sync::atomic::AtomicU64,
    /// The KV calls the client port answers itself that are in flight, made and not yet
    /// answered ([`KvCallInFlight`]): with one, its proposal has no company to wait for.
    /// Calls served through tonic (a compressed KV call, the other services) are not counted:
    /// one made beside a single counted call may take its turn without waiting for that one's
    /// (at worst an fsync more for the two).
    kv_calls: AtomicUsize,
    /// The ids of grants that leave them to the server.
    pub(crate) lease_ids: crate::lease::LeaseIds,
}

/// Counts a KV call in [`Core`]'s calls in flight while it lives.
pub(crate) struct KvCallInFlight(Arc<Core>);

impl KvCallInFlight {
    /// Counted from now: made when the call is (the calls of one read of a connection are
    /// all made before the first is polled).
    pub(crate) fn new(core: &Arc<Core>) -> KvCallInFlight {
        core.kv_calls.fetch_add(1, Ordering::Relaxed);
        KvCallInFlight(core.clone())
    }
}

impl Drop for KvCallInFlight {
    fn drop(&mut self) {
        self.0.kv_calls.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The metadata naming the cluster of a request a member forwards to its leader; the
/// leader's peer port refuses one from another cluster.
pub(crate) const FORWARD_CLUSTER: &str = "kvd-cluster-id";

impl Core {
    pub fn new(
        node: RaftNode<Applied>,
        backend: Arc<Backend>,
        cfg: ServerConfig,
        cluster_id: ClusterId,
        auth: Arc<Auth>,
        dialer: consensus::Dialer,
    ) -> Arc<Core> {
        let grpc_calls = Arc::new(crate::grpc_metrics(cfg.metrics_extensive));
        Arc::new(Core {
            lease_ids: crate::lease::LeaseIds::new(node.id(), std::time::SystemTime::now()),
            id: node.id(),
            node,
            backend,
            cfg,
            cluster_id,
            auth,
            dialer,
            to_leader: parking_lot::Mutex::new(None),
            client_guard: Arc::default(),
            grpc_calls,
            proposals_failed: Default::default(),
            kv_calls: AtomicUsize::new(0),
        })
    }

    /// A response header at revision `rev`.
    pub fn header(&self, rev: Revision) -> ResponseHeader {
        ResponseHeader {
            cluster_id: self.cluster_id.0,
            member_id: self.id.0,
            revision: rev.0,
            raft_term: self.node.term(),
        }
    }

    /// Completes a header mvcc filled with its revision.
    pub fn fill(&self, h: &mut Option<ResponseHeader>) {
        let rev = h
            .as_ref()
            .map_or_else(|| self.backend.store().rev(), |h| Revision(h.revision));
        *h = Some(self.header(rev));
    }

    /// Whether the NOSPACE alarm is raised anywhere in the cluster.
    pub fn no_space(&self) -> bool {
        let nospace = api::etcdserverpb::AlarmType::Nospace as i32;
        self.backend.store().has_alarm(nospace)
    }

    /// The alarms raised in the cluster: (member, alarm type).
    pub fn alarms(&self) -> Vec<(MemberId, i32)> {
        self.backend.store().alarms()
    }

    /// etcd's backend quota: a write that would take the data file past
    /// `--quota-backend-bytes` raises the cluster-wide NOSPACE alarm and is refused, as is
    /// every write while the alarm stands (reads, deletes and compaction still work).
    pub async fn check_quota(&self, cost: usize) -> Result<(), Status> {
        if self.no_space() {
            return Err(error::no_space());
        }
        // etcd's measure: the data up to the high-water mark (the file grows in larger chunks).
        let size = self.backend.store().db().space().size;
        if size + cost as u64 <= self.cfg.quota() {
            return Ok(());
        }
        tracing::warn!(
            size,
            quota = self.cfg.quota(),
            "the data file is over its quota: raising the NOSPACE alarm"
        );
        let alarm = api::etcdserverpb::AlarmRequest {
            action: api::etcdserverpb::alarm_request::AlarmAction::Activate as i32,
            member_id: self.id.0,
            alarm: api::etcdserverpb::AlarmType::Nospace as i32,
        };
        if let Err(e) = self.propose_internal(Op::Alarm(alarm)).await {
            tracing::warn!("raising the NOSPACE alarm failed: {}", e.message());
        }
        Err(error::no_space())
    }

    /// Proposes a client's `op`, made by `who`, and waits for its answer; applying it checks
    /// the caller's permissions again.
    pub async fn propose(&self, op: Op, who: Option<&AuthInfo>) -> Result<Response, Status> {
        let header = RequestHeader {
            username: who.map(|w| w.user.clone()).unwrap_or_default(),
            auth_revision: who.map_or(0, |w| w.revision),
        };
        // A client's only call in flight: its proposal need not wait for others'.
        let company = match self.kv_calls.load(Ordering::Relaxed) {
            1 => Company::None,
            _ => Company::Maybe,
        };
        self.propose_request(
            InternalRequest {
                op: Some(op),
                header: Some(header),
            },
            company,
        )
        .await
    }

    /// Proposes the member's own `op` (an expired lease, a checkpoint, an alarm, an automatic
    /// compaction) and waits for its answer.
    pub async fn propose_internal(&self, op: Op) -> Result<Response, Status> {
        self.propose_request(
            InternalRequest {
                op: Some(op),
                header: None,
            },
            Company::Maybe,
        )
        .await
    }

    /// Proposes `req` encoded; this member's apply takes `req` itself rather than decode it.
    async fn propose_request(
        &self,
        req: InternalRequest,
        company: Company,
    ) -> Result<Response, Status> {
        let (commit, applied) = self.node.progress();
        if too_far_behind(commit.0, applied.0, &req, self.cfg.priority_request) {
            return Err(error::too_many_requests());
        }
        // Timed from here, as etcd times it (etcd_server_request_duration_seconds).
        let start = std::time::Instant::now();
        let kind = crate::metrics::request_type(req.op.as_ref());
        let data = req.encode_to_vec();
        let answer = if data.len() > self.cfg.max_request_bytes {
            Err(error::request_too_large())
        } else {
            match self.node.propose_local(data, Box::new(req), company).await {
                Ok(applied) => applied,
                Err(e) => {
                    self.proposals_failed.fetch_add(1, Ordering::Relaxed);
                    Err(error::consensus(&e))
                }
            }
        };
        crate::metrics::proposal(kind, answer.is_ok(), start);
        answer
    }

    /// Waits until a read here sees every write acknowledged before the call (ReadIndex).
    pub async fn linearize(&self) -> Result<(), Status> {
        self.node
            .read_index()
            .await
            .map(|_| ())
            .map_err(|e| error::consensus(&e))
    }

    /// Resolves once a quorum confirms this member's leader (no wait for the apply).
    pub async fn confirm_leader(&self) -> Result<(), Status> {
        self.node
            .confirm_leader()
            .await
            .map_err(|e| error::consensus(&e))
    }

    /// The leader's id, or etcd's "no leader".
    pub fn leader(&self) -> Result<MemberId, Status> {
        self.node
            .leader()
            .0
            .ok_or_else(|| error::consensus(&consensus::Error::NoLeader))
    }

    /// etcd's learner rule: a learner serves only serializable reads and member/status
    /// queries.
    pub fn refuse_learner(&self) -> Result<(), Status> {
        if self.node.is_learner() {
            return Err(error::not_supported_for_learner());
        }
        Ok(())
    }

    /// Whether this member is the leader.
    pub fn is_leader(&self) -> bool {
        self.node.leader().1 == Role::Leader
    }

    /// Proposes checkpoints of leases' remaining TTLs, in the background (a failure only
    /// means a later leader restarts those leases from an older remainder).
    pub fn checkpoint_leases(self: &Arc<Self>, remaining: Vec<(LeaseId, i64)>) {
        for batch in remaining.chunks(CHECKPOINT_BATCH) {
            let req = api::etcdserverpb::LeaseCheckpointRequest {
                checkpoints: batch
                    .iter()
                    .map(|&(id, remaining_ttl)| api::etcdserverpb::LeaseCheckpoint {
                        id: id.0,
                        remaining_ttl,
                    })
                    .collect(),
            };
            let core = self.clone();
            tokio::spawn(async move {
                if let Err(e) = core.propose_internal(Op::LeaseCheckpoint(req)).await {
                    tracing::debug!("lease checkpoint failed: {}", e.message());
                }
            });
        }
    }

    /// A connection to the leader's peer port (for requests only the leader serves, as etcd
    /// forwards lease renewals to its leader's peer URLs), reused while the leader stays.
    pub fn leader_channel(&self) -> Result<tonic::transport::Channel, Status> {
        let leader = self.leader()?;
        let mut slot = self.to_leader.lock();
        if let Some((id, ch)) = slot.as_ref() {
            if *id == leader {
                return Ok(ch.clone());
            }
        }
        let url = self
            .node
            .members()
            .get(leader)
            .and_then(|m| m.peer_urls.first().cloned())
            .ok_or_else(|| error::consensus(&consensus::Error::NoLeader))?;
        let ch = self
            .dialer
            .channel(&url, |e| e.connect_timeout(Duration::from_secs(2)))
            .map_err(|e| Status::unavailable(format!("leader peer URL {url}: {e}")))?;
        *slot = Some((leader, ch.clone()));
        Ok(ch)
    }

    /// A connection to a peer URL whose calls end after `timeout` (the corruption checks').
    pub(crate) fn peer_channel(
        &self,
        url: &str,
        timeout: Duration,
    ) -> Result<tonic::transport::Channel, Status> {
        self.dialer
            .channel(url, |e| {
                e.connect_timeout(Duration::from_secs(2)).timeout(timeout)
            })
            .map_err(|e| Status::unavailable(format!("peer URL {url}: {e}")))
    }

    /// `msg` as a request to another member's peer port (forwarded to the leader, or a
    /// member's own question): it names this member's cluster.
    pub fn to_leader<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Ok(v) = self.cluster_id.to_string().parse() {
            r.metadata_mut().insert(FORWARD_CLUSTER, v);
        }
        r
    }
}

/// Runs beside the services until the core is dropped: leases on the leader (expiry clocks
/// start when this member becomes leader, and expired leases are revoked through consensus),
/// and this member's name and client URLs published into the member list.
pub async fn background(core: std::sync::Weak<Core>) {
    if let Some(c) = core.upgrade() {
        tokio::spawn(crate::compactor::run(core.clone(), c.cfg.auto_compaction));
        tokio::spawn(crate::corrupt::periodic(
            core.clone(),
            c.cfg.corrupt_check_time,
        ));
    }
    tokio::spawn(publish_until_done(core.clone()));
    tokio::spawn(crate::version::monitor(core.clone()));
    let mut leading = false;
    let mut last_checkpoint = Instant::now();
    let mut tick = tokio::time::interval(EXPIRY_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(core) = core.upgrade() else {
            return;
        };
        let store = core.backend.store();
        let now_leading = core.is_leader();
        if now_leading != leading {
            leading = now_leading;
            if leading {
                // As etcd: the new leader extends every lease by an election timeout, so
                // clients have time to find it and renew.
                store.lease_promote(Instant::now(), core.cfg.election_timeout);
            } else {
                store.lease_demote();
            }
        }
        let checkpoint_due = core
            .cfg
            .lease_checkpoint_interval
            .is_some_and(|every| last_checkpoint.elapsed() >= every);
        if checkpoint_due {
            last_checkpoint = Instant::now();
            if leading {
                let remaining: Vec<(LeaseId, i64)> = store
                    .lease_remaining(Instant::now())
                    .into_iter()
                    .filter(|&(_, left)| left > 0)
                    .collect();
                core.checkpoint_leases(remaining);
            }
        }
        if leading {
            for id in store.expired_leases(Instant::now(), REVOKES_PER_ROUND) {
                let c = core.clone();
                tokio::spawn(async move {
                    let r = c
                        .propose_internal(Op::LeaseRevoke(LeaseRevokeRequest { id: id.0 }))
                        .await;
                    match r {
                        Ok(_) => {
                            tracing::debug!(lease = %id, "expired lease revoked")
                        }
                        Err(e) if e.code() == tonic::Code::NotFound => {}
                        Err(e) => {
                            tracing::warn!(lease = %id, "revoking an expired lease failed: {}", e.message())
                        }
                    }
                });
            }
        }
    }
}

/// How often publishing this member's attributes is tried until it succeeds (it needs a
/// leader).
const PUBLISH_RETRY: Duration = Duration::from_millis(100);

/// Publishes this member's attributes, trying until it succeeds or the core is gone.
async fn publish_until_done(core: std::sync::Weak<Core>) {
    loop {
        let Some(c) = core.upgrade() else {
            return;
        };
        if publish(&c).await {
            return;
        }
        drop(c);
        tokio::time::sleep(PUBLISH_RETRY).await;
    }
}

impl Core {
    /// Whether the member list holds this member's name and client URLs as this member
    /// has them.
    pub fn published(&self) -> bool {
        self.node
            .members()
            .get(self.id)
            .is_some_and(|me| me.name == self.cfg.name && me.client_urls == self.cfg.client_urls)
    }
}

/// Resolves once this member's attributes are in the member list: etcd serves clients only
/// from then on, so that no client sees this member without its client URLs.
pub async fn published(core: &Core) {
    while !core.published() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Publishes this member's name and client URLs (etcd does so once started); true once done.
async fn publish(core: &Core) -> bool {
    let Some(me) = core.node.members().get(core.id).cloned() else {
        return false;
    };
    if core.published() {
        return true;
    }
    let update = Member {
        name: core.cfg.name.clone(),
        client_urls: core.cfg.client_urls.clone(),
        ..me
    };
    match core.node.change_membership(Change::Update(update)).await {
        Ok(_) => {
            tracing::info!(name = %core.cfg.name, urls = ?core.cfg.client_urls, "published this member's attributes");
            true
        }
        Err(e) => {
            tracing::debug!("publishing this member's attributes: {e}; retrying");
            false
        }
    }
}

#[cfg(test)]
mod gap_tests {
    use super::*;

    #[test]
    fn a_lease_revoke_goes_through_twice_the_gap_with_priority() {
        let req = |op| InternalRequest {
            op: Some(op),
            ..Default::default()
        };
        let put = req(Op::Put(Default::default()));
        let revoke = req(Op::LeaseRevoke(Default::default()));
        let at = |gap: u64| (1 + gap, 1);
        for priority in [false, true] {
            let (c, a) = at(MAX_APPLY_GAP);
            assert!(!too_far_behind(c, a, &put, priority));
            assert!(!too_far_behind(c, a, &revoke, priority));
            let (c, a) = at(MAX_APPLY_GAP + 1);
            assert!(too_far_behind(c, a, &put, priority));
            assert_eq!(too_far_behind(c, a, &revoke, priority), !priority);
        }
        let (c, a) = at(2 * MAX_APPLY_GAP + 1);
        assert!(too_far_behind(c, a, &revoke, true));
    }
}
