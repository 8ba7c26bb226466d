//! `etcdserverpb.KV`: reads from a store snapshot (after a ReadIndex round unless
//! serializable), streamed in chunks for RangeStream, writes through consensus.

use std::sync::Arc;

use api::etcdserverpb::kv_server::Kv;
use api::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};
use ids::Revision;
use mvcc::validate;
use tonic::{Request, Response, Status};

use crate::auth::{self, AuthInfo};
use crate::error;
use crate::range_stream;
use crate::request::{Op, Response as Applied};
use crate::server::Core;

/// The KV service.
#[derive(Debug, Clone)]
pub struct KvService {
    core: Arc<Core>,
}

impl KvService {
    pub fn new(core: Arc<Core>) -> Self {
        KvService { core }
    }
}

/// Whether a txn writes (any put or delete, at any depth).
fn writes(t: &TxnRequest) -> bool {
    !mvcc::is_txn_readonly(t)
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn range(&self, req: Request<RangeRequest>) -> Result<Response<RangeResponse>, Status> {
        let who = self.core.who(&req).await?;
        range(&self.core, who.as_ref(), req.into_inner())
            .await
            .map(Response::new)
    }

    type RangeStreamStream = range_stream::Chunks;

    async fn range_stream(
        &self,
        req: Request<RangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        let who = self.core.who(&req).await?;
        range_stream::range_stream(self.core.clone(), who, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn put(&self, req: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let who = self.core.who(&req).await?;
        put(&self.core, who.as_ref(), req.into_inner())
            .await
            .map(Response::new)
    }

    async fn delete_range(
        &self,
        req: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let who = self.core.who(&req).await?;
        delete_range(&self.core, who.as_ref(), req.into_inner())
            .await
            .map(Response::new)
    }

    async fn txn(&self, req: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let who = self.core.who(&req).await?;
        txn(&self.core, who.as_ref(), req.into_inner())
            .await
            .map(Response::new)
    }

    async fn compact(
        &self,
        req: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        let who = self.core.who(&req).await?;
        let r = req.into_inner();
        self.core.refuse_learner()?;
        self.core.admin(who.as_ref())?;
        let (rev, physical) = (r.revision, r.physical);
        match self.core.propose(Op::Compaction(r), who.as_ref()).await? {
            Applied::Compaction(mut resp) => {
                if physical {
                    let store = self.core.backend.store();
                    tokio::task::spawn_blocking(move || store.wait_compaction(Revision(rev)))
                        .await
                        .map_err(|e| Status::internal(e.to_string()))?
                        .map_err(|e| error::mvcc(&e))?;
                }
                self.core.fill(&mut resp.header);
                Ok(Response::new(resp))
            }
            other => Err(other.unexpected()),
        }
    }
}

// The calls themselves, shared by the tonic service above and the client connection's
// unary path (`direct_kv.rs`); `who` is the caller, whose permissions are checked here (and again
// when a write is applied).

pub(crate) async fn range(
    core: &Core,
    who: Option<&AuthInfo>,
    r: RangeRequest,
) -> Result<RangeResponse, Status> {
    let start = std::time::Instant::now();
    let answer = read_range(core, who, r).await;
    crate::metrics::read(false, answer.is_ok(), start);
    answer
}

async fn read_range(
    core: &Core,
    who: Option<&AuthInfo>,
    r: RangeRequest,
) -> Result<RangeResponse, Status> {
    validate::check_range(&r).map_err(|e| error::mvcc(&e))?;
    if !r.serializable {
        core.refuse_learner()?;
        core.linearize().await?;
    }
    core.permitted(who, |c| auth::range(c, &r))?;
    let store = core.backend.store();
    let mut resp = store
        .read()
        .and_then(|mut s| s.range(&r))
        .map_err(|e| error::mvcc(&e))?;
    core.auth_unchanged(who)?;
    core.fill(&mut resp.header);
    Ok(resp)
}

pub(crate) async fn put(
    core: &Core,
    who: Option<&AuthInfo>,
    r: PutRequest,
) -> Result<PutResponse, Status> {
    validate::check_put(&r).map_err(|e| error::mvcc(&e))?;
    core.refuse_learner()?;
    core.permitted(who, |c| auth::put(c, &r))?;
    core.check_quota(r.key.len() + r.value.len()).await?;
    match core.propose(Op::Put(r), who).await? {
        Applied::Put(mut resp) => {
            core.fill(&mut resp.header);
            Ok(resp)
        }
        other => Err(other.unexpected()),
    }
}

pub(crate) async fn delete_range(
    core: &Core,
    who: Option<&AuthInfo>,
    r: DeleteRangeRequest,
) -> Result<DeleteRangeResponse, Status> {
    validate::check_delete(&r).map_err(|e| error::mvcc(&e))?;
    core.refuse_learner()?;
    core.permitted(who, |c| auth::delete_range(c, &r))?;
    match core.propose(Op::DeleteRange(r), who).await? {
        Applied::DeleteRange(mut resp) => {
            core.fill(&mut resp.header);
            Ok(resp)
        }
        other => Err(other.unexpected()),
    }
}

pub(crate) async fn txn(
    core: &Core,
    who: Option<&AuthInfo>,
    t: TxnRequest,
) -> Result<TxnResponse, Status> {
    validate::check_txn(&t, core.cfg.max_txn_ops).map_err(|e| error::mvcc(&e))?;
    core.refuse_learner()?;
    if !writes(&t) {
        let start = std::time::Instant::now();
        let answer = read_txn(core, who, &t).await;
        crate::metrics::read(true, answer.is_ok(), start);
        return answer;
    }
    core.permitted(who, |c| auth::txn(c, &t))?;
    core.check_quota(prost::Message::encoded_len(&t)).await?;
    match core.propose(Op::Txn(t), who).await? {
        Applied::Txn(mut resp) => {
            core.fill(&mut resp.header);
            Ok(resp)
        }
        other => Err(other.unexpected()),
    }
}

/// A Txn that only reads: after a ReadIndex round, in a store snapshot.
async fn read_txn(
    core: &Core,
    who: Option<&AuthInfo>,
    t: &TxnRequest,
) -> Result<TxnResponse, Status> {
    core.linearize().await?;
    core.permitted(who, |c| auth::txn(c, t))?;
    let store = core.backend.store();
    let mut resp = store
        .read()
        .and_then(|mut s| s.txn(t))
        .map_err(|e| error::mvcc(&e))?;
    core.auth_unchanged(who)?;
    core.fill(&mut resp.header);
    Ok(resp)
}
