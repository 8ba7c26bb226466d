//! The member's identity in its WAL's metadata (cluster id and member id, which a restart must
//! keep whatever its flags say), and the log a new member starts from.

use std::fs;

use raft::eraftpb::{ConfState, HardState};

use crate::codec::{put_u64, Reader};
use crate::member::{Member, Members};
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

/// A member's log carried over from another server's (`kvd migrate`): who the member is, the
/// snapshot its state machine's data stands at, its hard state and the entries after the
/// snapshot.
#[derive(Debug, Clone)]
pub struct ImportedLog {
    pub member: MemberId,
    pub cluster: ClusterId,
    pub snapshot: SnapMeta,
    pub hard_state: HardState,
    pub entries: Vec<ImportedEntry>,
}

/// An entry of a log carried over from another server's, as kvd's log holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportedEntry {
    pub index: u64,
    pub term: u64,
    pub op: ImportedOp,
}

/// What an imported entry does.
#[derive(Debug, Clone, PartialEq)]
pub enum ImportedOp {
    /// Nothing (raft's own entry, or a request with nothing to apply here).
    Empty,
    /// A request for the state machine (its encoding).
    Proposal(Vec<u8>),
    /// A member's name or URLs changed.
    MemberUpdate(Member),
    /// A voter added, or a learner promoted.
    AddMember(Member),
    AddLearner(Member),
    Remove(MemberId),
    /// raft's leaving of a joint configuration.
    LeaveJoint,
}

impl ImportedEntry {
    fn to_raft(&self) -> raft::eraftpb::Entry {
        use crate::node::{context, TAG_CONF, TAG_MEMBER_UPDATE, TAG_PROPOSAL};
        use raft::eraftpb::{ConfChangeSingle, ConfChangeType, ConfChangeV2, Entry, EntryType};
        let mut e = Entry {
            index: self.index,
            term: self.term,
            ..Default::default()
        };
        let conf = |e: &mut Entry, kind: Option<(ConfChangeType, MemberId)>, m: Option<&Member>| {
            let mut cc = ConfChangeV2::default();
            if let Some((kind, id)) = kind {
                let mut single = ConfChangeSingle::default();
                single.set_change_type(kind);
                single.node_id = id.0;
                cc.mut_changes().push(single);
                e.context = context(TAG_CONF, 0, 0, m).into();
            }
            e.set_entry_type(EntryType::EntryConfChangeV2);
            e.data = protobuf::Message::write_to_bytes(&cc)
                .expect("a conf change encodes")
                .into();
        };
        match &self.op {
            ImportedOp::Empty => {}
            ImportedOp::Proposal(data) => {
                e.data = data.clone().into();
                e.context = context(TAG_PROPOSAL, 0, 0, None).into();
            }
            ImportedOp::MemberUpdate(m) => {
                e.context = context(TAG_MEMBER_UPDATE, 0, 0, Some(m)).into();
            }
            ImportedOp::AddMember(m) => {
                conf(&mut e, Some((ConfChangeType::AddNode, m.id)), Some(m))
            }
            ImportedOp::AddLearner(m) => conf(
                &mut e,
                Some((ConfChangeType::AddLearnerNode, m.id)),
                Some(m),
            ),
            ImportedOp::Remove(id) => conf(&mut e, Some((ConfChangeType::RemoveNode, *id)), None),
            ImportedOp::LeaveJoint => conf(&mut e, None, None),
        }
        e
    }
}

/// Writes `log` as the log of the member directory `dir`, which must hold none: the WAL (in a
/// temporary directory renamed into place) and the snapshot file. The member then starts from
/// it as from its own.
pub fn write_imported_log(dir: &std::path::Path, log: &ImportedLog) -> Result<()> {
    let io = |op: &'static str, path: &std::path::Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { op, path, source }
    };
    let (wal_dir, tmp) = (dir.join("wal"), dir.join("wal.tmp"));
    if wal_dir.exists() {
        return Err(Error::Io {
            op: "create a log in",
            path: wal_dir,
            source: std::io::Error::from(std::io::ErrorKind::AlreadyExists),
        });
    }
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(io("remove", &tmp))?;
    }
    Snapshotter::new(dir.join("snap"))?.save(&log.snapshot)?;
    let mut wal = Wal::create(
        &tmp,
        &encode_meta(log.cluster, log.member),
        crate::wal::Options::default(),
    )?;
    wal.save_snapshot(SnapshotMark {
        index: RaftIndex(log.snapshot.index),
        term: log.snapshot.term,
    })?;
    let entries: Vec<raft::eraftpb::Entry> =
        log.entries.iter().map(ImportedEntry::to_raft).collect();
    wal.save(Some(&log.hard_state), &entries, true)?;
    drop(wal);
    fs::rename(&tmp, &wal_dir).map_err(io("rename a new log to", &wal_dir))?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("sync", dir))
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
