//! A KV server that does no work: the floor under any server's cost per call, for the
//! measurements in docs/measurements.md. Range and Put answer an empty response at once (Put after one
//! 4 KiB `fdatasync` with `NOOP_FSYNC=1`); nothing is stored.
//!
//! `NOOP_STACK=tonic` serves it with tonic's server (hyper + h2 + tower), `NOOP_STACK=wire` (the
//! default) with grpc-wire, as kvd's client port does. It listens on 127.0.0.1:23790 and
//! ignores its arguments, so `tests/tools/server-cpu.sh` drives it like kvd:
//!
//! ```sh
//! cargo build --release -p kvd --example noop-kv
//! NOOP_STACK=tonic tests/tools/server-cpu.sh target/release/examples/noop-kv range-s
//! NOOP_STACK=wire  tests/tools/server-cpu.sh target/release/examples/noop-kv range-s
//! NOOP_FSYNC=1     tests/tools/server-cpu.sh target/release/examples/noop-kv put1
//! ```

use std::convert::Infallible;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use api::etcdserverpb::kv_server::{Kv, KvServer};
use api::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, ResponseHeader, TxnRequest, TxnResponse,
};
use bytes::Bytes;
use prost::Message;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status};

/// The work a put does: nothing, or one `fdatasync` of a 4 KiB overwrite.
#[derive(Debug)]
struct Noop {
    file: Option<std::fs::File>,
}

impl Noop {
    fn header() -> Option<ResponseHeader> {
        Some(ResponseHeader {
            revision: 1,
            ..Default::default()
        })
    }

    fn put(&self) -> PutResponse {
        if let Some(f) = &self.file {
            f.write_at(&[1; 4096], 0).expect("write");
            f.sync_data().expect("fdatasync");
        }
        PutResponse {
            header: Self::header(),
            ..Default::default()
        }
    }

    fn range(&self) -> RangeResponse {
        RangeResponse {
            header: Self::header(),
            ..Default::default()
        }
    }
}

/// The same, as a tonic service.
#[derive(Debug)]
struct TonicNoop(Arc<Noop>);

#[tonic::async_trait]
impl Kv for TonicNoop {
    async fn range(&self, _: Request<RangeRequest>) -> Result<Response<RangeResponse>, Status> {
        Ok(Response::new(self.0.range()))
    }
    async fn put(&self, _: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        Ok(Response::new(self.0.put()))
    }
    async fn delete_range(
        &self,
        _: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        Err(Status::unimplemented("noop"))
    }
    async fn txn(&self, _: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        Err(Status::unimplemented("noop"))
    }
    async fn compact(
        &self,
        _: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        Err(Status::unimplemented("noop"))
    }
}

impl grpc_wire::Unary for Noop {
    fn route(&self, path: &[u8]) -> Option<usize> {
        match path {
            b"/etcdserverpb.KV/Range" => Some(0),
            b"/etcdserverpb.KV/Put" => Some(1),
            _ => None,
        }
    }

    fn call(
        &self,
        id: usize,
        msg: Bytes,
        _head: grpc_wire::CallHead<'_>,
    ) -> grpc_wire::UnaryFuture {
        // Decoded as a real server would, then dropped.
        let out = if id == 0 {
            drop(RangeRequest::decode(msg));
            self.range().encode_to_vec()
        } else {
            drop(PutRequest::decode(msg));
            self.put().encode_to_vec()
        };
        Box::pin(std::future::ready(Ok(Bytes::from(out))))
    }
}

/// Everything but Range and Put: UNIMPLEMENTED.
#[derive(Debug, Clone)]
struct Unimplemented;

impl tower_service::Service<http::Request<grpc_wire::RecvBody>> for Unimplemented {
    type Response = http::Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<http::Response<String>, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<grpc_wire::RecvBody>) -> Self::Future {
        std::future::ready(Ok(Status::unimplemented("noop").into_http()))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = match std::env::var_os("NOOP_FSYNC") {
        None => None,
        Some(_) => {
            let f = tempfile::tempfile()?;
            f.write_at(&[0; 4096], 0)?;
            f.sync_all()?;
            Some(f)
        }
    };
    let noop = Arc::new(Noop { file });
    let tonic_stack = std::env::var("NOOP_STACK").is_ok_and(|s| s == "tonic");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let l = tokio::net::TcpListener::bind("127.0.0.1:23790").await?;
        if tonic_stack {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(l)
                .map(|s| s.inspect(|s| drop(s.set_nodelay(true))));
            tonic::transport::Server::builder()
                .add_service(KvServer::new(TonicNoop(noop)))
                .serve_with_incoming(incoming)
                .await?;
            return Ok(());
        }
        let cfg = Arc::new(grpc_wire::Config::default());
        let unary: Arc<dyn grpc_wire::Unary> = noop;
        loop {
            let (mut sock, _) = l.accept().await?;
            sock.set_nodelay(true)?;
            let (cfg, unary) = (cfg.clone(), unary.clone());
            tokio::spawn(async move {
                if let Ok((grpc_wire::Protocol::Http2, first)) = grpc_wire::sniff(&mut sock).await {
                    let never = std::future::pending();
                    let _ = grpc_wire::serve(
                        sock,
                        &first,
                        cfg,
                        unary,
                        Unimplemented,
                        Default::default(),
                        never,
                    )
                    .await;
                }
            });
        }
    })
}
