//! The command line: etcd's flags, names and defaults (and their `ETCD_*` environment
//! variables), kvd's own additions, and clear refusals of etcd flags kvd does not support.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// kvd: a distributed, consistent key-value store that speaks etcd's v3 API.
#[derive(Debug, Parser)]
#[command(
    name = "kvd",
    disable_version_flag = true,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Option<Cmd>,
    #[command(flatten)]
    pub serve: ServeFlags,
    /// Print the version and exit.
    #[arg(long)]
    pub version: bool,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Snapshot tools.
    Snapshot {
        #[command(subcommand)]
        cmd: SnapshotCmd,
    },
    /// The gRPC proxy (etcd's `grpc-proxy`).
    GrpcProxy {
        #[command(subcommand)]
        cmd: ProxyCmd,
    },
    /// Makes a stopped etcd member's data directory kvd's, in place: the same member and
    /// cluster, every revision, lease and user, and etcd's log carried over; etcd's files kept
    /// in member.etcd/.
    Migrate {
        /// The etcd member's data directory.
        #[arg(long)]
        data_dir: PathBuf,
    },
    /// Defragments a stopped member's data file, etcd's or kvd's (etcdutl's `defrag`).
    Defrag {
        /// The data directory (its `member/snap/db`).
        #[arg(long)]
        data_dir: PathBuf,
    },
    /// The KV history hash of a stopped member's data file, etcd's or kvd's, as `etcdctl
    /// endpoint hashkv` gives it for a running one (etcdutl's `hashkv`).
    Hashkv(HashkvFlags),
}

/// etcdutl's output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WriteOut {
    Simple,
    Table,
    Json,
    Fields,
}

#[derive(Debug, Args)]
pub struct HashkvFlags {
    /// The data file (`member/snap/db`, or a snapshot); or give --data-dir.
    pub file: Option<PathBuf>,
    /// The data directory whose `member/snap/db` to hash.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// The revision to hash up to (0: the newest).
    #[arg(long, default_value_t = 0)]
    pub rev: i64,
    #[arg(long, short = 'w', value_enum, default_value = "simple")]
    pub write_out: WriteOut,
}

#[derive(Debug, Subcommand)]
pub enum ProxyCmd {
    /// Starts a proxy in front of a cluster: etcd's v3 API on --listen-addr, everything
    /// forwarded to --endpoints; with --experimental-leasing-prefix, linearizable reads of
    /// keys it holds a lease on are answered from its memory.
    Start(Box<ProxyFlags>),
}

