//! Snapshot files in `<member dir>/snap/`.
//!
//! The state machine keeps its own state on disk (kvd's pager file), so a raft snapshot here is
//! small: `{term:016x}-{index:016x}.snap` records the position, the raft configuration and the
//! member list at `index`, CRC-protected, once the state machine has made everything up to
//! `index` durable. The state machine's data only travels when a follower needs it:
//! `{index:016x}.spool` is a copy of the state at `index` being sent to followers, and
//! `{index:016x}.recv` one received from the leader, kept until the state machine has restored
//! it (so a crash in between restores it again at restart).

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use protobuf::Message as _;
use raft::eraftpb::ConfState;

use crate::codec::{put_bytes, put_u64, Reader};
use crate::member::Members;

const MAGIC: &[u8; 8] = b"KVDSNAP1";

/// What a snapshot file records.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SnapMeta {
    pub index: u64,
    pub term: u64,
    pub conf_state: ConfState,
    pub members: Members,
}

/// What went wrong with a snapshot file.
#[derive(Debug, thiserror::Error)]
pub enum SnapError {
    #[error("snap: {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("snap: {path} is corrupt: {reason}; refusing to start (restore the member from a backup or remove and re-add it)")]
    Corrupt { path: PathBuf, reason: String },
    #[error("snap: no snapshot file for index {index} in {dir} although the WAL records one; refusing to start")]
    Missing { dir: PathBuf, index: u64 },
}

fn io<T>(op: &'static str, path: &Path, r: io::Result<T>) -> Result<T, SnapError> {
    r.map_err(|source| SnapError::Io {
        op,
        path: path.to_path_buf(),
        source,
    })
}

impl SnapMeta {
    /// The bytes carried in a raft snapshot message's `data` (members; the rest is metadata).
    pub(crate) fn envelope(members: &Members) -> Vec<u8> {
        members.encode()
    }

    fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        put_u64(&mut body, self.index);
        put_u64(&mut body, self.term);
        let cs = self.conf_state.write_to_bytes().unwrap_or_default();
        put_bytes(&mut body, &cs);
        put_bytes(&mut body, &self.members.encode());
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    fn decode(buf: &[u8]) -> Result<SnapMeta, String> {
        if buf.len() < 12 || &buf[..8] != MAGIC {
            return Err("not a kvd snapshot file".into());
        }
        let crc = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]);
        let body = &buf[12..];
        if crc32c::crc32c(body) != crc {
            return Err("checksum mismatch".into());
        }
        let mut r = Reader::new(body, "snapshot file");
        let bad = |e: crate::codec::Malformed| e.to_string();
        let index = r.u64().map_err(bad)?;
        let term = r.u64().map_err(bad)?;
        let conf_state =
            ConfState::parse_from_bytes(r.bytes().map_err(bad)?).map_err(|e| e.to_string())?;
        let members = Members::decode(r.bytes().map_err(bad)?).map_err(bad)?;
        r.finish().map_err(bad)?;
        Ok(SnapMeta {
            index,
            term,
            conf_state,
            members,
        })
    }
}

/// The `snap/` directory.
#[derive(Debug, Clone)]
pub struct Snapshotter {
    dir: PathBuf,
}

fn parse_name(name: &str) -> Option<(u64, u64)> {
    let stem = name.strip_suffix(".snap")?;
    let (t, i) = stem.split_once('-')?;
    Some((
        u64::from_str_radix(t, 16).ok()?,
        u64::from_str_radix(i, 16).ok()?,
    ))
}

/// Writes `path` whole or not at all: a temporary file, fsynced, renamed, the directory fsynced.
pub(crate) fn write_atomic(path: &Path, data: &mut dyn Read) -> Result<u64, SnapError> {
    let tmp = path.with_extension("tmp");
    let mut f = io("create", &tmp, File::create(&tmp))?;
    let n = io("write", &tmp, io::copy(data, &mut f))?;
    io("flush", &tmp, f.flush())?;
    io("fsync", &tmp, f.sync_all())?;
    io("rename", path, fs::rename(&tmp, path))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    io("fsync", dir, File::open(dir).and_then(|d| d.sync_all()))?;
    Ok(n)
}

impl Snapshotter {
    pub fn new(dir: impl AsRef<Path>) -> Result<Snapshotter, SnapError> {
        let dir = dir.as_ref().to_path_buf();
        io("create", &dir, fs::create_dir_all(&dir))?;
        Ok(Snapshotter { dir })
    }

    fn path(&self, index: u64, term: u64) -> PathBuf {
        self.dir.join(format!("{term:016x}-{index:016x}.snap"))
    }

    /// The copy of the state machine's data at `index` offered to followers.
    pub fn spool_path(&self, index: u64) -> PathBuf {
        self.dir.join(format!("{index:016x}.spool"))
    }

