//! Telling HTTP/2 with prior knowledge (what gRPC clients speak) from HTTP/1.1 on one port.

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

use crate::frame::PREFACE;

/// What a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http2,
    Http1,
}

/// Reads until the first bytes decide between HTTP/2's preface and anything else, and returns
/// the verdict with the bytes read (to be served first). A connection closed before it said
/// anything reads as HTTP/1 with no bytes.
pub async fn sniff<T: AsyncRead + Unpin>(io: &mut T) -> std::io::Result<(Protocol, Vec<u8>)> {
    let mut got = Vec::with_capacity(PREFACE.len());
    let mut buf = [0u8; 64];
    loop {
        let n = io.read(&mut buf[..PREFACE.len() - got.len()]).await?;
        if n == 0 {
            return Ok((Protocol::Http1, got));
        }
        got.extend_from_slice(&buf[..n]);
        if got.len() >= PREFACE.len() {
            let p = if got.starts_with(PREFACE) {
                Protocol::Http2
            } else {
                Protocol::Http1
            };
            return Ok((p, got));
        }
        if !PREFACE.starts_with(&got) {
            return Ok((Protocol::Http1, got));
        }
    }
}

/// `io` with the bytes [`sniff`] read put back in front: for a server that reads the
/// connection from its start (HTTP/1).
#[derive(Debug)]
pub struct Rewind<T> {
    first: Vec<u8>,
    at: usize,
    io: T,
}

impl<T> Rewind<T> {
    pub fn new(first: Vec<u8>, io: T) -> Rewind<T> {
        Rewind { first, at: 0, io }
    }
}

/// For a tonic server: the connection's information is the wrapped one's.
impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected for Rewind<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Rewind<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.at < self.first.len() {
            let n = buf.remaining().min(self.first.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.first[at..at + n]);
            self.at += n;
            if self.at == self.first.len() {
                self.first = Vec::new();
                self.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Rewind<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The verdict on `input`, checking the bytes handed back are what was read of it.
    async fn verdict(input: &[u8]) -> Protocol {
        let mut r = std::io::Cursor::new(input.to_vec());
        let (p, got) = sniff(&mut r).await.unwrap();
        assert!(input.starts_with(&got));
        assert_eq!(got.len() as u64, r.position());
        p
    }

    #[tokio::test]
    async fn preface_and_http1() {
        let mut h2 = PREFACE.to_vec();
        h2.extend_from_slice(b"\0\0\0\x04");
        assert_eq!(verdict(&h2).await, Protocol::Http2);
        // "POST" shares its first letter with "PRI ".
        assert_eq!(
            verdict(b"POST /v3/kv/range HTTP/1.1\r\nHost: x\r\n\r\n").await,
            Protocol::Http1
        );
        assert_eq!(
            verdict(b"GET /health HTTP/1.1\r\n\r\n").await,
            Protocol::Http1
        );
        assert_eq!(verdict(b"PRI").await, Protocol::Http1);
        assert_eq!(verdict(b"").await, Protocol::Http1);
    }

    #[tokio::test]
    async fn rewind_replays_what_was_read() {
        let input = b"GET /health HTTP/1.1\r\n\r\n".to_vec();
        let mut r = std::io::Cursor::new(input.clone());
        let (_, first) = sniff(&mut r).await.unwrap();
        let mut all = Vec::new();
        Rewind::new(first, r).read_to_end(&mut all).await.unwrap();
        assert_eq!(all, input);
    }
}
