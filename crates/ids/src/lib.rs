//! kvd's ids as types, so an argument list cannot swap them: a member's id, the cluster's id, a
//! position in the raft log (`consensus`), a lease's id and a store revision (`mvcc`); `rpc` and
//! the binary take them from both. A crate of its own because `consensus` and `mvcc` know nothing
//! of each other, yet both speak of members (an alarm names the member that raised it).
//!
//! Ids print as etcd prints them (hex: `8e9e05c52164694d`), indexes and revisions in decimal. The
//! wire types (`api`, raft-rs's messages) keep etcd's and raft's plain integers; the conversion
//! happens where they are read and written.

use std::fmt;
use std::str::FromStr;

/// A member's raft id: etcd's, derived from its peer URLs and the cluster token (never 0, raft's
/// "no member").
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MemberId(pub u64);

/// The cluster's id: derived from the ids of the members that bootstrapped it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ClusterId(pub u64);

/// A position in the raft log: what a member has committed, applied or snapshotted.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Debug)]
pub struct RaftIndex(pub u64);

/// A lease's id: chosen by the client or the leader, never 0 (etcd's "no lease").
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct LeaseId(pub i64);

/// A store revision: the count of write transactions (etcd's `main` revision). 0 asks for the
/// newest where a request allows it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Debug)]
pub struct Revision(pub i64);

/// Ids parse as etcd writes them: hex, with no `0x`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an id (hex digits, as etcd prints ids)")]
pub struct BadId(pub String);

macro_rules! hex_id {
    ($t:ident, $int:ty) => {
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:x}", self.0)
            }
        }

        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($t), "({:x})"), self.0)
            }
        }

        impl FromStr for $t {
            type Err = BadId;
            fn from_str(s: &str) -> Result<Self, BadId> {
                <$int>::from_str_radix(s, 16)
                    .map($t)
                    .map_err(|_| BadId(s.to_string()))
            }
        }
    };
}

hex_id!(MemberId, u64);
hex_id!(ClusterId, u64);
hex_id!(LeaseId, i64);

impl MemberId {
    /// raft's "no member": no leader known, or a field not set.
    pub const NONE: MemberId = MemberId(0);
}

impl fmt::Display for RaftIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl LeaseId {
    /// etcd's "no lease": a key not attached to one.
    pub const NONE: LeaseId = LeaseId(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_print_and_parse_as_etcd_does() {
        let id = MemberId(0x8e9e05c52164694d);
        assert_eq!(id.to_string(), "8e9e05c52164694d");
        assert_eq!(format!("{id:?}"), "MemberId(8e9e05c52164694d)");
        assert_eq!("8e9e05c52164694d".parse(), Ok(id));
        assert_eq!(ClusterId(0xa).to_string(), "a");
        assert!("0x1".parse::<MemberId>().is_err());
        assert!("".parse::<ClusterId>().is_err());
        assert_eq!(RaftIndex(12).to_string(), "12");
        assert_eq!(LeaseId(0x694d7ed4dca3a80b).to_string(), "694d7ed4dca3a80b");
        assert_eq!("694d7ed4dca3a80b".parse(), Ok(LeaseId(0x694d7ed4dca3a80b)));
        assert_eq!(Revision(7).to_string(), "7");
    }
}
