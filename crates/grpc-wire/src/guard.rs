//! What the connections of one server share to stay served under abuse: the bytes they hold
//! together (unsent responses and request state, see [`crate::Config::max_total_buffer`]),
//! each client address's budget for frames that do no work (so that reconnecting does not
//! start a client afresh), and the counts of what was refused, for `/metrics` and the log.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::Waker;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::frame::Reason;

/// Frames that do no work a connection may send in a burst (resets of streams under way,
/// refused or malformed streams, empty DATA and CONTINUATION frames, SETTINGS and PRIORITY
/// frames, header blocks of empty fields), and how many it is forgiven each second; every
/// 16 completed calls forgive one more.
pub(crate) const CONN_WASTE: f64 = 1000.0;
pub(crate) const CONN_WASTE_PER_SEC: f64 = 100.0;
/// The same for all connections from one client address together.
pub(crate) const ADDR_WASTE: f64 = 4000.0;
pub(crate) const ADDR_WASTE_PER_SEC: f64 = 400.0;
/// Completed calls that forgive one wasted frame.
pub(crate) const CALLS_PER_TOKEN: f64 = 16.0;
/// Client addresses whose budgets are remembered; beyond, those back at full budget go.
const ADDRS_REMEMBERED: usize = 4096;
/// At most one log line a second about clients sent away; the rest are counted in it.
const LOG_EVERY: Duration = Duration::from_secs(1);

/// The client's address, which the server puts in a connection's extensions: the budget for
/// wasted frames is kept per address as well as per connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteAddr(pub SocketAddr);

/// A token bucket: spent by wasted frames, refilled with time and with completed calls.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    pub(crate) fn full(cap: f64) -> Bucket {
        Bucket {
            tokens: cap,
            at: Instant::now(),
        }
    }

    /// Takes `n` tokens (refilling at `rate` a second up to `cap` first); false when there
    /// were not enough.
    pub(crate) fn take(&mut self, n: f64, now: Instant, cap: f64, rate: f64) -> bool {
        let secs = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + secs * rate).min(cap);
        self.at = now;
        self.tokens -= n;
        self.tokens >= 0.0
    }

    pub(crate) fn give(&mut self, n: f64, cap: f64) {
        self.tokens = (self.tokens + n).min(cap);
    }

    fn is_full(&self, now: Instant, cap: f64, rate: f64) -> bool {
        let secs = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens + secs * rate >= cap
    }
}

/// Why a connection was sent away, as counted in [`Stats::sent_away`].
const KINDS: [&str; 15] = [
    "NO_ERROR",
    "PROTOCOL_ERROR",
    "INTERNAL_ERROR",
    "FLOW_CONTROL_ERROR",
    "SETTINGS_TIMEOUT",
    "STREAM_CLOSED",
    "FRAME_SIZE_ERROR",
    "REFUSED_STREAM",
    "CANCEL",
    "COMPRESSION_ERROR",
    "CONNECT_ERROR",
    "ENHANCE_YOUR_CALM",
    "INADEQUATE_SECURITY",
    "HTTP_1_1_REQUIRED",
    "keepalive_timeout",
];
const KEEPALIVE: usize = 14;

/// Shared by the connections served with one [`crate::Config`].
#[derive(Debug)]
pub struct Guard {
    /// Bytes all connections hold (each publishes its own at every turn).
    held: AtomicUsize,
    /// Connections waiting for `held` to fall below the total bound.
    waiters: Mutex<Vec<Waker>>,
    addrs: Mutex<HashMap<IpAddr, Bucket>>,
    sent_away: [AtomicU64; KINDS.len()],
    refused: AtomicU64,
    pauses: AtomicU64,
    log: Mutex<LogLimit>,
}

#[derive(Debug)]
struct LogLimit {
    last: Option<Instant>,
    suppressed: u64,
}

impl Default for Guard {
    fn default() -> Guard {
        Guard {
            held: AtomicUsize::new(0),
            waiters: Mutex::new(Vec::new()),
            addrs: Mutex::new(HashMap::new()),
            sent_away: Default::default(),
            refused: AtomicU64::new(0),
            pauses: AtomicU64::new(0),
            log: Mutex::new(LogLimit {
                last: None,
                suppressed: 0,
            }),
        }
    }
}

