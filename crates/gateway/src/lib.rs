//! etcd's JSON gateway (`POST /v3/kv/range` and the rest) in front of any server of etcd's
//! gRPC services: each route is the gRPC method of the same name, with its request and
//! response in protobuf's JSON mapping as etcd's grpc-gateway writes it (proto field names,
//! 64-bit integers as strings, bytes as base64, enums by name, unset fields left out; either
//! field name accepted in, unknown fields ignored). Streams (`/v3/watch`,
//! `/v3/lease/keepalive`, `/v3/election/observe`, `/v3/maintenance/snapshot`) take a sequence
//! of JSON requests in the body and answer one `{"result": …}` line per response. Errors are
//! `{"code": <gRPC code>, "message": …}` with the HTTP status grpc-gateway maps the code to.
//!
//! As etcd's grpc-gateway dials its own server, each request here is made as a gRPC call to
//! the server's own router, in process: the same services, checks and answers as a gRPC
//! client gets. The `Authorization` header travels as `authorization` metadata (etcd takes
//! the token from there); nothing else of the HTTP request does (a client certificate never
//! names the user here, as in etcd). kvd's member and kvd's proxy both serve it.
//!
//! ```no_run
//! # fn example(grpc: axum::Router) -> axum::Router {
//! gateway::router(grpc, 4 << 20)
//! # }
//! ```

mod call;
mod json;

use api::etcdserverpb::*;
use api::v3electionpb::*;
use api::v3lockpb::*;
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, post, MethodRouter};
use axum::Router;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_stream::{Stream, StreamExt};
use tonic::{Code, Status};

use call::Grpc;

/// grpc-gateway's HTTP status for a gRPC code.
fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A status as grpc-gateway writes it: `{"code":3,"message":"…"}`.
fn status_json(s: &Status) -> serde_json::Value {
    let mut v = serde_json::Map::new();
    v.insert("code".into(), (s.code() as i32).into());
    if !s.message().is_empty() {
        v.insert("message".into(), s.message().into());
    }
    serde_json::Value::Object(v)
}

fn with_headers(mut r: Response, grpc: bool) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    // etcd's default --cors (every origin) and the gRPC response header the gateway forwards.
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("POST, GET, OPTIONS, PUT, DELETE"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("accept, content-type, authorization"),
    );
    if grpc {
        h.insert(
            "grpc-metadata-content-type",
            HeaderValue::from_static("application/grpc"),
        );
    }
    r
}

/// An error as the gateway answers it.
pub fn error(s: &Status) -> Response {
    let body = status_json(s).to_string();
    with_headers((http_status(s.code()), body).into_response(), false)
}

fn ok<T: Serialize>(v: &T) -> Response {
    match serde_json::to_string(v) {
        Ok(body) => with_headers((StatusCode::OK, body).into_response(), true),
        Err(e) => error(&Status::internal(e.to_string())),
    }
}

/// One JSON request; an empty body is the default request, as grpc-gateway's. A request
/// whose protobuf encoding exceeds `limit` (gRPC's receive limit) gets gRPC's answer, as it
/// does behind etcd's gateway.
fn decode<T>(body: &[u8], limit: usize) -> Result<T, Status>
where
    T: DeserializeOwned + Default + prost::Message + prost::Name,
{
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    // Refused in etcd's words; what etcd takes, rewritten so that serde takes it too.
    let json =
        json::read(body, &format!(".{}", T::full_name())).map_err(Status::invalid_argument)?;
    let req: T =
        serde_json::from_str(&json).map_err(|e| Status::invalid_argument(e.to_string()))?;
    within(req, limit)
}

/// `req` if its encoding fits gRPC's receive limit, else grpc-go's refusal.
fn within<T: prost::Message>(req: T, limit: usize) -> Result<T, Status> {
    let n = req.encoded_len();
    if n > limit {
        return Err(grpc_wire::too_large(n, limit));
    }
    Ok(req)
}

/// How much JSON may carry a request of `limit` protobuf bytes: base64 takes 4 bytes for 3,
/// and field names and punctuation take more.
fn json_limit(limit: usize) -> usize {
    limit.saturating_mul(2).saturating_add(64 << 10)
}

