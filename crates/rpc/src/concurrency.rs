//! `v3lockpb.Lock` and `v3electionpb.Election`: etcd runs clientv3's `concurrency` recipes
//! (Mutex, Election) inside the server, over an in-process client. kvd runs the same recipes
//! over its own KV and Lease services and mvcc watchers, with the same keys, revisions and
//! answers: a hold or a candidacy is the key `name/<lease in hex>` under the caller's lease; the
//! key with the lowest create revision holds the lock or leads.
//!
//! As etcd's, these servers hand their inner requests' failures back with gRPC code `Unknown`
//! and the inner message (`etcdserver: requested lease not found`, `election: not leader`, …).

use std::pin::Pin;
use std::sync::Arc;

use api::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use api::etcdserverpb::kv_server::Kv;
use api::etcdserverpb::lease_server::Lease;
use api::etcdserverpb::range_request::{SortOrder, SortTarget};
use api::etcdserverpb::request_op::Request as ReqOp;
use api::etcdserverpb::response_op::Response as RespOp;
use api::etcdserverpb::{
    Compare, DeleteRangeRequest, LeaseGrantRequest, PutRequest, RangeRequest, RangeResponse,
    RequestOp, ResponseHeader, TxnRequest, TxnResponse, WatchCreateRequest,
};
use api::mvccpb::event::EventType;
use api::mvccpb::KeyValue;
use api::v3electionpb::election_server::Election;
use api::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};
use api::v3lockpb::lock_server::Lock;
use api::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use ids::{LeaseId, Revision};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::auth::Creds;
use crate::kv::KvService;
use crate::lease::LeaseService;
use crate::server::Core;

/// The TTL of the lease granted for a Lock or Campaign that names none (clientv3's
/// default session TTL).
const SESSION_TTL: i64 = 60;

/// A recipe's failure as etcd's lock and election servers answer it.
fn unknown(s: Status) -> Status {
    Status::unknown(s.message().to_owned())
}

fn recipe_error(msg: &str) -> Status {
    Status::unknown(msg.to_owned())
}

/// The smallest key greater than every key starting with `p` (`"\0"` if none is).
fn prefix_end(p: &[u8]) -> Vec<u8> {
    let mut end = p.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The prefix of a lock's holds or an election's candidates: `name/`.
fn prefix(name: &[u8]) -> Vec<u8> {
    let mut pfx = name.to_vec();
    pfx.push(b'/');
    pfx
}

/// `name/` and the key `name/<lease in hex>` a session holds under it.
fn session_key(name: &[u8], lease: i64) -> (Vec<u8>, Vec<u8>) {
    let pfx = prefix(name);
    let mut key = pfx.clone();
    key.extend_from_slice(LeaseId(lease).to_string().as_bytes());
    (pfx, key)
}

fn created_at(key: &[u8], rev: i64) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Create as i32,
        key: key.to_vec(),
        target_union: Some(TargetUnion::CreateRevision(rev)),
        ..Default::default()
    }
}

fn op(r: ReqOp) -> RequestOp {
    RequestOp { request: Some(r) }
}

fn get(key: &[u8]) -> RangeRequest {
    RangeRequest {
        key: key.to_vec(),
        ..Default::default()
    }
}

/// The oldest (`Ascend`) or newest (`Descend`) key under `pfx` by create revision.
fn by_create(pfx: &[u8], order: SortOrder) -> RangeRequest {
    RangeRequest {
        key: pfx.to_vec(),
        range_end: prefix_end(pfx),
        limit: 1,
        sort_order: order as i32,
        sort_target: SortTarget::Create as i32,
        ..Default::default()
    }
}

fn range_at(t: &TxnResponse, i: usize) -> Option<&RangeResponse> {
    match t.responses.get(i)?.response.as_ref()? {
        RespOp::ResponseRange(r) => Some(r),
        _ => None,
    }
}

