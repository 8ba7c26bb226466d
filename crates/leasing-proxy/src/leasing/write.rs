//! Writes through the protocol, each applied exactly once: guarded so that it commits only
//! with no other holder of what it writes; when the guard fails, the holders are revoked, the
//! write waits for their leasing keys to go, and tries again (the write itself sits only in
//! the guarded branch, so a failed try changes nothing).
//!
//! A write of a few single keys (a put, a delete of one key, a small txn) guards on each
//! key's holders and revokes an exclusive holder in the same txn: one round trip when no one
//! else holds the keys, as etcd's. A write of ranges (or a large txn) reads the holders
//! first, revokes them, then guards with one compare over the span of their leasing keys:
//! nothing there created since that read.

use std::sync::Arc;
use std::time::Duration;

use api::etcdserverpb::compare::{CompareResult, TargetUnion};
use api::etcdserverpb::request_op::Request as Op;
use api::etcdserverpb::response_op::Response as RespOp;
use api::etcdserverpb::*;
use api::mvccpb::{event::EventType, KeyValue};
use tokio::time::Instant;
use tonic::Status;

use super::keys::{cmp, REVOKE};
use super::{get, op, range_of, Leasing};
use crate::cache::{WriteOutcome, Writing};
use crate::upstream::Creds;
use crate::watchmux::WatchMux;

/// The longest a write waits for holders to give its keys up (a holder that died lets go
/// when its session lease expires; a client that gives up sooner cancels the wait).
const REVOKE_WAIT: Duration = Duration::from_secs(300);
/// Written keys up to which a txn takes the one-round-trip path, and its ops up to which (the
/// guard's compares and the wrapping count against the cluster's `--max-txn-ops`).
const FEW_KEYS: usize = 4;
const FEW_OPS: usize = 64;

/// What a write touches: single keys, or ranges (etcd's `range_end` conventions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Item {
    pub key: Vec<u8>,
    pub end: Vec<u8>,
}

/// The items a txn writes, in both branches, at every depth.
pub(crate) fn written(t: &TxnRequest, out: &mut Vec<Item>) {
    for o in t.success.iter().chain(&t.failure) {
        match &o.request {
            Some(Op::RequestPut(p)) => out.push(Item {
                key: p.key.clone(),
                end: Vec::new(),
            }),
            Some(Op::RequestDeleteRange(d)) => out.push(Item {
                key: d.key.clone(),
                end: d.range_end.clone(),
            }),
            Some(Op::RequestTxn(t)) => written(t, out),
            _ => {}
        }
    }
}

fn ops(t: &TxnRequest) -> usize {
    t.compare.len()
        + t.success
            .iter()
            .chain(&t.failure)
            .map(|o| match &o.request {
                Some(Op::RequestTxn(t)) => 1 + ops(t),
                _ => 1,
            })
            .sum::<usize>()
}

/// The writes of the proxy's to held keys under way, ended once each: a write dropped before
/// it ended (its client went away) may yet apply, so its keys are given up.
struct Writes<'a> {
    leasing: &'a Arc<Leasing>,
    keys: Vec<Vec<u8>>,
    ws: Vec<Writing>,
    ended: Vec<bool>,
}

impl<'a> Writes<'a> {
    fn begin(leasing: &'a Arc<Leasing>, keys: Vec<Vec<u8>>) -> Writes<'a> {
        let ws = keys.iter().map(|k| leasing.cache.begin_write(k)).collect();
        Writes {
            leasing,
            ended: vec![false; keys.len()],
            keys,
            ws,
        }
    }

    fn end(&mut self, i: usize, outcome: WriteOutcome) {
        if std::mem::replace(&mut self.ended[i], true) {
            return;
        }
        if let Some(r) = self
            .leasing
            .cache
            .end_write(&self.keys[i], self.ws[i], outcome)
        {
            self.leasing.forget(&self.keys[i], r);
        }
    }

    fn end_all(&mut self, outcome: impl Fn() -> WriteOutcome) {
        for i in 0..self.keys.len() {
            self.end(i, outcome());
        }
    }
}

impl Drop for Writes<'_> {
    fn drop(&mut self) {
        self.end_all(|| WriteOutcome::Lost);
    }
}

