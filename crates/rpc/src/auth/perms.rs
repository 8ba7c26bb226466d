//! Permissions: the key ranges a user may read and write (the union of its roles' grants), and
//! the check of a request against them — etcd's checks, and the corners etcd 3.6.5 misses
//! (the ops of a txn nested in a txn, `prev_kv` and leases on a txn's puts).

use std::collections::BTreeMap;

use api::authpb::permission::Type as PermType;
use api::authpb::{Role, User};
use api::etcdserverpb::request_op::Request as Op;
use api::etcdserverpb::{DeleteRangeRequest, PutRequest, RangeRequest, TxnRequest};
use ids::LeaseId;

/// The role whose users may do everything.
pub const ROOT: &str = "root";

/// A half-open key range `[start, end)`; `end` None: up to the end of the key space.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Span {
    start: Vec<u8>,
    end: Option<Vec<u8>>,
}

impl Span {
    /// The keys etcd's `(key, range_end)` names: `range_end` empty is `key` alone, `"\0"` is
    /// every key from `key` on.
    fn of(key: &[u8], range_end: &[u8]) -> Span {
        let end = match range_end {
            [] => {
                let mut e = key.to_vec();
                e.push(0);
                Some(e)
            }
            [0] => None,
            e => Some(e.to_vec()),
        };
        Span {
            start: key.to_vec(),
            end,
        }
    }

    /// Whether `end` reaches at least `other` (None is the end of the key space).
    fn ends_at_or_after(end: &Option<Vec<u8>>, other: &Option<Vec<u8>>) -> bool {
        match (end, other) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(a), Some(b)) => a >= b,
        }
    }
}

/// Sorted, disjoint and non-adjacent spans.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet(Vec<Span>);

impl RangeSet {
    fn new(mut spans: Vec<Span>) -> RangeSet {
        spans.sort_by(|a, b| a.start.cmp(&b.start));
        let mut out: Vec<Span> = Vec::with_capacity(spans.len());
        for s in spans {
            match out.last_mut() {
                // Overlapping or touching the last one: extend it.
                Some(last) if last.end.as_ref().is_none_or(|e| *e >= s.start) => {
                    if !Span::ends_at_or_after(&last.end, &s.end) {
                        last.end = s.end;
                    }
                }
                _ => out.push(s),
            }
        }
        RangeSet(out)
    }

    /// Whether every key of etcd's `(key, range_end)` is in the set. A range that names no
    /// key (`range_end` below `key`) needs `key` itself.
    pub fn covers(&self, key: &[u8], range_end: &[u8]) -> bool {
        let mut want = Span::of(key, range_end);
        if want.end.as_deref().is_some_and(|e| e <= key) {
            want = Span::of(key, &[]);
        }
        // The span starting at or before `key`: merged spans leave no other candidate.
        let i = self.0.partition_point(|s| s.start.as_slice() <= key);
        let Some(s) = i.checked_sub(1).map(|i| &self.0[i]) else {
            return false;
        };
        Span::ends_at_or_after(&s.end, &want.end) && s.end.as_deref().is_none_or(|e| e > key)
    }
}

/// What a user may read and write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Perms {
    pub root: bool,
    read: RangeSet,
    write: RangeSet,
}

impl Perms {
    /// `user`'s permissions: the grants of its roles (a role that no longer exists gives
    /// nothing; the `root` role gives everything).
    pub fn of(user: &User, roles: &BTreeMap<String, Role>) -> Perms {
        let (mut read, mut write) = (Vec::new(), Vec::new());
        let mut root = false;
        for name in &user.roles {
            root |= name == ROOT;
            let Some(role) = roles.get(name) else {
                continue;
            };
            for p in &role.key_permission {
                let span = Span::of(&p.key, &p.range_end);
                match PermType::try_from(p.perm_type) {
                    Ok(PermType::Read) => read.push(span),
                    Ok(PermType::Write) => write.push(span),
                    Ok(PermType::Readwrite) => {
                        read.push(span.clone());
                        write.push(span);
                    }
                    Err(_) => {}
                }
            }
        }
        Perms {
            root,
            read: RangeSet::new(read),
            write: RangeSet::new(write),
        }
    }

