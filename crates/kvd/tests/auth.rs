//! Authentication and RBAC, against kvd and etcd v3.6.5 (3.7.1 too for etcdctl) side by side:
//! etcdctl's `user`, `role` and `auth` commands print the same; every permission corner (ops
//! nested in a txn, `prev_kv`, keys reached through a lease, watch, lock and election,
//! maintenance, cluster and auth-admin calls, compaction, alarms) is refused to a user who
//! lacks the permission, and the data is untouched — where etcd 3.6.5 lets such a call
//! through, the test shows that too; AuthStatus answers anyone, as etcd 3.7's; simple tokens
//! expire, JWTs (ES256) are checked for their key, expiry and auth revision; a client
//! certificate's CN is the user with `--client-cert-auth`; the JSON gateway takes the token in
//! `Authorization`; users, roles and tokens are replicated in a cluster and survive a restart.

mod common;

use std::path::Path;
use std::time::Duration;

use api::authpb::permission::Type as PermType;
use api::authpb::Permission;
use api::etcdserverpb::auth_client::AuthClient;
use api::etcdserverpb::cluster_client::ClusterClient;
use api::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use api::etcdserverpb::kv_client::KvClient;
use api::etcdserverpb::lease_client::LeaseClient;
use api::etcdserverpb::maintenance_client::MaintenanceClient;
use api::etcdserverpb::request_op::Request as ReqOp;
use api::etcdserverpb::watch_client::WatchClient;
use api::etcdserverpb::*;
use api::v3electionpb::election_client::ElectionClient;
use api::v3electionpb::CampaignRequest;
use api::v3lockpb::lock_client::LockClient;
use api::v3lockpb::LockRequest;
use common::pki::Ca;
use common::{ctl_input, normalize, Addrs, Proc};
use tonic::transport::Channel;
use tonic::{Code, Status};

/// etcdctl `args` (with `flags` first): its output, normalized.
fn ctl_lines(endpoint: &str, flags: &[&str], args: &[&str], input: &str) -> String {
    let mut all = flags.to_vec();
    all.extend_from_slice(args);
    let out = ctl_input(endpoint, &all, input);
    let text = format!(
        "$ etcdctl {}\n[exit {}]\n{}{}",
        args.join(" "),
        out.status.code().unwrap_or(-1),
        normalize(&String::from_utf8_lossy(&out.stdout), endpoint),
        normalize(&String::from_utf8_lossy(&out.stderr), endpoint)
    );
    // Durations ("took 2.05ms") differ run to run.
    text.split(". took ")
        .enumerate()
        .map(|(i, part)| match i {
            0 => part.to_string(),
            _ => format!(". took <t>{}", &part[part.find(". (").unwrap_or(0)..]),
        })
        .collect()
}

/// etcdctl's user, role and auth commands, as root and as a user, with auth off and on.
const SCRIPT: &[&str] = &[
    "user add root --new-user-password=rootpw",
    "role add root",
    "user grant-role root root",
    "user add alice --new-user-password=alicepw",
    "user add nopass --no-password",
    "role add r1",
    "role grant-permission r1 readwrite /a/ --prefix",
    "role grant-permission r1 read /b",
    "role grant-permission r1 write /w/ --prefix",
    "role grant-permission r1 read /z --from-key",
    "role grant-permission r1 readwrite /a/ --prefix",
    "role grant-permission r1 read c e",
    "role grant-permission r1 read e c",
    "user grant-role alice r1",
    "user grant-role alice r1",
    "role get r1",
    "user get alice",
    "user get alice --detail",
    "user list",
    "role list",
    "auth status",
    "put x y",
    "auth enable",
    "auth enable",
    "put x y",
    "get x",
    "--user root:rootpw auth status",
    "--user alice:alicepw auth status",
    "--user alice:alicepw put /a/1 v",
    "--user alice:alicepw get /a/1",
    "--user alice:alicepw put /b v",
    "--user alice:alicepw get /b",
    "--user alice:alicepw get /a/ --prefix",
    "--user alice:alicepw get /zz",
    "--user alice:alicepw get /a/ --from-key",
    "--user alice:alicepw put /w/1 w",
    "--user alice:alicepw get /w/1",
    "--user alice:alicepw del /a/1 --prev-kv",
    "--user alice:alicepw del /w/1 --prev-kv",
    "--user alice:wrong get /a/1",
    "--user bob:x get /a/1",
    "--user nopass:x get /a/1",
    "--user alice:alicepw user get alice",
    "--user alice:alicepw user get root",
    "--user alice:alicepw role get r1",
    "--user alice:alicepw role get root",
    "--user alice:alicepw user list",
    "--user alice:alicepw role list",
    "--user alice:alicepw user add eve --new-user-password=e",
    "--user alice:alicepw user grant-role alice root",
    "--user alice:alicepw user passwd alice --new-user-password=x",
    "--user alice:alicepw endpoint status",
    "--user alice:alicepw endpoint hashkv",
    "--user alice:alicepw defrag",
    "--user alice:alicepw alarm list",
    "--user alice:alicepw member list",
    "--user alice:alicepw member add m2 --peer-urls=http://127.0.0.1:1",
    "--user alice:alicepw lease grant 60",
    "--user alice:alicepw auth disable",
    "--user root:rootpw role revoke-permission r1 /b",
    "--user root:rootpw role revoke-permission r1 /nothing",
    "--user root:rootpw role revoke-permission nothing /b",
    "--user root:rootpw user revoke-role root root",
    "--user root:rootpw user revoke-role alice nothing",
    "--user root:rootpw user delete root",
    "--user root:rootpw role delete root",
    "--user root:rootpw user add alice --new-user-password=x",
    "--user root:rootpw user add \"\" --new-user-password=x",
    "--user root:rootpw role add r1",
    "--user root:rootpw user grant-role alice nope",
    "--user root:rootpw user grant-role nobody r1",
    "--user root:rootpw role get root",
    "--user root:rootpw role get nope",
    "--user root:rootpw user get root",
    "--user root:rootpw user get nobody",
    "--user root:rootpw user passwd alice --new-user-password=alice2",
    "--user alice:alicepw get /a/1",
    "--user alice:alice2 get /a/1",
    "--user root:rootpw role delete r1",
    "--user root:rootpw user get alice",
    "--user alice:alice2 get /a/1",
    "--user root:rootpw user delete alice",
    "--user root:rootpw auth disable",
    "auth status",
    "get /a/1",
    "user list",
];

