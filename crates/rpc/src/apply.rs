//! The state machine consensus replicates into: committed requests applied to mvcc.
//!
//! A batch of committed entries is applied under one mvcc writer (each request is still its own
//! etcd transaction with its own revision) and the raft index it reaches is recorded with the
//! writes, in the same pager commit, so a restart resumes from exactly there. Request errors
//! (a compacted revision, an unknown lease) are answers; storage failures stop the member.

use std::io::{self, Read};
use std::sync::Arc;

use api::etcdserverpb::alarm_request::AlarmAction;
use api::etcdserverpb::{
    AlarmMember, AlarmResponse, AlarmType, CompactionResponse, ResponseHeader,
};
use consensus::{Committed, StateMachine};
use mvcc::Writer;
use prost::Message;

use crate::auth::{self, Auth, AuthError, AuthInfo, Checks, Need};
use ids::{LeaseId, MemberId, RaftIndex, Revision};

use crate::backend::Backend;
use crate::error;
use crate::request::{Applied, InternalRequest, Op, RequestHeader, Response};

/// kvd's [`StateMachine`].
#[derive(Debug)]
pub struct KvStateMachine {
    backend: Arc<Backend>,
    /// The member's tokens and permission checks (the users and roles are in the store).
    auth: Arc<Auth>,
}

impl KvStateMachine {
    pub fn new(backend: Arc<Backend>, auth: Arc<Auth>) -> Self {
        KvStateMachine { backend, auth }
    }

    /// etcd's apply-time auth checks of a client's request (`header` names the caller), on
    /// the auth store as of this entry: a permission revoked since the request was checked
    /// and proposed is honoured here, the same on every member.
    fn permitted(&self, w: &Writer<'_>, header: &RequestHeader, op: &Op) -> Result<(), AuthError> {
        let data = w.auth();
        if !data.enabled {
            return Ok(());
        }
        let who = AuthInfo {
            user: header.username.clone(),
            revision: header.auth_revision,
        };
        let keys = |id| w.lease_keys(id);
        let mut c = self.auth.check(&data, Some(&who), &keys);
        match op {
            Op::Put(p) => auth::put(&mut c, p),
            Op::DeleteRange(d) => auth::delete_range(&mut c, d),
            Op::Txn(t) => auth::txn(&mut c, t),
            Op::LeaseRevoke(r) => c.lease(LeaseId(r.id)),
            // An admin's, as in etcd 3.7 (compaction drops every key's history).
            Op::Compaction(_) | Op::Alarm(_) | Op::DowngradeInfoSet(_) => c.admin(),
            op if op.needs_admin() => c.admin(),
            // Anyone may grant a lease (etcd's rule); Authenticate was checked by password;
            // checkpoints are the leader's own.
            Op::LeaseGrant(_) | Op::Authenticate(_) | Op::LeaseCheckpoint(_) => Ok(()),
            // The leader's own.
            Op::ClusterVersionSet(_) => Ok(()),
            _ => c.need(Need::Write, &[0], &[0]),
        }
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
    fn apply_one(
        &self,
        w: &mut Writer<'_>,
        rev: Revision,
        op: Op,
        index: RaftIndex,
    ) -> mvcc::Result<Applied> {
        if auth::is_auth(&op) {
            return Ok(auth::apply(w, &self.auth, op, index).map_err(AuthError::status));
        }
        Ok(Ok(match op {
            Op::Put(p) => Response::Put(w.put(&p)?),
            Op::DeleteRange(d) => Response::DeleteRange(w.delete_range(&d)?),
            Op::Txn(t) => Response::Txn(w.txn(&t)?),
            Op::Compaction(c) => {
                let cur = w.compact(Revision(c.revision))?;
                Response::Compaction(CompactionResponse {
                    header: Some(ResponseHeader {
                        revision: cur.0,
                        ..Default::default()
                    }),
                })
            }
            Op::LeaseGrant(g) => Response::LeaseGrant(w.lease_grant(LeaseId(g.id), g.ttl)?),
            Op::LeaseRevoke(r) => Response::LeaseRevoke(w.lease_revoke(LeaseId(r.id))?),
            Op::LeaseCheckpoint(c) => {
                for cp in &c.checkpoints {
                    // A lease revoked since the checkpoint was proposed has nothing to record.
                    match w.lease_checkpoint(LeaseId(cp.id), cp.remaining_ttl) {
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
                        if w.alarm(MemberId(a.member_id), a.alarm, true) {
                            tracing::warn!(member = %MemberId(a.member_id), alarm = a.alarm, "alarm raised");
                        }
                        alarms.push(member);
                    }
                    Ok(AlarmAction::Deactivate)
                        if w.alarm(MemberId(a.member_id), a.alarm, false) =>
                    {
                        tracing::info!(member = %MemberId(a.member_id), alarm = a.alarm, "alarm cleared");
                        alarms.push(member);
                    }
                    _ => {}
                }
                Response::Alarm(AlarmResponse {
                    header: Some(ResponseHeader {
                        revision: rev.0,
                        ..Default::default()
                    }),
                    alarms,
                })
            }
            Op::DowngradeInfoSet(d) => {
                w.set_downgrade(d);
                Response::None
            }
            Op::ClusterVersionSet(v) => {
                match crate::version::Version::parse(&v.ver) {
                    Some(_) => w.set_cluster_version(&v.ver),
                    None => {
                        tracing::warn!(version = %v.ver, "a cluster version that is not a version: ignored")
                    }
                }
                Response::None
            }
            // Routed to the auth store above.
            _ => return Ok(Err(AuthError::InvalidAuthMgmt.status())),
        }))
    }
}

impl StateMachine for KvStateMachine {
    type Output = Applied;