/// `kvd grpc-proxy start`'s flags: etcd's grpc-proxy flags, and kvd's `--leasing-*`.
#[derive(Debug, Args)]
pub struct ProxyFlags {
    /// Comma-separated etcd cluster endpoints.
    #[arg(long, default_value = "127.0.0.1:2379")]
    pub endpoints: String,
    /// Listen address.
    #[arg(long, default_value = "127.0.0.1:23790")]
    pub listen_addr: String,
    /// The address MemberList answers with (empty: the cluster's member list).
    #[arg(long, default_value = "127.0.0.1:23790")]
    pub advertise_client_url: String,
    /// Leasing metadata prefix for disconnected linearized reads (empty: no leasing).
    #[arg(long, default_value = "")]
    pub experimental_leasing_prefix: String,
    /// A prefix to all keys, for namespacing requests.
    #[arg(long, default_value = "")]
    pub namespace: String,
    /// Listen for /metrics (and /health) on this URL too.
    #[arg(long, default_value = "")]
    pub metrics_addr: String,
    /// Message send limit to the cluster, in bytes.
    #[arg(long, default_value_t = 1_572_864)]
    pub max_send_bytes: usize,
    /// Message receive limit from the cluster, in bytes.
    #[arg(long, default_value_t = i32::MAX as usize)]
    pub max_recv_bytes: usize,
    /// kvd's: how long a connection to an endpoint may take.
    #[arg(long, default_value = "5s")]
    pub dial_timeout: String,
    /// Keepalive time of the connections to the cluster (0: off).
    #[arg(long, default_value = "0s")]
    pub dial_keepalive_time: String,
    /// Keepalive timeout of the connections to the cluster.
    #[arg(long, default_value = "20s")]
    pub dial_keepalive_timeout: String,
    /// Keepalive pings to the cluster even with no call under way.
    #[arg(long, default_value = "false", num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub permit_without_stream: bool,
    /// kvd's: log level (debug, info, warn, error).
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// kvd's: log format, `json` or `text`.
    #[arg(long, default_value = "json")]
    pub log_format: String,
    /// Debug-level logging (etcd's).
    #[arg(long, default_value = "false", num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub debug: bool,
    /// The certificate the proxy presents to the cluster's TLS endpoints.
    #[arg(long, default_value = "")]
    pub cert: String,
    /// The key of --cert.
    #[arg(long, default_value = "")]
    pub key: String,
    /// The CA bundle that signs the cluster's certificates.
    #[arg(long, default_value = "")]
    pub cacert: String,
    /// Skips checking the cluster's certificates (testing only).
    #[arg(long, default_value = "false", num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub insecure_skip_tls_verify: bool,
    /// The certificate clients of the proxy are served.
    #[arg(long, default_value = "")]
    pub cert_file: String,
    /// The key of --cert-file.
    #[arg(long, default_value = "")]
    pub key_file: String,
    /// The CA of the proxy's clients' certificates (given, clients must present one).
    #[arg(long, default_value = "")]
    pub trusted_ca_file: String,
    /// Revoked client certificates.
    #[arg(long, default_value = "")]
    pub client_crl_file: String,
    /// TLS to clients with a generated certificate.
    #[arg(long, default_value = "false", num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub auto_tls: bool,
    /// The validity of --auto-tls's certificate, in years.
    #[arg(long, default_value_t = 1)]
    pub self_signed_cert_validity: u32,
    /// TLS 1.2 cipher suites between clients and the proxy (Go's names).
    #[arg(long, default_value = "")]
    pub listen_cipher_suites: String,
    /// Minimum TLS version: TLS1.2 or TLS1.3.
    #[arg(long, default_value = "TLS1.2")]
    pub tls_min_version: String,
    /// Maximum TLS version (empty: the newest).
    #[arg(long, default_value = "")]
    pub tls_max_version: String,
    /// Where --auto-tls keeps its certificate.
    #[arg(long, default_value = "default.proxy")]
    pub data_dir: String,
    /// How often a client may ping while it has streams open.
    #[arg(long, default_value = "5s")]
    pub grpc_keepalive_min_time: String,
    /// How long a client may be quiet before the proxy pings it (0 disables).
    #[arg(long, default_value = "2h")]
    pub grpc_keepalive_interval: String,
    /// How long the proxy waits for a ping's answer.
    #[arg(long, default_value = "20s")]
    pub grpc_keepalive_timeout: String,
    /// Streams a client may have open on one connection.
    #[arg(long, default_value_t = u32::MAX)]
    pub max_concurrent_streams: u32,
    /// kvd's: bytes one client connection may hold, for unsent responses and again for
    /// request state; past it the connection's requests wait (or new streams are refused).
    #[arg(long, default_value_t = 16 << 20)]
    pub max_connection_buffer_bytes: usize,
    /// kvd's: bytes all client connections may hold together; past it the connections
    /// holding more than 1 MiB are held back, so that the others are served.
    #[arg(long, default_value_t = 512 << 20)]
    pub max_client_buffer_bytes: usize,
    /// kvd's: the TTL of the session lease the proxy holds keys under (etcd's proxy: 60s).
    #[arg(long, default_value = "60s")]
    pub leasing_ttl: String,
    /// kvd's: the share of the TTL the proxy keeps back for clock-rate drift: it serves
    /// nothing from its cache past `send + TTL * (1 - drift)` of its last keep-alive.
    #[arg(long, default_value_t = 0.01)]
    pub leasing_clock_drift: f64,
    /// kvd's: shared read leases (several proxies hold a read-mostly key at once); every
    /// proxy on the prefix must be kvd's.
    #[arg(long, default_value = "false", num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub leasing_shared: bool,
    /// kvd's: keys the cache holds at most (the coldest go first).
    #[arg(long, default_value_t = 100_000)]
    pub leasing_cache_keys: usize,
    /// kvd's: bytes the cached values take at most.
    #[arg(long, default_value_t = 256 << 20)]
    pub leasing_cache_bytes: usize,
    /// kvd's: how long a key given up on another's request is not taken again (it doubles
    /// for a key revoked again soon after).
    #[arg(long, default_value = "2s")]
    pub leasing_revoke_backoff: String,
}