/// The KV, Lease and watch operations the recipes are written in, served locally, as the
/// caller (etcd's recipes run on a client with the caller's credentials: each operation is
/// checked against the caller's permissions).
#[derive(Debug, Clone)]
struct Local {
    core: Arc<Core>,
    kv: KvService,
    lease: LeaseService,
    creds: Creds,
}

impl Local {
    fn new(core: Arc<Core>) -> Self {
        Local {
            kv: KvService::new(core.clone()),
            lease: LeaseService::new(core.clone()),
            core,
            creds: Creds::default(),
        }
    }

    /// The same, as the caller of `req`.
    fn as_caller_of<T>(&self, req: &Request<T>) -> Local {
        Local {
            creds: Creds::of(req),
            ..self.clone()
        }
    }

    fn request<T>(&self, msg: T) -> Request<T> {
        self.creds.request(msg)
    }

    async fn txn(&self, t: TxnRequest) -> Result<TxnResponse, Status> {
        self.kv.txn(self.request(t)).await.map(Response::into_inner)
    }

    async fn range(&self, r: RangeRequest) -> Result<RangeResponse, Status> {
        self.kv
            .range(self.request(r))
            .await
            .map(Response::into_inner)
    }

    async fn delete(&self, key: &[u8]) -> Result<ResponseHeader, Status> {
        let r = DeleteRangeRequest {
            key: key.to_vec(),
            ..Default::default()
        };
        let resp = self.kv.delete_range(self.request(r)).await?.into_inner();
        Ok(resp.header.unwrap_or_default())
    }

    /// The caller's lease, or a fresh one when it named none (etcd's session).
    async fn session(&self, lease: i64) -> Result<i64, Status> {
        if lease != 0 {
            return Ok(lease);
        }
        let r = LeaseGrantRequest {
            ttl: SESSION_TTL,
            id: 0,
        };
        Ok(self
            .lease
            .lease_grant(self.request(r))
            .await?
            .into_inner()
            .id)
    }

    /// Deletes `key` if it was created at `rev` (a resignation); the txn's header.
    async fn delete_if_created(&self, key: &[u8], rev: i64) -> Result<ResponseHeader, Status> {
        let t = TxnRequest {
            compare: vec![created_at(key, rev)],
            success: vec![op(ReqOp::RequestDeleteRange(DeleteRangeRequest {
                key: key.to_vec(),
                ..Default::default()
            }))],
            failure: vec![],
        };
        Ok(self.txn(t).await?.header.unwrap_or_default())
    }

    /// Waits until every key under `pfx` created at or before `max_create_rev` is deleted
    /// (clientv3's waitDeletes: the newest such key first, then the next).
    async fn wait_deletes(&self, pfx: &[u8], max_create_rev: i64) -> Result<(), Status> {
        loop {
            let mut r = by_create(pfx, SortOrder::Descend);
            r.max_create_revision = max_create_rev;
            let resp = self.range(r).await?;
            let Some(last) = resp.kvs.first() else {
                return Ok(());
            };
            let rev = resp.header.map_or(0, |h| h.revision);
            let mut w = Watching::new(&self.core, &last.key, None, rev)?;
            loop {
                match w.next().await? {
                    // The store was replaced by a snapshot: look again.
                    None => break,
                    Some(r) => {
                        if r.events
                            .iter()
                            .any(|e| e.r#type == EventType::Delete as i32)
                        {
                            break;
                        }
                    }
                }
            }
        }
    }
}

/// One mvcc watcher, ended early when the store is replaced by a snapshot.
struct Watching {
    ws: mvcc::WatchStream,
    generation: tokio::sync::watch::Receiver<u64>,
}

impl Watching {
    fn new(core: &Core, key: &[u8], end: Option<Vec<u8>>, rev: i64) -> Result<Self, Status> {
        let mut generation = core.backend.generation();
        generation.mark_unchanged();
        let ws = core.backend.store().watch_stream();
        let req = WatchCreateRequest {
            key: key.to_vec(),
            range_end: end.unwrap_or_default(),
            start_revision: rev,
            ..Default::default()
        };
        ws.watch(&req)
            .map_err(|e| unknown(crate::error::mvcc(&e)))?;
        Ok(Watching { ws, generation })
    }

