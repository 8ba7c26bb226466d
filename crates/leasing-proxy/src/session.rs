//! The proxy's session: one upstream lease (etcd's concurrency session) that every leasing key
//! of the proxy is attached to, kept alive while the cluster answers.
//!
//! The cluster lets a lease expire no sooner than its TTL after it received the last
//! keep-alive, which it received after the proxy sent it. So, on the proxy's own clock, the
//! lease — and with it every key the proxy holds — is certainly alive until the keep-alive's
//! *send* time plus the TTL, less a margin for the two clocks running at different rates
//! (`drift`: with a margin of 1 % of the TTL, the proxy's clock may run up to 1 % slower than
//! the cluster leader's). Past that deadline the proxy serves nothing from its cache; etcd's
//! proxy does not check this, so one paused or cut off past its TTL serves old data there.
//!
//! The clock is `CLOCK_BOOTTIME`: unlike the monotonic clock it counts the time a suspended
//! machine slept, so a proxy whose machine was suspended past its deadline knows it.
//!
//! A keep-alive that fails does not end the session: the proxy keeps trying with the same
//! lease. Once one is answered with a TTL, the lease never expired (an expired lease is gone
//! for good), so the keys held under it are still the proxy's and the cache is served again.
//! The session ends, and its keys with it, when the cluster answers that the lease is gone.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use api::etcdserverpb::lease_client::LeaseClient;
use api::etcdserverpb::{LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest};
use tokio::sync::{mpsc, watch};

use crate::metrics::Metrics;
use crate::upstream::Upstream;

/// How long a failed grant or keep-alive waits before the next try.
const RETRY: Duration = Duration::from_millis(200);

/// Time since boot, suspended time included (see the module's doc).
pub fn now() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

/// The session: its lease, a generation counted up by each new lease, and the deadline.
#[derive(Debug)]
pub struct Session {
    ttl: Duration,
    /// The fraction of the TTL kept back for clock-rate drift.
    drift: f64,
    lease: AtomicI64,
    generation: AtomicU64,
    /// Nanoseconds since boot until which the lease is certainly alive (0: none).
    deadline: AtomicU64,
    /// Changes (a new lease, or the lease lost): the generation now.
    changed: watch::Sender<u64>,
}

impl Session {
    pub fn new(ttl: Duration, drift: f64) -> Arc<Session> {
        Arc::new(Session {
            ttl,
            drift: drift.clamp(0.0, 0.5),
            lease: AtomicI64::new(0),
            generation: AtomicU64::new(0),
            deadline: AtomicU64::new(0),
            changed: watch::Sender::new(0),
        })
    }

    /// The lease and generation of a session alive now.
    pub fn current(&self) -> Option<(i64, u64)> {
        let g = self.generation.load(Ordering::Acquire);
        let lease = self.lease.load(Ordering::Acquire);
        (lease != 0 && self.valid(g)).then_some((lease, g))
    }

    /// The lease of the session, alive or not (0: none yet).
    pub fn lease(&self) -> i64 {
        self.lease.load(Ordering::Acquire)
    }

    /// The generation of the session now.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether the session of generation `g` is certainly alive now: what a cache hit checks.
    pub fn valid(&self, g: u64) -> bool {
        g == self.generation.load(Ordering::Acquire)
            && (now().as_nanos() as u64) < self.deadline.load(Ordering::Acquire)
    }

    /// How long the session of generation `g` is certainly alive from now (zero: not).
    #[cfg(test)]
    fn left(&self, g: u64) -> Duration {
        if g != self.generation.load(Ordering::Acquire) {
            return Duration::ZERO;
        }
        let d = self.deadline.load(Ordering::Acquire);
        Duration::from_nanos(d.saturating_sub(now().as_nanos() as u64))
    }

    /// Changes of the session, as its generation.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The lease was kept alive by a grant or keep-alive sent at `sent` (see [`now`]) that
    /// the cluster answered with `ttl` seconds.
    fn extend(&self, sent: Duration, ttl: i64) {
        let keep = Duration::from_secs(ttl.max(0) as u64).mul_f64(1.0 - self.drift);
        let was = self
            .deadline
            .fetch_max((sent + keep).as_nanos() as u64, Ordering::AcqRel);
        if was == 0 {
            self.changed.send_replace(self.generation());
        }
    }

    /// The lease is gone: nothing of its generation is served again.
    fn end(&self, why: &str) {
        self.deadline.store(0, Ordering::Release);
        tracing::warn!(lease = %format!("{:x}", self.lease()), "leasing session ended: {why}; a new one starts");
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.lease.store(0, Ordering::Release);
        self.changed.send_replace(self.generation());
    }

