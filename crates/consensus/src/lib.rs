//! kvd's consensus: a raft-rs driver with its WAL, snapshots, peer transport, linearizable
//! reads and membership. It replicates opaque entries into a [`StateMachine`]; it knows nothing
//! of keys.

mod apply;
mod codec;
pub mod dial;
mod driver;
pub mod etcd_log;
pub mod grpc;
mod idmap;
mod log;
mod logger;
pub mod member;
pub mod metrics;
mod node;
mod raftpb;
mod snap;
pub mod transport;
pub mod wal;

pub use codec::Malformed;
pub use dial::{DialError, Dialer};
pub use driver::{existing_member, write_imported_log, ImportedEntry, ImportedLog, ImportedOp};
pub use ids::{BadId, ClusterId, MemberId, RaftIndex};
pub use member::{
    cluster_id, member_id, parse_initial_cluster, BadInitialCluster, Member, Members,
};
pub use node::{
    Change, Committed, Company, Config, Error, Inbox, Local, PeerProgress, RaftNode, Result, Role,
    Start, StateMachine, Status, LONE_TURNS,
};
pub use raft::eraftpb::{ConfState, HardState, Message, MessageType};
pub use snap::{SnapError, SnapMeta};
pub use transport::{Reporter, SnapshotDone, Transport};
