//! Keepalive and abuse limits: a quiet client is pinged and dropped if it does not answer, and
//! one that pings too often is sent away, as grpc-go's server (and so etcd) does; a client
//! that sends frames which do no work (resets of streams under way — the "rapid reset"
//! attack, CVE-2023-44487 —, streams refused or malformed, empty DATA or CONTINUATION frames,
//! SETTINGS or PRIORITY frames, header blocks of empty fields) faster than a budget allows is
//! sent away with ENHANCE_YOUR_CALM, as nghttp2 does. The budget refills with time and with
//! completed calls, and is kept for the client's address too, so neither pairing each reset
//! with a call nor reconnecting starts a client afresh.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Sleep;

use super::{conn_err, Conn, ConnError};
use crate::frame::{self, Reason};
use crate::guard::{self, Bucket};
use crate::{Config, Error, Fallback};

/// What a keepalive ping carries (the client echoes it).
const PING: [u8; 8] = *b"kvd-ping";
/// Strikes past which a client's pings end the connection (grpc-go's `maxPingStrikes`).
const MAX_PING_STRIKES: u32 = 2;
/// How often a client may ping while it has no stream open (grpc-go's `defaultPingTimeout`,
/// with etcd's `PermitWithoutStream: false`).
const PING_WITHOUT_STREAMS: Duration = Duration::from_secs(2 * 3600);

#[derive(Debug)]
pub(super) struct Liveness {
    /// Fires when a keepalive ping is due or overdue; `None` when keepalive is off.
    timer: Option<Pin<Box<Sleep>>>,
    /// The waker `timer` was last polled with: while it is the connection's and the timer has
    /// not fired, polling it again (at every wake-up of the connection, several a request)
    /// would only register the same waker again.
    timer_waker: Option<Waker>,
    interval: Duration,
    timeout: Duration,
    ping_min_interval: Duration,
    /// When the client last sent anything.
    last_read: Instant,
    /// When our keepalive ping went out, until it is acknowledged.
    ping_sent: Option<Instant>,
    last_client_ping: Option<Instant>,
    strikes: u32,
    /// HEADERS or DATA went out since the client's last ping: its next ping is no strike.
    answered: bool,
    /// The budget for frames that do no work.
    waste: Bucket,
    /// Some were sent: completed calls then forgive the client's address too.
    wasted: bool,
}

impl Liveness {
    pub(super) fn new(cfg: &Config) -> Liveness {
        let now = Instant::now();
        Liveness {
            timer: cfg
                .keepalive_interval
                .filter(|d| !d.is_zero())
                .map(|d| Box::pin(tokio::time::sleep_until((now + d).into()))),
            timer_waker: None,
            interval: cfg.keepalive_interval.unwrap_or_default(),
            timeout: cfg.keepalive_timeout,
            ping_min_interval: cfg.ping_min_interval,
            last_read: now,
            ping_sent: None,
            last_client_ping: None,
            strikes: 0,
            answered: false,
            waste: Bucket::full(guard::CONN_WASTE),
            wasted: false,
        }
    }

    /// The client sent something.
    pub(super) fn read(&mut self) {
        if self.timer.is_some() {
            self.last_read = Instant::now();
        }
    }

    /// HEADERS or DATA went out.
    pub(super) fn answered(&mut self) {
        self.answered = true;
    }
}

impl<T, S> Conn<T, S>
where
    T: AsyncRead + AsyncWrite + Unpin,
    S: Fallback,
{
    /// Sends a keepalive ping when the client has been quiet for the interval, and fails the
    /// connection when one went unanswered for the timeout. Whether it did anything.
    pub(super) fn poll_keepalive(&mut self, cx: &mut Context<'_>) -> bool {
        let l = &mut self.live;
        let Some(timer) = &mut l.timer else {
            return false;
        };
        // A timer fires (is elapsed) before it wakes the waker it holds.
        let registered = l
            .timer_waker
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()));
        if registered && !timer.is_elapsed() {
            return false;
        }
        l.timer_waker = Some(cx.waker().clone());
        if timer.as_mut().poll(cx).is_pending() {
            return false;
        }
        let now = Instant::now();
        let next = match l.ping_sent {
            Some(sent) if now >= sent + l.timeout => {
                tracing::debug!("keepalive ping unanswered: closing the connection");
                self.failed = Some(Error::KeepaliveTimeout(l.timeout));
                return true;
            }
            Some(sent) => sent + l.timeout,
            None if now >= l.last_read + l.interval => {
                frame::head(&mut self.out, 8, frame::PING, 0, 0);
                self.out.extend_from_slice(&PING);
                l.ping_sent = Some(now);
                now + l.timeout
            }
            None => l.last_read + l.interval,
        };
        timer.as_mut().reset(next.into());
        // Registers the timer again.
        let _ = timer.as_mut().poll(cx);
        true
    }

    /// A PING from the client: acknowledged, and checked against the ping policy.
    pub(super) fn on_client_ping(&mut self, payload: &[u8]) -> Result<(), ConnError> {
        frame::ping_ack(&mut self.acks, payload);
        let l = &mut self.live;
        let now = Instant::now();
        let last = l.last_client_ping.replace(now);
        if std::mem::take(&mut l.answered) {
            l.strikes = 0;
            return Ok(());
        }
        let min = if self.streams.is_empty() {
            PING_WITHOUT_STREAMS
        } else {
            l.ping_min_interval
        };
        if last.is_some_and(|last| now < last + min) {
            l.strikes += 1;
        }
        if l.strikes > MAX_PING_STRIKES {
            return conn_err(Reason::ENHANCE_YOUR_CALM, "too_many_pings");
        }
        Ok(())
    }

    /// A PING acknowledgement: our keepalive ping was answered.
    pub(super) fn on_ping_ack(&mut self, payload: &[u8]) {
        if payload == PING {
            self.live.ping_sent = None;
        }
    }

    /// `n` frames that did no work (of the kind `what` names, the GOAWAY's text should the
    /// budget of the connection or of its client's address be spent).
    pub(super) fn waste(&mut self, n: f64, what: &'static str) -> Result<(), ConnError> {
        let now = Instant::now();
        self.live.wasted = true;
        let conn_ok = self
            .live
            .waste
            .take(n, now, guard::CONN_WASTE, guard::CONN_WASTE_PER_SEC);
        let addr_ok = self
            .peer
            .is_none_or(|p| self.cfg.guard.waste(p.ip(), n, now));
        if conn_ok && addr_ok {
            return Ok(());
        }
        conn_err(Reason::ENHANCE_YOUR_CALM, what)
    }

    /// A call completed: it forgives part of a wasted frame.
    pub(super) fn completed(&mut self) {
        let n = 1.0 / guard::CALLS_PER_TOKEN;
        self.live.waste.give(n, guard::CONN_WASTE);
        if let Some(p) = self.peer.filter(|_| self.live.wasted) {
            self.cfg.guard.forgive(p.ip(), n);
        }
    }
}
