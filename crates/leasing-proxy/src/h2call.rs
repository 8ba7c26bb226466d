//! Unary gRPC calls to the cluster straight over an HTTP/2 connection (the `h2` crate, as
//! hyper uses it): the proxy's hot path (a read it cannot answer, a write) forwards a call
//! without tonic's client stack, whose buffer task and dispatch add a task hand-off each
//! way to every call. One connection per endpoint, made on first use and made again after it
//! breaks; the rest of the proxy's calls (streams, other services) keep to tonic.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::{Code, Status};

/// A connection's byte stream (plain TCP, or TLS).
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// Opens a byte stream to an endpoint URL (plain or TLS, with ALPN `h2`).
pub type Dial = Arc<
    dyn Fn(String) -> Pin<Box<dyn std::future::Future<Output = io::Result<Box<dyn Io>>> + Send>>
        + Send
        + Sync,
>;

/// The connections to one endpoint.
struct Endpoint {
    url: String,
    /// `scheme://authority` of the requests.
    base: String,
    conn: tokio::sync::Mutex<Option<h2::client::SendRequest<Bytes>>>,
}

/// The HTTP/2 connections to every endpoint.
pub struct H2Calls {
    endpoints: Vec<Endpoint>,
    dial: Dial,
    dial_timeout: Duration,
    max_recv: usize,
    /// The stream and connection receive windows (tonic's client defaults: 2 MiB / 5 MiB).
    windows: (u32, u32),
}

impl std::fmt::Debug for H2Calls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2Calls")
            .field(
                "endpoints",
                &self.endpoints.iter().map(|e| &e.url).collect::<Vec<_>>(),
            )
            .finish()
    }
}

fn unavailable(e: impl std::fmt::Display) -> Status {
    Status::unavailable(e.to_string())
}

impl H2Calls {
    pub fn new(urls: &[String], dial: Dial, dial_timeout: Duration, max_recv: usize) -> H2Calls {
        H2Calls {
            endpoints: urls
                .iter()
                .map(|u| Endpoint {
                    url: u.clone(),
                    base: u.trim_end_matches('/').to_string(),
                    conn: tokio::sync::Mutex::new(None),
                })
                .collect(),
            dial,
            dial_timeout,
            max_recv,
            windows: (2 << 20, 5 << 20),
        }
    }

