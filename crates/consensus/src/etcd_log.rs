//! etcd's raft log on disk, read as etcd reads it when it starts: the snapshot files in
//! `member/snap` and the WAL segments in `member/wal`. For `kvd migrate`, which carries an etcd
//! member's log over into kvd's.
//!
//! A WAL segment `{seq:016x}-{index:016x}.wal` is a sequence of frames: a little-endian u64 —
//! the record's length in its low 56 bits, and when its top bit is set, the padding to 8 bytes
//! in bits 56–58 — then the record, a `walpb.Record` (type, crc, data), then the padding. A
//! zero length ends the segment (preallocated space). The crc of each record is a CRC-32C
//! running over the data of every record since the segment chain began; a `crc` record at the
//! start of each segment carries it over. A snapshot file is a `snappb.Snapshot` (a CRC-32C
//! and a `raftpb.Snapshot`).
//!
//! As etcd: the newest snapshot file the WAL also records is where the log starts; entries
//! after it are read, a later entry replacing those from its index on; a record torn by a crash
//! at the end of the last segment is cut off (etcd repairs that); any other damage, a conflict
//! of the segments' metadata, or a gap in the log is an error naming the file.

use std::fs;
use std::path::{Path, PathBuf};

use ids::{ClusterId, MemberId};
use prost::Message as _;
use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};

const METADATA: i64 = 1;
const ENTRY: i64 = 2;
const STATE: i64 = 3;
const CRC: i64 = 4;
const SNAPSHOT: i64 = 5;
const SECTOR: usize = 512;

#[derive(Clone, PartialEq, prost::Message)]
struct Record {
    #[prost(int64, tag = "1")]
    kind: i64,
    #[prost(uint32, tag = "2")]
    crc: u32,
    #[prost(bytes = "vec", tag = "3")]
    data: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct WalSnapshot {
    #[prost(uint64, tag = "1")]
    index: u64,
    #[prost(uint64, tag = "2")]
    term: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SnapFile {
    #[prost(uint32, tag = "1")]
    crc: u32,
    #[prost(bytes = "vec", tag = "2")]
    data: Vec<u8>,
}

/// etcd's `raftpb.ConfChange` (its change types are not raft-rs's: read as numbers).
#[derive(Clone, PartialEq, prost::Message)]
struct EtcdConfChange {
    #[prost(int32, tag = "2")]
    kind: i32,
    #[prost(uint64, tag = "3")]
    node_id: u64,
    #[prost(bytes = "vec", tag = "4")]
    context: Vec<u8>,
}

/// etcd's membership change types (`raftpb.ConfChangeType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcdChange {
    AddNode,
    RemoveNode,
    /// A member's peer URLs changed.
    UpdateNode,
    AddLearnerNode,
}

/// What an entry of etcd's log holds.
#[derive(Debug, Clone, PartialEq)]
pub enum EtcdEntryKind {
    /// A request (an `InternalRaftRequest`, or before 3.5 a v2 `Request`); empty: raft's own.
    Normal(Vec<u8>),
    /// A membership change, with etcd's JSON of the member as its context.
    ConfChange {
        change: EtcdChange,
        node: u64,
        context: Vec<u8>,
    },
    /// A raft `ConfChangeV2` (etcd makes none but raft's empty one leaving a joint
    /// configuration): its bytes.
    ConfChangeV2(Vec<u8>),
}

/// One entry of etcd's log.
#[derive(Debug, Clone, PartialEq)]
pub struct EtcdEntry {
    pub index: u64,
    pub term: u64,
    pub kind: EtcdEntryKind,
}

impl EtcdEntry {
    fn from_raft(e: Entry, path: &Path) -> Result<EtcdEntry, EtcdLogError> {
        use raft::eraftpb::EntryType;
        let kind = match e.get_entry_type() {
            EntryType::EntryNormal => EtcdEntryKind::Normal(e.data.to_vec()),
            EntryType::EntryConfChange => {
                let cc = EtcdConfChange::decode(&e.data[..])
                    .map_err(|err| damaged(path, format!("entry {}: {err}", e.index)))?;
                let change = match cc.kind {
                    0 => EtcdChange::AddNode,
                    1 => EtcdChange::RemoveNode,
                    2 => EtcdChange::UpdateNode,
                    3 => EtcdChange::AddLearnerNode,
                    k => {
                        return Err(damaged(
                            path,
                            format!("entry {}: a membership change of unknown type {k}", e.index),
                        ))
                    }
                };
                EtcdEntryKind::ConfChange {
                    change,
                    node: cc.node_id,
                    context: cc.context,
                }
            }
            EntryType::EntryConfChangeV2 => EtcdEntryKind::ConfChangeV2(e.data.to_vec()),
        };
        Ok(EtcdEntry {
            index: e.index,
            term: e.term,
            kind,
        })
    }
}

#[derive(Clone, PartialEq, prost::Message)]
struct Metadata {
    #[prost(uint64, tag = "1")]
    node_id: u64,
    #[prost(uint64, tag = "2")]
    cluster_id: u64,
}

/// What is wrong with an etcd member's log.
#[derive(Debug, thiserror::Error)]
pub enum EtcdLogError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Damaged { path: PathBuf, reason: String },
    #[error("{dir}: {reason}")]
    Log { dir: PathBuf, reason: String },
}

