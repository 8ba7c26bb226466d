//! The JSON gateway's request bodies, on every route: the first byte picks the route, the
//! rest is the body. Each gets a JSON answer (an error is one), never a panic. The server
//! behind it answers every call with an empty message.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

const ROUTES: &[&str] = &[
    "/v3/kv/range",
    "/v3/kv/put",
    "/v3/kv/deleterange",
    "/v3/kv/txn",
    "/v3/kv/compaction",
    "/v3/watch",
    "/v3/lease/grant",
    "/v3/lease/keepalive",
    "/v3/lease/timetolive",
    "/v3/cluster/member/add",
    "/v3/maintenance/status",
    "/v3/maintenance/snapshot",
    "/v3/auth/user/add",
    "/v3/auth/role/grant",
    "/v3/lock/lock",
    "/v3/election/campaign",
    "/v3/election/observe",
    "/v3/nosuch",
];

/// A gRPC server that answers every call with one empty message and an OK status.
fn grpc() -> axum::Router {
    axum::Router::new().fallback(|| async {
        let body = axum::body::Body::from(vec![0u8, 0, 0, 0, 0]);
        http::Response::builder()
            .header("content-type", "application/grpc")
            .header("grpc-status", "0")
            .body(body)
            .expect("a response")
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let route = ROUTES[pick as usize % ROUTES.len()];
    static ROUTER: OnceLock<axum::Router> = OnceLock::new();
    let router = ROUTER
        .get_or_init(|| gateway::router(grpc(), 1 << 16))
        .clone();
    kvd_fuzz::runtime().block_on(async {
        let req = http::Request::post(route)
            .body(axum::body::Body::from(body.to_vec()))
            .expect("a request");
        let resp = router.oneshot(req).await.expect("infallible");
        let body = axum::body::to_bytes(resp.into_body(), 1 << 24)
            .await
            .expect("a body");
        // Every answer is JSON: one value, or one per line for a stream.
        for line in body.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            assert!(
                serde_json::from_slice::<serde_json::Value>(line).is_ok(),
                "not JSON: {}",
                String::from_utf8_lossy(line)
            );
        }
    });
});