fn run_script(m: &Addrs) -> Vec<String> {
    SCRIPT
        .iter()
        .map(|line| {
            let args: Vec<&str> = line
                .split_whitespace()
                .map(|a| if a == "\"\"" { "" } else { a })
                .collect();
            ctl_lines(&m.endpoint(), &[], &args, "").replace(&m.peer, "<peer>")
        })
        .collect()
}

/// The script against etcd 3.7.1 and 3.6.5: kvd prints what each prints, but the lines 3.7
/// changed (a user who is not root may ask `auth status` and `endpoint status`) as 3.7.1, and
/// `endpoint status` (whose versions say 3.6 on kvd) as neither.
#[test]
fn etcdctl_user_role_and_auth_commands_print_against_kvd_what_they_print_against_etcd() {
    const CHANGED_IN_37: [&str; 2] = [
        "--user alice:alicepw auth status",
        "--user alice:alicepw endpoint status",
    ];
    let dir = tempfile::tempdir().unwrap();
    let (k, _kvd) = Proc::single_kvd(dir.path());
    let (e, _etcd) = Proc::single_etcd(dir.path());
    let m = Addrs::new("default");
    let etcd37 = common::etcd_tools("v3.7.1").join("etcd");
    let dir37 = dir.path().join("etcd37");
    let mut e37 = Proc::start(&etcd37, &m, &dir37, std::slice::from_ref(&m), "new", &[]);
    e37.wait_ready();
    let without = |answers: Vec<String>, lines: &[&str]| -> Vec<String> {
        SCRIPT
            .iter()
            .zip(answers)
            .filter(|(l, _)| !lines.contains(l))
            .map(|(_, a)| a)
            .collect()
    };
    let got = run_script(&k);
    let status = &CHANGED_IN_37[1..];
    common::assert_same_answers(
        &without(run_script(&m), status),
        &without(got.clone(), status),
    );
    common::assert_same_answers(
        &without(run_script(&e), &CHANGED_IN_37),
        &without(got, &CHANGED_IN_37),
    );
}

// ---------------------------------------------------------------------------------------
// Every corner, through kvd's generated gRPC clients.

/// gRPC clients of one server, calling with a token (or none).
#[derive(Clone)]
struct Client {
    ch: Channel,
    token: Option<String>,
}

impl Client {
    fn new(url: &str) -> Client {
        Client {
            ch: common::grpc::channel(url),
            token: None,
        }
    }

    fn req<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Some(t) = &self.token {
            r.metadata_mut().insert("token", t.parse().unwrap());
        }
        r
    }

    async fn login(&self, user: &str, password: &str) -> Result<Client, Status> {
        let resp = AuthClient::new(self.ch.clone())
            .authenticate(AuthenticateRequest {
                name: user.into(),
                password: password.into(),
            })
            .await?;
        Ok(Client {
            ch: self.ch.clone(),
            token: Some(resp.into_inner().token),
        })
    }

    fn kv(&self) -> KvClient<Channel> {
        KvClient::new(self.ch.clone())
    }

    fn auth(&self) -> AuthClient<Channel> {
        AuthClient::new(self.ch.clone())
    }

    async fn put(&self, key: &str, value: &str, lease: i64) -> Result<PutResponse, Status> {
        let r = PutRequest {
            key: key.into(),
            value: value.into(),
            lease,
            ..Default::default()
        };
        self.kv().put(self.req(r)).await.map(|r| r.into_inner())
    }

    async fn get(&self, key: &str) -> Result<Option<String>, Status> {
        let r = RangeRequest {
            key: key.into(),
            ..Default::default()
        };
        let resp = self.kv().range(self.req(r)).await?.into_inner();
        Ok(resp
            .kvs
            .first()
            .map(|kv| String::from_utf8_lossy(&kv.value).into_owned()))
    }

    async fn txn(&self, t: TxnRequest) -> Result<TxnResponse, Status> {
        self.kv().txn(self.req(t)).await.map(|r| r.into_inner())
    }
}

fn perm(t: PermType, key: &str, end: &str) -> Option<Permission> {
    Some(Permission {
        perm_type: t as i32,
        key: key.into(),
        range_end: end.into(),
    })
}

fn op(r: ReqOp) -> RequestOp {
    RequestOp { request: Some(r) }
}

fn range_op(key: &str) -> ReqOp {
    ReqOp::RequestRange(RangeRequest {
        key: key.into(),
        ..Default::default()
    })
}

fn put_op(key: &str, value: &str, prev_kv: bool, lease: i64) -> ReqOp {
    ReqOp::RequestPut(PutRequest {
        key: key.into(),
        value: value.into(),
        prev_kv,
        lease,
        ..Default::default()
    })
}

fn txn_of(success: Vec<RequestOp>) -> TxnRequest {
    TxnRequest {
        success,
        ..Default::default()
    }
}

/// The secret lease: granted by root, attached to `/secret/leased`.
const SECRET_LEASE: i64 = 0x5ec;

