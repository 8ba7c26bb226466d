//! The naive model of the revision store that `model.rs` (proptest) and the fuzz target
//! `store_model` (`fuzz/`) check the store against: every revision's whole key space, and
//! [`run`], which applies one sequence of operations to a store and to the model and compares
//! every response, error, revision and, at the end, every revision's full read.

#![allow(dead_code)]

use std::collections::BTreeMap;

use api::etcdserverpb::compare::{CompareTarget, TargetUnion};
use api::etcdserverpb::{
    request_op, response_op, Compare, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, ResponseHeader, ResponseOp, TxnRequest, TxnResponse,
};
use api::mvccpb::KeyValue;
use ids::Revision;
use mvcc::{Store, StoreOptions};

pub type State = BTreeMap<Vec<u8>, KeyValue>;

/// Every revision's key space; `states[r]` is the store at revision r (0 unused, 1 = empty).
pub struct Model {
    states: Vec<State>,
    compacted: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Err {
    Compacted,
    Future,
}

pub fn hdr(revision: i64) -> Option<ResponseHeader> {
    Some(ResponseHeader {
        revision,
        ..Default::default()
    })
}

pub fn in_range(k: &[u8], key: &[u8], end: &[u8]) -> bool {
    match end {
        [] => k == key,
        [0] => k >= key,
        e => k >= key && k < e,
    }
}

impl Model {
    pub fn new() -> Model {
        Model {
            states: vec![State::new(), State::new()],
            compacted: -1,
        }
    }

    fn rev(&self) -> i64 {
        self.states.len() as i64 - 1
    }

    fn range_in(&self, st: &State, cur: i64, r: &RangeRequest) -> Result<RangeResponse, Err> {
        let at = if r.revision <= 0 { cur } else { r.revision };
        if r.revision > cur {
            return Err(Err::Future);
        }
        if at < self.compacted {
            return Err(Err::Compacted);
        }
        let state = if at == cur {
            st
        } else {
            &self.states[at as usize]
        };
        let mut kvs: Vec<KeyValue> = state
            .iter()
            .filter(|(k, _)| in_range(k, &r.key, &r.range_end))
            .map(|(_, v)| v.clone())
            .collect();
        let count = kvs.len() as i64;
        if r.count_only {
            return Ok(RangeResponse {
                header: hdr(cur),
                kvs: vec![],
                more: false,
                count,
            });
        }
        // etcd quirk (checked against etcd 3.6.5: `get a z --sort-by=CREATE --limit 1`): a sort
        // target without a sort order is sorted ascending, but only after the store has cut the
        // keys to limit + 1 in key order.
        let filtered = r.min_mod_revision != 0
            || r.max_mod_revision != 0
            || r.min_create_revision != 0
            || r.max_create_revision != 0;
        if r.sort_order == 0 && r.limit > 0 && !filtered {
            kvs.truncate(r.limit as usize + 1);
        }
        kvs.retain(|kv| {
            (r.max_mod_revision == 0 || kv.mod_revision <= r.max_mod_revision)
                && (r.min_mod_revision == 0 || kv.mod_revision >= r.min_mod_revision)
                && (r.max_create_revision == 0 || kv.create_revision <= r.max_create_revision)
                && (r.min_create_revision == 0 || kv.create_revision >= r.min_create_revision)
        });
        let key_of = |kv: &KeyValue| -> (i64, Vec<u8>) {
            match r.sort_target {
                1 => (kv.version, vec![]),
                2 => (kv.create_revision, vec![]),
                3 => (kv.mod_revision, vec![]),
                4 => (0, kv.value.clone()),
                _ => (0, kv.key.clone()),
            }
        };
        match (r.sort_order, r.sort_target) {
            (2, _) => kvs.sort_by_key(|kv| std::cmp::Reverse(key_of(kv))),
            (0, 0) => {}
            _ => kvs.sort_by_key(key_of),
        }
        let more = r.limit > 0 && kvs.len() as i64 > r.limit;
        if more {
            kvs.truncate(r.limit as usize);
        }
        if r.keys_only {
            // etcd 3.7 reads keys-only ranges from its index (no lease there) unless values
            // order them.
            let from_index = r.sort_target != 4;
            for kv in &mut kvs {
                kv.value.clear();
                if from_index {
                    kv.lease = 0;
                }
            }
        }
        Ok(RangeResponse {
            header: hdr(cur),
            kvs,
            more,
            count,
        })
    }