    /// A copy of the state machine's data at `index` received from the leader.
    pub fn recv_path(&self, index: u64) -> PathBuf {
        self.dir.join(format!("{index:016x}.recv"))
    }

    /// Saves a snapshot file, durable on return.
    pub fn save(&self, meta: &SnapMeta) -> Result<(), SnapError> {
        let buf = meta.encode();
        write_atomic(&self.path(meta.index, meta.term), &mut &buf[..])?;
        Ok(())
    }

    fn list(&self) -> Result<Vec<(u64, u64, PathBuf)>, SnapError> {
        let mut out = Vec::new();
        for e in io("read dir", &self.dir, fs::read_dir(&self.dir))? {
            let e = io("read dir", &self.dir, e)?;
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some((term, index)) = parse_name(&name) {
                out.push((index, term, e.path()));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Loads the snapshot file at `index` (the one the WAL names).
    pub fn load(&self, index: u64) -> Result<SnapMeta, SnapError> {
        let found = self.list()?.into_iter().rev().find(|s| s.0 == index);
        let Some((_, _, path)) = found else {
            return Err(SnapError::Missing {
                dir: self.dir.clone(),
                index,
            });
        };
        let buf = io("read", &path, fs::read(&path))?;
        let meta = SnapMeta::decode(&buf).map_err(|reason| SnapError::Corrupt {
            path: path.clone(),
            reason,
        })?;
        if meta.index != index {
            return Err(SnapError::Corrupt {
                path,
                reason: format!("it records index {} but is named for {index}", meta.index),
            });
        }
        Ok(meta)
    }

    /// Deletes all but the newest `keep` snapshot files, and every spool or received copy other
    /// than `spool_keep`. Returns how many files went.
    pub fn purge(&self, keep: usize, spool_keep: Option<u64>) -> Result<usize, SnapError> {
        let list = self.list()?;
        let mut n = 0;
        for (_, _, path) in list.iter().take(list.len().saturating_sub(keep.max(1))) {
            io("remove", path, fs::remove_file(path))?;
            n += 1;
        }
        let keep_spool = spool_keep.map(|i| self.spool_path(i));
        for e in io("read dir", &self.dir, fs::read_dir(&self.dir))? {
            let p = io("read dir", &self.dir, e)?.path();
            let ext = p.extension().and_then(|e| e.to_str());
            if ext == Some("spool") && Some(&p) != keep_spool.as_ref() {
                io("remove", &p, fs::remove_file(&p))?;
                n += 1;
            }
        }
        Ok(n)
    }
}

impl Snapshotter {
    /// Deletes received snapshot data for positions before `index`.
    pub fn purge_received(&self, index: u64) -> Result<usize, SnapError> {
        let mut n = 0;
        for e in io("read dir", &self.dir, fs::read_dir(&self.dir))? {
            let p = io("read dir", &self.dir, e)?.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            let Some(stem) = name.strip_suffix(".recv") else {
                continue;
            };
            if u64::from_str_radix(stem, 16).is_ok_and(|i| i < index) {
                io("remove", &p, fs::remove_file(&p))?;
                n += 1;
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_load_purge_and_refuse_damage() {
        let dir = tempfile::tempdir().unwrap();
        let s = Snapshotter::new(dir.path().join("snap")).unwrap();
        for i in 1..=4u64 {
            let cs = ConfState {
                voters: vec![1, 2, 3],
                ..Default::default()
            };
            s.save(&SnapMeta {
                index: i * 10,
                term: 2,
                conf_state: cs,
                members: Members::default(),
            })
            .unwrap();
        }
        assert_eq!(s.load(30).unwrap().conf_state.voters, vec![1, 2, 3]);
        assert!(matches!(s.load(31), Err(SnapError::Missing { .. })));
        fs::write(s.spool_path(40), b"x").unwrap();
        fs::write(s.spool_path(30), b"x").unwrap();
        assert_eq!(s.purge(2, Some(40)).unwrap(), 3);
        assert!(s.load(10).is_err() && s.load(30).is_ok() && s.spool_path(40).exists());
        fs::write(s.recv_path(20), b"x").unwrap();
        fs::write(s.recv_path(40), b"x").unwrap();
        assert_eq!(s.purge_received(40).unwrap(), 1);
        assert!(s.recv_path(40).exists() && !s.recv_path(20).exists());
        let p = s.path(40, 2);
        let mut buf = fs::read(&p).unwrap();
        let last = buf.len() - 1;
        buf[last] ^= 1;
        fs::write(&p, &buf).unwrap();
        let err = s.load(40).unwrap_err().to_string();
        assert!(err.contains("corrupt") && err.contains("checksum"), "{err}");
    }
}