    /// The next response with events; `None` when the store was replaced.
    async fn next(&mut self) -> Result<Option<mvcc::WatchResponse>, Status> {
        loop {
            tokio::select! {
                r = self.ws.recv() => match r {
                    Some(r) if r.compact_revision.0 != 0 => {
                        return Err(unknown(crate::error::mvcc(&mvcc::Error::Compacted)));
                    }
                    Some(r) if r.events.is_empty() => continue,
                    Some(r) => return Ok(Some(r)),
                    None => return Err(recipe_error("etcdserver: server stopped")),
                },
                _ = self.generation.changed() => return Ok(None),
            }
        }
    }
}

/// Runs a cleanup if the request it guards ends early (the client cancelled or went away):
/// a waiting lock or candidacy must not stay queued behind the others.
struct Cleanup {
    local: Local,
    key: Vec<u8>,
    /// Delete only if created at this revision (a candidacy); 0 deletes unconditionally.
    rev: i64,
    armed: bool,
}

impl Cleanup {
    fn new(local: &Local, key: &[u8], rev: i64) -> Self {
        Cleanup {
            local: local.clone(),
            key: key.to_vec(),
            rev,
            armed: true,
        }
    }

    async fn run(mut self) {
        self.armed = false;
        let r = if self.rev == 0 {
            self.local.delete(&self.key).await
        } else {
            self.local.delete_if_created(&self.key, self.rev).await
        };
        if let Err(e) = r {
            tracing::debug!(key = %String::from_utf8_lossy(&self.key), "cleanup failed: {}", e.message());
        }
    }

    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let c = Cleanup {
            local: self.local.clone(),
            key: std::mem::take(&mut self.key),
            rev: self.rev,
            armed: false,
        };
        tokio::spawn(c.run());
    }
}

/// The Lock service.
#[derive(Debug, Clone)]
pub struct LockService {
    local: Local,
}

impl LockService {
    pub fn new(core: Arc<Core>) -> Self {
        LockService {
            local: Local::new(core),
        }
    }
}

#[tonic::async_trait]
impl Lock for LockService {
    async fn lock(&self, req: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let l = &self.local.as_caller_of(&req);
        let r = req.into_inner();
        let lease = l.session(r.lease).await.map_err(unknown)?;
        let (pfx, key) = session_key(&r.name, lease);
        let owner = by_create(&pfx, SortOrder::Ascend);
        let t = TxnRequest {
            compare: vec![created_at(&key, 0)],
            success: vec![
                op(ReqOp::RequestPut(PutRequest {
                    key: key.clone(),
                    lease,
                    ..Default::default()
                })),
                op(ReqOp::RequestRange(owner.clone())),
            ],
            failure: vec![
                op(ReqOp::RequestRange(get(&key))),
                op(ReqOp::RequestRange(owner)),
            ],
        };
        let resp = l.txn(t).await.map_err(unknown)?;
        let mut my_rev = resp.header.as_ref().map_or(0, |h| h.revision);
        if !resp.succeeded {
            my_rev = range_at(&resp, 0)
                .and_then(|r| r.kvs.first())
                .map_or(my_rev, |kv| kv.create_revision);
        }
        let held = range_at(&resp, 1)
            .and_then(|r| r.kvs.first())
            .is_none_or(|kv| kv.create_revision == my_rev);
        if held {
            return Ok(Response::new(LockResponse {
                header: resp.header,
                key,
            }));
        }
        let cleanup = Cleanup::new(l, &key, 0);
        if let Err(e) = l.wait_deletes(&pfx, my_rev - 1).await {
            cleanup.run().await;
            return Err(unknown(e));
        }
        let mine = match l.range(get(&key)).await {
            Ok(r) => r,
            Err(e) => {
                cleanup.run().await;
                return Err(unknown(e));
            }
        };
        cleanup.disarm();
        if mine.kvs.is_empty() {
            // The lease expired or was revoked while waiting: the hold is gone.
            return Err(recipe_error("mutex: session is expired"));
        }
        Ok(Response::new(LockResponse {
            header: mine.header,
            key,
        }))
    }

