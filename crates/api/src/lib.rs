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

/// `leasepb`: the lease record etcd keeps in its data file's `lease` bucket.
pub mod leasepb {
    tonic::include_proto!("leasepb");
}

/// The shape of every message above, generated from `proto/` with the code: what reading
/// JSON as protobuf's JSON mapping does (the gateway checks a request's JSON against it, to
/// refuse it in etcd's words).
pub mod schema {
    /// A field's type as protobuf's JSON mapping reads it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Kind {
        Bool,
        Int32,
        Int64,
        Uint32,
        Uint64,
        Float,
        Double,
        String,
        Bytes,
        Enum,
        Message,
    }

    /// One field of a message.
    #[derive(Debug)]
    pub struct Field {
        pub name: &'static str,
        /// The lowerCamelCase name JSON may use instead of `name`.
        pub json_name: &'static str,
        pub kind: Kind,
        pub repeated: bool,
        /// For a message or enum: its full name (`.etcdserverpb.Compare`).
        pub type_name: &'static str,
        /// The oneof it belongs to, if any.
        pub oneof: Option<&'static str>,
    }

    include!(concat!(env!("OUT_DIR"), "/schema.rs"));

    /// The values of enum `full_name` (`.etcdserverpb.RangeRequest.SortOrder`): names and
    /// numbers.
    pub fn enum_values(full_name: &str) -> &'static [(&'static str, i32)] {
        ENUMS
            .binary_search_by(|(n, _)| (*n).cmp(full_name))
            .map_or(&[], |i| ENUMS[i].1)
    }

    /// The fields of message `full_name` (`.etcdserverpb.RangeRequest`).
    pub fn message(full_name: &str) -> Option<&'static [Field]> {
        MESSAGES
            .binary_search_by(|(n, _)| (*n).cmp(full_name))
            .ok()
            .map(|i| MESSAGES[i].1)
    }
}
