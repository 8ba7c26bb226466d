//! etcd v3's wire types and gRPC service stubs, generated from the `.proto` files in `proto/`.
//!
//! The packages keep etcd's names, so a message here encodes to the same bytes as etcd's and the
//! gRPC paths are etcd's (`/etcdserverpb.KV/Range`, …). Every message also has serde impls for
//! protobuf's JSON mapping (the `/v3/*` gateway's wire format). No logic lives in this crate.

#![allow(missing_docs, missing_debug_implementations)]

/// `mvccpb`: stored key-values and watch events.
pub mod mvccpb {
    tonic::include_proto!("mvccpb");
    include!(concat!(env!("OUT_DIR"), "/mvccpb.serde.rs"));
}

/// `authpb`: users, roles and permissions.
pub mod authpb {
    tonic::include_proto!("authpb");
    include!(concat!(env!("OUT_DIR"), "/authpb.serde.rs"));
}

/// `etcdserverpb`: requests, responses and the services KV, Watch, Lease, Cluster, Maintenance, Auth.
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
    include!(concat!(env!("OUT_DIR"), "/etcdserverpb.serde.rs"));
}

/// `v3lockpb`: the Lock service (distributed locks held under leases).
pub mod v3lockpb {
    tonic::include_proto!("v3lockpb");
    include!(concat!(env!("OUT_DIR"), "/v3lockpb.serde.rs"));
}

/// `v3electionpb`: the Election service (leader election over keys).
pub mod v3electionpb {
    tonic::include_proto!("v3electionpb");
    include!(concat!(env!("OUT_DIR"), "/v3electionpb.serde.rs"));
}
