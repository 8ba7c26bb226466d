//! etcd's peer prober: the round trip to each peer whose stream is up.

use std::time::Duration;

use super::pb::Hello;
use super::wire::{connect, request, Ident, OPEN_TIMEOUT};
use crate::dial::Dialer;
use ids::MemberId;

/// How often a peer's round trip is measured (etcd's prober: 5 s).
pub(super) const PROBE_INTERVAL: Duration = Duration::from_secs(5);

/// Stops a peer's prober when its stream ends.
pub(super) struct Prober(pub(super) tokio::task::JoinHandle<()>);

impl Drop for Prober {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// etcd's peer prober: every few seconds, the round trip of a small request on a connection of
/// its own, into `etcd_network_peer_round_trip_time_seconds`.
pub(super) async fn probe(ident: Ident, dialer: Dialer, to: MemberId, url: String) {
    let rtt = crate::metrics::PEER_RTT.with_label_values(&[&crate::metrics::peer(to)]);
    let mut tick = tokio::time::interval(PROBE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut client = None;
    loop {
        tick.tick().await;
        if client.is_none() {
            client = connect(&dialer, &url).await.ok();
        }
        let Some(c) = client.as_mut() else { continue };
        let t = std::time::Instant::now();
        let req = request(Hello::default(), ident, to);
        match tokio::time::timeout(OPEN_TIMEOUT, c.probe(req)).await {
            Ok(Ok(_)) => rtt.observe(t.elapsed().as_secs_f64()),
            _ => client = None,
        }
    }
}
