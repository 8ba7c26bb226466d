//! The etcd v3 server: request checks, proposals through consensus, the state machine that
//! applies them to mvcc, and the tonic services (`etcdserverpb.KV`, `Watch`, `Lease`,
//! `Cluster`, `Maintenance`, `Auth`, `v3lockpb.Lock`, `v3electionpb.Election`,
//! `grpc.health.v1.Health`) with etcd's wire behaviour.
//!
//! Every write is proposed (a single member is a one-member raft group, not a special path),
//! applied by [`KvStateMachine`] in raft order, and answered once applied here. Linearizable
//! reads wait for a ReadIndex round and read a store snapshot; serializable reads skip the round.

pub mod apply;
pub mod auth;
pub mod backend;
mod cluster;
pub mod compactor;
mod concurrency;
pub mod corrupt;
mod direct_kv;
mod error;
mod http;
mod kv;
mod lease;
mod maintenance;
mod metrics;
pub mod migrate;
mod range_stream;
pub mod request;
pub mod server;
pub mod snapshot;
pub mod version;
mod watch;

use std::sync::Arc;

pub use apply::KvStateMachine;
pub use backend::Backend;
pub use cluster::to_pb as members_pb;
pub use compactor::{parse_duration, AutoCompaction, BadAutoCompaction, BadDuration};
pub use server::{background, published, Core, ServerConfig};

use api::etcdserverpb::auth_server::AuthServer;
use api::etcdserverpb::cluster_server::ClusterServer;
use api::etcdserverpb::kv_server::KvServer;
use api::etcdserverpb::lease_server::LeaseServer;
use api::etcdserverpb::maintenance_server::MaintenanceServer;
use api::v3electionpb::election_server::ElectionServer;
use api::v3lockpb::lock_server::LockServer;

/// gRPC's receive limit over `--max-request-bytes`, as etcd's (room for the envelope).
const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;
/// etcd's gRPC send limit (math.MaxInt32).
const GRPC_MAX_SEND: usize = i32::MAX as usize;

/// A connection's verified client certificate, in the extensions of each of its requests:
/// its CN is the user of a gRPC request that carries no token when auth is on, as etcd's
/// `--client-cert-auth` has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    pub common_name: String,
}

/// Marks a request a member forwarded to its leader over the peer port: the member that
/// received it from the client checked its permissions, so the leader does not again (it has
/// no credentials to check). Only the peer port's services set it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Forwarded;

/// Whether `req` was forwarded by a member (see [`Forwarded`]).
pub(crate) fn forwarded<T>(req: &tonic::Request<T>) -> bool {
    req.extensions().get::<Forwarded>().is_some()
}

/// What the client port serves: etcd's KV calls answered by the connection itself, and the
/// routers for everything else.
#[derive(Debug, Clone)]
pub struct ClientPort {
    /// Every etcd service, the JSON gateway and the HTTP endpoints.
    pub router: axum::Router,
    /// Only the gRPC services: what `--listen-client-urls` serve when
    /// `--listen-client-http-urls` takes the HTTP traffic elsewhere, as etcd splits it.
    pub grpc_router: axum::Router,
    /// Only the JSON gateway and the HTTP endpoints (`--listen-client-http-urls`).
    pub http_router: axum::Router,
    /// KV Range, Put, DeleteRange and Txn without tonic's per-call machinery.
    pub unary: Arc<dyn grpc_wire::Unary>,
    /// HTTP/2 settings, with gRPC's receive limit as etcd's.
    pub config: Arc<grpc_wire::Config>,
}

/// The process's `process_*` metrics (resident memory, CPU time, descriptors, start time), as
/// Go's Prometheus client serves them for etcd, in `registry` (a second call changes nothing).
pub fn register_process_metrics(registry: &prometheus::Registry) {
    let collector = prometheus::process_collector::ProcessCollector::for_self();
    match registry.register(Box::new(collector)) {
        Ok(()) | Err(prometheus::Error::AlreadyReg) => {}
        Err(e) => tracing::warn!("process metrics: {e}"),
    }
}

