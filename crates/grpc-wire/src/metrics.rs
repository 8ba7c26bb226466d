//! grpc-go's server metrics as etcd registers them (go-grpc-middleware's Prometheus provider):
//! calls started and handled, by method and status code, and with etcd's `--metrics=extensive`
//! the handling-time histogram; counted by the connection for every call it serves, answered
//! itself or bridged. Every method's series exist from the start, as etcd initializes them.
//! Beside them, the bytes of gRPC messages received and sent (etcd's
//! `etcd_network_client_grpc_{received,sent}_bytes_total`, counted here with gRPC's 5-byte
//! message prefixes).

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// grpc-go's status code names, by number.
const CODES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];

/// The status code a call ended with when it did not say (gRPC's Unknown).
pub(crate) const UNKNOWN: u16 = 2;
/// A call whose stream went before its status (the client cancelled).
pub(crate) const CANCELED: u16 = 1;

/// Prometheus's default buckets (`prometheus.DefBuckets`), in seconds.
const BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Debug)]
struct Method {
    service: &'static str,
    name: &'static str,
    kind: &'static str,
    started: AtomicU64,
    handled: [AtomicU64; CODES.len()],
    buckets: [AtomicU64; BUCKETS.len()],
    /// Handling time, in nanoseconds.
    sum_nanos: AtomicU64,
}

/// The server metrics of the connections that share a config.
#[derive(Debug)]
pub struct CallMetrics {
    methods: Vec<Method>,
    by_path: HashMap<Box<[u8]>, u32>,
    histogram: bool,
    received: AtomicU64,
    sent: AtomicU64,
}

impl CallMetrics {
    /// The metrics of `methods` (package-qualified service, method, grpc-go's type label:
    /// `unary`, `server_stream`, `client_stream`, `bidi_stream`); `histogram`: etcd's
    /// `--metrics=extensive`.
    pub fn new(methods: &[(&'static str, &'static str, &'static str)], histogram: bool) -> Self {
        let methods: Vec<Method> = methods
            .iter()
            .map(|&(service, name, kind)| Method {
                service,
                name,
                kind,
                started: AtomicU64::new(0),
                handled: Default::default(),
                buckets: Default::default(),
                sum_nanos: AtomicU64::new(0),
            })
            .collect();
        let by_path = methods
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let path = format!("/{}/{}", m.service, m.name).into_bytes();
                (path.into_boxed_slice(), i as u32)
            })
            .collect();
        CallMetrics {
            methods,
            by_path,
            histogram,
            received: AtomicU64::new(0),
            sent: AtomicU64::new(0),
        }
    }

    /// A call to `path` starts: its method's index, if it is one of the methods counted.
    pub(crate) fn started(&self, path: &[u8]) -> Option<u32> {
        let m = *self.by_path.get(path)?;
        self.methods[m as usize]
            .started
            .fetch_add(1, Ordering::Relaxed);
        Some(m)
    }

    /// The call to method `m` begun at `since` ended with status `code`.
    pub(crate) fn handled(&self, m: u32, code: u16, since: Instant) {
        let Some(method) = self.methods.get(m as usize) else {
            return;
        };
        let code = if (code as usize) < CODES.len() {
            code
        } else {
            UNKNOWN
        };
        method.handled[code as usize].fetch_add(1, Ordering::Relaxed);
        if self.histogram {
            let took = since.elapsed();
            let secs = took.as_secs_f64();
            if let Some(b) = BUCKETS.iter().position(|&le| secs <= le) {
                method.buckets[b].fetch_add(1, Ordering::Relaxed);
            }
            let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
            method.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
        }
    }

