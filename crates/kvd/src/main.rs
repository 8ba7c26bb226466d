//! `kvd`: one member of a kvd cluster — etcd's flags, the etcd v3 API on the client URLs, the
//! raft peer protocol on the peer URLs.

mod client_port;
mod config;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use config::{Cli, Cmd, RestoreFlags, ServeFlags, SnapshotCmd};
use consensus::grpc::{GrpcTransport, PeerService};
use consensus::{Member, RaftNode, Start};
use rpc::{Backend, Core, KvStateMachine, ServerConfig};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt;

/// How long shutdown waits for open client streams before closing them.
const DRAIN: Duration = Duration::from_secs(2);

/// mimalloc instead of the system allocator: less CPU per request (see Cargo.toml).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
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
        println!("etcd API Version: {}", rpc::server::ETCD_API_VERSION);
        return ExitCode::SUCCESS;
    }
    let r = match cli.cmd {
        Some(Cmd::Snapshot {
            cmd: SnapshotCmd::Restore(f),
        }) => restore(&f),
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

/// Everything the flags determine, checked.
struct Plan {
    name: String,
    member_dir: PathBuf,
    id: u64,
    cluster_id: u64,
    start: Start,
    client_listen: Vec<String>,
    peer_listen: Vec<String>,
    raft: consensus::Config,
    server: ServerConfig,
    store: mvcc::StoreOptions,
    http2: grpc_wire::Config,
}

/// The client port's HTTP/2 settings from etcd's gRPC flags.
fn http2_config(f: &ServeFlags) -> Result<grpc_wire::Config> {
    let duration =
        |flag: &str, v: &str| rpc::parse_duration(v).map_err(|e| format!("--{flag}: {e}"));
    let interval = duration("grpc-keepalive-interval", &f.grpc_keepalive_interval)?;
    let timeout = duration("grpc-keepalive-timeout", &f.grpc_keepalive_timeout)?;
    if timeout.is_zero() {
        return Err("--grpc-keepalive-timeout: must be more than 0".into());
    }
    Ok(grpc_wire::Config {
        ping_min_interval: duration("grpc-keepalive-min-time", &f.grpc_keepalive_min_time)?,
        keepalive_interval: (!interval.is_zero()).then_some(interval),
        keepalive_timeout: timeout,
        max_concurrent_streams: f.max_concurrent_streams,
        ..grpc_wire::Config::default()
    })
}

fn same_urls(a: &[String], b: &[String]) -> bool {
    let (mut a, mut b) = (a.to_vec(), b.to_vec());
    a.sort();
    b.sort();
    a == b
}

/// For a member joining a running cluster: asks the other members in `--initial-cluster` for
/// the cluster's member list and finds this member (added beforehand with `member add`) in it
/// by its peer URLs. Returns (cluster id, member id, the members).
fn find_self(initial: &[Member], peer_urls: &[String]) -> Result<(u64, u64, consensus::Members)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut errors = Vec::new();
    let others = initial
        .iter()
        .filter(|m| !same_urls(&m.peer_urls, peer_urls))
        .flat_map(|m| m.peer_urls.iter());
    for url in others {
        match rt.block_on(consensus::grpc::fetch_members(url)) {
            Ok((cluster_id, members)) => {
                return match members.iter().find(|m| same_urls(&m.peer_urls, peer_urls)) {
                    Some(me) => Ok((cluster_id, me.id, members.clone())),
                    None => Err(format!(
                        "no member of cluster {cluster_id:x} has peer URLs {}: add this member first (etcdctl member add)",
                        peer_urls.join(",")
                    )),
                };
            }
            Err(e) => errors.push(e),
        }
    }
    Err(format!(
        "--initial-cluster-state existing: cannot reach any other member to join ({})",
        errors.join("; ")
    ))
}

