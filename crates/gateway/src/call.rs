//! A gRPC call made to a router in process: the request message framed as gRPC frames it,
//! the answer's frames read back as they come, and its status taken from the trailers (or
//! from the headers of a trailers-only answer).

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::Router;
use bytes::{Buf, BufMut, BytesMut};
use http_body_util::BodyExt;
use prost::Message;
use tokio_stream::{Stream, StreamExt};
use tonic::{Code, Status};
use tower::ServiceExt;

/// The server's own gRPC router.
#[derive(Clone, Debug)]
pub(crate) struct Grpc {
    router: Router,
}

/// A message in gRPC's framing: uncompressed, its length, its bytes.
fn frame<T: Message>(m: &T) -> Bytes {
    let len = m.encoded_len();
    let mut b = BytesMut::with_capacity(5 + len);
    b.put_u8(0);
    b.put_u32(len as u32);
    m.encode(&mut b).expect("a BytesMut grows as needed");
    b.freeze()
}

/// The status a header map carries, unless it says OK.
fn failed(h: &axum::http::HeaderMap) -> Option<Status> {
    Status::from_header_map(h).filter(|s| s.code() != Code::Ok)
}

impl Grpc {
    pub(crate) fn new(router: Router) -> Grpc {
        Grpc { router }
    }

    /// A unary call of `path` with `req`; its answer.
    pub(crate) async fn unary<Req: Message, Resp: Message + Default>(
        &self,
        path: &'static str,
        auth: Option<HeaderValue>,
        req: &Req,
    ) -> Result<Resp, Status> {
        let mut out = self.call(path, auth, Body::from(frame(req))).await?;
        let resp = out
            .next::<Resp>()
            .await
            .unwrap_or_else(|| Err(Status::internal("no message in a unary call's answer")))?;
        // The status, in the trailers after the message.
        match out.next::<Resp>().await {
            Some(Err(s)) => Err(s),
            _ => Ok(resp),
        }
    }

    /// A streaming call of `path` with the requests of `input`; its answers as they come.
    pub(crate) async fn streaming<Req, Resp, S>(
        &self,
        path: &'static str,
        auth: Option<HeaderValue>,
        input: S,
    ) -> Result<impl Stream<Item = Result<Resp, Status>> + Send + 'static, Status>
    where
        Req: Message + Send + 'static,
        Resp: Message + Default + Send + 'static,
        S: Stream<Item = Req> + Send + 'static,
    {
        let body = Body::from_stream(input.map(|r| Ok::<_, Infallible>(frame(&r))));
        let out = self.call(path, auth, body).await?;
        Ok(futures_util::stream::unfold(out, |mut f| async move {
            f.next::<Resp>().await.map(|r| (r, f))
        }))
    }

    async fn call(
        &self,
        path: &'static str,
        auth: Option<HeaderValue>,
        body: Body,
    ) -> Result<Frames, Status> {
        let mut b = axum::http::Request::post(path)
            .header(header::CONTENT_TYPE, "application/grpc")
            .header(header::TE, "trailers");
        if let Some(a) = auth {
            b = b.header("authorization", a);
        }
        let req = b.body(body).map_err(|e| Status::internal(e.to_string()))?;
        let resp = match self.router.clone().oneshot(req).await {
            Ok(r) => r,
            Err(never) => match never {},
        };
        if let Some(s) = failed(resp.headers()) {
            return Err(s);
        }
        Ok(Frames {
            body: resp.into_body(),
            buf: BytesMut::new(),
            done: false,
        })
    }
}

/// The messages of an answer's body.
struct Frames {
    body: Body,
    buf: BytesMut,
    done: bool,
}

impl Frames {
    /// The next message; `None` at the end of an answer that succeeded, its status if it
    /// failed.
    async fn next<T: Message + Default>(&mut self) -> Option<Result<T, Status>> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if self.buf.len() >= 5 + len {
                    let compressed = self.buf[0] != 0;
                    let mut msg = self.buf.split_to(5 + len);
                    msg.advance(5);
                    if compressed {
                        return Some(Err(Status::internal("a compressed message")));
                    }
                    return Some(T::decode(msg.freeze()).map_err(|e| {
                        Status::internal(format!("grpc: error unmarshalling the answer: {e}"))
                    }));
                }
            }
            if self.done {
                return None;
            }
            match self.body.frame().await {
                None => {
                    self.done = true;
                    if !self.buf.is_empty() {
                        return Some(Err(Status::internal("a truncated message")));
                    }
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(Status::internal(e.to_string())));
                }
                Some(Ok(f)) => match f.into_data() {
                    Ok(d) => self.buf.extend_from_slice(&d),
                    Err(f) => {
                        if let Ok(t) = f.into_trailers() {
                            self.done = true;
                            if let Some(s) = failed(&t) {
                                return Some(Err(s));
                            }
                        }
                    }
                },
            }
        }
    }
}
