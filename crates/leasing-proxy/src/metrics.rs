//! The proxy's metrics, in a registry of its own (served as Prometheus text on `/metrics`):
//! etcd's grpc-proxy names where etcd has the metric, `kvd_leasing_*` for the leasing layer's.

use prometheus::{IntCounter, IntGauge, Opts, Registry};

/// Counters and gauges of one proxy.
#[derive(Debug, Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// Linearizable single-key reads answered from the cache.
    pub hits: IntCounter,
    /// Cacheable reads that went to the cluster.
    pub misses: IntCounter,
    /// Keys taken (a leasing key created under the proxy's session).
    pub acquisitions: IntCounter,
    /// Revocations of the proxy's leasing keys by writers elsewhere (a `REVOKE` seen).
    pub revocations_received: IntCounter,
    /// Revocations the proxy made of others' leasing keys, for its clients' writes.
    pub revocations_sent: IntCounter,
    /// Held keys given up for room (cold keys), or because a write bypassed the protocol.
    pub evictions: IntCounter,
    /// Calls the proxy made to the cluster (its clients' calls forwarded, and its own).
    pub upstream: IntCounter,
    /// Keys held, and the bytes their values take.
    pub keys: IntGauge,
    pub bytes: IntGauge,
    /// Client watchers, the upstream watchers they share, and how many client watchers
    /// share another's (set when the metrics are read).
    pub watchers: IntGauge,
    pub upstream_watchers: IntGauge,
    pub watchers_coalescing: IntGauge,
    pub events_coalescing: IntCounter,
    /// What the proxy's client connections hold and were refused (the guard its client
    /// port's HTTP/2 config shares).
    pub client_guard: std::sync::Arc<grpc_wire::Guard>,
    /// grpc-go's server metrics of the calls the proxy serves (its client port's HTTP/2
    /// config counts them), as etcd's proxy registers them.
    pub grpc_calls: std::sync::Arc<grpc_wire::CallMetrics>,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        // process_* (resident memory, CPU time, descriptors), as Go's client serves them.
        let process = prometheus::process_collector::ProcessCollector::for_self();
        registry
            .register(Box::new(process))
            .expect("each metric registered once");
        let counter = |name: &str, help: &str| {
            let c = IntCounter::with_opts(Opts::new(name, help)).expect("a valid metric name");
            registry
                .register(Box::new(c.clone()))
                .expect("each metric registered once");
            c
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::with_opts(Opts::new(name, help)).expect("a valid metric name");
            registry
                .register(Box::new(g.clone()))
                .expect("each metric registered once");
            g
        };
        Metrics {
            hits: counter(
                "etcd_grpc_proxy_cache_hits_total",
                "Linearizable single-key reads answered from the leasing cache.",
            ),
            misses: counter(
                "etcd_grpc_proxy_cache_misses_total",
                "Cacheable reads answered by the cluster.",
            ),
            acquisitions: counter(
                "kvd_leasing_acquisitions_total",
                "Keys the proxy took a lease on.",
            ),
            revocations_received: counter(
                "kvd_leasing_revocations_received_total",
                "Revocations of the proxy's leasing keys by writers elsewhere.",
            ),
            revocations_sent: counter(
                "kvd_leasing_revocations_sent_total",
                "Leasing keys of other holders the proxy revoked for its clients' writes.",
            ),
            evictions: counter(
                "kvd_leasing_evictions_total",
                "Held keys given up for room in the cache.",
            ),
            upstream: counter(
                "kvd_leasing_upstream_calls_total",
                "Calls the proxy made to the cluster.",
            ),
            keys: gauge(
                "etcd_grpc_proxy_cache_keys_total",
                "Keys the leasing cache holds.",
            ),
            bytes: gauge(
                "kvd_leasing_cache_bytes",
                "Bytes the values held in the leasing cache take (estimated).",
            ),
            watchers: gauge(
                "kvd_grpc_proxy_watchers",
                "Client watchers served by the proxy.",
            ),
            upstream_watchers: gauge(
                "kvd_grpc_proxy_upstream_watchers",
                "Upstream watchers the proxy's client watchers share.",
            ),
            watchers_coalescing: gauge(
                "etcd_grpc_proxy_watchers_coalescing_total",
                "Client watchers served by an upstream watcher another client watcher shares.",
            ),
            events_coalescing: counter(
                "etcd_grpc_proxy_events_coalescing_total",
                "Watch responses sent to more than one client watcher from one upstream response.",
            ),
            grpc_calls: std::sync::Arc::new(grpc_wire::CallMetrics::new(
                api::schema::METHODS,
                false,
            )),
            registry,
            client_guard: Default::default(),
        }
    }

    /// Prometheus text of every metric.
    pub fn text(&self) -> String {
        self.watchers_coalescing
            .set((self.watchers.get() - self.upstream_watchers.get()).max(0));
        let mut text = prometheus::TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_else(|e| format!("# metrics could not be encoded: {e}\n"));
        text.push_str(&self.client_guard.stats().prometheus("kvd_client"));
        text.push_str(&self.grpc_calls.prometheus());
        text
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