/// grpc-go's server metrics of the services a member serves, as etcd registers them (its
/// services and the health service); `extensive` adds the handling-time histograms.
pub fn grpc_metrics(extensive: bool) -> grpc_wire::CallMetrics {
    const HEALTH: [(&str, &str, &str); 2] = [
        ("grpc.health.v1.Health", "Check", "unary"),
        ("grpc.health.v1.Health", "Watch", "server_stream"),
    ];
    let methods: Vec<_> = api::schema::METHODS.iter().copied().chain(HEALTH).collect();
    grpc_wire::CallMetrics::new(&methods, extensive)
}

/// The client port over `core` with the HTTP/2 settings `config`, its receive limit set from
/// `--max-request-bytes` (called inside the runtime: it starts the health reporter).
pub fn client_port(core: &Arc<Core>, config: grpc_wire::Config) -> ClientPort {
    let config = grpc_wire::Config {
        max_recv_message: core.cfg.max_request_bytes + GRPC_OVERHEAD_BYTES,
        guard: core.client_guard.clone(),
        calls: Some(core.grpc_calls.clone()),
        ..config
    };
    // `/metrics` lists the consensus and storage histograms before their first sample.
    consensus::metrics::init();
    mvcc::init_metrics();
    register_process_metrics(prometheus::default_registry());
    metrics::init();
    let (health, health_service) = tonic_health::server::health_reporter();
    tokio::spawn(report_health(Arc::downgrade(core), health));
    let gate = axum::middleware::from_fn_with_state(core.clone(), learner_gate);
    let grpc = grpc_services(core)
        .add_service(health_service)
        .into_axum_router();
    // The JSON gateway makes its calls to the gRPC router, as etcd's dials its own port.
    let gateway = gateway::router(
        grpc.clone(),
        core.cfg.max_request_bytes + GRPC_OVERHEAD_BYTES,
    );
    let finish = |r: axum::Router| {
        r.fallback(http::fallback)
            .layer(axum::middleware::from_fn(http::grpc_status))
    };
    ClientPort {
        router: finish(
            grpc.clone()
                .merge(gateway.clone())
                .layer(gate.clone())
                .merge(http::router(core.clone())),
        ),
        grpc_router: finish(grpc.layer(gate.clone())),
        http_router: finish(gateway.layer(gate).merge(http::router(core.clone()))),
        unary: Arc::new(direct_kv::KvCalls::new(core.clone())),
        config: Arc::new(config),
    }
}

/// What a member's peer port serves besides raft: the calls followers forward to their
/// leader (lease keep-alives and time-to-live, membership changes), for members of this
/// cluster only.
pub fn peer_services(core: &Arc<Core>) -> tonic::service::Routes {
    let cluster = core.cluster_id.to_string();
    let check = move |req: tonic::Request<()>| -> Result<tonic::Request<()>, tonic::Status> {
        let from = req
            .metadata()
            .get(server::FORWARD_CLUSTER)
            .and_then(|v| v.to_str().ok());
        if from != Some(cluster.as_str()) {
            return Err(tonic::Status::failed_precondition(format!(
                "cluster id mismatch: this member is in cluster {cluster}, the request came from cluster {}",
                from.unwrap_or("(none)")
            )));
        }
        let mut req = req;
        req.extensions_mut().insert(Forwarded);
        Ok(req)
    };
    let recv = core.cfg.max_request_bytes + GRPC_OVERHEAD_BYTES;
    let lease = LeaseServer::new(lease::LeaseService::new(core.clone()))
        .max_decoding_message_size(recv)
        .max_encoding_message_size(GRPC_MAX_SEND);
    let cluster_svc = ClusterServer::new(cluster::ClusterService::new(core.clone()))
        .max_decoding_message_size(recv)
        .max_encoding_message_size(GRPC_MAX_SEND);
    let maintenance = tonic::service::interceptor::InterceptedService::new(
        MaintenanceServer::new(maintenance::MaintenanceService::new(core.clone())),
        check.clone(),
    );
    let routes = tonic::service::Routes::new(tonic::service::interceptor::InterceptedService::new(
        lease,
        check.clone(),
    ))
    .add_service(tonic::service::interceptor::InterceptedService::new(
        cluster_svc,
        check,
    ));
    // Of Maintenance, HashKV (the leader's corruption check asks its followers) and Status
    // (its version monitor asks their versions).
    tonic::service::Routes::from(
        routes
            .into_axum_router()
            .route_service(PEER_HASH_KV, maintenance.clone())
            .route_service(PEER_STATUS, maintenance),
    )
}

