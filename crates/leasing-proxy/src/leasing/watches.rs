//! What the proxy watches: the leasing prefix (revocations of its leasing keys, and their
//! deletion by others), and each key it holds (writes that bypass the protocol).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use api::etcdserverpb::WatchCreateRequest;
use api::mvccpb::{event::EventType, Event};

use super::keys::{LeasingKeys, REVOKE};
use super::Leasing;
use crate::cache::Revoked;
use crate::namespace::prefix_end;

/// How long a broken watch waits before it is made again.
const RETRY: Duration = Duration::from_millis(100);

impl Leasing {
    /// Watches the leasing prefix for as long as the proxy runs: one watch per session, from
    /// the moment it is in place ([`Leasing::watching`] says so, and keys are taken only
    /// then), made again from where it was when the stream breaks.
    pub async fn watch_revocations(self: Arc<Self>) {
        let mut changes = self.session.subscribe();
        let warned = AtomicBool::new(false);
        loop {
            let Some((lease, generation)) = self.session.current() else {
                let _ = changes.changed().await;
                continue;
            };
            // Whatever older sessions held went with their leases.
            for (k, _) in self.cache.drain() {
                self.stop_key_watch(&k);
            }
            let mut from = 0;
            'stream: while self.session.generation() == generation {
                let req = WatchCreateRequest {
                    key: self.keys.prefix.clone(),
                    range_end: prefix_end(&self.keys.prefix),
                    start_revision: from,
                    progress_notify: true,
                    ..Default::default()
                };
                let mut w = match self.mux.watch(req).await {
                    Ok(w) => w,
                    Err(_) => {
                        tokio::time::sleep(RETRY).await;
                        continue;
                    }
                };
                if w.created.canceled {
                    // Compacted past where it was: a revocation may have been missed. Every
                    // key goes (a writer waiting for one would otherwise wait for the lease).
                    tracing::warn!(
                        "the revocation watch lost its place ({}): every held key is given up",
                        w.created.cancel_reason
                    );
                    for (k, r) in self.cache.drain() {
                        self.forget(&k, r);
                    }
                    from = 0;
                    continue;
                }
                if from == 0 {
                    from = w.created.header.as_ref().map_or(0, |h| h.revision) + 1;
                }
                self.watching.send_replace(generation);
                loop {
                    tokio::select! {
                        r = w.rx.recv() => match r {
                            Some(r) => {
                                for ev in &r.events {
                                    if let Some(kv) = &ev.kv {
                                        from = from.max(kv.mod_revision + 1);
                                    }
                                    self.on_leasing_event(ev, lease, &warned);
                                }
                                if let Some(h) = &r.header {
                                    from = from.max(h.revision + 1);
                                }
                                if r.canceled {
                                    continue 'stream;
                                }
                            }
                            None => {
                                tokio::time::sleep(RETRY).await;
                                continue 'stream;
                            }
                        },
                        _ = changes.changed() => {
                            if self.session.generation() != generation {
                                break 'stream;
                            }
                        }
                    }
                }
            }
            self.watching.send_replace(0);
        }
    }

    fn on_leasing_event(self: &Arc<Self>, ev: &Event, lease: i64, warned: &AtomicBool) {
        let Some(kv) = &ev.kv else { return };
        self.calls.up.saw_revision(kv.mod_revision);
        let Some(key) = self.keys.key_of(&kv.key, lease) else {
            if self.keys.shared
                && ev.r#type == EventType::Put as i32
                && LeasingKeys::is_etcd_holder(&kv.value)
                && !warned.swap(true, Ordering::Relaxed)
            {
                tracing::error!(
                    key = %String::from_utf8_lossy(&kv.key),
                    "an etcd proxy took a leasing key on this prefix: etcd's proxies do not respect shared leases, so --leasing-shared is safe only with kvd proxies on the prefix"
                );
            }
            return;
        };
        if ev.r#type == EventType::Delete as i32 {
            if self.cache.on_lk_deleted(key, kv.mod_revision) {
                tracing::info!(key = %String::from_utf8_lossy(key), "a leasing key of this proxy was deleted by another: the key is let go");
                self.stop_key_watch(key);
            }
            return;
        }
        if kv.value != REVOKE || kv.lease != lease {
            return;
        }
        match self
            .cache
            .on_revoke(key, kv.create_revision, kv.mod_revision)
        {
            Revoked::Release(r) => {
                self.metrics.revocations_received.inc();
                self.cache.backoff(key);
                self.forget(key, r);
            }
            Revoked::Deferred => self.metrics.revocations_received.inc(),
            Revoked::Stale => {
                // A leasing key of this session's that is not held: left over by a taking
                // whose answer was lost. Its revoker waits for it to go.
                let me = self.clone();
                let (lk, rev) = (kv.key.clone(), kv.create_revision);
                tokio::spawn(async move { me.delete_lk(lk, rev).await });
            }
        }
    }

    /// Watches held `key` (taken at `lk_rev`) for writes that bypass the protocol: each makes
    /// the cached value unknown until a read through the proxy learns it again.
    pub(super) fn watch_key(self: &Arc<Self>, key: &[u8], lk_rev: i64) {
        let me = Arc::downgrade(self);
        let mux = self.mux.clone();
        let k = key.to_vec();
        let task = tokio::spawn(async move {
            let mut from = lk_rev + 1;
            loop {
                let held = me.upgrade().and_then(|m| m.cache.held_as(&k));
                if held != Some(lk_rev) {
                    return;
                }
                let req = WatchCreateRequest {
                    key: k.clone(),
                    start_revision: from,
                    ..Default::default()
                };
                let Ok(mut w) = mux.watch(req).await else {
                    tokio::time::sleep(RETRY).await;
                    continue;
                };
                let now = w.created.header.as_ref().map_or(0, |h| h.revision);
                if w.created.canceled {
                    // Compacted past `from`: a write there cannot be seen; the value is known
                    // again from a read at the current revision.
                    if let Some(m) = me.upgrade() {
                        m.cache.on_key_event(&k, now);
                    }
                    from = now + 1;
                    continue;
                }
                while let Some(r) = w.rx.recv().await {
                    let Some(m) = me.upgrade() else { return };
                    for ev in &r.events {
                        let Some(kv) = &ev.kv else { continue };
                        from = from.max(kv.mod_revision + 1);
                        m.calls.up.saw_revision(kv.mod_revision);
                        if m.cache.on_key_event(&k, kv.mod_revision) {
                            tracing::debug!(key = %String::from_utf8_lossy(&k), revision = kv.mod_revision, "a write bypassed the leasing protocol: the cached value is not served until read again");
                        }
                    }
                    if r.canceled {
                        break;
                    }
                }
                tokio::time::sleep(RETRY).await;
            }
        });
        if let Some(old) = self
            .key_watches
            .lock()
            .insert(key.to_vec(), task.abort_handle())
        {
            old.abort();
        }
    }

    pub(super) fn stop_key_watch(&self, key: &[u8]) {
        if let Some(h) = self.key_watches.lock().remove(key) {
            h.abort();
        }
    }
}
