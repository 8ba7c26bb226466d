//! etcd's `cluster` bucket: the cluster version (`clusterVersion`, set through consensus by
//! the leader's version monitor, [`Writer::set_cluster_version`]) and the downgrade job
//! (`downgrade`, etcd's `DowngradeInfo` as its JSON, [`Writer::set_downgrade`]), written with
//! the flush that carries the change, so both survive a restart and travel in snapshots.

use std::path::Path;

use api::etcdserverpb::DowngradeInfo;
use prost::Message;

use crate::error::{Error, Result};
use crate::store::{Store, Writer, CLUSTER_BUCKET, META_BUCKET};

/// The downgrade job's key in the `cluster` bucket.
pub(crate) const DOWNGRADE: &[u8] = b"downgrade";
/// The cluster version's key in the `cluster` bucket.
pub(crate) const VERSION: &[u8] = b"clusterVersion";

/// What the `cluster` bucket holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterState {
    /// The cluster version as etcd stores it (`3.7.0`); none until first decided.
    pub version: Option<String>,
    pub downgrade: DowngradeInfo,
}

/// The bucket's state, and which of it changed since the last flush.
#[derive(Debug, Default)]
pub(crate) struct ClusterCell {
    pub(crate) state: ClusterState,
    pub(crate) version_dirty: bool,
    pub(crate) downgrade_dirty: bool,
}

/// What a flush writes to the bucket: the changed values.
#[derive(Debug, Default)]
pub(crate) struct ClusterChanges {
    pub(crate) version: Option<String>,
    pub(crate) downgrade: Option<DowngradeInfo>,
}

impl ClusterCell {
    /// The changes since the last flush, taken (none: nothing changed).
    pub(crate) fn take_changes(&mut self) -> Option<ClusterChanges> {
        let c = ClusterChanges {
            version: std::mem::take(&mut self.version_dirty)
                .then(|| self.state.version.clone())
                .flatten(),
            downgrade: std::mem::take(&mut self.downgrade_dirty)
                .then(|| self.state.downgrade.clone()),
        };
        (c.version.is_some() || c.downgrade.is_some()).then_some(c)
    }
}

/// etcd's JSON of the job (`version.DowngradeInfo`).
#[derive(serde::Serialize, serde::Deserialize)]
struct Json {
    #[serde(rename = "target-version", default)]
    target_version: String,
    #[serde(default)]
    enabled: bool,
}

/// The job as the `cluster` bucket holds it.
pub(crate) fn encode_downgrade(info: &DowngradeInfo) -> Vec<u8> {
    serde_json::to_vec(&Json {
        target_version: info.target_version.clone(),
        enabled: info.enabled,
    })
    .expect("two plain fields encode")
}

/// The `cluster` bucket's state — the job, or from a file kvd wrote before it kept etcd's
/// form, the encoded `DowngradeInfo` under the `meta` bucket's `downgrade` (none: not enabled).
pub(crate) fn restore(db: &pager::Db, path: &Path) -> Result<ClusterState> {
    let tx = db.begin_read()?;
    let bad = |what: &str, e: String| Error::Corrupt {
        path: path.display().to_string(),
        reason: format!("the {what} does not decode: {e}"),
    };
    let cluster = tx.bucket(CLUSTER_BUCKET)?;
    let version = match cluster.get(VERSION)? {
        Some(v) => Some(
            std::str::from_utf8(v)
                .map_err(|e| bad("cluster version", e.to_string()))?
                .to_owned(),
        ),
        None => None,
    };
    let downgrade = if let Some(v) = cluster.get(DOWNGRADE)? {
        let j: Json = serde_json::from_slice(v).map_err(|e| bad("downgrade job", e.to_string()))?;
        DowngradeInfo {
            enabled: j.enabled,
            target_version: j.target_version,
        }
    } else {
        match tx.bucket(META_BUCKET)?.get(DOWNGRADE)? {
            Some(v) => DowngradeInfo::decode(v).map_err(|e| bad("downgrade job", e.to_string()))?,
            None => DowngradeInfo::default(),
        }
    };
    Ok(ClusterState { version, downgrade })
}

/// The cluster version a store file holds, read in `tx` (none: not set, or not text).
pub fn stored_version(tx: &pager::ReadTxn) -> Option<String> {
    let v = tx.bucket(CLUSTER_BUCKET).ok()?.get(VERSION).ok()??;
    std::str::from_utf8(v).ok().map(str::to_owned)
}

impl Writer<'_> {
    /// Sets the downgrade job (cancelled: not enabled, no target).
    pub fn set_downgrade(&mut self, info: DowngradeInfo) {
        let mut c = self.inner().cluster.lock();
        if c.state.downgrade != info {
            c.state.downgrade = info;
            c.downgrade_dirty = true;
        }
    }

    /// Sets the cluster version (etcd's `ClusterVersionSet`).
    pub fn set_cluster_version(&mut self, version: &str) {
        let mut c = self.inner().cluster.lock();
        if c.state.version.as_deref() != Some(version) {
            c.state.version = Some(version.to_owned());
            c.version_dirty = true;
        }
    }
}

impl Store {
    /// The downgrade job, as `Status` reports it.
    pub fn downgrade(&self) -> DowngradeInfo {
        self.inner.cluster.lock().state.downgrade.clone()
    }

    /// The cluster version as stored (`3.7.0`), none until first decided.
    pub fn cluster_version(&self) -> Option<String> {
        self.inner.cluster.lock().state.version.clone()
    }
}
