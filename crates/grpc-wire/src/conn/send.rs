//! Writing: answers, bridged streams' output within the peer's windows, resets.

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};

use super::{Conn, Kind, Stream, RESETS_REMEMBERED};
use crate::bridge::Out;
use crate::frame::{self, Reason};
use crate::grpc;
use crate::hpack::Encoder;
use crate::metrics;
use crate::request;
use crate::Fallback;

impl<T, S> Conn<T, S>
where
    T: AsyncRead + AsyncWrite + Unpin,
    S: Fallback,
{
    /// Resets stream `id` (a stream error): RST_STREAM, and its call or task is dropped.
    pub(super) fn reset(&mut self, id: u32, why: Reason) {
        self.send_reset(id, why);
        if let Some(s) = self.remove_stream(id) {
            self.forget(&s, why);
        }
    }

    /// RST_STREAM for stream `id`, remembered so the frames already on their way are ignored.
    pub(super) fn send_reset(&mut self, id: u32, why: Reason) {
        frame::rst_stream(&mut self.out, id, why);
        if self.we_reset.len() == RESETS_REMEMBERED {
            self.we_reset.pop_front();
        }
        self.we_reset.push_back(id);
    }

    /// Whether we reset closed stream `id` lately.
    pub(super) fn we_reset(&self, id: u32) -> bool {
        self.we_reset.contains(&id)
    }

    /// A stream left the table: its call or task stops.
    pub(super) fn forget(&self, s: &Stream, why: Reason) {
        match &s.kind {
            Kind::Bridged(io) => io.reset(why),
            Kind::Called(Some(c)) => c.cancel(),
            _ => {}
        }
    }

    /// Answers unary call `id`: headers, the message and trailers, in one go when the
    /// windows allow (they nearly always do).
    pub(super) fn answer(&mut self, id: u32, r: Result<Bytes, tonic::Status>) {
        if !self.streams.contains_key(&id) {
            return;
        }
        match &r {
            Ok(msg) => {
                self.handled(id, 0);
                if let Some(calls) = &self.cfg.calls {
                    calls.sent(grpc::PREFIX_LEN + msg.len());
                }
            }
            Err(status) => self.handled(id, status.code() as u16),
        }
        let msg = match r {
            Ok(msg) => msg,
            Err(status) => {
                let fields = grpc::status_fields(&status);
                self.write_headers(id, true, |enc, out| {
                    enc.fixed(out, b":status", b"200", false);
                    enc.fixed(out, b"content-type", b"application/grpc", true);
                    header_map(enc, out, &fields);
                });
                if let Some(s) = self.streams.get_mut(&id) {
                    s.local_closed = true;
                }
                return self.finish_if_done(id);
            }
        };
        self.write_headers(id, false, |enc, out| {
            enc.fixed(out, b":status", b"200", false);
            enc.fixed(out, b"content-type", b"application/grpc", true);
        });
        let total = grpc::PREFIX_LEN + msg.len();
        let s = self.streams.get_mut(&id).expect("checked above");
        s.local_closed = true;
        if total as i64 <= self.send_window.min(s.send_window) && total <= self.peer_max_frame {
            s.send_window -= total as i64;
            self.send_window -= total as i64;
            frame::head(&mut self.out, total, frame::DATA, 0, id);
            self.out.extend_from_slice(&grpc::prefix(msg.len()));
            self.out.extend_from_slice(&msg);
            self.write_grpc_ok(id);
            return self.finish_if_done(id);
        }
        let mut data = Vec::with_capacity(total);
        data.extend_from_slice(&grpc::prefix(msg.len()));
        data.extend_from_slice(&msg);
        self.pending_bytes += total;
        s.pending.push_back(Out::Data(data.into()));
        s.pending.push_back(Out::GrpcOk);
        self.flush_stream(id);
    }

    /// Counts call `id` (if counted and not yet) as ended with status `code`.
    pub(super) fn handled(&mut self, id: u32, code: u16) {
        let Some(calls) = &self.cfg.calls else {
            return;
        };
        if let Some((m, since)) = self.streams.get_mut(&id).and_then(|s| s.call.take()) {
            calls.handled(m, code, since);
        }
    }

    /// The trailers of a successful call.
    pub(super) fn write_grpc_ok(&mut self, id: u32) {
        self.write_headers(id, true, |enc, out| {
            enc.fixed(out, b"grpc-status", b"0", true);
        });
    }

    /// Frames what a bridged stream's task produced, and credits what its body consumed.
    pub(super) fn pump(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        let Kind::Bridged(io) = &s.kind else {
            return;
        };
        let io = io.clone();
        let mut items = std::mem::take(&mut self.scratch);
        let credit = io.take(&mut items);
        if credit > 0 && !s.remote_closed {
            frame::window_update(&mut self.out, id, credit as u32);
            s.recv_window += credit as i64;
        }
        if credit > 0 {
            // Read by the task: no longer held here.
            self.charge(id, -(credit as isize));
        }
        while let Some(item) = items.pop_front() {
            match item {
                Out::Head { parts, end } => {
                    if end {
                        let code = metrics::status_code(&parts.headers);
                        self.handled(id, code.unwrap_or(metrics::UNKNOWN));
                    }
                    self.write_headers(id, end, |enc, out| {
                        enc.field(out, b":status", parts.status.as_str().as_bytes(), false);
                        header_map(enc, out, &parts.headers);
                    });
                    if end {
                        if let Some(s) = self.streams.get_mut(&id) {
                            s.local_closed = true;
                        }
                    }
                }
                Out::Reset(why) => {
                    items.clear();
                    self.reset(id, why);
                }
                other => {
                    if let Some(s) = self.streams.get_mut(&id) {
                        s.pending.push_back(other);
                    }
                }
            }
        }
        self.scratch = items;
        self.flush_stream(id);
    }

    /// Sends what stream `id` has pending, as far as the windows allow.
    pub(super) fn flush_stream(&mut self, id: u32) {
        loop {
            let Some(s) = self.streams.get_mut(&id) else {
                return;
            };
            match s.pending.front_mut() {
                None => break,
                Some(Out::Data(b)) => {
                    let room = self.send_window.min(s.send_window).max(0) as usize;
                    let n = b.len().min(room).min(self.peer_max_frame);
                    if n == 0 && !b.is_empty() {
                        if !s.blocked {
                            s.blocked = true;
                            self.blocked.push_back(id);
                        }
                        return;
                    }
                    let chunk = b.split_to(n);
                    if b.is_empty() {
                        s.pending.pop_front();
                    }
                    s.send_window -= n as i64;
                    self.send_window -= n as i64;
                    frame::head(&mut self.out, n, frame::DATA, 0, id);
                    self.out.extend_from_slice(&chunk);
                    self.live.answered();
                    match &s.kind {
                        Kind::Bridged(io) => {
                            io.sent(n);
                            if let (Some(calls), Some(_)) = (&self.cfg.calls, s.call) {
                                calls.sent(n);
                            }
                        }
                        _ => self.pending_bytes -= n,
                    }
                }
                Some(Out::Trailers(_)) => {
                    let Some(Out::Trailers(t)) = s.pending.pop_front() else {
                        unreachable!("matched above")
                    };
                    s.local_closed = true;
                    let code = metrics::status_code(&t).unwrap_or(metrics::UNKNOWN);
                    self.handled(id, code);
                    self.write_headers(id, true, |enc, out| header_map(enc, out, &t));
                }
                Some(Out::GrpcOk) => {
                    s.pending.pop_front();
                    s.local_closed = true;
                    self.write_grpc_ok(id);
                }
                Some(_) => {
                    // The body's end (a Head or Reset is never queued).
                    s.pending.pop_front();
                    s.local_closed = true;
                    frame::head(&mut self.out, 0, frame::DATA, frame::END_STREAM, id);
                    self.handled(id, metrics::UNKNOWN);
                }
            }
        }
        self.finish_if_done(id);
    }

    /// Removes stream `id` once its response is out and its request is in. A unary call
    /// answered before its request ended (a message over the limit) tells the client to stop
    /// sending with RST_STREAM(NO_ERROR) (RFC 9113, 8.1); a bridged stream is kept until the
    /// request ends, its data discarded, so content-length and flow control are still checked.
    pub(super) fn finish_if_done(&mut self, id: u32) {
        let Some(s) = self.streams.get(&id) else {
            return;
        };
        if !s.local_closed || !s.pending.is_empty() {
            return;
        }
        if !s.remote_closed {
            if matches!(s.kind, Kind::Bridged(_)) {
                return;
            }
            self.send_reset(id, Reason::NO_ERROR);
        }
        self.remove_stream(id);
        self.completed();
    }

    /// Windows grew: streams waiting for them go on.
    pub(super) fn unblock(&mut self) {
        for _ in 0..self.blocked.len() {
            let Some(id) = self.blocked.pop_front() else {
                break;
            };
            if let Some(s) = self.streams.get_mut(&id) {
                s.blocked = false;
                self.flush_stream(id);
            }
            if self.send_window <= 0 {
                break;
            }
        }
    }

    /// Appends a header block for stream `id` as HEADERS (+ CONTINUATION) frames no larger
    /// than the peer takes.
    pub(super) fn write_headers(
        &mut self,
        id: u32,
        end: bool,
        fields: impl FnOnce(&mut Encoder, &mut Vec<u8>),
    ) {
        self.live.answered();
        if let Some(s) = self.streams.get_mut(&id) {
            s.answered = true;
        }
        let at = frame::begin(&mut self.out, frame::HEADERS, 0, id);
        self.enc.begin(&mut self.out);
        fields(&mut self.enc, &mut self.out);
        let block_len = self.out.len() - at - frame::HEAD_LEN;
        let flags = if end { frame::END_STREAM } else { 0 };
        if block_len <= self.peer_max_frame {
            self.out[at + 4] = flags | frame::END_HEADERS;
            frame::finish(&mut self.out, at);
            return;
        }
        let rest = self
            .out
            .split_off(at + frame::HEAD_LEN + self.peer_max_frame);
        self.out[at + 4] = flags;
        frame::finish(&mut self.out, at);
        let mut chunks = rest.chunks(self.peer_max_frame).peekable();
        while let Some(c) = chunks.next() {
            let last = chunks.peek().is_none();
            let f = if last { frame::END_HEADERS } else { 0 };
            frame::head(&mut self.out, c.len(), frame::CONTINUATION, f, id);
            self.out.extend_from_slice(c);
        }
    }
}

/// Appends a header map's fields, leaving out HTTP/1.1's connection-specific ones.
pub(super) fn header_map(enc: &mut Encoder, out: &mut Vec<u8>, h: &http::HeaderMap) {
    for (n, v) in h {
        let name = n.as_str().as_bytes();
        if !request::is_connection_specific(name) {
            enc.field(out, name, v.as_bytes(), is_cached(n, v));
        }
    }
}

/// Response fields that repeat unchanged on every call: worth a dynamic-table entry.
fn is_cached(n: &http::HeaderName, v: &http::HeaderValue) -> bool {
    (n == http::header::CONTENT_TYPE && v.as_bytes().starts_with(b"application/grpc"))
        || (n.as_str() == "grpc-status" && v.as_bytes() == b"0")
}
