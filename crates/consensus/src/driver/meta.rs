//! The member's identity in its WAL's metadata (cluster id and member id, which a restart must
//! keep whatever its flags say), and the log a new member starts from.

use std::fs;

use raft::eraftpb::{ConfState, HardState};

use crate::codec::{put_u64, Reader};
use crate::member::Members;
use crate::node::{Config, Error, Result, Start};
use crate::snap::{SnapMeta, Snapshotter};
use crate::wal::{SnapshotMark, Wal};
use ids::{ClusterId, MemberId, RaftIndex};

/// The position of the snapshot a new cluster starts from (its configuration, no data).
pub(super) const BOOTSTRAP_INDEX: u64 = 1;

/// The WAL metadata of a member: its cluster id and its member id.
fn encode_meta(cluster_id: ClusterId, member_id: MemberId) -> Vec<u8> {
    let mut v = Vec::with_capacity(16);
    put_u64(&mut v, cluster_id.0);
    put_u64(&mut v, member_id.0);
    v
}

/// The member and cluster whose log is in the member directory `dir`, if it holds one: what a
/// restarting server must use, whatever its flags say now.
pub fn existing_member(dir: &std::path::Path) -> Result<Option<(MemberId, ClusterId)>> {
    let wal_dir = dir.join("wal");
    if !wal_dir.exists() {
        return Ok(None);
    }
    match decode_meta(&Wal::read_metadata(&wal_dir)?) {
        Some(ids) => Ok(Some(ids)),
        None => Err(Error::ForeignWal { dir: wal_dir }),
    }
}

/// The ids `encode_meta` wrote, or `None` for metadata that is not kvd's.
pub(super) fn decode_meta(b: &[u8]) -> Option<(MemberId, ClusterId)> {
    let mut r = Reader::new(b, "WAL metadata");
    let cluster = ClusterId(r.u64().ok()?);
    let member = MemberId(r.u64().ok()?);
    r.finish().ok()?;
    Some((member, cluster))
}

/// Creates the log of a member that has none, in a temporary directory renamed into place, so
/// a crash half-way leaves no log rather than half a one.
pub(super) fn bootstrap(cfg: &Config, start: &Start, snapshotter: &Snapshotter) -> Result<()> {
    let tmp = cfg.dir.join("wal.tmp");
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(|source| Error::Io {
            op: "remove",
            path: tmp.clone(),
            source,
        })?;
    }
    let mut wal = Wal::create(&tmp, &encode_meta(cfg.cluster_id, cfg.id), cfg.wal)?;
    match start {
        Start::NewCluster(members) => {
            if !members.iter().any(|m| m.id == cfg.id) {
                return Err(Error::NotInInitialCluster(cfg.id));
            }
            let members = Members::new(members.iter().cloned());
            let mut cs = ConfState::default();
            for m in members.iter() {
                if m.is_learner {
                    cs.learners.push(m.id.0);
                } else {
                    cs.voters.push(m.id.0);
                }
            }
            snapshotter.save(&SnapMeta {
                index: BOOTSTRAP_INDEX,
                term: 1,
                conf_state: cs,
                members,
            })?;
            wal.save_snapshot(SnapshotMark {
                index: RaftIndex(BOOTSTRAP_INDEX),
                term: 1,
            })?;
            let hs = HardState {
                term: 1,
                commit: BOOTSTRAP_INDEX,
                ..Default::default()
            };
            wal.save(Some(&hs), &[], true)?;
        }
        Start::Join(_) => {}
    }
    drop(wal);
    let dst = cfg.dir.join("wal");
    fs::rename(&tmp, &dst).map_err(|source| Error::Io {
        op: "rename a new log to",
        path: dst.clone(),
        source,
    })?;
    fs::File::open(&cfg.dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| Error::Io {
            op: "sync",
            path: cfg.dir.clone(),
            source,
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wal_metadata_holds_both_ids_and_nothing_else() {
        let b = encode_meta(ClusterId(0x1234_5678_9abc_def0), MemberId(0x42));
        assert_eq!(b.len(), 16);
        assert_eq!(
            decode_meta(&b),
            Some((MemberId(0x42), ClusterId(0x1234_5678_9abc_def0)))
        );
        assert_eq!(decode_meta(&b[..15]), None);
        let mut longer = b.clone();
        longer.push(0);
        assert_eq!(decode_meta(&longer), None);
        assert_eq!(decode_meta(b""), None);
    }
}
