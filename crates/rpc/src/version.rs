//! The versions a member answers with, as etcd's: the **server version** (the etcd release
//! whose API kvd serves), the **cluster version** (major.minor: the lowest server version of
//! the members, or a downgrade's target — decided by the leader's monitor, set through
//! consensus, kept in the `cluster` bucket) and the **storage version** (the cluster version's,
//! as etcd writes it in its file). What the cluster version turns on: 3.7's `RangeStream`.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use api::etcdserverpb::maintenance_client::MaintenanceClient;
use api::etcdserverpb::{DowngradeInfo, StatusRequest};
use consensus::Member;

use crate::request::{ClusterVersionSet, Op};
use crate::server::Core;

/// The etcd release kvd answers as (`/version`, Status, `etcd_server_version`).
pub const SERVER_VERSION: &str = "3.7.1";

/// A version as the cluster version counts it: major.minor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u64,
    pub minor: u64,
}

impl Version {
    /// This member's server version.
    pub const SERVER: Version = Version { major: 3, minor: 7 };
    /// etcd's `MinClusterVersion`: the cluster version before any member's is known.
    pub const MIN_CLUSTER: Version = Version { major: 3, minor: 0 };
    /// What a kvd member built before kvd answered as 3.7 reports (its peer port answers no
    /// Status).
    const KVD_BEFORE_3_7: Version = Version { major: 3, minor: 6 };
    /// The first cluster version that serves `RangeStream`.
    pub const RANGE_STREAM: Version = Version { major: 3, minor: 7 };

    /// A semantic version `X.Y.Z[-pre][+build]` (coreos/go-semver's syntax), patch dropped.
    pub fn parse(v: &str) -> Option<Version> {
        let core = v.split(['-', '+']).next()?;
        let parts: Vec<&str> = core.split('.').collect();
        let [major, minor, patch] = parts.as_slice() else {
            return None;
        };
        let num = |s: &str| -> Option<u64> {
            let ok = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            ok.then(|| s.parse().ok()).flatten()
        };
        num(patch)?;
        Some(Version {
            major: num(major)?,
            minor: num(minor)?,
        })
    }

    /// As etcd stores and reports it in full (`3.7.0`).
    pub fn full(self) -> String {
        format!("{}.{}.0", self.major, self.minor)
    }

    /// As etcd's `version.Cluster` shortens it (`3.7`).
    pub fn short(self) -> String {
        format!("{}.{}", self.major, self.minor)
    }

    /// The one version a cluster at this one may downgrade to (etcd's
    /// `allowedDowngradeVersion`: the minor version below).
    pub fn downgrade_target(self) -> Version {
        Version {
            major: self.major,
            minor: self.minor.wrapping_sub(1),
        }
    }

    /// The storage version of a cluster at this version (etcd's monitor keeps it at the
    /// cluster version's major.minor, but for 3.0, which a cluster has before it knows its
    /// members' versions).
    pub fn storage(self) -> Option<Version> {
        (self != Version::MIN_CLUSTER).then_some(self)
    }

    /// etcd's `IsValidClusterVersionChange`: up within the major version, or one minor down.
    pub fn may_change_to(self, to: Version) -> bool {
        to == self.downgrade_target() || (self.major == to.major && self < to)
    }
}

/// etcd's `decideClusterVersion`: the cluster version to set, if it is to change, from the
/// current one, the lowest of the members' server versions (none: one is unknown) and the
/// downgrade job.
pub fn decide(
    current: Option<Version>,
    lowest: Option<Version>,
    downgrade: &DowngradeInfo,
) -> Option<Version> {
    let Some(current) = current else {
        return Some(lowest.unwrap_or(Version::MIN_CLUSTER));
    };
    let lowest = lowest?;
    if downgrade.enabled {
        let target = Version::parse(&downgrade.target_version)?;
        if target == current {
            return None;
        }
        let valid = current.downgrade_target() == target && lowest.downgrade_target() == target;
        if !valid {
            tracing::error!(
                target = %downgrade.target_version,
                cluster = %current.short(),
                lowest = %lowest.short(),
                "cannot downgrade the cluster version to the downgrade's target"
            );
            return None;
        }
        return Some(target);
    }
    (current < lowest && current.may_change_to(lowest)).then_some(lowest)
}

impl Core {
    /// The cluster version in force (none: not decided yet).
    pub fn cluster_version(&self) -> Option<Version> {
        let v = self.backend.store().cluster_version()?;
        Version::parse(&v)
    }

    /// The storage version ([`Version::storage`] of the cluster version).
    pub fn storage_version(&self) -> Option<Version> {
        self.cluster_version().and_then(Version::storage)
    }

    /// Whether the cluster version, once decided, is below `v` (what a member of that version
    /// does not serve, the cluster does not either).
    pub fn cluster_below(&self, v: Version) -> bool {
        self.cluster_version().is_some_and(|c| c < v)
    }
}

/// How often the leader looks at its members' versions (etcd's `monitorVersionInterval`).
const MONITOR_INTERVAL: Duration = Duration::from_secs(4);
/// How often while the cluster version is undecided or 3.0 (a member did not answer yet).
const MONITOR_INTERVAL_UNDECIDED: Duration = Duration::from_millis(500);
/// How long one member's version may take to arrive.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// etcd's version monitor, on the leader: soon after it takes the lead and every
/// [`MONITOR_INTERVAL`] after (more often while no member's version is known), the cluster
/// version brought to what the members run or a downgrade's target, and a downgrade ended once
/// every member runs its target.
pub async fn monitor(core: Weak<Core>) {
    let mut last: Option<(u64, Instant)> = None;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let Some(c) = core.upgrade() else {
            return;
        };
        if !c.is_leader() {
            last = None;
            continue;
        }
        let term = c.node.status().term;
        let every = match c.cluster_version() {
            None | Some(Version::MIN_CLUSTER) => MONITOR_INTERVAL_UNDECIDED,
            Some(_) => MONITOR_INTERVAL,
        };
        let due = last.is_none_or(|(t, at)| t != term || at.elapsed() >= every);
        if !due {
            continue;
        }
        last = Some((term, Instant::now()));
        check(&c).await;
    }
}