#[derive(Debug, Subcommand)]
pub enum SnapshotCmd {
    /// Builds a new member's data directory from a snapshot file — etcd's (`etcdctl snapshot
    /// save` against etcd or kvd, or a member's `member/snap/db` with --skip-hash-check) or
    /// kvd's earlier format: the keys, their history and leases, users and roles, in a new
    /// cluster of the members given (etcdutl's `snapshot restore`).
    Restore(Box<RestoreFlags>),
    /// Prints a snapshot file's hash, revision, keys, size and storage version (etcdutl's
    /// `snapshot status`).
    Status {
        file: PathBuf,
        #[arg(long, short = 'w', value_enum, default_value = "simple")]
        write_out: WriteOut,
    },
}

#[derive(Debug, Args)]
pub struct RestoreFlags {
    /// The snapshot file.
    pub file: PathBuf,
    /// The data directory to create (must not exist).
    #[arg(long, default_value = "")]
    pub data_dir: String,
    #[arg(long, default_value = "default")]
    pub name: String,
    #[arg(long, default_value = "")]
    pub initial_cluster: String,
    #[arg(long, default_value = "etcd-cluster")]
    pub initial_cluster_token: String,
    #[arg(long, default_value = "http://localhost:2380")]
    pub initial_advertise_peer_urls: String,
    /// Do not check the SHA-256 the file ends with (a member's db file has none).
    #[arg(long)]
    pub skip_hash_check: bool,
    /// Raise the newest revision by this much (with --mark-compacted), so that clients that
    /// watched the old cluster see their revisions compacted rather than reused.
    #[arg(long, default_value_t = 0)]
    pub bump_revision: u64,
    /// Mark the raised revision compacted (required with --bump-revision, refused without).
    #[arg(long)]
    pub mark_compacted: bool,
    /// etcdutl's: the initial memory map size; kvd maps its file as it grows, so it is not
    /// used.
    #[arg(long, default_value_t = 0)]
    pub initial_memory_map_size: u64,
    /// etcdutl's: a WAL directory apart from the data directory; kvd keeps its WAL in the
    /// data directory, so it is refused.
    #[arg(long, default_value = "")]
    pub wal_dir: String,
    /// etcdctl's global TLS flags, accepted as `etcdctl snapshot restore` (etcd 3.5) took
    /// them: a restore reads the file and contacts no server, so they are not used.
    #[arg(long, default_value = "")]
    pub cacert: String,
    #[arg(long, default_value = "")]
    pub cert: String,
    #[arg(long, default_value = "")]
    pub key: String,
}

