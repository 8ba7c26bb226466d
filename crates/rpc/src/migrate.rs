//! An etcd member's log entries as kvd's, for `kvd migrate`: etcd's `InternalRaftRequest`s
//! (and the v2 requests of logs begun before etcd 3.5) mapped onto kvd's replicated requests,
//! which kvd applies as etcd applies them; etcd's membership changes onto kvd's. What kvd
//! cannot apply as etcd would — a field it does not know, a v2 API write, a joint configuration
//! change — is refused, naming the entry.

use api::etcdserverpb::{
    AlarmRequest, AuthDisableRequest, AuthEnableRequest, AuthRoleAddRequest, AuthRoleDeleteRequest,
    AuthRoleGrantPermissionRequest, AuthRoleRevokePermissionRequest, AuthUserAddRequest,
    AuthUserChangePasswordRequest, AuthUserDeleteRequest, AuthUserGrantRoleRequest,
    AuthUserRevokeRoleRequest, CompactionRequest, DeleteRangeRequest, DowngradeInfo,
    LeaseCheckpointRequest, LeaseGrantRequest, LeaseRevokeRequest, PutRequest, TxnRequest,
};
use consensus::etcd_log::{EtcdChange, EtcdEntry, EtcdEntryKind};
use consensus::{ImportedEntry, ImportedOp, Member, Members};
use ids::MemberId;
use prost::Message;

use crate::request::{InternalAuthenticate, InternalRequest, Op, RequestHeader};

