//! `etcdserverpb.Lease`: grants and revocations go through consensus; keep-alives and
//! time-to-live run on the leader, which alone runs lease clocks — a follower forwards them to
//! the leader's peer port, as etcd forwards them to its leader's peer URLs.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use api::etcdserverpb::lease_client::LeaseClient;
use api::etcdserverpb::lease_server::Lease;
use api::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use ids::{LeaseId, MemberId};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{AuthInfo, Checks, Need};
use crate::error;
use crate::request::{Op, Response as Applied};
use crate::server::Core;

/// The Lease service.
#[derive(Debug, Clone)]
pub struct LeaseService {
    core: Arc<Core>,
}

impl LeaseService {
    pub fn new(core: Arc<Core>) -> Self {
        LeaseService { core }
    }
}

/// Lease ids for grants that leave the id to the server, made as etcd's request-id generator
/// makes them: the member id's low 16 bits, then 40 bits of the time the member started (in
/// milliseconds) and an 8-bit counter, the last 48 bits counted up from there. A member's
/// grants take increasing ids, so keys named by lease id (concurrency's lock and election
/// keys) list in grant order, as on etcd; two members' ids differ in their top bits unless
/// the members' own ids share their low 16.
#[derive(Debug)]
pub(crate) struct LeaseIds {
    prefix: u64,
    suffix: std::sync::atomic::AtomicU64,
}

impl LeaseIds {
    const SUFFIX_BITS: u32 = 48;
    const COUNT_BITS: u32 = 8;

    pub(crate) fn new(member: MemberId, now: std::time::SystemTime) -> LeaseIds {
        let millis = now
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let time_bits = Self::SUFFIX_BITS - Self::COUNT_BITS;
        LeaseIds {
            prefix: (member.0 & 0xffff) << Self::SUFFIX_BITS,
            suffix: std::sync::atomic::AtomicU64::new(
                (millis & ((1 << time_bits) - 1)) << Self::COUNT_BITS,
            ),
        }
    }

    /// The next id: positive and never 0, as etcd takes them (its generator's ids with the
    /// top bit cleared; one that is then 0 is skipped).
    pub(crate) fn next(&self) -> i64 {
        loop {
            let suffix = self
                .suffix
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                .wrapping_add(1);
            let id = (self.prefix | (suffix & ((1 << Self::SUFFIX_BITS) - 1))) & (i64::MAX as u64);
            if id != 0 {
                return id as i64;
            }
        }
    }
}

/// A keep-alive stream a follower holds open to the leader for one client stream.
struct Forward {
    leader: MemberId,
    tx: mpsc::Sender<LeaseKeepAliveRequest>,
    rx: Streaming<LeaseKeepAliveResponse>,
}

impl LeaseService {
    /// One keep-alive: renewed here on the leader, else through `fwd` at the leader.
    /// etcd 3.7's check of a renewal (`checkLeaseRenew`): with auth on, a caller, and one
    /// who may write every key of the lease unless an admin.
    fn may_renew(&self, who: &Renewer, id: LeaseId) -> Result<(), Status> {
        let Renewer::Client(who) = who else {
            return Ok(());
        };
        self.core.signed_in(who.as_ref())?;
        self.core.permitted(who.as_ref(), |c| c.lease(id))?;
        self.core.auth_unchanged(who.as_ref())
    }