    fn range(&self, r: &RangeRequest) -> Result<RangeResponse, Err> {
        self.range_in(self.states.last().unwrap(), self.rev(), r)
    }

    /// Applies writes to `st` as part of revision `rev`; returns (response, wrote).
    fn put_in(st: &mut State, rev: i64, p: &PutRequest) -> PutResponse {
        let prev = st.get(&p.key).cloned();
        let kv = KeyValue {
            key: p.key.clone(),
            create_revision: prev.as_ref().map_or(rev, |kv| kv.create_revision),
            mod_revision: rev,
            version: prev.as_ref().map_or(1, |kv| kv.version + 1),
            value: p.value.clone(),
            lease: 0,
        };
        st.insert(p.key.clone(), kv);
        PutResponse {
            header: hdr(rev),
            prev_kv: if p.prev_kv { prev } else { None },
        }
    }

    fn delete_in(
        st: &mut State,
        rev: i64,
        wrote: bool,
        d: &DeleteRangeRequest,
    ) -> DeleteRangeResponse {
        let doomed: Vec<_> = st
            .keys()
            .filter(|k| in_range(k, &d.key, &d.range_end))
            .cloned()
            .collect();
        let prev_kvs = if d.prev_kv {
            doomed.iter().map(|k| st[k].clone()).collect()
        } else {
            vec![]
        };
        for k in &doomed {
            st.remove(k);
        }
        let n = doomed.len() as i64;
        let r = if n > 0 || wrote { rev } else { rev - 1 };
        DeleteRangeResponse {
            header: hdr(r),
            deleted: n,
            prev_kvs,
        }
    }

    fn commit(&mut self, st: State) {
        self.states.push(st);
    }

    fn put(&mut self, p: &PutRequest) -> PutResponse {
        let mut st = self.states.last().unwrap().clone();
        let resp = Self::put_in(&mut st, self.rev() + 1, p);
        self.commit(st);
        resp
    }

    fn delete(&mut self, d: &DeleteRangeRequest) -> DeleteRangeResponse {
        let mut st = self.states.last().unwrap().clone();
        let resp = Self::delete_in(&mut st, self.rev() + 1, false, d);
        if resp.deleted > 0 {
            self.commit(st);
        }
        resp
    }

    fn compare(st: &State, c: &Compare) -> bool {
        let kvs: Vec<_> = st
            .iter()
            .filter(|(k, _)| in_range(k, &c.key, &c.range_end))
            .map(|(_, v)| v)
            .collect();
        let zero = KeyValue::default();
        if kvs.is_empty() && c.target == CompareTarget::Value as i32 {
            return false;
        }
        let check = |kv: &KeyValue| {
            let ord = match (c.target, &c.target_union) {
                (3, Some(TargetUnion::Value(v))) => kv.value.cmp(v),
                (1, Some(TargetUnion::CreateRevision(v))) => kv.create_revision.cmp(v),
                (2, Some(TargetUnion::ModRevision(v))) => kv.mod_revision.cmp(v),
                (0, Some(TargetUnion::Version(v))) => kv.version.cmp(v),
                _ => unreachable!("the generator pairs targets and operands"),
            };
            match c.result {
                0 => ord.is_eq(),
                1 => ord.is_gt(),
                2 => ord.is_lt(),
                _ => ord.is_ne(),
            }
        };
        if kvs.is_empty() {
            check(&zero)
        } else {
            kvs.into_iter().all(check)
        }
    }

    /// Runs a txn on `work` (the pre-txn state is `pre`); `wrote` tracks whether any write
    /// happened yet (reads then see revision `rev`, else `rev - 1`).
    fn txn_in(
        &self,
        pre: &State,
        work: &mut State,
        rev: i64,
        wrote: &mut bool,
        t: &TxnRequest,
    ) -> TxnResponse {
        let ok = t.compare.iter().all(|c| Self::compare(pre, c));
        let mut responses = vec![];
        for op in if ok { &t.success } else { &t.failure } {
            let r = match op.request.as_ref().unwrap() {
                request_op::Request::RequestRange(r) => {
                    let cur = if *wrote { rev } else { rev - 1 };
                    response_op::Response::ResponseRange(self.range_in(work, cur, r).unwrap())
                }
                request_op::Request::RequestPut(p) => {
                    *wrote = true;
                    response_op::Response::ResponsePut(Self::put_in(work, rev, p))
                }
                request_op::Request::RequestDeleteRange(d) => {
                    let resp = Self::delete_in(work, rev, *wrote, d);
                    *wrote |= resp.deleted > 0;
                    response_op::Response::ResponseDeleteRange(resp)
                }
                request_op::Request::RequestTxn(n) => {
                    response_op::Response::ResponseTxn(self.txn_in(pre, work, rev, wrote, n))
                }
            };
            responses.push(ResponseOp { response: Some(r) });
        }
        TxnResponse {
            header: Some(ResponseHeader::default()),
            succeeded: ok,
            responses,
        }
    }