/// The server's flags (etcd's, unless marked kvd's).
#[derive(Debug, Args)]
pub struct ServeFlags {
    /// Human-readable name for this member.
    #[arg(long, env = "ETCD_NAME", default_value = "default")]
    pub name: String,
    /// Path to the data directory (default: `<name>.kvd`).
    #[arg(long, env = "ETCD_DATA_DIR", default_value = "")]
    pub data_dir: String,
    /// URLs to listen on for client traffic.
    #[arg(
        long,
        env = "ETCD_LISTEN_CLIENT_URLS",
        default_value = "http://localhost:2379"
    )]
    pub listen_client_urls: String,
    /// This member's client URLs to advertise to the rest of the cluster.
    #[arg(
        long,
        env = "ETCD_ADVERTISE_CLIENT_URLS",
        default_value = "http://localhost:2379"
    )]
    pub advertise_client_urls: String,
    /// URLs to listen on for peer traffic.
    #[arg(
        long,
        env = "ETCD_LISTEN_PEER_URLS",
        default_value = "http://localhost:2380"
    )]
    pub listen_peer_urls: String,
    /// This member's peer URLs to advertise to the rest of the cluster.
    #[arg(
        long,
        env = "ETCD_INITIAL_ADVERTISE_PEER_URLS",
        default_value = "http://localhost:2380"
    )]
    pub initial_advertise_peer_urls: String,
    /// Initial cluster configuration for bootstrapping (`name=url,…`; default: this member
    /// alone at its advertised peer URLs).
    #[arg(long, env = "ETCD_INITIAL_CLUSTER", default_value = "")]
    pub initial_cluster: String,
    /// `new` to bootstrap a cluster, `existing` to join one (after `member add`).
    #[arg(long, env = "ETCD_INITIAL_CLUSTER_STATE", default_value = "new")]
    pub initial_cluster_state: String,
    /// Initial cluster token, mixed into the member ids (and so the cluster id), as etcd's.
    #[arg(
        long,
        env = "ETCD_INITIAL_CLUSTER_TOKEN",
        default_value = "etcd-cluster"
    )]
    pub initial_cluster_token: String,
    /// Raise the NOSPACE alarm when the backend exceeds this size (0 = 2 GiB).
    #[arg(long, env = "ETCD_QUOTA_BACKEND_BYTES", default_value_t = 0)]
    pub quota_backend_bytes: u64,
    /// Applied entries between snapshots.
    #[arg(long, env = "ETCD_SNAPSHOT_COUNT", default_value_t = 10_000)]
    pub snapshot_count: u64,
    /// The longest time before applied writes are committed to the data file (empty: 100ms).
    #[arg(long, env = "ETCD_BACKEND_BATCH_INTERVAL", default_value = "")]
    pub backend_batch_interval: String,
    /// The most applied writes before they are committed to the data file (0: 10,000).
    #[arg(long, env = "ETCD_BACKEND_BATCH_LIMIT", default_value_t = 0)]
    pub backend_batch_limit: usize,
    /// Time (ms) of a heartbeat interval.
    #[arg(long, env = "ETCD_HEARTBEAT_INTERVAL", default_value_t = 100)]
    pub heartbeat_interval: u64,
    /// Time (ms) for an election to time out.
    #[arg(long, env = "ETCD_ELECTION_TIMEOUT", default_value_t = 1000)]
    pub election_timeout: u64,
    /// `periodic` (retention is a duration) or `revision` (retention is a revision count).
    #[arg(long, env = "ETCD_AUTO_COMPACTION_MODE", default_value = "periodic")]
    pub auto_compaction_mode: String,
    /// History to keep when auto-compacting: `0` disables (periodic: `1h`, `30m`, or hours).
    #[arg(long, env = "ETCD_AUTO_COMPACTION_RETENTION", default_value = "0")]
    pub auto_compaction_retention: String,
    /// Maximum client request size in bytes the server will accept.
    #[arg(long, env = "ETCD_MAX_REQUEST_BYTES", default_value_t = 1_572_864)]
    pub max_request_bytes: usize,
    /// Maximum operations in a transaction.
    #[arg(long, env = "ETCD_MAX_TXN_OPS", default_value_t = 128)]
    pub max_txn_ops: usize,
    /// Snapshot files to keep (0 = unlimited).
    #[arg(long, env = "ETCD_MAX_SNAPSHOTS", default_value_t = 5)]
    pub max_snapshots: usize,
    /// WAL files to keep (0 = unlimited).
    #[arg(long, env = "ETCD_MAX_WALS", default_value_t = 5)]
    pub max_wals: usize,
    /// Log level: debug, info, warn, error.
    #[arg(long, env = "ETCD_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Log format: `json` (etcd's default) or `text`/`console`.
    #[arg(long, env = "ETCD_LOG_FORMAT", default_value = "json")]
    pub log_format: String,
    /// Period of progress notifications to watchers that asked for them.
    #[arg(
        long,
        env = "ETCD_WATCH_PROGRESS_NOTIFY_INTERVAL",
        default_value = "10m"
    )]
    pub watch_progress_notify_interval: String,
    /// Server feature gates, `Name=true|false` pairs by etcd's names: FastLeaseKeepAlive
    /// (default: true), InitialCorruptCheck, LeaseCheckpoint (kvd's default: true),
    /// PriorityRequest, LeaseCheckpointPersist and TxnModeWriteWithSharedBuffer (no effect),
    /// AllAlpha, AllBeta. CompactHashCheck, SetMemberLocalAddr and StopGRPCServiceOnDefrag are
    /// not supported.
    #[arg(long, env = "ETCD_FEATURE_GATES", default_value = "")]
    pub feature_gates: String,
    /// Time between the leader's comparisons of the members' data (HashKV at one revision);
    /// a member that differs raises the CORRUPT alarm. 0s: never.
    #[arg(long, env = "ETCD_CORRUPT_CHECK_TIME", default_value = "0s")]
    pub corrupt_check_time: String,
    /// Refuse membership changes that could cost the quorum (etcd's, on by default).
    #[arg(
        long,
        env = "ETCD_STRICT_RECONFIG_CHECK",
        default_value = "true",
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub strict_reconfig_check: bool,
    /// How often a client may ping the server while it has streams open; sooner is a strike,
    /// and the third closes the connection ("too_many_pings").
    #[arg(long, env = "ETCD_GRPC_KEEPALIVE_MIN_TIME", default_value = "5s")]
    pub grpc_keepalive_min_time: String,
    /// How long a client may be quiet before the server pings it (0 disables).
    #[arg(long, env = "ETCD_GRPC_KEEPALIVE_INTERVAL", default_value = "2h")]
    pub grpc_keepalive_interval: String,
    /// How long the server waits for a ping's answer before it closes the connection.
    #[arg(long, env = "ETCD_GRPC_KEEPALIVE_TIMEOUT", default_value = "20s")]
    pub grpc_keepalive_timeout: String,
    /// Streams a client may have open on one connection.
    #[arg(long, env = "ETCD_MAX_CONCURRENT_STREAMS", default_value_t = u32::MAX)]
    pub max_concurrent_streams: u32,
    /// kvd's: bytes one client connection may hold, for unsent responses and again for
    /// request state; past it the connection's requests wait (or new streams are refused).
    #[arg(long, env = "KVD_MAX_CONNECTION_BUFFER_BYTES", default_value_t = 16 << 20)]
    pub max_connection_buffer_bytes: usize,
    /// kvd's: bytes all client connections may hold together; past it the connections
    /// holding more than 1 MiB are held back, so that the others are served.
    #[arg(long, env = "KVD_MAX_CLIENT_BUFFER_BYTES", default_value_t = 512 << 20)]
    pub max_client_buffer_bytes: usize,
    /// URLs to listen on for HTTP-only client traffic (the JSON gateway, `/health`,
    /// `/metrics`…); given, `--listen-client-urls` serve gRPC only.
    #[arg(long, env = "ETCD_LISTEN_CLIENT_HTTP_URLS", default_value = "")]
    pub listen_client_http_urls: String,
    /// URLs to serve `/metrics` and the health endpoints on as well.
    #[arg(long, env = "ETCD_LISTEN_METRICS_URLS", default_value = "")]
    pub listen_metrics_urls: String,
    /// Level of detail of the metrics: `extensive` adds the gRPC handling-time histograms
    /// (anything else is `basic`, as etcd reads it).
    #[arg(long, env = "ETCD_METRICS", default_value = "basic")]
    pub metrics: String,
    /// Path to the client server TLS cert file.
    #[arg(long, env = "ETCD_CERT_FILE", default_value = "")]
    pub cert_file: String,
    /// Path to the client server TLS key file.
    #[arg(long, env = "ETCD_KEY_FILE", default_value = "")]
    pub key_file: String,
    /// Path to the certificate this member presents when it connects to a client URL
    /// (default: --cert-file).
    #[arg(long, env = "ETCD_CLIENT_CERT_FILE", default_value = "")]
    pub client_cert_file: String,
    /// Path to the key of --client-cert-file.
    #[arg(long, env = "ETCD_CLIENT_KEY_FILE", default_value = "")]
    pub client_key_file: String,
    /// Enable client cert authentication (a client's certificate CN is its user name when
    /// auth is on and no token is given).
    #[arg(
        long,
        env = "ETCD_CLIENT_CERT_AUTH",
        default_value = "false",
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub client_cert_auth: bool,
    /// Path to the client server TLS trusted CA cert file.
    #[arg(long, env = "ETCD_TRUSTED_CA_FILE", default_value = "")]
    pub trusted_ca_file: String,
    /// Path to the client certificate revocation list file.
    #[arg(long, env = "ETCD_CLIENT_CRL_FILE", default_value = "")]
    pub client_crl_file: String,
    /// Comma-separated list of allowed SAN hostnames for client cert authentication.
    #[arg(long, env = "ETCD_CLIENT_CERT_ALLOWED_HOSTNAME", default_value = "")]
    pub client_cert_allowed_hostname: String,
    /// Client TLS using generated certificates.
    #[arg(
        long,
        env = "ETCD_AUTO_TLS",
        default_value = "false",
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub auto_tls: bool,
    /// Path to the peer server TLS cert file.
    #[arg(long, env = "ETCD_PEER_CERT_FILE", default_value = "")]
    pub peer_cert_file: String,
    /// Path to the peer server TLS key file.
    #[arg(long, env = "ETCD_PEER_KEY_FILE", default_value = "")]
    pub peer_key_file: String,
    /// Path to the certificate this member presents to its peers (default: --peer-cert-file).
    #[arg(long, env = "ETCD_PEER_CLIENT_CERT_FILE", default_value = "")]
    pub peer_client_cert_file: String,
    /// Path to the key of --peer-client-cert-file.
    #[arg(long, env = "ETCD_PEER_CLIENT_KEY_FILE", default_value = "")]
    pub peer_client_key_file: String,
    /// Enable peer client cert authentication.
    #[arg(
        long,
        env = "ETCD_PEER_CLIENT_CERT_AUTH",
        default_value = "false",
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub peer_client_cert_auth: bool,
    /// Path to the peer server TLS trusted CA file.
    #[arg(long, env = "ETCD_PEER_TRUSTED_CA_FILE", default_value = "")]
    pub peer_trusted_ca_file: String,
    /// Peer TLS using generated certificates.
    #[arg(
        long,
        env = "ETCD_PEER_AUTO_TLS",
        default_value = "false",
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub peer_auto_tls: bool,
    /// Path to the peer certificate revocation list file.
    #[arg(long, env = "ETCD_PEER_CRL_FILE", default_value = "")]
    pub peer_crl_file: String,
    /// Comma-separated list of allowed CNs for inter-peer TLS authentication.
    #[arg(long, env = "ETCD_PEER_CERT_ALLOWED_CN", default_value = "")]
    pub peer_cert_allowed_cn: String,
    /// Comma-separated list of allowed SAN hostnames for inter-peer TLS authentication.
    #[arg(long, env = "ETCD_PEER_CERT_ALLOWED_HOSTNAME", default_value = "")]
    pub peer_cert_allowed_hostname: String,
    /// Skip verification of SAN field in client certificate for peer connections.
    #[arg(
        long,
        env = "ETCD_PEER_SKIP_CLIENT_SAN_VERIFICATION",
        default_value = "false",
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub peer_skip_client_san_verification: bool,
    /// The validity period of the client and peer certificates --auto-tls and
    /// --peer-auto-tls generate, in years.
    #[arg(long, env = "ETCD_SELF_SIGNED_CERT_VALIDITY", default_value_t = 1)]
    pub self_signed_cert_validity: u32,
    /// Comma-separated list of TLS 1.2 cipher suites allowed on both ports (Go's names).
    #[arg(long, env = "ETCD_CIPHER_SUITES", default_value = "")]
    pub cipher_suites: String,
    /// Minimum TLS version: TLS1.2 or TLS1.3.
    #[arg(long, env = "ETCD_TLS_MIN_VERSION", default_value = "TLS1.2")]
    pub tls_min_version: String,
    /// Maximum TLS version: TLS1.2 or TLS1.3 (empty: the newest).
    #[arg(long, env = "ETCD_TLS_MAX_VERSION", default_value = "")]
    pub tls_max_version: String,
    /// Auth tokens: `simple`, `jwt,pub-key=<file>,priv-key=<file>,sign-method=<alg>,ttl=<d>`,
    /// or "" for none.
    #[arg(long, env = "ETCD_AUTH_TOKEN", default_value = "simple")]
    pub auth_token: String,
    /// The lifetime in seconds of an unused simple token.
    #[arg(long, env = "ETCD_AUTH_TOKEN_TTL", default_value_t = 300)]
    pub auth_token_ttl: u64,
    /// bcrypt's cost factor for password hashes (4-31).
    #[arg(long, env = "ETCD_BCRYPT_COST", default_value_t = 10)]
    pub bcrypt_cost: u32,
    /// kvd's: how often the leader checkpoints leases (etcd's fixed interval is 5 minutes).
    #[arg(long, env = "KVD_LEASE_CHECKPOINT_INTERVAL", default_value = "5m")]
    pub lease_checkpoint_interval: String,
    /// kvd's: the pager's free-page algorithm, `hashmap` (default) or `array` (bbolt's). etcd's
    /// `--backend-bbolt-freelist-type` (`map`, `array`) is accepted too.
    #[arg(
        long,
        alias = "backend-bbolt-freelist-type",
        env = "KVD_FREELIST_TYPE",
        default_value = "hashmap"
    )]
    pub freelist_type: String,
}

