//! One HTTP/2 server connection: a single task reads frames, answers unary calls itself,
//! bridges every other stream to a tower service, and writes whatever is ready in one go.
//!
//! Each turn of [`Conn::poll`] handles the frames already read, reads more while the output
//! is small, collects the unary calls that finished and the bridged streams' output, then
//! writes all of it with as few system calls as the socket takes. What the connection holds
//! for its client is bounded (`budget.rs`): past the bound it stops running calls, or refuses
//! streams, until the client catches up.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::{BuildHasherDefault, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::bridge::{ConnShared, Out, StreamIo};
use crate::frame::{self, Reason};
use crate::hpack::{Decoder, Encoder};
use crate::request::Repeated;
use crate::{Config, Error, Fallback, Unary, UnaryFuture};

mod budget;
mod liveness;
mod recv;
mod send;

/// Read-buffer growth step.
const READ_CHUNK: usize = 64 * 1024;
/// Output waiting for the socket past which no more frames are read.
const OUT_HIGH: usize = 1 << 20;
/// The HPACK table size we let the peer use (the default).
const HEADER_TABLE: usize = 4096;
/// How many streams we reset are remembered, to ignore what the client still sends on them.
const RESETS_REMEMBERED: usize = 64;

/// Stream ids are odd and ascending: a multiplication spreads them enough.
#[derive(Debug, Default)]
struct IdHash(u64);

impl Hasher for IdHash {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type Streams = HashMap<u32, Stream, BuildHasherDefault<IdHash>>;

#[derive(Debug)]
enum Kind {
    /// A unary call receiving its request message.
    Unary {
        method: usize,
        body: Vec<u8>,
        timeout: Option<Duration>,
        /// The request's fields: its metadata is handed to the call.
        fields: Arc<crate::request::Fields>,
    },
    /// A unary call under way (its cancel handle) or answered.
    Called(Option<Arc<Cancel>>),
    /// Served by the tower service in a task of its own.
    Bridged(Arc<StreamIo>),
}

#[derive(Debug)]
struct Stream {
    kind: Kind,
    /// What we may still send on it.
    send_window: i64,
    /// What the peer may still send on it.
    recv_window: i64,
    /// Received on a unary stream and not yet credited back.
    recv_unacked: i64,
    /// END_STREAM (or the reset) received.
    remote_closed: bool,
    /// END_STREAM queued.
    local_closed: bool,
    /// Its response head went out: the call did its work, and a reset from here on is the
    /// client cancelling an answered call (clientv3's KeepAliveOnce does, every time), not
    /// a reset that wastes the server's work.
    answered: bool,
    /// Output waiting for window, in order.
    pending: VecDeque<Out>,
    /// In `Conn::blocked`.
    blocked: bool,
    content_length: Option<u64>,
    received: u64,
    /// What it is charged in `Conn::req_bytes`: its state, header block and unread body.
    cost: usize,
    /// A counted gRPC call's method and start, until its status is known.
    call: Option<(u32, std::time::Instant)>,
}

/// How the connection stops a unary call whose stream the client reset: the call's future
/// is dropped at its next poll, which this wakes.
#[derive(Debug, Default)]
struct Cancel {
    cancelled: AtomicBool,
    waker: AtomicWaker,
}

impl Cancel {
    fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        self.waker.wake();
    }
}

/// A unary call in flight.
struct Call {
    id: u32,
    fut: UnaryFuture,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    cancel: Arc<Cancel>,
}

impl Future for Call {
    type Output = (u32, Result<Bytes, tonic::Status>);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let id = self.id;
        let reset = || tonic::Status::cancelled("the client reset the stream");
        if self.cancel.cancelled.load(Ordering::Acquire) {
            return Poll::Ready((id, Err(reset())));
        }
        // A handler that panics fails its own call, not the connection's others.
        let polled =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.fut.as_mut().poll(cx)));
        match polled {
            Ok(Poll::Ready(r)) => return Poll::Ready((id, r)),
            Ok(Poll::Pending) => {}
            Err(_) => {
                tracing::error!(stream = id, "a unary call panicked");
                return Poll::Ready((id, Err(tonic::Status::internal("the call panicked"))));
            }
        }
        self.cancel.waker.register(cx.waker());
        if self.cancel.cancelled.load(Ordering::Acquire) {
            return Poll::Ready((id, Err(reset())));
        }
        if let Some(t) = &mut self.timer {
            if t.as_mut().poll(cx).is_ready() {
                // grpc-go's words when a handler outlives the call's deadline.
                let late = tonic::Status::deadline_exceeded("context deadline exceeded");
                return Poll::Ready((id, Err(late)));
            }
        }
        Poll::Pending
    }
}

