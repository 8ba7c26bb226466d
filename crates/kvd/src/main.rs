//! `kvd`: one member of a kvd cluster — etcd's flags, the etcd v3 API on the client URLs, the
//! raft peer protocol on the peer URLs.

mod client_port;
mod config;
#[cfg(feature = "failpoints")]
mod failpoints;
mod gates;
mod listen;
mod migrate;
mod peer_port;
mod plan;
mod proxy;
mod tls;
mod tools;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use client_port::{Port, Traffic};
use config::{Cli, Cmd, ProxyCmd, ServeFlags, SnapshotCmd};
use consensus::grpc::{GrpcTransport, PeerService};
use consensus::RaftNode;
use plan::plan;
use rpc::{Backend, Core, KvStateMachine};
use tokio::sync::watch;

/// How long shutdown waits for open client streams before closing them.
const DRAIN: Duration = Duration::from_secs(2);

/// jemalloc instead of the system allocator: less CPU per request, and memory given back to
/// the OS after a burst (see Cargo.toml).
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    // Test builds only: failpoints armed from FAILPOINTS (e.g. `wal_fsync=20*off->return`),
    // and a failpoint's panic (on whichever thread) kills the process at that point, as a
    // crash would.
    #[cfg(feature = "failpoints")]
    let _failpoints = {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            hook(info);
            std::process::abort();
        }));
        fail::FailScenario::setup()
    };
    let args = match config::normalize_args(std::env::args()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(args);
    if cli.version {
        println!("kvd Version: {}", env!("CARGO_PKG_VERSION"));
        println!("etcd API Version: {}", rpc::version::SERVER_VERSION);
        return ExitCode::SUCCESS;
    }
    let r = match cli.cmd {
        Some(Cmd::Snapshot { cmd }) => offline(|| match cmd {
            SnapshotCmd::Restore(f) => tools::restore(&f),
            SnapshotCmd::Status { file, write_out } => tools::status(&file, write_out),
        }),
        Some(Cmd::Defrag { data_dir }) => offline(|| tools::defrag(&data_dir)),
        Some(Cmd::Migrate { data_dir }) => offline(|| migrate::migrate(&data_dir)),
        Some(Cmd::Hashkv(f)) => offline(|| tools::hashkv(&f)),
        Some(Cmd::GrpcProxy {
            cmd: ProxyCmd::Start(f),
        }) => proxy::run(&f),
        None => serve(cli.serve),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("kvd: {e}");
            ExitCode::FAILURE
        }
    }
}

type Result<T, E = String> = std::result::Result<T, E>;

/// Runs an offline tool, logging as text.
fn offline(tool: impl FnOnce() -> Result<(), tools::ToolError>) -> Result<()> {
    init_logging("info", "text")?;
    tool().map_err(|e| e.to_string())
}