    pub(crate) fn received(&self, n: usize) {
        self.received.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn sent(&self, n: usize) {
        self.sent.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// The metrics in Prometheus's text format.
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        let labels = |m: &Method| {
            format!(
                "grpc_method=\"{}\",grpc_service=\"{}\",grpc_type=\"{}\"",
                m.name, m.service, m.kind
            )
        };
        let _ = writeln!(
            out,
            "# HELP grpc_server_started_total Total number of RPCs started on the server.\n# TYPE grpc_server_started_total counter"
        );
        for m in &self.methods {
            let n = m.started.load(Ordering::Relaxed);
            let _ = writeln!(out, "grpc_server_started_total{{{}}} {n}", labels(m));
        }
        let _ = writeln!(
            out,
            "# HELP grpc_server_handled_total Total number of RPCs completed on the server, regardless of success or failure.\n# TYPE grpc_server_handled_total counter"
        );
        for m in &self.methods {
            for (code, n) in CODES.iter().zip(&m.handled) {
                let n = n.load(Ordering::Relaxed);
                let _ = writeln!(
                    out,
                    "grpc_server_handled_total{{grpc_code=\"{code}\",{}}} {n}",
                    labels(m)
                );
            }
        }
        if self.histogram {
            let _ = writeln!(
                out,
                "# HELP grpc_server_handling_seconds Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.\n# TYPE grpc_server_handling_seconds histogram"
            );
            for m in &self.methods {
                let l = labels(m);
                let mut cumulative = 0;
                for (le, n) in BUCKETS.iter().zip(&m.buckets) {
                    cumulative += n.load(Ordering::Relaxed);
                    let _ = writeln!(
                        out,
                        "grpc_server_handling_seconds_bucket{{{l},le=\"{le}\"}} {cumulative}"
                    );
                }
                let count: u64 = m.handled.iter().map(|n| n.load(Ordering::Relaxed)).sum();
                let sum = m.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
                let _ = writeln!(
                    out,
                    "grpc_server_handling_seconds_bucket{{{l},le=\"+Inf\"}} {count}\ngrpc_server_handling_seconds_sum{{{l}}} {sum}\ngrpc_server_handling_seconds_count{{{l}}} {count}"
                );
            }
        }
        for (name, help, n) in [
            (
                "etcd_network_client_grpc_received_bytes_total",
                "The total number of bytes received from grpc clients.",
                &self.received,
            ),
            (
                "etcd_network_client_grpc_sent_bytes_total",
                "The total number of bytes sent to grpc clients.",
                &self.sent,
            ),
        ] {
            let n = n.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {n}"
            );
        }
        out
    }
}

/// The status code in a response's `grpc-status` header, if it has one.
pub(crate) fn status_code(headers: &http::HeaderMap) -> Option<u16> {
    headers.get("grpc-status")?.to_str().ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_counted_by_method_and_code() {
        let m = CallMetrics::new(
            &[
                ("etcdserverpb.KV", "Range", "unary"),
                ("etcdserverpb.Watch", "Watch", "bidi_stream"),
            ],
            true,
        );
        assert_eq!(m.started(b"/etcdserverpb.KV/Put"), None);
        let range = m.started(b"/etcdserverpb.KV/Range").unwrap();
        m.handled(range, 0, Instant::now());
        let watch = m.started(b"/etcdserverpb.Watch/Watch").unwrap();
        m.handled(watch, CANCELED, Instant::now());
        m.received(7);
        let text = m.prometheus();
        let line = |l: &str| text.lines().any(|x| x == l);
        assert!(line("grpc_server_started_total{grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 1"), "{text}");
        assert!(line("grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 1"));
        assert!(line("grpc_server_handled_total{grpc_code=\"Canceled\",grpc_method=\"Watch\",grpc_service=\"etcdserverpb.Watch\",grpc_type=\"bidi_stream\"} 1"));
        assert!(line("grpc_server_handled_total{grpc_code=\"Unavailable\",grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 0"));
        assert!(line("grpc_server_handling_seconds_count{grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 1"));
        assert!(line("etcd_network_client_grpc_received_bytes_total 7"));
    }
}
