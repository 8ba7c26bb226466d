//! The cluster's downgrade job (etcd's `DowngradeInfo`): enabled and cancelled through
//! consensus ([`Writer::set_downgrade`]), kept in the `meta` bucket under `downgrade` with the
//! flush that carries the change, so it survives a restart and travels in snapshots.

use std::path::Path;

use api::etcdserverpb::DowngradeInfo;
use prost::Message;

use crate::error::{Error, Result};
use crate::store::{Store, Writer, META_BUCKET};

/// Its key in the `meta` bucket; the value is the encoded `DowngradeInfo`.
pub(crate) const KEY: &[u8] = b"downgrade";

/// The job, and whether it changed since the last flush.
#[derive(Debug, Default)]
pub(crate) struct DowngradeState {
    pub(crate) info: DowngradeInfo,
    pub(crate) dirty: bool,
}

/// The job stored in the `meta` bucket (none: not enabled).
pub(crate) fn restore(db: &pager::Db, path: &Path) -> Result<DowngradeInfo> {
    let tx = db.begin_read()?;
    let Some(v) = tx.bucket(META_BUCKET)?.get(KEY)? else {
        return Ok(DowngradeInfo::default());
    };
    DowngradeInfo::decode(v).map_err(|e| Error::Corrupt {
        path: path.display().to_string(),
        reason: format!("the downgrade job in the meta bucket does not decode: {e}"),
    })
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
