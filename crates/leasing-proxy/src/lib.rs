//! kvd's etcd v3 proxy (`kvd grpc-proxy start`): a stateless front for a cluster that
//! clients use as they would a member, with etcd's grpc-proxy flags and behaviour, and a
//! *leasing* cache (`--experimental-leasing-prefix`): linearizable single-key reads of keys
//! the proxy holds a lease on are answered from its memory, with no round trip to the
//! cluster — and keep being answered while the cluster is unreachable, until the proxy's
//! session lease could have expired.
//!
//! It talks to the cluster through etcd's public API only, so it works in front of kvd and in
//! front of etcd, and shares a leasing prefix with etcd's leasing proxies.
//!
//! | module | what it holds |
//! |---|---|
//! | `upstream` | the endpoints, failover, the newest header seen |
//! | `calls` | every call to the cluster: credentials, namespace, limits |
//! | `session` | the session lease and the deadline it is certainly alive until |
//! | `cache` | the held keys and the rules for answering from them |
//! | `leasing` | the protocol: taking keys, revocations, writes |
//! | `kv`, `watch`, `forward`, `http` | the services clients see |
//!
//! ```no_run
//! # async fn example(connect: leasing_proxy::Connect) -> Result<(), leasing_proxy::StartError> {
//! let cfg = leasing_proxy::Config {
//!     endpoints: vec!["http://127.0.0.1:2379".into()],
//!     leasing: Some(leasing_proxy::LeasingOptions {
//!         prefix: b"_/leases/".to_vec(),
//!         ..Default::default()
//!     }),
//!     ..Default::default()
//! };
//! let proxy = leasing_proxy::Proxy::start(cfg, connect).await?;
//! let unary = proxy.unary(); // etcd's KV calls, answered by the connection (grpc-wire)
//! let router = proxy.router(); // every other service, and /health, /metrics
//! # Ok(()) }
//! ```

mod cache;
mod calls;
mod forward;
mod h2call;
mod kv;
mod leasing;
mod metrics;
mod namespace;
mod routes;
mod session;
mod upstream;
mod watch;
mod watchmux;

use std::sync::Arc;
use std::time::Duration;

use api::etcdserverpb::auth_server::AuthServer;
use api::etcdserverpb::cluster_server::ClusterServer;
use api::etcdserverpb::kv_server::KvServer;
use api::etcdserverpb::lease_server::LeaseServer;
use api::etcdserverpb::maintenance_server::MaintenanceServer;
use api::etcdserverpb::watch_server::{Watch, WatchServer};
use api::etcdserverpb::{RangeRequest, WatchRequest, WatchResponse};
use api::v3electionpb::election_server::ElectionServer;
use api::v3lockpb::lock_server::LockServer;
use tonic::{Request, Response, Status, Streaming};

pub use h2call::{Dial, Io};
pub use leasing::Options as LeasingOptions;
pub use leasing::{REVOKE, SHARED};
pub use metrics::Metrics;
pub use upstream::Connect;

use calls::Calls;
use upstream::{Creds, Upstream};

/// The proxy's settings (etcd's grpc-proxy flags, and kvd's `--leasing-*`).
#[derive(Debug, Clone)]
pub struct Config {
    /// The cluster's client URLs (`--endpoints`).
    pub endpoints: Vec<String>,
    /// Every key under this prefix upstream (`--namespace`).
    pub namespace: Vec<u8>,
    /// What `MemberList` answers (`--advertise-client-url`; empty: the cluster's list).
    pub advertise_client_url: String,
    /// The largest message sent to, and taken from, the cluster (`--max-send-bytes`,
    /// `--max-recv-bytes`).
    pub max_send_bytes: usize,
    pub max_recv_bytes: usize,
    /// The leasing layer, when on.
    pub leasing: Option<LeasingOptions>,
    /// The session lease's TTL (`--leasing-ttl`) and the share of it kept back for clock
    /// drift (`--leasing-clock-drift`).
    pub session_ttl: Duration,
    pub clock_drift: f64,
    /// How long a start waits for the cluster when it must ask it something (the shared
    /// leasing check; `--dial-timeout`).
    pub dial_timeout: Duration,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            namespace: Vec::new(),
            advertise_client_url: "127.0.0.1:23790".into(),
            // etcd's grpc-proxy defaults: 1.5 MiB sent, math.MaxInt32 taken.
            max_send_bytes: 3 << 19,
            max_recv_bytes: i32::MAX as usize,
            leasing: None,
            session_ttl: Duration::from_secs(60),
            clock_drift: 0.01,
            dial_timeout: Duration::from_secs(5),
        }
    }
}

