//! What the flags determine, checked before anything starts: the member's identity and
//! cluster, the listeners, TLS on both ports, and the settings of raft, the store and the
//! server.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use consensus::{Member, Start};
use ids::{ClusterId, MemberId};
use rpc::ServerConfig;

use crate::config::{self, ServeFlags};
use crate::{gates, listen, tls};

type Result<T, E = String> = std::result::Result<T, E>;

/// Everything the flags determine, checked.
pub struct Plan {
    pub name: String,
    pub member_dir: PathBuf,
    pub id: MemberId,
    pub cluster_id: ClusterId,
    pub start: Start,
    /// Compare this member's data with its peers' before serving clients: the
    /// InitialCorruptCheck gate, on a restart (a new member has nothing to compare).
    pub initial_corrupt_check: bool,
    /// `(host:port, https)` of `--listen-client-urls`, `--listen-client-http-urls`,
    /// `--listen-metrics-urls` and `--listen-peer-urls`.
    pub client_listen: Vec<listen::ListenUrl>,
    pub client_http_listen: Vec<listen::ListenUrl>,
    pub metrics_listen: Vec<listen::ListenUrl>,
    pub peer_listen: Vec<listen::ListenUrl>,
    pub raft: consensus::Config,
    pub server: ServerConfig,
    pub store: mvcc::StoreOptions,
    pub http2: grpc_wire::Config,
    pub security: Security,
    /// Tokens, password hashing and `--client-cert-auth`.
    pub auth: Arc<rpc::auth::Auth>,
}

/// TLS on both ports, from etcd's security flags.
pub struct Security {
    /// The client, client HTTP and metrics listeners' TLS (when one of their URLs is https).
    pub client: Option<Arc<rustls::ServerConfig>>,
    /// The peer listeners' TLS (when one of their URLs is https).
    pub peer: Option<Arc<rustls::ServerConfig>>,
    /// How this member dials its peers (TLS for https:// peer URLs).
    pub dialer: consensus::Dialer,
    /// etcd's check that a peer's client certificate names the address it connects from.
    pub peer_check_san: bool,
}

fn path(flag: &str) -> Option<PathBuf> {
    (!flag.is_empty()).then(|| PathBuf::from(flag))
}

/// `--auto-tls`'s hosts: those of the listen URLs (a unix socket has none).
fn hosts(urls: &[listen::ListenUrl]) -> Vec<String> {
    urls.iter()
        .filter_map(|u| match &u.addr {
            listen::Addr::Tcp(h) => Some(h.clone()),
            listen::Addr::Unix(_) => None,
        })
        .collect()
}

fn security(
    f: &ServeFlags,
    data_dir: &Path,
    listen: [&[listen::ListenUrl]; 4],
) -> Result<Security> {
    let [client_urls, http_urls, metrics_urls, peer_urls] = listen;
    let policy = tls::Policy::parse(&f.tls_min_version, &f.tls_max_version, &f.cipher_suites)?;
    let mut client = tls::Side {
        cert_file: path(&f.cert_file),
        key_file: path(&f.key_file),
        client_cert_file: path(&f.client_cert_file),
        client_key_file: path(&f.client_key_file),
        trusted_ca_file: path(&f.trusted_ca_file),
        client_cert_auth: f.client_cert_auth,
        crl_file: path(&f.client_crl_file),
        allowed_cns: Vec::new(),
        allowed_hostnames: config::urls(&f.client_cert_allowed_hostname),
        self_signed: false,
    };
    let mut peer = tls::Side {
        cert_file: path(&f.peer_cert_file),
        key_file: path(&f.peer_key_file),
        client_cert_file: path(&f.peer_client_cert_file),
        client_key_file: path(&f.peer_client_key_file),
        trusted_ca_file: path(&f.peer_trusted_ca_file),
        client_cert_auth: f.peer_client_cert_auth,
        crl_file: path(&f.peer_crl_file),
        allowed_cns: config::urls(&f.peer_cert_allowed_cn),
        allowed_hostnames: config::urls(&f.peer_cert_allowed_hostname),
        self_signed: false,
    };
    let all_client: Vec<listen::ListenUrl> = [client_urls, http_urls].concat();
    if f.auto_tls && !client.has_pair() {
        let (c, k) = tls::self_signed(
            &data_dir.join("fixtures").join("client"),
            &hosts(&all_client),
            f.self_signed_cert_validity,
        )?;
        (client.cert_file, client.key_file, client.self_signed) = (Some(c), Some(k), true);
    }
    if f.peer_auto_tls && !peer.has_pair() {
        let (c, k) = tls::self_signed(
            &data_dir.join("fixtures").join("peer"),
            &hosts(peer_urls),
            f.self_signed_cert_validity,
        )?;
        (peer.cert_file, peer.key_file, peer.self_signed) = (Some(c), Some(k), true);
    }
    client.check("client TLS")?;
    peer.check("peer TLS")?;
    let https = |urls: &[listen::ListenUrl]| {
        urls.iter().find(|u| u.tls).map(|u| match &u.addr {
            listen::Addr::Tcp(h) => format!("https://{h}"),
            listen::Addr::Unix(p) => format!("unixs://{}", p.display()),
        })
    };
    let client_tls = match https(&[&all_client[..], metrics_urls].concat()) {
        None => None,
        Some(h) if !client.has_pair() => {
            return Err(format!(
                "TLS key/cert (--cert-file, --key-file) must be provided for client url {h} with HTTPS scheme"
            ))
        }
        Some(_) => Some(tls::server_config(&client, &policy, tls::ALPN_H2_HTTP1)?),
    };
    let peer_tls = match https(peer_urls) {
        None => None,
        Some(h) if !peer.has_pair() => {
            return Err(format!(
                "TLS key/cert (--peer-cert-file, --peer-key-file) must be provided for peer url {h} with HTTPS scheme"
            ))
        }
        Some(_) => Some(tls::server_config(&peer, &policy, tls::ALPN_H2)?),
    };
    let dialer = consensus::Dialer::with_tls(tls::client_config(&peer, &policy, tls::ALPN_H2)?);
    Ok(Security {
        client: client_tls,
        peer: peer_tls,
        dialer,
        peer_check_san: !f.peer_skip_client_san_verification,
    })
}

