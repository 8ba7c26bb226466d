//! The services the proxy forwards to the cluster as they are (with the caller's credentials):
//! Lease, Cluster, Maintenance, Auth, Lock and Election. As etcd's proxy: `MemberList`
//! answers with the proxy itself at `--advertise-client-url` (clients that sync their
//! endpoints from the member list keep talking to the proxy), and the namespace applies to
//! the keys a lease lists. Beyond etcd's proxy, `MemberPromote` is forwarded (etcd's answers
//! "not implemented").

use std::future::Future;
use std::pin::Pin;

use api::etcdserverpb::*;
use api::v3electionpb::election_server::Election;
use api::v3electionpb::*;
use api::v3lockpb::lock_server::Lock;
use api::v3lockpb::*;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::calls::Calls;
use crate::upstream::Creds;

/// The forwarding services.
#[derive(Debug, Clone)]
pub struct Forward {
    calls: Calls,
    /// What `MemberList` answers with (empty: the cluster's member list).
    advertise: String,
}

impl Forward {
    pub fn new(calls: Calls, advertise: String) -> Forward {
        Forward { calls, advertise }
    }
}

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;
type Answer<'a, T> = Pin<Box<dyn Future<Output = Result<Response<T>, Status>> + Send + 'a>>;

/// Unary methods forwarded on the client `$client` of [`Calls`]: each written out as
/// `async_trait` writes an `async fn` (the services' traits are declared with it).
macro_rules! unary {
    ($client:ident: $($method:ident($req:ty) -> $resp:ty;)*) => {$(
        fn $method<'a, 'async_trait>(&'a self, req: Request<$req>) -> Answer<'async_trait, $resp>
        where
            'a: 'async_trait,
            Self: 'async_trait,
        {
            Box::pin(async move {
                let creds = Creds::from_metadata(req.metadata());
                let msg = req.into_inner();
                self.calls.check_send(&msg)?;
                let (i, mut c) = self.calls.$client();
                let r = self.calls.answer(i, c.$method(creds.request(msg)).await)?;
                Ok(Response::new(r))
            })
        }
    )*};
}

/// A server stream of the cluster, handed to the client as it comes.
fn streamed<T: Send + 'static>(s: Streaming<T>) -> Boxed<T> {
    Box::pin(s)
}

/// A client stream, handed to the cluster message by message (it ends at the client's
/// first error).
fn requests<T: Send + 'static>(s: Streaming<T>) -> impl Stream<Item = T> + Send + 'static {
    s.map_while(Result::ok)
}

#[tonic::async_trait]
impl lease_server::Lease for Forward {
    unary! { lease:
        lease_grant(LeaseGrantRequest) -> LeaseGrantResponse;
        lease_revoke(LeaseRevokeRequest) -> LeaseRevokeResponse;
        lease_leases(LeaseLeasesRequest) -> LeaseLeasesResponse;
    }

    type LeaseKeepAliveStream = Boxed<LeaseKeepAliveResponse>;

    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        let creds = Creds::from_metadata(req.metadata());
        let input = requests(req.into_inner());
        let (i, mut c) = self.calls.lease();
        let out = self
            .calls
            .answer(i, c.lease_keep_alive(creds.request(input)).await)?;
        Ok(Response::new(streamed(out)))
    }

    async fn lease_time_to_live(
        &self,
        req: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        let creds = Creds::from_metadata(req.metadata());
        let (i, mut c) = self.calls.lease();
        let mut r = self.calls.answer(
            i,
            c.lease_time_to_live(creds.request(req.into_inner())).await,
        )?;
        self.calls.ns.lease_keys(&mut r.keys);
        Ok(Response::new(r))
    }
}

#[tonic::async_trait]
impl cluster_server::Cluster for Forward {
    unary! { cluster:
        member_add(MemberAddRequest) -> MemberAddResponse;
        member_remove(MemberRemoveRequest) -> MemberRemoveResponse;
        member_update(MemberUpdateRequest) -> MemberUpdateResponse;
        member_promote(MemberPromoteRequest) -> MemberPromoteResponse;
    }