    fn txn(&mut self, t: &TxnRequest) -> TxnResponse {
        let pre = self.states.last().unwrap().clone();
        let mut work = pre.clone();
        let mut wrote = false;
        let rev = self.rev() + 1;
        let mut resp = self.txn_in(&pre, &mut work, rev, &mut wrote, t);
        if wrote {
            self.commit(work);
        }
        resp.header = hdr(if wrote { rev } else { rev - 1 });
        resp
    }

    fn compact(&mut self, rev: i64) -> Result<(), Err> {
        if rev <= self.compacted {
            return Err(Err::Compacted);
        }
        if rev > self.rev() {
            return Err(Err::Future);
        }
        self.compacted = rev;
        Ok(())
    }
}

pub fn map_err<T>(r: mvcc::Result<T>) -> Result<T, Err> {
    r.map_err(|e| match e {
        mvcc::Error::Compacted => Err::Compacted,
        mvcc::Error::FutureRev => Err::Future,
        e => panic!("unexpected error {e}"),
    })
}

#[derive(Debug, Clone)]
pub enum Op {
    Put(PutRequest),
    Delete(DeleteRangeRequest),
    /// A range at a revision offset back from the current one (0 = current, may be too old or
    /// in the future).
    Range(RangeRequest, i64),
    Txn(TxnRequest),
    Compact(i64),
    Flush,
    Reopen,
}

pub fn run(ops: Vec<Op>, batch_limit: usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let opts = StoreOptions {
        batch_limit,
        compaction_batch: 2,
        // A reopen's rebuild lets go of the map's pages every few revisions.
        rebuild_release_bytes: 64,
        ..Default::default()
    };
    let mut store = Store::open(&path, opts.clone()).unwrap();
    let mut model = Model::new();
    for op in ops {
        match op {
            Op::Put(p) => {
                let got = store.write().unwrap().put(&p).unwrap();
                assert_eq!(got, model.put(&p), "put {p:?}");
            }
            Op::Delete(d) => {
                let got = store.write().unwrap().delete_range(&d).unwrap();
                assert_eq!(got, model.delete(&d), "delete {d:?}");
            }
            Op::Range(mut r, back) => {
                r.revision = if back < 0 {
                    model.rev() + 1
                } else {
                    (model.rev() - back).max(0)
                };
                let got = map_err(store.read().unwrap().range(&r));
                assert_eq!(got, model.range(&r), "range {r:?}");
            }
            Op::Txn(t) => {
                let got = store.write().unwrap().txn(&t).unwrap();
                assert_eq!(got, model.txn(&t), "txn {t:?}");
            }
            Op::Compact(back) => {
                let rev = model.rev() - back;
                let got = map_err(store.write().unwrap().compact(Revision(rev)).map(|_| ()));
                assert_eq!(got, model.compact(rev), "compact {rev}");
            }
            Op::Flush => store.flush().unwrap(),
            Op::Reopen => {
                store.close().unwrap();
                store = Store::open(&path, opts.clone()).unwrap();
            }
        }
        assert_eq!(store.rev().0, model.rev());
        assert_eq!(store.compacted().0, model.compacted);
    }
    // Every revision not compacted still reads back whole.
    let from = model.compacted.max(1);
    for rev in from..=model.rev() {
        let r = RangeRequest {
            key: vec![0],
            range_end: vec![0],
            revision: rev,
            ..Default::default()
        };
        assert_eq!(
            map_err(store.read().unwrap().range(&r)),
            model.range(&r),
            "full read at {rev}"
        );
    }
    store.close().unwrap();
}
