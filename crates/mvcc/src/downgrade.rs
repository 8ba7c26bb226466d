//! The cluster's downgrade job (etcd's `DowngradeInfo`): enabled and cancelled through
//! consensus ([`Writer::set_downgrade`]), kept where etcd keeps it — the `cluster` bucket's
//! `downgrade` key, as etcd's JSON — with the flush that carries the change, so it survives a
//! restart and travels in snapshots.

use std::path::Path;

use api::etcdserverpb::DowngradeInfo;
use prost::Message;

use crate::error::{Error, Result};
use crate::store::{Store, Writer, CLUSTER_BUCKET, META_BUCKET};

/// Its key in the `cluster` bucket.
pub(crate) const KEY: &[u8] = b"downgrade";

/// The job, and whether it changed since the last flush.
#[derive(Debug, Default)]
pub(crate) struct DowngradeState {
    pub(crate) info: DowngradeInfo,
    pub(crate) dirty: bool,
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
pub(crate) fn encode(info: &DowngradeInfo) -> Vec<u8> {
    serde_json::to_vec(&Json {
        target_version: info.target_version.clone(),
        enabled: info.enabled,
    })
    .expect("two plain fields encode")
}

/// The job stored in the `cluster` bucket — or, from a file kvd wrote before it kept etcd's
/// form, the encoded `DowngradeInfo` under the `meta` bucket's `downgrade` (none: not enabled).
pub(crate) fn restore(db: &pager::Db, path: &Path) -> Result<DowngradeInfo> {
    let tx = db.begin_read()?;
    let bad = |e: String| Error::Corrupt {
        path: path.display().to_string(),
        reason: format!("the downgrade job does not decode: {e}"),
    };
    if let Some(v) = tx.bucket(CLUSTER_BUCKET)?.get(KEY)? {
        let j: Json = serde_json::from_slice(v).map_err(|e| bad(e.to_string()))?;
        return Ok(DowngradeInfo {
            enabled: j.enabled,
            target_version: j.target_version,
        });
    }
    match tx.bucket(META_BUCKET)?.get(KEY)? {
        Some(v) => DowngradeInfo::decode(v).map_err(|e| bad(e.to_string())),
        None => Ok(DowngradeInfo::default()),
    }
}

impl Writer<'_> {
    /// Sets the downgrade job (cancelled: not enabled, no target).
    pub fn set_downgrade(&mut self, info: DowngradeInfo) {
        let mut d = self.inner().downgrade.lock();
        if d.info != info {
            d.info = info;
            d.dirty = true;
        }
    }
}

impl Store {
    /// The downgrade job, as `Status` reports it.
    pub fn downgrade(&self) -> DowngradeInfo {
        self.inner.downgrade.lock().info.clone()
    }
}
