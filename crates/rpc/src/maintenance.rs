//! `etcdserverpb.Maintenance`: status, alarms, hashes, snapshots and leadership moves.

use std::io::Read;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use api::etcdserverpb::alarm_request::AlarmAction;
use api::etcdserverpb::downgrade_request::DowngradeAction;
use api::etcdserverpb::maintenance_server::Maintenance;
use api::etcdserverpb::{
    AlarmMember, AlarmRequest, AlarmResponse, AlarmType, DefragmentRequest, DefragmentResponse,
    DowngradeInfo, DowngradeRequest, DowngradeResponse, HashKvRequest, HashKvResponse, HashRequest,
    HashResponse, MoveLeaderRequest, MoveLeaderResponse, SnapshotRequest, SnapshotResponse,
    StatusRequest, StatusResponse,
};
use ids::{MemberId, Revision};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::error;
use crate::request::{Op, Response as Applied};
use crate::server::Core;
use crate::version::{Version, SERVER_VERSION};

/// The Maintenance service.
#[derive(Debug, Clone)]
pub struct MaintenanceService {
    core: Arc<Core>,
}

impl MaintenanceService {
    pub fn new(core: Arc<Core>) -> Self {
        MaintenanceService { core }
    }
}

fn alarm_name(a: i32) -> &'static str {
    match AlarmType::try_from(a) {
        Ok(AlarmType::Nospace) => "NOSPACE",
        Ok(AlarmType::Corrupt) => "CORRUPT",
        _ => "NONE",
    }
}