impl Default for LeasingOptions {
    fn default() -> Self {
        LeasingOptions {
            prefix: Vec::new(),
            shared: false,
            cache_keys: 100_000,
            cache_bytes: 256 << 20,
            backoff: Duration::from_secs(2),
        }
    }
}

/// A running proxy: its services, to be served on its listeners.
#[derive(Debug)]
pub struct Proxy {
    calls: Calls,
    session: Option<Arc<session::Session>>,
    leasing: Option<Arc<leasing::Leasing>>,
    kv: Arc<kv::Kv>,
    watch: watch::WatchProxy,
    forward: forward::Forward,
    tasks: Vec<tokio::task::AbortHandle>,
}

/// Why the proxy would not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    #[error("--endpoints: no endpoint given")]
    NoEndpoints,
    #[error("--endpoints {endpoint}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    #[error("--experimental-leasing-prefix: empty")]
    EmptyPrefix,
    #[error("--leasing-shared: cannot check the leasing prefix for etcd-style holders: {0}")]
    SharedCheck(String),
    #[error(
        "--leasing-shared: an etcd proxy holds a leasing key on the prefix ({0:?}): etcd's \
         leasing proxies do not respect shared leases; stop them (or use another prefix)"
    )]
    EtcdHolder(String),
}

impl Proxy {
    /// Starts the proxy's own work (the leasing session and its watches), inside a tokio
    /// runtime. Only `--leasing-shared` asks the cluster anything before it returns.
    pub async fn start(cfg: Config, connect: Connect) -> Result<Proxy, StartError> {
        let up = Arc::new(Upstream::new(
            &cfg.endpoints,
            &connect,
            cfg.dial_timeout,
            cfg.max_recv_bytes,
        )?);
        let calls = Calls {
            up,
            ns: namespace::Namespace::new(&cfg.namespace),
            metrics: Arc::new(Metrics::new()),
            max_send: cfg.max_send_bytes,
            max_recv: cfg.max_recv_bytes,
        };
        let mut tasks = Vec::new();
        let (session, leasing) = match &cfg.leasing {
            None => (None, None),
            Some(opts) => {
                if opts.prefix.is_empty() {
                    return Err(StartError::EmptyPrefix);
                }
                if opts.shared {
                    check_shared_prefix(&calls, &opts.prefix, cfg.dial_timeout).await?;
                }
                let s = session::Session::new(cfg.session_ttl, cfg.clock_drift);
                let l = leasing::Leasing::new(calls.clone(), s.clone(), opts);
                tasks.push(
                    tokio::spawn(s.clone().run(calls.up.clone(), calls.metrics.clone()))
                        .abort_handle(),
                );
                tasks.push(tokio::spawn(l.clone().watch_revocations()).abort_handle());
                (Some(s), Some(l))
            }
        };
        Ok(Proxy {
            kv: Arc::new(kv::Kv::new(calls.clone(), leasing.clone())),
            watch: watch::WatchProxy::new(calls.clone()),
            forward: forward::Forward::new(calls.clone(), cfg.advertise_client_url.clone()),
            calls,
            session,
            leasing,
            tasks,
        })
    }

    /// etcd's KV calls as the client connection answers them (grpc-wire).
    pub fn unary(&self) -> Arc<dyn grpc_wire::Unary> {
        Arc::new(kv::KvCalls(self.kv.clone()))
    }

