//! The etcd v3 server: request checks, proposals through consensus, the state machine that
//! applies them to mvcc, and the tonic services (`etcdserverpb.KV`, `Watch`, `Lease`,
//! `Cluster`, `Maintenance`, `Auth`, `grpc.health.v1.Health`) with etcd's wire behaviour.
//!
//! Every write is proposed (a single member is a one-member raft group, not a special path),
//! applied by [`KvStateMachine`] in raft order, and answered once applied here. Linearizable
//! reads wait for a ReadIndex round and read a store snapshot; serializable reads skip the round.

mod auth;
pub mod backend;
mod cluster;
pub mod compactor;
mod error;
mod kv;
mod lease;
mod maintenance;
pub mod request;
pub mod server;
pub mod state;
mod watch;

use std::sync::Arc;

pub use backend::{check_snapshot_file, restore_file, Backend};
pub use cluster::to_pb as members_pb;
pub use compactor::{parse_duration, AutoCompaction};
pub use server::{background, Core, ServerConfig};
pub use state::{Alarms, KvStateMachine};

use api::etcdserverpb::auth_server::AuthServer;
use api::etcdserverpb::cluster_server::ClusterServer;
use api::etcdserverpb::kv_server::KvServer;
use api::etcdserverpb::lease_server::LeaseServer;
use api::etcdserverpb::maintenance_server::MaintenanceServer;
use api::etcdserverpb::watch_server::WatchServer;

/// gRPC's receive limit over `--max-request-bytes`, as etcd's (room for the envelope).
const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;
/// etcd's gRPC send limit (math.MaxInt32).
const GRPC_MAX_SEND: usize = i32::MAX as usize;

/// Every etcd service over `core`, ready to add to a tonic server.
pub fn services(core: &Arc<Core>) -> tonic::service::Routes {
    let recv = core.cfg.max_request_bytes + GRPC_OVERHEAD_BYTES;
    macro_rules! limits {
        ($svc:expr) => {
            $svc.max_decoding_message_size(recv)
                .max_encoding_message_size(GRPC_MAX_SEND)
        };
    }
    tonic::service::Routes::new(limits!(KvServer::new(kv::KvService::new(core.clone()))))
        .add_service(limits!(WatchServer::new(watch::WatchService::new(
            core.clone()
        ))))
        .add_service(limits!(LeaseServer::new(lease::LeaseService::new(
            core.clone()
        ))))
        .add_service(limits!(ClusterServer::new(cluster::ClusterService::new(
            core.clone()
        ))))
        .add_service(limits!(MaintenanceServer::new(
            maintenance::MaintenanceService::new(core.clone())
        )))
        .add_service(limits!(AuthServer::new(auth::AuthService::new(
            core.clone()
        ))))
}