/// A snapshot of a [`Guard`]'s counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes the connections hold now: unsent responses and request state.
    pub held_bytes: usize,
    /// Connections sent away (a GOAWAY with an error, or no answer to a keepalive ping), by
    /// HTTP/2 error code name or `keepalive_timeout`; only the kinds seen.
    pub sent_away: Vec<(&'static str, u64)>,
    /// Streams refused (REFUSED_STREAM) because a connection or the server held too much.
    pub refused_streams: u64,
    /// Times a connection stopped reading new requests until its unsent responses drained.
    pub backpressure_pauses: u64,
}

impl Stats {
    /// The counts as Prometheus text, each metric's name starting with `prefix`.
    pub fn prometheus(&self, prefix: &str) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let mut one = |name: &str, kind: &str, help: &str, samples: &[(String, u64)]| {
            let _ = writeln!(out, "# HELP {prefix}_{name} {help}");
            let _ = writeln!(out, "# TYPE {prefix}_{name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(out, "{prefix}_{name}{labels} {v}");
            }
        };
        one(
            "buffered_bytes",
            "gauge",
            "Bytes the client connections hold: unsent responses and request state.",
            &[(String::new(), self.held_bytes as u64)],
        );
        let away: Vec<(String, u64)> = self
            .sent_away
            .iter()
            .map(|(k, n)| (format!("{{reason=\"{k}\"}}"), *n))
            .collect();
        one(
            "connections_sent_away_total",
            "counter",
            "Client connections ended by the server for a protocol error, abuse or a keepalive ping unanswered, by reason.",
            &away,
        );
        one(
            "streams_refused_total",
            "counter",
            "Streams refused because a connection or the server held too much.",
            &[(String::new(), self.refused_streams)],
        );
        one(
            "backpressure_pauses_total",
            "counter",
            "Times a connection stopped running its calls until its unsent responses drained.",
            &[(String::new(), self.backpressure_pauses)],
        );
        out
    }
}

