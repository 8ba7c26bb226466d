//! Snapshot files. What `etcdctl snapshot save` receives from a member is etcd's: a bbolt file
//! with etcd's buckets, then the SHA-256 of it (so etcdutl, and every backup tool made for
//! etcd, reads it). What `kvd snapshot restore` and `kvd snapshot status` read: etcd's
//! snapshots from etcd 3.4 to 3.7, a member's `member/snap/db` (etcd's or kvd's) copied while
//! it was stopped, and kvd's earlier snapshot format (`KVDSNAP1`).

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use mvcc::etcd_file::EtcdMeta;
use mvcc::{Store, StoreOptions};
use sha2::{Digest, Sha256};

/// etcd's `snapshotSendBufferSize`: bytes per Snapshot response.
pub const CHUNK: usize = 32 << 10;
const SHA_LEN: u64 = 32;

/// What is wrong with a snapshot file.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// As etcdutl: a file without the trailer (a copied `member/snap/db`) needs the flag.
    #[error("snapshot {path}: snapshot missing hash but --skip-hash-check=false (a member's db file copied while stopped has none: give --skip-hash-check)")]
    NoHash { path: PathBuf },
    #[error("snapshot {path}: its SHA-256 does not match the one it ends with: the file is damaged or incomplete")]
    HashMismatch { path: PathBuf },
    #[error("snapshot {path}: not a snapshot or data file of etcd or kvd")]
    Unknown { path: PathBuf },
    #[error("snapshot {path}: {what}")]
    Unsupported { path: PathBuf, what: &'static str },
    #[error("snapshot {path}: {source}")]
    Store { path: PathBuf, source: mvcc::Error },
}

/// The formats a snapshot file may be in.
#[derive(Debug)]
pub enum Kind {
    /// etcd's bbolt file (a snapshot, or a member's `db`).
    Etcd(bbolt::Db),
    /// A kvd member's store file (its `db`).
    KvdStore,
    /// kvd's earlier snapshot format, a dump.
    KvdDump,
}

/// The check of a file's SHA-256, run beside what reads the file.
type HashCheck = std::thread::JoinHandle<Result<(), SnapshotError>>;

/// A snapshot file, opened.
#[derive(Debug)]
pub struct SnapshotFile {
    path: PathBuf,
    kind: Kind,
    check: parking_lot::Mutex<Option<HashCheck>>,
}

impl SnapshotFile {
    /// Opens `path`. As etcdutl: a file whose length is a multiple of 512 plus 32 ends with a
    /// SHA-256, checked unless `skip_hash_check`; one without is refused unless
    /// `skip_hash_check`. The check reads the whole file on a thread of its own: a restore
    /// waits for it before it is done (see [`SnapshotFile::restore`]).
    pub fn open(path: &Path, skip_hash_check: bool) -> Result<SnapshotFile, SnapshotError> {
        let io = |source| SnapshotError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut f = File::open(path).map_err(io)?;
        let len = f.metadata().map_err(io)?.len();
        let hashed = len % 512 == SHA_LEN;
        if !hashed && !skip_hash_check {
            return Err(SnapshotError::NoHash {
                path: path.to_path_buf(),
            });
        }
        let data_len = if hashed { len - SHA_LEN } else { len };
        let check = (hashed && !skip_hash_check).then(|| {
            let path = path.to_path_buf();
            std::thread::spawn(move || check_sha(&path, data_len))
        });
        let file = SnapshotFile {
            path: path.to_path_buf(),
            kind: Kind::KvdStore,
            check: parking_lot::Mutex::new(check),
        };
        let mut head = [0u8; 24];
        let n = f.read(&mut head).map_err(io)?;
        let head = &head[..n];
        let kind = if head.starts_with(b"KVDSNAP1") {
            Ok(Kind::KvdDump)
        } else if pager::looks_like_pager_file(head) {
            Ok(Kind::KvdStore)
        } else {
            match bbolt::Db::open_prefix(path, data_len) {
                Ok(db) => Ok(Kind::Etcd(db)),
                Err(bbolt::Error::NotBolt { .. }) => Err(SnapshotError::Unknown {
                    path: path.to_path_buf(),
                }),
                Err(e) => Err(SnapshotError::Store {
                    path: path.to_path_buf(),
                    source: e.into(),
                }),
            }
        };
        match kind {
            Ok(kind) => Ok(SnapshotFile { kind, ..file }),
            // A damaged file is reported as such, whatever else was found wrong.
            Err(e) => Err(file.checked().err().unwrap_or(e)),
        }
    }

