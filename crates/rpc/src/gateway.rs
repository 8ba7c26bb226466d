//! etcd's JSON gateway on the client port: `POST /v3/kv/range` and the rest, each the gRPC
//! method of the same name with its request and response in protobuf's JSON mapping as etcd's
//! grpc-gateway writes it (proto field names, 64-bit integers as strings, bytes as base64,
//! enums by name, unset fields left out; either field name accepted in, unknown fields
//! ignored). Streams (`/v3/watch`, `/v3/lease/keepalive`, `/v3/election/observe`,
//! `/v3/maintenance/snapshot`) take a sequence of JSON requests in the body and answer one
//! `{"result": …}` line per response. Errors are `{"code": <gRPC code>, "message": …}` with the
//! HTTP status grpc-gateway maps the code to.
//!
//! Requests are served in-process by the same service implementations gRPC calls reach.

use std::sync::Arc;

use api::etcdserverpb::auth_server::Auth;
use api::etcdserverpb::cluster_server::Cluster;
use api::etcdserverpb::kv_server::Kv;
use api::etcdserverpb::lease_server::Lease;
use api::etcdserverpb::maintenance_server::Maintenance;
use api::v3electionpb::election_server::Election;
use api::v3lockpb::lock_server::Lock;
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, post, MethodRouter};
use axum::Router;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_stream::{Stream, StreamExt};
use tonic::{Code, Status};

use crate::auth::{AuthService, Creds};
use crate::cluster::ClusterService;
use crate::concurrency::{ElectionService, LockService};
use crate::kv::KvService;
use crate::lease::LeaseService;
use crate::maintenance::MaintenanceService;
use crate::server::Core;
use crate::watch::WatchService;

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