    async fn unlock(
        &self,
        req: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        let header = self
            .local
            .as_caller_of(&req)
            .delete(&req.into_inner().key)
            .await
            .map_err(unknown)?;
        Ok(Response::new(UnlockResponse {
            header: Some(header),
        }))
    }
}

/// The Election service.
#[derive(Debug, Clone)]
pub struct ElectionService {
    local: Local,
}

impl ElectionService {
    pub fn new(core: Arc<Core>) -> Self {
        ElectionService {
            local: Local::new(core),
        }
    }

    /// Puts `value` on the leader key if it still is `leader`'s, as `l`'s caller; the txn's
    /// header.
    async fn proclaim(
        l: &Local,
        leader: &LeaderKey,
        value: &[u8],
    ) -> Result<ResponseHeader, Status> {
        let t = TxnRequest {
            compare: vec![created_at(&leader.key, leader.rev)],
            success: vec![op(ReqOp::RequestPut(PutRequest {
                key: leader.key.clone(),
                value: value.to_vec(),
                lease: leader.lease,
                ..Default::default()
            }))],
            failure: vec![],
        };
        let resp = l.txn(t).await.map_err(unknown)?;
        if !resp.succeeded {
            return Err(recipe_error("election: not leader"));
        }
        Ok(resp.header.unwrap_or_default())
    }
}

fn leader_field(l: Option<LeaderKey>) -> Result<LeaderKey, Status> {
    l.ok_or_else(|| recipe_error("\"leader\" field must be provided"))
}

type ObserveOut = Pin<Box<dyn Stream<Item = Result<LeaderResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Election for ElectionService {
    async fn campaign(
        &self,
        req: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        let l = &self.local.as_caller_of(&req);
        let r = req.into_inner();
        let lease = l.session(r.lease).await.map_err(unknown)?;
        let (pfx, key) = session_key(&r.name, lease);
        let t = TxnRequest {
            compare: vec![created_at(&key, 0)],
            success: vec![op(ReqOp::RequestPut(PutRequest {
                key: key.clone(),
                value: r.value.clone(),
                lease,
                ..Default::default()
            }))],
            failure: vec![op(ReqOp::RequestRange(get(&key)))],
        };
        let resp = l.txn(t).await.map_err(unknown)?;
        let mut leader = LeaderKey {
            name: r.name,
            key,
            rev: resp.header.as_ref().map_or(0, |h| h.revision),
            lease,
        };
        if !resp.succeeded {
            if let Some(kv) = range_at(&resp, 0).and_then(|r| r.kvs.first()) {
                leader.rev = kv.create_revision;
                if kv.value != r.value {
                    if let Err(e) = ElectionService::proclaim(l, &leader, &r.value).await {
                        Cleanup::new(l, &leader.key, leader.rev).run().await;
                        return Err(e);
                    }
                }
            }
        }
        let cleanup = Cleanup::new(l, &leader.key, leader.rev);
        if let Err(e) = l.wait_deletes(&pfx, leader.rev - 1).await {
            // As etcd: a failed wait (not a cancelled one) leaves the candidacy in place.
            cleanup.disarm();
            return Err(unknown(e));
        }
        cleanup.disarm();
        Ok(Response::new(CampaignResponse {
            header: resp.header,
            leader: Some(leader),
        }))
    }

    async fn proclaim(
        &self,
        req: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        let l = self.local.as_caller_of(&req);
        let r = req.into_inner();
        let leader = leader_field(r.leader)?;
        let header = ElectionService::proclaim(&l, &leader, &r.value).await?;
        Ok(Response::new(ProclaimResponse {
            header: Some(header),
        }))
    }

    async fn leader(
        &self,
        req: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        let l = self.local.as_caller_of(&req);
        let pfx = prefix(&req.into_inner().name);
        let resp = l
            .range(by_create(&pfx, SortOrder::Ascend))
            .await
            .map_err(unknown)?;
        let kv = resp.kvs.into_iter().next();
        if kv.is_none() {
            return Err(recipe_error("election: no leader"));
        }
        Ok(Response::new(LeaderResponse {
            header: resp.header,
            kv,
        }))
    }

    type ObserveStream = ObserveOut;

    async fn observe(
        &self,
        req: Request<LeaderRequest>,
    ) -> Result<Response<Self::ObserveStream>, Status> {
        let local = self.local.as_caller_of(&req);
        let pfx = prefix(&req.into_inner().name);
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            // Ends quietly when the client leaves or a read or watch fails, as etcd's does.
            tokio::select! {
                _ = observe(&local, &pfx, &tx) => {}
                _ = tx.closed() => {}
            }
        });
        Ok(Response::new(
            Box::pin(ReceiverStream::new(rx)) as ObserveOut
        ))
    }

    async fn resign(
        &self,
        req: Request<ResignRequest>,
    ) -> Result<Response<ResignResponse>, Status> {
        let l = self.local.as_caller_of(&req);
        let leader = leader_field(req.into_inner().leader)?;
        let header = l
            .delete_if_created(&leader.key, leader.rev)
            .await
            .map_err(unknown)?;
        Ok(Response::new(ResignResponse {
            header: Some(header),
        }))
    }
}

