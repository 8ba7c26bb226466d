//! etcd's request semantics on the store: Range (sort, filters, limit), Put, DeleteRange and
//! Txn (compares, nested transactions, one revision), matching etcd 3.7's apply code.

use api::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use api::etcdserverpb::range_request::{SortOrder, SortTarget};
use api::etcdserverpb::{
    request_op, response_op, Compare, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, ResponseHeader, ResponseOp, TxnRequest, TxnResponse,
};
use api::mvccpb::{event::EventType, Event, KeyValue};
use ids::{LeaseId, Revision};

use crate::error::{Error, Result};
use crate::index::KeyRange;
use crate::revision::Rev;
use crate::store::{RangeOptions, RangeResult, Reader, Snapshot, Writer};
use crate::validate;

/// A `KeyValue` of borrowed parts, encoded to exactly the bytes `KeyValue::encode` gives
/// without copying key and value into an owned message first.
#[derive(Default, Clone, Copy)]
struct KeyValueRef<'a> {
    key: &'a [u8],
    create_revision: i64,
    mod_revision: i64,
    version: i64,
    value: &'a [u8],
    lease: i64,
}

impl KeyValueRef<'_> {
    /// Appends the encoding to `buf`.
    fn encode(&self, buf: &mut Vec<u8>) {
        use prost::encoding::{encode_key, encode_varint, encoded_len_varint, int64, WireType};
        let bytes_len = |tag: u32, b: &[u8]| {
            if b.is_empty() {
                0
            } else {
                prost::encoding::key_len(tag) + encoded_len_varint(b.len() as u64) + b.len()
            }
        };
        let int_len = |tag: u32, v: i64| {
            if v == 0 {
                0
            } else {
                int64::encoded_len(tag, &v)
            }
        };
        let len = bytes_len(1, self.key)
            + int_len(2, self.create_revision)
            + int_len(3, self.mod_revision)
            + int_len(4, self.version)
            + bytes_len(5, self.value)
            + int_len(6, self.lease);
        buf.reserve(len);
        let bytes = |tag: u32, b: &[u8], buf: &mut Vec<u8>| {
            if !b.is_empty() {
                encode_key(tag, WireType::LengthDelimited, buf);
                encode_varint(b.len() as u64, buf);
                buf.extend_from_slice(b);
            }
        };
        let int = |tag: u32, v: i64, buf: &mut Vec<u8>| {
            if v != 0 {
                int64::encode(tag, &v, buf);
            }
        };
        bytes(1, self.key, buf);
        int(2, self.create_revision, buf);
        int(3, self.mod_revision, buf);
        int(4, self.version, buf);
        bytes(5, self.value, buf);
        int(6, self.lease, buf);
    }

    fn to_owned(self) -> KeyValue {
        KeyValue {
            key: self.key.to_vec(),
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
            version: self.version,
            value: self.value.to_vec(),
            lease: self.lease,
        }
    }
}

/// A response header carrying the store revision (the server fills in the rest).
pub(crate) fn header(revision: i64) -> Option<ResponseHeader> {
    Some(ResponseHeader {
        revision,
        ..Default::default()
    })
}

