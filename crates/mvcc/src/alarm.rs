//! Alarms (etcd's alarm store): which member raised which alarm (NOSPACE, CORRUPT). Raising
//! and clearing are replicated writes ([`Writer`] methods); the set persists in the `alarm`
//! bucket with the flush that carries the change, so a raised alarm survives a restart and
//! travels in snapshots, as etcd's does.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use api::etcdserverpb::AlarmMember;
use ids::MemberId;
use prost::Message;

use crate::error::{Error, Result};
use crate::store::{Store, Writer, ALARM_BUCKET};

/// The alarms raised, and the changes not yet flushed (true = raised).
#[derive(Debug, Default)]
pub(crate) struct AlarmSet {
    pub(crate) raised: BTreeSet<(MemberId, i32)>,
    pub(crate) dirty: BTreeMap<(MemberId, i32), bool>,
}

/// The bucket key of an alarm: etcd's, the encoded `AlarmMember`.
pub(crate) fn key(member: MemberId, alarm: i32) -> Vec<u8> {
    AlarmMember {
        member_id: member.0,
        alarm,
    }
    .encode_to_vec()
}

/// The alarms stored in the `alarm` bucket.
pub(crate) fn restore(db: &pager::Db, path: &Path) -> Result<BTreeSet<(MemberId, i32)>> {
    let tx = db.begin_read()?;
    let mut raised = BTreeSet::new();
    for e in tx.bucket(ALARM_BUCKET)?.iter() {
        let (k, _) = e?;
        let a = AlarmMember::decode(k).map_err(|e| Error::Corrupt {
            path: path.display().to_string(),
            reason: format!("alarm bucket key {k:?} is not an alarm: {e}"),
        })?;
        raised.insert((MemberId(a.member_id), a.alarm));
    }
    Ok(raised)
}

impl Writer<'_> {
    /// Raises (`active`) or clears alarm `alarm` of `member`; whether that changed anything.
    pub fn alarm(&mut self, member: MemberId, alarm: i32, active: bool) -> bool {
        let mut a = self.inner().alarms.lock();
        let changed = if active {
            a.raised.insert((member, alarm))
        } else {
            a.raised.remove(&(member, alarm))
        };
        if changed {
            a.dirty.insert((member, alarm), active);
        }
        changed
    }
}

impl Store {
    /// The alarms raised: (member, alarm type), in order.
    pub fn alarms(&self) -> Vec<(MemberId, i32)> {
        self.inner.alarms.lock().raised.iter().copied().collect()
    }

    /// Whether any member raised alarm type `alarm` (checked on every write: no copy).
    pub fn has_alarm(&self, alarm: i32) -> bool {
        self.inner
            .alarms
            .lock()
            .raised
            .iter()
            .any(|&(_, a)| a == alarm)
    }
}