/// A client's response, taken out of the wrapping write's answer (under its header).
trait Inner: Sized {
    const WHAT: &'static str;
    fn take(r: RespOp) -> Option<Self>;
    fn set_header(&mut self, h: ResponseHeader);

    fn from(r: ResponseOp, h: ResponseHeader) -> Result<Self, Status> {
        let mut inner = r.response.and_then(Self::take).ok_or_else(|| {
            Status::internal(format!(
                "the cluster answered a {} with another response",
                Self::WHAT
            ))
        })?;
        inner.set_header(h);
        Ok(inner)
    }
}

macro_rules! inner {
    ($ty:ty, $variant:ident, $what:literal) => {
        impl Inner for $ty {
            const WHAT: &'static str = $what;
            fn take(r: RespOp) -> Option<Self> {
                match r {
                    RespOp::$variant(x) => Some(x),
                    _ => None,
                }
            }
            fn set_header(&mut self, h: ResponseHeader) {
                self.header = Some(h);
            }
        }
    };
}

inner!(PutResponse, ResponsePut, "put");
inner!(DeleteRangeResponse, ResponseDeleteRange, "delete");
inner!(TxnResponse, ResponseTxn, "txn");

impl Leasing {
    /// A client's Put, through the protocol.
    pub async fn put(
        self: &Arc<Self>,
        creds: &Creds,
        p: PutRequest,
    ) -> Result<PutResponse, Status> {
        let key = p.key.clone();
        let (r, header) = self.write_keys(creds, vec![key], Op::RequestPut(p)).await?;
        Inner::from(r, header)
    }