    /// A sender on endpoint `i`'s connection, connecting first if there is none.
    async fn sender(&self, i: usize) -> Result<h2::client::SendRequest<Bytes>, Status> {
        let ep = &self.endpoints[i];
        let mut conn = ep.conn.lock().await;
        if let Some(s) = conn.as_ref() {
            return Ok(s.clone());
        }
        let io = tokio::time::timeout(self.dial_timeout, (self.dial)(ep.url.clone()))
            .await
            .map_err(|_| unavailable(format!("{}: connection timed out", ep.url)))?
            .map_err(|e| unavailable(format!("{}: {e}", ep.url)))?;
        let (send, connection) = h2::client::Builder::new()
            .initial_window_size(self.windows.0)
            .initial_connection_window_size(self.windows.1)
            .max_frame_size(1 << 20)
            .handshake::<_, Bytes>(io)
            .await
            .map_err(|e| unavailable(format!("{}: {e}", ep.url)))?;
        let url = ep.url.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(%url, "upstream connection ended: {e}");
            }
        });
        *conn = Some(send.clone());
        Ok(send)
    }

    /// Forgets endpoint `i`'s connection (it broke): the next call makes a new one.
    async fn forget(&self, i: usize) {
        *self.endpoints[i].conn.lock().await = None;
    }

    /// Calls unary method `path` (`/package.Service/Method`) on endpoint `i` with `req`
    /// and the credential header `creds` (name, value), and decodes its answer.
    pub async fn call<Req: Message, Resp: Message + Default>(
        &self,
        i: usize,
        path: &'static str,
        req: &Req,
        creds: Option<(&'static str, &[u8])>,
    ) -> Result<Resp, Status> {
        let bytes = self.call_bytes(i, path, req, creds).await?;
        Resp::decode(bytes).map_err(|e| {
            Status::internal(format!(
                "grpc: failed to unmarshal the received message: {e}"
            ))
        })
    }

    async fn call_bytes<Req: Message>(
        &self,
        i: usize,
        path: &'static str,
        req: &Req,
        creds: Option<(&'static str, &[u8])>,
    ) -> Result<Bytes, Status> {
        // A connection found broken is made again, once.
        let mut send = match self.sender(i).await?.ready().await {
            Ok(s) => s,
            Err(_) => {
                self.forget(i).await;
                self.sender(i).await?.ready().await.map_err(unavailable)?
            }
        };
        let mut b = http::Request::builder()
            .method(http::Method::POST)
            .uri(format!("{}{path}", self.endpoints[i].base))
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers");
        if let Some((name, value)) = creds {
            b = b.header(name, value);
        }
        let request = b.body(()).map_err(|e| Status::internal(e.to_string()))?;
        let (response, mut body) = match send.send_request(request, false) {
            Ok(x) => x,
            Err(e) => {
                self.forget(i).await;
                return Err(unavailable(e));
            }
        };
        let len = req.encoded_len();
        let mut msg = BytesMut::with_capacity(5 + len);
        msg.put_u8(0);
        msg.put_u32(len as u32);
        req.encode(&mut msg)
            .map_err(|e| Status::internal(e.to_string()))?;
        body.send_data(msg.freeze(), true).map_err(unavailable)?;
        let response = match response.await {
            Ok(r) => r,
            Err(e) => {
                if e.is_io() || e.is_go_away() {
                    self.forget(i).await;
                }
                return Err(unavailable(e));
            }
        };
        let (head, mut body) = response.into_parts();
        if head.status != http::StatusCode::OK {
            return Err(Status::unknown(format!(
                "unexpected HTTP status code received from server: {}",
                head.status.as_u16()
            )));
        }
        // A trailers-only answer: the status is in the headers.
        if let Some(status) = status_of(&head.headers) {
            return Err(status);
        }
        let mut data = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(unavailable)?;
            let n = chunk.len();
            data.extend_from_slice(&chunk);
            let _ = body.flow_control().release_capacity(n);
            if data.len() > self.max_recv + 5 {
                return Err(Status::resource_exhausted(format!(
                    "grpc: received message larger than max ({} vs. {})",
                    data.len() - 5,
                    self.max_recv
                )));
            }
        }
        let trailers = body.trailers().await.map_err(unavailable)?;
        if let Some(status) = trailers.as_ref().and_then(status_of) {
            return Err(status);
        }
        let mut data = data.freeze();
        if data.len() < 5 || data[0] != 0 {
            return Err(Status::internal(
                "grpc: the server's answer is not one uncompressed message",
            ));
        }
        data.advance(1);
        let n = data.get_u32() as usize;
        if data.len() != n {
            return Err(Status::internal("grpc: a truncated message"));
        }
        Ok(data)
    }
}

/// The gRPC status a header map carries, unless it is OK.
fn status_of(h: &http::HeaderMap) -> Option<Status> {
    Status::from_header_map(h).filter(|s| s.code() != Code::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_in_the_headers_is_read() {
        let mut h = http::HeaderMap::new();
        h.insert("grpc-status", "3".parse().unwrap());
        h.insert(
            "grpc-message",
            "etcdserver:%20key%20is%20not%20provided".parse().unwrap(),
        );
        let s = status_of(&h).unwrap();
        assert_eq!(
            (s.code(), s.message()),
            (Code::InvalidArgument, "etcdserver: key is not provided")
        );
        h.insert("grpc-status", "0".parse().unwrap());
        assert!(status_of(&h).is_none());
    }
}
