//! A lean HTTP/2 server connection for gRPC.
//!
//! The hot unary methods of a gRPC API are answered by the connection itself: it decodes the
//! HTTP/2 frames and HPACK headers, hands the request message to a [`Unary`] handler, and
//! writes the response, the responses of every call that finished meanwhile leaving in one
//! write. No task, tower stack, `http::Request` or body object is made per call. Every other
//! request (streaming calls, other services, plain HTTP) is bridged to a tower service as an
//! `http::Request` whose body streams the DATA frames, as hyper would serve it.
//!
//! Why not hyper + h2 for everything: for a small unary call they cost more CPU than the call
//! itself (a spawned task, a header map, tower and routing layers, several allocations per
//! frame). kvd's client port serves etcd's KV calls here, everything else through tonic.
//!
//! ```no_run
//! # async fn example(
//! #     sock: tokio::net::TcpStream,
//! #     unary: std::sync::Arc<dyn grpc_wire::Unary>,
//! #     svc: axum::Router,
//! # ) -> Result<(), grpc_wire::Error> {
//! let cfg = std::sync::Arc::new(grpc_wire::Config::default());
//! grpc_wire::serve(sock, b"", cfg, unary, svc, std::future::pending()).await
//! # }
//! ```

mod bridge;
mod conn;
pub mod frame;
mod grpc;
mod hpack;
mod request;
mod sniff;

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;

pub use bridge::RecvBody;
pub use conn::serve;
pub use frame::Reason;
pub use sniff::{sniff, Protocol, Rewind};

/// A unary call's answer: the encoded response message, or a gRPC status.
pub type UnaryFuture = Pin<Box<dyn Future<Output = Result<Bytes, tonic::Status>> + Send>>;

/// The unary gRPC methods a connection answers itself.
pub trait Unary: std::fmt::Debug + Send + Sync + 'static {
    /// The id of the method at gRPC `path` (`/package.Service/Method`), or `None` to pass
    /// the call to the tower service.
    fn route(&self, path: &[u8]) -> Option<usize>;

    /// Calls method `id` with the request message (the payload without gRPC's prefix).
    fn call(&self, id: usize, msg: Bytes) -> UnaryFuture;
}

/// The response body of the tower service calls are bridged to.
pub trait ResponseBody:
    http_body::Body<Data = Bytes, Error: std::fmt::Display> + Send + 'static
{
}

impl<B> ResponseBody for B where
    B: http_body::Body<Data = Bytes, Error: std::fmt::Display> + Send + 'static
{
}

/// A bridged service's response, taken apart for framing (`http::Response` of a
/// [`ResponseBody`]).
pub trait Response: Send + 'static {
    type Body: ResponseBody;
    fn into_parts(self) -> (http::response::Parts, Self::Body);
}

impl<B: ResponseBody> Response for http::Response<B> {
    type Body = B;

    fn into_parts(self) -> (http::response::Parts, B) {
        http::Response::into_parts(self)
    }
}

/// The tower service a connection hands every request it does not answer itself (axum's
/// `Router` is one).
pub trait Fallback:
    tower_service::Service<
        http::Request<RecvBody>,
        Response: Response,
        Error = std::convert::Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
{
}

impl<S> Fallback for S where
    S: tower_service::Service<
            http::Request<RecvBody>,
            Response: Response,
            Error = std::convert::Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static
{
}

/// A connection's limits and windows.
#[derive(Debug, Clone)]
pub struct Config {
    /// The largest request message (gRPC's receive limit); a larger one is refused with
    /// grpc-go's RESOURCE_EXHAUSTED text.
    pub max_recv_message: usize,
    /// Streams a client may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS).
    pub max_concurrent_streams: u32,
    /// The receive window of each stream (SETTINGS_INITIAL_WINDOW_SIZE).
    pub stream_window: u32,
    /// The receive window of the connection.
    pub conn_window: u32,
    /// The largest frame we accept (SETTINGS_MAX_FRAME_SIZE).
    pub max_frame_size: u32,
    /// The largest header list we accept, decoded (SETTINGS_MAX_HEADER_LIST_SIZE).
    pub max_header_list_size: u32,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            max_recv_message: 4 << 20,
            // grpc-go's (and so etcd's) default: no limit worth naming.
            max_concurrent_streams: u32::MAX,
            stream_window: 1 << 20,
            conn_window: 1 << 20,
            max_frame_size: 16_384,
            max_header_list_size: 1 << 20,
        }
    }
}

/// Why a connection ended early.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("connection I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The peer broke the protocol; it was told with a GOAWAY.
    #[error("HTTP/2 {reason}: {why}")]
    Protocol { reason: Reason, why: String },
}