    fn applied(&self) -> RaftIndex {
        self.backend.store().applied().index
    }

    fn apply(&mut self, batch: &mut [Committed<'_>]) -> io::Result<Vec<Applied>> {
        let store = self.backend.store();
        let done = store.applied().index;
        let mut w = store.write().map_err(io_err)?;
        let mut out = Vec::with_capacity(batch.len());
        for c in batch.iter_mut() {
            let Some(data) = c.data.filter(|_| c.index > done) else {
                out.push(Ok(Response::None));
                continue;
            };
            // The request this member proposed, as it encoded it into `data`: not decoded again.
            let local = c
                .local
                .take()
                .and_then(|l| l.downcast::<InternalRequest>().ok());
            let (op, header) = match local.map_or_else(|| InternalRequest::decode(data), |r| Ok(*r))
            {
                Ok(InternalRequest {
                    op: Some(op),
                    header,
                }) => (op, header),
                Ok(InternalRequest { op: None, .. }) | Err(_) => {
                    // Written by a newer kvd, or damaged: refuse it, the same on every member.
                    tracing::error!(index = %c.index, "entry holds no request kvd knows; skipped");
                    out.push(Err(tonic::Status::internal(format!(
                        "raft entry {} holds no request this kvd knows",
                        c.index
                    ))));
                    continue;
                }
            };
            if let Some(h) = &header {
                if let Err(e) = self.permitted(&w, h, &op) {
                    out.push(Err(e.status()));
                    continue;
                }
            }
            // etcd's corrupt applier: while a member's data is known to differ, nothing more
            // is written anywhere (reads and alarm changes go on), the same on every member.
            if op.writes_data() && store.has_alarm(AlarmType::Corrupt as i32) {
                out.push(Err(error::corrupt()));
                continue;
            }
            match self.apply_one(&mut w, store.rev(), op, c.index) {
                Ok(r) => out.push(r),
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

    fn restore(&mut self, index: RaftIndex, term: u64, data: &mut dyn Read) -> io::Result<()> {
        self.backend.restore(data, mvcc::Applied { index, term })?;
        tracing::info!(%index, term, "restored the store from a snapshot");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Tokens;
    use crate::request::RequestHeader;
    use api::authpb::{permission::Type as PermType, Permission};
    use api::etcdserverpb::{
        AuthEnableRequest, AuthRoleAddRequest, AuthRoleGrantPermissionRequest, AuthUserAddRequest,
        AuthUserGrantRoleRequest, AuthUserRevokeRoleRequest, PutRequest,
    };

    /// Applies `ops` in order (with each `who`, None for the member's own), one per entry.
    fn apply(
        sm: &mut KvStateMachine,
        first: u64,
        ops: Vec<(Op, Option<&str>, u64)>,
    ) -> Vec<Applied> {
        let entries: Vec<Vec<u8>> = ops
            .into_iter()
            .map(|(op, who, rev)| match who {
                None => InternalRequest::encode(op),
                Some(u) => InternalRequest::encode_from(
                    op,
                    RequestHeader {
                        username: u.into(),
                        auth_revision: rev,
                    },
                ),
            })
            .collect();
        let mut batch: Vec<Committed<'_>> = entries
            .iter()
            .enumerate()
            .map(|(i, d)| Committed {
                index: RaftIndex(first + i as u64),
                term: 1,
                data: Some(d),
                local: None,
            })
            .collect();
        sm.apply(&mut batch).unwrap()
    }

    /// A state machine over a new store (kept in the returned directory), auth off.
    fn state_machine() -> (tempfile::TempDir, Arc<Backend>, KvStateMachine) {
        let dir = tempfile::tempdir().unwrap();
        let backend = Arc::new(Backend::open(dir.path().join("db"), Default::default()).unwrap());
        let auth = Arc::new(Auth::new(Tokens::None, 4, false));
        let sm = KvStateMachine::new(backend.clone(), auth);
        (dir, backend, sm)
    }

    /// The keys under `/` in the store.
    fn keys(backend: &Backend) -> Vec<String> {
        let r = backend
            .store()
            .read()
            .unwrap()
            .range(&api::etcdserverpb::RangeRequest {
                key: b"/".to_vec(),
                range_end: b"0".to_vec(),
                keys_only: true,
                ..Default::default()
            })
            .unwrap();
        r.kvs
            .iter()
            .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
            .collect()
    }

    fn put(key: &str) -> Op {
        Op::Put(PutRequest {
            key: key.into(),
            value: b"v".to_vec(),
            ..Default::default()
        })
    }

    /// A request checked when proposed is checked again when applied: a role revoked in
    /// between (an entry before it in the log) is honoured, on every member alike.
    #[test]
    fn applying_checks_the_caller_against_the_auth_store_of_that_entry() {
        let (_dir, backend, mut sm) = state_machine();
        let user = |name: &str| {
            Op::UserAdd(AuthUserAddRequest {
                name: name.into(),
                options: Some(api::authpb::UserAddOptions { no_password: true }),
                ..Default::default()
            })
        };
        let grant = |user: &str, role: &str| {
            Op::UserGrantRole(AuthUserGrantRoleRequest {
                user: user.into(),
                role: role.into(),
            })
        };
        let setup = vec![
            (user("root"), None, 0),
            (grant("root", "root"), None, 0),
            (user("alice"), None, 0),
            (
                Op::RoleAdd(AuthRoleAddRequest { name: "a".into() }),
                None,
                0,
            ),
            (
                Op::RoleGrantPermission(AuthRoleGrantPermissionRequest {
                    name: "a".into(),
                    perm: Some(Permission {
                        perm_type: PermType::Readwrite as i32,
                        key: b"/a/".to_vec(),
                        range_end: b"/a0".to_vec(),
                    }),
                }),
                None,
                0,
            ),
            (grant("alice", "a"), None, 0),
            (Op::AuthEnable(AuthEnableRequest {}), None, 0),
        ];
        for r in apply(&mut sm, 1, setup) {
            r.unwrap();
        }
        let rev = backend.store().auth().revision;
        let code = |r: &Applied| r.as_ref().err().map(|s| s.message().to_string());
        let out = apply(
            &mut sm,
            10,
            vec![
                (put("/a/1"), Some("alice"), rev),
                (put("/b"), Some("alice"), rev),
                (put("/a/2"), Some(""), 0),
                (put("/a/3"), Some("alice"), rev - 1),
                // Root takes the role away; alice's next write, checked (and proposed)
                // before that, is refused as it is applied.
                (
                    Op::UserRevokeRole(AuthUserRevokeRoleRequest {
                        name: "alice".into(),
                        role: "a".into(),
                    }),
                    Some("root"),
                    rev,
                ),
                (put("/a/4"), Some("alice"), rev),
                (put("/a/5"), Some("alice"), rev + 1),
                (put("/x"), None, 0),
            ],
        );
        let got: Vec<Option<String>> = out.iter().map(code).collect();
        assert_eq!(
            got,
            [
                None,
                Some("etcdserver: permission denied".into()),
                Some("etcdserver: user name is empty".into()),
                Some("etcdserver: revision of auth store is old".into()),
                None,
                Some("etcdserver: revision of auth store is old".into()),
                Some("etcdserver: permission denied".into()),
                None,
            ]
        );
        assert_eq!(
            keys(&backend),
            ["/a/1", "/x"],
            "alice's refused writes left nothing"
        );
    }

    /// The proposing member's apply takes the request its proposer handed along rather than
    /// decode the entry (the two are the same request in use; they differ here to tell which
    /// was applied); a local of another type leaves the entry's bytes to be decoded.
    #[test]
    fn the_proposers_own_request_is_applied_without_decoding_the_entry() {
        let (_dir, backend, mut sm) = state_machine();
        let bytes = [
            InternalRequest::encode(put("/bytes-1")),
            InternalRequest::encode(put("/bytes-2")),
        ];
        let local = InternalRequest {
            op: Some(put("/local-1")),
            header: None,
        };
        let locals: [consensus::Local; 2] = [Box::new(local), Box::new(put("/not-a-request"))];
        let mut batch: Vec<Committed<'_>> = bytes
            .iter()
            .zip(locals)
            .enumerate()
            .map(|(i, (d, l))| Committed {
                index: RaftIndex(i as u64 + 1),
                term: 1,
                data: Some(d),
                local: Some(l),
            })
            .collect();
        for r in sm.apply(&mut batch).unwrap() {
            r.unwrap();
        }
        assert_eq!(keys(&backend), ["/bytes-2", "/local-1"]);
    }
}
