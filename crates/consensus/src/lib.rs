//! kvd's consensus: a raft-rs (tikv) driver — the write-ahead log, snapshots, the peer
//! transport, ReadIndex and membership. It replicates opaque entries; it knows nothing of keys.

pub mod wal;