/// Users root, alice (everything under `/a/`) and mallory (read-write `/m/`, write-only
/// `/w/`), root's secrets under `/secret/`, a value under `/w/` mallory may write and not
/// read, then auth on. Returns root's and mallory's clients.
async fn setup(url: &str) -> (Client, Client) {
    let c = Client::new(url);
    let a = c.auth();
    for (u, pw) in [("root", "rootpw"), ("alice", "alicepw"), ("mallory", "m")] {
        a.clone()
            .user_add(AuthUserAddRequest {
                name: u.into(),
                password: pw.into(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    for r in ["root", "a", "m"] {
        a.clone()
            .role_add(AuthRoleAddRequest { name: r.into() })
            .await
            .unwrap();
    }
    for (role, p) in [
        ("a", perm(PermType::Readwrite, "/a/", "/a0")),
        ("m", perm(PermType::Readwrite, "/m/", "/m0")),
        ("m", perm(PermType::Write, "/w/", "/w0")),
    ] {
        a.clone()
            .role_grant_permission(AuthRoleGrantPermissionRequest {
                name: role.into(),
                perm: p,
            })
            .await
            .unwrap();
    }
    for (u, r) in [("root", "root"), ("alice", "a"), ("mallory", "m")] {
        a.clone()
            .user_grant_role(AuthUserGrantRoleRequest {
                user: u.into(),
                role: r.into(),
            })
            .await
            .unwrap();
    }
    c.put("/secret/x", "s", 0).await.unwrap();
    c.put("/w/k", "hidden", 0).await.unwrap();
    LeaseClient::new(c.ch.clone())
        .lease_grant(LeaseGrantRequest {
            ttl: 600,
            id: SECRET_LEASE,
        })
        .await
        .unwrap();
    c.put("/secret/leased", "l", SECRET_LEASE).await.unwrap();
    a.clone().auth_enable(AuthEnableRequest {}).await.unwrap();
    let root = c.login("root", "rootpw").await.unwrap();
    let mallory = c.login("mallory", "m").await.unwrap();
    (root, mallory)
}

/// A way a caller may try to reach what it may not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Corner {
    Range,
    Put,
    PutWithPrevKvOfWriteOnly,
    Delete,
    DeleteWithPrevKvOfWriteOnly,
    TxnCompare,
    TxnRead,
    TxnWriteInFailureBranch,
    NestedTxnRead,
    NestedTxnWrite,
    TxnPutWithPrevKvOfWriteOnly,
    PutWithSecretLease,
    TxnPutWithSecretLease,
    LeaseRevoke,
    LeaseTimeToLiveKeys,
    Watch,
    Lock,
    Campaign,
    Snapshot,
    Defragment,
    Hash,
    HashKv,
    Status,
    MoveLeader,
    MemberAdd,
    UserAdd,
    GrantRootRole,
    ChangeRootPassword,
    GrantPermission,
    UserGetRoot,
    RoleGetRoot,
    UserList,
    AuthStatus,
    AuthDisable,
    Compaction,
    AlarmActivate,
}

const CORNERS: &[Corner] = &[
    Corner::Range,
    Corner::Put,
    Corner::PutWithPrevKvOfWriteOnly,
    Corner::Delete,
    Corner::DeleteWithPrevKvOfWriteOnly,
    Corner::TxnCompare,
    Corner::TxnRead,
    Corner::TxnWriteInFailureBranch,
    Corner::NestedTxnRead,
    Corner::NestedTxnWrite,
    Corner::TxnPutWithPrevKvOfWriteOnly,
    Corner::PutWithSecretLease,
    Corner::TxnPutWithSecretLease,
    Corner::LeaseRevoke,
    Corner::LeaseTimeToLiveKeys,
    Corner::Watch,
    Corner::Lock,
    Corner::Campaign,
    Corner::Snapshot,
    Corner::Defragment,
    Corner::Hash,
    Corner::HashKv,
    Corner::Status,
    Corner::MoveLeader,
    Corner::MemberAdd,
    Corner::UserAdd,
    Corner::GrantRootRole,
    Corner::ChangeRootPassword,
    Corner::GrantPermission,
    Corner::UserGetRoot,
    Corner::RoleGetRoot,
    Corner::UserList,
    Corner::AuthStatus,
    Corner::AuthDisable,
    // Last: etcd lets these through, and they change the whole store.
    Corner::Compaction,
    Corner::AlarmActivate,
];

/// The corners etcd 3.6.5 leaves open: what it does for a caller without the permission.
fn open_in_etcd(c: Corner) -> bool {
    matches!(
        c,
        Corner::NestedTxnRead
            | Corner::NestedTxnWrite
            | Corner::TxnPutWithPrevKvOfWriteOnly
            | Corner::TxnPutWithSecretLease
            | Corner::Compaction
            | Corner::AlarmActivate
    )
}

/// `c` tried by `m`; Ok with what leaked (if anything) when the server let it through.
async fn attempt(m: &Client, c: Corner) -> Result<String, Status> {
    let ch = m.ch.clone();
    let secret_txn = |t: TxnRequest| async move {
        let r = m.txn(t).await?;
        Ok(format!("{r:?}"))
    };
    match c {
        Corner::Range => m.get("/secret/x").await.map(|v| format!("{v:?}")),
        Corner::Put => m.put("/secret/x", "pwned", 0).await.map(|_| String::new()),
        Corner::PutWithPrevKvOfWriteOnly => {
            let r = PutRequest {
                key: "/w/k".into(),
                value: "x".into(),
                prev_kv: true,
                ..Default::default()
            };
            m.kv()
                .put(m.req(r))
                .await
                .map(|r| format!("{:?}", r.into_inner().prev_kv))
        }
        Corner::Delete => {
            let r = DeleteRangeRequest {
                key: "/secret/".into(),
                range_end: "/secret0".into(),
                ..Default::default()
            };
            m.kv().delete_range(m.req(r)).await.map(|_| String::new())
        }
        Corner::DeleteWithPrevKvOfWriteOnly => {
            let r = DeleteRangeRequest {
                key: "/w/k".into(),
                prev_kv: true,
                ..Default::default()
            };
            m.kv()
                .delete_range(m.req(r))
                .await
                .map(|r| format!("{:?}", r.into_inner().prev_kvs))
        }
        Corner::TxnCompare => {
            secret_txn(TxnRequest {
                compare: vec![Compare {
                    key: "/secret/x".into(),
                    target: CompareTarget::Value as i32,
                    result: CompareResult::Equal as i32,
                    target_union: Some(TargetUnion::Value("s".into())),
                    ..Default::default()
                }],
                success: vec![op(put_op("/m/guess", "right", false, 0))],
                failure: vec![],
            })
            .await
        }
        Corner::TxnRead => secret_txn(txn_of(vec![op(range_op("/secret/x"))])).await,
        Corner::TxnWriteInFailureBranch => {
            secret_txn(TxnRequest {
                compare: vec![],
                success: vec![op(put_op("/m/ok", "1", false, 0))],
                failure: vec![op(put_op("/secret/x", "pwned", false, 0))],
            })
            .await
        }
        Corner::NestedTxnRead => {
            let inner = txn_of(vec![op(range_op("/secret/x"))]);
            secret_txn(txn_of(vec![op(ReqOp::RequestTxn(inner))])).await
        }
        Corner::NestedTxnWrite => {
            let inner = txn_of(vec![op(put_op("/secret/x", "pwned", false, 0))]);
            secret_txn(txn_of(vec![op(ReqOp::RequestTxn(inner))])).await
        }
        Corner::TxnPutWithPrevKvOfWriteOnly => {
            secret_txn(txn_of(vec![op(put_op("/w/k", "x", true, 0))])).await
        }
        Corner::PutWithSecretLease => m
            .put("/m/k", "v", SECRET_LEASE)
            .await
            .map(|_| String::new()),
        Corner::TxnPutWithSecretLease => {
            secret_txn(txn_of(vec![op(put_op("/m/k2", "v", false, SECRET_LEASE))])).await
        }
        Corner::LeaseRevoke => LeaseClient::new(ch)
            .lease_revoke(m.req(LeaseRevokeRequest { id: SECRET_LEASE }))
            .await
            .map(|_| String::new()),
        Corner::LeaseTimeToLiveKeys => LeaseClient::new(ch)
            .lease_time_to_live(m.req(LeaseTimeToLiveRequest {
                id: SECRET_LEASE,
                keys: true,
            }))
            .await
            .map(|r| format!("{:?}", r.into_inner().keys)),
        Corner::Watch => {
            let req = WatchRequest {
                request_union: Some(watch_request::RequestUnion::CreateRequest(
                    WatchCreateRequest {
                        key: "/secret/".into(),
                        range_end: "/secret0".into(),
                        start_revision: 1,
                        ..Default::default()
                    },
                )),
            };
            let mut resp = WatchClient::new(ch)
                .watch(m.req(tokio_stream::iter(vec![req])))
                .await?
                .into_inner();
            let first = resp.message().await?.unwrap_or_default();
            if first.canceled {
                return Err(Status::permission_denied(first.cancel_reason));
            }
            let events = resp.message().await?.unwrap_or_default();
            Ok(format!("{:?}", events.events))
        }
        Corner::Lock => {
            let mut client = LockClient::new(ch);
            let call = client.lock(m.req(LockRequest {
                name: "/secret/lock".into(),
                lease: 0,
            }));
            match tokio::time::timeout(Duration::from_secs(3), call).await {
                Ok(r) => r.map(|r| format!("{:?}", r.into_inner().key)),
                Err(_) => Ok("waiting on the lock".into()),
            }
        }
        Corner::Campaign => {
            let mut client = ElectionClient::new(ch);
            let call = client.campaign(m.req(CampaignRequest {
                name: "/secret/election".into(),
                lease: 0,
                value: "me".into(),
            }));
            match tokio::time::timeout(Duration::from_secs(3), call).await {
                Ok(r) => r.map(|_| String::new()),
                Err(_) => Ok("campaigning".into()),
            }
        }
        Corner::Snapshot => {
            let mut s = MaintenanceClient::new(ch)
                .snapshot(m.req(SnapshotRequest {}))
                .await?
                .into_inner();
            s.message()
                .await
                .map(|b| format!("{} bytes", b.map_or(0, |b| b.blob.len())))
        }
        Corner::Defragment => MaintenanceClient::new(ch)
            .defragment(m.req(DefragmentRequest {}))
            .await
            .map(|_| String::new()),
        Corner::Hash => MaintenanceClient::new(ch)
            .hash(m.req(HashRequest {}))
            .await
            .map(|_| String::new()),
        Corner::HashKv => MaintenanceClient::new(ch)
            .hash_kv(m.req(HashKvRequest { revision: 0 }))
            .await
            .map(|_| String::new()),
        Corner::Status => MaintenanceClient::new(ch)
            .status(m.req(StatusRequest {}))
            .await
            .map(|_| String::new()),
        Corner::MoveLeader => MaintenanceClient::new(ch)
            .move_leader(m.req(MoveLeaderRequest { target_id: 1 }))
            .await
            .map(|_| String::new()),
        Corner::MemberAdd => ClusterClient::new(ch)
            .member_add(m.req(MemberAddRequest {
                peer_ur_ls: vec!["http://127.0.0.1:1".into()],
                is_learner: true,
            }))
            .await
            .map(|_| String::new()),
        Corner::UserAdd => m
            .auth()
            .user_add(m.req(AuthUserAddRequest {
                name: "eve".into(),
                password: "e".into(),
                ..Default::default()
            }))
            .await
            .map(|_| String::new()),
        Corner::GrantRootRole => m
            .auth()
            .user_grant_role(m.req(AuthUserGrantRoleRequest {
                user: "mallory".into(),
                role: "root".into(),
            }))
            .await
            .map(|_| String::new()),
        Corner::ChangeRootPassword => m
            .auth()
            .user_change_password(m.req(AuthUserChangePasswordRequest {
                name: "root".into(),
                password: "mine".into(),
                ..Default::default()
            }))
            .await
            .map(|_| String::new()),
        Corner::GrantPermission => m
            .auth()
            .role_grant_permission(m.req(AuthRoleGrantPermissionRequest {
                name: "m".into(),
                perm: perm(PermType::Readwrite, "/secret/", "/secret0"),
            }))
            .await
            .map(|_| String::new()),
        Corner::UserGetRoot => m
            .auth()
            .user_get(m.req(AuthUserGetRequest {
                name: "root".into(),
            }))
            .await
            .map(|r| format!("{:?}", r.into_inner().roles)),
        Corner::RoleGetRoot => m
            .auth()
            .role_get(m.req(AuthRoleGetRequest {
                role: "root".into(),
            }))
            .await
            .map(|_| String::new()),
        Corner::UserList => m
            .auth()
            .user_list(m.req(AuthUserListRequest {}))
            .await
            .map(|r| format!("{:?}", r.into_inner().users)),
        Corner::AuthStatus => m
            .auth()
            .auth_status(m.req(AuthStatusRequest {}))
            .await
            .map(|_| String::new()),
        Corner::AuthDisable => m
            .auth()
            .auth_disable(m.req(AuthDisableRequest {}))
            .await
            .map(|_| String::new()),
        Corner::Compaction => m
            .kv()
            .compact(m.req(CompactionRequest {
                revision: 3,
                physical: false,
            }))
            .await
            .map(|_| String::new()),
        Corner::AlarmActivate => MaintenanceClient::new(ch)
            .alarm(m.req(AlarmRequest {
                action: alarm_request::AlarmAction::Activate as i32,
                member_id: 1,
                alarm: AlarmType::Nospace as i32,
            }))
            .await
            .map(|_| String::new()),
    }
}

/// What root sees of the data mallory tried to reach.
async fn untouched(root: &Client) -> Vec<String> {
    let mut seen = vec![
        format!("{:?}", root.get("/secret/x").await),
        format!("{:?}", root.get("/w/k").await),
        format!("{:?}", root.get("/secret/leased").await),
    ];
    let ttl = LeaseClient::new(root.ch.clone())
        .lease_time_to_live(root.req(LeaseTimeToLiveRequest {
            id: SECRET_LEASE,
            keys: true,
        }))
        .await
        .map(|r| r.into_inner().keys.len());
    seen.push(format!("{ttl:?}"));
    let alarms = MaintenanceClient::new(root.ch.clone())
        .alarm(root.req(AlarmRequest::default()))
        .await
        .map(|r| r.into_inner().alarms.len());
    seen.push(format!("{alarms:?}"));
    let old = RangeRequest {
        key: "/secret/x".into(),
        revision: 2,
        ..Default::default()
    };
    let history = root
        .kv()
        .range(root.req(old))
        .await
        .map(|r| r.into_inner().count);
    seen.push(format!("{history:?}"));
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_the_permission_reaches_nothing_through_any_corner() {
    let dir = tempfile::tempdir().unwrap();
    let (k, _kvd) = Proc::single_kvd(dir.path());
    let (e, _etcd) = Proc::single_etcd(dir.path());
    let (k_root, k_mallory) = setup(&k.client).await;
    let (e_root, e_mallory) = setup(&e.client).await;
    let before = untouched(&k_root).await;
    assert_eq!(
        before,
        [
            "Ok(Some(\"s\"))",
            "Ok(Some(\"hidden\"))",
            "Ok(Some(\"l\"))",
            "Ok(1)",
            "Ok(0)",
            "Ok(1)"
        ]
    );
    let mut report = Vec::new();
    for &c in CORNERS {
        let kvd = attempt(&k_mallory, c).await;
        let etcd = attempt(&e_mallory, c).await;
        let denied = |r: &Result<String, Status>| match r {
            Err(s) => {
                s.code() == Code::PermissionDenied || s.message().contains("permission denied")
            }
            Ok(_) => false,
        };
        // etcd 3.7 answers AuthStatus to any caller (whether auth is on, and its revision),
        // and Status to any user.
        let kvd_open = matches!(c, Corner::AuthStatus | Corner::Status);
        if denied(&kvd) == kvd_open {
            let did = if kvd_open { "refused" } else { "let through" };
            report.push(format!("kvd {did} {c:?}: {kvd:?}"));
        }
        if open_in_etcd(c) == denied(&etcd) {
            report.push(format!(
                "etcd 3.6.5 {} {c:?}, unlike what the test expects: {etcd:?}",
                if denied(&etcd) {
                    "refused"
                } else {
                    "let through"
                }
            ));
        }
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
    // Nothing mallory tried changed anything on kvd; on etcd, the open corners did.
    assert_eq!(untouched(&k_root).await, before);
    let etcd_after = untouched(&e_root).await;
    assert_ne!(etcd_after, before, "etcd's open corners changed nothing?");
    assert_eq!(
        e_root.get("/secret/x").await.unwrap().as_deref(),
        Some("pwned"),
        "a txn nested in a txn wrote root's key on etcd 3.6.5"
    );

    // Without credentials: etcd's "user name is empty"; with a forged token, "invalid auth
    // token" — on both.
    for url in [&k.client, &e.client] {
        let anon = Client::new(url);
        let s = anon.get("/a/x").await.unwrap_err();
        assert_eq!(
            (s.code(), s.message()),
            (Code::InvalidArgument, "etcdserver: user name is empty")
        );
        let s = anon
            .auth()
            .user_list(AuthUserListRequest {})
            .await
            .unwrap_err();
        assert_eq!(s.message(), "etcdserver: user name is empty");
        let forged = Client {
            token: Some("AbCdEfGhIjKlMnOp.1".into()),
            ..anon.clone()
        };
        let s = forged.get("/a/x").await.unwrap_err();
        assert_eq!(
            (s.code(), s.message()),
            (Code::Unauthenticated, "etcdserver: invalid auth token")
        );
    }
    // kvd goes on for whoever has the right (etcd refuses every write now: mallory raised
    // the NOSPACE alarm there).
    k_root.put("/a/after", "ok", 0).await.unwrap();
    let s = e_root.put("/a/after", "ok", 0).await.unwrap_err();
    assert_eq!(s.message(), "etcdserver: mvcc: database space exceeded");
    // A forged simple token naming an index the cluster has not reached: etcd waits for that
    // index until the client gives up; kvd asks the leader once and refuses it.
    let forged = Client {
        token: Some("AbCdEfGhIjKlMnOp.99999".into()),
        ..Client::new(&k.client)
    };
    let t = std::time::Instant::now();
    let s = forged.get("/a/x").await.unwrap_err();
    assert_eq!(s.message(), "etcdserver: invalid auth token");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

// ---------------------------------------------------------------------------------------
// Tokens.

/// Root and alice (everything under `/a/`) on a server, auth on, through etcdctl.
fn users_and_enable(endpoint: &str) {
    for cmd in [
        "user add root --new-user-password=rootpw",
        "role add root",
        "user grant-role root root",
        "user add alice --new-user-password=alicepw",
        "role add a",
        "role grant-permission a readwrite /a/ --prefix",
        "user grant-role alice a",
        "auth enable",
    ] {
        let args: Vec<&str> = cmd.split_whitespace().collect();
        common::ctl_ok(endpoint, &args);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simple_token_expires_once_unused_for_its_ttl_as_etcds() {
    let dir = tempfile::tempdir().unwrap();
    let ttl = ["--auth-token-ttl", "2"];
    let (k, _kvd) = Proc::single_kvd_with(dir.path(), &ttl);
    let e = Addrs::new("default");
    let mut etcd = Proc::etcd(&e, &dir.path().join("etcd"), std::slice::from_ref(&e), &ttl);
    etcd.wait_ready();
    for m in [&k, &e] {
        users_and_enable(&m.endpoint());
        let alice = Client::new(&m.client)
            .login("alice", "alicepw")
            .await
            .unwrap();
        let token = alice.token.clone().unwrap();
        let (prefix, index) = token.split_once('.').unwrap();
        assert!(
            prefix.len() == 16 && prefix.chars().all(|c| c.is_ascii_alphabetic()),
            "{token}"
        );
        assert!(index.parse::<u64>().is_ok(), "{token}");
        // Used, it stays alive past its TTL.
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(1000)).await;
            alice.put("/a/1", "v", 0).await.unwrap();
        }
        // Unused for longer than the TTL, it is gone.
        tokio::time::sleep(Duration::from_millis(3500)).await;
        let s = alice.get("/a/1").await.unwrap_err();
        assert_eq!(
            s.message(),
            "etcdserver: invalid auth token",
            "{}",
            m.client
        );
    }
}

/// An ES256 key pair in PEM files.
fn es256_keys(dir: &Path, name: &str) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let (private, public) = (
        dir.join(format!("{name}.key")),
        dir.join(format!("{name}.pub")),
    );
    std::fs::write(&private, key.serialize_pem()).unwrap();
    std::fs::write(&public, key.public_key_pem()).unwrap();
    (private.display().to_string(), public.display().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwts_are_checked_for_their_key_expiry_and_auth_revision_as_etcds() {
    let dir = tempfile::tempdir().unwrap();
    let (private, public) = es256_keys(dir.path(), "jwt");
    let (other_private, _) = es256_keys(dir.path(), "other");
    let opt = |p: &str, ttl: &str| {
        format!("jwt,pub-key={public},priv-key={p},sign-method=ES256,ttl={ttl}")
    };
    let flags = ["--auth-token".to_string(), opt(&private, "3s")];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let (k, _kvd) = Proc::single_kvd_with(dir.path(), &flags);
    let e = Addrs::new("default");
    let mut etcd = Proc::etcd(
        &e,
        &dir.path().join("etcd"),
        std::slice::from_ref(&e),
        &flags,
    );
    etcd.wait_ready();
    // A token signed with another key, by a kvd that shares nothing else.
    let forger_dir = tempfile::tempdir().unwrap();
    let forger_flags = [
        "--auth-token".to_string(),
        format!("jwt,priv-key={other_private},sign-method=ES256"),
    ];
    let forger_flags: Vec<&str> = forger_flags.iter().map(String::as_str).collect();
    let (f, _forger) = Proc::single_kvd_with(forger_dir.path(), &forger_flags);
    users_and_enable(&f.endpoint());
    let forged = Client::new(&f.client)
        .login("alice", "alicepw")
        .await
        .unwrap()
        .token
        .unwrap();

    for m in [&k, &e] {
        users_and_enable(&m.endpoint());
        let c = Client::new(&m.client);
        let alice = c.login("alice", "alicepw").await.unwrap();
        let token = alice.token.clone().unwrap();
        assert_eq!(token.split('.').count(), 3, "not a JWT: {token}");
        alice.put("/a/1", "v", 0).await.unwrap();
        // etcdctl too, with the user's password.
        let out = common::ctl_ok(
            &m.endpoint(),
            &[
                "--user",
                "alice:alicepw",
                "get",
                "/a/1",
                "--print-value-only",
            ],
        );
        assert_eq!(out.trim(), "v");
        // Signed with another key: invalid.
        let s = Client {
            token: Some(forged.clone()),
            ..c.clone()
        }
        .get("/a/1")
        .await
        .unwrap_err();
        assert_eq!(
            s.message(),
            "etcdserver: invalid auth token",
            "{}",
            m.client
        );
        // Issued before the auth store changed: old.
        let root = c.login("root", "rootpw").await.unwrap();
        root.auth()
            .role_add(root.req(AuthRoleAddRequest { name: "new".into() }))
            .await
            .unwrap();
        let s = alice.get("/a/1").await.unwrap_err();
        assert_eq!(
            s.message(),
            "etcdserver: revision of auth store is old",
            "{}",
            m.client
        );
        // Expired.
        let fresh = c.login("alice", "alicepw").await.unwrap();
        fresh.get("/a/1").await.unwrap();
        tokio::time::sleep(Duration::from_millis(4200)).await;
        let s = fresh.get("/a/1").await.unwrap_err();
        assert_eq!(
            s.message(),
            "etcdserver: invalid auth token",
            "{}",
            m.client
        );
    }
}

// ---------------------------------------------------------------------------------------
// A client certificate's CN as the user; the JSON gateway's token.

#[test]
fn a_client_certificates_cn_is_the_user_with_client_cert_auth_as_with_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let mut ca = Ca::new(&dir.path().join("pki"), "cluster");
    let server = ca.issue("server", "server");
    let root_cert = ca.issue("root", "root");
    let alice_cert = ca.issue("alice", "alice");
    let nobody_cert = ca.issue("nobody", "nobody");
    let flags = [
        format!("--cert-file={}", server.cert.display()),
        format!("--key-file={}", server.key.display()),
        format!("--trusted-ca-file={}", ca.cert.display()),
        "--client-cert-auth".to_string(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let transcript = |bin: &str| {
        let m = Addrs::new_tls("default");
        let m = Addrs {
            peer: m.peer.replacen("https", "http", 1),
            peer_listen: m.peer_listen.replacen("https", "http", 1),
            ..m
        };
        let d = dir.path().join(bin);
        let mut p = match bin {
            "kvd" => Proc::kvd(&m, &d, std::slice::from_ref(&m), "new", &flags),
            _ => Proc::etcd(&m, &d, std::slice::from_ref(&m), &flags),
        };
        p.ctl_flags = root_cert.ctl_flags(&ca.cert);
        p.wait_ready();
        let ep = m.endpoint();
        let as_root = root_cert.ctl_flags(&ca.cert);
        let r: Vec<&str> = as_root.iter().map(String::as_str).collect();
        for cmd in [
            "user add root --new-user-password=rootpw",
            "role add root",
            "user grant-role root root",
            "user add alice --new-user-password=alicepw",
            "role add a",
            "role grant-permission a readwrite /a/ --prefix",
            "user grant-role alice a",
            "auth enable",
        ] {
            let args: Vec<&str> = cmd.split_whitespace().collect();
            let out = ctl_lines(&ep, &r, &args, "");
            assert!(out.contains("[exit 0]"), "{out}");
        }
        let mut out = Vec::new();
        for (who, cert) in [
            ("root", &root_cert),
            ("alice", &alice_cert),
            ("nobody", &nobody_cert),
        ] {
            let f = cert.ctl_flags(&ca.cert);
            let f: Vec<&str> = f.iter().map(String::as_str).collect();
            for cmd in ["put /a/1 v", "get /a/1", "put /b v", "user list"] {
                let args: Vec<&str> = cmd.split_whitespace().collect();
                out.push(format!("as {who}: {}", ctl_lines(&ep, &f, &args, "")));
            }
            // A token wins over the certificate.
            let args = ["--user", "alice:alicepw", "user", "list"];
            out.push(format!(
                "as {who} with alice's password: {}",
                ctl_lines(&ep, &f, &args, "")
            ));
        }
        out
    };
    let want = transcript("etcd");
    let got = transcript("kvd");
    common::assert_same_answers(&want, &got);
    assert!(got[0].contains("OK"), "{}", got[0]);
    assert!(got
        .iter()
        .any(|l| l.starts_with("as alice") && l.contains("permission denied")));
}

/// A POST to the JSON gateway: (status, body).
fn gateway(url: &str, path: &str, body: &str, token: Option<&str>) -> (u16, String) {
    let headers: Vec<String> = token
        .map(|t| format!("Authorization: {t}"))
        .into_iter()
        .collect();
    common::http_request(url, "POST", path, &headers, body)
}

#[test]
fn the_json_gateway_takes_the_token_in_the_authorization_header_as_etcds() {
    let dir = tempfile::tempdir().unwrap();
    let (k, _kvd) = Proc::single_kvd(dir.path());
    let (e, _etcd) = Proc::single_etcd(dir.path());
    let run = |m: &Addrs| {
        users_and_enable(&m.endpoint());
        let mut out = Vec::new();
        let (code, body) = gateway(
            &m.client,
            "/v3/auth/authenticate",
            r#"{"name":"alice","password":"alicepw"}"#,
            None,
        );
        out.push(format!("{code}"));
        let token = serde_json::from_str::<serde_json::Value>(&body).unwrap()["token"]
            .as_str()
            .unwrap()
            .to_string();
        let put = r#"{"key":"L2EvMQ==","value":"dg=="}"#;
        let secret = r#"{"key":"L2IvMQ==","value":"dg=="}"#;
        for (path, body, tok) in [
            ("/v3/kv/put", put, Some(token.as_str())),
            ("/v3/kv/put", secret, Some(token.as_str())),
            ("/v3/kv/put", put, None),
            ("/v3/kv/put", put, Some("bogus.1")),
            ("/v3/auth/user/list", "{}", Some(token.as_str())),
        ] {
            let (code, body) = gateway(&m.client, path, body, tok);
            // Headers' revisions and ids differ; the codes and errors must not.
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            out.push(format!("{path} {code} {} {}", v["code"], v["message"]));
        }
        out
    };
    let want = run(&e);
    let got = run(&k);
    common::assert_same_answers(&want, &got);
}

// ---------------------------------------------------------------------------------------
// Replication and restart.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_roles_and_tokens_are_replicated_and_users_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ms: Vec<Addrs> = ["m1", "m2", "m3"].iter().map(|n| Addrs::new(n)).collect();
    let mut procs: Vec<Proc> = ms
        .iter()
        .map(|m| Proc::kvd(m, &dir.path().join(&m.name), &ms, "new", &[]))
        .collect();
    for p in &mut procs {
        p.wait_ready();
    }
    users_and_enable(&ms[0].endpoint());
    // A token from one member is good on another (each member applied its assignment).
    let alice = Client::new(&ms[1].client)
        .login("alice", "alicepw")
        .await
        .unwrap();
    let on_m3 = Client {
        ch: common::grpc::channel(&ms[2].client),
        token: alice.token.clone(),
    };
    on_m3.put("/a/1", "v", 0).await.unwrap();
    // A follower forwards a keep-alive to its leader for an authenticated user.
    let out = common::ctl_ok(
        &ms[2].endpoint(),
        &["--user", "alice:alicepw", "lease", "grant", "60"],
    );
    let id = out.split_whitespace().nth(1).unwrap().to_string();
    for m in &ms {
        common::ctl_ok(
            &m.endpoint(),
            &[
                "--user",
                "alice:alicepw",
                "lease",
                "keep-alive",
                "--once",
                &id,
            ],
        );
    }
    // Restarted, a member still has auth on and its users (its simple tokens are in memory,
    // as etcd's: whether one survives depends on whether the restart replays the entry that
    // assigned it).
    procs[2].kill();
    procs[2] = Proc::kvd(&ms[2], &dir.path().join("m3"), &ms, "new", &[]);
    procs[2].ctl_flags = vec!["--user".into(), "root:rootpw".into()];
    procs[2].wait_ready();
    let s = Client::new(&ms[2].client).get("/a/1").await.unwrap_err();
    assert_eq!(
        s.message(),
        "etcdserver: user name is empty",
        "auth is off after a restart"
    );
    let again = Client::new(&ms[2].client)
        .login("alice", "alicepw")
        .await
        .unwrap();
    assert_eq!(again.get("/a/1").await.unwrap().as_deref(), Some("v"));
    // The token from m2 still works there.
    assert_eq!(alice.get("/a/1").await.unwrap().as_deref(), Some("v"));
}

/// What a caller gets from the calls etcd 3.7 opened to any user and closed to callers without
/// credentials: each call's outcome, `ok` or the error's message.
async fn any_user_calls(c: &Client) -> Vec<String> {
    fn out<T>(what: &str, r: Result<T, Status>) -> String {
        match r {
            Ok(_) => format!("{what}: ok"),
            Err(s) => format!("{what}: {}", s.message()),
        }
    }
    let ch = c.ch.clone();
    let mut seen = vec![
        out(
            "status",
            MaintenanceClient::new(ch.clone())
                .status(c.req(StatusRequest {}))
                .await,
        ),
        out(
            "member list",
            ClusterClient::new(ch.clone())
                .member_list(c.req(MemberListRequest::default()))
                .await,
        ),
        out(
            "alarm list",
            MaintenanceClient::new(ch.clone())
                .alarm(c.req(AlarmRequest::default()))
                .await,
        ),
        out(
            "auth status",
            c.auth().auth_status(c.req(AuthStatusRequest {})).await,
        ),
        out(
            "lease grant",
            LeaseClient::new(ch.clone())
                .lease_grant(c.req(LeaseGrantRequest { ttl: 100, id: 0 }))
                .await,
        ),
        out(
            "lease list",
            LeaseClient::new(ch.clone())
                .lease_leases(c.req(LeaseLeasesRequest {}))
                .await,
        ),
        out(
            "time to live",
            LeaseClient::new(ch.clone())
                .lease_time_to_live(c.req(LeaseTimeToLiveRequest {
                    id: SECRET_LEASE,
                    keys: false,
                }))
                .await,
        ),
        out(
            "lease revoke of a lease without keys",
            LeaseClient::new(ch.clone())
                .lease_revoke(c.req(LeaseRevokeRequest { id: 12345 }))
                .await,
        ),
    ];
    let renew = LeaseKeepAliveRequest { id: SECRET_LEASE };
    let ka = LeaseClient::new(ch)
        .lease_keep_alive(c.req(tokio_stream::iter(vec![renew])))
        .await;
    let ka = match ka {
        Ok(r) => r.into_inner().message().await.map(|_| ()),
        Err(s) => Err(s),
    };
    seen.push(out("keep-alive of root's lease", ka));
    seen
}

/// etcd 3.7 refuses every corner a user without the permission tries, as kvd does; it lets any
/// user ask for the status, the member and alarm lists, and requires credentials for them and
/// for leases: kvd answers those calls as etcd 3.7.1 does, to a user and to a caller without
/// credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_user_may_ask_is_what_etcd_3_7_allows() {
    let dir = tempfile::tempdir().unwrap();
    let m = Addrs::new("default");
    let etcd37 = common::etcd_tools("v3.7.1").join("etcd");
    let dir37 = dir.path().join("etcd37");
    let mut e = Proc::start(&etcd37, &m, &dir37, std::slice::from_ref(&m), "new", &[]);
    e.wait_ready();
    let (k, _kvd) = Proc::single_kvd(dir.path());
    let (_, e_mallory) = setup(&m.client).await;
    let (_, k_mallory) = setup(&k.client).await;
    let mut report = Vec::new();
    for &c in CORNERS {
        let kvd = attempt(&k_mallory, c)
            .await
            .map_err(|s| s.message().to_string());
        let etcd = attempt(&e_mallory, c)
            .await
            .map_err(|s| s.message().to_string());
        if kvd.is_ok() != etcd.is_ok() {
            report.push(format!("{c:?}: etcd 3.7.1 {etcd:?}, kvd {kvd:?}"));
        }
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
    let anon = |url: &str| Client::new(url);
    for (who, e, k) in [
        ("a user", e_mallory, k_mallory),
        ("no credentials", anon(&m.client), anon(&k.client)),
    ] {
        let want = any_user_calls(&e).await;
        let got = any_user_calls(&k).await;
        assert_eq!(got, want, "{who}: kvd, then etcd 3.7.1");
    }
}
