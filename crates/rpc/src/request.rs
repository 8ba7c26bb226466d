//! What kvd replicates: one internal request per raft entry (etcd's `InternalRaftRequest`),
//! carrying the client's request unchanged, and what applying it answers.

use api::etcdserverpb::{
    AlarmRequest, AlarmResponse, AuthDisableRequest, AuthEnableRequest, AuthRoleAddRequest,
    AuthRoleDeleteRequest, AuthRoleGrantPermissionRequest, AuthRoleRevokePermissionRequest,
    AuthUserAddRequest, AuthUserChangePasswordRequest, AuthUserDeleteRequest,
    AuthUserGrantRoleRequest, AuthUserRevokeRoleRequest, CompactionRequest, CompactionResponse,
    DeleteRangeRequest, DeleteRangeResponse, DowngradeInfo, LeaseCheckpointRequest,
    LeaseGrantRequest, LeaseGrantResponse, LeaseRevokeRequest, LeaseRevokeResponse, PutRequest,
    PutResponse, TxnRequest, TxnResponse,
};
use prost::Message;

/// One replicated request.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InternalRequest {
    #[prost(
        oneof = "Op",
        tags = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22"
    )]
    pub op: Option<Op>,
    /// Who asked, for a client's request (etcd's RequestHeader): applying it checks the
    /// caller's permissions again, against the auth store as of that entry. None for the
    /// member's own requests (expired leases, checkpoints, alarms, auto-compaction).
    #[prost(message, optional, tag = "50")]
    pub header: Option<RequestHeader>,
}

/// The caller of a replicated request.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct RequestHeader {
    /// The user ("" with no credentials, or with auth off when proposed).
    #[prost(string, tag = "1")]
    pub username: String,
    /// The auth revision the caller's credentials were issued at (0: none).
    #[prost(uint64, tag = "2")]
    pub auth_revision: u64,
}

/// Authenticate, once the password checked: every member records a simple token made of
/// `simple_token` and the entry's index (the password never enters the log).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct InternalAuthenticate {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub simple_token: String,
}

/// The cluster version set (etcd's `membershippb.ClusterVersionSetRequest`), by the leader's
/// version monitor.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ClusterVersionSet {
    /// As etcd stores it: `3.7.0`.
    #[prost(string, tag = "1")]
    pub ver: String,
}

/// The operations a raft entry can carry.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Op {
    #[prost(message, tag = "1")]
    Put(PutRequest),
    #[prost(message, tag = "2")]
    DeleteRange(DeleteRangeRequest),
    #[prost(message, tag = "3")]
    Txn(TxnRequest),
    #[prost(message, tag = "4")]
    Compaction(CompactionRequest),
    /// A grant whose id the proposing member chose (never 0).
    #[prost(message, tag = "5")]
    LeaseGrant(LeaseGrantRequest),
    #[prost(message, tag = "6")]
    LeaseRevoke(LeaseRevokeRequest),
    #[prost(message, tag = "7")]
    LeaseCheckpoint(LeaseCheckpointRequest),
    #[prost(message, tag = "8")]
    Alarm(AlarmRequest),
    #[prost(message, tag = "9")]
    AuthEnable(AuthEnableRequest),
    #[prost(message, tag = "10")]
    AuthDisable(AuthDisableRequest),
    #[prost(message, tag = "11")]
    Authenticate(InternalAuthenticate),
    /// With the password already hashed (`hashed_password`), never in the clear.
    #[prost(message, tag = "12")]
    UserAdd(AuthUserAddRequest),
    #[prost(message, tag = "13")]
    UserDelete(AuthUserDeleteRequest),
    /// With the password already hashed.
    #[prost(message, tag = "14")]
    UserChangePassword(AuthUserChangePasswordRequest),
    #[prost(message, tag = "15")]
    UserGrantRole(AuthUserGrantRoleRequest),
    #[prost(message, tag = "16")]
    UserRevokeRole(AuthUserRevokeRoleRequest),
    #[prost(message, tag = "17")]
    RoleAdd(AuthRoleAddRequest),
    #[prost(message, tag = "18")]
    RoleDelete(AuthRoleDeleteRequest),
    #[prost(message, tag = "19")]
    RoleGrantPermission(AuthRoleGrantPermissionRequest),
    #[prost(message, tag = "20")]
    RoleRevokePermission(AuthRoleRevokePermissionRequest),
    /// The cluster's downgrade job set (enabled, with its target version) or cancelled.
    #[prost(message, tag = "21")]
    DowngradeInfoSet(DowngradeInfo),
    #[prost(message, tag = "22")]
    ClusterVersionSet(ClusterVersionSet),
}