    async fn renew(&self, id: LeaseId, fwd: &mut Option<Forward>) -> Result<i64, Status> {
        if self.core.is_leader() {
            *fwd = None;
            // A leader renews only once a quorum confirms it still leads (a ReadIndex round,
            // shared with the reads waiting): one cut off from the others or just resumed
            // from a pause may not know yet that another leads, whose clock for this lease
            // ran from its election; renewed here, the lease would expire there before its
            // holder's TTL ran out. etcd checks this only on a member whose ticks stalled;
            // kvd always does. With FastLeaseKeepAlive (etcd 3.7), a lease this member has
            // is renewed without waiting to apply what is committed; one it lacks may be
            // granted but not applied yet: the renewal waits for the apply to know.
            let store = self.core.backend.store();
            let confirmed = if self.core.cfg.fast_lease_keep_alive && store.lease_exists(id) {
                self.core.confirm_leader().await
            } else {
                self.core.linearize().await
            };
            if confirmed.is_err() || !self.core.is_leader() {
                return Err(error::not_primary());
            }
            return match self.core.backend.store().lease_renew(id, Instant::now()) {
                Ok(r) => {
                    if r.checkpointed {
                        // As etcd: every member forgets the checkpoint, so a later leader
                        // restarts this lease from its full TTL, not from a stale remainder.
                        self.core.checkpoint_leases(vec![(id, 0)]);
                    }
                    Ok(r.ttl)
                }
                // etcd answers an unknown lease with TTL 0.
                Err(mvcc::Error::LeaseNotFound) => Ok(0),
                Err(e) => Err(error::mvcc(&e)),
            };
        }
        let leader = self.core.leader()?;
        if fwd.as_ref().is_none_or(|f| f.leader != leader) {
            let mut client = LeaseClient::new(self.core.leader_channel()?);
            let (tx, rx) = mpsc::channel(16);
            let stream = client
                .lease_keep_alive(self.core.to_leader(ReceiverStream::new(rx)))
                .await
                .map_err(|s| error::forward_failed(&s))?
                .into_inner();
            *fwd = Some(Forward {
                leader,
                tx,
                rx: stream,
            });
        }
        let f = fwd.as_mut().expect("set above");
        let sent = f.tx.send(LeaseKeepAliveRequest { id: id.0 }).await;
        let got = match sent {
            Ok(()) => f.rx.message().await,
            Err(_) => Ok(None),
        };
        match got {
            Ok(Some(r)) => Ok(r.ttl),
            Ok(None) => {
                *fwd = None;
                Err(Status::unavailable("etcdserver: leader changed"))
            }
            Err(s) => {
                *fwd = None;
                Err(error::forward_failed(&s))
            }
        }
    }
}

impl LeaseService {
    /// Serves one keep-alive stream whose requests come from `input` (a gRPC stream, or the
    /// JSON gateway's); it ends when the input does.
    pub(crate) fn keep_alive<S>(&self, who: Renewer, mut input: S) -> KeepAliveOut
    where
        S: Stream<Item = Result<LeaseKeepAliveRequest, Status>> + Send + Unpin + 'static,
    {
        let (tx, rx) = mpsc::channel(16);
        let svc = self.clone();
        tokio::spawn(async move {
            let mut fwd = None;
            while let Some(Ok(r)) = input.next().await {
                let renewed = match svc.may_renew(&who, LeaseId(r.id)) {
                    Ok(()) => svc.renew(LeaseId(r.id), &mut fwd).await,
                    Err(e) => Err(e),
                };
                let out = renewed.map(|ttl| {
                    let rev = svc.core.backend.store().rev();
                    LeaseKeepAliveResponse {
                        header: Some(svc.core.header(rev)),
                        id: r.id,
                        ttl,
                    }
                });
                let failed = out.is_err();
                if tx.send(out).await.is_err() || failed {
                    return;
                }
            }
        });
        Box::pin(ReceiverStream::new(rx))
    }
}

/// Who renews over a keep-alive stream.
pub(crate) enum Renewer {
    /// A client (`None`: no credentials).
    Client(Option<AuthInfo>),
    /// A member forwarding its clients' renewals to the leader, having checked them.
    Member,
}

