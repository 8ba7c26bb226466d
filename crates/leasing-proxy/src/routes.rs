//! The proxy's plain HTTP, beside gRPC on its port and on `--metrics-addr`: `/health` (a
//! linearizable read of the cluster through the proxy's upstream, as etcd's proxy checks),
//! `/proxy/health` (the same), `/metrics` and `/proxy/metrics` (the proxy's own metrics;
//! etcd's proxy answers `/metrics` with a member's, fetched from it).

use std::sync::Arc;
use std::time::Duration;

use api::etcdserverpb::RangeRequest;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::calls::Calls;
use crate::leasing::Leasing;
use crate::upstream::Creds;

/// What the routes read.
#[derive(Debug, Clone)]
pub struct Http {
    pub calls: Calls,
    pub leasing: Option<Arc<Leasing>>,
}

/// The HTTP routes (no fallback: the caller adds [`fallback`] once its routes are merged).
pub fn router(h: Http) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/proxy/health", get(health))
        .route("/metrics", get(metrics))
        .route("/proxy/metrics", get(metrics))
        .with_state(h)
}

/// A gRPC call to a service the proxy does not have gets gRPC's UNIMPLEMENTED; anything
/// else HTTP 404.
pub async fn fallback(req: axum::extract::Request) -> Response {
    grpc_wire::fallback(req.headers(), req.uri().path())
}

/// gRPC statuses as etcd's grpc-proxy (grpc-go) gives them, in place of tonic's: a message
/// over the receive limit, a method a service lacks.
pub async fn grpc_status(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let path = req.uri().path().to_owned();
    let mut resp = next.run(req).await;
    grpc_wire::rewrite_status(&path, resp.headers_mut());
    resp
}

/// etcd's health answer: `{"health":"true","reason":""}`, 503 when false.
async fn health(State(h): State<Http>) -> Response {
    let read = RangeRequest {
        key: b"a".to_vec(),
        ..Default::default()
    };
    let r = tokio::time::timeout(
        Duration::from_secs(1),
        h.calls.range(&Creds::default(), read),
    )
    .await;
    let reason = match r {
        Ok(Ok(_)) => None,
        // A cluster with auth on answered: it is up.
        Ok(Err(s)) if s.code() == tonic::Code::PermissionDenied => None,
        Ok(Err(s)) => Some(format!("GET ERROR:{}", s.message())),
        Err(_) => Some("GET ERROR:context deadline exceeded".to_string()),
    };
    let (code, body) = match reason {
        None => (
            StatusCode::OK,
            r#"{"health":"true","reason":""}"#.to_string(),
        ),
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({"health": "false", "reason": why}).to_string(),
        ),
    };
    (code, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn metrics(State(h): State<Http>) -> Response {
    let m = &h.calls.metrics;
    if let Some(l) = &h.leasing {
        let (keys, bytes) = l.held();
        m.keys.set(keys as i64);
        m.bytes.set(bytes as i64);
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        m.text(),
    )
        .into_response()
}