    pub fn kind(&self) -> &Kind {
        &self.kind
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits for the SHA-256 check begun at open, if there is one.
    fn checked(&self) -> Result<(), SnapshotError> {
        match self.check.lock().take() {
            None => Ok(()),
            Some(h) => h.join().unwrap_or_else(|_| {
                Err(SnapshotError::Io {
                    path: self.path.clone(),
                    source: io::Error::other("the hash check failed"),
                })
            }),
        }
    }

    /// Builds a store's file at `dst` (which must not exist) from this snapshot; nothing is
    /// left at `dst` unless it is whole. The store records no consensus position (a restored
    /// member starts a new log) and keeps no member list (the flags give the new one). With
    /// `bump` > 0, etcdutl's `--bump-revision` and `--mark-compacted`; the revision bumped to.
    pub fn restore(
        &self,
        dst: &Path,
        opts: &StoreOptions,
        bump: u64,
    ) -> Result<Option<i64>, SnapshotError> {
        let path = self.path.clone();
        let store_err = |source| SnapshotError::Store {
            path: path.clone(),
            source,
        };
        let src = &self.path;
        let r = match &self.kind {
            Kind::Etcd(db) => mvcc::etcd_file::import(db, dst).map(|_| ()),
            Kind::KvdStore => std::fs::copy(src, dst).map(|_| ()).map_err(|e| {
                mvcc::Error::Storage(pager::Error::Io {
                    op: "copy",
                    path: dst.to_path_buf(),
                    source: e,
                })
            }),
            Kind::KvdDump => {
                let mut f = File::open(src).map_err(|e| SnapshotError::Io {
                    path: path.clone(),
                    source: e,
                })?;
                mvcc::dump::restore_file(&mut f, dst, opts).map_err(|e| mvcc::Error::Corrupt {
                    path: src.display().to_string(),
                    reason: e.to_string(),
                })
            }
        };
        let r = r.and_then(|()| mvcc::etcd_file::finish_restore(dst, bump));
        // Whatever the copy found, a file whose digest does not match is damaged: said so.
        let r = match (self.checked(), r) {
            (Ok(()), Ok(to)) => return Ok(to),
            (Err(e), _) => e,
            (Ok(()), Err(e)) => store_err(e),
        };
        let _ = std::fs::remove_file(dst);
        Err(r)
    }

    /// etcdutl's `snapshot status`: a CRC-32C of every bucket's name, keys and values, the
    /// newest revision, the keys alive at it, the size, and the storage version.
    pub fn status(&self) -> Result<Status, SnapshotError> {
        let path = self.path.clone();
        let store_err = |source| SnapshotError::Store {
            path: path.clone(),
            source,
        };
        let mut st = StatusBuilder::default();
        match &self.kind {
            Kind::Etcd(db) => {
                db.check().map_err(|e| store_err(e.into()))?;
                let mut w = db.walker();
                for (name, b) in db.buckets().map_err(|e| store_err(e.into()))? {
                    st.bucket(&name);
                    w.for_each(&b, &mut |k, item| {
                        // etcdutl hashes a nested bucket's key with no value.
                        let v = match item {
                            bbolt::Item::Value(v) => v,
                            bbolt::Item::Bucket(_) => &[],
                        };
                        st.entry(&name, k, v);
                        Ok(true)
                    })
                    .map_err(|e| store_err(e.into()))?;
                }
                st.size = db.size();
                st.version = match db.bucket(b"meta").map_err(|e| store_err(e.into()))? {
                    Some(m) => db
                        .get(&m, b"storageVersion")
                        .map_err(|e| store_err(e.into()))?
                        .map(|v| String::from_utf8_lossy(&v).into_owned())
                        .unwrap_or_default(),
                    None => String::new(),
                };
            }
            Kind::KvdStore => {
                let db = pager::Db::open(&self.path, pager::Options::default())
                    .map_err(|e| store_err(e.into()))?;
                let tx = db.begin_read().map_err(|e| store_err(e.into()))?;
                for name in tx.buckets().map_err(|e| store_err(e.into()))? {
                    st.bucket(&name);
                    let b = tx.bucket(&name).map_err(|e| store_err(e.into()))?;
                    for e in b.iter() {
                        let (k, v) = e.map_err(|e| store_err(e.into()))?;
                        st.entry(&name, k, v);
                    }
                }
                st.size = db.file_size();
                // What a snapshot of it would say.
                st.version = db_storage_version(&tx).unwrap_or_default();
            }
            Kind::KvdDump => {
                return Err(SnapshotError::Unsupported {
                    path,
                    what: "kvd's earlier snapshot format: `kvd snapshot restore` reads it (status reads etcd's format and data files)",
                })
            }
        }
        Ok(st.finish())
    }
}

/// Checks that the file at `path` ends, after `data_len` bytes, with their SHA-256.
fn check_sha(path: &Path, data_len: u64) -> Result<(), SnapshotError> {
    let io = |source| SnapshotError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = File::open(path).map_err(io)?;
    let mut h = Sha256::new();
    let mut left = data_len;
    let mut buf = vec![0; 1 << 20];
    while left > 0 {
        let n = (buf.len() as u64).min(left) as usize;
        f.read_exact(&mut buf[..n]).map_err(io)?;
        h.update(&buf[..n]);
        left -= n as u64;
    }
    let mut want = [0u8; SHA_LEN as usize];
    f.read_exact(&mut want).map_err(io)?;
    if h.finalize().as_slice() != want {
        return Err(SnapshotError::HashMismatch {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// etcdutl's `snapshot status` columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub hash: u32,
    pub revision: i64,
    pub total_keys: u64,
    pub total_size: u64,
    pub version: String,
}

#[derive(Default)]
struct StatusBuilder {
    hash: u32,
    revision: i64,
    live: std::collections::HashSet<Vec<u8>>,
    size: u64,
    version: String,
}

impl StatusBuilder {
    fn bucket(&mut self, name: &[u8]) {
        self.hash = crc32c::crc32c_append(self.hash, name);
    }

    fn entry(&mut self, bucket: &[u8], k: &[u8], v: &[u8]) {
        self.hash = crc32c::crc32c_append(self.hash, k);
        self.hash = crc32c::crc32c_append(self.hash, v);
        if bucket == b"key" {
            if let Some((r, tombstone)) = mvcc::Rev::from_key(k) {
                self.revision = r.main;
                let key = <api::mvccpb::KeyValue as prost::Message>::decode(v)
                    .map(|kv| kv.key)
                    .unwrap_or_default();
                if tombstone {
                    self.live.remove(&key);
                } else {
                    self.live.insert(key);
                }
            }
        }
    }

    fn finish(self) -> Status {
        Status {
            hash: self.hash,
            revision: self.revision,
            total_keys: self.live.len() as u64,
            total_size: self.size,
            version: self.version,
        }
    }
}

/// etcd's JSON of a member, as its `members` bucket holds it.
#[derive(serde::Serialize, serde::Deserialize)]
struct MemberJson {
    id: u64,
    #[serde(rename = "peerURLs", default)]
    peer_urls: Vec<String>,
    #[serde(
        rename = "isLearner",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    is_learner: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    name: String,
    #[serde(rename = "clientURLs", default, skip_serializing_if = "Vec::is_empty")]
    client_urls: Vec<String>,
}

/// etcd's JSON of the raft configuration, as its `meta` bucket holds it (`confState`).
#[derive(serde::Serialize, serde::Deserialize, Default)]
struct ConfStateJson {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    voters: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    learners: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    voters_outgoing: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    learners_next: Vec<u64>,
    #[serde(default)]
    auto_leave: bool,
}

/// The member etcd's JSON describes.
pub(crate) fn member_from_json(json: &[u8]) -> Result<consensus::Member, String> {
    let m: MemberJson = serde_json::from_slice(json).map_err(|e| {
        format!(
            "a member that does not decode ({e}): {}",
            String::from_utf8_lossy(json)
        )
    })?;
    if m.id == 0 {
        return Err("a member with id 0".into());
    }
    Ok(consensus::Member {
        id: ids::MemberId(m.id),
        name: m.name,
        peer_urls: m.peer_urls,
        client_urls: m.client_urls,
        is_learner: m.is_learner,
    })
}

/// The raft configuration etcd's JSON describes (`meta/confState`).
pub(crate) fn conf_state_from_json(json: &[u8]) -> Result<consensus::ConfState, String> {
    let c: ConfStateJson = serde_json::from_slice(json)
        .map_err(|e| format!("a raft configuration that does not decode ({e})"))?;
    Ok(consensus::ConfState {
        voters: c.voters,
        learners: c.learners,
        voters_outgoing: c.voters_outgoing,
        learners_next: c.learners_next,
        auto_leave: c.auto_leave,
        ..Default::default()
    })
}

/// The storage version of a store file ([`Version::storage`] of its cluster version).
///
/// [`Version::storage`]: crate::version::Version::storage
fn db_storage_version(tx: &pager::ReadTxn) -> Option<String> {
    let v = crate::version::Version::parse(&mvcc::cluster::stored_version(tx)?)?;
    v.storage().map(crate::version::Version::full)
}

/// What etcd's data file holds beside the store, for `members`: the member list, the raft
/// configuration it makes, and the storage version (the store holds the cluster version).
pub fn etcd_meta(
    members: &consensus::Members,
    storage: Option<crate::version::Version>,
) -> EtcdMeta {
    let mut conf = ConfStateJson::default();
    let mut out = EtcdMeta {
        storage_version: storage.map(|v| v.full()),
        ..EtcdMeta::default()
    };
    for m in members.iter() {
        let json = MemberJson {
            id: m.id.0,
            peer_urls: m.peer_urls.clone(),
            is_learner: m.is_learner,
            name: m.name.clone(),
            client_urls: m.client_urls.clone(),
        };
        out.members.insert(
            format!("{:x}", m.id.0).into_bytes(),
            serde_json::to_vec(&json).expect("plain fields encode"),
        );
        if m.is_learner {
            conf.learners.push(m.id.0);
        } else {
            conf.voters.push(m.id.0);
        }
    }
    out.conf_state = Some(serde_json::to_vec(&conf).expect("plain fields encode"));
    out
}

/// The store as etcd's snapshot, sent to `send` as etcd's Maintenance/Snapshot does: chunks of
/// [`CHUNK`] bytes, each with the bytes still to come, then the SHA-256 in a message of its own.
pub fn stream(
    store: &Store,
    etcd: &EtcdMeta,
    send: &mut dyn FnMut(Vec<u8>, u64) -> io::Result<()>,
) -> Result<(), mvcc::Error> {
    let file = store.etcd_file(etcd)?;
    let mut out = Chunks {
        buf: Vec::with_capacity(CHUNK),
        sha: Sha256::new(),
        left: file.size(),
        send,
    };
    file.write_to(&mut out)?;
    out.flush().map_err(io_err)?;
    let sha = std::mem::take(&mut out.sha).finalize().to_vec();
    (out.send)(sha, 0).map_err(io_err)
}

fn io_err(e: io::Error) -> mvcc::Error {
    mvcc::Error::Storage(pager::Error::Io {
        op: "send a snapshot",
        path: PathBuf::new(),
        source: e,
    })
}

struct Chunks<'a> {
    buf: Vec<u8>,
    sha: Sha256,
    /// Bytes of the file not yet sent.
    left: u64,
    send: &'a mut dyn FnMut(Vec<u8>, u64) -> io::Result<()>,
}

impl Write for Chunks<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let n = b.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&b[..n]);
        if self.buf.len() == CHUNK {
            self.flush()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK));
        self.sha.update(&chunk);
        self.left = self.left.saturating_sub(chunk.len() as u64);
        (self.send)(chunk, self.left)
    }
}
