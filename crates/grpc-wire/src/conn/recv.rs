//! Reading: each frame a client sends, checked against RFC 9113 and handled.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};

use super::budget::{BRIDGED_COST, UNARY_COST};
use super::{conn_err, Call, Cancel, Conn, ConnError, Kind, Partial, Stream, OUT_HIGH};
use crate::bridge::{self, RecvBody, StreamIo};
use crate::frame::{self, Head, Reason};
use crate::grpc;
use crate::Fallback;

/// Empty header fields a block may carry before they count as wasted frames (16 each).
const EMPTY_FIELDS_FREE: usize = 16;

impl<T, S> Conn<T, S>
where
    T: AsyncRead + AsyncWrite + Unpin,
    S: Fallback,
{
    /// Handles every whole frame in the read buffer (while the output is not too large).
    pub(super) fn handle_frames(&mut self) -> Result<(), ConnError> {
        let buf = std::mem::take(&mut self.rbuf);
        let r = self.frames(&buf);
        self.rbuf = buf;
        // Room for the frame that is partly read.
        if let Ok(Some(need)) = r {
            if self.rpos + need > self.rbuf.len() {
                self.rbuf.copy_within(self.rpos..self.rlen, 0);
                self.rlen -= self.rpos;
                self.rpos = 0;
                if need > self.rbuf.len() {
                    self.rbuf.resize(need, 0);
                }
            }
        }
        r.map(|_| ())
    }

    /// Returns the size of the frame waiting to be read whole, if one is.
    pub(super) fn frames(&mut self, buf: &[u8]) -> Result<Option<usize>, ConnError> {
        if !self.preface_read {
            let got = &buf[self.rpos..self.rlen];
            let n = got.len().min(frame::PREFACE.len());
            if got[..n] != frame::PREFACE[..n] {
                return conn_err(Reason::PROTOCOL_ERROR, "invalid connection preface");
            }
            if n < frame::PREFACE.len() {
                return Ok(None);
            }
            self.rpos += n;
            self.preface_read = true;
        }
        while self.rlen - self.rpos >= frame::HEAD_LEN {
            if self.out.len() >= OUT_HIGH {
                self.held_back = true;
                break;
            }
            let h = Head::parse(&buf[self.rpos..]);
            let max = (self.cfg.max_frame_size as usize)
                .clamp(frame::DEFAULT_MAX_FRAME, frame::MAX_MAX_FRAME);
            if h.len > max {
                return conn_err(
                    Reason::FRAME_SIZE_ERROR,
                    format!("frame of {} bytes over the limit of {max}", h.len),
                );
            }
            let end = self.rpos + frame::HEAD_LEN + h.len;
            if end > self.rlen {
                return Ok(Some(frame::HEAD_LEN + h.len));
            }
            let payload = &buf[self.rpos + frame::HEAD_LEN..end];
            self.rpos = end;
            self.frame(h, payload)?;
            if self.failed.is_some() || self.draining && self.streams.is_empty() {
                break;
            }
        }
        Ok(None)
    }

    pub(super) fn frame(&mut self, h: Head, payload: &[u8]) -> Result<(), ConnError> {
        if let Some(p) = &self.partial {
            if h.kind != frame::CONTINUATION || h.stream != p.stream {
                return conn_err(Reason::PROTOCOL_ERROR, "header block interrupted");
            }
        }
        if !self.settings_read {
            if h.kind != frame::SETTINGS || h.has(frame::ACK) {
                return conn_err(Reason::PROTOCOL_ERROR, "the first frame must be SETTINGS");
            }
            self.settings_read = true;
        }
        match h.kind {
            frame::DATA => self.on_data(h, payload),
            frame::HEADERS => self.on_headers(h, payload),
            frame::PRIORITY => self.on_priority(h, payload),
            frame::RST_STREAM => self.on_rst_stream(h, payload),
            frame::SETTINGS => self.on_settings(h, payload),
            frame::PUSH_PROMISE => conn_err(Reason::PROTOCOL_ERROR, "PUSH_PROMISE from a client"),
            frame::PING => self.on_ping(h, payload),
            frame::GOAWAY => self.on_goaway(h, payload),
            frame::WINDOW_UPDATE => self.on_window_update(h, payload),
            frame::CONTINUATION => self.on_continuation(h, payload),
            // Unknown frame types are ignored (RFC 9113, 4.1).
            _ => Ok(()),
        }
    }

    pub(super) fn on_data(&mut self, h: Head, payload: &[u8]) -> Result<(), ConnError> {
        if h.stream == 0 {
            return conn_err(Reason::PROTOCOL_ERROR, "DATA on stream 0");
        }
        let len = h.len as i64;
        self.recv_window -= len;
        if self.recv_window < 0 {
            return conn_err(
                Reason::FLOW_CONTROL_ERROR,
                "DATA beyond the connection window",
            );
        }
        // The connection window is credited at once: each stream's window bounds what it
        // may have buffered.
        self.recv_unacked += len;
        if self.recv_unacked >= self.cfg.conn_window as i64 / 2 {
            frame::window_update(&mut self.out, 0, self.recv_unacked as u32);
            self.recv_window += self.recv_unacked;
            self.recv_unacked = 0;
        }
        let (a, b) = frame::unpad(&h, payload)?;
        let data = &payload[a..b];
        let end = h.has(frame::END_STREAM);
        if data.is_empty() && !end {
            self.waste(1.0, "too_many_empty_frames")?;
        }
        let Some(s) = self.streams.get_mut(&h.stream) else {
            if h.stream > self.last_stream {
                return conn_err(Reason::PROTOCOL_ERROR, "DATA on an idle stream");
            }
            if !self.we_reset(h.stream) {
                self.reset(h.stream, Reason::STREAM_CLOSED);
            }
            return Ok(());
        };
        if s.remote_closed {
            self.reset(h.stream, Reason::STREAM_CLOSED);
            return Ok(());
        }
        if let (Some(calls), Some(_)) = (&self.cfg.calls, s.call) {
            calls.received(data.len());
        }
        s.recv_window -= len;
        if s.recv_window < 0 {
            self.reset(h.stream, Reason::FLOW_CONTROL_ERROR);
            return Ok(());
        }
        s.received += data.len() as u64;
        if s.content_length
            .is_some_and(|n| s.received > n || end && s.received != n)
        {
            self.reset(h.stream, Reason::PROTOCOL_ERROR);
            return Ok(());
        }
        let mut grew = 0;
        match &mut s.kind {
            Kind::Unary { body, .. } => {
                body.extend_from_slice(data);
                let limit = self.cfg.max_recv_message;
                let found = grpc::announced_len(body)
                    .filter(|&n| n > limit)
                    .or_else(|| (body.len() > limit + grpc::PREFIX_LEN).then_some(body.len()));
                if let Some(found) = found {
                    let status = grpc::too_large(found, limit);
                    s.kind = Kind::Called(None);
                    s.remote_closed |= end;
                    self.answer(h.stream, Err(status));
                    return Ok(());
                }
                s.recv_unacked += len;
                grew = data.len();
            }
            Kind::Called(_) => {}
            // Answered already: the rest of the request is read and dropped.
            Kind::Bridged(_) if s.local_closed => s.recv_unacked += len,
            Kind::Bridged(io) => {
                if !data.is_empty() || end {
                    let chunk = Bytes::copy_from_slice(data);
                    io.deliver(|st| {
                        if !chunk.is_empty() {
                            st.recv.push_back(chunk);
                        }
                        st.recv_end |= end;
                    });
                }
                // Unread until the task's body hands it out (see `pump`).
                grew = data.len();
            }
        }
        let s_unary = matches!(s.kind, Kind::Unary { .. });
        if grew > 0 {
            self.charge(h.stream, grew as isize);
            if s_unary && !end && self.requests_full() && !self.may_grow(h.stream) {
                return self.refuse(h.stream);
            }
        }
        let Some(s) = self.streams.get_mut(&h.stream) else {
            return Ok(());
        };
        if !end && s.recv_unacked >= self.cfg.stream_window as i64 / 2 {
            frame::window_update(&mut self.out, h.stream, s.recv_unacked as u32);
            s.recv_window += s.recv_unacked;
            s.recv_unacked = 0;
        }
        if end {
            s.remote_closed = true;
            self.remote_ended(h.stream);
        }
        Ok(())
    }

    pub(super) fn on_headers(&mut self, h: Head, payload: &[u8]) -> Result<(), ConnError> {
        if h.stream == 0 {
            return conn_err(Reason::PROTOCOL_ERROR, "HEADERS on stream 0");
        }
        let (a, b) = frame::unpad(&h, payload)?;
        let mut frag = &payload[a..b];
        let mut self_dependent = false;
        if h.has(frame::PRIORITY_FLAG) {
            if frag.len() < 5 {
                return conn_err(
                    Reason::FRAME_SIZE_ERROR,
                    "HEADERS too short for its priority",
                );
            }
            self_dependent = frame::u32_at(frag) & 0x7fff_ffff == h.stream;
            frag = &frag[5..];
        }
        let p = Partial {
            stream: h.stream,
            block: frag.to_vec(),
            end_stream: h.has(frame::END_STREAM),
            self_dependent,
        };
        if h.has(frame::END_HEADERS) {
            self.on_block(p)
        } else {
            self.check_block_size(p.block.len())?;
            self.partial = Some(p);
            Ok(())
        }
    }

    pub(super) fn on_continuation(&mut self, h: Head, payload: &[u8]) -> Result<(), ConnError> {
        let Some(p) = &mut self.partial else {
            return conn_err(Reason::PROTOCOL_ERROR, "CONTINUATION without HEADERS");
        };
        p.block.extend_from_slice(payload);
        let len = p.block.len();
        if payload.is_empty() && !h.has(frame::END_HEADERS) {
            self.waste(1.0, "too_many_empty_frames")?;
        }
        self.check_block_size(len)?;
        if h.has(frame::END_HEADERS) {
            let p = self.partial.take().expect("checked above");
            return self.on_block(p);
        }
        Ok(())
    }

    pub(super) fn check_block_size(&self, len: usize) -> Result<(), ConnError> {
        if len > self.cfg.max_header_list_size as usize {
            return conn_err(Reason::ENHANCE_YOUR_CALM, "header block too large");
        }
        Ok(())
    }

    /// A whole header block: a new stream's request, or trailers.
    pub(super) fn on_block(&mut self, p: Partial) -> Result<(), ConnError> {
        let id = p.stream;
        let block = Bytes::from(p.block);
        // Decoded first, whatever becomes of the stream: the table must follow every block.
        let fields = self
            .repeated
            .decode(&mut self.dec, &block)
            .map_err(|e| ConnError(Reason::COMPRESSION_ERROR, e.to_string()))?;
        if fields.empty() > EMPTY_FIELDS_FREE {
            let n = fields.empty() as f64 / EMPTY_FIELDS_FREE as f64;
            self.waste(n, "too_many_empty_header_fields")?;
        }
        if let Some(s) = self.streams.get_mut(&id) {
            // Trailers: they end the request and carry no pseudo-headers.
            let why = if s.remote_closed {
                Some(Reason::STREAM_CLOSED)
            } else if !p.end_stream
                || fields.has_pseudo()
                || fields.malformed().is_some()
                || s.content_length.is_some_and(|n| n != s.received)
            {
                Some(Reason::PROTOCOL_ERROR)
            } else {
                None
            };
            if let Some(why) = why {
                self.reset(id, why);
                return self.waste(1.0, "too_many_malformed_streams");
            }
            s.remote_closed = true;
            if let Kind::Bridged(io) = &s.kind {
                let trailers = Arc::unwrap_or_clone(fields).into_header_map();
                io.deliver(|st| {
                    st.recv_trailers = trailers.ok();
                    st.recv_end = true;
                });
            }
            self.remote_ended(id);
            return Ok(());
        }
        if id.is_multiple_of(2) {
            return conn_err(Reason::PROTOCOL_ERROR, "a client stream with an even id");
        }
        if id <= self.last_stream {
            if self.we_reset(id) {
                return Ok(());
            }
            return conn_err(Reason::STREAM_CLOSED, "HEADERS on a closed stream");
        }
        self.last_stream = id;
        if p.self_dependent {
            self.reset(id, Reason::PROTOCOL_ERROR);
            return self.waste(1.0, "too_many_malformed_streams");
        }
        if self.draining || self.streams.len() >= self.cfg.max_concurrent_streams as usize {
            self.reset(id, Reason::REFUSED_STREAM);
            return self.waste(1.0, "too_many_refused_streams");
        }
        if let Some(why) = fields.malformed().or_else(|| fields.request_error()) {
            tracing::debug!(stream = id, "malformed request: {why}");
            self.reset(id, Reason::PROTOCOL_ERROR);
            return self.waste(1.0, "too_many_malformed_streams");
        }
        if self.requests_full() {
            // The stream is not in the table: the reset only tells the client.
            return self.refuse(id);
        }
        if let Some(ct) = fields.wrong_content_type() {
            // grpc-go's answer (etcd's): 415 and the status as one trailers-only response.
            let status = grpc::status_fields(&grpc::wrong_content_type(ct));
            self.write_headers(id, true, |enc, out| {
                enc.field(out, b":status", b"415", false);
                enc.field(out, b"content-type", b"application/grpc", true);
                super::send::header_map(enc, out, &status);
            });
            if !p.end_stream {
                self.send_reset(id, Reason::NO_ERROR);
            }
            return self.waste(1.0, "too_many_malformed_streams");
        }
        if fields.size() > self.cfg.max_header_list_size as usize {
            // RFC 9113, 10.5.1: the request is answered 431 rather than processed.
            self.write_headers(id, true, |enc, out| {
                enc.field(out, b":status", b"431", false);
            });
            if !p.end_stream {
                self.send_reset(id, Reason::NO_ERROR);
            }
            return Ok(());
        }
        let mut s = Stream {
            kind: Kind::Called(None),
            send_window: self.peer_initial_window,
            recv_window: self.cfg.stream_window as i64,
            recv_unacked: 0,
            remote_closed: p.end_stream,
            local_closed: false,
            answered: false,
            pending: VecDeque::new(),
            blocked: false,
            content_length: fields.content_length(),
            received: 0,
            cost: 0,
            call: None,
        };
        if p.end_stream && s.content_length.is_some_and(|n| n != 0) {
            self.reset(id, Reason::PROTOCOL_ERROR);
            return self.waste(1.0, "too_many_malformed_streams");
        }
        if let Some(calls) = &self.cfg.calls {
            s.call = calls
                .started(fields.path())
                .map(|m| (m, std::time::Instant::now()));
        }
        let method = fields
            .is_plain_grpc()
            .then(|| self.unary.route(fields.path()))
            .flatten();
        match method {
            Some(method) => {
                s.kind = Kind::Unary {
                    method,
                    body: Vec::new(),
                    timeout: fields.timeout(),
                    fields,
                };
                self.insert_stream(id, s, UNARY_COST + block.len());
                if p.end_stream {
                    self.remote_ended(id);
                }
            }
            None => {
                let timeout = fields.timeout();
                let req = match Arc::unwrap_or_clone(fields).into_request() {
                    Ok(r) => r,
                    Err(why) => {
                        tracing::debug!(stream = id, "malformed request: {why}");
                        self.reset(id, Reason::PROTOCOL_ERROR);
                        return Ok(());
                    }
                };
                let io = StreamIo::new(id, self.shared.clone(), self.cfg.stream_window as usize);
                if p.end_stream {
                    io.deliver(|st| st.recv_end = true);
                }
                let mut req = req.map(|()| RecvBody::new(Some(io.clone())));
                req.extensions_mut().extend(self.extensions.clone());
                s.kind = Kind::Bridged(io.clone());
                self.insert_stream(id, s, BRIDGED_COST + block.len());
                bridge::spawn(self.svc.clone(), req, io, timeout);
            }
        }
        Ok(())
    }

    /// The request of stream `id` is complete: a unary call is due to start (the turn starts
    /// it, unless the connection's output is full: see [`Conn::start_calls`]).
    pub(super) fn remote_ended(&mut self, id: u32) {
        let Some(s) = self.streams.get(&id) else {
            return;
        };
        if matches!(s.kind, Kind::Unary { .. }) {
            self.due.push_back(id);
        } else {
            self.finish_if_done(id);
        }
    }

    /// Starts the calls due, while the output has room: a call not started holds only its
    /// request's bytes, where a started one holds its decoded request and its future.
    pub(super) fn start_calls(&mut self) -> bool {
        let mut started = false;
        while !self.due.is_empty() && !self.output_full() {
            let id = self.due.pop_front().expect("not empty");
            self.start_call(id);
            started = true;
        }
        if self.due.capacity() > 1024 && self.due.is_empty() {
            self.due.shrink_to_fit();
        }
        started
    }

    fn start_call(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        match std::mem::replace(&mut s.kind, Kind::Called(None)) {
            Kind::Unary {
                method,
                body,
                timeout,
                fields,
            } => match grpc::unary_message(&body) {
                Ok(msg) => {
                    let head = crate::CallHead::new(fields.regular(), &self.extensions);
                    let fut = self.unary.call(method, msg, head);
                    let timer = timeout.map(|d| Box::pin(tokio::time::sleep(d)));
                    let cancel = Arc::new(Cancel::default());
                    s.kind = Kind::Called(Some(cancel.clone()));
                    self.calls.push(Call {
                        id,
                        fut,
                        timer,
                        cancel,
                    });
                }
                Err(status) => self.answer(id, Err(status)),
            },
            other => s.kind = other,
        }
    }

    pub(super) fn on_priority(&mut self, h: Head, payload: &[u8]) -> Result<(), ConnError> {
        if h.stream == 0 {
            return conn_err(Reason::PROTOCOL_ERROR, "PRIORITY on stream 0");
        }
        if payload.len() != 5 {
            self.reset(h.stream, Reason::FRAME_SIZE_ERROR);
        } else if frame::u32_at(payload) & 0x7fff_ffff == h.stream {
            self.reset(h.stream, Reason::PROTOCOL_ERROR);
        }
        // Priorities are not followed: the frame does no work.
        self.waste(1.0, "too_many_priority_frames")
    }

    pub(super) fn on_rst_stream(&mut self, h: Head, payload: &[u8]) -> Result<(), ConnError> {
        if h.stream == 0 {
            return conn_err(Reason::PROTOCOL_ERROR, "RST_STREAM on stream 0");
        }
        if payload.len() != 4 {
            return conn_err(Reason::FRAME_SIZE_ERROR, "RST_STREAM of the wrong size");
        }
        if h.stream > self.last_stream {
            return conn_err(Reason::PROTOCOL_ERROR, "RST_STREAM on an idle stream");
        }
        if let Some(s) = self.remove_stream(h.stream) {
            self.forget(&s, Reason(frame::u32_at(payload)));
            if !s.answered {
                return self.waste(1.0, "too_many_resets");
            }
        }
        Ok(())
    }

    pub(super) fn on_settings(&mut self, h: Head, payload: &[u8]) -> Result<(), ConnError> {
        if h.stream != 0 {
            return conn_err(Reason::PROTOCOL_ERROR, "SETTINGS on a stream");
        }
        if h.has(frame::ACK) {
            if !payload.is_empty() {
                return conn_err(Reason::FRAME_SIZE_ERROR, "SETTINGS ack with a payload");
            }
            return Ok(());
        }
        if !payload.len().is_multiple_of(6) {
            return conn_err(Reason::FRAME_SIZE_ERROR, "SETTINGS of the wrong size");
        }
        if std::mem::replace(&mut self.settings_seen, true) {
            // The first SETTINGS is the preface's; a client changes its settings seldom.
            self.waste(1.0, "too_many_settings")?;
        }
        for p in payload.chunks_exact(6) {
            let id = u16::from_be_bytes([p[0], p[1]]);
            let v = frame::u32_at(&p[2..]);
            match id {
                frame::SETTINGS_HEADER_TABLE_SIZE => self.enc.set_max_size(v as usize),
                frame::SETTINGS_ENABLE_PUSH if v > 1 => {
                    return conn_err(Reason::PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH above 1")
                }
                frame::SETTINGS_INITIAL_WINDOW_SIZE => {
                    if v as i64 > frame::MAX_WINDOW {
                        return conn_err(
                            Reason::FLOW_CONTROL_ERROR,
                            "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1",
                        );
                    }
                    let delta = v as i64 - self.peer_initial_window;
                    self.peer_initial_window = v as i64;
                    for s in self.streams.values_mut() {
                        s.send_window += delta;
                        if s.send_window > frame::MAX_WINDOW {
                            return conn_err(
                                Reason::FLOW_CONTROL_ERROR,
                                "a stream window above 2^31-1",
                            );
                        }
                    }
                }
                frame::SETTINGS_MAX_FRAME_SIZE => {
                    let v = v as usize;
                    if !(frame::DEFAULT_MAX_FRAME..=frame::MAX_MAX_FRAME).contains(&v) {
                        return conn_err(
                            Reason::PROTOCOL_ERROR,
                            "SETTINGS_MAX_FRAME_SIZE out of range",
                        );
                    }
                    self.peer_max_frame = v;
                }
                // Limits on what we send that a server never reaches (push, concurrent
                // streams it opens, header lists it would fill), or unknown: ignored.
                _ => {}
            }
        }
        frame::settings_ack(&mut self.out);
        self.unblock();
        Ok(())
    }

    pub(super) fn on_ping(&mut self, h: Head, payload: &[u8]) -> Result<(), ConnError> {
        if h.stream != 0 {
            return conn_err(Reason::PROTOCOL_ERROR, "PING on a stream");
        }
        if payload.len() != 8 {
            return conn_err(Reason::FRAME_SIZE_ERROR, "PING of the wrong size");
        }
        if h.has(frame::ACK) {
            self.on_ping_ack(payload);
            return Ok(());
        }
        self.on_client_ping(payload)
    }

    pub(super) fn on_goaway(&mut self, h: Head, payload: &[u8]) -> Result<(), ConnError> {
        if h.stream != 0 {
            return conn_err(Reason::PROTOCOL_ERROR, "GOAWAY on a stream");
        }
        if payload.len() < 8 {
            return conn_err(Reason::FRAME_SIZE_ERROR, "GOAWAY too short");
        }
        // The peer opens no more streams: finish those under way, then close.
        self.draining = true;
        Ok(())
    }

    pub(super) fn on_window_update(&mut self, h: Head, payload: &[u8]) -> Result<(), ConnError> {
        if payload.len() != 4 {
            return conn_err(Reason::FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size");
        }
        let inc = (frame::u32_at(payload) & 0x7fff_ffff) as i64;
        if h.stream == 0 {
            if inc == 0 {
                return conn_err(Reason::PROTOCOL_ERROR, "WINDOW_UPDATE of 0");
            }
            self.send_window += inc;
            if self.send_window > frame::MAX_WINDOW {
                return conn_err(Reason::FLOW_CONTROL_ERROR, "connection window above 2^31-1");
            }
        } else if let Some(s) = self.streams.get_mut(&h.stream) {
            if inc == 0 {
                self.reset(h.stream, Reason::PROTOCOL_ERROR);
                return Ok(());
            }
            s.send_window += inc;
            if s.send_window > frame::MAX_WINDOW {
                self.reset(h.stream, Reason::FLOW_CONTROL_ERROR);
                return Ok(());
            }
        } else if h.stream > self.last_stream {
            return conn_err(Reason::PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream");
        }
        self.unblock();
        Ok(())
    }
}