async fn check(core: &Arc<Core>) {
    let versions = members_versions(core).await;
    let lowest = versions
        .iter()
        .try_fold(Version::SERVER, |low, v| v.map(|v| low.min(v)));
    let store = core.backend.store();
    let downgrade = store.downgrade();
    let current = core.cluster_version();
    if let Some(v) = decide(current, lowest, &downgrade) {
        if Some(v) != current {
            let op = Op::ClusterVersionSet(ClusterVersionSet { ver: v.full() });
            match core.propose_internal(op).await {
                Ok(_) => tracing::info!(cluster_version = %v.short(), "cluster version set"),
                Err(e) => tracing::warn!("setting the cluster version: {}", e.message()),
            }
        }
    }
    // etcd's CancelDowngradeIfNeeded: every member runs the target.
    if downgrade.enabled {
        let target = Version::parse(&downgrade.target_version);
        if target.is_some() && versions.iter().all(|&v| v == target) {
            tracing::info!(cluster_version = %downgrade.target_version, "the cluster has been downgraded");
            if let Err(e) = core
                .propose_internal(Op::DowngradeInfoSet(DowngradeInfo::default()))
                .await
            {
                tracing::warn!("ending the downgrade: {}", e.message());
            }
        }
    }
}

/// Every member's server version, this one's included (none: it did not answer).
async fn members_versions(core: &Arc<Core>) -> Vec<Option<Version>> {
    let asks: Vec<_> = (core.node.members().iter())
        .filter(|m| m.id != core.id)
        .map(|m| {
            let (core, m) = (core.clone(), m.clone());
            tokio::spawn(async move { server_version(&core, &m).await })
        })
        .collect();
    let mut out = vec![Some(Version::SERVER)];
    for a in asks {
        out.push(a.await.ok().flatten());
    }
    out
}

/// A peer's server version, from its peer port's Status (etcd asks its peers' `/version`).
async fn server_version(core: &Arc<Core>, m: &Member) -> Option<Version> {
    for url in &m.peer_urls {
        let Ok(ch) = core.peer_channel(url, ASK_TIMEOUT) else {
            continue;
        };
        match MaintenanceClient::new(ch)
            .status(core.to_leader(StatusRequest {}))
            .await
        {
            Ok(r) => return Version::parse(&r.into_inner().version),
            // A kvd member from before 3.7 serves only HashKV of Maintenance there.
            Err(s) if s.code() == tonic::Code::Unimplemented => {
                return Some(Version::KVD_BEFORE_3_7)
            }
            Err(e) => {
                tracing::debug!(peer = %m.id, %url, "asking a peer's version: {}", e.message())
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: u64, minor: u64) -> Version {
        Version { major, minor }
    }

    fn job(target: &str) -> DowngradeInfo {
        DowngradeInfo {
            enabled: true,
            target_version: target.into(),
        }
    }

    #[test]
    fn versions_parse_as_go_semver_takes_them() {
        assert_eq!(Version::parse("3.7.1"), Some(v(3, 7)));
        assert_eq!(Version::parse("3.6.0-alpha.0+git"), Some(v(3, 6)));
        for bad in ["3.7", "v3.7.0", "3.7.x", "", "3..0"] {
            assert_eq!(Version::parse(bad), None, "{bad}");
        }
        assert_eq!(v(3, 7).full(), "3.7.0");
        assert_eq!(v(3, 7).short(), "3.7");
    }

    #[test]
    fn the_cluster_version_is_decided_as_etcds_monitor_decides_it() {
        let none = DowngradeInfo::default();
        // Not decided yet: the lowest version, or 3.0 while one is unknown.
        assert_eq!(decide(None, Some(v(3, 7)), &none), Some(v(3, 7)));
        assert_eq!(decide(None, None, &none), Some(v(3, 0)));
        // Up once every member runs the higher version; never down without a downgrade.
        assert_eq!(decide(Some(v(3, 6)), Some(v(3, 7)), &none), Some(v(3, 7)));
        assert_eq!(decide(Some(v(3, 7)), Some(v(3, 6)), &none), None);
        assert_eq!(decide(Some(v(3, 6)), None, &none), None);
        assert_eq!(decide(Some(v(3, 0)), Some(v(3, 7)), &none), Some(v(3, 7)));
        // A downgrade takes it to the target, one minor down, and holds it there.
        assert_eq!(
            decide(Some(v(3, 7)), Some(v(3, 7)), &job("3.6.0")),
            Some(v(3, 6))
        );
        assert_eq!(decide(Some(v(3, 6)), Some(v(3, 7)), &job("3.6.0")), None);
        assert_eq!(decide(Some(v(3, 7)), Some(v(3, 7)), &job("3.5.0")), None);
        // Cancelled: back up to what the members run.
        assert_eq!(decide(Some(v(3, 6)), Some(v(3, 7)), &none), Some(v(3, 7)));
    }

    #[test]
    fn changes_etcd_allows() {
        assert!(v(3, 6).may_change_to(v(3, 7)));
        assert!(v(3, 7).may_change_to(v(3, 6)));
        assert!(v(3, 0).may_change_to(v(3, 7)));
        assert!(!v(3, 7).may_change_to(v(3, 5)));
        assert!(!v(3, 7).may_change_to(v(4, 0)));
    }
}
