//! etcd's gRPC errors: the status code and message etcd sends for each failure, so client retry
//! logic keyed on them (clientv3 retries `Unavailable`, etcdctl prints the message) works as it
//! does against etcd.

use tonic::{Code, Status};

/// Requests that fail before they reach consensus, and server-side failures with etcd's text.
pub(crate) fn request_too_large() -> Status {
    Status::invalid_argument("etcdserver: request is too large")
}

pub(crate) fn too_many_requests() -> Status {
    Status::resource_exhausted("etcdserver: too many requests")
}

pub(crate) fn no_space() -> Status {
    Status::resource_exhausted("etcdserver: mvcc: database space exceeded")
}

/// A write while the CORRUPT alarm stands (etcd's `ErrGRPCCorrupt`).
pub(crate) fn corrupt() -> Status {
    Status::data_loss("etcdserver: corrupt cluster")
}

pub(crate) fn bad_member_urls() -> Status {
    Status::invalid_argument("etcdserver: given member URLs are invalid")
}

pub(crate) fn peer_url_exists() -> Status {
    Status::failed_precondition("etcdserver: Peer URLs already exists")
}

pub(crate) fn bad_leader_transferee() -> Status {
    Status::failed_precondition("etcdserver: bad leader transferee")
}

pub(crate) fn not_leader() -> Status {
    Status::failed_precondition("etcdserver: not leader")
}

/// A keep-alive reached a member that thinks it leads but could not confirm it (etcd's
/// `lease.ErrNotPrimary`, which etcd sends as it is: code Unknown).
pub(crate) fn not_primary() -> Status {
    Status::unknown("not a primary lessor")
}

pub(crate) fn not_supported_for_learner() -> Status {
    Status::failed_precondition("etcdserver: rpc not supported for learner")
}

/// A request forwarded to the leader failed: the leader's own answers (etcd's errors) pass
/// through; failing to reach it is etcd's "leader changed", which clients retry.
pub(crate) fn forward_failed(s: &Status) -> Status {
    tracing::debug!("forwarding to the leader failed: {s}");
    if s.code() == Code::Unavailable && !s.message().starts_with("etcdserver:") {
        Status::unavailable("etcdserver: leader changed")
    } else {
        s.clone()
    }
}

/// The status etcd answers for an mvcc error.
pub(crate) fn mvcc(e: &mvcc::Error) -> Status {
    use mvcc::Error as E;
    let code = match e {
        E::EmptyKey
        | E::KeyNotFound
        | E::DuplicateKey
        | E::TooManyOps
        | E::ValueProvided
        | E::LeaseProvided
        | E::InvalidSortOption => Code::InvalidArgument,
        E::Compacted | E::FutureRev | E::LeaseTtlTooLarge => Code::OutOfRange,
        E::LeaseNotFound => Code::NotFound,
        E::LeaseExists => Code::FailedPrecondition,
        E::EmptyWatcherRange | E::DuplicateWatchId | E::WatcherNotExist => Code::InvalidArgument,
        E::Storage(_) | E::Corrupt { .. } | E::EtcdFile(_) | E::NotEtcd { .. } => Code::DataLoss,
        E::Stopped(_) => Code::Unavailable,
    };
    Status::new(code, e.to_string())
}

/// The status etcd answers for a consensus error.
pub(crate) fn consensus(e: &consensus::Error) -> Status {
    use consensus::Error as E;
    let code = match e {
        E::NoLeader | E::Timeout | E::Stopped | E::LeaderChanged | E::Removed | E::Unhealthy => {
            Code::Unavailable
        }
        E::MemberExists | E::NotLearner => Code::FailedPrecondition,
        E::MemberNotFound => Code::NotFound,
        // A member that fails these does not serve: they reach a client only as a broken
        // server's answer.
        E::Wal(_)
        | E::Snap(_)
        | E::StateMachine(_)
        | E::Raft(_)
        | E::Malformed(_)
        | E::Io { .. }
        | E::Spawn { .. }
        | E::WrongMember { .. }
        | E::ForeignWal { .. }
        | E::NotInInitialCluster(_)
        | E::ReservedId
        | E::Unrestorable { .. }
        | E::NotSnapshot => Code::Internal,
    };
    Status::new(code, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_messages_are_etcds() {
        let s = mvcc(&mvcc::Error::Compacted);
        assert_eq!(s.code(), Code::OutOfRange);
        assert_eq!(
            s.message(),
            "etcdserver: mvcc: required revision has been compacted"
        );
        let s = mvcc(&mvcc::Error::LeaseNotFound);
        assert_eq!(s.code(), Code::NotFound);
        assert_eq!(s.message(), "etcdserver: requested lease not found");
        let s = consensus(&consensus::Error::NoLeader);
        assert_eq!(s.code(), Code::Unavailable);
        assert_eq!(s.message(), "etcdserver: no leader");
        assert_eq!(request_too_large().code(), Code::InvalidArgument);
    }
}