impl Op {
    /// Whether applying the op needs an admin (a `root` user) when auth is on.
    pub fn needs_admin(&self) -> bool {
        matches!(
            self,
            Op::AuthEnable(_)
                | Op::AuthDisable(_)
                | Op::UserAdd(_)
                | Op::UserDelete(_)
                | Op::UserChangePassword(_)
                | Op::UserGrantRole(_)
                | Op::UserRevokeRole(_)
                | Op::RoleAdd(_)
                | Op::RoleDelete(_)
                | Op::RoleGrantPermission(_)
                | Op::RoleRevokePermission(_)
        )
    }

    /// What etcd's corrupt applier refuses: the ops that write keys or leases.
    pub fn writes_data(&self) -> bool {
        matches!(
            self,
            Op::Put(_)
                | Op::DeleteRange(_)
                | Op::Txn(_)
                | Op::Compaction(_)
                | Op::LeaseGrant(_)
                | Op::LeaseRevoke(_)
        )
    }
}

impl InternalRequest {
    /// A request of the member's own.
    pub fn encode(op: Op) -> Vec<u8> {
        InternalRequest {
            op: Some(op),
            header: None,
        }
        .encode_to_vec()
    }

    /// A client's request, made by `header`'s caller.
    pub fn encode_from(op: Op, header: RequestHeader) -> Vec<u8> {
        InternalRequest {
            op: Some(op),
            header: Some(header),
        }
        .encode_to_vec()
    }
}

/// The answer to an applied request.
#[derive(Debug, Clone)]
pub enum Response {
    /// Entries without a request (raft's own), or requests answered with nothing.
    None,
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
    Compaction(CompactionResponse),
    LeaseGrant(LeaseGrantResponse),
    LeaseRevoke(LeaseRevokeResponse),
    Alarm(AlarmResponse),
    /// An auth change was applied (its response is empty but for the header).
    AuthDone,
    /// Authenticate applied: the simple token every member recorded, or, for the member that
    /// signs JWTs, who to sign one for.
    Authenticated {
        user: String,
        revision: u64,
        simple_token: Option<String>,
    },
}

impl Response {
    /// The error for an answer of the wrong kind (a bug: each op has one kind of answer).
    pub(crate) fn unexpected(self) -> tonic::Status {
        tonic::Status::internal(format!("unexpected apply result {self:?}"))
    }
}

/// What the state machine hands back to the proposer: the response or etcd's error status.
pub type Applied = Result<Response, tonic::Status>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        let put = PutRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            lease: 7,
            prev_kv: true,
            ..Default::default()
        };
        let bytes = InternalRequest::encode(Op::Put(put.clone()));
        let back = InternalRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(back.op, Some(Op::Put(put.clone())));
        assert_eq!(back.header, None);
        let who = RequestHeader {
            username: "alice".into(),
            auth_revision: 3,
        };
        let bytes = InternalRequest::encode_from(Op::Put(put), who.clone());
        let back = InternalRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(back.header, Some(who));
        assert!(InternalRequest::decode(&b"\xff\xff\xff"[..]).is_err());
    }
}
