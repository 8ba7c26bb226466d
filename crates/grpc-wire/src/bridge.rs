//! Streams served by a tower service: each runs as its own task, exchanging body chunks and
//! window credit with the connection through a shared queue.
//!
//! The connection task owns the socket, the HPACK state and the flow-control windows; a
//! stream's task owns the service's future and the response body. The task pushes what it
//! produces (head, data, trailers) and counts what its request body consumed; it wakes the
//! connection, which frames the output as the peer's windows allow and returns the credit.
//! A task waits while more than [`UNSENT_LIMIT`] of its output is unsent, or while its
//! connection holds more unsent output than it may, so a slow reader holds back the producer
//! instead of growing a buffer.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http::HeaderMap;
use http_body::{Body, Frame};
use parking_lot::Mutex;

use crate::frame::Reason;
use crate::{Fallback, Response};

/// Output a stream's task may have waiting before it waits for the connection.
pub(crate) const UNSENT_LIMIT: usize = 64 * 1024;

/// What the stream tasks of one connection tell it: which streams have news. As a waker it
/// is the one the connection's unary calls are polled with: it notes that one woke.
#[derive(Debug, Default)]
pub(crate) struct ConnShared {
    ready: Mutex<Vec<u32>>,
    waker: AtomicWaker,
    calls_woken: AtomicBool,
    /// Response bytes the stream tasks pushed that are not framed yet.
    unsent: AtomicUsize,
    /// The connection holds too much unsent output: its tasks wait in `room`.
    paused: AtomicBool,
    room: Mutex<Vec<Waker>>,
}

impl ConnShared {
    /// Response bytes the stream tasks pushed that are not framed yet.
    pub(crate) fn unsent(&self) -> usize {
        self.unsent.load(Ordering::Relaxed)
    }

    /// Sets whether the connection's tasks may produce output; they go on when it may.
    pub(crate) fn set_paused(&self, paused: bool) {
        if self.paused.swap(paused, Ordering::AcqRel) && !paused {
            for w in self.room.lock().drain(..) {
                w.wake();
            }
        }
    }

    pub(crate) fn register(&self, w: &Waker) {
        self.waker.register(w);
    }

    /// Whether a unary call woke since the last call.
    pub(crate) fn take_calls_woken(&self) -> bool {
        self.calls_woken.swap(false, Ordering::AcqRel)
    }

    /// The streams with news since the last call.
    pub(crate) fn take_ready(&self, into: &mut Vec<u32>) {
        std::mem::swap(&mut *self.ready.lock(), into);
    }
}

impl std::task::Wake for ConnShared {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.calls_woken.store(true, Ordering::Release);
        self.waker.wake();
    }
}

/// A response part on its way to the connection.
#[derive(Debug)]
pub(crate) enum Out {
    /// The response head; `end` when there is no body (a trailers-only gRPC response).
    Head {
        parts: http::response::Parts,
        end: bool,
    },
    Data(Bytes),
    Trailers(HeaderMap),
    /// The body ended without trailers.
    End,
    /// A unary call's trailers: `grpc-status: 0`.
    GrpcOk,
    /// The body failed: the stream is reset.
    Reset(Reason),
}

impl Out {
    /// The response bytes it carries.
    pub(crate) fn data_len(&self) -> usize {
        match self {
            Out::Data(b) => b.len(),
            _ => 0,
        }
    }
}

/// One stream's queues, shared by its task and the connection.
#[derive(Debug)]
pub(crate) struct StreamIo {
    id: u32,
    conn: Arc<ConnShared>,
    /// The stream window: credit is returned in steps of a quarter of it.
    window: usize,
    st: Mutex<State>,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) recv: VecDeque<Bytes>,
    pub(crate) recv_trailers: Option<HeaderMap>,
    pub(crate) recv_end: bool,
    /// Request bytes the body handed out and the connection has not credited yet.
    consumed: usize,
    recv_waker: Option<Waker>,
    send: VecDeque<Out>,
    /// Response bytes pushed and not yet framed.
    unsent: usize,
    send_waker: Option<Waker>,
    /// Set by the connection: the stream is gone (reset by the peer, or the connection ended).
    reset: Option<Reason>,
    task_waker: Option<Waker>,
    notified: bool,
}

impl StreamIo {
    pub(crate) fn new(id: u32, conn: Arc<ConnShared>, window: usize) -> Arc<StreamIo> {
        Arc::new(StreamIo {
            id,
            conn,
            window,
            st: Mutex::new(State::default()),
        })
    }

    /// Hands the request body data, trailers or its end to the task.
    pub(crate) fn deliver(&self, f: impl FnOnce(&mut State)) {
        let mut st = self.st.lock();
        f(&mut st);
        let w = st.recv_waker.take();
        drop(st);
        if let Some(w) = w {
            w.wake();
        }
    }

    /// The stream is gone: the task stops and drops the call, and its unsent output no
    /// longer counts.
    pub(crate) fn reset(&self, why: Reason) {
        let mut st = self.st.lock();
        st.reset.get_or_insert(why);
        let unsent = std::mem::take(&mut st.unsent);
        self.conn.unsent.fetch_sub(unsent, Ordering::Relaxed);
        st.send.clear();
        let wakers = [
            st.recv_waker.take(),
            st.send_waker.take(),
            st.task_waker.take(),
        ];
        drop(st);
        for w in wakers.into_iter().flatten() {
            w.wake();
        }
    }

    /// Moves the task's output to `into` and returns the request bytes consumed since the
    /// last call (credit for the stream window).
    pub(crate) fn take(&self, into: &mut VecDeque<Out>) -> usize {
        let mut st = self.st.lock();
        st.notified = false;
        into.append(&mut st.send);
        std::mem::take(&mut st.consumed)
    }