pub(crate) fn error(s: &Status) -> Response {
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
    T: DeserializeOwned + Default + prost::Message,
{
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    let req: T =
        serde_json::from_slice(body).map_err(|e| Status::invalid_argument(e.to_string()))?;
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

fn reply<T: Serialize>(r: Result<tonic::Response<T>, Status>) -> Response {
    match r {
        Ok(r) => ok(r.get_ref()),
        Err(s) => error(&s),
    }
}

fn reply_stream<T, S>(r: Result<tonic::Response<S>, Status>) -> Response
where
    T: Serialize + Send + 'static,
    S: Stream<Item = Result<T, Status>> + Send + 'static,
{
    match r {
        Ok(r) => streamed(r.into_inner()),
        Err(s) => error(&s),
    }
}

/// Requests read one after another from a body, as they arrive: a JSON value per request,
/// separated by nothing or whitespace. Ends at the body's end, at the first request that does
/// not parse, or at one larger than `limit` bytes.
fn requests<T>(
    body: Body,
    limit: usize,
) -> impl Stream<Item = Result<T, Status>> + Send + Unpin + 'static
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
                let v = within(v, limit);
                let over = v.is_err();
                if tx.send(v).await.is_err() || over {
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
async fn method_not_allowed(method: Method) -> Response {
    if method == Method::OPTIONS {
        return with_headers(StatusCode::OK.into_response(), false);
    }
    let mut r = error(&Status::unimplemented("Method Not Allowed"));
    *r.status_mut() = StatusCode::NOT_IMPLEMENTED;
    r
}

async fn not_found() -> Response {
    error(&Status::not_found("Not Found"))
}

/// A gateway request as the gRPC method sees it: grpc-gateway passes the `Authorization`
/// header on as `authorization` metadata (etcd takes the token from there). Nothing else of
/// the HTTP request reaches the call: a client certificate never names the user here.
fn grpc_request<T>(msg: T, headers: &axum::http::HeaderMap) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Some(v) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
    {
        r.metadata_mut().insert("authorization", v);
    }
    r
}

/// The credentials of a gateway stream (its token, as [`grpc_request`] passes it).
fn creds(headers: &axum::http::HeaderMap) -> Creds {
    Creds {
        token: headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(String::from),
        cert: None,
    }
}

/// A route for `svc.method(request)` with one request in the body, answered by `answer`
/// ([`reply`] for a unary method, [`reply_stream`] for a server-streaming one).
macro_rules! route {
    ($svc:expr, $method:ident, $limit:expr, $answer:ident) => {{
        let svc = $svc.clone();
        let limit = $limit;
        post(move |headers: axum::http::HeaderMap, body: Bytes| {
            let svc = svc.clone();
            async move {
                match decode(&body, limit) {
                    Ok(req) => $answer(svc.$method(grpc_request(req, &headers)).await),
                    Err(s) => error(&s),
                }
            }
        })
        .fallback(method_not_allowed)
    }};
}

/// A bidirectional route: requests (each up to `limit` bytes) read from the body as they come,
/// a line per response.
fn bidi<T, O, S>(
    limit: usize,
    open: impl Fn(Requests<T>, Creds) -> S + Clone + Send + Sync + 'static,
) -> MethodRouter
where
    T: DeserializeOwned + prost::Message + Send + 'static,
    O: Serialize + Send + 'static,
    S: Stream<Item = Result<O, Status>> + Send + 'static,
{
    post(move |headers: axum::http::HeaderMap, body: Body| {
        let open = open.clone();
        async move { streamed(open(Box::pin(requests::<T>(body, limit)), creds(&headers))) }
    })
    .fallback(method_not_allowed)
}

/// The requests of a bidirectional route.
pub(crate) type Requests<T> =
    std::pin::Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Every `/v3/*` route etcd's gateway serves. A request body may be as large as a gRPC
/// message may (`limit`: `--max-request-bytes` and gRPC's envelope).
pub fn router(core: &Arc<Core>, limit: usize) -> Router {
    let kv = KvService::new(core.clone());
    let watch = WatchService::new(core.clone());
    let lease = LeaseService::new(core.clone());
    let cluster = ClusterService::new(core.clone());
    let mt = MaintenanceService::new(core.clone());
    let auth = AuthService::new(core.clone());
    let lock = LockService::new(core.clone());
    let election = ElectionService::new(core.clone());
    let keep_alive = {
        let lease = lease.clone();
        bidi(limit, move |input, _creds| lease.keep_alive(input))
    };
    Router::new()
        .route("/v3/kv/range", route!(kv, range, limit, reply))
        .route("/v3/kv/put", route!(kv, put, limit, reply))
        .route("/v3/kv/deleterange", route!(kv, delete_range, limit, reply))
        .route("/v3/kv/txn", route!(kv, txn, limit, reply))
        .route("/v3/kv/compaction", route!(kv, compact, limit, reply))
        .route(
            "/v3/watch",
            bidi(limit, move |input, creds| watch.open(input, creds)),
        )
        .route("/v3/lease/grant", route!(lease, lease_grant, limit, reply))
        .route(
            "/v3/lease/revoke",
            route!(lease, lease_revoke, limit, reply),
        )
        .route(
            "/v3/kv/lease/revoke",
            route!(lease, lease_revoke, limit, reply),
        )
        .route("/v3/lease/keepalive", keep_alive)
        .route(
            "/v3/lease/timetolive",
            route!(lease, lease_time_to_live, limit, reply),
        )
        .route(
            "/v3/kv/lease/timetolive",
            route!(lease, lease_time_to_live, limit, reply),
        )
        .route(
            "/v3/lease/leases",
            route!(lease, lease_leases, limit, reply),
        )
        .route(
            "/v3/kv/lease/leases",
            route!(lease, lease_leases, limit, reply),
        )
        .route(
            "/v3/cluster/member/add",
            route!(cluster, member_add, limit, reply),
        )
        .route(
            "/v3/cluster/member/remove",
            route!(cluster, member_remove, limit, reply),
        )
        .route(
            "/v3/cluster/member/update",
            route!(cluster, member_update, limit, reply),
        )
        .route(
            "/v3/cluster/member/list",
            route!(cluster, member_list, limit, reply),
        )
        .route(
            "/v3/cluster/member/promote",
            route!(cluster, member_promote, limit, reply),
        )
        .route("/v3/maintenance/alarm", route!(mt, alarm, limit, reply))
        .route("/v3/maintenance/status", route!(mt, status, limit, reply))
        .route(
            "/v3/maintenance/defragment",
            route!(mt, defragment, limit, reply),
        )
        .route("/v3/maintenance/hash", route!(mt, hash, limit, reply))
        .route("/v3/maintenance/hashkv", route!(mt, hash_kv, limit, reply))
        .route(
            "/v3/maintenance/snapshot",
            route!(mt, snapshot, limit, reply_stream),
        )
        .route(
            "/v3/maintenance/transfer-leadership",
            route!(mt, move_leader, limit, reply),
        )
        .route(
            "/v3/maintenance/downgrade",
            route!(mt, downgrade, limit, reply),
        )
        .route("/v3/auth/enable", route!(auth, auth_enable, limit, reply))
        .route("/v3/auth/disable", route!(auth, auth_disable, limit, reply))
        .route("/v3/auth/status", route!(auth, auth_status, limit, reply))
        .route(
            "/v3/auth/authenticate",
            route!(auth, authenticate, limit, reply),
        )
        .route("/v3/auth/user/add", route!(auth, user_add, limit, reply))
        .route("/v3/auth/user/get", route!(auth, user_get, limit, reply))
        .route("/v3/auth/user/list", route!(auth, user_list, limit, reply))
        .route(
            "/v3/auth/user/delete",
            route!(auth, user_delete, limit, reply),
        )
        .route(
            "/v3/auth/user/changepw",
            route!(auth, user_change_password, limit, reply),
        )
        .route(
            "/v3/auth/user/grant",
            route!(auth, user_grant_role, limit, reply),
        )
        .route(
            "/v3/auth/user/revoke",
            route!(auth, user_revoke_role, limit, reply),
        )
        .route("/v3/auth/role/add", route!(auth, role_add, limit, reply))
        .route("/v3/auth/role/get", route!(auth, role_get, limit, reply))
        .route("/v3/auth/role/list", route!(auth, role_list, limit, reply))
        .route(
            "/v3/auth/role/delete",
            route!(auth, role_delete, limit, reply),
        )
        .route(
            "/v3/auth/role/grant",
            route!(auth, role_grant_permission, limit, reply),
        )
        .route(
            "/v3/auth/role/revoke",
            route!(auth, role_revoke_permission, limit, reply),
        )
        .route("/v3/lock/lock", route!(lock, lock, limit, reply))
        .route("/v3/lock/unlock", route!(lock, unlock, limit, reply))
        .route(
            "/v3/election/campaign",
            route!(election, campaign, limit, reply),
        )
        .route(
            "/v3/election/proclaim",
            route!(election, proclaim, limit, reply),
        )
        .route(
            "/v3/election/leader",
            route!(election, leader, limit, reply),
        )
        .route(
            "/v3/election/observe",
            route!(election, observe, limit, reply_stream),
        )
        .route(
            "/v3/election/resign",
            route!(election, resign, limit, reply),
        )
        .route("/v3/{*rest}", any(not_found))
        .layer(axum::extract::DefaultBodyLimit::max(json_limit(limit)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::etcdserverpb::{RangeRequest, RangeResponse, ResponseHeader};
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