type ObserveTx = mpsc::Sender<Result<LeaderResponse, Status>>;

/// clientv3's Election.Observe: the leader now, then each new value of its key, then the next
/// leader once that key is deleted.
async fn observe(local: &Local, pfx: &[u8], tx: &ObserveTx) -> Result<(), Status> {
    let core = &local.core;
    let send = |rev: Revision, kv: KeyValue| LeaderResponse {
        header: Some(core.header(rev)),
        kv: Some(kv),
    };
    loop {
        let resp = local.range(by_create(pfx, SortOrder::Ascend)).await?;
        let rev = resp.header.as_ref().map_or(0, |h| h.revision);
        let (rev, kv) = match resp.kvs.into_iter().next() {
            Some(kv) => (rev, kv),
            None => {
                // No leader yet: the first key put under the prefix leads.
                let mut w = Watching::new(core, pfx, Some(prefix_end(pfx)), rev)?;
                let first = loop {
                    let Some(r) = w.next().await? else {
                        break None;
                    };
                    let put = r
                        .events
                        .into_iter()
                        .find(|e| e.r#type == EventType::Put as i32);
                    if let Some(kv) = put.and_then(|e| e.kv) {
                        break Some(kv);
                    }
                };
                let Some(kv) = first else {
                    continue;
                };
                (kv.mod_revision, kv)
            }
        };
        let key = kv.key.clone();
        if tx.send(Ok(send(Revision(rev), kv))).await.is_err() {
            return Ok(());
        }
        let mut w = Watching::new(core, &key, None, rev + 1)?;
        'leader: loop {
            let Some(r) = w.next().await? else {
                break;
            };
            for ev in r.events {
                if ev.r#type == EventType::Delete as i32 {
                    break 'leader;
                }
                if let Some(kv) = ev.kv {
                    if tx.send(Ok(send(r.revision, kv))).await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_keys_are_clientv3s() {
        let (pfx, key) = session_key(b"mylock", 0x694d8a7d3c1e2f05);
        assert_eq!(pfx, b"mylock/");
        assert_eq!(key, b"mylock/694d8a7d3c1e2f05");
        assert_eq!(prefix_end(b"a/"), b"a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\0");
    }
}