fn init_logging(level: &str, format: &str) -> Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .map_err(|e| format!("--log-level {level:?}: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        "json" => builder.json().init(),
        "text" | "console" => builder.with_ansi(false).init(),
        other => return Err(format!("--log-format {other:?}: want json or text")),
    }
    Ok(())
}
fn serve(f: ServeFlags) -> Result<()> {
    init_logging(&f.log_level, &f.log_format)?;
    #[cfg(feature = "failpoints")]
    failpoints::serve_from_env()?;
    let p = plan(&f)?;
    std::fs::create_dir_all(p.member_dir.join("snap"))
        .map_err(|e| format!("{}: {e}", p.member_dir.display()))?;
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    // TOKIO_WORKER_THREADS, when set, is tokio's own override.
    if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        rt.worker_threads(runtime_workers());
    }
    let rt = rt
        .enable_all()
        .thread_name("kvd")
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let db = p.member_dir.join("snap").join("db");
    let backend = Arc::new(Backend::open(&db, p.store.clone()).map_err(|e| e.to_string())?);
    let sm = KvStateMachine::new(backend.clone(), p.auth.clone());
    // Listeners first: a port in use fails before anything is written.
    let (peer_ls, client_ls, http_ls, metrics_ls) = rt.block_on(async {
        Ok::<_, String>((
            listen::bind(&p.peer_listen, "--listen-peer-urls").await?,
            listen::bind(&p.client_listen, "--listen-client-urls").await?,
            listen::bind(&p.client_http_listen, "--listen-client-http-urls").await?,
            listen::bind(&p.metrics_listen, "--listen-metrics-urls").await?,
        ))
    })?;
    let sec = p.security;
    let transport = GrpcTransport::new(p.id, p.cluster_id, sec.dialer.clone(), rt.handle().clone());
    let node = RaftNode::start(p.raft, p.start, sm, transport).map_err(|e| e.to_string())?;
    let inbox = node.inbox();
    let core = Core::new(
        node,
        backend,
        p.server,
        p.cluster_id,
        p.auth,
        sec.dialer.clone(),
    );
    tracing::info!(name = %p.name, member = %p.id, cluster = %p.cluster_id, "kvd started");
    // As etcd's: before this member serves its peers or clients (so nothing reaches it and the
    // leader's own check cannot ask it), its data against every peer's.
    if p.initial_corrupt_check {
        if let Err(e) = rt.block_on(rpc::corrupt::initial_check(&core)) {
            rt.shutdown_timeout(DRAIN);
            drop(core);
            return Err(e);
        }
    }

    let (stop_tx, stop_rx) = watch::channel(false);
    let mut servers = Vec::new();
    let peer_tls = sec.peer.map(|config| peer_port::PeerTls {
        config,
        check_san: sec.peer_check_san,
    });
    for b in peer_ls {
        let weak = Arc::downgrade(&core);
        let members: consensus::grpc::MembersFn =
            Arc::new(move || weak.upgrade().map(|c| c.node.members()).unwrap_or_default());
        let raft = PeerService::new(p.id, p.cluster_id, inbox.clone()).with_members(members);
        let routes = rpc::peer_services(&core).add_service(raft.clone().into_server());
        servers.push(peer_port::spawn(
            &rt,
            b,
            routes,
            raft,
            peer_tls.clone(),
            stop_rx.clone(),
        ));
    }
    let port = rt.block_on(async {
        Port::member(rpc::client_port(&core, p.http2), rpc::metrics_router(&core))
    });
    let acceptor = sec.client.map(listen::acceptor);
    // As etcd: with HTTP URLs of their own, the client URLs serve gRPC only.
    let client_traffic = if http_ls.is_empty() {
        Traffic::Both
    } else {
        Traffic::Grpc
    };
    // Metrics and health at once; clients once this member's attributes are published (as
    // etcd: until then the member list would show it without its client URLs). A client
    // connecting meanwhile waits in the listener's backlog.
    servers.extend(client_port::serve_all(
        rt.handle(),
        vec![(metrics_ls, Traffic::Metrics)],
        &port,
        acceptor.clone(),
        &stop_rx,
    ));
    rt.spawn(rpc::background(Arc::downgrade(&core)));
    let listeners = vec![(client_ls, client_traffic), (http_ls, Traffic::Http)];
    servers.push(rt.spawn({
        let core = Arc::downgrade(&core);
        let mut stop = stop_rx.clone();
        async move {
            let ready = async {
                let Some(c) = core.upgrade() else {
                    return false;
                };
                rpc::published(&c).await;
                true
            };
            let ready = tokio::select! {
                r = ready => r,
                _ = stop.wait_for(|s| *s) => false,
            };
            if !ready {
                return;
            }
            tracing::info!("serving client requests");
            let handle = tokio::runtime::Handle::current();
            for s in client_port::serve_all(&handle, listeners, &port, acceptor, &stop) {
                let _ = s.await;
            }
        }
    }));

    // Why the member stops: a signal, its removal, or a failure of its disk (None: asked to).
    let (why, failed) = rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
        let mut check = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return Ok::<_, String>(("SIGINT", None)),
                _ = term.recv() => return Ok(("SIGTERM", None)),
                _ = check.tick() => {
                    let st = core.node.status();
                    // As etcd: a member removed from the cluster stops.
                    if st.removed {
                        return Ok(("removal from the cluster", None));
                    }
                    // As etcd's fatal errors: a WAL write or fsync, or a write of the data
                    // file, that failed (a full or failing disk) stops the member — never
                    // retried as if it had succeeded. What was acknowledged is in the WAL.
                    let store = core.backend.store().failure();
                    if let Some(e) = st.failed.or(store) {
                        return Ok(("a storage failure", Some(e)));
                    }
                }
            }
        }
    })?;
    tracing::info!("received {why}: shutting down");
    let _ = stop_tx.send(true);
    rt.block_on(async {
        let _ = tokio::time::timeout(DRAIN, async {
            for s in servers {
                let _ = s.await;
            }
        })
        .await;
    });
    rt.shutdown_timeout(DRAIN);
    // The last reference: stops the raft member, then closes the store (flushed and synced).
    drop(core);
    tracing::info!("stopped");
    match failed {
        Some(e) => Err(format!("stopped after a storage failure: {e}")),
        None => Ok(()),
    }
}

/// The runtime's worker threads: half the cores, at least one. The heavy work runs on threads
/// of its own (raft, apply, the store's flush and watch threads), and each worker more adds
/// cross-thread wake-ups: on 2 cores one worker took put1's CPU per request from 180-183 to
/// 157-173 us, with put100, range-l and range-s unchanged within noise (docs/measurements.md).
fn runtime_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}
