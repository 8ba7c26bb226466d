//! A connection whose writes leave in batches: one `writev` carries every response that is ready,
//! instead of one `writev` per response.
//!
//! hyper runs each HTTP/2 stream as its own task, and a stream finishing its response wakes the
//! connection task, which tokio runs next (its LIFO slot): without help, the connection writes
//! and flushes once per response, although the other streams of the same read are about to
//! answer too. grpc-go (etcd) batches in its "loopy writer"; here the connection's first write
//! after a flush yields to the scheduler with [`tokio::task::yield_now`], which resumes it only
//! once the worker has run every ready task and polled the I/O driver. The responses produced
//! meanwhile join the same write. A lone request pays one scheduler turn, no system call or
//! context switch.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// `T` with batched writes (see the module documentation).
#[derive(Debug)]
pub struct Batched<T> {
    io: T,
    /// Yielded since the last flush: the next write goes through.
    yielded: bool,
}

impl<T> Batched<T> {
    pub fn new(io: T) -> Batched<T> {
        Batched { io, yielded: false }
    }

    /// Pending once per flush, handing the task's waker to the scheduler's deferred list.
    fn yield_once(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            return Poll::Ready(());
        }
        self.yielded = true;
        let yielding = std::pin::pin!(tokio::task::yield_now());
        // The first poll of `yield_now` registers the waker and is always pending.
        let _ = std::future::Future::poll(yielding, cx);
        Poll::Pending
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Batched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Batched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.yield_once(cx));
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        ready!(self.yield_once(cx));
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let done = Pin::new(&mut self.io).poll_flush(cx);
        if done.is_ready() {
            self.yielded = false;
        }
        done
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<T: Connected> Connected for Batched<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}