/// What a transaction reads through: a snapshot, or a write transaction in progress.
pub(crate) trait View {
    fn range(&mut self, range: KeyRange<'_>, ro: RangeOptions) -> Result<RangeResult>;
    /// The revision reads see.
    fn rev(&self) -> i64;
    /// The compaction revision.
    fn first_rev(&self) -> i64;
    fn lease_exists(&self, id: i64) -> bool;
    fn put(&mut self, key: &[u8], value: &[u8], lease: i64) -> Result<i64>;
    fn delete_range(&mut self, range: KeyRange<'_>) -> Result<(i64, i64)>;
}

impl View for Snapshot {
    fn range(&mut self, range: KeyRange<'_>, ro: RangeOptions) -> Result<RangeResult> {
        self.reader.range_keys(&self.inner, range, self.rev, ro)
    }
    fn rev(&self) -> i64 {
        self.rev
    }
    fn first_rev(&self) -> i64 {
        self.inner.index.read().compacted()
    }
    fn lease_exists(&self, _id: i64) -> bool {
        false
    }
    fn put(&mut self, _: &[u8], _: &[u8], _: i64) -> Result<i64> {
        Err(Error::Stopped("a put reached a read-only view".into()))
    }
    fn delete_range(&mut self, _: KeyRange<'_>) -> Result<(i64, i64)> {
        Err(Error::Stopped("a delete reached a read-only view".into()))
    }
}

/// One write transaction (one revision) of a [`Writer`] — etcd's `storeTxnWrite`.
pub(crate) struct TxnWrite<'a, 'w> {
    w: &'a mut Writer<'w>,
    reader: Option<Reader>,
    begin: i64,
    /// Writes so far; the sub revision of the next one.
    subs: i64,
    /// Whether to build events: only when some watcher exists (checked once, at the start).
    collect: bool,
    events: Vec<Event>,
}

impl<'a, 'w> TxnWrite<'a, 'w> {
    pub(crate) fn begin(w: &'a mut Writer<'w>) -> TxnWrite<'a, 'w> {
        let begin = w.state().rev;
        let collect = w.inner().hub.has_watchers();
        TxnWrite {
            w,
            reader: None,
            begin,
            subs: 0,
            collect,
            events: Vec::new(),
        }
    }

    fn main_rev(&self) -> i64 {
        self.begin + 1
    }

    /// Ends the transaction: a transaction that wrote takes the next revision. Returns it,
    /// with the events the transaction built (if it built them).
    pub(crate) fn end(self) -> Option<(i64, Option<Vec<Event>>)> {
        if self.subs == 0 {
            return None;
        }
        let rev = self.begin + 1;
        self.w.publish_rev(rev);
        Some((rev, self.collect.then_some(self.events)))
    }

    fn next_rev(&mut self) -> Rev {
        let r = Rev::new(self.main_rev(), self.subs);
        self.subs += 1;
        r
    }

    fn delete(&mut self, key: Vec<u8>) {
        let rev = self.next_rev();
        let kv = KeyValueRef {
            key: &key,
            ..Default::default()
        };
        self.w.append(rev, true, |b| kv.encode(b));
        let inner = self.w.inner();
        inner.index.write().tombstone(&key, rev);
        self.w.inner().lessor.lock().detach(&key);
        if self.collect {
            let kv = KeyValue {
                key,
                mod_revision: rev.main,
                ..Default::default()
            };
            self.events.push(Event {
                r#type: EventType::Delete as i32,
                kv: Some(kv),
                prev_kv: None,
            });
        }
    }
}

impl View for TxnWrite<'_, '_> {
    fn range(&mut self, range: KeyRange<'_>, ro: RangeOptions) -> Result<RangeResult> {
        let rev = self.rev();
        if self.reader.is_none() {
            self.reader = Some(self.w.inner().reader()?.0);
        }
        let reader = self.reader.as_ref().expect("just set");
        reader.range_keys(self.w.inner(), range, rev, ro)
    }

    fn rev(&self) -> i64 {
        self.begin + i64::from(self.subs > 0)
    }

    fn first_rev(&self) -> i64 {
        self.w.st.as_ref().map_or(-1, |s| s.compacted)
    }

    fn lease_exists(&self, id: i64) -> bool {
        self.w.inner().lessor.lock().contains(LeaseId(id))
    }

    fn put(&mut self, key: &[u8], value: &[u8], lease: i64) -> Result<i64> {
        let main = self.main_rev();
        let rev = self.next_rev();
        let inner = self.w.inner();
        let prev = inner.index.write().put_after(key, rev, main);
        let (created, version) = prev.map_or((main, 1), |v| (v.created.main, v.version + 1));
        let kv = KeyValueRef {
            key,
            create_revision: created,
            mod_revision: main,
            version,
            value,
            lease,
        };
        self.w.append(rev, false, |b| kv.encode(b));
        let mut lessor = self.w.inner().lessor.lock();
        lessor.detach(key);
        if lease != 0 {
            lessor.attach(LeaseId(lease), key);
        }
        drop(lessor);
        if self.collect {
            self.events.push(Event {
                r#type: EventType::Put as i32,
                kv: Some(kv.to_owned()),
                prev_kv: None,
            });
        }
        Ok(main)
    }

    fn delete_range(&mut self, range: KeyRange<'_>) -> Result<(i64, i64)> {
        let at = self.rev();
        let mut keys = Vec::new();
        self.w.inner().index.read().visit(range, at, |k, _| {
            keys.push(k.to_vec());
            true
        });
        let n = keys.len() as i64;
        for k in keys {
            self.delete(k);
        }
        Ok(if n != 0 || self.subs > 0 {
            (n, self.begin + 1)
        } else {
            (0, self.begin)
        })
    }
}

/// etcd's executeRange: filters, sort and limit on top of the store's range read.
pub(crate) fn range(v: &mut impl View, r: &RangeRequest) -> Result<RangeResponse> {
    range_with(v, r, false)
}

/// [`range`], whose `count` is every key in the range, or with `stop_at_limit` only the keys
/// read (one past the limit when there are more): a chunk of etcd 3.7's RangeStream.
fn range_with(v: &mut impl View, r: &RangeRequest, stop_at_limit: bool) -> Result<RangeResponse> {
    let filtered = r.min_mod_revision != 0
        || r.max_mod_revision != 0
        || r.min_create_revision != 0
        || r.max_create_revision != 0;
    let mut order = SortOrder::try_from(r.sort_order).map_err(|_| Error::InvalidSortOption)?;
    let target = SortTarget::try_from(r.sort_target).map_err(|_| Error::InvalidSortOption)?;
    // Fetch everything when sorting or filtering, one more than the limit otherwise (to set
    // `more`).
    let mut limit = r.limit;
    if order != SortOrder::None || filtered {
        limit = 0;
    }
    if limit > 0 {
        limit += 1;
    }
    let ro = RangeOptions {
        limit,
        rev: Revision(r.revision),
        count: r.count_only,
        // etcd 3.7 answers keys-only ranges from its index unless values order them.
        keys_only: r.keys_only && target != SortTarget::Value,
        stop_at_limit,
    };
    let mut rr = v.range(KeyRange::new(&r.key, &r.range_end), ro)?;
    if r.max_mod_revision != 0 {
        rr.kvs.retain(|kv| kv.mod_revision <= r.max_mod_revision);
    }
    if r.min_mod_revision != 0 {
        rr.kvs.retain(|kv| kv.mod_revision >= r.min_mod_revision);
    }
    if r.max_create_revision != 0 {
        rr.kvs
            .retain(|kv| kv.create_revision <= r.max_create_revision);
    }
    if r.min_create_revision != 0 {
        rr.kvs
            .retain(|kv| kv.create_revision >= r.min_create_revision);
    }
    // The store returns keys ascending: a sort by another target defaults to ascending, and an
    // ascending sort by key is already done.
    if target != SortTarget::Key && order == SortOrder::None {
        order = SortOrder::Ascend;
    } else if target == SortTarget::Key && order == SortOrder::Ascend {
        order = SortOrder::None;
    }
    if order != SortOrder::None {
        let cmp = |a: &KeyValue, b: &KeyValue| match target {
            SortTarget::Key => a.key.cmp(&b.key),
            SortTarget::Version => a.version.cmp(&b.version),
            SortTarget::Create => a.create_revision.cmp(&b.create_revision),
            SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
            SortTarget::Value => a.value.cmp(&b.value),
        };
        if order == SortOrder::Descend {
            rr.kvs.sort_by(|a, b| cmp(b, a));
        } else {
            rr.kvs.sort_by(cmp);
        }
    }
    let mut more = false;
    if r.limit > 0 && rr.kvs.len() as i64 > r.limit {
        rr.kvs.truncate(r.limit as usize);
        more = true;
    }
    if r.keys_only {
        for kv in &mut rr.kvs {
            kv.value.clear();
        }
    }
    Ok(RangeResponse {
        header: header(rr.rev.0),
        kvs: rr.kvs,
        more,
        count: rr.count,
    })
}

/// etcd's put: prev_kv, ignore_value and ignore_lease read the key first.
pub(crate) fn put(v: &mut impl View, p: &PutRequest) -> Result<PutResponse> {
    let mut lease = p.lease;
    let mut prev = None;
    if p.ignore_value || p.ignore_lease || p.prev_kv {
        prev = v
            .range(KeyRange::One(&p.key), RangeOptions::default())?
            .kvs
            .pop();
    }
    let mut value = p.value.as_slice();
    if p.ignore_value || p.ignore_lease {
        let Some(prev) = &prev else {
            return Err(Error::KeyNotFound);
        };
        if p.ignore_value {
            value = &prev.value;
        }
        if p.ignore_lease {
            lease = prev.lease;
        }
    }
    let rev = v.put(&p.key, value, lease)?;
    Ok(PutResponse {
        header: header(rev),
        prev_kv: if p.prev_kv { prev } else { None },
    })
}

/// etcd's deleteRange: prev_kvs are read before deleting.
pub(crate) fn delete_range(
    v: &mut impl View,
    d: &DeleteRangeRequest,
) -> Result<DeleteRangeResponse> {
    let range = KeyRange::new(&d.key, &d.range_end);
    let mut prev_kvs = Vec::new();
    if d.prev_kv {
        prev_kvs = v.range(range, RangeOptions::default())?.kvs;
    }
    let (deleted, rev) = v.delete_range(range)?;
    Ok(DeleteRangeResponse {
        header: header(rev),
        deleted,
        prev_kvs,
    })
}

fn compare_kv(c: &Compare, kv: &KeyValue) -> bool {
    use std::cmp::Ordering;
    let target = CompareTarget::try_from(c.target).unwrap_or(CompareTarget::Version);
    // The operand is the union member matching the target; any other (or none) reads as zero,
    // as in etcd.
    let number = match (target, &c.target_union) {
        (CompareTarget::Version, Some(TargetUnion::Version(n)))
        | (CompareTarget::Create, Some(TargetUnion::CreateRevision(n)))
        | (CompareTarget::Mod, Some(TargetUnion::ModRevision(n)))
        | (CompareTarget::Lease, Some(TargetUnion::Lease(n))) => *n,
        _ => 0,
    };
    let ord: Ordering = match target {
        CompareTarget::Value => {
            let v = match &c.target_union {
                Some(TargetUnion::Value(v)) => v.as_slice(),
                _ => &[],
            };
            kv.value.as_slice().cmp(v)
        }
        CompareTarget::Create => kv.create_revision.cmp(&number),
        CompareTarget::Mod => kv.mod_revision.cmp(&number),
        CompareTarget::Version => kv.version.cmp(&number),
        CompareTarget::Lease => kv.lease.cmp(&number),
    };
    match CompareResult::try_from(c.result) {
        Ok(CompareResult::Equal) => ord == Ordering::Equal,
        Ok(CompareResult::NotEqual) => ord != Ordering::Equal,
        Ok(CompareResult::Greater) => ord == Ordering::Greater,
        Ok(CompareResult::Less) => ord == Ordering::Less,
        Err(_) => true,
    }
}

/// etcd's applyCompare: every key in the compare's range must satisfy it; a missing key reads
/// as a zero KeyValue, except that a value compare on a missing key fails.
fn apply_compare(v: &mut impl View, c: &Compare) -> bool {
    let Ok(rr) = v.range(KeyRange::new(&c.key, &c.range_end), RangeOptions::default()) else {
        return false;
    };
    if rr.kvs.is_empty() {
        return c.target != CompareTarget::Value as i32 && compare_kv(c, &KeyValue::default());
    }
    rr.kvs.iter().all(|kv| compare_kv(c, kv))
}

/// The branch taken at each txn on the execution path, in execution order, all decided before
/// anything is written (etcd's compareToPath).
fn compare_to_path(v: &mut impl View, t: &TxnRequest, path: &mut Vec<bool>) {
    let ok = t.compare.iter().all(|c| apply_compare(v, c));
    path.push(ok);
    for op in if ok { &t.success } else { &t.failure } {
        if let Some(request_op::Request::RequestTxn(n)) = &op.request {
            compare_to_path(v, n, path);
        }
    }
}

/// etcd's checkTxn: the errors the chosen path would hit, found before any write.
fn check_path(v: &mut impl View, t: &TxnRequest, path: &[bool], at: &mut usize) -> Result<()> {
    let ok = path[*at];
    *at += 1;
    for op in if ok { &t.success } else { &t.failure } {
        match &op.request {
            Some(request_op::Request::RequestRange(r)) => {
                if r.revision > v.rev() {
                    return Err(Error::FutureRev);
                }
                if r.revision != 0 && r.revision < v.first_rev() {
                    return Err(Error::Compacted);
                }
            }
            Some(request_op::Request::RequestPut(p)) => {
                if (p.ignore_value || p.ignore_lease)
                    && v.range(KeyRange::One(&p.key), RangeOptions::default())?
                        .kvs
                        .is_empty()
                {
                    return Err(Error::KeyNotFound);
                }
                if p.lease != 0 && !v.lease_exists(p.lease) {
                    return Err(Error::LeaseNotFound);
                }
            }
            Some(request_op::Request::RequestTxn(n)) => check_path(v, n, path, at)?,
            Some(request_op::Request::RequestDeleteRange(_)) | None => {}
        }
    }
    Ok(())
}

fn execute(
    v: &mut impl View,
    t: &TxnRequest,
    path: &[bool],
    at: &mut usize,
) -> Result<TxnResponse> {
    let ok = path[*at];
    *at += 1;
    let ops = if ok { &t.success } else { &t.failure };
    let mut responses = Vec::with_capacity(ops.len());
    for op in ops {
        let response = match &op.request {
            Some(request_op::Request::RequestRange(r)) => {
                Some(response_op::Response::ResponseRange(range(v, r)?))
            }
            Some(request_op::Request::RequestPut(p)) => {
                Some(response_op::Response::ResponsePut(put(v, p)?))
            }
            Some(request_op::Request::RequestDeleteRange(d)) => Some(
                response_op::Response::ResponseDeleteRange(delete_range(v, d)?),
            ),
            Some(request_op::Request::RequestTxn(n)) => {
                Some(response_op::Response::ResponseTxn(execute(v, n, path, at)?))
            }
            None => None,
        };
        responses.push(ResponseOp { response });
    }
    // Nested responses carry an empty header, as etcd's.
    Ok(TxnResponse {
        header: Some(ResponseHeader::default()),
        succeeded: ok,
        responses,
    })
}

/// Whether a transaction has no write on any path.
pub fn is_txn_readonly(t: &TxnRequest) -> bool {
    t.success
        .iter()
        .chain(&t.failure)
        .all(|op| match &op.request {
            Some(request_op::Request::RequestPut(_))
            | Some(request_op::Request::RequestDeleteRange(_)) => false,
            Some(request_op::Request::RequestTxn(n)) => is_txn_readonly(n),
            _ => true,
        })
}

/// etcd's Txn: decide the path, check it, execute it.
fn txn(v: &mut impl View, t: &TxnRequest) -> Result<TxnResponse> {
    let mut path = Vec::new();
    compare_to_path(v, t, &mut path);
    check_path(v, t, &path, &mut 0)?;
    let mut resp = execute(v, t, &path, &mut 0)?;
    resp.header = header(v.rev());
    Ok(resp)
}

impl Snapshot {
    /// A Range at this view (a serializable read, or a linearizable one once the view is at
    /// the read index).
    pub fn range(&mut self, r: &RangeRequest) -> Result<RangeResponse> {
        validate::check_range(r)?;
        range(self, r)
    }

    /// One chunk of etcd 3.7's RangeStream at this view: a Range that reads no further than
    /// its limit, so its `count` is not the range's.
    pub fn range_chunk(&mut self, r: &RangeRequest) -> Result<RangeResponse> {
        validate::check_range(r)?;
        range_with(self, r, true)
    }

    /// A read-only Txn at this view.
    pub fn txn(&mut self, t: &TxnRequest) -> Result<TxnResponse> {
        validate::check_txn(t, usize::MAX)?;
        if !is_txn_readonly(t) {
            return Err(Error::Stopped(
                "a txn with writes reached a read-only view".into(),
            ));
        }
        txn(self, t)
    }

    /// Low-level range at this view (etcd's `RangeResult`), for watch catch-up and tests.
    pub fn range_keys(
        &mut self,
        key: &[u8],
        range_end: &[u8],
        ro: RangeOptions,
    ) -> Result<RangeResult> {
        View::range(self, KeyRange::new(key, range_end), ro)
    }
}

impl Writer<'_> {
    /// Runs `f` as one write transaction. A failure after something was written would leave a
    /// half-applied transaction, so it stops the store (etcd panics there).
    fn in_txn<T>(&mut self, f: impl FnOnce(&mut TxnWrite<'_, '_>) -> Result<T>) -> Result<T> {
        let mut tw = TxnWrite::begin(self);
        let out = f(&mut tw);
        let ended = tw.end();
        match out {
            Err(e) if ended.is_some() => {
                let msg = format!("a write transaction failed half-way: {e}");
                self.fail(msg.clone());
                Err(Error::Stopped(msg))
            }
            Err(e) => Err(e),
            Ok(v) => {
                if let Some((rev, events)) = ended {
                    self.notify(rev, events);
                }
                Ok(v)
            }
        }
    }

    /// Put (etcd's `KV/Put` apply).
    pub fn put(&mut self, p: &PutRequest) -> Result<PutResponse> {
        validate::check_put(p)?;
        if p.lease != 0 && !self.inner().lessor.lock().contains(LeaseId(p.lease)) {
            return Err(Error::LeaseNotFound);
        }
        self.in_txn(|tw| put(tw, p))
    }

    /// DeleteRange (etcd's `KV/DeleteRange` apply).
    pub fn delete_range(&mut self, d: &DeleteRangeRequest) -> Result<DeleteRangeResponse> {
        validate::check_delete(d)?;
        self.in_txn(|tw| delete_range(tw, d))
    }

    /// Txn (etcd's `KV/Txn` apply); all its writes share one revision.
    pub fn txn(&mut self, t: &TxnRequest) -> Result<TxnResponse> {
        validate::check_txn(t, usize::MAX)?;
        self.in_txn(|tw| txn(tw, t))
    }

    /// Deletes each of `reqs` in one write transaction (a lease revocation).
    pub(crate) fn delete_keys(&mut self, reqs: &[DeleteRangeRequest]) -> Result<()> {
        self.in_txn(|tw| {
            for d in reqs {
                delete_range(tw, d)?;
            }
            Ok(())
        })
    }

    /// A Range read by the writer, at the newest revision.
    pub fn range(&mut self, r: &RangeRequest) -> Result<RangeResponse> {
        validate::check_range(r)?;
        self.in_txn(|tw| range(tw, r))
    }
}
