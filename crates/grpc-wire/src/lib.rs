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
//! let conn = http::Extensions::new();
//! grpc_wire::serve(sock, b"", cfg, unary, svc, conn, std::future::pending()).await
//! # }
//! ```

mod bridge;
mod conn;
pub mod frame;
mod grpc;
mod guard;
mod hpack;
mod metrics;
mod request;
mod sniff;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

pub use bridge::RecvBody;
pub use conn::serve;
pub use frame::Reason;
pub use grpc::{fallback, rewrite_status, too_large};
pub use guard::{Guard, RemoteAddr, Stats};
pub use metrics::CallMetrics;
pub use sniff::{sniff, Protocol, Rewind};

/// A unary call's answer: the encoded response message, or a gRPC status.
pub type UnaryFuture = Pin<Box<dyn Future<Output = Result<Bytes, tonic::Status>> + Send>>;

/// The unary gRPC methods a connection answers itself.
pub trait Unary: std::fmt::Debug + Send + Sync + 'static {
    /// The id of the method at gRPC `path` (`/package.Service/Method`), or `None` to pass
    /// the call to the tower service.
    fn route(&self, path: &[u8]) -> Option<usize>;

    /// Calls method `id` with the request message (the payload without gRPC's prefix) and
    /// what came with it (its metadata, the connection's extensions).
    fn call(&self, id: usize, msg: Bytes, head: CallHead<'_>) -> UnaryFuture;
}

/// A unary call's request metadata and its connection's extensions (what [`serve`] was
/// given: the client's TLS identity, say), as a bridged request has them in its
/// `http::Request`.
#[derive(Debug, Clone, Copy)]
pub struct CallHead<'a> {
    headers: &'a [(Bytes, Bytes)],
    extensions: &'a http::Extensions,
}

impl<'a> CallHead<'a> {
    pub fn new(headers: &'a [(Bytes, Bytes)], extensions: &'a http::Extensions) -> Self {
        CallHead {
            headers,
            extensions,
        }
    }

    /// The first value of metadata `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.as_ref() == name.as_bytes())
            .map(|(_, v)| v.as_ref())
    }

    /// The connection's extensions.
    pub fn extensions(&self) -> &'a http::Extensions {
        self.extensions
    }
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
    /// Ping a client after this long without a byte from it, and close the connection if the
    /// ping is not acknowledged within `keepalive_timeout` (grpc-go's keepalive `Time` and
    /// `Timeout`; etcd's `--grpc-keepalive-interval` and `--grpc-keepalive-timeout`, 2 h and
    /// 20 s). `None`: never.
    pub keepalive_interval: Option<Duration>,
    pub keepalive_timeout: Duration,
    /// How often a client may ping while it has streams open (grpc-go's enforcement policy
    /// `MinTime`; etcd's `--grpc-keepalive-min-time`, 5 s); without streams, once in two hours
    /// (etcd's `PermitWithoutStream: false`). A ping sooner is a strike, unless the server
    /// sent HEADERS or DATA since the last one (grpc-go's BDP pings answer those); the third
    /// strike ends the connection with GOAWAY(ENHANCE_YOUR_CALM, "too_many_pings").
    pub ping_min_interval: Duration,
    /// What one connection may hold for its client, on each side. Unsent responses (framed
    /// and waiting for the socket, or queued for the peer's flow-control window): past it, the
    /// connection's calls are not run on (their answers would only pile up) until they drain,
    /// so its new requests wait (backpressure; one answer larger than the bound still goes).
    /// Request state (open streams, their header blocks, request bodies not yet read): past
    /// it, new streams are refused (REFUSED_STREAM, which clients retry), and data for any
    /// request but the oldest unfinished one refuses that request.
    pub max_conn_buffer: usize,
    /// The same bytes of all connections together: past it, every connection holding more
    /// than [`FAIR_SHARE`] is held back as if over its own bound, so others keep being served.
    pub max_total_buffer: usize,
    /// What the connections served with this config share: the total above, each client
    /// address's budget for frames that do no work, and counts for metrics.
    pub guard: Arc<Guard>,
    /// grpc-go's server metrics of the calls served (None: not counted).
    pub calls: Option<Arc<CallMetrics>>,
}

/// What a connection may hold while the server as a whole is over
/// [`Config::max_total_buffer`].
pub const FAIR_SHARE: usize = 1 << 20;

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
            keepalive_interval: Some(Duration::from_secs(2 * 3600)),
            keepalive_timeout: Duration::from_secs(20),
            ping_min_interval: Duration::from_secs(5),
            max_conn_buffer: 16 << 20,
            max_total_buffer: 512 << 20,
            guard: Arc::default(),
            calls: None,
        }
    }
}

/// Why a connection ended early.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("connection I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The peer broke the protocol, or abused it; it was told with a GOAWAY.
    #[error("HTTP/2 {reason}: {why}")]
    Protocol { reason: Reason, why: String },
    /// The client did not acknowledge a keepalive ping in time.
    #[error("the client did not answer a keepalive ping within {0:?}")]
    KeepaliveTimeout(Duration),
}