    pub fn allows(&self, need: Need, key: &[u8], range_end: &[u8]) -> bool {
        self.root
            || match need {
                Need::Read => self.read.covers(key, range_end),
                Need::Write => self.write.covers(key, range_end),
            }
    }
}

/// What an operation needs of a key range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    Read,
    Write,
}

/// Whether a role's permission names a valid range (etcd's isValidPermissionRange): a key,
/// and an end after it, or none (one key), or `"\0"` (every key from it on).
pub fn valid_permission_range(key: &[u8], range_end: &[u8]) -> bool {
    !key.is_empty() && (range_end.is_empty() || range_end == [0] || key < range_end)
}

/// The checks of one request: `need` for each key range it reads or writes, and `lease`
/// for a lease it attaches keys to (its keys must all be writable).
pub trait Checks {
    type Error;
    fn need(&mut self, need: Need, key: &[u8], range_end: &[u8]) -> Result<(), Self::Error>;
    fn lease(&mut self, id: LeaseId) -> Result<(), Self::Error>;
}

pub fn range<C: Checks>(c: &mut C, r: &RangeRequest) -> Result<(), C::Error> {
    c.need(Need::Read, &r.key, &r.range_end)
}

pub fn put<C: Checks>(c: &mut C, p: &PutRequest) -> Result<(), C::Error> {
    c.need(Need::Write, &p.key, &[])?;
    if p.lease != 0 {
        // The lease's keys must all be the caller's to write: it could revoke them otherwise.
        c.lease(LeaseId(p.lease))?;
    }
    if p.prev_kv {
        c.need(Need::Read, &p.key, &[])?;
    }
    Ok(())
}

pub fn delete_range<C: Checks>(c: &mut C, d: &DeleteRangeRequest) -> Result<(), C::Error> {
    c.need(Need::Write, &d.key, &d.range_end)?;
    if d.prev_kv {
        c.need(Need::Read, &d.key, &d.range_end)?;
    }
    Ok(())
}