impl Guard {
    pub fn stats(&self) -> Stats {
        Stats {
            held_bytes: self.held.load(Ordering::Relaxed),
            sent_away: KINDS
                .iter()
                .zip(&self.sent_away)
                .map(|(k, n)| (*k, n.load(Ordering::Relaxed)))
                .filter(|(_, n)| *n > 0)
                .collect(),
            refused_streams: self.refused.load(Ordering::Relaxed),
            backpressure_pauses: self.pauses.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// A connection's share went from `was` to `now` bytes; when that brings the total under
    /// `limit`, the connections waiting for it go on.
    pub(crate) fn publish(&self, was: usize, now: usize, limit: usize) {
        if now >= was {
            self.held.fetch_add(now - was, Ordering::Relaxed);
            return;
        }
        let before = self.held.fetch_sub(was - now, Ordering::Relaxed);
        if before > limit && before - (was - now) <= limit {
            for w in self.waiters.lock().drain(..) {
                w.wake();
            }
        }
    }

    /// Wakes `w` once the total falls under its bound.
    pub(crate) fn wait(&self, w: &Waker) {
        let mut ws = self.waiters.lock();
        if !ws.iter().any(|x| x.will_wake(w)) {
            ws.push(w.clone());
        }
    }

    pub(crate) fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn paused(&self) {
        self.pauses.fetch_add(1, Ordering::Relaxed);
    }

    /// Spends `n` of address `ip`'s budget; false when it is spent.
    pub(crate) fn waste(&self, ip: IpAddr, n: f64, now: Instant) -> bool {
        let mut addrs = self.addrs.lock();
        if addrs.len() >= ADDRS_REMEMBERED && !addrs.contains_key(&ip) {
            addrs.retain(|_, b| !b.is_full(now, ADDR_WASTE, ADDR_WASTE_PER_SEC));
            if addrs.len() >= ADDRS_REMEMBERED {
                // All busy wasting: forget one rather than grow.
                if let Some(k) = addrs.keys().next().copied() {
                    addrs.remove(&k);
                }
            }
        }
        addrs
            .entry(ip)
            .or_insert_with(|| Bucket::full(ADDR_WASTE))
            .take(n, now, ADDR_WASTE, ADDR_WASTE_PER_SEC)
    }

    /// Completed calls from `ip` forgive some of its waste.
    pub(crate) fn forgive(&self, ip: IpAddr, n: f64) {
        if let Some(b) = self.addrs.lock().get_mut(&ip) {
            b.give(n, ADDR_WASTE);
        }
    }

    /// A connection was sent away: counted, and logged (at most once a second).
    pub(crate) fn sent_away(&self, peer: Option<SocketAddr>, reason: Option<Reason>, why: &str) {
        let kind = reason.map_or(KEEPALIVE, |r| (r.0 as usize).min(KEEPALIVE - 1));
        self.sent_away[kind].fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut log = self.log.lock();
        if log.last.is_some_and(|t| now < t + LOG_EVERY) {
            log.suppressed += 1;
            return;
        }
        let more = std::mem::take(&mut log.suppressed);
        log.last = Some(now);
        drop(log);
        let peer = peer.map_or_else(|| "unknown".to_owned(), |p| p.to_string());
        tracing::warn!(
            client = %peer,
            reason = KINDS[kind],
            "sent a client connection away: {why} ({more} more since the last such line)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_refills_with_time_up_to_its_cap() {
        let t0 = Instant::now();
        let mut b = Bucket::full(10.0);
        assert!(b.take(10.0, t0, 10.0, 5.0));
        assert!(!b.take(1.0, t0, 10.0, 5.0));
        // One second later, 5 more (less the one overdrawn).
        let t1 = t0 + Duration::from_secs(1);
        assert!(b.take(4.0, t1, 10.0, 5.0));
        assert!(!b.take(0.5, t1, 10.0, 5.0));
        let t2 = t1 + Duration::from_secs(100);
        assert!(b.is_full(t2, 10.0, 5.0));
        assert!(b.take(10.0, t2, 10.0, 5.0));
        b.give(3.0, 10.0);
        assert!(b.take(3.0, t2, 10.0, 5.0));
    }

    #[test]
    fn an_address_budget_outlives_its_connections() {
        let g = Guard::default();
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let now = Instant::now();
        assert!(g.waste(ip, ADDR_WASTE, now));
        assert!(!g.waste(ip, 1.0, now));
        let other: IpAddr = "192.0.2.2".parse().unwrap();
        assert!(g.waste(other, 1.0, now));
    }

    #[test]
    fn the_total_wakes_its_waiters_when_it_falls_under_the_bound() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        struct Flag(AtomicBool);
        impl std::task::Wake for Flag {
            fn wake(self: Arc<Self>) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let g = Guard::default();
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        g.publish(0, 200, 100);
        g.wait(&Waker::from(flag.clone()));
        g.publish(200, 150, 100);
        assert!(!flag.0.load(Ordering::SeqCst));
        g.publish(150, 50, 100);
        assert!(flag.0.load(Ordering::SeqCst));
        assert_eq!(g.stats().held_bytes, 50);
    }

    #[test]
    fn sent_away_is_counted_by_reason() {
        let g = Guard::default();
        g.sent_away(None, Some(Reason::ENHANCE_YOUR_CALM), "too_many_resets");
        g.sent_away(None, Some(Reason::ENHANCE_YOUR_CALM), "too_many_resets");
        g.sent_away(None, None, "no ping answer");
        assert_eq!(
            g.stats().sent_away,
            [("ENHANCE_YOUR_CALM", 2), ("keepalive_timeout", 1)]
        );
        let text = g.stats().prometheus("kvd_client");
        assert!(text
            .contains("kvd_client_connections_sent_away_total{reason=\"ENHANCE_YOUR_CALM\"} 2\n"));
        assert!(text.contains("kvd_client_buffered_bytes 0\n"));
    }
}