/// etcd flags kvd knows of and does not support yet, with why; refused with that reason.
const UNSUPPORTED: &[(&str, &str)] = &[
    (
        "discovery",
        "discovery is not supported; use --initial-cluster",
    ),
    (
        "discovery-srv",
        "discovery is not supported; use --initial-cluster",
    ),
    (
        "discovery-endpoints",
        "discovery is not supported; use --initial-cluster",
    ),
    ("enable-v2", "the v2 API is gone from etcd 3.6 as well"),
    ("enable-pprof", "pprof is a Go runtime facility"),
    ("unsafe-no-fsync", "kvd does not run without fsync"),
    ("force-new-cluster", "not supported yet"),
    ("wal-dir", "the WAL lives in the data directory"),
];

/// etcd's grpc-proxy flags kvd's proxy does not support, with why.
const PROXY_UNSUPPORTED: &[(&str, &str)] = &[
    (
        "discovery-srv",
        "DNS discovery is not supported; give the cluster's --endpoints",
    ),
    (
        "discovery-srv-name",
        "DNS discovery is not supported; give the cluster's --endpoints",
    ),
    (
        "insecure-discovery",
        "DNS discovery is not supported; give the cluster's --endpoints",
    ),
    (
        "endpoints-auto-sync-interval",
        "endpoints are not synced from the member list; give every endpoint in --endpoints",
    ),
    (
        "resolver-prefix",
        "registering proxies in the cluster is not supported",
    ),
    (
        "resolver-ttl",
        "registering proxies in the cluster is not supported",
    ),
    ("enable-pprof", "pprof is a Go runtime facility"),
    (
        "experimental-serializable-ordering",
        "not supported; the proxy sticks to one endpoint until it fails",
    ),
    (
        "experimental-enable-grpc-logging",
        "not supported; use --log-level debug",
    ),
];