    /// A client's DeleteRange, through the protocol.
    pub async fn delete_range(
        self: &Arc<Self>,
        creds: &Creds,
        d: DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, Status> {
        let (r, header) = if d.range_end.is_empty() {
            let key = d.key.clone();
            self.write_keys(creds, vec![key], Op::RequestDeleteRange(d))
                .await?
        } else {
            let item = Item {
                key: d.key.clone(),
                end: d.range_end.clone(),
            };
            self.write_ranges(creds, vec![item], Op::RequestDeleteRange(d))
                .await?
        };
        Inner::from(r, header)
    }

    /// A client's Txn that writes, through the protocol.
    pub async fn txn(
        self: &Arc<Self>,
        creds: &Creds,
        t: TxnRequest,
    ) -> Result<TxnResponse, Status> {
        let mut items = Vec::new();
        written(&t, &mut items);
        let mut keys: Vec<Vec<u8>> = Vec::new();
        let singles = items.iter().all(|i| i.end.is_empty());
        if singles {
            for i in &items {
                if !keys.contains(&i.key) {
                    keys.push(i.key.clone());
                }
            }
        }
        let (r, header) = if singles && keys.len() <= FEW_KEYS && ops(&t) <= FEW_OPS {
            self.write_keys(creds, keys, Op::RequestTxn(t)).await?
        } else {
            self.write_ranges(creds, items, Op::RequestTxn(t)).await?
        };
        Inner::from(r, header)
    }

    /// `client_op`, which writes `keys` (single keys), once no other holder has them.
    async fn write_keys(
        self: &Arc<Self>,
        creds: &Creds,
        keys: Vec<Vec<u8>>,
        client_op: Op,
    ) -> Result<(ResponseOp, ResponseHeader), Status> {
        let until = Instant::now() + REVOKE_WAIT;
        let lease = self.session.lease();
        let generation = self.session.generation();
        let mut writes = Writes::begin(self, keys.clone());
        loop {
            let mut compare = Vec::new();
            let mut success = vec![op(client_op.clone())];
            let mut failure = Vec::new();
            // Where the answers for each held key's value and leasing key are.
            let mut learn = Vec::new();
            for (i, key) in keys.iter().enumerate() {
                let w = writes.ws[i];
                // A key held under an older session is held no more.
                let own = if w.generation == generation { w.own } else { 0 };
                compare.extend(self.keys.write_guard(key, own, lease));
                if own != 0 {
                    learn.push((i, success.len()));
                    success.push(op(get(key)));
                    success.push(op(get(&self.keys.own(key, lease))));
                }
                failure.push(op(Op::RequestTxn(self.revoke_exclusive(key, own))));
                let (lo, hi) = self.keys.holders(key);
                failure.push(op(Op::RequestRange(RangeRequest {
                    key: lo,
                    range_end: hi,
                    ..Default::default()
                })));
            }
            let t = TxnRequest {
                compare,
                success,
                failure,
            };
            let resp = match self.calls.txn(creds, t).await {
                Ok(r) => r,
                Err(s) => {
                    writes.end_all(|| WriteOutcome::Lost);
                    return Err(s);
                }
            };
            let header = resp.header.unwrap_or_default();
            if resp.succeeded {
                for (i, at) in learn {
                    let value = resp.responses.get(at).and_then(range_of);
                    let lk = resp.responses.get(at + 1).and_then(range_of);
                    let value = value.map(|r| r.kvs.first().cloned());
                    let ours = lk
                        .and_then(|r| r.kvs.first())
                        .is_some_and(|l| l.create_revision == writes.ws[i].own);
                    let outcome = match value {
                        // A key with a lease can go without a write: it is not held.
                        Some(v) if ours && v.as_ref().is_none_or(|kv| kv.lease == 0) => {
                            WriteOutcome::Known {
                                value: v,
                                at: header.revision,
                            }
                        }
                        _ => WriteOutcome::Lost,
                    };
                    writes.end(i, outcome);
                }
                writes.end_all(|| WriteOutcome::Unknown {
                    at: header.revision,
                });
                let first = resp.responses.into_iter().next().unwrap_or_default();
                return Ok((first, header));
            }
            // Another holds a key: revoke, wait, try again.
            let mut gone = Vec::new();
            for (j, key) in keys.iter().enumerate() {
                let own = writes.ws[j].own;
                let holders = resp.responses.get(2 * j + 1).and_then(range_of);
                for l in holders.map(|r| r.kvs.as_slice()).unwrap_or_default() {
                    if self.is_own_holder(key, l, lease, own) {
                        continue;
                    }
                    if l.value == REVOKE && l.mod_revision == header.revision {
                        // Revoked by this very txn's failure branch.
                        self.metrics.revocations_sent.inc();
                    }
                    gone.push(l.clone());
                }
            }
            if let Err(s) = self.revoke_and_wait(creds, gone, until).await {
                // The guard failed: nothing was written; the keys held stay held.
                writes.end_all(|| WriteOutcome::NotApplied);
                return Err(s);
            }
        }
    }

    /// `client_op`, which writes `items` (ranges, or many keys), once no other holder has
    /// them.
    async fn write_ranges(
        self: &Arc<Self>,
        creds: &Creds,
        items: Vec<Item>,
        client_op: Op,
    ) -> Result<(ResponseOp, ResponseHeader), Status> {
        let until = Instant::now() + REVOKE_WAIT;
        let spans: Vec<(Vec<u8>, Vec<u8>)> = items
            .iter()
            .map(|i| self.keys.holders_of_range(&i.key, &i.end))
            .collect();
        let lo = spans.iter().map(|s| s.0.clone()).min().unwrap_or_default();
        let hi = spans.iter().map(|s| s.1.clone()).max().unwrap_or_default();
        loop {
            let lease = self.session.lease();
            // Who holds what is written.
            let read = TxnRequest {
                compare: Vec::new(),
                success: spans
                    .iter()
                    .map(|(k, e)| {
                        op(Op::RequestRange(RangeRequest {
                            key: k.clone(),
                            range_end: e.clone(),
                            ..Default::default()
                        }))
                    })
                    .collect(),
                failure: Vec::new(),
            };
            let held = self.calls.txn(creds, read).await?;
            let read_rev = held.header.as_ref().map_or(0, |h| h.revision);
            let mut gone = Vec::new();
            for l in held
                .responses
                .iter()
                .filter_map(range_of)
                .flat_map(|r| &r.kvs)
            {
                let own = self
                    .keys
                    .key_of(&l.key, lease)
                    .and_then(|k| self.cache.held_as(k))
                    .unwrap_or(0);
                if l.lease == lease && lease != 0 && l.create_revision == own {
                    continue;
                }
                gone.push(l.clone());
            }
            self.revoke_and_wait(creds, gone, until).await?;
            // The write, guarded: nothing in the span created since the read (what was
            // there is gone, or the proxy's own).
            let mine: Vec<Vec<u8>> = items
                .iter()
                .flat_map(|i| self.cache.held_in(&i.key, &i.end))
                .collect();
            let mut writes = Writes::begin(self, mine);
            let t = TxnRequest {
                compare: vec![cmp(
                    lo.clone(),
                    hi.clone(),
                    CompareResult::Less,
                    TargetUnion::CreateRevision(read_rev + 1),
                )],
                success: vec![op(client_op.clone())],
                failure: Vec::new(),
            };
            let resp = match self.calls.txn(creds, t).await {
                Ok(r) => r,
                Err(s) => {
                    writes.end_all(|| WriteOutcome::Lost);
                    return Err(s);
                }
            };
            let header = resp.header.unwrap_or_default();
            if resp.succeeded {
                writes.end_all(|| WriteOutcome::Unknown {
                    at: header.revision,
                });
                let first = resp.responses.into_iter().next().unwrap_or_default();
                return Ok((first, header));
            }
            writes.end_all(|| WriteOutcome::NotApplied);
        }
    }

    /// Whether leasing key `l` of `key` is the proxy's own, as the write knows it.
    fn is_own_holder(&self, key: &[u8], l: &KeyValue, lease: i64, own: i64) -> bool {
        own != 0
            && l.lease == lease
            && l.create_revision == own
            && l.key == self.keys.own(key, lease)
    }

    /// A txn that revokes the exclusive holder of `key`, if there is one other than the
    /// proxy's own leasing key (created at `own`): in the failure branch of a write, so that
    /// a write that finds the key held revokes it in the same round trip, as etcd's.
    fn revoke_exclusive(&self, key: &[u8], own: i64) -> TxnRequest {
        let lk = self.keys.exclusive(key);
        let mine = if self.keys.shared { 0 } else { own };
        TxnRequest {
            compare: vec![cmp(
                lk.clone(),
                Vec::new(),
                CompareResult::Greater,
                TargetUnion::CreateRevision(mine),
            )],
            success: vec![op(Op::RequestPut(PutRequest {
                key: lk,
                value: REVOKE.to_vec(),
                ignore_lease: true,
                ..Default::default()
            }))],
            failure: Vec::new(),
        }
    }

    /// Asks every holder in `holders` to give its key up (those not asked already), and
    /// waits until each of their leasing keys is gone.
    async fn revoke_and_wait(
        &self,
        creds: &Creds,
        holders: Vec<KeyValue>,
        until: Instant,
    ) -> Result<(), Status> {
        let mut waits = Vec::new();
        for l in holders {
            if l.value == REVOKE {
                waits.push((l.key, l.create_revision, l.mod_revision));
                continue;
            }
            let t = TxnRequest {
                compare: vec![cmp(
                    l.key.clone(),
                    Vec::new(),
                    CompareResult::Equal,
                    TargetUnion::CreateRevision(l.create_revision),
                )],
                success: vec![op(Op::RequestPut(PutRequest {
                    key: l.key.clone(),
                    value: REVOKE.to_vec(),
                    ignore_lease: true,
                    ..Default::default()
                }))],
                failure: Vec::new(),
            };
            let r = self.calls.txn(creds, t).await?;
            self.metrics.revocations_sent.inc();
            if r.succeeded {
                let rev = r.header.map_or(0, |h| h.revision);
                waits.push((l.key, l.create_revision, rev));
            }
        }
        if waits.is_empty() {
            return Ok(());
        }
        // With a client's credentials, the waits watch as that client (the cluster checks).
        let own_mux;
        let mux = if creds.is_some() {
            own_mux = WatchMux::new(self.calls.clone(), creds.clone());
            &own_mux
        } else {
            &self.mux
        };
        let all = waits
            .into_iter()
            .map(|(lk, create, from)| self.wait_gone(mux, creds, lk, create, from, until));
        for r in futures_util::future::join_all(all).await {
            r?;
        }
        Ok(())
    }

    /// Waits until leasing key `lk` (created at `create`) is deleted after revision `from`.
    async fn wait_gone(
        &self,
        mux: &WatchMux,
        creds: &Creds,
        lk: Vec<u8>,
        create: i64,
        mut from: i64,
        until: Instant,
    ) -> Result<(), Status> {
        let timeout =
            || Status::deadline_exceeded("a holder of the key did not give it up in time");
        loop {
            let req = WatchCreateRequest {
                key: lk.clone(),
                start_revision: from + 1,
                ..Default::default()
            };
            let mut w = tokio::time::timeout_at(until, mux.watch(req))
                .await
                .map_err(|_| timeout())??;
            if w.created.canceled {
                // Compacted past `from`: the key's state now says.
                let r = RangeRequest {
                    key: lk.clone(),
                    ..Default::default()
                };
                let now = self.calls.range(creds, r).await?;
                if now.kvs.first().is_none_or(|l| l.create_revision != create) {
                    return Ok(());
                }
                from = now.header.map_or(from, |h| h.revision);
                continue;
            }
            loop {
                match tokio::time::timeout_at(until, w.rx.recv()).await {
                    Err(_) => return Err(timeout()),
                    Ok(None) => break,
                    Ok(Some(r)) => {
                        for ev in &r.events {
                            if let Some(kv) = &ev.kv {
                                from = from.max(kv.mod_revision);
                            }
                            if ev.r#type == EventType::Delete as i32 {
                                return Ok(());
                            }
                        }
                        if r.canceled {
                            break;
                        }
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
    fn a_txn_writes_what_either_branch_writes_at_any_depth() {
        let put = |k: &str| RequestOp {
            request: Some(Op::RequestPut(PutRequest {
                key: k.into(),
                ..Default::default()
            })),
        };
        let t = TxnRequest {
            compare: vec![Compare::default()],
            success: vec![
                put("a"),
                RequestOp {
                    request: Some(Op::RequestRange(RangeRequest::default())),
                },
            ],
            failure: vec![RequestOp {
                request: Some(Op::RequestTxn(TxnRequest {
                    success: vec![
                        put("b"),
                        RequestOp {
                            request: Some(Op::RequestDeleteRange(DeleteRangeRequest {
                                key: b"c".to_vec(),
                                range_end: b"d".to_vec(),
                                ..Default::default()
                            })),
                        },
                    ],
                    ..Default::default()
                })),
            }],
        };
        let mut items = Vec::new();
        written(&t, &mut items);
        let keys: Vec<(&[u8], &[u8])> = items
            .iter()
            .map(|i| (i.key.as_slice(), i.end.as_slice()))
            .collect();
        assert_eq!(keys, [(&b"a"[..], &b""[..]), (b"b", b""), (b"c", b"d")]);
        assert_eq!(ops(&t), 1 + 2 + 1 + 2);
    }
}
