//! Request checks run before a request reaches consensus (etcd's v3rpc checks), with etcd's
//! errors. A request that passes them cannot fail half-way through its apply.

use std::collections::HashSet;

use api::etcdserverpb::range_request::{SortOrder, SortTarget};
use api::etcdserverpb::{
    request_op, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};

use crate::error::{Error, Result};

/// etcd's default `--max-txn-ops`.
pub const DEFAULT_MAX_TXN_OPS: usize = 128;

pub fn check_range(r: &RangeRequest) -> Result<()> {
    if r.key.is_empty() {
        return Err(Error::EmptyKey);
    }
    if SortOrder::try_from(r.sort_order).is_err() || SortTarget::try_from(r.sort_target).is_err() {
        return Err(Error::InvalidSortOption);
    }
    Ok(())
}

pub fn check_put(r: &PutRequest) -> Result<()> {
    if r.key.is_empty() {
        return Err(Error::EmptyKey);
    }
    if r.ignore_value && !r.value.is_empty() {
        return Err(Error::ValueProvided);
    }
    if r.ignore_lease && r.lease != 0 {
        return Err(Error::LeaseProvided);
    }
    Ok(())
}

pub fn check_delete(r: &DeleteRangeRequest) -> Result<()> {
    if r.key.is_empty() {
        return Err(Error::EmptyKey);
    }
    Ok(())
}

/// Checks a transaction: operation counts (at most `max_ops` compares, and as many operations
/// per branch, shrinking with nesting as etcd does), every operation, and that no key is
/// written twice on one path (`duplicate key given in txn request`).
pub fn check_txn(r: &TxnRequest, max_ops: usize) -> Result<()> {
    check_txn_ops(r, max_ops)?;
    check_intervals(&r.success)?;
    check_intervals(&r.failure)?;
    Ok(())
}

fn check_txn_ops(r: &TxnRequest, max_ops: usize) -> Result<()> {
    let opc = r.compare.len().max(r.success.len()).max(r.failure.len());
    if opc > max_ops {
        return Err(Error::TooManyOps);
    }
    if r.compare.iter().any(|c| c.key.is_empty()) {
        return Err(Error::EmptyKey);
    }
    for op in r.success.iter().chain(&r.failure) {
        match &op.request {
            Some(request_op::Request::RequestRange(q)) => check_range(q)?,
            Some(request_op::Request::RequestPut(q)) => check_put(q)?,
            Some(request_op::Request::RequestDeleteRange(q)) => check_delete(q)?,
            Some(request_op::Request::RequestTxn(q)) => check_txn_ops(q, max_ops - opc)?,
            None => {}
        }
    }
    Ok(())
}

/// Deleted ranges of one level: a point, or `[begin, end)` compared as bytes.
#[derive(Default)]
struct Dels(Vec<(Vec<u8>, Option<Vec<u8>>)>);

impl Dels {
    fn intersects(&self, k: &[u8]) -> bool {
        self.0.iter().any(|(b, e)| match e {
            None => b.as_slice() == k,
            Some(e) => b.as_slice() <= k && k < e.as_slice(),
        })
    }
}

