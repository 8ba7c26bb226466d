//! The state machine consensus replicates into: committed requests applied to mvcc.
//!
//! A batch of committed entries is applied under one mvcc writer (each request is still its own
//! etcd transaction with its own revision) and the raft index it reaches is recorded with the
//! writes, in the same pager commit, so a restart resumes from exactly there. Request errors
//! (a compacted revision, an unknown lease) are answers; storage failures stop the member.

use std::io::{self, Read};
use std::sync::Arc;

use api::etcdserverpb::alarm_request::AlarmAction;
use api::etcdserverpb::{AlarmMember, AlarmResponse, CompactionResponse, ResponseHeader};
use consensus::{Committed, StateMachine};
use mvcc::Writer;
use prost::Message;

use crate::backend::Backend;
use crate::error;
use crate::request::{Applied, InternalRequest, Op, Response};

/// kvd's [`StateMachine`].
#[derive(Debug)]
pub struct KvStateMachine {
    backend: Arc<Backend>,
}

impl KvStateMachine {
    pub fn new(backend: Arc<Backend>) -> Self {
        KvStateMachine { backend }
    }
}

/// Whether an mvcc error is a failure of the member (not an answer to the request).
fn fatal(e: &mvcc::Error) -> bool {
    matches!(
        e,
        mvcc::Error::Storage(_) | mvcc::Error::Stopped(_) | mvcc::Error::Corrupt { .. }
    )
}

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

impl KvStateMachine {
    fn apply_one(&self, w: &mut Writer<'_>, rev: i64, op: Op) -> mvcc::Result<Response> {
        Ok(match op {
            Op::Put(p) => Response::Put(w.put(&p)?),
            Op::DeleteRange(d) => Response::DeleteRange(w.delete_range(&d)?),
            Op::Txn(t) => Response::Txn(w.txn(&t)?),
            Op::Compaction(c) => {
                let cur = w.compact(c.revision)?;
                Response::Compaction(CompactionResponse {
                    header: Some(ResponseHeader {
                        revision: cur,
                        ..Default::default()
                    }),
                })
            }
            Op::LeaseGrant(g) => Response::LeaseGrant(w.lease_grant(g.id, g.ttl)?),
            Op::LeaseRevoke(r) => Response::LeaseRevoke(w.lease_revoke(r.id)?),
            Op::LeaseCheckpoint(c) => {
                for cp in &c.checkpoints {
                    // A lease revoked since the checkpoint was proposed has nothing to record.
                    match w.lease_checkpoint(cp.id, cp.remaining_ttl) {
                        Err(mvcc::Error::LeaseNotFound) | Ok(()) => {}
                        Err(e) => return Err(e),
                    }
                }
                Response::None
            }
            Op::Alarm(a) => {
                // As etcd's: the answer holds the alarm raised (new or already there) or the
                // alarm cleared (none if it was not raised).
                let member = AlarmMember {
                    member_id: a.member_id,
                    alarm: a.alarm,
                };
                let mut alarms = Vec::new();
                match AlarmAction::try_from(a.action) {
                    Ok(AlarmAction::Activate) if a.alarm != 0 => {
                        if w.alarm(a.member_id, a.alarm, true) {
                            tracing::warn!(member = %format!("{:x}", a.member_id), alarm = a.alarm, "alarm raised");
                        }
                        alarms.push(member);
                    }
                    Ok(AlarmAction::Deactivate) if w.alarm(a.member_id, a.alarm, false) => {
                        tracing::info!(member = %format!("{:x}", a.member_id), alarm = a.alarm, "alarm cleared");
                        alarms.push(member);
                    }
                    _ => {}
                }
                Response::Alarm(AlarmResponse {
                    header: Some(ResponseHeader {
                        revision: rev,
                        ..Default::default()
                    }),
                    alarms,
                })
            }
        })
    }
}

impl StateMachine for KvStateMachine {
    type Output = Applied;

    fn applied(&self) -> u64 {
        self.backend.store().applied().index
    }

    fn apply(&mut self, batch: &[Committed<'_>]) -> io::Result<Vec<Applied>> {
        let store = self.backend.store();
        let done = store.applied().index;
        let mut w = store.write().map_err(io_err)?;
        let mut out = Vec::with_capacity(batch.len());
        for c in batch {
            let Some(data) = c.data.filter(|_| c.index > done) else {
                out.push(Ok(Response::None));
                continue;
            };
            let op = match InternalRequest::decode(data) {
                Ok(InternalRequest { op: Some(op) }) => op,
                Ok(InternalRequest { op: None }) | Err(_) => {
                    // Written by a newer kvd, or damaged: refuse it, the same on every member.
                    tracing::error!(index = c.index, "entry holds no request kvd knows; skipped");
                    out.push(Err(tonic::Status::internal(format!(
                        "raft entry {} holds no request this kvd knows",
                        c.index
                    ))));
                    continue;
                }
            };
            match self.apply_one(&mut w, store.rev(), op) {
                Ok(r) => out.push(Ok(r)),
                Err(e) if fatal(&e) => return Err(io_err(e)),
                Err(e) => out.push(Err(error::mvcc(&e))),
            }
        }
        if let Some(last) = batch.last() {
            if last.index > done {
                w.set_applied(mvcc::Applied {
                    index: last.index,
                    term: last.term,
                });
            }
        }
        Ok(out)
    }

    fn sync(&mut self) -> io::Result<()> {
        self.backend.store().sync().map_err(io_err)
    }

    fn snapshot(&mut self) -> io::Result<Box<dyn Read + Send>> {
        Ok(Box::new(self.backend.dump()?))
    }

    fn restore(&mut self, index: u64, term: u64, data: &mut dyn Read) -> io::Result<()> {
        self.backend.restore(data, mvcc::Applied { index, term })?;
        tracing::info!(index, term, "restored the store from a snapshot");
        Ok(())
    }
}