/// The Maintenance calls the peer port serves.
const PEER_HASH_KV: &str = "/etcdserverpb.Maintenance/HashKV";
const PEER_STATUS: &str = "/etcdserverpb.Maintenance/Status";

/// What `--listen-metrics-urls` serve, as etcd: `/metrics` and the health endpoints.
pub fn metrics_router(core: &Arc<Core>) -> axum::Router {
    http::metrics_router(core.clone()).fallback(http::fallback)
}

/// What a learner serves, as etcd's interceptors allow it: Status, Snapshot and Range (the KV
/// service refuses a linearizable Range itself), over gRPC or the JSON gateway.
const LEARNER_SERVES: &[&str] = &[
    "/etcdserverpb.Maintenance/Status",
    "/etcdserverpb.Maintenance/Snapshot",
    "/etcdserverpb.KV/Range",
    "/v3/maintenance/status",
    "/v3/maintenance/snapshot",
    "/v3/kv/range",
];

/// etcd's learner rule for every other gRPC and gateway call: "rpc not supported for learner".
async fn learner_gate(
    axum::extract::State(core): axum::extract::State<Arc<Core>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let path = req.uri().path();
    if LEARNER_SERVES.contains(&path) || !core.node.is_learner() {
        return next.run(req).await;
    }
    let refused = error::not_supported_for_learner();
    if path.starts_with("/v3/") {
        return gateway::error(&refused);
    }
    axum::response::IntoResponse::into_response(refused.into_http::<axum::body::Body>())
}

/// `grpc.health.v1.Health` for the empty service name: SERVING while this member has a
/// leader, NOT_SERVING otherwise (checked every 100 ms).
async fn report_health(
    core: std::sync::Weak<Core>,
    reporter: tonic_health::server::HealthReporter,
) {
    let mut last = None;
    loop {
        let Some(c) = core.upgrade() else {
            return;
        };
        let serving = c.node.leader().0.is_some();
        drop(c);
        if last != Some(serving) {
            let status = if serving {
                tonic_health::ServingStatus::Serving
            } else {
                tonic_health::ServingStatus::NotServing
            };
            reporter.set_service_status("", status).await;
            last = Some(serving);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

fn grpc_services(core: &Arc<Core>) -> tonic::service::Routes {
    let recv = core.cfg.max_request_bytes + GRPC_OVERHEAD_BYTES;
    macro_rules! limits {
        ($svc:expr) => {
            $svc.max_decoding_message_size(recv)
                .max_encoding_message_size(GRPC_MAX_SEND)
        };
    }
    tonic::service::Routes::new(limits!(KvServer::new(kv::KvService::new(core.clone()))))
        .add_service(watch::WatchServer::new(
            watch::WatchService::new(core.clone()),
            recv,
            GRPC_MAX_SEND,
        ))
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
        .add_service(limits!(LockServer::new(concurrency::LockService::new(
            core.clone()
        ))))
        .add_service(limits!(ElectionServer::new(
            concurrency::ElectionService::new(core.clone())
        )))
}