/// The client port's HTTP/2 settings from etcd's gRPC flags.
fn http2_config(f: &ServeFlags) -> Result<grpc_wire::Config> {
    http2_settings(
        &f.grpc_keepalive_min_time,
        &f.grpc_keepalive_interval,
        &f.grpc_keepalive_timeout,
        f.max_concurrent_streams,
        (f.max_connection_buffer_bytes, f.max_client_buffer_bytes),
    )
}

/// HTTP/2 settings from etcd's `--grpc-keepalive-min-time`, `--grpc-keepalive-interval`,
/// `--grpc-keepalive-timeout` and `--max-concurrent-streams`, and kvd's
/// `--max-connection-buffer-bytes` and `--max-client-buffer-bytes` (a member's and a proxy's).
pub fn http2_settings(
    min_time: &str,
    interval: &str,
    timeout: &str,
    max_streams: u32,
    (max_conn_buffer, max_total_buffer): (usize, usize),
) -> Result<grpc_wire::Config> {
    let duration =
        |flag: &str, v: &str| rpc::parse_duration(v).map_err(|e| format!("--{flag}: {e}"));
    let interval = duration("grpc-keepalive-interval", interval)?;
    let timeout = duration("grpc-keepalive-timeout", timeout)?;
    if timeout.is_zero() {
        return Err("--grpc-keepalive-timeout: must be more than 0".into());
    }
    Ok(grpc_wire::Config {
        ping_min_interval: duration("grpc-keepalive-min-time", min_time)?,
        keepalive_interval: (!interval.is_zero()).then_some(interval),
        keepalive_timeout: timeout,
        max_concurrent_streams: max_streams,
        max_conn_buffer,
        max_total_buffer,
        ..grpc_wire::Config::default()
    })
}

pub fn same_urls(a: &[String], b: &[String]) -> bool {
    let (mut a, mut b) = (a.to_vec(), b.to_vec());
    a.sort();
    b.sort();
    a == b
}

