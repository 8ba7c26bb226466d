//! What a connection holds for its client, and its bounds ([`crate::Config::max_conn_buffer`],
//! [`crate::Config::max_total_buffer`]).
//!
//! Two sides are counted. Unsent output: frames waiting for the socket, unary answers queued
//! for the peer's flow-control window, and what bridged tasks pushed and the connection has
//! not framed. Past the bound the connection stops running its calls (a call's answer is made
//! when it is polled), so requests wait rather than answers pile up: backpressure, never an
//! error. Request state: each open stream's `cost` (a fixed part, its header block, its body
//! not yet read). Past the bound new streams are refused, and data for an unfinished request
//! other than the oldest refuses that request, so the oldest can always complete.

use std::task::Context;

use tokio::io::{AsyncRead, AsyncWrite};

use super::{Conn, ConnError, Kind, Stream};
use crate::frame::Reason;
use crate::metrics;
use crate::{Fallback, FAIR_SHARE};

/// A stream's fixed cost: its entry, its call or its task's request (estimates on the high
/// side, so that many empty streams count for what they take).
pub(super) const UNARY_COST: usize = 512;
pub(super) const BRIDGED_COST: usize = 4096;

impl<T, S> Conn<T, S>
where
    T: AsyncRead + AsyncWrite + Unpin,
    S: Fallback,
{
    /// Response bytes not yet written to the socket.
    fn unsent(&self) -> usize {
        self.out.len() - self.written + self.acks.len() + self.pending_bytes + self.shared.unsent()
    }

    /// Everything this connection holds for its client.
    fn held(&self) -> usize {
        self.unsent() + self.req_bytes
    }

    /// The server as a whole holds too much, and this connection more than its fair share
    /// (counting what it holds now, not what it last published).
    fn over_total(&self) -> bool {
        let held = self.held();
        let others = self.cfg.guard.held().saturating_sub(self.published);
        others + held > self.cfg.max_total_buffer && held > FAIR_SHARE
    }

    /// The unsent output is past its bound: calls are not run on.
    pub(super) fn output_full(&self) -> bool {
        self.unsent() >= self.cfg.max_conn_buffer || self.over_total()
    }

    /// The request state is past its bound: new streams are refused.
    pub(super) fn requests_full(&self) -> bool {
        self.req_bytes >= self.cfg.max_conn_buffer || self.over_total()
    }

    /// Publishes what the connection holds to the guard, and pauses or resumes its calls and
    /// tasks accordingly. Whether they resumed (the turn goes round again).
    pub(super) fn settle(&mut self, cx: &mut Context<'_>) -> bool {
        let held = self.held();
        if held != self.published {
            self.cfg
                .guard
                .publish(self.published, held, self.cfg.max_total_buffer);
            self.published = held;
        }
        let full = self.output_full();
        if full && self.over_total() {
            // Woken when the total falls: another connection's doing.
            self.cfg.guard.wait(cx.waker());
        }
        self.shared.set_paused(full);
        let resumed = self.paused && !full;
        if full && !self.paused {
            self.cfg.guard.paused();
        }
        self.paused = full;
        resumed
    }

    /// Charges stream `id` `n` more bytes of request state (`n` may be negative).
    pub(super) fn charge(&mut self, id: u32, n: isize) {
        if let Some(s) = self.streams.get_mut(&id) {
            let cost = s.cost.saturating_add_signed(n);
            self.req_bytes = self.req_bytes - s.cost + cost;
            s.cost = cost;
        }
    }

    /// Adds a stream to the table, charged `cost`.
    pub(super) fn insert_stream(&mut self, id: u32, mut s: Stream, cost: usize) {
        s.cost = cost;
        self.req_bytes += cost;
        self.streams.insert(id, s);
    }

    /// Takes a stream out of the table, and out of the counts.
    pub(super) fn remove_stream(&mut self, id: u32) -> Option<Stream> {
        let s = self.streams.remove(&id)?;
        // A call that went without a status: its client cancelled (or the connection ended).
        if let (Some(calls), Some((m, since))) = (&self.cfg.calls, s.call) {
            calls.handled(m, metrics::CANCELED, since);
        }
        self.req_bytes -= s.cost;
        if matches!(s.kind, Kind::Unary { .. } | Kind::Called(_)) {
            let queued: usize = s.pending.iter().map(|o| o.data_len()).sum();
            self.pending_bytes -= queued;
        }
        if self.oldest == Some(id) {
            self.oldest = None;
        }
        if self.streams.is_empty() && self.streams.capacity() > 1024 {
            // A burst of streams is over: its table goes back to the allocator.
            self.streams.shrink_to_fit();
        }
        Some(s)
    }

    /// Refuses stream `id` (REFUSED_STREAM: nothing of it was processed, so the client may
    /// retry it), which counts as a wasted frame.
    pub(super) fn refuse(&mut self, id: u32) -> Result<(), ConnError> {
        self.cfg.guard.refused();
        self.reset(id, Reason::REFUSED_STREAM);
        self.waste(1.0, "too_many_refused_streams")
    }

    /// Whether unary request `id`, still receiving its body, may go on while the request
    /// state is past its bound: only the oldest such request may.
    pub(super) fn may_grow(&mut self, id: u32) -> bool {
        let unfinished = |s: &Stream| matches!(s.kind, Kind::Unary { .. }) && !s.remote_closed;
        let valid = self
            .oldest
            .is_some_and(|o| self.streams.get(&o).is_some_and(unfinished));
        if !valid {
            self.oldest = self
                .streams
                .iter()
                .filter(|(_, s)| unfinished(s))
                .map(|(id, _)| *id)
                .min();
        }
        self.oldest == Some(id)
    }
}
