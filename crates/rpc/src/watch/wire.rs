//! The Watch service on the wire: the tower service tonic would generate for
//! `etcdserverpb.Watch`, with a codec that writes each response's events from their shared
//! encoding (see [`mvcc::WatchEvents`]) instead of copying and encoding them once per watcher.
//! The bytes are the ones prost writes for the same `WatchResponse`.

use std::convert::Infallible;
use std::task::{Context, Poll};

use api::etcdserverpb::{WatchRequest, WatchResponse};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Request, Response, Status, Streaming};

use super::{WatchOut, WatchService};

/// The field number of `events` in `etcdserverpb.WatchResponse`.
const EVENTS_FIELD: u32 = 11;
const PATH: &str = "/etcdserverpb.Watch/Watch";

/// One response on its way to the client: every field but the events, and the events.
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub(crate) head: WatchResponse,
    pub(crate) events: mvcc::WatchEvents,
}

impl From<WatchResponse> for Outgoing {
    /// A response whose events (if any) are its own.
    fn from(mut head: WatchResponse) -> Outgoing {
        let events = std::mem::take(&mut head.events).into();
        Outgoing { head, events }
    }
}

impl Outgoing {
    /// The bytes of its encoding.
    pub(crate) fn encoded_len(&self) -> usize {
        self.head.encoded_len() + self.events.encoded_len(EVENTS_FIELD)
    }
}

/// Requests decode as prost's codec decodes them; responses encode as above.
#[derive(Debug, Default, Clone, Copy)]
struct WatchCodec;

impl Codec for WatchCodec {
    type Encode = Outgoing;
    type Decode = WatchRequest;
    type Encoder = WatchCodec;
    type Decoder = WatchCodec;

    fn encoder(&mut self) -> WatchCodec {
        WatchCodec
    }

    fn decoder(&mut self) -> WatchCodec {
        WatchCodec
    }
}

impl Encoder for WatchCodec {
    type Item = Outgoing;
    type Error = Status;

    fn encode(&mut self, item: Outgoing, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        // The head comes first: prost writes fields in the order of their numbers, and the
        // events' (11) is the last.
        item.head
            .encode(dst)
            .map_err(|e| Status::internal(e.to_string()))?;
        item.events.encode(EVENTS_FIELD, dst);
        Ok(())
    }
}

impl Decoder for WatchCodec {
    type Item = WatchRequest;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<WatchRequest>, Status> {
        WatchRequest::decode(src)
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }
}

/// The `etcdserverpb.Watch` service, as tonic's generated `WatchServer` serves it (with no
/// compression, as that one is configured).
#[derive(Debug, Clone)]
pub(crate) struct WatchServer {
    svc: WatchService,
    max_decoding: usize,
    max_encoding: usize,
}

impl WatchServer {
    pub(crate) fn new(svc: WatchService, max_decoding: usize, max_encoding: usize) -> Self {
        WatchServer {
            svc,
            max_decoding,
            max_encoding,
        }
    }
}

impl NamedService for WatchServer {
    const NAME: &'static str = "etcdserverpb.Watch";
}

impl<B> Service<http::Request<B>> for WatchServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != PATH {
            return Box::pin(async { Ok(Status::unimplemented("").into_http()) });
        }
        let this = self.clone();
        Box::pin(async move {
            let mut grpc = Grpc::new(WatchCodec)
                .apply_max_message_size_config(Some(this.max_decoding), Some(this.max_encoding));
            Ok(grpc.streaming(Method(this.svc), req).await)
        })
    }
}

struct Method(WatchService);

impl StreamingService<WatchRequest> for Method {
    type Response = Outgoing;
    type ResponseStream = WatchOut;
    type Future = BoxFuture<Response<WatchOut>, Status>;

    fn call(&mut self, req: Request<Streaming<WatchRequest>>) -> Self::Future {
        let svc = self.0.clone();
        Box::pin(async move { svc.watch(req) })
    }
}
