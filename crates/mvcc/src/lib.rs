//! etcd's revision model on the pager.
//!
//! Every write transaction gets the next main revision; each write in it a sub revision. The
//! `key` bucket holds every version of every key under its revision (deletes as tombstones), and
//! an in-memory [`index`] maps each key to its generations of revisions, so a read at any
//! revision not yet compacted finds the version it needs. Requests and responses are etcd's own
//! `etcdserverpb` types, with etcd's results and errors.
//!
//! ```
//! use api::etcdserverpb::{PutRequest, RangeRequest};
//! let dir = tempfile::tempdir().unwrap();
//! let store = mvcc::Store::open(dir.path().join("db"), Default::default()).unwrap();
//! let put = PutRequest { key: b"k".to_vec(), value: b"v".to_vec(), ..Default::default() };
//! let resp = store.write().unwrap().put(&put).unwrap();
//! assert_eq!(resp.header.unwrap().revision, 2); // a new store is at revision 1, as etcd's
//! let got = store.read().unwrap().range(&RangeRequest { key: b"k".to_vec(), ..Default::default() }).unwrap();
//! assert_eq!(got.kvs[0].value, b"v");
//! assert_eq!(got.kvs[0].version, 1);
//! ```

mod alarm;
mod auth;
pub mod cluster;
pub mod dump;
mod error;
pub mod etcd_file;
mod hash;
mod index;
mod kv;
pub mod lease;
pub mod revision;
mod signal;
mod store;
pub mod validate;
mod watch;

pub use auth::AuthData;
pub use error::{Error, Result};
pub use hash::KvHash;
pub use kv::is_txn_readonly;
pub use revision::Rev;
pub use store::{
    init_metrics, Applied, Defragmented, RangeOptions, RangeResult, Snapshot, Store, StoreOptions,
    Writer,
};
pub use watch::{WatchCounts, WatchEvents, WatchResponse, WatchStream};