/// The `--experimental-*` flags etcd 3.7 removed (3.6 had deprecated them), refused as etcd
/// 3.7 refuses them, and what replaced each.
const REMOVED_IN_3_7: &[(&str, &str)] = &[
    (
        "experimental-initial-corrupt-check",
        "--feature-gates=InitialCorruptCheck=true",
    ),
    (
        "experimental-enable-lease-checkpoint",
        "--feature-gates=LeaseCheckpoint=true",
    ),
    ("experimental-corrupt-check-time", "--corrupt-check-time"),
    (
        "experimental-watch-progress-notify-interval",
        "--watch-progress-notify-interval",
    ),
    (
        "experimental-peer-skip-client-san-verification",
        "--peer-skip-client-san-verification",
    ),
];

/// Rewrites Go-style single-dash long flags (`-name x`) to `--name x`, as etcd accepts both,
/// and refuses etcd flags kvd does not support with the reason, and those etcd 3.7 removed
/// with what replaced them.
pub fn normalize_args(args: impl IntoIterator<Item = String>) -> Result<Vec<String>, String> {
    let args: Vec<String> = args.into_iter().collect();
    let (unsupported, what) = if args.get(1).map(String::as_str) == Some("grpc-proxy") {
        (PROXY_UNSUPPORTED, "etcd's grpc-proxy flag")
    } else {
        (UNSUPPORTED, "etcd's flag")
    };
    let mut out = Vec::new();
    for (i, a) in args.into_iter().enumerate() {
        let a = if i > 0 && a.starts_with('-') && !a.starts_with("--") && a.len() > 2 {
            format!("-{a}")
        } else {
            a
        };
        if let Some(name) = a.strip_prefix("--") {
            let name = name.split('=').next().unwrap_or_default();
            if let Some((_, why)) = unsupported.iter().find(|(f, _)| *f == name) {
                return Err(format!("kvd: {what} --{name} is not supported: {why}"));
            }
            let member = what == "etcd's flag";
            if let Some((_, new)) = REMOVED_IN_3_7.iter().find(|(f, _)| member && *f == name) {
                return Err(format!(
                    "kvd: flag provided but not defined: --{name} (etcd 3.7 removed it; use {new})"
                ));
            }
        }
        out.push(a);
    }
    Ok(out)
}