    /// `n` bytes of output were framed: the task may produce more.
    pub(crate) fn sent(&self, n: usize) {
        let mut st = self.st.lock();
        let was_full = st.unsent >= UNSENT_LIMIT;
        let n = n.min(st.unsent);
        st.unsent -= n;
        self.conn.unsent.fetch_sub(n, Ordering::Relaxed);
        let w = (was_full && st.unsent < UNSENT_LIMIT)
            .then(|| st.send_waker.take())
            .flatten();
        drop(st);
        if let Some(w) = w {
            w.wake();
        }
    }

    /// The task's side: pushes output and tells the connection.
    fn push(&self, out: Out) {
        let mut st = self.st.lock();
        if st.reset.is_some() {
            return;
        }
        if let Out::Data(b) = &out {
            st.unsent += b.len();
            self.conn.unsent.fetch_add(b.len(), Ordering::Relaxed);
        }
        st.send.push_back(out);
        self.notify(st);
    }

    fn notify(&self, mut st: parking_lot::MutexGuard<'_, State>) {
        if !st.notified {
            st.notified = true;
            drop(st);
            self.conn.ready.lock().push(self.id);
            self.conn.waker.wake();
        }
    }

    /// Ready once the unsent output is below the limit and the connection is not paused
    /// (or the stream is gone).
    fn poll_room(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = self.st.lock();
        if st.reset.is_some() {
            return Poll::Ready(());
        }
        if st.unsent >= UNSENT_LIMIT {
            st.send_waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        drop(st);
        // Checked with the list locked: the connection clears the flag before it wakes the
        // list, so a waker pushed here is woken or sees the flag cleared.
        let mut room = self.conn.room.lock();
        if !self.conn.paused.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        if !room.iter().any(|w| w.will_wake(cx.waker())) {
            room.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// The request body of a bridged stream: the DATA frames as they arrive.
#[derive(Debug)]
pub struct RecvBody {
    io: Option<Arc<StreamIo>>,
}

impl RecvBody {
    pub(crate) fn new(io: Option<Arc<StreamIo>>) -> RecvBody {
        RecvBody { io }
    }
}

/// The peer reset the stream, or the connection ended, before the body did.
#[derive(Debug, thiserror::Error)]
#[error("stream reset before the request body ended ({0})")]
pub struct Reset(pub Reason);

impl Body for RecvBody {
    type Data = Bytes;
    type Error = Reset;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Reset>>> {
        let Some(io) = &self.io else {
            return Poll::Ready(None);
        };
        let mut st = io.st.lock();
        if let Some(b) = st.recv.pop_front() {
            st.consumed += b.len();
            if st.consumed >= io.window / 4 {
                io.notify(st);
            }
            return Poll::Ready(Some(Ok(Frame::data(b))));
        }
        if let Some(t) = st.recv_trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(t))));
        }
        if st.recv_end {
            return Poll::Ready(None);
        }
        if let Some(r) = st.reset {
            return Poll::Ready(Some(Err(Reset(r))));
        }
        st.recv_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.io.as_ref().is_none_or(|io| {
            let st = io.st.lock();
            st.recv_end && st.recv.is_empty() && st.recv_trailers.is_none()
        })
    }
}

/// Runs `svc` on `req` in a task of its own, its response going out through `io`. A
/// `deadline` (the call's grpc-timeout) bounds the wait for the response head, as tonic's
/// server does; past it the call answers DEADLINE_EXCEEDED.
pub(crate) fn spawn<S: Fallback>(
    mut svc: S,
    req: http::Request<RecvBody>,
    io: Arc<StreamIo>,
    deadline: Option<Duration>,
) {
    let out = io.clone();
    let run = async move {
        let call = async {
            match std::future::poll_fn(|cx| svc.poll_ready(cx)).await {
                Ok(()) => svc.call(req).await,
                Err(never) => match never {},
            }
        };
        let resp = match deadline {
            None => call.await,
            Some(d) => match tokio::time::timeout(d, call).await {
                Ok(r) => r,
                Err(_) => {
                    let late = tonic::Status::deadline_exceeded("context deadline exceeded")
                        .into_http::<()>();
                    let (parts, ()) = late.into_parts();
                    out.push(Out::Head { parts, end: true });
                    return;
                }
            },
        };
        let Ok(resp) = resp;
        let (parts, body) = Response::into_parts(resp);
        if body.is_end_stream() {
            out.push(Out::Head { parts, end: true });
            return;
        }
        out.push(Out::Head { parts, end: false });
        let mut body = std::pin::pin!(body);
        loop {
            std::future::poll_fn(|cx| out.poll_room(cx)).await;
            match std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
                None => return out.push(Out::End),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(d) => {
                        if !d.is_empty() {
                            out.push(Out::Data(d));
                        }
                    }
                    Err(frame) => {
                        if let Ok(t) = frame.into_trailers() {
                            return out.push(Out::Trailers(t));
                        }
                    }
                },
                Some(Err(e)) => {
                    tracing::debug!(stream = out.id, "response body failed: {e}");
                    return out.push(Out::Reset(Reason::INTERNAL_ERROR));
                }
            }
        }
    };
    tokio::spawn(Task {
        io,
        run: Box::pin(run),
    });
}

/// A stream's task: ends as soon as the connection resets the stream, dropping the call.
struct Task {
    io: Arc<StreamIo>,
    run: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl Future for Task {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        {
            let mut st = self.io.st.lock();
            if st.reset.is_some() {
                return Poll::Ready(());
            }
            match &st.task_waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => st.task_waker = Some(cx.waker().clone()),
            }
        }
        self.run.as_mut().poll(cx)
    }
}
