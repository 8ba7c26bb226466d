//! Plain HTTP beside gRPC on the client URLs, as etcd serves it: `/health`, `/livez`,
//! `/readyz`, `/version` and `/metrics` (Prometheus text, etcd's metric names).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::server::Core;
use crate::version::{Version, SERVER_VERSION};

/// How long `/health` waits for its linearizable check (etcd: 1 s past the request timeout is
/// too long for a probe; it uses the request timeout of its client, we use this).
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

/// The HTTP routes.
pub fn router(core: Arc<Core>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/readyz", get(readyz))
        .route("/livez", get(livez))
        .route("/version", get(version))
        .route("/metrics", get(metrics))
        .with_state(core)
}

/// The routes of a metrics URL (etcd's `--listen-metrics-urls`): metrics and health.
pub fn metrics_router(core: Arc<Core>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/readyz", get(readyz))
        .route("/livez", get(livez))
        .route("/metrics", get(metrics))
        .with_state(core)
}

/// What answers a path no route has: a gRPC call gets gRPC's UNIMPLEMENTED, anything else
/// HTTP 404, as etcd's server.
pub async fn fallback(req: axum::extract::Request) -> Response {
    grpc_wire::fallback(req.headers(), req.uri().path())
}

/// gRPC statuses as grpc-go's server gives them (etcd's, so clients see the same code and
/// text), in place of tonic's: a message over the receive limit, a method a service lacks.
pub async fn grpc_status(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let path = req.uri().path().to_owned();
    let mut resp = next.run(req).await;
    grpc_wire::rewrite_status(&path, resp.headers_mut());
    resp
}

/// Why the member is not healthy, if it is not (etcd's checks: a leader, no alarm, and a
/// linearizable read that completes unless `serializable`).
async fn check(core: &Core, serializable: bool) -> Result<(), String> {
    if core.node.leader().0.is_none() {
        return Err("RAFT NO LEADER".into());
    }
    let alarms: Vec<String> = core
        .alarms()
        .iter()
        .map(|&(_, a)| match api::etcdserverpb::AlarmType::try_from(a) {
            Ok(api::etcdserverpb::AlarmType::Nospace) => "ALARM NOSPACE".to_string(),
            Ok(api::etcdserverpb::AlarmType::Corrupt) => "ALARM CORRUPT".to_string(),
            _ => format!("ALARM {a}"),
        })
        .collect();
    if !alarms.is_empty() {
        return Err(alarms.join(", "));
    }
    if !serializable {
        match tokio::time::timeout(HEALTH_TIMEOUT, core.linearize()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(format!("QGET ERROR: {}", e.message())),
            Err(_) => return Err("QGET ERROR: timed out".into()),
        }
    }
    Ok(())
}

fn json(code: StatusCode, body: String) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

async fn health(State(core): State<Arc<Core>>, uri: Uri) -> Response {
    let serializable = uri
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "serializable=true"));
    match check(&core, serializable).await {
        Ok(()) => json(
            StatusCode::OK,
            r#"{"health":"true","reason":""}"#.to_string(),
        ),
        Err(why) => {
            tracing::warn!("/health: unhealthy: {why}");
            json(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(r#"{{"health":"false","reason":{}}}"#, quote(&why)),
            )
        }
    }
}