/// Splits a comma-separated URL list.
pub fn urls(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(String::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_etcd_3_7_removed_are_refused_with_their_replacement() {
        for a in [
            "--experimental-initial-corrupt-check",
            "-experimental-corrupt-check-time=5m",
            "--experimental-watch-progress-notify-interval=1s",
        ] {
            let err = normalize_args(["kvd".to_string(), a.to_string()]).unwrap_err();
            assert!(
                err.contains("flag provided but not defined") && err.contains("use --"),
                "{err}"
            );
        }
        let err = normalize_args(
            ["kvd", "--experimental-enable-lease-checkpoint=false"].map(String::from),
        )
        .unwrap_err();
        assert!(
            err.ends_with("use --feature-gates=LeaseCheckpoint=true)"),
            "{err}"
        );
        // The proxy keeps its experimental flag, as etcd 3.7's.
        let proxy = [
            "kvd",
            "grpc-proxy",
            "start",
            "--experimental-leasing-prefix=l/",
        ];
        normalize_args(proxy.map(String::from)).unwrap();
        // Their replacements parse.
        Cli::try_parse_from([
            "kvd",
            "--corrupt-check-time=5m",
            "--peer-skip-client-san-verification",
        ])
        .unwrap();
    }

    #[test]
    fn go_style_flags() {
        let args = ["kvd", "-name", "a", "--data-dir=x", "-v"].map(String::from);
        assert_eq!(
            normalize_args(args).unwrap(),
            ["kvd", "--name", "a", "--data-dir=x", "-v"]
        );
        let err = normalize_args(["kvd", "--wal-dir", "w"].map(String::from)).unwrap_err();
        assert!(err.contains("--wal-dir") && err.contains("WAL"), "{err}");
        let proxy = ["kvd", "grpc-proxy", "start", "--resolver-prefix=x"].map(String::from);
        let err = normalize_args(proxy).unwrap_err();
        assert!(err.contains("grpc-proxy flag --resolver-prefix"), "{err}");
    }
}