/// `--initial-cluster`, or by default this member alone at its advertised peer URLs.
fn initial_cluster(flag: &str, name: &str, peer_urls: &[String]) -> String {
    if !flag.is_empty() {
        return flag.to_string();
    }
    peer_urls
        .iter()
        .map(|u| format!("{name}={u}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn plan(f: &ServeFlags) -> Result<Plan> {
    let data_dir = if f.data_dir.is_empty() {
        PathBuf::from(format!("{}.kvd", f.name))
    } else {
        PathBuf::from(&f.data_dir)
    };
    let member_dir = data_dir.join("member");
    if f.heartbeat_interval == 0 || f.election_timeout < 5 * f.heartbeat_interval {
        return Err(format!(
            "--election-timeout[{}ms] should be at least as 5 times as --heartbeat-interval[{}ms]",
            f.election_timeout, f.heartbeat_interval
        ));
    }
    if f.max_request_bytes == 0 || f.max_txn_ops == 0 {
        return Err("--max-request-bytes and --max-txn-ops must be positive".into());
    }
    let peer_urls = config::urls(&f.initial_advertise_peer_urls);
    let client_urls = config::urls(&f.advertise_client_urls);
    let token = &f.initial_cluster_token;
    let initial = initial_cluster(&f.initial_cluster, &f.name, &peer_urls);
    let members = consensus::parse_initial_cluster(&initial, token)?;
    let existing = consensus::existing_member(&member_dir).map_err(|e| e.to_string())?;
    let (id, cluster_id, start) = match existing {
        Some((cluster_id, id)) => {
            tracing::info!(dir = %member_dir.display(), member = %format!("{id:x}"), cluster = %format!("{cluster_id:x}"), "restarting from the data directory");
            (id, cluster_id, Start::Join(Vec::new()))
        }
        None => match f.initial_cluster_state.as_str() {
            "new" => {
                let me = members.iter().find(|m| m.name == f.name).cloned().ok_or_else(|| {
                    format!(
                        "couldn't find local name {:?} in the initial cluster configuration ({initial})",
                        f.name
                    )
                })?;
                if !same_urls(&me.peer_urls, &peer_urls) {
                    return Err(format!(
                        "--initial-cluster has {}={} but missing from --initial-advertise-peer-urls={}",
                        f.name,
                        me.peer_urls.join(","),
                        peer_urls.join(",")
                    ));
                }
                let ids: Vec<u64> = members.iter().map(|m| m.id).collect();
                let cluster_id = consensus::cluster_id(&ids);
                // Every member bootstraps the same list; each publishes its name and client
                // URLs through raft once started, as etcd's do.
                let id = me.id;
                (id, cluster_id, Start::NewCluster(members))
            }
            "existing" => {
                let (cluster_id, id, running) = find_self(&members, &peer_urls)?;
                tracing::info!(member = %format!("{id:x}"), cluster = %format!("{cluster_id:x}"), "joining the running cluster");
                (
                    id,
                    cluster_id,
                    Start::Join(running.iter().cloned().collect()),
                )
            }
            other => {
                return Err(format!(
                    "--initial-cluster-state {other:?}: want new or existing"
                ))
            }
        },
    };
    let heartbeat = Duration::from_millis(f.heartbeat_interval);
    let election = Duration::from_millis(f.election_timeout);
    let mut raft = consensus::Config::new(id, cluster_id, &member_dir);
    raft.heartbeat = heartbeat;
    raft.election_ticks = (f.election_timeout / f.heartbeat_interval) as usize;
    raft.snapshot_count = f.snapshot_count.max(1);
    raft.max_snapshots = if f.max_snapshots == 0 {
        usize::MAX
    } else {
        f.max_snapshots
    };
    raft.max_wals = if f.max_wals == 0 {
        usize::MAX
    } else {
        f.max_wals
    };
    raft.request_timeout = Duration::from_secs(5) + 2 * election;
    let mut server = ServerConfig::new(&f.name);
    server.max_request_bytes = f.max_request_bytes;
    server.max_txn_ops = f.max_txn_ops;
    server.quota_backend_bytes = f.quota_backend_bytes;
    server.cluster_token = token.clone();
    server.client_urls = client_urls;
    server.election_timeout = election;
    server.watch_progress_notify_interval = rpc::parse_duration(&f.watch_progress_notify_interval)
        .map_err(|e| format!("--watch-progress-notify-interval: {e}"))?;
    server.auto_compaction =
        rpc::AutoCompaction::parse(&f.auto_compaction_mode, &f.auto_compaction_retention)?;
    let every = rpc::parse_duration(&f.lease_checkpoint_interval)
        .map_err(|e| format!("--lease-checkpoint-interval: {e}"))?;
    if every.is_zero() {
        return Err("--lease-checkpoint-interval: must be more than 0".into());
    }
    server.lease_checkpoint_interval = f.experimental_enable_lease_checkpoint.then_some(every);
    server.strict_reconfig_check = f.strict_reconfig_check;
    let freelist = match f.freelist_type.as_str() {
        "map" => pager::FreelistKind::Hashmap,
        other => other
            .parse()
            .map_err(|_| format!("--freelist-type {other:?}: want hashmap (map) or array"))?,
    };
    let store = mvcc::StoreOptions {
        freelist,
        // The WAL holds every applied entry: a flush need not fsync (consensus syncs the store
        // before it purges the log behind a snapshot).
        durable_flush: false,
        // etcd's minimum lease TTL: 1.5 election timeouts, rounded up to whole seconds.
        min_lease_ttl: (f.election_timeout * 3 / 2).div_ceil(1000) as i64,
        ..Default::default()
    };
    Ok(Plan {
        name: f.name.clone(),
        member_dir,
        id,
        cluster_id,
        start,
        client_listen: config::urls(&f.listen_client_urls),
        peer_listen: config::urls(&f.listen_peer_urls),
        raft,
        server,
        store,
        http2: http2_config(f)?,
    })
}

/// The socket addresses a list of `http://host:port` URLs names.
async fn bind_all(urls: &[String], what: &str) -> Result<Vec<TcpListener>> {
    let mut out = Vec::new();
    for u in urls {
        let Some(("http", hostport)) = u.split_once("://") else {
            return Err(format!(
                "{what} {u:?}: kvd listens on http://host:port URLs (TLS and unix sockets are not supported yet)"
            ));
        };
        let hostport = hostport.trim_end_matches('/');
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host(hostport)
            .await
            .map_err(|e| format!("{what} {u}: {e}"))?
            .collect();
        // localhost resolves to both families; etcd listens on the first.
        let addr = addrs
            .iter()
            .find(|a| a.is_ipv4())
            .or(addrs.first())
            .copied()
            .ok_or_else(|| format!("{what} {u}: resolves to no address"))?;
        let l = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("{what} {u}: cannot listen on {addr}: {e}"))?;
        out.push(l);
    }
    Ok(out)
}

fn serve(f: ServeFlags) -> Result<()> {
    init_logging(&f.log_level, &f.log_format)?;
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
    let sm = KvStateMachine::new(backend.clone());
    // Listeners first: a port in use fails before anything is written.
    let (peer_ls, client_ls) = rt.block_on(async {
        Ok::<_, String>((
            bind_all(&p.peer_listen, "--listen-peer-urls").await?,
            bind_all(&p.client_listen, "--listen-client-urls").await?,
        ))
    })?;
    let transport = GrpcTransport::new(p.cluster_id, p.id, rt.handle().clone());
    let node = RaftNode::start(p.raft, p.start, sm, transport).map_err(|e| e.to_string())?;
    let inbox = node.inbox();
    let core = Core::new(node, backend, p.server, p.cluster_id);
    tracing::info!(name = %p.name, member = %format!("{:x}", p.id), cluster = %format!("{:x}", p.cluster_id), "kvd started");

    let (stop_tx, stop_rx) = watch::channel(false);
    let mut servers = Vec::new();
    for l in peer_ls {
        let weak = Arc::downgrade(&core);
        let members: consensus::grpc::MembersFn =
            Arc::new(move || weak.upgrade().map(|c| c.node.members()).unwrap_or_default());
        let svc = PeerService::new(p.cluster_id, p.id, inbox.clone())
            .with_members(members)
            .into_server();
        let routes = tonic::service::Routes::new(svc);
        servers.push(spawn_peer_server(&rt, l, routes, stop_rx.clone()));
    }
    let port = rt.block_on(async { rpc::client_port(&core, p.http2) });
    for l in client_ls {
        let addr = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
        tracing::info!(%addr, "serving client traffic");
        servers.push(rt.spawn(client_port::serve(l, port.clone(), stop_rx.clone())));
    }
    rt.spawn(rpc::background(Arc::downgrade(&core)));

    let why = rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
        let mut check = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return Ok::<_, String>("SIGINT"),
                _ = term.recv() => return Ok("SIGTERM"),
                _ = check.tick() => {
                    // As etcd: a member removed from the cluster stops.
                    if core.node.status().removed {
                        return Ok("removal from the cluster");
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
    Ok(())
}

/// The runtime's worker threads: half the cores, at least one. The heavy work runs on threads
/// of its own (raft, apply, the store's flush and watch threads), and each worker more adds
/// cross-thread wake-ups: on 2 cores one worker took put1's CPU per request from 180-183 to
/// 157-173 us, with put100, range-l and range-s unchanged within noise (README, "Measured").
fn runtime_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

/// Serves the peer service `routes` on `l` until `stop` turns true.
fn spawn_peer_server(
    rt: &tokio::runtime::Runtime,
    l: TcpListener,
    routes: tonic::service::Routes,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let addr = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
    tracing::info!(%addr, "serving peer traffic");
    // Small frames (heartbeats, appends) must not wait for Nagle's algorithm.
    let incoming = TcpListenerStream::new(l).map(|s| {
        s.inspect(|s| {
            if let Err(e) = s.set_nodelay(true) {
                tracing::debug!("TCP_NODELAY: {e}");
            }
        })
    });
    rt.spawn(async move {
        let r = tonic::transport::Server::builder()
            .add_routes(routes)
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await;
        if let Err(e) = r {
            tracing::error!("peer server stopped: {e}");
        }
    })
}

fn restore(f: &RestoreFlags) -> Result<()> {
    init_logging("info", "text")?;
    let data_dir = if f.data_dir.is_empty() {
        PathBuf::from(format!("{}.kvd", f.name))
    } else {
        PathBuf::from(&f.data_dir)
    };
    if data_dir.exists() {
        return Err(format!(
            "data-dir {:?} exists; restore into a new directory",
            data_dir.display()
        ));
    }
    // As etcdutl's: the member must be in the cluster it will bootstrap. The raft log starts
    // afresh when the member first starts (with these same flags); the restored store's
    // applied index is reset to match.
    let peer_urls = config::urls(&f.initial_advertise_peer_urls);
    let initial = initial_cluster(&f.initial_cluster, &f.name, &peer_urls);
    let members = consensus::parse_initial_cluster(&initial, &f.initial_cluster_token)?;
    if !members
        .iter()
        .any(|m| m.name == f.name && same_urls(&m.peer_urls, &peer_urls))
    {
        return Err(format!(
            "--initial-cluster {initial} has no member {:?} at --initial-advertise-peer-urls {}",
            f.name, f.initial_advertise_peer_urls
        ));
    }
    rpc::check_snapshot_file(&f.file).map_err(|e| format!("restore: {e}"))?;
    let mut file = std::fs::File::open(&f.file)
        .map_err(|e| format!("snapshot file {}: {e}", f.file.display()))?;
    let snap_dir = data_dir.join("member").join("snap");
    std::fs::create_dir_all(&snap_dir).map_err(|e| format!("{}: {e}", snap_dir.display()))?;
    let r = restore_into(&mut file, &snap_dir.join("db"));
    if let Err(e) = r {
        let _ = std::fs::remove_dir_all(&data_dir);
        return Err(e);
    }
    println!(
        "restored snapshot {} into {}",
        f.file.display(),
        data_dir.display()
    );
    Ok(())
}

fn restore_into(file: &mut std::fs::File, db: &Path) -> Result<()> {
    let opts = mvcc::StoreOptions::default();
    rpc::restore_file(file, db, &opts).map_err(|e| format!("restore: {e}"))?;
    let store = mvcc::Store::open(db, opts).map_err(|e| format!("restore: {e}"))?;
    {
        let mut w = store.write().map_err(|e| e.to_string())?;
        w.set_applied(mvcc::Applied::default());
    }
    store.close().map_err(|e| e.to_string())
}