pub(crate) type KeepAliveOut =
    Pin<Box<dyn Stream<Item = Result<LeaseKeepAliveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Lease for LeaseService {
    async fn lease_grant(
        &self,
        req: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        let who = self.core.who(&req).await?;
        self.core.signed_in(who.as_ref())?;
        let mut r = req.into_inner();
        if r.ttl > mvcc::lease::MAX_LEASE_TTL {
            return Err(error::mvcc(&mvcc::Error::LeaseTtlTooLarge));
        }
        if r.id == 0 {
            r.id = self.core.lease_ids.next();
        }
        self.core.check_quota(32).await?;
        match self.core.propose(Op::LeaseGrant(r), who.as_ref()).await? {
            Applied::LeaseGrant(mut resp) => {
                self.core.fill(&mut resp.header);
                Ok(Response::new(resp))
            }
            other => Err(other.unexpected()),
        }
    }

    async fn lease_revoke(
        &self,
        req: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        let who = self.core.who(&req).await?;
        self.core.signed_in(who.as_ref())?;
        let r = req.into_inner();
        // Revoking deletes the lease's keys: the caller must be able to write them all.
        self.core
            .permitted(who.as_ref(), |c| c.lease(LeaseId(r.id)))?;
        match self.core.propose(Op::LeaseRevoke(r), who.as_ref()).await? {
            Applied::LeaseRevoke(mut resp) => {
                self.core.fill(&mut resp.header);
                Ok(Response::new(resp))
            }
            other => Err(other.unexpected()),
        }
    }

    type LeaseKeepAliveStream = KeepAliveOut;

    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        // A forwarded stream was checked by the member it came through.
        let who = match crate::forwarded(&req) {
            true => Renewer::Member,
            false => Renewer::Client(self.core.who(&req).await?),
        };
        Ok(Response::new(self.keep_alive(who, req.into_inner())))
    }

    async fn lease_time_to_live(
        &self,
        req: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        let who = self.core.who(&req).await?;
        let forwarded = crate::forwarded(&req);
        if !forwarded {
            self.core.signed_in(who.as_ref())?;
        }
        let r = req.into_inner();
        // etcd checks what the keys reveal where the request arrives (a forwarded one was
        // checked by the member that forwarded it): each must be readable, or the answer is
        // a refusal (not a shorter list), as etcd 3.6.5 answers.
        if r.keys && !forwarded {
            let keys = self
                .core
                .backend
                .store()
                .lease_keys(LeaseId(r.id))
                .unwrap_or_default();
            self.core.permitted(who.as_ref(), |c| {
                keys.iter().try_for_each(|k| c.need(Need::Read, k, &[]))
            })?;
        }
        if !self.core.is_leader() {
            let mut client = LeaseClient::new(self.core.leader_channel()?);
            let mut resp = client
                .lease_time_to_live(self.core.to_leader(r))
                .await
                .map_err(|s| error::forward_failed(&s))?
                .into_inner();
            self.core.auth_unchanged(who.as_ref())?;
            self.core.fill(&mut resp.header);
            return Ok(Response::new(resp));
        }
        let mut resp =
            self.core
                .backend
                .store()
                .lease_time_to_live(LeaseId(r.id), r.keys, Instant::now());
        self.core.auth_unchanged(who.as_ref())?;
        self.core.fill(&mut resp.header);
        Ok(Response::new(resp))
    }

    async fn lease_leases(
        &self,
        req: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        let who = self.core.who(&req).await?;
        self.core.signed_in(who.as_ref())?;
        self.core.linearize().await?;
        let store = self.core.backend.store();
        let mut resp = store.leases();
        // As etcd 3.7: a user who is not an admin must be able to read every leased key.
        if self.core.admin(who.as_ref()).is_err() {
            let keys: Vec<Vec<u8>> = resp
                .leases
                .iter()
                .flat_map(|l| store.lease_keys(LeaseId(l.id)).unwrap_or_default())
                .collect();
            self.core.permitted(who.as_ref(), |c| {
                keys.iter().try_for_each(|k| c.need(Need::Read, k, &[]))
            })?;
            self.core.auth_unchanged(who.as_ref())?;
        }
        self.core.fill(&mut resp.header);
        Ok(Response::new(resp))
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn lease_ids_count_up_under_the_members_bits() {
        // 2026-07-08 00:00:00 UTC, in milliseconds.
        let now = UNIX_EPOCH + Duration::from_millis(1_783_468_800_000);
        let ids = LeaseIds::new(MemberId(0x8e9e_05c5_2164_694d), now);
        let first = ids.next();
        // The member's low 16 bits on top, then the time's low 40 bits and a count of 1.
        let expect = (0x694d_u64 << 48) | ((1_783_468_800_000_u64 & ((1 << 40) - 1)) << 8) | 1;
        assert_eq!(first as u64, expect);
        let next: Vec<i64> = (0..300).map(|_| ids.next()).collect();
        assert!(next.windows(2).all(|w| w[1] == w[0] + 1));
        assert_eq!(next[0], first + 1);
        assert!(next.iter().all(|id| (*id as u64) >> 48 == 0x694d));
    }

    #[test]
    fn lease_ids_stay_positive_when_the_member_bits_have_the_top_one() {
        let ids = LeaseIds::new(MemberId(0xffff), UNIX_EPOCH);
        let id = ids.next();
        assert!(id > 0);
        assert_eq!(id as u64, (0x7fff << 48) | 1);
    }

    #[test]
    fn lease_ids_skip_zero() {
        // Member bits 0x8000 are cleared with the sign bit; a suffix wrapping to 0 gives 0.
        let ids = LeaseIds::new(MemberId(0x8000), UNIX_EPOCH);
        ids.suffix.store(
            (1 << LeaseIds::SUFFIX_BITS) - 1,
            std::sync::atomic::Ordering::Relaxed,
        );
        assert_eq!(ids.next(), 1);
    }
}