    /// Keeps a session alive for as long as the proxy runs: grants a lease, renews it every
    /// third of its TTL, and starts over with a new lease once the cluster says the old one
    /// is gone.
    pub async fn run(self: Arc<Self>, up: Arc<Upstream>, metrics: Arc<Metrics>) {
        loop {
            let sent = now();
            let (i, ch) = up.channel();
            let req = LeaseGrantRequest {
                ttl: self.ttl.as_secs().max(1) as i64,
                id: 0,
            };
            metrics.upstream.inc();
            let granted = match LeaseClient::new(ch).lease_grant(req).await {
                Ok(r) => r.into_inner(),
                Err(s) => {
                    up.failed(i, &s);
                    tracing::debug!("leasing session: grant failed: {}", s.message());
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            up.saw(granted.header.as_ref());
            let g = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
            self.lease.store(granted.id, Ordering::Release);
            self.extend(sent, granted.ttl);
            self.changed.send_replace(g);
            tracing::info!(lease = %format!("{:x}", granted.id), ttl = granted.ttl, "leasing session started");
            let why = self
                .keep_alive(&up, &metrics, granted.id, granted.ttl)
                .await;
            self.end(&why);
        }
    }

    /// Renews `lease` until the cluster says it is gone (why).
    async fn keep_alive(&self, up: &Upstream, metrics: &Metrics, lease: i64, ttl: i64) -> String {
        let every = Duration::from_secs(ttl.max(1) as u64) / 3;
        loop {
            let (i, ch) = up.channel();
            let (tx, rx) = mpsc::channel(1);
            metrics.upstream.inc();
            let stream = LeaseClient::new(ch)
                .lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await;
            let mut answers = match stream {
                Ok(s) => s.into_inner(),
                Err(s) => {
                    up.failed(i, &s);
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            loop {
                let sent = now();
                if tx.send(LeaseKeepAliveRequest { id: lease }).await.is_err() {
                    break;
                }
                // A keep-alive not answered within a third of the TTL is as good as lost:
                // the next one goes out on a new stream.
                match tokio::time::timeout(every, answers.message()).await {
                    Ok(Ok(Some(r))) if r.ttl > 0 => {
                        up.saw(r.header.as_ref());
                        self.extend(sent, r.ttl);
                        tokio::time::sleep(every.saturating_sub(now().saturating_sub(sent))).await;
                    }
                    Ok(Ok(Some(_))) => return "the cluster no longer has the lease".into(),
                    Ok(Err(s)) if s.message().contains("requested lease not found") => {
                        return "the cluster no longer has the lease".into();
                    }
                    Ok(Err(s)) => {
                        up.failed(i, &s);
                        break;
                    }
                    Ok(Ok(None)) | Err(_) => break,
                }
            }
            tokio::time::sleep(RETRY).await;
        }
    }

    /// Revokes the session's lease (its leasing keys go with it): for a clean shutdown.
    pub async fn close(&self, up: &Upstream) {
        let lease = self.lease.swap(0, Ordering::AcqRel);
        self.deadline.store(0, Ordering::Release);
        self.generation.fetch_add(1, Ordering::AcqRel);
        if lease != 0 {
            let (_, ch) = up.channel();
            let _ = tokio::time::timeout(
                Duration::from_secs(2),
                LeaseClient::new(ch).lease_revoke(LeaseRevokeRequest { id: lease }),
            )
            .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_counts_from_the_send_less_the_drift_margin() {
        let s = Session::new(Duration::from_secs(10), 0.1);
        s.lease.store(7, Ordering::Release);
        s.generation.store(1, Ordering::Release);
        assert_eq!(s.current(), None, "no keep-alive answered yet");
        let sent = now() - Duration::from_secs(8);
        s.extend(sent, 10);
        // Sent 8 s ago, 10 s TTL, 10 % kept back: 1 s left.
        let left = s.left(1);
        assert!(
            left > Duration::from_millis(900) && left <= Duration::from_secs(1),
            "{left:?}"
        );
        assert_eq!(s.current(), Some((7, 1)));
        assert!(!s.valid(0), "another generation's entries are not valid");
        // An older keep-alive answered late does not shorten it.
        s.extend(sent - Duration::from_secs(5), 10);
        assert!(s.left(1) > Duration::from_millis(900));
        // Past the deadline: nothing is valid, though the lease may live on.
        let s2 = Session::new(Duration::from_secs(10), 0.1);
        s2.lease.store(7, Ordering::Release);
        s2.generation.store(1, Ordering::Release);
        s2.extend(now() - Duration::from_secs(20), 10);
        assert!(!s2.valid(1));
        assert_eq!(s2.current(), None);
        // A keep-alive answered later proves the lease alive again.
        s2.extend(now(), 10);
        assert!(s2.valid(1));
        s2.end("test");
        assert!(!s2.valid(1) && !s2.valid(2));
        assert_eq!(s2.current(), None);
    }

    #[test]
    fn the_clock_counts_forward() {
        let a = now();
        std::thread::sleep(Duration::from_millis(5));
        assert!(now() >= a + Duration::from_millis(5));
    }
}
