//! `--namespace`: every key a client names is the key under the namespace upstream, as etcd's
//! proxy does it (its `namespace` package): keys and range ends of requests, compares and
//! ops at every depth of a txn, and watches are prefixed on the way up; keys of answers and
//! events are stripped on the way down. A range end of `[0]` ("every key from here") becomes
//! the end of the namespace. The leasing layer sits above the namespace, so its leasing keys
//! are `<namespace><prefix><key>`, as etcd's.

use api::etcdserverpb::request_op::Request as Op;
use api::etcdserverpb::response_op::Response as RespOp;
use api::etcdserverpb::*;
use api::mvccpb::KeyValue;

/// The namespace (empty: none).
#[derive(Debug, Clone, Default)]
pub struct Namespace {
    prefix: Vec<u8>,
}

/// The end of the keys with `prefix` (etcd's `GetPrefixRangeEnd`): `[0]` when every byte is
/// 0xff.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl Namespace {
    pub fn new(prefix: &[u8]) -> Namespace {
        Namespace {
            prefix: prefix.to_vec(),
        }
    }

    fn key(&self, k: &mut Vec<u8>) {
        if !self.prefix.is_empty() {
            k.splice(0..0, self.prefix.iter().copied());
        }
    }

    /// `[key, end)` under the namespace (etcd's `prefixInterval`).
    fn interval(&self, key: &mut Vec<u8>, end: &mut Vec<u8>) {
        if self.prefix.is_empty() {
            return;
        }
        self.key(key);
        if end.as_slice() == [0] {
            *end = prefix_end(&self.prefix);
        } else if !end.is_empty() {
            self.key(end);
        }
    }

    fn strip(&self, k: &mut Vec<u8>) {
        if !self.prefix.is_empty() && k.starts_with(&self.prefix) {
            k.drain(..self.prefix.len());
        }
    }

    fn strip_kv(&self, kv: &mut KeyValue) {
        self.strip(&mut kv.key);
    }

    pub fn range(&self, r: &mut RangeRequest) {
        self.interval(&mut r.key, &mut r.range_end);
    }

    pub fn put(&self, r: &mut PutRequest) {
        self.key(&mut r.key);
    }

    pub fn delete_range(&self, r: &mut DeleteRangeRequest) {
        self.interval(&mut r.key, &mut r.range_end);
    }

    pub fn txn(&self, t: &mut TxnRequest) {
        if self.prefix.is_empty() {
            return;
        }
        for c in &mut t.compare {
            self.interval(&mut c.key, &mut c.range_end);
        }
        for o in t.success.iter_mut().chain(t.failure.iter_mut()) {
            match &mut o.request {
                Some(Op::RequestRange(r)) => self.range(r),
                Some(Op::RequestPut(p)) => self.put(p),
                Some(Op::RequestDeleteRange(d)) => self.delete_range(d),
                Some(Op::RequestTxn(t)) => self.txn(t),
                None => {}
            }
        }
    }

    pub fn watch(&self, w: &mut WatchCreateRequest) {
        self.interval(&mut w.key, &mut w.range_end);
    }

    pub fn range_resp(&self, r: &mut RangeResponse) {
        if !self.prefix.is_empty() {
            r.kvs.iter_mut().for_each(|kv| self.strip_kv(kv));
        }
    }

    pub fn put_resp(&self, r: &mut PutResponse) {
        if let Some(kv) = &mut r.prev_kv {
            self.strip_kv(kv);
        }
    }

    pub fn delete_resp(&self, r: &mut DeleteRangeResponse) {
        if !self.prefix.is_empty() {
            r.prev_kvs.iter_mut().for_each(|kv| self.strip_kv(kv));
        }
    }

    pub fn txn_resp(&self, t: &mut TxnResponse) {
        if self.prefix.is_empty() {
            return;
        }
        for r in &mut t.responses {
            match &mut r.response {
                Some(RespOp::ResponseRange(r)) => self.range_resp(r),
                Some(RespOp::ResponsePut(p)) => self.put_resp(p),
                Some(RespOp::ResponseDeleteRange(d)) => self.delete_resp(d),
                Some(RespOp::ResponseTxn(t)) => self.txn_resp(t),
                None => {}
            }
        }
    }

    pub fn watch_resp(&self, w: &mut WatchResponse) {
        if self.prefix.is_empty() {
            return;
        }
        for ev in &mut w.events {
            if let Some(kv) = &mut ev.kv {
                self.strip_kv(kv);
            }
            if let Some(kv) = &mut ev.prev_kv {
                self.strip_kv(kv);
            }
        }
    }

    /// The keys of a lease outside the namespace are not the client's to see (etcd drops them).
    pub fn lease_keys(&self, keys: &mut Vec<Vec<u8>>) {
        if self.prefix.is_empty() {
            return;
        }
        keys.retain(|k| k.starts_with(&self.prefix));
        keys.iter_mut().for_each(|k| self.strip(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_go_under_the_namespace_and_come_back_without_it() {
        let ns = Namespace::new(b"ns/");
        let mut r = RangeRequest {
            key: b"a".to_vec(),
            range_end: vec![0],
            ..Default::default()
        };
        ns.range(&mut r);
        assert_eq!(
            (r.key.as_slice(), r.range_end.as_slice()),
            (&b"ns/a"[..], &b"ns0"[..])
        );
        let mut r = RangeRequest {
            key: b"a".to_vec(),
            range_end: b"b".to_vec(),
            ..Default::default()
        };
        ns.range(&mut r);
        assert_eq!(r.range_end, b"ns/b");
        let mut t = TxnRequest {
            compare: vec![Compare {
                key: b"c".to_vec(),
                ..Default::default()
            }],
            success: vec![RequestOp {
                request: Some(Op::RequestTxn(TxnRequest {
                    success: vec![RequestOp {
                        request: Some(Op::RequestPut(PutRequest {
                            key: b"d".to_vec(),
                            ..Default::default()
                        })),
                    }],
                    ..Default::default()
                })),
            }],
            failure: vec![],
        };
        ns.txn(&mut t);
        assert_eq!(t.compare[0].key, b"ns/c");
        let Some(Op::RequestTxn(inner)) = &t.success[0].request else {
            panic!()
        };
        let Some(Op::RequestPut(p)) = &inner.success[0].request else {
            panic!()
        };
        assert_eq!(p.key, b"ns/d");
        let mut resp = RangeResponse {
            kvs: vec![KeyValue {
                key: b"ns/a".to_vec(),
                ..Default::default()
            }],
            ..Default::default()
        };
        ns.range_resp(&mut resp);
        assert_eq!(resp.kvs[0].key, b"a");
        let mut keys = vec![b"ns/x".to_vec(), b"other".to_vec()];
        ns.lease_keys(&mut keys);
        assert_eq!(keys, [b"x".to_vec()]);
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), [0]);
    }
}