    /// Every gRPC service (the KV calls too, for clients that compress), the JSON gateway,
    /// `/health` and `/metrics`; gRPC's UNIMPLEMENTED for other services, 404 for other paths.
    pub fn router(&self) -> axum::Router {
        // The proxy's own receive limit is grpc-go's default (etcd's proxy sets none).
        const RECV: usize = 4 << 20;
        macro_rules! limits {
            ($svc:expr) => {
                $svc.max_decoding_message_size(RECV)
                    .max_encoding_message_size(usize::MAX)
            };
        }
        let grpc = tonic::service::Routes::new(limits!(KvServer::from_arc(self.kv.clone())))
            .add_service(limits!(WatchServer::new(self.watch.clone())))
            .add_service(limits!(LeaseServer::new(self.forward.clone())))
            .add_service(limits!(ClusterServer::new(self.forward.clone())))
            .add_service(limits!(MaintenanceServer::new(self.forward.clone())))
            .add_service(limits!(AuthServer::new(self.forward.clone())))
            .add_service(limits!(LockServer::new(self.forward.clone())))
            .add_service(limits!(ElectionServer::new(self.forward.clone())))
            .into_axum_router();
        // The JSON gateway on the same port (etcd's proxy has none), its calls made to the
        // proxy's own services.
        let gateway = gateway::router(grpc.clone(), RECV);
        grpc.merge(gateway)
            .merge(self.http_routes())
            .fallback(routes::fallback)
            .layer(axum::middleware::from_fn(routes::grpc_status))
    }

    /// What `--metrics-addr` serves: `/metrics` and `/health`.
    pub fn metrics_router(&self) -> axum::Router {
        self.http_routes().fallback(routes::fallback)
    }

    fn http_routes(&self) -> axum::Router {
        routes::router(routes::Http {
            calls: self.calls.clone(),
            leasing: self.leasing.clone(),
        })
    }

    /// The proxy's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.calls.metrics
    }

    /// A clean stop: the session lease revoked, which deletes every leasing key attached to
    /// it in one go (so no writer waits for it to expire), and the background work stopped.
    pub async fn shutdown(&self) {
        if let Some(l) = &self.leasing {
            l.forget_all();
        }
        for t in &self.tasks {
            t.abort();
        }
        if let Some(s) = &self.session {
            s.close(&self.calls.up).await;
        }
    }
}

/// `--leasing-shared` refuses to start beside an etcd proxy's leasing key (etcd's writers do
/// not respect shared leases: see `leasing/keys.rs`).
async fn check_shared_prefix(
    calls: &Calls,
    prefix: &[u8],
    wait: Duration,
) -> Result<(), StartError> {
    let until = tokio::time::Instant::now() + wait;
    let mut key = prefix.to_vec();
    let end = namespace::prefix_end(prefix);
    loop {
        let r = RangeRequest {
            key: key.clone(),
            range_end: end.clone(),
            limit: 1000,
            ..Default::default()
        };
        let resp = match calls.range(&Creds::default(), r).await {
            Ok(r) => r,
            Err(s) if tokio::time::Instant::now() < until => {
                tracing::debug!("checking the leasing prefix: {}", s.message());
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Err(s) => return Err(StartError::SharedCheck(s.message().to_string())),
        };
        if let Some(kv) = resp
            .kvs
            .iter()
            .find(|kv| leasing::LeasingKeys::is_etcd_holder(&kv.value))
        {
            return Err(StartError::EtcdHolder(
                String::from_utf8_lossy(&kv.key).into_owned(),
            ));
        }
        match resp.kvs.last() {
            Some(last) if resp.more => {
                key = last.key.clone();
                key.push(0);
            }
            _ => return Ok(()),
        }
    }
}

#[tonic::async_trait]
impl Watch for watch::WatchProxy {
    type WatchStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<WatchResponse, Status>> + Send>>;

    async fn watch(
        &self,
        req: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let creds = Creds::from_metadata(req.metadata());
        Ok(Response::new(Box::pin(self.open(req.into_inner(), creds))))
    }
}