type SnapshotOut = Pin<Box<dyn Stream<Item = Result<SnapshotResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    async fn alarm(&self, req: Request<AlarmRequest>) -> Result<Response<AlarmResponse>, Status> {
        let who = self.core.who(&req).await?;
        let r = req.into_inner();
        match AlarmAction::try_from(r.action) {
            Ok(AlarmAction::Get) => {
                // As etcd 3.7: any user may list.
                self.core.signed_in(who.as_ref())?;
                // etcd answers a list through its log, so it sees every alarm raised or
                // cleared before the call: here a ReadIndex does, whichever member answers
                // (a disarm lists first and would miss an alarm a lagging member had not yet
                // applied, leaving it standing).
                self.core.linearize().await?;
                let alarms = self
                    .core
                    .alarms()
                    .iter()
                    .filter(|&&(m, a)| {
                        (r.member_id == 0 || m == MemberId(r.member_id))
                            && (r.alarm == 0 || a == r.alarm)
                    })
                    .map(|&(member, alarm)| AlarmMember {
                        member_id: member.0,
                        alarm,
                    })
                    .collect();
                let rev = self.core.backend.store().rev();
                Ok(Response::new(AlarmResponse {
                    header: Some(self.core.header(rev)),
                    alarms,
                }))
            }
            Ok(AlarmAction::Activate | AlarmAction::Deactivate) => {
                // Raising an alarm stops every write; clearing one lifts a stop the cluster
                // raised: an admin's call (as etcd 3.7; 3.6.5 let any caller make it).
                self.core.admin(who.as_ref())?;
                match self.core.propose(Op::Alarm(r), who.as_ref()).await? {
                    Applied::Alarm(mut resp) => {
                        self.core.fill(&mut resp.header);
                        Ok(Response::new(resp))
                    }
                    other => Err(other.unexpected()),
                }
            }
            Err(_) => Err(Status::invalid_argument("etcdserver: unknown alarm action")),
        }
    }

    async fn status(
        &self,
        req: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        // As etcd 3.7: any user; on the peer port, the leader's version monitor.
        if !crate::forwarded(&req) {
            self.core.signed_in(self.core.who(&req).await?.as_ref())?;
        }
        let st = self.core.node.status();
        let store = self.core.backend.store();
        // As bbolt reports them to etcd: up to the high-water mark, and that less the pages the
        // newest commit no longer reaches.
        let space = store.db().space();
        let errors = self
            .core
            .alarms()
            .iter()
            .map(|&(m, a)| format!("memberID:{} alarm:{} ", m.0, alarm_name(a)))
            .collect();
        let is_learner = st.members.get(st.id).is_some_and(|m| m.is_learner);
        Ok(Response::new(StatusResponse {
            header: Some(self.core.header(store.rev())),
            version: SERVER_VERSION.into(),
            db_size: space.size as i64,
            leader: st.leader.unwrap_or(MemberId::NONE).0,
            raft_index: st.commit.0,
            raft_term: st.term,
            raft_applied_index: st.applied.0,
            errors,
            db_size_in_use: space.in_use as i64,
            is_learner,
            storage_version: self
                .core
                .storage_version()
                .map(|v| v.full())
                .unwrap_or_default(),
            // As etcd 3.7: the flag as given, or etcd's default quota (2 GiB) when unset
            // (3.6 answered 0 then).
            db_size_quota: match self.core.cfg.quota_backend_bytes {
                0 => ETCD_DEFAULT_QUOTA_BYTES,
                q => q as i64,
            },
            downgrade_info: Some(store.downgrade()),
        }))
    }

    /// etcd's defragment is this member's alone (not through consensus); kvd's lets reads and
    /// writes go on while it copies.
    async fn defragment(
        &self,
        req: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        self.core.admin(self.core.who(&req).await?.as_ref())?;
        let backend = self.core.backend.clone();
        tokio::task::spawn_blocking(move || backend.defragment())
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| error::mvcc(&e))?;
        // As etcd's: no header.
        Ok(Response::new(DefragmentResponse::default()))
    }

    async fn hash(&self, req: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        self.core.admin(self.core.who(&req).await?.as_ref())?;
        let backend = self.core.backend.clone();
        let hash = tokio::task::spawn_blocking(move || -> std::io::Result<u32> {
            let mut dump = backend.dump()?;
            let mut buf = vec![0; 1 << 16];
            let mut h = 0;
            loop {
                let n = dump.read(&mut buf)?;
                if n == 0 {
                    return Ok(h);
                }
                h = crc32c::crc32c_append(h, &buf[..n]);
            }
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(|e| Status::internal(format!("hash: {e}")))?;
        let rev = self.core.backend.store().rev();
        Ok(Response::new(HashResponse {
            header: Some(self.core.header(rev)),
            hash,
        }))
    }

    async fn hash_kv(
        &self,
        req: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        // A peer's corruption check (on the peer port) carries no credentials.
        if !crate::forwarded(&req) {
            self.core.admin(self.core.who(&req).await?.as_ref())?;
        }
        let rev = Revision(req.into_inner().revision);
        let store = self.core.backend.store();
        let h = tokio::task::spawn_blocking(move || store.hash_kv(rev))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| error::mvcc(&e))?;
        Ok(Response::new(HashKvResponse {
            header: Some(self.core.header(h.current)),
            hash: h.hash,
            compact_revision: h.compact_revision.0,
            hash_revision: h.hash_revision.0,
        }))
    }

    type SnapshotStream = SnapshotOut;

    async fn snapshot(
        &self,
        req: Request<SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        self.core.admin(self.core.who(&req).await?.as_ref())?;
        let store = self.core.backend.store();
        let storage = self.core.storage_version();
        let etcd = crate::snapshot::etcd_meta(&self.core.node.members(), storage);
        let version = storage.map(|v| v.full()).unwrap_or_default();
        let (tx, rx) = mpsc::channel(4);
        tokio::task::spawn_blocking(move || {
            // As etcd's: no header, the storage version on every message.
            let mut send = |blob: Vec<u8>, remaining_bytes: u64| {
                let resp = SnapshotResponse {
                    header: None,
                    remaining_bytes,
                    blob,
                    version: version.clone(),
                };
                tx.blocking_send(Ok(resp))
                    .map_err(|_| std::io::Error::other("the client went away"))
            };
            if let Err(e) = crate::snapshot::stream(&store, &etcd, &mut send) {
                let _ = tx.blocking_send(Err(Status::internal(format!("snapshot: {e}"))));
            }
        });
        Ok(Response::new(
            Box::pin(ReceiverStream::new(rx)) as SnapshotOut
        ))
    }

    async fn move_leader(
        &self,
        req: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        self.core.admin(self.core.who(&req).await?.as_ref())?;
        let target = MemberId(req.into_inner().target_id);
        if !self.core.is_leader() {
            return Err(error::not_leader());
        }
        let voter = self
            .core
            .node
            .members()
            .get(target)
            .is_some_and(|m| !m.is_learner);
        if !voter {
            return Err(error::bad_leader_transferee());
        }
        if target != self.core.id {
            self.core
                .node
                .transfer_leader(target)
                .map_err(|e| error::consensus(&e))?;
            // As etcd: wait (up to an election timeout's worth of retries) for the move.
            let deadline = tokio::time::Instant::now() + self.core.cfg.election_timeout * 5;
            while self.core.node.leader().0 != Some(target) {
                if tokio::time::Instant::now() > deadline {
                    return Err(error::consensus(&consensus::Error::Timeout));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        // As etcd's: no header.
        Ok(Response::new(MoveLeaderResponse::default()))
    }

    async fn downgrade(
        &self,
        req: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        let who = self.core.who(&req).await?;
        self.core.admin(who.as_ref())?;
        let req = req.into_inner();
        // As etcd: read the job after every write acknowledged before the call.
        self.core.linearize().await?;
        let store = self.core.backend.store();
        let job = store.downgrade();
        let cluster = self.core.cluster_version();
        let resp = |cluster: Option<Version>| {
            Response::new(DowngradeResponse {
                header: Some(self.core.header(store.rev())),
                version: cluster.map(Version::short).unwrap_or_default(),
            })
        };
        let set = |info: DowngradeInfo| self.core.propose(Op::DowngradeInfoSet(info), who.as_ref());
        match DowngradeAction::try_from(req.action) {
            Ok(DowngradeAction::Validate) => {
                downgrade_target(&req.version, cluster, job.enabled)?;
                Ok(resp(cluster))
            }
            Ok(DowngradeAction::Enable) => {
                let target = downgrade_target(&req.version, cluster, job.enabled)?;
                set(DowngradeInfo {
                    enabled: true,
                    target_version: target.full(),
                })
                .await?;
                Ok(resp(self.core.cluster_version()))
            }
            // etcd answers a cancel with no downgrade under way as one that cancelled.
            Ok(DowngradeAction::Cancel) => {
                if job.enabled {
                    set(DowngradeInfo::default()).await?;
                }
                Ok(resp(self.core.cluster_version()))
            }
            Err(_) => Err(Status::invalid_argument("etcdserver: unknown method")),
        }
    }
}

/// etcd's `DefaultQuotaBytes`.
const ETCD_DEFAULT_QUOTA_BYTES: i64 = 2 << 30;

/// The target a downgrade request may name (`3.6` or `3.6.z`: etcd takes major.minor, or a
/// full version whose patch it drops, and allows only the minor version below the cluster's);
/// etcd's errors otherwise.
fn downgrade_target(
    version: &str,
    cluster: Option<Version>,
    in_progress: bool,
) -> Result<Version, Status> {
    let wrong = || Status::invalid_argument("etcdserver: wrong downgrade target version format");
    let target = Version::parse(version)
        .or_else(|| Version::parse(&format!("{version}.0")))
        .ok_or_else(wrong)?;
    let Some(cluster) = cluster else {
        return Err(Status::failed_precondition(
            "etcdserver: cluster version not found during downgrade",
        ));
    };
    if target != cluster.downgrade_target() {
        return Err(Status::invalid_argument(
            "etcdserver: invalid downgrade target version",
        ));
    }
    if in_progress {
        return Err(Status::failed_precondition(
            "etcdserver: cluster has a downgrade job in progress",
        ));
    }
    Ok(target)
}

#[cfg(test)]
mod downgrade_tests {
    use super::*;

    #[test]
    fn targets_as_etcd_takes_them() {
        let at = Some(Version { major: 3, minor: 6 });
        let ok = |v: &str| downgrade_target(v, at, false).unwrap().full();
        assert_eq!(ok("3.5"), "3.5.0");
        assert_eq!(ok("3.5.9"), "3.5.0");
        let e = |v: &str, busy| downgrade_target(v, at, busy).unwrap_err();
        assert_eq!(
            e("v3.5", false).message(),
            "etcdserver: wrong downgrade target version format"
        );
        assert_eq!(e("bad", false).code(), tonic::Code::InvalidArgument);
        assert_eq!(
            e("3.4", false).message(),
            "etcdserver: invalid downgrade target version"
        );
        assert_eq!(
            e("3.6", false).message(),
            "etcdserver: invalid downgrade target version"
        );
        assert_eq!(e("3.5", true).code(), tonic::Code::FailedPrecondition);
        let undecided = downgrade_target("3.6", None, false).unwrap_err();
        assert_eq!(
            undecided.message(),
            "etcdserver: cluster version not found during downgrade"
        );
    }
}
