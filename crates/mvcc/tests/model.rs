//! Model-based test: random sequences of Put, DeleteRange, Range (at any revision, with every
//! option), Txn (with nested txns), Compact, flush and reopen against a naive model that keeps
//! the whole key space at every revision (`support/model.rs`). Responses (including header
//! revisions) and errors must be identical.

#[path = "support/model.rs"]
mod model;

use api::etcdserverpb::compare::TargetUnion;
use api::etcdserverpb::{
    request_op, Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use model::{run, Op};
use proptest::prelude::*;

const KEYS: &[&[u8]] = &[b"a", b"b", b"c", b"d", b"e"];

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop::sample::select(KEYS).prop_map(|k| k.to_vec())
}

fn range_end() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![Just(vec![]), Just(vec![0u8]), key(), Just(b"z".to_vec())]
}

fn put_req(k: Vec<u8>) -> impl Strategy<Value = PutRequest> {
    (prop::collection::vec(any::<u8>(), 0..4), any::<bool>()).prop_map(move |(value, prev_kv)| {
        PutRequest {
            key: k.clone(),
            value,
            prev_kv,
            ..Default::default()
        }
    })
}

fn range_req() -> impl Strategy<Value = RangeRequest> {
    (
        key(),
        range_end(),
        0i64..4,
        0i32..3,
        0i32..5,
        any::<bool>(),
        any::<bool>(),
        0i64..8,
        0i64..8,
    )
        .prop_map(
            |(
                key,
                range_end,
                limit,
                sort_order,
                sort_target,
                keys_only,
                count_only,
                min_mod,
                max_create,
            )| RangeRequest {
                key,
                range_end,
                limit,
                sort_order,
                sort_target,
                keys_only,
                count_only: count_only && limit == 0,
                min_mod_revision: min_mod,
                max_create_revision: max_create,
                ..Default::default()
            },
        )
}

fn compare() -> impl Strategy<Value = Compare> {
    (
        key(),
        prop_oneof![Just(vec![]), Just(vec![0u8])],
        0i32..4,
        0i32..4,
        0i64..6,
        prop::collection::vec(any::<u8>(), 0..3),
    )
        .prop_map(|(key, range_end, target, result, n, v)| {
            let target_union = Some(match target {
                0 => TargetUnion::Version(n),
                1 => TargetUnion::CreateRevision(n),
                2 => TargetUnion::ModRevision(n),
                _ => TargetUnion::Value(v),
            });
            Compare {
                result,
                target,
                key,
                range_end,
                target_union,
            }
        })
}

/// One op per key of a branch (a put, a delete or a range), so no key is written twice.
fn branch(keys: Vec<Vec<u8>>) -> BoxedStrategy<Vec<RequestOp>> {
    let ops: Vec<BoxedStrategy<RequestOp>> = keys
        .into_iter()
        .map(|k| {
            let kd = k.clone();
            let w: BoxedStrategy<RequestOp> = prop_oneof![
                put_req(k).prop_map(|p| RequestOp {
                    request: Some(request_op::Request::RequestPut(p))
                }),
                any::<bool>().prop_map(move |prev_kv| RequestOp {
                    request: Some(request_op::Request::RequestDeleteRange(
                        DeleteRangeRequest {
                            key: kd.clone(),
                            prev_kv,
                            ..Default::default()
                        }
                    ))
                }),
                range_req().prop_map(|mut r| {
                    r.revision = 0;
                    RequestOp {
                        request: Some(request_op::Request::RequestRange(r)),
                    }
                }),
            ]
            .boxed();
            w
        })
        .collect();
    ops.boxed()
}

fn txn_req() -> impl Strategy<Value = TxnRequest> {
    // Success and failure each write a disjoint key set; one nested txn in success writes keys
    // of its own.
    (
        prop::collection::vec(compare(), 0..3),
        prop::collection::vec(compare(), 0..2),
        any::<bool>(),
    )
        .prop_flat_map(|(cmp, inner_cmp, nest)| {
            let outer = branch(vec![b"a".to_vec(), b"b".to_vec()]);
            let fail = branch(vec![b"c".to_vec()]);
            let inner_s = branch(vec![b"d".to_vec()]);
            let inner_f = branch(vec![b"e".to_vec()]);
            (
                Just(cmp),
                Just(inner_cmp),
                Just(nest),
                outer,
                fail,
                inner_s,
                inner_f,
            )
        })
        .prop_map(
            |(compare, inner_cmp, nest, mut success, failure, is, if_)| {
                if nest {
                    let inner = TxnRequest {
                        compare: inner_cmp,
                        success: is,
                        failure: if_,
                    };
                    success.push(RequestOp {
                        request: Some(request_op::Request::RequestTxn(inner)),
                    });
                }
                TxnRequest {
                    compare,
                    success,
                    failure,
                }
            },
        )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => key().prop_flat_map(put_req).prop_map(Op::Put),
        2 => (key(), range_end(), any::<bool>()).prop_map(|(key, range_end, prev_kv)| Op::Delete(DeleteRangeRequest { key, range_end, prev_kv })),
        5 => (range_req(), -1i64..12).prop_map(|(r, back)| Op::Range(r, back)),
        3 => txn_req().prop_map(Op::Txn),
        1 => (0i64..6).prop_map(Op::Compact),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_model(ops in prop::collection::vec(op(), 1..60), batch_limit in prop::sample::select(vec![1usize, 3, 10_000])) {
        run(ops, batch_limit);
    }
}