/// A header block arriving in HEADERS + CONTINUATION frames.
#[derive(Debug)]
struct Partial {
    stream: u32,
    block: Vec<u8>,
    end_stream: bool,
    self_dependent: bool,
}

/// A connection error: the peer gets a GOAWAY with this reason.
#[derive(Debug)]
struct ConnError(Reason, String);

fn conn_err<T>(reason: Reason, why: impl Into<String>) -> Result<T, ConnError> {
    Err(ConnError(reason, why.into()))
}

impl From<Reason> for ConnError {
    fn from(r: Reason) -> ConnError {
        ConnError(r, "malformed frame".into())
    }
}

pub(crate) struct Conn<T, S> {
    io: T,
    cfg: Arc<Config>,
    unary: Arc<dyn Unary>,
    svc: S,
    /// Given to every call: inserted into bridged requests, lent to unary ones.
    extensions: http::Extensions,
    rbuf: Vec<u8>,
    rpos: usize,
    rlen: usize,
    preface_read: bool,
    settings_read: bool,
    /// A SETTINGS (not an ACK) was handled: later ones count as wasted frames.
    settings_seen: bool,
    out: Vec<u8>,
    /// The ACKs of the client's PINGs, put after the rest of the output when it is written.
    acks: Vec<u8>,
    written: usize,
    dec: Decoder,
    /// The header blocks the client repeats, decoded once.
    repeated: Repeated,
    enc: Encoder,
    peer_max_frame: usize,
    peer_initial_window: i64,
    send_window: i64,
    recv_window: i64,
    recv_unacked: i64,
    streams: Streams,
    last_stream: u32,
    partial: Option<Partial>,
    blocked: VecDeque<u32>,
    calls: FuturesUnordered<Call>,
    /// What `calls` are polled with: `shared`, noting their wake-ups.
    calls_waker: Waker,
    shared: Arc<ConnShared>,
    ready_ids: Vec<u32>,
    scratch: VecDeque<Out>,
    /// The peer closed its side.
    eof: bool,
    /// GOAWAY sent: no new streams; the connection ends once the streams are done.
    draining: bool,
    /// A connection error: only the GOAWAY is left to write.
    failed: Option<Error>,
    /// Frame handling stopped with whole frames unread, the output being full.
    held_back: bool,
    /// The last turn left its output for the next (see `poll`).
    write_deferred: bool,
    /// The streams we reset last: frames the client sent on them before it knew are ignored
    /// (RFC 9113, 5.1), not answered as errors.
    we_reset: VecDeque<u32>,
    live: liveness::Liveness,
    /// The client's address (from the extensions), for its budget and the log.
    peer: Option<std::net::SocketAddr>,
    /// Unary answers queued on their streams for the peer's window.
    pending_bytes: usize,
    /// Request state: the `cost` of every stream.
    req_bytes: usize,
    /// What this connection counts for in the guard's total.
    published: usize,
    /// Calls are not run on: the unsent output is over its bound.
    paused: bool,
    /// The oldest unary request still receiving its body, when last looked for.
    oldest: Option<u32>,
    /// Unary requests received whole whose calls have not started, oldest first.
    due: VecDeque<u32>,
}

