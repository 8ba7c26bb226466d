//! Requests through validation and apply: fuzz bytes drive a sequence of Put, DeleteRange,
//! Range (at any revision, with its options), Txn (nested), Compact, flush and reopen; what
//! mvcc's validation refuses (as etcd would) never reaches the store; the rest is applied to
//! the store and to the naive model of `crates/mvcc/tests/support/model.rs`, and every
//! response, error and revision must be the same.
#![no_main]

#[path = "../../crates/mvcc/tests/support/model.rs"]
mod model;

use api::etcdserverpb::compare::TargetUnion;
use api::etcdserverpb::request_op::Request;
use api::etcdserverpb::*;
use libfuzzer_sys::fuzz_target;
use model::{run, Op};

const KEYS: &[&[u8]] = &[b"a", b"b", b"c", b"d", b"e"];

/// The fuzz bytes, read a choice at a time (zeros once they run out).
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }

    fn below(&mut self, n: u8) -> u8 {
        self.byte() % n
    }

    fn bool(&mut self) -> bool {
        self.byte() & 1 == 1
    }

    /// One of a few keys, so requests meet; now and then any short key, the empty one
    /// included (which validation refuses).
    fn key(&mut self) -> Vec<u8> {
        match self.byte() {
            b @ 0..=239 => KEYS[b as usize % KEYS.len()].to_vec(),
            b => (0..b % 4).map(|_| self.byte()).collect(),
        }
    }

    /// A sort option, now and then one no enum has (validation refuses it).
    fn sort(&mut self, n: u8) -> i32 {
        match self.byte() {
            250.. => 7,
            b => (b % n) as i32,
        }
    }

    fn range_end(&mut self) -> Vec<u8> {
        match self.below(4) {
            0 => Vec::new(),
            1 => vec![0],
            2 => self.key(),
            _ => b"z".to_vec(),
        }
    }

    fn value(&mut self) -> Vec<u8> {
        let n = self.below(4) as usize;
        (0..n).map(|_| self.byte()).collect()
    }

    fn put(&mut self, key: Vec<u8>) -> PutRequest {
        PutRequest {
            key,
            value: self.value(),
            prev_kv: self.bool(),
            ..Default::default()
        }
    }

    fn range(&mut self) -> RangeRequest {
        let limit = self.below(4) as i64;
        RangeRequest {
            key: self.key(),
            range_end: self.range_end(),
            limit,
            sort_order: self.sort(3),
            sort_target: self.sort(5),
            keys_only: self.bool(),
            count_only: self.bool() && limit == 0,
            min_mod_revision: self.below(8) as i64,
            max_create_revision: self.below(8) as i64,
            ..Default::default()
        }
    }

    fn compare(&mut self) -> Compare {
        let key = self.key();
        let range_end = if self.bool() { vec![0] } else { Vec::new() };
        let (target, result, n) = (self.below(4), self.below(4), self.below(6) as i64);
        let target_union = Some(match target {
            0 => TargetUnion::Version(n),
            1 => TargetUnion::CreateRevision(n),
            2 => TargetUnion::ModRevision(n),
            _ => TargetUnion::Value(self.value()),
        });
        Compare {
            result: result as i32,
            target: target as i32,
            key,
            range_end,
            target_union,
        }
    }

    /// Ops of a branch; a nested txn while `depth` allows.
    fn branch(&mut self, depth: u8) -> Vec<RequestOp> {
        let n = self.below(4);
        (0..n)
            .map(|_| {
                let r = match self.below(if depth > 0 { 4 } else { 3 }) {
                    0 => {
                        let k = self.key();
                        Request::RequestPut(self.put(k))
                    }
                    1 => Request::RequestDeleteRange(DeleteRangeRequest {
                        key: self.key(),
                        range_end: self.range_end(),
                        prev_kv: self.bool(),
                    }),
                    2 => {
                        let mut r = self.range();
                        r.revision = 0;
                        Request::RequestRange(r)
                    }
                    _ => Request::RequestTxn(self.txn(depth - 1)),
                };
                RequestOp { request: Some(r) }
            })
            .collect()
    }

    fn txn(&mut self, depth: u8) -> TxnRequest {
        let n = self.below(3);
        TxnRequest {
            compare: (0..n).map(|_| self.compare()).collect(),
            success: self.branch(depth),
            failure: self.branch(depth),
        }
    }

    fn op(&mut self) -> Op {
        match self.below(8) {
            0 | 1 => {
                let k = self.key();
                Op::Put(self.put(k))
            }
            2 => Op::Delete(DeleteRangeRequest {
                key: self.key(),
                range_end: self.range_end(),
                prev_kv: self.bool(),
            }),
            3 => {
                let back = self.below(6) as i64 - 1;
                Op::Range(self.range(), back)
            }
            4 => Op::Txn(self.txn(2)),
            5 => Op::Compact(self.below(4) as i64),
            6 => Op::Flush,
            _ => Op::Reopen,
        }
    }
}

/// Whether mvcc's validation (etcd's checks, done before a request is proposed) takes `op`.
fn valid(op: &Op) -> bool {
    match op {
        Op::Put(p) => mvcc::validate::check_put(p).is_ok(),
        Op::Delete(d) => mvcc::validate::check_delete(d).is_ok(),
        Op::Range(r, _) => mvcc::validate::check_range(r).is_ok(),
        Op::Txn(t) => mvcc::validate::check_txn(t, 128).is_ok(),
        Op::Compact(_) | Op::Flush | Op::Reopen => true,
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let batch_limit = [1usize, 3, 10_000][input.below(3) as usize];
    let n = input.below(40) as usize + 1;
    let ops: Vec<Op> = (0..n).map(|_| input.op()).filter(valid).collect();
    run(ops, batch_limit);
});
