//! What kvd replicates: one internal request per raft entry (etcd's `InternalRaftRequest`),
//! carrying the client's request unchanged, and what applying it answers.

use api::etcdserverpb::{
    AlarmRequest, AlarmResponse, CompactionRequest, CompactionResponse, DeleteRangeRequest,
    DeleteRangeResponse, LeaseCheckpointRequest, LeaseGrantRequest, LeaseGrantResponse,
    LeaseRevokeRequest, LeaseRevokeResponse, PutRequest, PutResponse, TxnRequest, TxnResponse,
};
use prost::Message;

/// One replicated request.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InternalRequest {
    #[prost(oneof = "Op", tags = "1, 2, 3, 4, 5, 6, 7, 8")]
    pub op: Option<Op>,
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
}

impl InternalRequest {
    pub fn encode(op: Op) -> Vec<u8> {
        InternalRequest { op: Some(op) }.encode_to_vec()
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
        assert_eq!(back.op, Some(Op::Put(put)));
        assert!(InternalRequest::decode(&b"\xff\xff\xff"[..]).is_err());
    }
}