/// Serves one HTTP/2 connection until the peer closes it, a protocol error, or `shutdown`
/// completes and every stream under way has finished. `first` holds bytes already read
/// from `io` (the preface, as [`crate::sniff`] leaves it); `extensions` go with every call
/// (what the server knows of the connection, such as its client's certificate).
pub async fn serve<T, S>(
    io: T,
    first: &[u8],
    cfg: Arc<Config>,
    unary: Arc<dyn Unary>,
    svc: S,
    extensions: http::Extensions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error>
where
    T: AsyncRead + AsyncWrite + Unpin,
    S: Fallback,
{
    let mut conn = Conn::new(io, first, cfg, unary, svc, extensions);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut shut = false;
    let r = std::future::poll_fn(|cx| {
        if !shut && shutdown.as_mut().poll(cx).is_ready() {
            shut = true;
            conn.drain();
        }
        conn.poll(cx)
    })
    .await;
    match &r {
        Err(Error::Protocol { reason, why }) => {
            conn.cfg.guard.sent_away(conn.peer, Some(*reason), why);
        }
        Err(e @ Error::KeepaliveTimeout(_)) => {
            conn.cfg.guard.sent_away(conn.peer, None, &e.to_string());
        }
        _ => {}
    }
    r
}

impl<T, S> Drop for Conn<T, S> {
    fn drop(&mut self) {
        // Unary calls go with `calls`; bridged tasks are told. Calls without a status yet
        // ended with their connection: cancelled, as grpc-go counts them.
        for s in self.streams.values() {
            if let Kind::Bridged(io) = &s.kind {
                io.reset(Reason::CANCEL);
            }
            if let (Some(calls), Some((m, since))) = (&self.cfg.calls, s.call) {
                calls.handled(m, crate::metrics::CANCELED, since);
            }
        }
        let limit = self.cfg.max_total_buffer;
        self.cfg.guard.publish(self.published, 0, limit);
    }
}

impl<T, S> Conn<T, S>
where
    T: AsyncRead + AsyncWrite + Unpin,
    S: Fallback,
{
    fn new(
        io: T,
        first: &[u8],
        cfg: Arc<Config>,
        unary: Arc<dyn Unary>,
        svc: S,
        extensions: http::Extensions,
    ) -> Self {
        let mut rbuf = vec![0; READ_CHUNK.max(first.len())];
        rbuf[..first.len()].copy_from_slice(first);
        let mut out = Vec::with_capacity(16 * 1024);
        let mut params = vec![
            (
                frame::SETTINGS_INITIAL_WINDOW_SIZE,
                cfg.stream_window.min(frame::MAX_WINDOW as u32),
            ),
            (
                frame::SETTINGS_MAX_HEADER_LIST_SIZE,
                cfg.max_header_list_size,
            ),
        ];
        if cfg.max_concurrent_streams != u32::MAX {
            params.push((
                frame::SETTINGS_MAX_CONCURRENT_STREAMS,
                cfg.max_concurrent_streams,
            ));
        }
        let max_frame =
            (cfg.max_frame_size as usize).clamp(frame::DEFAULT_MAX_FRAME, frame::MAX_MAX_FRAME);
        if max_frame != frame::DEFAULT_MAX_FRAME {
            params.push((frame::SETTINGS_MAX_FRAME_SIZE, max_frame as u32));
        }
        frame::settings(&mut out, &params);
        let conn_window = (cfg.conn_window as i64).clamp(frame::DEFAULT_WINDOW, frame::MAX_WINDOW);
        if conn_window > frame::DEFAULT_WINDOW {
            frame::window_update(&mut out, 0, (conn_window - frame::DEFAULT_WINDOW) as u32);
        }
        let shared = Arc::new(ConnShared::default());
        let peer = extensions.get::<crate::RemoteAddr>().map(|a| a.0);
        Conn {
            calls_waker: Waker::from(shared.clone()),
            shared,
            io,
            unary,
            svc,
            extensions,
            rbuf,
            rpos: 0,
            rlen: first.len(),
            preface_read: false,
            settings_read: false,
            settings_seen: false,
            out,
            acks: Vec::new(),
            written: 0,
            dec: Decoder::new(HEADER_TABLE),
            repeated: Repeated::default(),
            enc: Encoder::new(),
            peer_max_frame: frame::DEFAULT_MAX_FRAME,
            peer_initial_window: frame::DEFAULT_WINDOW,
            send_window: frame::DEFAULT_WINDOW,
            recv_window: conn_window,
            recv_unacked: 0,
            streams: Streams::default(),
            last_stream: 0,
            partial: None,
            blocked: VecDeque::new(),
            calls: FuturesUnordered::new(),
            ready_ids: Vec::new(),
            scratch: VecDeque::new(),
            eof: false,
            draining: false,
            failed: None,
            held_back: false,
            write_deferred: false,
            we_reset: VecDeque::new(),
            live: liveness::Liveness::new(&cfg),
            cfg,
            peer,
            pending_bytes: 0,
            req_bytes: 0,
            published: 0,
            paused: false,
            oldest: None,
            due: VecDeque::new(),
        }
    }

    /// Stops taking new streams (GOAWAY); the connection ends once the others are done.
    fn drain(&mut self) {
        if !self.draining && self.failed.is_none() {
            self.draining = true;
            frame::goaway(&mut self.out, self.last_stream, Reason::NO_ERROR, "");
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.shared.register(cx.waker());
        // Only a call's wake-up from here on counts for deferring the output (see below): it
        // polls this task again, the waker being registered.
        self.shared.take_calls_woken();
        loop {
            let mut busy = false;
            if self.failed.is_none() {
                if let Err(ConnError(reason, why)) = self.handle_frames() {
                    tracing::debug!(%reason, "HTTP/2 connection error: {why}");
                    frame::goaway(&mut self.out, self.last_stream, reason, &why);
                    self.failed = Some(Error::Protocol { reason, why });
                }
            }
            // With the output full, the socket is not read (the peer must read ours first);
            // the turn then goes round once the output has drained, so reading resumes.
            let reading = self.failed.is_none() && !self.eof;
            let read_held = reading && self.out.len() >= OUT_HIGH;
            if reading && !read_held {
                match self.poll_fill(cx) {
                    Poll::Ready(Ok(0)) => {
                        self.eof = true;
                        busy = true;
                    }
                    Poll::Ready(Ok(_)) => busy = true,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                    Poll::Pending => {}
                }
            }
            // Calls start and run on only while the unsent output is within its bound: each
            // answer is checked, so one answer at most goes past it.
            busy |= self.start_calls();
            let waker = self.calls_waker.clone();
            let mut calls_cx = Context::from_waker(&waker);
            while !self.output_full() {
                let Poll::Ready(Some((id, r))) = self.calls.poll_next_unpin(&mut calls_cx) else {
                    break;
                };
                self.answer(id, r);
                busy = true;
            }
            self.shared.take_ready(&mut self.ready_ids);
            if !self.ready_ids.is_empty() {
                busy = true;
                let ids = std::mem::take(&mut self.ready_ids);
                for &id in &ids {
                    self.pump(id);
                }
                self.ready_ids = ids;
                self.ready_ids.clear();
            }
            busy |= self.poll_keepalive(cx);
            // A call that woke itself while polled (a proposal yields once so that the calls
            // of every connection polled before it joins its turn) is answered when this task
            // is polled next, at once: the output waits for it, so the answer leaves with what
            // its request brought about (a PING's ACK, window credit) in one write. Once: the
            // next turn writes whatever it has.
            let defer = self.shared.take_calls_woken() && !self.write_deferred;
            self.write_deferred = defer;
            if defer {
                return Poll::Pending;
            }
            // PING ACKs go after the answers of the same write: grpc-go's client pings to
            // estimate bandwidth on the first DATA frame it reads while no ping of its is
            // unanswered, so an ACK read after the DATA costs it (and us) a ping only every
            // other answer; before the DATA, every answer.
            self.out.append(&mut self.acks);
            let written = self.poll_write(cx);
            // Whatever the write did, the guard learns what the connection holds now; when
            // the output fell within its bound, the calls run on.
            busy |= self.settle(cx);
            match written {
                Poll::Ready(Ok(())) => busy |= std::mem::take(&mut self.held_back) || read_held,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                Poll::Pending => return Poll::Pending,
            }
            let done =
                self.failed.is_some() || self.eof || (self.draining && self.streams.is_empty());
            if done {
                ready!(Pin::new(&mut self.io).poll_shutdown(cx))?;
                return Poll::Ready(match self.failed.take() {
                    Some(e) => Err(e),
                    None => Ok(()),
                });
            }
            if !busy {
                return Poll::Pending;
            }
        }
    }

    /// Reads what the socket has into the read buffer; `Ok(0)` at its end.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        if self.rpos == self.rlen {
            self.rpos = 0;
            self.rlen = 0;
        } else if self.rpos > 0 && self.rbuf.len() - self.rlen < READ_CHUNK / 4 {
            self.rbuf.copy_within(self.rpos..self.rlen, 0);
            self.rlen -= self.rpos;
            self.rpos = 0;
        }
        if self.rlen == self.rbuf.len() {
            self.rbuf.resize(self.rbuf.len() + READ_CHUNK, 0);
        }
        let mut rb = ReadBuf::new(&mut self.rbuf[self.rlen..]);
        ready!(Pin::new(&mut self.io).poll_read(cx, &mut rb))?;
        let n = rb.filled().len();
        self.rlen += n;
        if n > 0 {
            self.live.read();
        }
        Poll::Ready(Ok(n))
    }

    fn poll_write(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while self.written < self.out.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.out[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        if self.written > 0 {
            self.out.clear();
            self.written = 0;
            if self.out.capacity() > 4 * OUT_HIGH {
                self.out.shrink_to(OUT_HIGH);
            }
            ready!(Pin::new(&mut self.io).poll_flush(cx))?;
        }
        Poll::Ready(Ok(()))
    }
}