/// An entry kvd cannot carry over as etcd would apply it.
#[derive(Debug, thiserror::Error)]
#[error("raft entry {index}: {what}")]
pub struct Untranslatable {
    pub index: u64,
    pub what: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct EtcdHeader {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(string, tag = "2")]
    username: String,
    #[prost(uint64, tag = "3")]
    auth_revision: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct EtcdAuthenticate {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    password: String,
    #[prost(string, tag = "3")]
    simple_token: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Attributes {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, repeated, tag = "2")]
    client_urls: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct MemberAttrSet {
    #[prost(uint64, tag = "1")]
    member_id: u64,
    #[prost(message, optional, tag = "2")]
    attributes: Option<Attributes>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct DowngradeSet {
    #[prost(bool, tag = "1")]
    enabled: bool,
    #[prost(string, tag = "2")]
    ver: String,
}

/// etcd's v2 `Request`: what etcd 3.4 and older proposed to publish a member's attributes
/// and the cluster version.
#[derive(Clone, PartialEq, prost::Message)]
struct V2Request {
    #[prost(string, tag = "2")]
    method: String,
    #[prost(string, tag = "3")]
    path: String,
    #[prost(string, tag = "4")]
    val: String,
}

/// etcd's `InternalRaftRequest` (3.4 to 3.7): the requests that change state, and those it
/// replicated only to read through raft (applied as nothing).
#[derive(Clone, PartialEq, prost::Message)]
struct EtcdRequest {
    #[prost(message, optional, tag = "100")]
    header: Option<EtcdHeader>,
    #[prost(message, optional, tag = "2")]
    v2: Option<V2Request>,
    /// Read only: decoded so that an entry that is not etcd's InternalRaftRequest fails as it
    /// does in etcd (and is read as a v2 request).
    #[prost(message, optional, tag = "3")]
    range: Option<api::etcdserverpb::RangeRequest>,
    #[prost(message, optional, tag = "4")]
    put: Option<PutRequest>,
    #[prost(message, optional, tag = "5")]
    delete_range: Option<DeleteRangeRequest>,
    #[prost(message, optional, tag = "6")]
    txn: Option<TxnRequest>,
    #[prost(message, optional, tag = "7")]
    compaction: Option<CompactionRequest>,
    #[prost(message, optional, tag = "8")]
    lease_grant: Option<LeaseGrantRequest>,
    #[prost(message, optional, tag = "9")]
    lease_revoke: Option<LeaseRevokeRequest>,
    #[prost(message, optional, tag = "10")]
    alarm: Option<AlarmRequest>,
    #[prost(message, optional, tag = "11")]
    lease_checkpoint: Option<LeaseCheckpointRequest>,
    #[prost(message, optional, tag = "1000")]
    auth_enable: Option<AuthEnableRequest>,
    #[prost(message, optional, tag = "1011")]
    auth_disable: Option<AuthDisableRequest>,
    #[prost(message, optional, tag = "1012")]
    authenticate: Option<EtcdAuthenticate>,
    #[prost(message, optional, tag = "1100")]
    user_add: Option<AuthUserAddRequest>,
    #[prost(message, optional, tag = "1101")]
    user_delete: Option<AuthUserDeleteRequest>,
    #[prost(message, optional, tag = "1103")]
    user_change_password: Option<AuthUserChangePasswordRequest>,
    #[prost(message, optional, tag = "1104")]
    user_grant_role: Option<AuthUserGrantRoleRequest>,
    #[prost(message, optional, tag = "1105")]
    user_revoke_role: Option<AuthUserRevokeRoleRequest>,
    #[prost(message, optional, tag = "1200")]
    role_add: Option<AuthRoleAddRequest>,
    #[prost(message, optional, tag = "1201")]
    role_delete: Option<AuthRoleDeleteRequest>,
    #[prost(message, optional, tag = "1203")]
    role_grant_permission: Option<AuthRoleGrantPermissionRequest>,
    #[prost(message, optional, tag = "1204")]
    role_revoke_permission: Option<AuthRoleRevokePermissionRequest>,
    #[prost(message, optional, tag = "1300")]
    cluster_version_set: Option<crate::request::ClusterVersionSet>,
    #[prost(message, optional, tag = "1301")]
    member_attr_set: Option<MemberAttrSet>,
    #[prost(message, optional, tag = "1302")]
    downgrade_info_set: Option<DowngradeSet>,
}

/// Fields of `InternalRaftRequest` that change nothing when applied: the request id, reads
/// (range, auth status, user and role gets and lists) and the downgrade test request.
const NOTHING_TO_APPLY: [u32; 9] = [1, 3, 100, 1013, 1102, 1106, 1107, 1202, 9900];

/// The field numbers of the top-level message, or None if it is not well-formed protobuf.
fn field_numbers(mut b: &[u8]) -> Option<Vec<u32>> {
    use prost::encoding::{decode_key, skip_field, DecodeContext};
    let mut out = Vec::new();
    while !b.is_empty() {
        let (tag, wire) = decode_key(&mut b).ok()?;
        skip_field(wire, tag, &mut b, DecodeContext::default()).ok()?;
        out.push(tag);
    }
    Some(out)
}

/// The fields [`EtcdRequest`] and [`NOTHING_TO_APPLY`] cover.
fn known(tag: u32) -> bool {
    matches!(tag, 2 | 4..=11 | 1000 | 1011 | 1012 | 1100 | 1101 | 1103..=1105 | 1200 | 1201 | 1203 | 1204 | 1300..=1302)
        || NOTHING_TO_APPLY.contains(&tag)
}

/// What an etcd member's directory holds that kvd's log cannot take.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error(transparent)]
    Entry(#[from] Untranslatable),
    #[error("{0}")]
    Inconsistent(String),
}

/// The log a migrated member starts from: its data stands at the consistent index `db`
/// records (the snapshot, with the members and configuration the data file holds at that
/// index), then the entries of etcd's log after it, carried over; etcd's hard state.
pub fn member_log(
    log: &consensus::etcd_log::EtcdLog,
    db: &mvcc::etcd_file::Imported,
) -> Result<consensus::ImportedLog, MigrateError> {
    let bad = |s: String| MigrateError::Inconsistent(s);
    let at = db.consistent_index;
    let (snap_index, snap_term, _) = &log.snapshot;
    if at < *snap_index {
        return Err(bad(format!(
            "the data file stands at raft index {at}, before the log's snapshot at {snap_index}"
        )));
    }
    // The data may stand past the log's last entry (a torn write cut off the WAL's end after
    // it was applied): kvd's log then starts at the data's snapshot, its term the data file's.
    // The term of the entry the data stands at: etcd 3.5 and later record it beside the index.
    let from_log = if at == *snap_index {
        Some(*snap_term)
    } else {
        log.entries.iter().find(|e| e.index == at).map(|e| e.term)
    };
    let term = match (db.term, from_log) {
        (0, Some(t)) => t,
        (t, Some(l)) if t != l => {
            return Err(bad(format!(
                "the data file records term {t} for raft index {at}, the log term {l}"
            )))
        }
        (t, _) => t,
    };
    if term == 0 {
        return Err(bad(format!("no term is known for raft index {at}")));
    }
    if db.etcd.members.is_empty() {
        return Err(bad(
            "the data file lists no member: written by etcd 3.3 or older (start it once under etcd 3.4 or newer, then migrate)".into(),
        ));
    }
    let mut members = consensus::Members::default();
    for (key, json) in &db.etcd.members {
        let m = parse_member_json(json).map_err(bad)?;
        if format!("{:x}", m.id.0).as_bytes() != key.as_slice() {
            return Err(bad(format!(
                "members bucket key {} holds member {}",
                String::from_utf8_lossy(key),
                m.id
            )));
        }
        members.0.insert(m.id, m);
    }
    let conf_state = match &db.etcd.conf_state {
        Some(json) => crate::snapshot::conf_state_from_json(json).map_err(bad)?,
        // etcd 3.4 records no configuration: its members make it.
        None => {
            let mut cs = consensus::ConfState::default();
            for m in members.iter() {
                if m.is_learner {
                    cs.learners.push(m.id.0);
                } else {
                    cs.voters.push(m.id.0);
                }
            }
            cs
        }
    };
    let snapshot = consensus::SnapMeta {
        index: at,
        term,
        conf_state,
        members: members.clone(),
    };
    let after: Vec<_> = log
        .entries
        .iter()
        .filter(|e| e.index > at)
        .cloned()
        .collect();
    let entries = translate(&after, &mut members)?;
    // etcd applies entries while their commit index is being written: after a crash its data
    // may stand past the commit index its WAL recorded. What was applied was committed.
    let mut hard_state = log.hard_state.clone();
    hard_state.commit = hard_state.commit.max(at);
    Ok(consensus::ImportedLog {
        member: log.member,
        cluster: log.cluster,
        snapshot,
        hard_state,
        entries,
    })
}

/// The member of etcd's JSON (a membership change's context, the `members` bucket).
pub fn parse_member_json(json: &[u8]) -> Result<Member, String> {
    crate::snapshot::member_from_json(json)
}

/// Carries `entries` over, in order, tracking the members (`members`: those in effect before
/// the first one, left as they are after the last).
pub fn translate(
    entries: &[EtcdEntry],
    members: &mut Members,
) -> Result<Vec<ImportedEntry>, Untranslatable> {
    entries
        .iter()
        .map(|e| {
            let op = entry_op(e, members).map_err(|what| Untranslatable {
                index: e.index,
                what,
            })?;
            Ok(ImportedEntry {
                index: e.index,
                term: e.term,
                op,
            })
        })
        .collect()
}

fn entry_op(e: &EtcdEntry, members: &mut Members) -> Result<ImportedOp, String> {
    match &e.kind {
        EtcdEntryKind::Normal(data) if data.is_empty() => Ok(ImportedOp::Empty),
        EtcdEntryKind::Normal(data) => request_op(data, members),
        EtcdEntryKind::ConfChange {
            change,
            node,
            context,
        } => {
            let id = MemberId(*node);
            let member = || -> Result<Member, String> {
                let m = parse_member_json(context)?;
                if m.id != id {
                    return Err(format!(
                        "a change of member {id} with member {}'s context",
                        m.id
                    ));
                }
                Ok(m)
            };
            let op = match change {
                EtcdChange::AddNode => ImportedOp::AddMember(Member {
                    is_learner: false,
                    ..member()?
                }),
                EtcdChange::AddLearnerNode => ImportedOp::AddLearner(Member {
                    is_learner: true,
                    ..member()?
                }),
                EtcdChange::RemoveNode => ImportedOp::Remove(id),
                EtcdChange::UpdateNode => ImportedOp::MemberUpdate(Member {
                    name: String::new(),
                    client_urls: Vec::new(),
                    ..member()?
                }),
            };
            track(members, &op);
            Ok(op)
        }
        EtcdEntryKind::ConfChangeV2(data) if data.is_empty() => Ok(ImportedOp::LeaveJoint),
        EtcdEntryKind::ConfChangeV2(_) => {
            Err("a joint membership change (ConfChangeV2), which etcd does not make".into())
        }
    }
}

/// The members after `op`, as kvd's membership applies it.
fn track(members: &mut Members, op: &ImportedOp) {
    match op {
        ImportedOp::AddMember(m) | ImportedOp::AddLearner(m) => {
            let e = members.0.entry(m.id).or_insert_with(|| m.clone());
            e.is_learner = m.is_learner;
        }
        ImportedOp::Remove(id) => {
            members.0.remove(id);
        }
        ImportedOp::MemberUpdate(m) => {
            if let Some(cur) = members.0.get_mut(&m.id) {
                cur.peer_urls = m.peer_urls.clone();
                if !m.name.is_empty() {
                    cur.name = m.name.clone();
                }
                if !m.client_urls.is_empty() {
                    cur.client_urls = m.client_urls.clone();
                }
            }
        }
        _ => {}
    }
}

/// A member update setting `id`'s name and client URLs (its peer URLs as they are).
fn attributes(
    members: &mut Members,
    id: MemberId,
    name: String,
    client_urls: Vec<String>,
) -> ImportedOp {
    let peer_urls = members
        .get(id)
        .map(|m| m.peer_urls.clone())
        .unwrap_or_default();
    let op = ImportedOp::MemberUpdate(Member {
        id,
        name,
        peer_urls,
        client_urls,
        is_learner: false,
    });
    track(members, &op);
    op
}

fn request_op(data: &[u8], members: &mut Members) -> Result<ImportedOp, String> {
    // As etcd: an entry that is not an InternalRaftRequest is a v2 request.
    let tags = field_numbers(data);
    let r = match tags.as_ref().and_then(|_| EtcdRequest::decode(data).ok()) {
        Some(r) => r,
        None => {
            let v2 = V2Request::decode(data)
                .map_err(|e| format!("neither an InternalRaftRequest nor a v2 request: {e}"))?;
            return v2_op(&v2, members);
        }
    };
    if let Some(t) = tags.unwrap_or_default().into_iter().find(|t| !known(*t)) {
        return Err(format!(
            "an InternalRaftRequest with field {t}, which kvd does not know"
        ));
    }
    if let Some(v2) = &r.v2 {
        return v2_op(v2, members);
    }
    let op = match r {
        EtcdRequest { put: Some(p), .. } => Op::Put(p),
        EtcdRequest {
            delete_range: Some(d),
            ..
        } => Op::DeleteRange(d),
        EtcdRequest { txn: Some(t), .. } => Op::Txn(t),
        EtcdRequest {
            compaction: Some(c),
            ..
        } => Op::Compaction(c),
        EtcdRequest {
            lease_grant: Some(g),
            ..
        } => Op::LeaseGrant(g),
        EtcdRequest {
            lease_revoke: Some(l),
            ..
        } => Op::LeaseRevoke(l),
        EtcdRequest { alarm: Some(a), .. } => Op::Alarm(a),
        EtcdRequest {
            lease_checkpoint: Some(c),
            ..
        } => Op::LeaseCheckpoint(c),
        EtcdRequest {
            auth_enable: Some(a),
            ..
        } => Op::AuthEnable(a),
        EtcdRequest {
            auth_disable: Some(a),
            ..
        } => Op::AuthDisable(a),
        EtcdRequest {
            authenticate: Some(a),
            ..
        } => Op::Authenticate(InternalAuthenticate {
            name: a.name,
            simple_token: a.simple_token,
        }),
        EtcdRequest {
            user_add: Some(u), ..
        } => Op::UserAdd(u),
        EtcdRequest {
            user_delete: Some(u),
            ..
        } => Op::UserDelete(u),
        EtcdRequest {
            user_change_password: Some(u),
            ..
        } => Op::UserChangePassword(u),
        EtcdRequest {
            user_grant_role: Some(u),
            ..
        } => Op::UserGrantRole(u),
        EtcdRequest {
            user_revoke_role: Some(u),
            ..
        } => Op::UserRevokeRole(u),
        EtcdRequest {
            role_add: Some(r), ..
        } => Op::RoleAdd(r),
        EtcdRequest {
            role_delete: Some(r),
            ..
        } => Op::RoleDelete(r),
        EtcdRequest {
            role_grant_permission: Some(r),
            ..
        } => Op::RoleGrantPermission(r),
        EtcdRequest {
            role_revoke_permission: Some(r),
            ..
        } => Op::RoleRevokePermission(r),
        EtcdRequest {
            cluster_version_set: Some(v),
            ..
        } => Op::ClusterVersionSet(v),
        EtcdRequest {
            downgrade_info_set: Some(d),
            ..
        } => Op::DowngradeInfoSet(DowngradeInfo {
            enabled: d.enabled,
            target_version: d.ver,
        }),
        EtcdRequest {
            member_attr_set: Some(a),
            ..
        } => {
            let at = a.attributes.unwrap_or_default();
            return Ok(attributes(
                members,
                MemberId(a.member_id),
                at.name,
                at.client_urls,
            ));
        }
        _ => return Ok(ImportedOp::Empty),
    };
    // etcd checks a request at apply with its header's user and auth revision; with revision 0
    // (a member's own request, or one made while auth was off) it permits every key operation
    // and refuses admin ones once auth is on — as kvd does with no header and an empty user.
    let header = r
        .header
        .filter(|h| h.auth_revision != 0 || op.needs_admin())
        .map(|h| RequestHeader {
            username: h.username,
            auth_revision: h.auth_revision,
        });
    Ok(ImportedOp::Proposal(
        InternalRequest {
            op: Some(op),
            header,
        }
        .encode_to_vec(),
    ))
}

/// etcd's v2 requests as etcd 3.6 still applies them: a member's attributes published, the
/// cluster version set; reads through raft apply as nothing.
fn v2_op(r: &V2Request, members: &mut Members) -> Result<ImportedOp, String> {
    match r.method.as_str() {
        "QGET" | "GET" | "SYNC" => return Ok(ImportedOp::Empty),
        "PUT" if r.path == "/0/version" => return Ok(ImportedOp::Empty),
        "PUT" => {
            let id = r
                .path
                .strip_prefix("/0/members/")
                .and_then(|p| p.strip_suffix("/attributes"))
                .and_then(|id| u64::from_str_radix(id, 16).ok());
            if let Some(id) = id {
                #[derive(serde::Deserialize)]
                struct Attr {
                    #[serde(default)]
                    name: String,
                    #[serde(rename = "clientURLs", default)]
                    client_urls: Vec<String>,
                }
                let a: Attr = serde_json::from_str(&r.val)
                    .map_err(|e| format!("a member's attributes that do not decode: {e}"))?;
                return Ok(attributes(members, MemberId(id), a.name, a.client_urls));
            }
        }
        _ => {}
    }
    Err(format!(
        "a v2 API request ({} {}): kvd has no v2 store (etcd 3.6 refuses v2 data too)",
        r.method, r.path
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normal(index: u64, data: Vec<u8>) -> EtcdEntry {
        EtcdEntry {
            index,
            term: 2,
            kind: EtcdEntryKind::Normal(data),
        }
    }

    #[test]
    fn etcds_requests_become_kvds_with_their_headers() {
        let put = PutRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        };
        let from_user = EtcdRequest {
            header: Some(EtcdHeader {
                id: 7,
                username: "alice".into(),
                auth_revision: 4,
            }),
            put: Some(put.clone()),
            ..Default::default()
        };
        let own = EtcdRequest {
            header: Some(EtcdHeader {
                id: 8,
                ..Default::default()
            }),
            lease_revoke: Some(LeaseRevokeRequest { id: 9 }),
            ..Default::default()
        };
        let read = EtcdRequest {
            header: Some(EtcdHeader::default()),
            ..Default::default()
        };
        let mut members = Members::default();
        let got = translate(
            &[
                normal(5, from_user.encode_to_vec()),
                normal(6, own.encode_to_vec()),
                normal(7, read.encode_to_vec()),
                normal(8, Vec::new()),
            ],
            &mut members,
        )
        .unwrap();
        let decoded = |op: &ImportedOp| match op {
            ImportedOp::Proposal(b) => InternalRequest::decode(b.as_slice()).unwrap(),
            other => panic!("{other:?}"),
        };
        let a = decoded(&got[0].op);
        assert_eq!(a.op, Some(Op::Put(put)));
        assert_eq!(
            a.header,
            Some(RequestHeader {
                username: "alice".into(),
                auth_revision: 4
            })
        );
        assert_eq!((got[0].index, got[0].term), (5, 2));
        let b = decoded(&got[1].op);
        assert_eq!(b.op, Some(Op::LeaseRevoke(LeaseRevokeRequest { id: 9 })));
        assert_eq!(
            b.header, None,
            "a member's own request is checked as kvd's own"
        );
        assert_eq!(got[2].op, ImportedOp::Empty);
        assert_eq!(got[3].op, ImportedOp::Empty);
    }

    #[test]
    fn membership_changes_and_attributes_follow_the_members() {
        let json = br#"{"id":42,"peerURLs":["http://a:2380"],"isLearner":true}"#;
        let mut members = Members::default();
        let attrs = EtcdRequest {
            member_attr_set: Some(MemberAttrSet {
                member_id: 42,
                attributes: Some(Attributes {
                    name: "a".into(),
                    client_urls: vec!["http://a:2379".into()],
                }),
            }),
            ..Default::default()
        };
        let v2 = V2Request {
            method: "PUT".into(),
            path: "/0/members/2a/attributes".into(),
            val: r#"{"name":"a2","clientURLs":["http://a:2479"]}"#.into(),
        };
        let got = translate(
            &[
                EtcdEntry {
                    index: 3,
                    term: 1,
                    kind: EtcdEntryKind::ConfChange {
                        change: EtcdChange::AddLearnerNode,
                        node: 42,
                        context: json.to_vec(),
                    },
                },
                normal(4, attrs.encode_to_vec()),
                normal(5, v2.encode_to_vec()),
            ],
            &mut members,
        )
        .unwrap();
        assert!(matches!(&got[0].op, ImportedOp::AddLearner(m) if m.id == MemberId(42)));
        let m = members.get(MemberId(42)).unwrap();
        assert_eq!(m.name, "a2");
        assert_eq!(m.client_urls, ["http://a:2479"]);
        assert_eq!(
            m.peer_urls,
            ["http://a:2380"],
            "attributes keep the peer URLs"
        );
        assert!(m.is_learner);
    }

    #[test]
    fn what_kvd_cannot_apply_as_etcd_is_refused() {
        let mut unknown = EtcdRequest::default().encode_to_vec();
        // Field 1400 (varint 1): a request kvd does not know.
        unknown.extend_from_slice(&[0xc0, 0x57, 0x01]);
        let v2_write = V2Request {
            method: "PUT".into(),
            path: "/foo".into(),
            val: "bar".into(),
        };
        for (data, says) in [
            (unknown, "field 1400"),
            (v2_write.encode_to_vec(), "v2 API request (PUT /foo)"),
        ] {
            let err = translate(&[normal(9, data)], &mut Members::default()).unwrap_err();
            assert_eq!(err.index, 9);
            assert!(err.to_string().contains(says), "{err}");
        }
    }
}