/// Requests read one after another from a body, as they arrive: a JSON value per request,
/// separated by nothing or whitespace. Ends at the body's end, at the first request that does
/// not parse, or at one larger than `limit` bytes.
fn requests<T>(body: Body, limit: usize) -> impl Stream<Item = T> + Send + Unpin + 'static
where
    T: DeserializeOwned + prost::Message + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        let mut chunks = body.into_data_stream();
        let mut buf: Vec<u8> = Vec::new();
        let mut done = false;
        loop {
            // Every complete value in the buffer.
            let mut it = serde_json::Deserializer::from_slice(&buf).into_iter::<T>();
            let mut sent = Vec::new();
            let mut failed = None;
            for r in it.by_ref() {
                match r {
                    Ok(v) => sent.push(v),
                    // Incomplete: the rest comes with the next chunk.
                    Err(e) if e.is_eof() && !done => break,
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            // What the values parsed so far took; an incomplete one starts there.
            let consumed = it.byte_offset();
            for v in sent {
                let Ok(v) = within(v, limit) else { return };
                if tx.send(v).await.is_err() {
                    return;
                }
            }
            if let Some(e) = failed {
                tracing::debug!("gateway stream: a request did not parse: {e}");
                return;
            }
            buf.drain(..consumed);
            if done {
                return;
            }
            if buf.len() > json_limit(limit) {
                tracing::debug!("gateway stream: a request over {limit} bytes; the stream ends");
                return;
            }
            match chunks.next().await {
                Some(Ok(b)) => buf.extend_from_slice(&b),
                Some(Err(_)) => return,
                None => done = true,
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// A streamed answer: one `{"result": …}` (or `{"error": …}`) line per response.
fn streamed<T, S>(out: S) -> Response
where
    T: Serialize + Send + 'static,
    S: Stream<Item = Result<T, Status>> + Send + 'static,
{
    let lines = out.map(|r| {
        let line = match r.map(|v| serde_json::to_string(&v)) {
            Ok(Ok(v)) => format!("{{\"result\":{v}}}\n"),
            Ok(Err(e)) => format!(
                "{{\"error\":{}}}\n",
                status_json(&Status::internal(e.to_string()))
            ),
            Err(s) => format!("{{\"error\":{}}}\n", status_json(&s)),
        };
        Ok::<_, std::convert::Infallible>(Bytes::from(line))
    });
    with_headers(
        (StatusCode::OK, Body::from_stream(lines)).into_response(),
        true,
    )
}

/// Anything but POST (and a CORS preflight) on a gateway path, as grpc-gateway answers it.
async fn method_not_allowed(method: Method, body: Body) -> Response {
    // Read first, as in `not_found`.
    let _ = axum::body::to_bytes(body, usize::MAX).await;
    if method == Method::OPTIONS {
        return with_headers(StatusCode::OK.into_response(), false);
    }
    let mut r = error(&Status::unimplemented("Method Not Allowed"));
    *r.status_mut() = StatusCode::NOT_IMPLEMENTED;
    r
}

/// A path etcd's gateway does not have. The body is read first: a connection closed with a
/// request's bytes unread is reset, and the client may lose the answer with it.
async fn not_found(body: Body) -> Response {
    let _ = axum::body::to_bytes(body, usize::MAX).await;
    error(&Status::not_found("Not Found"))
}

/// The `Authorization` header, passed on as `authorization` metadata.
fn auth(headers: &HeaderMap) -> Option<HeaderValue> {
    headers.get(header::AUTHORIZATION).cloned()
}

/// A unary route: one JSON request in the body, the gRPC method `path`'s answer.
fn unary<Req, Resp>(grpc: &Grpc, path: &'static str, limit: usize) -> MethodRouter
where
    Req: DeserializeOwned + Default + prost::Message + prost::Name + 'static,
    Resp: Serialize + Default + prost::Message + 'static,
{
    let grpc = grpc.clone();
    post(move |headers: HeaderMap, body: Bytes| {
        let grpc = grpc.clone();
        async move {
            let req: Req = match decode(&body, limit) {
                Ok(r) => r,
                Err(s) => return error(&s),
            };
            match grpc.unary::<Req, Resp>(path, auth(&headers), &req).await {
                Ok(r) => ok(&r),
                Err(s) => error(&s),
            }
        }
    })
    .fallback(method_not_allowed)
}

/// A server-streaming route: one JSON request, a line per response.
fn server_stream<Req, Resp>(grpc: &Grpc, path: &'static str, limit: usize) -> MethodRouter
where
    Req: DeserializeOwned + Default + prost::Message + prost::Name + Send + 'static,
    Resp: Serialize + Default + prost::Message + Send + 'static,
{
    let grpc = grpc.clone();
    post(move |headers: HeaderMap, body: Bytes| {
        let grpc = grpc.clone();
        async move {
            let req: Req = match decode(&body, limit) {
                Ok(r) => r,
                Err(s) => return error(&s),
            };
            let input = tokio_stream::once(req);
            match grpc
                .streaming::<Req, Resp, _>(path, auth(&headers), input)
                .await
            {
                Ok(out) => streamed(out),
                Err(s) => error(&s),
            }
        }
    })
    .fallback(method_not_allowed)
}

/// A bidirectional route: requests (each up to `limit` bytes) read from the body as they
/// come, a line per response.
fn bidi<Req, Resp>(grpc: &Grpc, path: &'static str, limit: usize) -> MethodRouter
where
    Req: DeserializeOwned + prost::Message + Send + 'static,
    Resp: Serialize + Default + prost::Message + Send + 'static,
{
    let grpc = grpc.clone();
    post(move |headers: HeaderMap, body: Body| {
        let grpc = grpc.clone();
        async move {
            let input = requests::<Req>(body, limit);
            match grpc
                .streaming::<Req, Resp, _>(path, auth(&headers), input)
                .await
            {
                Ok(out) => streamed(out),
                Err(s) => error(&s),
            }
        }
    })
    .fallback(method_not_allowed)
}

/// Every `/v3/*` route etcd's gateway serves, made as gRPC calls to `grpc` (the server's own
/// gRPC router). A request body may be as large as a gRPC message may (`limit`).
pub fn router(grpc: Router, limit: usize) -> Router {
    let g = Grpc::new(grpc);
    macro_rules! u {
        ($path:literal, $req:ty, $resp:ty) => {
            unary::<$req, $resp>(&g, $path, limit)
        };
    }
    Router::new()
        .route(
            "/v3/kv/range",
            u!("/etcdserverpb.KV/Range", RangeRequest, RangeResponse),
        )
        .route(
            "/v3/kv/put",
            u!("/etcdserverpb.KV/Put", PutRequest, PutResponse),
        )
        .route(
            "/v3/kv/deleterange",
            u!(
                "/etcdserverpb.KV/DeleteRange",
                DeleteRangeRequest,
                DeleteRangeResponse
            ),
        )
        .route(
            "/v3/kv/txn",
            u!("/etcdserverpb.KV/Txn", TxnRequest, TxnResponse),
        )
        .route(
            "/v3/kv/compaction",
            u!(
                "/etcdserverpb.KV/Compact",
                CompactionRequest,
                CompactionResponse
            ),
        )
        .route(
            "/v3/watch",
            bidi::<WatchRequest, WatchResponse>(&g, "/etcdserverpb.Watch/Watch", limit),
        )
        .route(
            "/v3/lease/grant",
            u!(
                "/etcdserverpb.Lease/LeaseGrant",
                LeaseGrantRequest,
                LeaseGrantResponse
            ),
        )
        .route(
            "/v3/lease/revoke",
            u!(
                "/etcdserverpb.Lease/LeaseRevoke",
                LeaseRevokeRequest,
                LeaseRevokeResponse
            ),
        )
        .route(
            "/v3/kv/lease/revoke",
            u!(
                "/etcdserverpb.Lease/LeaseRevoke",
                LeaseRevokeRequest,
                LeaseRevokeResponse
            ),
        )
        .route(
            "/v3/lease/keepalive",
            bidi::<LeaseKeepAliveRequest, LeaseKeepAliveResponse>(
                &g,
                "/etcdserverpb.Lease/LeaseKeepAlive",
                limit,
            ),
        )
        .route(
            "/v3/lease/timetolive",
            u!(
                "/etcdserverpb.Lease/LeaseTimeToLive",
                LeaseTimeToLiveRequest,
                LeaseTimeToLiveResponse
            ),
        )
        .route(
            "/v3/kv/lease/timetolive",
            u!(
                "/etcdserverpb.Lease/LeaseTimeToLive",
                LeaseTimeToLiveRequest,
                LeaseTimeToLiveResponse
            ),
        )
        .route(
            "/v3/lease/leases",
            u!(
                "/etcdserverpb.Lease/LeaseLeases",
                LeaseLeasesRequest,
                LeaseLeasesResponse
            ),
        )
        .route(
            "/v3/kv/lease/leases",
            u!(
                "/etcdserverpb.Lease/LeaseLeases",
                LeaseLeasesRequest,
                LeaseLeasesResponse
            ),
        )
        .route(
            "/v3/cluster/member/add",
            u!(
                "/etcdserverpb.Cluster/MemberAdd",
                MemberAddRequest,
                MemberAddResponse
            ),
        )
        .route(
            "/v3/cluster/member/remove",
            u!(
                "/etcdserverpb.Cluster/MemberRemove",
                MemberRemoveRequest,
                MemberRemoveResponse
            ),
        )
        .route(
            "/v3/cluster/member/update",
            u!(
                "/etcdserverpb.Cluster/MemberUpdate",
                MemberUpdateRequest,
                MemberUpdateResponse
            ),
        )
        .route(
            "/v3/cluster/member/list",
            u!(
                "/etcdserverpb.Cluster/MemberList",
                MemberListRequest,
                MemberListResponse
            ),
        )
        .route(
            "/v3/cluster/member/promote",
            u!(
                "/etcdserverpb.Cluster/MemberPromote",
                MemberPromoteRequest,
                MemberPromoteResponse
            ),
        )
        .route(
            "/v3/maintenance/alarm",
            u!(
                "/etcdserverpb.Maintenance/Alarm",
                AlarmRequest,
                AlarmResponse
            ),
        )
        .route(
            "/v3/maintenance/status",
            u!(
                "/etcdserverpb.Maintenance/Status",
                StatusRequest,
                StatusResponse
            ),
        )
        .route(
            "/v3/maintenance/defragment",
            u!(
                "/etcdserverpb.Maintenance/Defragment",
                DefragmentRequest,
                DefragmentResponse
            ),
        )
        .route(
            "/v3/maintenance/hash",
            u!("/etcdserverpb.Maintenance/Hash", HashRequest, HashResponse),
        )
        .route(
            "/v3/maintenance/hashkv",
            u!(
                "/etcdserverpb.Maintenance/HashKV",
                HashKvRequest,
                HashKvResponse
            ),
        )
        .route(
            "/v3/maintenance/snapshot",
            server_stream::<SnapshotRequest, SnapshotResponse>(
                &g,
                "/etcdserverpb.Maintenance/Snapshot",
                limit,
            ),
        )
        .route(
            "/v3/maintenance/transfer-leadership",
            u!(
                "/etcdserverpb.Maintenance/MoveLeader",
                MoveLeaderRequest,
                MoveLeaderResponse
            ),
        )
        .route(
            "/v3/maintenance/downgrade",
            u!(
                "/etcdserverpb.Maintenance/Downgrade",
                DowngradeRequest,
                DowngradeResponse
            ),
        )
        .route(
            "/v3/auth/enable",
            u!(
                "/etcdserverpb.Auth/AuthEnable",
                AuthEnableRequest,
                AuthEnableResponse
            ),
        )
        .route(
            "/v3/auth/disable",
            u!(
                "/etcdserverpb.Auth/AuthDisable",
                AuthDisableRequest,
                AuthDisableResponse
            ),
        )
        .route(
            "/v3/auth/status",
            u!(
                "/etcdserverpb.Auth/AuthStatus",
                AuthStatusRequest,
                AuthStatusResponse
            ),
        )
        .route(
            "/v3/auth/authenticate",
            u!(
                "/etcdserverpb.Auth/Authenticate",
                AuthenticateRequest,
                AuthenticateResponse
            ),
        )
        .route(
            "/v3/auth/user/add",
            u!(
                "/etcdserverpb.Auth/UserAdd",
                AuthUserAddRequest,
                AuthUserAddResponse
            ),
        )
        .route(
            "/v3/auth/user/get",
            u!(
                "/etcdserverpb.Auth/UserGet",
                AuthUserGetRequest,
                AuthUserGetResponse
            ),
        )
        .route(
            "/v3/auth/user/list",
            u!(
                "/etcdserverpb.Auth/UserList",
                AuthUserListRequest,
                AuthUserListResponse
            ),
        )
        .route(
            "/v3/auth/user/delete",
            u!(
                "/etcdserverpb.Auth/UserDelete",
                AuthUserDeleteRequest,
                AuthUserDeleteResponse
            ),
        )
        .route(
            "/v3/auth/user/changepw",
            u!(
                "/etcdserverpb.Auth/UserChangePassword",
                AuthUserChangePasswordRequest,
                AuthUserChangePasswordResponse
            ),
        )
        .route(
            "/v3/auth/user/grant",
            u!(
                "/etcdserverpb.Auth/UserGrantRole",
                AuthUserGrantRoleRequest,
                AuthUserGrantRoleResponse
            ),
        )
        .route(
            "/v3/auth/user/revoke",
            u!(
                "/etcdserverpb.Auth/UserRevokeRole",
                AuthUserRevokeRoleRequest,
                AuthUserRevokeRoleResponse
            ),
        )
        .route(
            "/v3/auth/role/add",
            u!(
                "/etcdserverpb.Auth/RoleAdd",
                AuthRoleAddRequest,
                AuthRoleAddResponse
            ),
        )
        .route(
            "/v3/auth/role/get",
            u!(
                "/etcdserverpb.Auth/RoleGet",
                AuthRoleGetRequest,
                AuthRoleGetResponse
            ),
        )
        .route(
            "/v3/auth/role/list",
            u!(
                "/etcdserverpb.Auth/RoleList",
                AuthRoleListRequest,
                AuthRoleListResponse
            ),
        )
        .route(
            "/v3/auth/role/delete",
            u!(
                "/etcdserverpb.Auth/RoleDelete",
                AuthRoleDeleteRequest,
                AuthRoleDeleteResponse
            ),
        )
        .route(
            "/v3/auth/role/grant",
            u!(
                "/etcdserverpb.Auth/RoleGrantPermission",
                AuthRoleGrantPermissionRequest,
                AuthRoleGrantPermissionResponse
            ),
        )
        .route(
            "/v3/auth/role/revoke",
            u!(
                "/etcdserverpb.Auth/RoleRevokePermission",
                AuthRoleRevokePermissionRequest,
                AuthRoleRevokePermissionResponse
            ),
        )
        .route(
            "/v3/lock/lock",
            u!("/v3lockpb.Lock/Lock", LockRequest, LockResponse),
        )
        .route(
            "/v3/lock/unlock",
            u!("/v3lockpb.Lock/Unlock", UnlockRequest, UnlockResponse),
        )
        .route(
            "/v3/election/campaign",
            u!(
                "/v3electionpb.Election/Campaign",
                CampaignRequest,
                CampaignResponse
            ),
        )
        .route(
            "/v3/election/proclaim",
            u!(
                "/v3electionpb.Election/Proclaim",
                ProclaimRequest,
                ProclaimResponse
            ),
        )
        .route(
            "/v3/election/leader",
            u!(
                "/v3electionpb.Election/Leader",
                LeaderRequest,
                LeaderResponse
            ),
        )
        .route(
            "/v3/election/observe",
            server_stream::<LeaderRequest, LeaderResponse>(
                &g,
                "/v3electionpb.Election/Observe",
                limit,
            ),
        )
        .route(
            "/v3/election/resign",
            u!(
                "/v3electionpb.Election/Resign",
                ResignRequest,
                ResignResponse
            ),
        )
        .route("/v3/{*rest}", any(not_found))
        .layer(axum::extract::DefaultBodyLimit::max(json_limit(limit)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::mvccpb::KeyValue;

    #[test]
    fn json_is_grpc_gateways() {
        let r = RangeResponse {
            header: Some(ResponseHeader {
                cluster_id: 1,
                member_id: 2,
                revision: 3,
                raft_term: 0,
            }),
            kvs: vec![KeyValue {
                key: b"foo".to_vec(),
                value: b"bar".to_vec(),
                create_revision: 2,
                mod_revision: 2,
                version: 1,
                lease: 0,
            }],
            count: 1,
            more: false,
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"header":{"cluster_id":"1","member_id":"2","revision":"3"},"kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"2","version":"1","value":"YmFy"}],"count":"1"}"#
        );
        // Either field name, enums by name or number, integers as strings or numbers, unknown
        // fields ignored.
        let q: RangeRequest = decode(
            br#"{"key":"Zm9v","countOnly":true,"sort_order":"DESCEND","revision":"2","bogus":1}"#,
            100,
        )
        .unwrap();
        assert_eq!(q.key, b"foo");
        assert!(q.count_only);
        assert_eq!(q.sort_order, 2);
        assert_eq!(q.revision, 2);
        let q: RangeRequest = decode(br#"{"sort_order":1,"revision":5}"#, 100).unwrap();
        assert_eq!((q.sort_order, q.revision), (1, 5));
        assert_eq!(
            decode::<RangeRequest>(b"  ", 100).unwrap(),
            RangeRequest::default()
        );
        assert!(decode::<RangeRequest>(br#"{"key":"!!!"}"#, 100).is_err());
        // Over gRPC's receive limit once encoded: grpc-go's refusal.
        let e = decode::<RangeRequest>(br#"{"key":"Zm9vYmFy"}"#, 4).unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted);
        assert_eq!(
            e.message(),
            "grpc: received message larger than max (8 vs. 4)"
        );
    }

    #[test]
    fn errors_map_as_grpc_gateway() {
        assert_eq!(http_status(Code::InvalidArgument), StatusCode::BAD_REQUEST);
        assert_eq!(http_status(Code::NotFound), StatusCode::NOT_FOUND);
        assert_eq!(
            http_status(Code::Unavailable),
            StatusCode::SERVICE_UNAVAILABLE
        );
        let s = Status::invalid_argument("etcdserver: key is not provided");
        assert_eq!(
            status_json(&s).to_string(),
            r#"{"code":3,"message":"etcdserver: key is not provided"}"#
        );
    }
}
