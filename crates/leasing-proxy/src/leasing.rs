//! etcd's leasing protocol, over the public API only, so kvd's proxies and etcd's share a
//! cluster and a prefix (the layout of the leasing keys: `leasing/keys.rs`):
//!
//! - A proxy holds a key `k` while its *leasing key* exists under its session lease. It takes
//!   `k` in one txn that reads `k` and creates the leasing key if no holder is in the way and
//!   `k` has no lease (a key that can vanish without a write is never held).
//! - A writer of `k` guards its write on the holders of `k`: none but its own leasing key, no
//!   newer than it knows. If another holder is there, it puts `REVOKE` on that leasing key
//!   (keeping its lease) and waits for the key's deletion, then tries again.
//! - The holder, seeing `REVOKE` on one of its leasing keys, stops serving the key, deletes
//!   the leasing key and does not take the key again for a while.
//!
//! So while the proxy holds `k`, no writer that follows the protocol changes `k` but the
//! proxy itself, whose writes teach the cache the new value: a read of `k` from the proxy's
//! memory is linearizable — for as long as the session lease is certainly alive
//! (`session.rs`), and with no write of the proxy's to `k` in flight (`cache.rs`).
//!
//! Unlike etcd's proxy: a write through this one is applied once (etcd's applies a write to a
//! key it does not hold, then again after its revocation); a leasing key already marked
//! `REVOKE`, or one left over by an earlier try, is never taken for ownership; a revocation
//! seen before the taking txn's answer gives the key back; the session's deadline is checked
//! at every hit; and a miss costs one read of the cluster, the key being taken afterwards,
//! off the client's path.
//!
//! Writes made straight to the cluster bypass the protocol. The proxy watches the keys it
//! holds and stops serving one as soon as such a write shows (the next read through the proxy
//! asks the cluster and learns the new value), but between that write and its watch event a
//! read may still be answered with the older value: only writers that go through a leasing
//! proxy are covered by the guarantee, as in etcd's design.

mod acquire;
mod keys;
mod watches;
mod write;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use api::etcdserverpb::compare::{CompareResult, TargetUnion};
use api::etcdserverpb::request_op::Request as Op;
use api::etcdserverpb::response_op::Response as RespOp;
use api::etcdserverpb::*;
use api::mvccpb::KeyValue;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::cache::{Cache, Lookup, Released};
use crate::calls::Calls;
use crate::metrics::Metrics;
use crate::session::Session;
use crate::upstream::Creds;
use crate::watchmux::WatchMux;

pub use keys::{LeasingKeys, REVOKE, SHARED};

/// The leasing layer's settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where leasing keys live (`--experimental-leasing-prefix`).
    pub prefix: Vec<u8>,
    /// Shared read leases (`--leasing-shared`).
    pub shared: bool,
    /// The cache's bounds (`--leasing-cache-keys`, `--leasing-cache-bytes`).
    pub cache_keys: usize,
    pub cache_bytes: usize,
    /// How long a key given up on another's request is not taken again (etcd's: 2 s).
    pub backoff: Duration,
}

/// The leasing layer of one proxy.
#[derive(Debug)]
pub struct Leasing {
    calls: Calls,
    session: Arc<Session>,
    pub(crate) cache: Cache,
    keys: LeasingKeys,
    /// The proxy's own watchers (revocations, held keys, writes waiting for a holder).
    mux: WatchMux,
    metrics: Arc<Metrics>,
    /// The watchers of held keys, by key: aborted when the key is let go.
    key_watches: Mutex<HashMap<Vec<u8>, tokio::task::AbortHandle>>,
    /// The session generation whose revocation watch is in place (0: none): keys are taken
    /// only then, so that no revocation of theirs can be missed.
    watching: watch::Sender<u64>,
}

/// What a read found in the cache before it went to the cluster: what its answer may teach.
#[derive(Debug, Clone, Copy)]
pub enum Ticket {
    /// Not for the cache (a range, a revision, a filter, a credential, serializable).
    Bypass,
    Miss,
    /// Held with its value not known now: the answer is the value, if nothing changed since.
    Held {
        lk_rev: i64,
        epoch: u64,
    },
    /// Being taken, or not to be taken.
    Other,
}

