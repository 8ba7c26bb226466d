//! etcd's KV calls answered by the client connection itself (see the `grpc-wire` crate): the
//! request message is decoded, the call runs and its response is encoded here, with no tonic
//! or tower machinery per call. They run the same code as the tonic `KV` service
//! (`kv.rs`), which still serves them when a client compresses its messages.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use prost::Message;
use tonic::Status;

use crate::auth::{AuthInfo, Creds};
use crate::kv;
use crate::server::{Core, KvCallInFlight};
use crate::ClientCert;

/// The methods answered here, by gRPC path; the index is the method's id.
const METHODS: [&[u8]; 4] = [
    b"/etcdserverpb.KV/Range",
    b"/etcdserverpb.KV/Put",
    b"/etcdserverpb.KV/DeleteRange",
    b"/etcdserverpb.KV/Txn",
];

/// etcd's KV calls over `core`.
#[derive(Debug)]
pub struct KvCalls {
    core: Arc<Core>,
}

impl KvCalls {
    pub fn new(core: Arc<Core>) -> KvCalls {
        KvCalls { core }
    }
}

/// Decodes the request, finds its caller (its token, or its connection's certificate), runs
/// `call` and encodes its answer.
fn run<Req, Resp, F>(
    core: &Arc<Core>,
    msg: Bytes,
    head: grpc_wire::CallHead<'_>,
    call: fn(Arc<Core>, Option<AuthInfo>, Req) -> F,
) -> grpc_wire::UnaryFuture
where
    Req: Message + Default + Send + 'static,
    Resp: Message,
    F: Future<Output = Result<Resp, Status>> + Send + 'static,
{
    match Req::decode(msg) {
        // grpc-go's (etcd's) words for a request that does not decode.
        Err(e) => Box::pin(std::future::ready(Err(Status::internal(format!(
            "grpc: error unmarshalling request: {e}"
        ))))),
        Ok(req) => {
            let creds = Creds {
                token: head
                    .header("token")
                    .or_else(|| head.header("authorization"))
                    .map(|t| String::from_utf8_lossy(t).into_owned()),
                cert: head.extensions().get::<ClientCert>().cloned(),
            };
            let in_flight = KvCallInFlight::new(core);
            let core = core.clone();
            Box::pin(async move {
                let _in_flight = in_flight;
                let who = core.identify(&creds).await?;
                let resp = call(core, who, req).await?;
                Ok(Bytes::from(resp.encode_to_vec()))
            })
        }
    }
}

impl grpc_wire::Unary for KvCalls {
    fn route(&self, path: &[u8]) -> Option<usize> {
        METHODS.iter().position(|m| *m == path)
    }

    fn call(&self, id: usize, msg: Bytes, head: grpc_wire::CallHead<'_>) -> grpc_wire::UnaryFuture {
        match id {
            0 => run(&self.core, msg, head, |c, who, r| async move {
                kv::range(&c, who.as_ref(), r).await
            }),
            1 => run(&self.core, msg, head, |c, who, r| async move {
                kv::put(&c, who.as_ref(), r).await
            }),
            2 => run(&self.core, msg, head, |c, who, r| async move {
                kv::delete_range(&c, who.as_ref(), r).await
            }),
            _ => run(&self.core, msg, head, |c, who, r| async move {
                kv::txn(&c, who.as_ref(), r).await
            }),
        }
    }
}
