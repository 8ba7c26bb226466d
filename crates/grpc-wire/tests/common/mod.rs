//! What the raw-frame tests share: a server with trivial handlers and a client that speaks
//! frames directly.

#![allow(dead_code)]

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body::Body;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub const DATA: u8 = 0;
pub const HEADERS: u8 = 1;
pub const RST_STREAM: u8 = 3;
pub const SETTINGS: u8 = 4;
pub const PING: u8 = 6;
pub const GOAWAY: u8 = 7;
pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;

/// What `/t.S/Big` answers: 1 MiB.
pub const BIG: usize = 1 << 20;
static BIG_ANSWER: [u8; BIG] = [b'v'; BIG];

/// Answers `/t.S/Echo` with its request message, `/t.S/Big` with [`BIG`] bytes.
#[derive(Debug)]
pub struct Echo;

impl grpc_wire::Unary for Echo {
    fn route(&self, path: &[u8]) -> Option<usize> {
        match path {
            b"/t.S/Echo" => Some(0),
            b"/t.S/Big" => Some(1),
            _ => None,
        }
    }

    fn call(&self, id: usize, msg: Bytes, _: grpc_wire::CallHead<'_>) -> grpc_wire::UnaryFuture {
        let answer = match id {
            0 => msg,
            _ => Bytes::from_static(&BIG_ANSWER),
        };
        Box::pin(std::future::ready(Ok(answer)))
    }
}

/// Reads the whole request body, then answers 200 with its length.
#[derive(Debug, Clone)]
pub struct Drain;

impl tower_service::Service<http::Request<grpc_wire::RecvBody>> for Drain {
    type Response = http::Response<String>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<http::Response<String>, Infallible>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<grpc_wire::RecvBody>) -> Self::Future {
        Box::pin(async move {
            let mut body = std::pin::pin!(req.into_body());
            let mut n = 0;
            while let Some(Ok(f)) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
                n += f.data_ref().map_or(0, |d| d.len());
            }
            Ok(http::Response::new(n.to_string()))
        })
    }
}

/// Header blocks (HPACK, static table only) worth sending whole.
pub mod block {
    /// :method POST, :scheme http, :path /t.S/Echo, content-type: application/grpc
    pub const ECHO: &[u8] = b"\x83\x86\x04\x09/t.S/Echo\x0f\x10\x10application/grpc";
    /// :method POST, :scheme http, :path /t.S/Big, content-type: application/grpc
    pub const BIG: &[u8] = b"\x83\x86\x04\x08/t.S/Big\x0f\x10\x10application/grpc";
    /// :method GET, :scheme http, :path /
    pub const GET: &[u8] = b"\x82\x86\x84";
}

/// One frame, encoded.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A gRPC message in a DATA payload.
pub fn grpc_message(msg: &[u8]) -> Vec<u8> {
    let mut p = vec![0];
    p.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    p.extend_from_slice(msg);
    p
}

/// The client's preface and an empty SETTINGS.
pub fn preface() -> Vec<u8> {
    preface_with(&[])
}

/// The client's preface and SETTINGS of `(id, value)` pairs.
pub fn preface_with(settings: &[(u16, u32)]) -> Vec<u8> {
    let mut payload = Vec::new();
    for (id, v) in settings {
        payload.extend_from_slice(&id.to_be_bytes());
        payload.extend_from_slice(&v.to_be_bytes());
    }
    let mut out = grpc_wire::frame::PREFACE.to_vec();
    out.extend_from_slice(&frame(SETTINGS, 0, 0, &payload));
    out
}

/// A frame as read: (type, flags, stream, payload).
pub type Frame = (u8, u8, u32, Vec<u8>);

/// Reads one frame; `None` at the end of the connection.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Option<Frame> {
    let mut head = [0u8; 9];
    r.read_exact(&mut head).await.ok()?;
    let len = (head[0] as usize) << 16 | (head[1] as usize) << 8 | head[2] as usize;
    let mut payload = vec![0; len];
    r.read_exact(&mut payload).await.ok()?;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    Some((head[3], head[4], stream, payload))
}

/// Reads frames until one matches, answering the server's PINGs if `ack_pings`; `None` if
/// the connection ends first or `limit` passes.
pub async fn read_until<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    ack_pings: bool,
    limit: Duration,
    mut want: impl FnMut(&Frame) -> bool,
) -> Option<Frame> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let f = tokio::time::timeout_at(deadline, read_frame(s))
            .await
            .ok()??;
        if ack_pings && f.0 == PING && f.1 & ACK == 0 {
            s.write_all(&frame(PING, ACK, 0, &f.3)).await.ok()?;
        }
        if want(&f) {
            return Some(f);
        }
    }
}

/// The error code and debug text of a GOAWAY frame.
pub fn goaway(f: &Frame) -> (u32, String) {
    let p = &f.3;
    (
        u32::from_be_bytes([p[4], p[5], p[6], p[7]]),
        String::from_utf8_lossy(&p[8..]).into_owned(),
    )
}

/// A connection served by grpc-wire with `cfg`, over an in-memory pipe: the client's end and
/// the server's task.
pub fn connect(
    cfg: grpc_wire::Config,
) -> (
    tokio::io::DuplexStream,
    tokio::task::JoinHandle<Result<(), grpc_wire::Error>>,
) {
    connect_shared(Arc::new(cfg), None)
}

/// A connection served with `cfg`, shared with other connections (and so its guard), from
/// client address `addr`.
pub fn connect_shared(
    cfg: Arc<grpc_wire::Config>,
    addr: Option<&str>,
) -> (
    tokio::io::DuplexStream,
    tokio::task::JoinHandle<Result<(), grpc_wire::Error>>,
) {
    let (client, server) = tokio::io::duplex(1 << 20);
    let mut ext = http::Extensions::new();
    if let Some(a) = addr {
        ext.insert(grpc_wire::RemoteAddr(a.parse().expect("an address")));
    }
    let conn = tokio::spawn(grpc_wire::serve(
        server,
        b"",
        cfg,
        Arc::new(Echo),
        Drain,
        ext,
        std::future::pending(),
    ));
    (client, conn)
}