impl Leasing {
    pub fn new(calls: Calls, session: Arc<Session>, opts: &Options) -> Arc<Leasing> {
        let metrics = calls.metrics.clone();
        Arc::new(Leasing {
            mux: WatchMux::new(calls.clone(), Creds::default()),
            calls,
            session,
            cache: Cache::new(opts.cache_keys, opts.cache_bytes, opts.backoff),
            keys: LeasingKeys {
                prefix: opts.prefix.clone(),
                shared: opts.shared,
            },
            metrics,
            key_watches: Mutex::new(HashMap::new()),
            watching: watch::Sender::new(0),
        })
    }

    /// A client's Range, from the cache if it may be; otherwise what the cluster's answer
    /// may teach the cache ([`Leasing::after_read`]).
    pub fn read(&self, r: &RangeRequest, creds: &Creds) -> Result<RangeResponse, Ticket> {
        if !cacheable(r) || creds.is_some() {
            return Err(Ticket::Bypass);
        }
        match self.cache.lookup(&r.key, |g| self.session.valid(g)) {
            Lookup::Hit(kv) => {
                self.metrics.hits.inc();
                Ok(answer(r, kv, self.calls.up.header()))
            }
            Lookup::Held { lk_rev, epoch } => Err(Ticket::Held { lk_rev, epoch }),
            Lookup::Miss => Err(Ticket::Miss),
            Lookup::Acquiring => Err(Ticket::Other),
        }
    }

    /// After a read the cluster answered with `resp`: the value of a held key whose value was
    /// unknown is learnt; a key not held is taken, in the background.
    pub fn after_read(self: &Arc<Self>, r: &RangeRequest, ticket: Ticket, resp: &RangeResponse) {
        if matches!(ticket, Ticket::Bypass) {
            return;
        }
        self.metrics.misses.inc();
        if r.serializable {
            return;
        }
        match ticket {
            Ticket::Held { lk_rev, epoch } if !r.keys_only && !r.count_only => {
                let at = resp.header.as_ref().map_or(0, |h| h.revision);
                let kv = resp.kvs.first().filter(|kv| kv.key == r.key).cloned();
                self.cache.learn(&r.key, lk_rev, epoch, kv, at);
            }
            // A key with a lease is never held (it can vanish without a write): no txn
            // is spent trying, as the answer shows it.
            Ticket::Miss if resp.kvs.first().is_some_and(|kv| kv.lease != 0) => {
                self.cache.backoff(&r.key)
            }
            Ticket::Miss => self.start_acquire(&r.key),
            _ => {}
        }
    }

    /// Gives up `key` (if held): no more answers from the cache for it, then its leasing key
    /// deleted. `backoff`: given up on another's request; not taken again for a while.
    pub(crate) fn release(self: &Arc<Self>, key: &[u8], backoff: bool) {
        if backoff {
            self.cache.backoff(key);
        }
        if let Some(r) = self.cache.remove(key) {
            self.forget(key, r);
        }
    }

    /// What follows a key given up: its watcher stopped and its leasing key deleted (if its
    /// session is still the proxy's: otherwise the key went with the old lease).
    fn forget(self: &Arc<Self>, key: &[u8], r: Released) {
        self.stop_key_watch(key);
        let lease = self.session.lease();
        if r.generation != self.session.generation() || lease == 0 {
            return;
        }
        let lk = self.keys.own(key, lease);
        let me = self.clone();
        tokio::spawn(async move { me.delete_lk(lk, r.lk_rev).await });
    }

