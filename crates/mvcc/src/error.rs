//! mvcc's errors. Each request error displays as the message etcd's server sends for it, so the
//! rpc layer passes the text through unchanged and client retry logic keyed on it keeps working.

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The requested revision is older than the compacted one.
    #[error("etcdserver: mvcc: required revision has been compacted")]
    Compacted,
    /// The requested revision is newer than the store's.
    #[error("etcdserver: mvcc: required revision is a future revision")]
    FutureRev,
    /// A request without a key.
    #[error("etcdserver: key is not provided")]
    EmptyKey,
    /// `ignore_value`/`ignore_lease` on a key that does not exist.
    #[error("etcdserver: key not found")]
    KeyNotFound,
    /// Two writes to one key in a transaction.
    #[error("etcdserver: duplicate key given in txn request")]
    DuplicateKey,
    /// More compares or operations than the limit.
    #[error("etcdserver: too many operations in txn request")]
    TooManyOps,
    /// `ignore_value` together with a value.
    #[error("etcdserver: value is provided")]
    ValueProvided,
    /// `ignore_lease` together with a lease.
    #[error("etcdserver: lease is provided")]
    LeaseProvided,
    /// A sort order or target outside the enum.
    #[error("etcdserver: invalid sort option")]
    InvalidSortOption,
    /// A lease id that is not granted.
    #[error("etcdserver: requested lease not found")]
    LeaseNotFound,
    /// A grant for an id already in use.
    #[error("etcdserver: lease already exists")]
    LeaseExists,
    /// A TTL above the maximum.
    #[error("etcdserver: too large lease TTL")]
    LeaseTtlTooLarge,
    /// A watch range whose end is not after its key.
    #[error("mvcc: watcher range is empty")]
    EmptyWatcherRange,
    /// A client-chosen watch id already in use on the stream.
    #[error("mvcc: duplicate watch ID provided on the WatchStream")]
    DuplicateWatchId,
    /// Cancelling a watch id the stream does not have.
    #[error("mvcc: watcher does not exist")]
    WatcherNotExist,
    /// The storage engine failed (I/O, corruption).
    #[error(transparent)]
    Storage(#[from] pager::Error),
    /// The data file holds something mvcc did not write.
    #[error("mvcc: corrupt data in {path}: {reason}")]
    Corrupt { path: String, reason: String },
    /// An etcd data file that is not readable as bbolt.
    #[error(transparent)]
    EtcdFile(#[from] bbolt::Error),
    /// A bbolt file that holds something etcd does not write.
    #[error("{path}: not etcd's data: {reason}")]
    NotEtcd { path: String, reason: String },
    /// An earlier storage failure stopped the store; reopen it.
    #[error("mvcc: the store stopped after a storage failure: {0}")]
    Stopped(String),
}

/// mvcc's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
