//! Taking a key after a miss: one txn that reads the key and creates the proxy's leasing key
//! if no holder is in the way, run off the client's path (the client's read was answered by
//! the cluster already).

use std::sync::Arc;

use api::etcdserverpb::request_op::Request as Op;
use api::etcdserverpb::{PutRequest, TxnRequest};

use super::{get, op, range_of, Leasing};
use crate::cache::Acquired;
use crate::upstream::Creds;

impl Leasing {
    /// Takes `key` in the background, if the session is alive with its revocation watch in
    /// place, the key was not given up a moment ago, and it is not held or being taken.
    pub(super) fn start_acquire(self: &Arc<Self>, key: &[u8]) {
        let Some((lease, generation)) = self.session.current() else {
            tracing::trace!("not taking a key: no session");
            return;
        };
        if *self.watching.borrow() != generation {
            tracing::trace!("not taking a key: the revocation watch is not in place");
            return;
        }
        if !self.cache.may_acquire(key) || !self.cache.begin_acquire(key) {
            return;
        }
        let me = self.clone();
        let key = key.to_vec();
        tokio::spawn(async move { me.acquire(key, lease, generation).await });
    }

    async fn acquire(self: Arc<Self>, key: Vec<u8>, lease: i64, generation: u64) {
        // Room first: the coldest keys go (their leasing keys with them).
        while !self.cache.has_room() {
            let Some(victim) = self.cache.victim() else {
                break;
            };
            self.metrics.evictions.inc();
            self.release(&victim, false);
        }
        let lk = self.keys.own(&key, lease);
        let t = TxnRequest {
            compare: self.keys.acquire_guard(&key, lease),
            success: vec![
                op(get(&key)),
                op(Op::RequestPut(PutRequest {
                    key: lk.clone(),
                    value: self.keys.own_value(),
                    lease,
                    ..Default::default()
                })),
            ],
            failure: vec![op(get(&lk))],
        };
        let resp = match self.calls.txn(&Creds::default(), t).await {
            Ok(r) => r,
            Err(s) => {
                // Applied or not, a leasing key left behind is deleted when a writer revokes it
                // (the revocation watch takes it for a leftover of this proxy's).
                tracing::debug!(key = %String::from_utf8_lossy(&key), "taking a key failed: {}", s.message());
                self.cache.abort_acquire(&key);
                return;
            }
        };
        let rev = resp.header.as_ref().map_or(0, |h| h.revision);
        if !resp.succeeded {
            tracing::trace!(key = %String::from_utf8_lossy(&key), "not taken: held elsewhere, or leased");
            self.cache.abort_acquire(&key);
            // Held elsewhere, or leased: not tried again for a while (each try is a write).
            self.cache.backoff(&key);
            // A leasing key of this session's left over (a taking whose answer was lost, or one
            // already revoked): a writer may be waiting for it to go.
            let left = resp.responses.first().and_then(range_of);
            if let Some(l) = left.and_then(|r| r.kvs.first()) {
                if l.lease == lease {
                    self.delete_lk(lk, l.create_revision).await;
                }
            }
            return;
        }
        if self.session.generation() != generation {
            // The session ended meanwhile: the leasing key went with its lease.
            self.cache.abort_acquire(&key);
            return;
        }
        let value = resp
            .responses
            .first()
            .and_then(range_of)
            .and_then(|r| r.kvs.first().cloned());
        match self.cache.finish_acquire(&key, rev, generation, value, rev) {
            Acquired::Held => {
                self.metrics.acquisitions.inc();
                self.watch_key(&key, rev);
            }
            Acquired::Disturbed => {
                self.cache.backoff(&key);
                self.delete_lk(lk, rev).await;
            }
        }
    }
}