    /// Deletes leasing key `lk` created at `lk_rev` (and no later one), trying again while
    /// the session that owns it lives.
    async fn delete_lk(&self, lk: Vec<u8>, lk_rev: i64) {
        let t = TxnRequest {
            compare: vec![keys::cmp(
                lk.clone(),
                Vec::new(),
                CompareResult::Equal,
                TargetUnion::CreateRevision(lk_rev),
            )],
            success: vec![op(Op::RequestDeleteRange(DeleteRangeRequest {
                key: lk.clone(),
                ..Default::default()
            }))],
            failure: vec![],
        };
        let generation = self.session.generation();
        for attempt in 0..30u32 {
            match self.calls.txn(&Creds::default(), t.clone()).await {
                Ok(_) => return,
                Err(s) => {
                    tracing::debug!(key = %String::from_utf8_lossy(&lk), "deleting a leasing key failed: {}", s.message());
                    if self.session.generation() != generation {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(50 << attempt.min(5))).await;
                }
            }
        }
        tracing::warn!(key = %String::from_utf8_lossy(&lk), "could not delete a leasing key: it goes when the session lease expires");
    }

    /// Serves nothing more from the cache (a clean shutdown: the session lease is revoked
    /// next, and its leasing keys with it).
    pub fn forget_all(&self) {
        for (k, _) in self.cache.drain() {
            self.stop_key_watch(&k);
        }
    }

    /// Keys held, and the bytes their values take.
    pub fn held(&self) -> (usize, usize) {
        (self.cache.keys(), self.cache.bytes())
    }
}

pub(crate) fn op(o: Op) -> RequestOp {
    RequestOp { request: Some(o) }
}

pub(crate) fn get(key: &[u8]) -> Op {
    Op::RequestRange(RangeRequest {
        key: key.to_vec(),
        ..Default::default()
    })
}

pub(crate) fn range_of(r: &ResponseOp) -> Option<&RangeResponse> {
    match r.response.as_ref()? {
        RespOp::ResponseRange(r) => Some(r),
        _ => None,
    }
}

/// Whether a Range may be answered from the cache: one key, at the current revision, with no
/// filter on revisions (a filtered answer's `count` is the unfiltered one's, as etcd's).
pub fn cacheable(r: &RangeRequest) -> bool {
    r.range_end.is_empty()
        && r.revision == 0
        && !r.key.is_empty()
        && r.min_mod_revision == 0
        && r.max_mod_revision == 0
        && r.min_create_revision == 0
        && r.max_create_revision == 0
}

/// The answer to `r` from a held key's value.
fn answer(r: &RangeRequest, kv: Option<KeyValue>, header: ResponseHeader) -> RangeResponse {
    let count = i64::from(kv.is_some());
    let kvs = match kv {
        Some(_) if r.count_only => Vec::new(),
        Some(mut kv) => {
            if r.keys_only {
                kv.value.clear();
            }
            vec![kv]
        }
        None => Vec::new(),
    };
    let revision = header
        .revision
        .max(kvs.first().map_or(0, |kv| kv.mod_revision));
    RangeResponse {
        header: Some(ResponseHeader { revision, ..header }),
        kvs,
        more: false,
        count,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_answer_reads_as_the_clusters() {
        let kv = KeyValue {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            mod_revision: 9,
            create_revision: 3,
            version: 2,
            lease: 0,
        };
        let h = ResponseHeader {
            revision: 7,
            ..Default::default()
        };
        let r = RangeRequest {
            key: b"k".to_vec(),
            ..Default::default()
        };
        let a = answer(&r, Some(kv.clone()), h);
        assert_eq!((a.count, a.kvs.len(), a.more), (1, 1, false));
        assert_eq!(a.header.unwrap().revision, 9, "never behind the value");
        let a = answer(
            &RangeRequest {
                keys_only: true,
                ..r.clone()
            },
            Some(kv.clone()),
            h,
        );
        assert!(a.kvs[0].value.is_empty());
        let a = answer(
            &RangeRequest {
                count_only: true,
                ..r.clone()
            },
            Some(kv),
            h,
        );
        assert_eq!((a.count, a.kvs.len()), (1, 0));
        let a = answer(&r, None, h);
        assert_eq!((a.count, a.kvs.len()), (0, 0));
        assert!(!cacheable(&RangeRequest {
            range_end: b"z".to_vec(),
            ..r.clone()
        }));
        assert!(!cacheable(&RangeRequest {
            min_mod_revision: 2,
            ..r.clone()
        }));
        assert!(cacheable(&r));
    }
}
