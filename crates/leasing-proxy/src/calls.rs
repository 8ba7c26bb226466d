//! The calls the proxy makes to the cluster, for its clients and for itself: each goes to the
//! current endpoint with the caller's credentials, under the namespace, within etcd's proxy
//! message limits (`--max-send-bytes`, `--max-recv-bytes`), counted, and an endpoint found
//! unreachable is left for the next.

use std::sync::Arc;

use api::etcdserverpb::auth_client::AuthClient;
use api::etcdserverpb::cluster_client::ClusterClient;
use api::etcdserverpb::kv_client::KvClient;
use api::etcdserverpb::lease_client::LeaseClient;
use api::etcdserverpb::maintenance_client::MaintenanceClient;
use api::etcdserverpb::*;
use api::v3electionpb::election_client::ElectionClient;
use api::v3lockpb::lock_client::LockClient;
use futures_util::{Stream, StreamExt};
use prost::Message;
use tonic::transport::Channel;
use tonic::Status;

use crate::metrics::Metrics;
use crate::namespace::Namespace;
use crate::upstream::{Creds, Upstream};

/// The proxy's way to the cluster.
#[derive(Debug, Clone)]
pub struct Calls {
    pub up: Arc<Upstream>,
    pub ns: Namespace,
    pub metrics: Arc<Metrics>,
    /// The largest message sent to, and taken from, the cluster.
    pub max_send: usize,
    pub max_recv: usize,
}

/// A client of one of etcd's services on the current endpoint, with the proxy's limits.
macro_rules! client {
    ($name:ident, $ty:ident) => {
        pub fn $name(&self) -> (usize, $ty<Channel>) {
            let (i, ch) = self.up.channel();
            self.metrics.upstream.inc();
            (
                i,
                $ty::new(ch)
                    .max_decoding_message_size(self.max_recv)
                    .max_encoding_message_size(self.max_send),
            )
        }
    };
}

impl Calls {
    client!(kv, KvClient);
    client!(lease, LeaseClient);
    client!(cluster, ClusterClient);
    client!(maintenance, MaintenanceClient);
    client!(auth, AuthClient);
    client!(lock, LockClient);
    client!(election, ElectionClient);

    /// grpc-go's refusal of a message over the send limit, before anything is sent.
    pub fn check_send<T: Message>(&self, msg: &T) -> Result<(), Status> {
        let n = msg.encoded_len();
        if n > self.max_send {
            return Err(Status::resource_exhausted(format!(
                "grpc: trying to send message larger than max ({n} vs. {})",
                self.max_send
            )));
        }
        Ok(())
    }

    /// The answer of a call made on endpoint `i`: the message, its header noted; or the
    /// error, an unreachable endpoint left.
    pub fn answer<T>(&self, i: usize, r: Result<tonic::Response<T>, Status>) -> Result<T, Status> {
        r.map(tonic::Response::into_inner)
            .inspect_err(|s| self.up.failed(i, s))
    }

    /// A unary KV call on the current endpoint, over HTTP/2 directly.
    async fn kv_call<Req: Message, Resp: Message + Default>(
        &self,
        path: &'static str,
        creds: &Creds,
        req: &Req,
    ) -> Result<Resp, Status> {
        self.check_send(req)?;
        let (i, _) = self.up.channel();
        self.metrics.upstream.inc();
        self.up
            .h2
            .call(i, path, req, creds.header())
            .await
            .inspect_err(|s| self.up.failed(i, s))
    }

    pub async fn range(&self, creds: &Creds, mut r: RangeRequest) -> Result<RangeResponse, Status> {
        self.ns.range(&mut r);
        let mut resp: RangeResponse = self.kv_call("/etcdserverpb.KV/Range", creds, &r).await?;
        self.up.saw(resp.header.as_ref());
        self.ns.range_resp(&mut resp);
        Ok(resp)
    }

    /// etcd 3.7's RangeStream, forwarded: the chunks as the cluster sends them, under the
    /// namespace.
    pub async fn range_stream(
        &self,
        creds: &Creds,
        mut r: RangeRequest,
    ) -> Result<impl Stream<Item = Result<RangeStreamResponse, Status>> + Send + 'static, Status>
    {
        self.ns.range(&mut r);
        self.check_send(&r)?;
        let (i, mut c) = self.kv();
        let chunks = self.answer(i, c.range_stream(creds.request(r)).await)?;
        let calls = self.clone();
        Ok(chunks.map(move |chunk| {
            let mut chunk = chunk.inspect_err(|s| calls.up.failed(i, s))?;
            if let Some(resp) = &mut chunk.range_response {
                calls.up.saw(resp.header.as_ref());
                calls.ns.range_resp(resp);
            }
            Ok(chunk)
        }))
    }

    pub async fn put(&self, creds: &Creds, mut r: PutRequest) -> Result<PutResponse, Status> {
        self.ns.put(&mut r);
        let mut resp: PutResponse = self.kv_call("/etcdserverpb.KV/Put", creds, &r).await?;
        self.up.saw(resp.header.as_ref());
        self.ns.put_resp(&mut resp);
        Ok(resp)
    }

    pub async fn delete_range(
        &self,
        creds: &Creds,
        mut r: DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, Status> {
        self.ns.delete_range(&mut r);
        let mut resp: DeleteRangeResponse = self
            .kv_call("/etcdserverpb.KV/DeleteRange", creds, &r)
            .await?;
        self.up.saw(resp.header.as_ref());
        self.ns.delete_resp(&mut resp);
        Ok(resp)
    }

    pub async fn txn(&self, creds: &Creds, mut t: TxnRequest) -> Result<TxnResponse, Status> {
        self.ns.txn(&mut t);
        let mut resp: TxnResponse = self.kv_call("/etcdserverpb.KV/Txn", creds, &t).await?;
        self.up.saw(resp.header.as_ref());
        self.ns.txn_resp(&mut resp);
        Ok(resp)
    }

    pub async fn compact(
        &self,
        creds: &Creds,
        r: CompactionRequest,
    ) -> Result<CompactionResponse, Status> {
        let resp: CompactionResponse = self.kv_call("/etcdserverpb.KV/Compact", creds, &r).await?;
        self.up.saw(resp.header.as_ref());
        Ok(resp)
    }
}