/// Compaction drops history of every key: kvd asks for write permission on all of them (etcd
/// 3.6.5 lets any caller compact).
/// Every compare and every op of both branches, at every depth: whichever branch runs, the
/// caller may do all of it.
pub fn txn<C: Checks>(c: &mut C, t: &TxnRequest) -> Result<(), C::Error> {
    for cmp in &t.compare {
        c.need(Need::Read, &cmp.key, &cmp.range_end)?;
    }
    for op in t.success.iter().chain(&t.failure) {
        match &op.request {
            Some(Op::RequestRange(r)) => range(c, r)?,
            Some(Op::RequestPut(p)) => put(c, p)?,
            Some(Op::RequestDeleteRange(d)) => delete_range(c, d)?,
            Some(Op::RequestTxn(t)) => txn(c, t)?,
            None => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::authpb::Permission;

    fn role(name: &str, perms: &[(PermType, &str, &str)]) -> (String, Role) {
        (
            name.to_string(),
            Role {
                name: name.as_bytes().to_vec(),
                key_permission: perms
                    .iter()
                    .map(|(t, k, e)| Permission {
                        perm_type: *t as i32,
                        key: k.as_bytes().to_vec(),
                        range_end: e.as_bytes().to_vec(),
                    })
                    .collect(),
            },
        )
    }

    fn user(roles: &[&str]) -> User {
        User {
            name: b"u".to_vec(),
            roles: roles.iter().map(|r| r.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn points_ranges_and_open_ends() {
        let roles: BTreeMap<_, _> = [
            role("one", &[(PermType::Read, "a", "")]),
            role("prefix", &[(PermType::Readwrite, "p/", "p0")]),
            role("from", &[(PermType::Write, "x", "\0")]),
        ]
        .into_iter()
        .collect();
        let p = Perms::of(&user(&["one", "prefix", "from", "gone"]), &roles);
        assert!(p.allows(Need::Read, b"a", b""));
        assert!(!p.allows(Need::Write, b"a", b""));
        assert!(
            !p.allows(Need::Read, b"a", b"b"),
            "a range past the one key"
        );
        assert!(!p.allows(Need::Read, b"a\0", b""));
        assert!(p.allows(Need::Read, b"p/x", b""));
        assert!(p.allows(Need::Write, b"p/", b"p0"));
        assert!(p.allows(Need::Read, b"p/a", b"p/b"));
        assert!(!p.allows(Need::Read, b"p/", b"p1"), "past the prefix");
        assert!(!p.allows(Need::Read, b"p/", b"\0"), "to the end");
        assert!(p.allows(Need::Write, b"x", b"\0"));
        assert!(p.allows(Need::Write, b"zzz", b""));
        assert!(!p.allows(Need::Write, b"w", b"\0"));
        assert!(!p.allows(Need::Read, b"x", b""));
        // An inverted range needs its first key.
        assert!(p.allows(Need::Read, b"p/b", b"p/a"));
        assert!(!p.allows(Need::Read, b"q", b"a"));
    }

    #[test]
    fn adjacent_and_overlapping_grants_merge() {
        let roles: BTreeMap<_, _> = [
            role("r1", &[(PermType::Read, "a", "c")]),
            role(
                "r2",
                &[(PermType::Read, "c", "e"), (PermType::Read, "b", "d")],
            ),
        ]
        .into_iter()
        .collect();
        let p = Perms::of(&user(&["r1", "r2"]), &roles);
        assert!(p.allows(Need::Read, b"a", b"e"));
        assert!(!p.allows(Need::Read, b"a", b"e\0"));
        assert!(p.allows(Need::Read, b"d", b""));
    }

    #[test]
    fn root_may_do_everything() {
        let p = Perms::of(&user(&["root"]), &BTreeMap::new());
        assert!(p.root);
        assert!(p.allows(Need::Write, b"\0", b"\0"));
    }

    #[test]
    fn permission_ranges() {
        assert!(valid_permission_range(b"a", b""));
        assert!(valid_permission_range(b"a", b"\0"));
        assert!(valid_permission_range(b"a", b"b"));
        assert!(!valid_permission_range(b"b", b"a"));
        assert!(!valid_permission_range(b"a", b"a"));
        assert!(!valid_permission_range(b"", b""));
    }

    /// Records what a request needs.
    #[derive(Default)]
    struct Log(Vec<String>);

    impl Checks for Log {
        type Error = ();
        fn need(&mut self, n: Need, k: &[u8], e: &[u8]) -> Result<(), ()> {
            let s = format!(
                "{n:?} {}..{}",
                String::from_utf8_lossy(k),
                String::from_utf8_lossy(e)
            );
            self.0.push(s);
            Ok(())
        }
        fn lease(&mut self, id: LeaseId) -> Result<(), ()> {
            self.0.push(format!("lease {id}"));
            Ok(())
        }
    }

    #[test]
    fn a_txn_needs_every_compare_and_op_at_every_depth() {
        use api::etcdserverpb::{Compare, RequestOp};
        let op = |r: Op| RequestOp { request: Some(r) };
        let inner = TxnRequest {
            compare: vec![Compare {
                key: b"c2".to_vec(),
                ..Default::default()
            }],
            success: vec![op(Op::RequestPut(PutRequest {
                key: b"deep".to_vec(),
                prev_kv: true,
                lease: 7,
                ..Default::default()
            }))],
            failure: vec![op(Op::RequestDeleteRange(DeleteRangeRequest {
                key: b"d".to_vec(),
                range_end: b"e".to_vec(),
                prev_kv: true,
            }))],
        };
        let t = TxnRequest {
            compare: vec![Compare {
                key: b"c1".to_vec(),
                ..Default::default()
            }],
            success: vec![op(Op::RequestRange(RangeRequest {
                key: b"r".to_vec(),
                ..Default::default()
            }))],
            failure: vec![op(Op::RequestTxn(inner))],
        };
        let mut log = Log::default();
        txn(&mut log, &t).unwrap();
        assert_eq!(
            log.0,
            [
                "Read c1..",
                "Read r..",
                "Read c2..",
                "Write deep..",
                "lease 7",
                "Read deep..",
                "Write d..e",
                "Read d..e"
            ]
        );
    }
}
