//! The KV service of the proxy: through the leasing layer when it is on (cached reads, writes
//! through the protocol), otherwise forwarded. Served twice, by the same code: answered by the
//! client connection itself (grpc-wire's [`grpc_wire::Unary`], no tonic machinery per call:
//! a cache hit costs a decode, a lookup and an encode), and as a tonic service for clients
//! that compress their messages.

use std::sync::Arc;

use api::etcdserverpb::kv_server;
use api::etcdserverpb::request_op::Request as Op;
use api::etcdserverpb::*;
use bytes::Bytes;
use prost::Message;
use tonic::{Request, Response, Status};

use crate::calls::Calls;
use crate::leasing::Leasing;
use crate::upstream::Creds;

/// The proxy's KV calls.
#[derive(Debug, Clone)]
pub struct Kv {
    calls: Calls,
    leasing: Option<Arc<Leasing>>,
}

fn writes(t: &TxnRequest) -> bool {
    t.success
        .iter()
        .chain(&t.failure)
        .any(|o| match &o.request {
            Some(Op::RequestPut(_)) | Some(Op::RequestDeleteRange(_)) => true,
            Some(Op::RequestTxn(t)) => writes(t),
            _ => false,
        })
}

impl Kv {
    pub fn new(calls: Calls, leasing: Option<Arc<Leasing>>) -> Kv {
        Kv { calls, leasing }
    }

    /// `r` answered from the cache, if it may be.
    pub fn hit(&self, r: &RangeRequest, creds: &Creds) -> Option<RangeResponse> {
        self.leasing.as_ref()?.read(r, creds).ok()
    }

    pub async fn range(&self, creds: &Creds, r: RangeRequest) -> Result<RangeResponse, Status> {
        let Some(l) = &self.leasing else {
            return self.calls.range(creds, r).await;
        };
        match l.read(&r, creds) {
            Ok(hit) => Ok(hit),
            Err(ticket) => {
                let resp = self.calls.range(creds, r.clone()).await?;
                l.after_read(&r, ticket, &resp);
                Ok(resp)
            }
        }
    }

    pub async fn put(&self, creds: &Creds, p: PutRequest) -> Result<PutResponse, Status> {
        match &self.leasing {
            Some(l) => l.put(creds, p).await,
            None => self.calls.put(creds, p).await,
        }
    }

    pub async fn delete_range(
        &self,
        creds: &Creds,
        d: DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, Status> {
        match &self.leasing {
            Some(l) => l.delete_range(creds, d).await,
            None => self.calls.delete_range(creds, d).await,
        }
    }

    pub async fn txn(&self, creds: &Creds, t: TxnRequest) -> Result<TxnResponse, Status> {
        match &self.leasing {
            Some(l) if writes(&t) => l.txn(creds, t).await,
            _ => self.calls.txn(creds, t).await,
        }
    }

    pub async fn compact(
        &self,
        creds: &Creds,
        c: CompactionRequest,
    ) -> Result<CompactionResponse, Status> {
        self.calls.compact(creds, c).await
    }
}

#[tonic::async_trait]
impl kv_server::Kv for Kv {
    async fn range(&self, req: Request<RangeRequest>) -> Result<Response<RangeResponse>, Status> {
        let creds = Creds::from_metadata(req.metadata());
        Kv::range(self, &creds, req.into_inner())
            .await
            .map(Response::new)
    }

    type RangeStreamStream =
        futures_util::stream::BoxStream<'static, Result<RangeStreamResponse, Status>>;

    /// Forwarded past the cache (etcd's own proxy answers Unimplemented).
    async fn range_stream(
        &self,
        req: Request<RangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        let creds = Creds::from_metadata(req.metadata());
        let chunks = self.calls.range_stream(&creds, req.into_inner()).await?;
        Ok(Response::new(Box::pin(chunks)))
    }

    async fn put(&self, req: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let creds = Creds::from_metadata(req.metadata());
        Kv::put(self, &creds, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn delete_range(
        &self,
        req: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let creds = Creds::from_metadata(req.metadata());
        Kv::delete_range(self, &creds, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn txn(&self, req: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let creds = Creds::from_metadata(req.metadata());
        Kv::txn(self, &creds, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn compact(
        &self,
        req: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        let creds = Creds::from_metadata(req.metadata());
        Kv::compact(self, &creds, req.into_inner())
            .await
            .map(Response::new)
    }
}

/// The methods the connection answers itself, by gRPC path; the index is the method's id.
const METHODS: [&[u8]; 4] = [
    b"/etcdserverpb.KV/Range",
    b"/etcdserverpb.KV/Put",
    b"/etcdserverpb.KV/DeleteRange",
    b"/etcdserverpb.KV/Txn",
];

/// The KV calls as the client connection answers them.
#[derive(Debug, Clone)]
pub struct KvCalls(pub Arc<Kv>);

fn creds_of(head: &grpc_wire::CallHead<'_>) -> Creds {
    for name in ["token", "authorization"] {
        if let Some(v) = head.header(name) {
            return Creds::from_header(name, v);
        }
    }
    Creds::default()
}

fn decoded<T: Message + Default>(msg: Bytes) -> Result<T, Status> {
    // grpc-go's (etcd's) words for a request that does not decode.
    T::decode(msg).map_err(|e| Status::internal(format!("grpc: error unmarshalling request: {e}")))
}

fn encoded<T: Message>(r: Result<T, Status>) -> Result<Bytes, Status> {
    r.map(|m| Bytes::from(m.encode_to_vec()))
}

impl grpc_wire::Unary for KvCalls {
    fn route(&self, path: &[u8]) -> Option<usize> {
        METHODS.iter().position(|m| *m == path)
    }

    fn call(&self, id: usize, msg: Bytes, head: grpc_wire::CallHead<'_>) -> grpc_wire::UnaryFuture {
        let creds = creds_of(&head);
        match id {
            0 => {
                let r: RangeRequest = match decoded(msg) {
                    Ok(r) => r,
                    Err(s) => return Box::pin(std::future::ready(Err(s))),
                };
                // A hit is answered at once, with no task.
                if let Some(hit) = self.0.hit(&r, &creds) {
                    return Box::pin(std::future::ready(encoded(Ok(hit))));
                }
                let kv = self.0.clone();
                Box::pin(async move { encoded(kv.range(&creds, r).await) })
            }
            1 => {
                let kv = self.0.clone();
                Box::pin(async move { encoded(kv.put(&creds, decoded(msg)?).await) })
            }
            2 => {
                let kv = self.0.clone();
                Box::pin(async move { encoded(kv.delete_range(&creds, decoded(msg)?).await) })
            }
            _ => {
                let kv = self.0.clone();
                Box::pin(async move { encoded(kv.txn(&creds, decoded(msg)?).await) })
            }
        }
    }
}