/// An etcd member's log as etcd would start from it.
#[derive(Debug, Clone)]
pub struct EtcdLog {
    pub member: MemberId,
    pub cluster: ClusterId,
    /// The snapshot the log starts after: index, term, configuration (0, 0 and empty when
    /// the member never took one).
    pub snapshot: (u64, u64, ConfState),
    pub hard_state: HardState,
    /// The entries after the snapshot.
    pub entries: Vec<EtcdEntry>,
    /// A torn record cut off the end of the last segment: the segment and where it was cut.
    pub torn: Option<(PathBuf, u64)>,
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> EtcdLogError + 'a {
    move |source| EtcdLogError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

fn damaged(path: &Path, reason: impl Into<String>) -> EtcdLogError {
    EtcdLogError::Damaged {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// The files in `dir` named `{hex}-{hex}.{ext}`, with the two numbers, sorted by them.
fn numbered(dir: &Path, ext: &str) -> Result<Vec<(u64, u64, PathBuf)>, EtcdLogError> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).map_err(io("read", dir))? {
        let e = e.map_err(io("read", dir))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(ext) else {
            continue;
        };
        let parsed = stem.split_once('-').and_then(|(a, b)| {
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        });
        if let Some((a, b)) = parsed {
            out.push((a, b, e.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Reads the snapshot file at `path`: index, term and configuration.
fn read_snap(path: &Path) -> Result<(u64, u64, ConfState), EtcdLogError> {
    let b = fs::read(path).map_err(io("read", path))?;
    let f = SnapFile::decode(b.as_slice()).map_err(|e| damaged(path, e.to_string()))?;
    if f.data.is_empty() || f.crc == 0 {
        return Err(damaged(path, "an empty snapshot"));
    }
    if crc32c::crc32c(&f.data) != f.crc {
        return Err(damaged(path, "its checksum does not match"));
    }
    let s = Snapshot::parse_from_bytes(&f.data).map_err(|e| damaged(path, e.to_string()))?;
    let m = s.get_metadata();
    Ok((m.index, m.term, m.get_conf_state().clone()))
}

/// What [`scan`] calls with each record: its segment, type and data.
type Visit<'a> = dyn FnMut(&Path, i64, &[u8]) -> Result<(), EtcdLogError> + 'a;

/// Calls `visit` with every record of the segments, in order, checking the CRC chain; cuts a
/// torn record at the end of the last segment (returned).
fn scan(
    segments: &[PathBuf],
    visit: &mut Visit<'_>,
) -> Result<Option<(PathBuf, u64)>, EtcdLogError> {
    let mut crc = 0u32;
    for (n, path) in segments.iter().enumerate() {
        let last = n + 1 == segments.len();
        let b = fs::read(path).map_err(io("read", path))?;
        let mut off = 0usize;
        while off + 8 <= b.len() {
            let len = u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"));
            if len == 0 {
                break;
            }
            let rec_len = (len & 0x00ff_ffff_ffff_ffff) as usize;
            let pad = if len >> 63 == 1 {
                ((len >> 56) & 0x7) as usize
            } else {
                0
            };
            let start = off + 8;
            let torn = |end: usize| -> bool {
                // As etcd: a frame one of whose disk sectors is all zeros was written part way.
                let end = end.min(b.len());
                let mut s = start;
                while s < end {
                    let e = ((s / SECTOR) + 1) * SECTOR;
                    let e = e.min(end);
                    if b[s..e].iter().all(|&x| x == 0) {
                        return true;
                    }
                    s = e;
                }
                false
            };
            let cut = |reason: &str| -> Result<Option<(PathBuf, u64)>, EtcdLogError> {
                if last {
                    Ok(Some((path.clone(), off as u64)))
                } else {
                    Err(damaged(
                        path,
                        format!("{reason} at offset {off}, in a segment that is not the last"),
                    ))
                }
            };
            let Some(end) = start.checked_add(rec_len).filter(|e| e + pad <= b.len()) else {
                return cut("a record runs past the end of the file");
            };
            let rec = match Record::decode(&b[start..end]) {
                Ok(r) => r,
                Err(e) if last && torn(end + pad) => {
                    tracing::debug!("torn record: {e}");
                    return cut("a torn record");
                }
                Err(e) => {
                    return Err(damaged(
                        path,
                        format!("a record at offset {off} does not decode: {e}"),
                    ))
                }
            };
            if rec.kind == CRC {
                if crc != 0 && rec.crc != crc {
                    return Err(damaged(path, format!("the CRC carried over at offset {off} does not match the segment before")));
                }
                crc = rec.crc;
            } else {
                let next = crc32c::crc32c_append(crc, &rec.data);
                if next != rec.crc {
                    if last && torn(end + pad) {
                        return cut("a torn record");
                    }
                    return Err(damaged(
                        path,
                        format!("the record at offset {off} fails its CRC check"),
                    ));
                }
                crc = next;
            }
            visit(path, rec.kind, &rec.data)?;
            off = end + pad;
        }
    }
    Ok(None)
}

/// Reads the log of the etcd member whose directory is `member_dir` (`<data-dir>/member`).
pub fn read_etcd_log(member_dir: &Path) -> Result<EtcdLog, EtcdLogError> {
    let wal_dir = member_dir.join("wal");
    let snap_dir = member_dir.join("snap");
    let log_err = |reason: String| EtcdLogError::Log {
        dir: wal_dir.clone(),
        reason,
    };
    let segments = numbered(&wal_dir, ".wal")?;
    if segments.is_empty() {
        return Err(log_err("no WAL segment (*.wal)".into()));
    }
    for w in segments.windows(2) {
        if w[1].0 != w[0].0 + 1 {
            return Err(log_err(format!(
                "segment {} follows {}: one is missing",
                w[1].0, w[0].0
            )));
        }
    }
    // The snapshots the WAL records, up to its commit index (etcd's ValidSnapshotEntries).
    let paths: Vec<PathBuf> = segments.iter().map(|s| s.2.clone()).collect();
    let mut recorded = Vec::new();
    let mut state = HardState::default();
    scan(&paths, &mut |path, kind, data| {
        match kind {
            SNAPSHOT => {
                let s = WalSnapshot::decode(data).map_err(|e| damaged(path, e.to_string()))?;
                recorded.push((s.index, s.term));
            }
            STATE => {
                state =
                    HardState::parse_from_bytes(data).map_err(|e| damaged(path, e.to_string()))?;
            }
            _ => {}
        }
        Ok(())
    })?;
    recorded.retain(|&(i, _)| i <= state.commit);
    // The newest snapshot file the WAL records.
    let mut snapshot = (0, 0, ConfState::default());
    let snaps = if snap_dir.exists() {
        numbered(&snap_dir, ".snap")?
    } else {
        Vec::new()
    };
    for (term, index, path) in snaps.iter().rev() {
        if !recorded.contains(&(*index, *term)) {
            continue;
        }
        match read_snap(path) {
            Ok(s) if (s.0, s.1) == (*index, *term) => {
                snapshot = s;
                break;
            }
            Ok(_) => {
                return Err(damaged(
                    path,
                    "its name and its content name different entries",
                ))
            }
            // As etcd: a damaged snapshot file is passed over for an older one.
            Err(e) => tracing::warn!("{e}; trying an older snapshot"),
        }
    }
    // The segments from the last one starting at or before the snapshot (etcd's searchIndex).
    let first = segments
        .iter()
        .rposition(|s| s.1 <= snapshot.0)
        .ok_or_else(|| {
            log_err(format!(
                "no segment holds the log from index {} on (purged?)",
                snapshot.0
            ))
        })?;
    if snapshot.0 == 0 && segments[first].0 != 0 {
        return Err(log_err(
            "the first segments are gone and there is no snapshot to start from".into(),
        ));
    }
    let mut meta: Option<Vec<u8>> = None;
    let mut entries: Vec<EtcdEntry> = Vec::new();
    let mut matched = snapshot.0 == 0;
    let start = snapshot.0;
    let torn = scan(&paths[first..], &mut |path, kind, data| {
        match kind {
            ENTRY => {
                let e = Entry::parse_from_bytes(data).map_err(|e| damaged(path, e.to_string()))?;
                if e.index > start {
                    let at = (e.index - start - 1) as usize;
                    if at > entries.len() {
                        return Err(damaged(
                            path,
                            format!(
                                "entry {} leaves a gap after entry {}",
                                e.index,
                                start + entries.len() as u64
                            ),
                        ));
                    }
                    entries.truncate(at);
                    entries.push(EtcdEntry::from_raft(e, path)?);
                }
            }
            STATE => {
                state =
                    HardState::parse_from_bytes(data).map_err(|e| damaged(path, e.to_string()))?;
            }
            METADATA => match &meta {
                Some(m) if m.as_slice() != data => {
                    return Err(damaged(
                        path,
                        "its metadata differs from an earlier segment's",
                    ));
                }
                _ => meta = Some(data.to_vec()),
            },
            CRC => {}
            SNAPSHOT => {
                let s = WalSnapshot::decode(data).map_err(|e| damaged(path, e.to_string()))?;
                if s.index == start {
                    if s.term != snapshot.1 {
                        return Err(damaged(path, format!("it records the snapshot at {} with term {}, the snapshot file term {}", s.index, s.term, snapshot.1)));
                    }
                    matched = true;
                }
            }
            other => return Err(damaged(path, format!("a record of unknown type {other}"))),
        }
        Ok(())
    })?;
    if !matched {
        return Err(log_err(format!(
            "the WAL does not record the snapshot at index {start}"
        )));
    }
    let meta = meta.ok_or_else(|| log_err("no metadata record".into()))?;
    let m = Metadata::decode(meta.as_slice())
        .map_err(|e| log_err(format!("the metadata does not decode: {e}")))?;
    if m.node_id == 0 || m.cluster_id == 0 {
        return Err(log_err("the metadata names no member or cluster".into()));
    }
    Ok(EtcdLog {
        member: MemberId(m.node_id),
        cluster: ClusterId(m.cluster_id),
        snapshot,
        hard_state: state,
        entries,
        torn,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames `records` as etcd's encoder does, the CRC running from `crc`.
    fn segment(records: &[(i64, Vec<u8>)], mut crc: u32) -> Vec<u8> {
        let mut out = Vec::new();
        for (kind, data) in records {
            if *kind == CRC {
                crc = u32::from_le_bytes(data[..4].try_into().unwrap());
            }
            let rec = if *kind == CRC {
                Record {
                    kind: CRC,
                    crc,
                    data: Vec::new(),
                }
            } else {
                crc = crc32c::crc32c_append(crc, data);
                Record {
                    kind: *kind,
                    crc,
                    data: data.clone(),
                }
            };
            let b = rec.encode_to_vec();
            let pad = (8 - b.len() % 8) % 8;
            let mut len = b.len() as u64;
            if pad > 0 {
                len |= (0x80 | pad as u64) << 56;
            }
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&b);
            out.extend(std::iter::repeat_n(0, pad));
        }
        out
    }

    fn entry(index: u64, term: u64, data: &[u8]) -> (i64, Vec<u8>) {
        let e = Entry {
            index,
            term,
            data: data.to_vec().into(),
            ..Default::default()
        };
        (ENTRY, e.write_to_bytes().unwrap())
    }

    fn state(term: u64, commit: u64) -> (i64, Vec<u8>) {
        let hs = HardState {
            term,
            commit,
            vote: 1,
            ..Default::default()
        };
        (STATE, hs.write_to_bytes().unwrap())
    }

    fn write(dir: &Path, seg: Vec<u8>) -> PathBuf {
        let wal = dir.join("member/wal");
        std::fs::create_dir_all(&wal).unwrap();
        let path = wal.join("0000000000000000-0000000000000000.wal");
        let mut b = seg;
        b.resize(b.len() + 4096, 0); // preallocated space
        std::fs::write(&path, b).unwrap();
        path
    }

    fn records() -> Vec<(i64, Vec<u8>)> {
        let meta = Metadata {
            node_id: 7,
            cluster_id: 9,
        };
        vec![
            (CRC, 0u32.to_le_bytes().to_vec()),
            (METADATA, meta.encode_to_vec()),
            (SNAPSHOT, WalSnapshot::default().encode_to_vec()),
            entry(1, 1, b"a"),
            entry(2, 1, b"b"),
            entry(3, 1, b"c"),
            // A new leader overwrote entry 3 on.
            entry(3, 2, b"C"),
            entry(4, 2, &[b'x'; 700]),
            state(2, 4),
        ]
    }

    #[test]
    fn a_log_reads_as_etcd_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), segment(&records(), 0));
        let log = read_etcd_log(&dir.path().join("member")).unwrap();
        assert_eq!((log.member, log.cluster), (MemberId(7), ClusterId(9)));
        assert_eq!((log.hard_state.term, log.hard_state.commit), (2, 4));
        let got: Vec<(u64, u64)> = log.entries.iter().map(|e| (e.index, e.term)).collect();
        assert_eq!(got, [(1, 1), (2, 1), (3, 2), (4, 2)]);
        assert_eq!(log.entries[2].kind, EtcdEntryKind::Normal(b"C".to_vec()));
        assert!(log.torn.is_none());
    }

    #[test]
    fn a_torn_tail_is_cut_and_other_damage_refused() {
        let dir = tempfile::tempdir().unwrap();
        let good = segment(&records(), 0);
        // The 700-byte entry crosses a sector boundary: its last sector zeroed is a torn write.
        let mut torn = good.clone();
        let last_entry_end = good.len() - 32;
        let sector = (last_entry_end - 1) / SECTOR * SECTOR;
        torn[sector..].fill(0);
        write(dir.path(), torn);
        let log = read_etcd_log(&dir.path().join("member")).unwrap();
        assert!(log.torn.is_some());
        assert_eq!(log.entries.last().map(|e| e.index), Some(3));

        let mut flipped = good.clone();
        flipped[100] ^= 1;
        write(dir.path(), flipped);
        let err = read_etcd_log(&dir.path().join("member"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("CRC") || err.contains("decode"), "{err}");

        let mut gap = records();
        gap.insert(4, entry(9, 1, b"far"));
        write(dir.path(), segment(&gap, 0));
        let err = read_etcd_log(&dir.path().join("member"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("gap"), "{err}");
    }
}