async fn readyz(State(core): State<Arc<Core>>) -> Response {
    match check(&core, false).await {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

async fn livez() -> Response {
    (StatusCode::OK, "ok\n").into_response()
}

/// etcd's `/version`: the cluster version "not_decided" and the storage version "unknown"
/// until the leader's monitor first sets them.
async fn version(State(core): State<Arc<Core>>) -> Response {
    let cluster = core
        .cluster_version()
        .map_or_else(|| "not_decided".to_owned(), Version::full);
    let storage = core
        .storage_version()
        .map_or_else(|| "unknown".to_owned(), Version::full);
    json(
        StatusCode::OK,
        format!(
            r#"{{"etcdserver":"{SERVER_VERSION}","etcdcluster":"{cluster}","storage":"{storage}"}}"#
        ),
    )
}

/// One Prometheus metric: HELP, TYPE and its sample.
fn metric(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    let _ = writeln!(out, "{name} {value}");
}

async fn metrics(State(core): State<Arc<Core>>) -> Response {
    let st = core.node.status();
    let store = core.backend.store();
    let space = store.db().space();
    let mut out = String::new();
    let b = |v: bool| u8::from(v);
    metric(
        &mut out,
        "etcd_server_has_leader",
        "gauge",
        "Whether or not a leader exists. 1 is existence, 0 is not.",
        b(st.leader.is_some()),
    );
    metric(
        &mut out,
        "etcd_server_is_leader",
        "gauge",
        "Whether or not this member is a leader. 1 if is, 0 otherwise.",
        b(st.role == consensus::Role::Leader),
    );
    metric(
        &mut out,
        "etcd_server_is_learner",
        "gauge",
        "Whether or not this member is a learner. 1 if is, 0 otherwise.",
        b(st.members.get(st.id).is_some_and(|m| m.is_learner)),
    );
    metric(
        &mut out,
        "etcd_server_proposals_committed_total",
        "gauge",
        "The total number of consensus proposals committed.",
        st.commit,
    );
    metric(
        &mut out,
        "etcd_server_proposals_applied_total",
        "gauge",
        "The total number of consensus proposals applied.",
        st.applied,
    );
    metric(
        &mut out,
        "etcd_server_proposals_failed_total",
        "counter",
        "The total number of failed proposals seen.",
        core.proposals_failed
            .load(std::sync::atomic::Ordering::Relaxed),
    );
    metric(
        &mut out,
        "etcd_server_proposals_pending",
        "gauge",
        "The current number of pending proposals to commit.",
        st.commit.0.saturating_sub(st.applied.0),
    );
    metric(
        &mut out,
        "etcd_server_term",
        "gauge",
        "The raft term (kvd).",
        st.term,
    );
    metric(
        &mut out,
        "etcd_server_quota_backend_bytes",
        "gauge",
        "Current backend storage quota size in bytes.",
        core.cfg.quota(),
    );
    metric(
        &mut out,
        "etcd_mvcc_db_total_size_in_bytes",
        "gauge",
        "Total size of the underlying database physically allocated in bytes.",
        space.size,
    );
    metric(
        &mut out,
        "etcd_mvcc_db_total_size_in_use_in_bytes",
        "gauge",
        "Total size of the underlying database logically in use in bytes.",
        space.in_use,
    );
    metric(
        &mut out,
        "etcd_debugging_mvcc_current_revision",
        "gauge",
        "The current revision of store.",
        store.rev().0,
    );
    metric(
        &mut out,
        "etcd_debugging_mvcc_compact_revision",
        "gauge",
        "The revision of the last compaction in store.",
        store.compacted().0.max(0),
    );
    let watch = store.watch_counts();
    metric(
        &mut out,
        "etcd_debugging_mvcc_watcher_total",
        "gauge",
        "Total number of watchers.",
        watch.watchers,
    );
    metric(
        &mut out,
        "etcd_debugging_mvcc_events_total",
        "counter",
        "Total number of events sent by this member.",
        watch.events,
    );
    metric(
        &mut out,
        "kvd_mvcc_watch_responses_total",
        "counter",
        "Watch responses with events sent by this member (kvd): events_total over this is the events a response holds on average.",
        watch.responses,
    );
    let _ = writeln!(out, "# HELP etcd_server_id Server or member ID in hexadecimal format. 1 for 'server_id' label with current ID.");
    let _ = writeln!(out, "# TYPE etcd_server_id gauge");
    let _ = writeln!(out, "etcd_server_id{{server_id=\"{}\"}} 1", core.id);
    let _ = writeln!(out, "# HELP etcd_server_version Which version is running. 1 for 'server_version' label with current version.");
    let _ = writeln!(out, "# TYPE etcd_server_version gauge");
    let _ = writeln!(
        out,
        "etcd_server_version{{server_version=\"{SERVER_VERSION}\"}} 1"
    );
    if let Some(v) = core.cluster_version() {
        let _ = writeln!(out, "# HELP etcd_cluster_version Which version is running. 1 for 'cluster_version' label with current cluster version");
        let _ = writeln!(out, "# TYPE etcd_cluster_version gauge");
        let _ = writeln!(
            out,
            "etcd_cluster_version{{cluster_version=\"{}\"}} 1",
            v.short()
        );
    }
    // What the client connections hold, and what they were refused.
    out.push_str(&core.client_guard.stats().prometheus("kvd_client"));
    out.push_str(&core.grpc_calls.prometheus());
    // The histograms and counters the consensus and storage layers keep.
    match prometheus::TextEncoder::new().encode_to_string(&prometheus::gather()) {
        Ok(s) => out.push_str(&s),
        Err(e) => tracing::warn!("encoding metrics: {e}"),
    }
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response()
}