/// For a member joining a running cluster: asks the other members in `--initial-cluster` for
/// the cluster's member list and finds this member (added beforehand with `member add`) in it
/// by its peer URLs. Returns this member's id, the cluster's and the members.
fn find_self(
    dialer: &consensus::Dialer,
    initial: &[Member],
    peer_urls: &[String],
) -> Result<(MemberId, ClusterId, consensus::Members)> {
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
        match rt.block_on(consensus::grpc::fetch_members(dialer, url)) {
            Ok((cluster_id, members)) => {
                return match members.iter().find(|m| same_urls(&m.peer_urls, peer_urls)) {
                    Some(me) => Ok((me.id, cluster_id, members.clone())),
                    None => Err(format!(
                        "no member of cluster {cluster_id} has peer URLs {}: add this member first (etcdctl member add)",
                        peer_urls.join(",")
                    )),
                };
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    Err(format!(
        "--initial-cluster-state existing: cannot reach any other member to join ({})",
        errors.join("; ")
    ))
}

/// `--initial-cluster`, or by default this member alone at its advertised peer URLs.
pub fn initial_cluster(flag: &str, name: &str, peer_urls: &[String]) -> String {
    if !flag.is_empty() {
        return flag.to_string();
    }
    peer_urls
        .iter()
        .map(|u| format!("{name}={u}"))
        .collect::<Vec<_>>()
        .join(",")
}

pub fn plan(f: &ServeFlags) -> Result<Plan> {
    let data_dir = if f.data_dir.is_empty() {
        PathBuf::from(format!("{}.kvd", f.name))
    } else {
        PathBuf::from(&f.data_dir)
    };
    let member_dir = data_dir.join("member");
    if crate::migrate::is_etcd_member(&member_dir) {
        return Err(format!(
            "{} holds an etcd member's data (member/snap/db is etcd's bbolt file): stop etcd, then run `kvd migrate --data-dir {}` to make it kvd's (etcd's files are kept)",
            data_dir.display(),
            data_dir.display()
        ));
    }
    let client_listen =
        listen::parse(&config::urls(&f.listen_client_urls), "--listen-client-urls")?;
    let client_http_listen = listen::parse(
        &config::urls(&f.listen_client_http_urls),
        "--listen-client-http-urls",
    )?;
    if let Some(u) = client_http_listen
        .iter()
        .find(|u| client_listen.iter().any(|c| c.addr == u.addr))
    {
        return Err(format!(
            "cannot bind both --listen-client-urls and --listen-client-http-urls on the same url {}",
            u.addr
        ));
    }
    let metrics_listen = listen::parse(
        &config::urls(&f.listen_metrics_urls),
        "--listen-metrics-urls",
    )?;
    let peer_listen = listen::parse_tcp(&config::urls(&f.listen_peer_urls), "--listen-peer-urls")?;
    let security = security(
        f,
        &data_dir,
        [
            &client_listen,
            &client_http_listen,
            &metrics_listen,
            &peer_listen,
        ],
    )?;
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
    let members = consensus::parse_initial_cluster(&initial, token).map_err(|e| e.to_string())?;
    let existing = consensus::existing_member(&member_dir).map_err(|e| e.to_string())?;
    let restart = existing.is_some();
    let (id, cluster_id, start) = match existing {
        Some((id, cluster_id)) => {
            tracing::info!(dir = %member_dir.display(), member = %id, cluster = %cluster_id, "restarting from the data directory");
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
                let ids: Vec<MemberId> = members.iter().map(|m| m.id).collect();
                let cluster_id = consensus::cluster_id(&ids);
                // Every member bootstraps the same list; each publishes its name and client
                // URLs through raft once started, as etcd's do.
                let id = me.id;
                (id, cluster_id, Start::NewCluster(members))
            }
            "existing" => {
                let (id, cluster_id, running) = find_self(&security.dialer, &members, &peer_urls)?;
                tracing::info!(member = %id, cluster = %cluster_id, "joining the running cluster");
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
        rpc::AutoCompaction::parse(&f.auto_compaction_mode, &f.auto_compaction_retention)
            .map_err(|e| e.to_string())?;
    let every = rpc::parse_duration(&f.lease_checkpoint_interval)
        .map_err(|e| format!("--lease-checkpoint-interval: {e}"))?;
    if every.is_zero() {
        return Err("--lease-checkpoint-interval: must be more than 0".into());
    }
    let gates = gates::parse(&f.feature_gates)?;
    server.lease_checkpoint_interval = gates.lease_checkpoint.then_some(every);
    server.priority_request = gates.priority_request;
    server.fast_lease_keep_alive = gates.fast_lease_keep_alive;
    server.metrics_extensive = f.metrics == "extensive";
    server.corrupt_check_time = rpc::parse_duration(&f.corrupt_check_time)
        .map_err(|e| format!("--corrupt-check-time: {e}"))?;
    server.strict_reconfig_check = f.strict_reconfig_check;
    let freelist = match f.freelist_type.as_str() {
        "map" => pager::FreelistKind::Hashmap,
        other => other
            .parse()
            .map_err(|_| format!("--freelist-type {other:?}: want hashmap (map) or array"))?,
    };
    let defaults = mvcc::StoreOptions::default();
    let batch_interval = match f.backend_batch_interval.as_str() {
        "" => defaults.batch_interval,
        v => rpc::parse_duration(v).map_err(|e| format!("--backend-batch-interval: {e}"))?,
    };
    let store = mvcc::StoreOptions {
        freelist,
        batch_interval,
        batch_limit: match f.backend_batch_limit {
            0 => defaults.batch_limit,
            n => n,
        },
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
        initial_corrupt_check: gates.initial_corrupt_check && restart,
        client_listen,
        client_http_listen,
        metrics_listen,
        peer_listen,
        security,
        auth: Arc::new(rpc::auth::Auth::new(
            rpc::auth::Tokens::parse(&f.auth_token, Duration::from_secs(f.auth_token_ttl))
                .map_err(|e| e.to_string())?,
            f.bcrypt_cost,
            f.client_cert_auth,
        )),
        raft,
        server,
        store,
        http2: http2_config(f)?,
    })
}