/// etcd's checkIntervals: the keys put and ranges deleted by `reqs` (nested txns included),
/// failing when one path writes a key twice. The two branches of a nested txn exclude each
/// other, so a key put in both is fine.
fn check_intervals(reqs: &[RequestOp]) -> Result<(HashSet<Vec<u8>>, Dels)> {
    let mut dels = Dels::default();
    for op in reqs {
        if let Some(request_op::Request::RequestDeleteRange(d)) = &op.request {
            let end = (!d.range_end.is_empty()).then(|| d.range_end.clone());
            dels.0.push((d.key.clone(), end));
        }
    }
    let mut puts = HashSet::new();
    for op in reqs {
        let Some(request_op::Request::RequestTxn(t)) = &op.request else {
            continue;
        };
        let (then_puts, then_dels) = check_intervals(&t.success)?;
        let (else_puts, else_dels) = check_intervals(&t.failure)?;
        for k in &then_puts {
            if puts.contains(k) || dels.intersects(k) {
                return Err(Error::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        for k in else_puts {
            if (puts.contains(&k) && !then_puts.contains(&k)) || dels.intersects(&k) {
                return Err(Error::DuplicateKey);
            }
            puts.insert(k);
        }
        dels.0.extend(then_dels.0);
        dels.0.extend(else_dels.0);
    }
    for op in reqs {
        let Some(request_op::Request::RequestPut(p)) = &op.request else {
            continue;
        };
        if puts.contains(&p.key) || dels.intersects(&p.key) {
            return Err(Error::DuplicateKey);
        }
        puts.insert(p.key.clone());
    }
    Ok((puts, dels))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(k: &str) -> RequestOp {
        RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: k.into(),
                ..Default::default()
            })),
        }
    }

    fn del(k: &str, end: &str) -> RequestOp {
        RequestOp {
            request: Some(request_op::Request::RequestDeleteRange(
                DeleteRangeRequest {
                    key: k.into(),
                    range_end: end.into(),
                    ..Default::default()
                },
            )),
        }
    }

    fn txn(success: Vec<RequestOp>, failure: Vec<RequestOp>) -> TxnRequest {
        TxnRequest {
            compare: vec![],
            success,
            failure,
        }
    }

    fn nested(t: TxnRequest) -> RequestOp {
        RequestOp {
            request: Some(request_op::Request::RequestTxn(t)),
        }
    }

    #[test]
    fn duplicate_keys_as_etcd_sees_them() {
        let max = DEFAULT_MAX_TXN_OPS;
        assert!(matches!(
            check_txn(&txn(vec![put("a"), put("a")], vec![]), max),
            Err(Error::DuplicateKey)
        ));
        assert!(matches!(
            check_txn(&txn(vec![put("b"), del("a", "c")], vec![]), max),
            Err(Error::DuplicateKey)
        ));
        assert!(check_txn(&txn(vec![put("c"), del("a", "c")], vec![]), max).is_ok());
        // Success and failure are separate paths.
        assert!(check_txn(&txn(vec![put("a")], vec![put("a")]), max).is_ok());
        // The branches of a nested txn exclude each other, but not the outer level.
        let inner = txn(vec![put("a")], vec![put("a")]);
        assert!(check_txn(&txn(vec![nested(inner.clone())], vec![]), max).is_ok());
        assert!(matches!(
            check_txn(&txn(vec![nested(inner), put("a")], vec![]), max),
            Err(Error::DuplicateKey)
        ));
        // A delete nested in one branch conflicts with an outer put.
        let inner = txn(vec![del("a", "")], vec![]);
        assert!(matches!(
            check_txn(&txn(vec![nested(inner), put("a")], vec![]), max),
            Err(Error::DuplicateKey)
        ));
        // Overlapping deletes are fine.
        assert!(check_txn(&txn(vec![del("a", "z"), del("b", "")], vec![]), max).is_ok());
    }

    #[test]
    fn limits_and_empty_keys() {
        let ops: Vec<_> = (0..3).map(|i| put(&i.to_string())).collect();
        assert!(matches!(
            check_txn(&txn(ops.clone(), vec![]), 2),
            Err(Error::TooManyOps)
        ));
        assert!(check_txn(&txn(ops, vec![]), 3).is_ok());
        assert!(matches!(
            check_txn(&txn(vec![put("")], vec![]), 3),
            Err(Error::EmptyKey)
        ));
        let bad_sort = RangeRequest {
            key: b"a".to_vec(),
            sort_order: 7,
            ..Default::default()
        };
        assert!(matches!(
            check_range(&bad_sort),
            Err(Error::InvalidSortOption)
        ));
        let p = PutRequest {
            key: b"a".to_vec(),
            value: b"v".to_vec(),
            ignore_value: true,
            ..Default::default()
        };
        assert!(matches!(check_put(&p), Err(Error::ValueProvided)));
    }
}