    async fn member_list(
        &self,
        req: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        if self.advertise.is_empty() {
            let creds = Creds::from_metadata(req.metadata());
            let (i, mut c) = self.calls.cluster();
            let r = self
                .calls
                .answer(i, c.member_list(creds.request(req.into_inner())).await)?;
            return Ok(Response::new(r));
        }
        let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default();
        Ok(Response::new(MemberListResponse {
            members: vec![Member {
                name,
                client_ur_ls: vec![self.advertise.clone()],
                ..Default::default()
            }],
            ..Default::default()
        }))
    }
}

#[tonic::async_trait]
impl maintenance_server::Maintenance for Forward {
    unary! { maintenance:
        alarm(AlarmRequest) -> AlarmResponse;
        status(StatusRequest) -> StatusResponse;
        defragment(DefragmentRequest) -> DefragmentResponse;
        hash(HashRequest) -> HashResponse;
        hash_kv(HashKvRequest) -> HashKvResponse;
        move_leader(MoveLeaderRequest) -> MoveLeaderResponse;
        downgrade(DowngradeRequest) -> DowngradeResponse;
    }

    type SnapshotStream = Boxed<SnapshotResponse>;

    async fn snapshot(
        &self,
        req: Request<SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        let creds = Creds::from_metadata(req.metadata());
        let (i, mut c) = self.calls.maintenance();
        let out = self
            .calls
            .answer(i, c.snapshot(creds.request(req.into_inner())).await)?;
        Ok(Response::new(streamed(out)))
    }
}

#[tonic::async_trait]
impl auth_server::Auth for Forward {
    unary! { auth:
        auth_enable(AuthEnableRequest) -> AuthEnableResponse;
        auth_disable(AuthDisableRequest) -> AuthDisableResponse;
        auth_status(AuthStatusRequest) -> AuthStatusResponse;
        authenticate(AuthenticateRequest) -> AuthenticateResponse;
        user_add(AuthUserAddRequest) -> AuthUserAddResponse;
        user_get(AuthUserGetRequest) -> AuthUserGetResponse;
        user_list(AuthUserListRequest) -> AuthUserListResponse;
        user_delete(AuthUserDeleteRequest) -> AuthUserDeleteResponse;
        user_change_password(AuthUserChangePasswordRequest) -> AuthUserChangePasswordResponse;
        user_grant_role(AuthUserGrantRoleRequest) -> AuthUserGrantRoleResponse;
        user_revoke_role(AuthUserRevokeRoleRequest) -> AuthUserRevokeRoleResponse;
        role_add(AuthRoleAddRequest) -> AuthRoleAddResponse;
        role_get(AuthRoleGetRequest) -> AuthRoleGetResponse;
        role_list(AuthRoleListRequest) -> AuthRoleListResponse;
        role_delete(AuthRoleDeleteRequest) -> AuthRoleDeleteResponse;
        role_grant_permission(AuthRoleGrantPermissionRequest) -> AuthRoleGrantPermissionResponse;
        role_revoke_permission(AuthRoleRevokePermissionRequest) -> AuthRoleRevokePermissionResponse;
    }
}

#[tonic::async_trait]
impl Lock for Forward {
    unary! { lock:
        lock(LockRequest) -> LockResponse;
        unlock(UnlockRequest) -> UnlockResponse;
    }
}

#[tonic::async_trait]
impl Election for Forward {
    unary! { election:
        campaign(CampaignRequest) -> CampaignResponse;
        proclaim(ProclaimRequest) -> ProclaimResponse;
        leader(LeaderRequest) -> LeaderResponse;
        resign(ResignRequest) -> ResignResponse;
    }

    type ObserveStream = Boxed<LeaderResponse>;

    async fn observe(
        &self,
        req: Request<LeaderRequest>,
    ) -> Result<Response<Self::ObserveStream>, Status> {
        let creds = Creds::from_metadata(req.metadata());
        let (i, mut c) = self.calls.election();
        let out = self
            .calls
            .answer(i, c.observe(creds.request(req.into_inner())).await)?;
        Ok(Response::new(streamed(out)))
    }
}
