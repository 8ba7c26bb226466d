//! The write-ahead log: what raft must find again after a crash (entries, hard state, snapshot
//! markers), in segment files of CRC-protected records.
//!
//! Record: `len: u32 LE | crc32c(kind ‖ payload): u32 LE | kind: u8 | payload[len]`. A segment is
//! named `{seq:016x}-{first_index:016x}.wal`, preallocated (zero-filled and fsynced by a
//! background thread ahead of need, so an append's fdatasync writes data, not file metadata), and
//! starts with the cluster metadata, the current hard state and the last snapshot marker, so
//! older segments can be deleted once a snapshot covers their entries.
//!
//! [`Wal::save`] writes one Ready's records with one `pwrite` and makes them durable with one
//! `fdatasync` (group commit). At open, the records are replayed; a damaged record at the end of
//! the last segment is a torn write from a crash and is cut off (logged); damage anywhere else is
//! a refusal to start that names the file, the offset and what failed.
//!
//! Torn or corrupt: a damaged record is taken as torn only if (like etcd's check) it runs past the
//! end of the file or one of its 512-byte disk sectors is all zeros — what an interrupted write
//! into a zero-filled file leaves — *and* no valid record follows it. A flipped byte in a record
//! that was written whole is corruption, even in the last record. Likewise a zero record
//! header (the end of the log) with bytes after it: a torn tail in the last segment if no
//! valid record starts anywhere after it, otherwise damage that would silently drop entries.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::mem;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;

use protobuf::Message;
use raft::eraftpb::{Entry, HardState};

use crate::raftpb;
use ids::RaftIndex;

/// Segment size (etcd's 64 MiB).
pub const DEFAULT_SEGMENT_SIZE: u64 = 64 << 20;
const HEADER: usize = 9;
const SECTOR: u64 = 512;
const PREALLOC_NAME: &str = "segment.tmp";
const LOCK_NAME: &str = "wal.lock";

const KIND_METADATA: u8 = 1;
const KIND_ENTRY: u8 = 2;
const KIND_HARD_STATE: u8 = 3;
const KIND_SNAPSHOT: u8 = 4;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("wal: {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("wal: {path} is corrupt at offset {offset}: {reason}; refusing to start (restore the member from a snapshot or remove and re-add it)")]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("wal: no log in {0}")]
    NotFound(PathBuf),
    #[error("wal: {0} already holds a log")]
    Exists(PathBuf),
    #[error("wal: {0} is in use by another process")]
    Locked(PathBuf),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io<T>(op: &'static str, path: &Path, r: std::io::Result<T>) -> Result<T> {
    r.map_err(|source| Error::Io {
        op,
        path: path.to_path_buf(),
        source,
    })
}

/// A snapshot the log knows of: entries up to `index` live in it, not in the log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnapshotMark {
    pub index: RaftIndex,
    pub term: u64,
}

/// What [`Wal::open`] found.
#[derive(Debug, Default)]
pub struct Recovered {
    /// The bytes given to [`Wal::create`] (cluster and member ids).
    pub metadata: Vec<u8>,
    pub hard_state: HardState,
    pub snapshot: SnapshotMark,
    /// Entries after the snapshot, in index order, with raft's overwrites applied.
    pub entries: Vec<Entry>,
    /// A torn tail that was cut off: (segment, offset, bytes dropped).
    pub repaired: Option<(PathBuf, u64, u64)>,
}

/// Options of a log.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub segment_size: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            segment_size: DEFAULT_SEGMENT_SIZE,
        }
    }
}

#[derive(Debug, Clone)]
struct Segment {
    seq: u64,
    first_index: u64,
    path: PathBuf,
}

/// An open log, appending to its last segment.
#[derive(Debug)]
pub struct Wal {
    dir: PathBuf,
    opts: Options,
    segments: Vec<Segment>,
    file: File,
    /// Where the next record goes in the last segment.
    offset: u64,
    /// Its length (preallocated).
    len: u64,
    /// Where the last segment's records after its head start.
    body: u64,
    metadata: Vec<u8>,
    hard_state: HardState,
    snapshot: SnapshotMark,
    last_index: u64,
    prealloc: Preallocator,
    /// `save`'s buffer, kept while no larger than [`SCRATCH_KEPT`].
    scratch: Vec<u8>,
    _lock: File,
}

/// The most `Wal::scratch` keeps between saves: a batch larger than this allocates its own.
const SCRATCH_KEPT: usize = 1 << 20;

fn segment_name(seq: u64, first_index: u64) -> String {
    format!("{seq:016x}-{first_index:016x}.wal")
}

fn parse_segment_name(name: &str) -> Option<(u64, u64)> {
    let stem = name.strip_suffix(".wal")?;
    let (a, b) = stem.split_once('-')?;
    if a.len() != 16 || b.len() != 16 {
        return None;
    }
    Some((
        u64::from_str_radix(a, 16).ok()?,
        u64::from_str_radix(b, 16).ok()?,
    ))
}

/// Appends a record of `payload`.
fn encode(buf: &mut Vec<u8>, kind: u8, payload: &[u8]) {
    encode_msg(buf, kind, |b| {
        b.extend_from_slice(payload);
        Ok(())
    });
}

/// Appends a record whose payload `write` appends, in place after its header (no copy of its
/// own to make): its length, the CRC of its kind and payload, its kind.
fn encode_msg(
    buf: &mut Vec<u8>,
    kind: u8,
    write: impl FnOnce(&mut Vec<u8>) -> protobuf::ProtobufResult<()>,
) {
    let start = buf.len();
    buf.extend_from_slice(&[0; HEADER]);
    buf[start + HEADER - 1] = kind;
    // Encoding a well-formed message into a Vec cannot fail; were it to, the record is empty.
    if write(buf).is_err() {
        buf.truncate(start + HEADER);
    }
    let len = (buf.len() - start - HEADER) as u32;
    let crc = crc32c::crc32c(&buf[start + HEADER - 1..]);
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

fn snapshot_bytes(s: SnapshotMark) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&s.index.0.to_le_bytes());
    b[8..].copy_from_slice(&s.term.to_le_bytes());
    b
}

fn sync_dir(dir: &Path) -> Result<()> {
    let d = io("open the directory", dir, File::open(dir))?;
    io("fsync the directory", dir, d.sync_all())
}

/// One decoded record, or why there is none at an offset.
enum Decoded<'a> {
    Record {
        kind: u8,
        payload: &'a [u8],
        next: u64,
    },
    /// Zeros: the end of the written part of a preallocated segment.
    End,
    Bad {
        reason: String,
        torn: bool,
    },
}

fn decode(data: &[u8], at: u64) -> Decoded<'_> {
    let start = at as usize;
    let rest = &data[start.min(data.len())..];
    if rest.len() < HEADER {
        return if rest.iter().all(|&b| b == 0) {
            Decoded::End
        } else {
            Decoded::Bad {
                reason: "a record header runs past the end of the file".into(),
                torn: true,
            }
        };
    }
    let len = u32::from_le_bytes(rest[..4].try_into().unwrap_or_default()) as usize;
    let crc = u32::from_le_bytes(rest[4..8].try_into().unwrap_or_default());
    if len == 0 && crc == 0 && rest[8] == 0 {
        return Decoded::End;
    }
    if rest.len() - HEADER < len {
        return Decoded::Bad {
            reason: format!("a record of {len} bytes runs past the end of the file"),
            torn: true,
        };
    }
    let kind = rest[8];
    let payload = &rest[HEADER..HEADER + len];
    let actual = crc32c::crc32c_append(crc32c::crc32c(&[kind]), payload);
    if actual != crc {
        // A sector of the record left as preallocated (all zeros): an interrupted write.
        let end = at + (HEADER + len) as u64;
        let mut s = at / SECTOR * SECTOR;
        let mut zero_sector = false;
        while s < end {
            let (a, b) = (s.max(at) as usize, (s + SECTOR).min(end) as usize);
            // A few zero bytes are ordinary data; an unwritten sector leaves more.
            if b - a >= 16 && data[a..b].iter().all(|&x| x == 0) {
                zero_sector = true;
                break;
            }
            s += SECTOR;
        }
        return Decoded::Bad {
            reason: format!("record checksum {actual:08x} does not match the stored {crc:08x}"),
            torn: zero_sector,
        };
    }
    Decoded::Record {
        kind,
        payload,
        next: at + (HEADER + len) as u64,
    }
}

/// Keeps one zero-filled, fsynced file ready for the next segment.
#[derive(Debug)]
struct Preallocator {
    ready: mpsc::Receiver<Result<PathBuf>>,
    thread: Option<JoinHandle<()>>,
    want: mpsc::Sender<()>,
}

impl Preallocator {
    fn start(dir: &Path, size: u64) -> Preallocator {
        let (want, wants) = mpsc::channel::<()>();
        let (done, ready) = mpsc::channel();
        let path = dir.join(PREALLOC_NAME);
        let thread = std::thread::Builder::new()
            .name("wal-prealloc".into())
            .spawn(move || {
                while wants.recv().is_ok() {
                    if done
                        .send(zero_file(&path, size).map(|_| path.clone()))
                        .is_err()
                    {
                        return;
                    }
                }
            })
            .ok();
        let _ = want.send(());
        Preallocator {
            ready,
            thread,
            want,
        }
    }

    /// The prepared file (waiting for it if needed); starts preparing the next.
    fn take(&self, dir: &Path, size: u64) -> Result<PathBuf> {
        let path = match self.ready.recv() {
            Ok(Ok(p)) => p,
            // Prepared ahead of time, it failed (a full disk may have room now): once more.
            Ok(Err(e)) => {
                tracing::warn!("preparing the next WAL segment failed: {e}; trying again");
                let p = dir.join(PREALLOC_NAME);
                zero_file(&p, size)?;
                p
            }
            // The thread could not start: prepare inline.
            Err(_) => {
                let p = dir.join(PREALLOC_NAME);
                zero_file(&p, size)?;
                p
            }
        };
        Ok(path)
    }

    fn again(&self) {
        let _ = self.want.send(());
    }
}

impl Drop for Preallocator {
    fn drop(&mut self) {
        let (tx, _) = mpsc::channel();
        self.want = tx;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Creates `path` zero-filled and fsynced; on failure (a full disk) removes what it wrote, so
/// a half-made segment holds no space the data file needs.
fn zero_file(path: &Path, size: u64) -> Result<()> {
    let r = fill_zeros(path, size);
    if r.is_err() {
        let _ = std::fs::remove_file(path);
    }
    r
}

/// The size of the writes that zero-fill a preallocated segment (see `fill_zeros`).
const ZERO_FILL_WRITE: usize = 64 << 10;

fn fill_zeros(path: &Path, size: u64) -> Result<()> {
    let mut f = io(
        "create",
        path,
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path),
    )?;
    // Small writes: the page cache keeps the file in folios the size of the writes that made
    // them, and every later append into a large folio costs the kernel more (ext4 walks all
    // its blocks at each write and at each fdatasync): zero-filled in 1 MiB writes, a
    // 300-byte append + fdatasync took ~2.5 µs more CPU than in 64 KiB or 4 KiB writes.
    let chunk = vec![0u8; ZERO_FILL_WRITE];
    let mut left = size;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        io("zero-fill", path, f.write_all(&chunk[..n]))?;
        left -= n as u64;
    }
    io("fsync", path, f.sync_all())
}

fn lock_dir(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK_NAME);
    let f = io(
        "open",
        &path,
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path),
    )?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(fs::TryLockError::WouldBlock) => Err(Error::Locked(dir.to_path_buf())),
        Err(fs::TryLockError::Error(e)) => Err(Error::Io {
            op: "lock",
            path,
            source: e,
        }),
    }
}

fn list_segments(dir: &Path) -> Result<Vec<Segment>> {
    let mut segs = Vec::new();
    for e in io("list", dir, fs::read_dir(dir))? {
        let e = io("list", dir, e)?;
        let name = e.file_name();
        if let Some((seq, first_index)) = name.to_str().and_then(parse_segment_name) {
            segs.push(Segment {
                seq,
                first_index,
                path: e.path(),
            });
        }
    }
    segs.sort_by_key(|s| s.seq);
    for w in segs.windows(2) {
        if w[0].seq.checked_add(1) != Some(w[1].seq) {
            return Err(Error::Corrupt {
                path: w[1].path.clone(),
                offset: 0,
                reason: format!("segment {} is missing before it", w[0].seq + 1),
            });
        }
    }
    Ok(segs)
}

impl Wal {
    /// Creates a new log in `dir` (made if missing) holding `metadata`.
    pub fn create(dir: impl AsRef<Path>, metadata: &[u8], opts: Options) -> Result<Wal> {
        let dir = dir.as_ref().to_path_buf();
        io("create", &dir, fs::create_dir_all(&dir))?;
        let lock = lock_dir(&dir)?;
        if !list_segments(&dir)?.is_empty() {
            return Err(Error::Exists(dir));
        }
        let prealloc = Preallocator::start(&dir, opts.segment_size);
        let mut wal = Wal {
            file: io("open", &dir, File::open(&dir))?,
            dir,
            opts,
            segments: Vec::new(),
            offset: 0,
            len: 0,
            body: 0,
            metadata: metadata.to_vec(),
            hard_state: HardState::default(),
            snapshot: SnapshotMark::default(),
            last_index: 0,
            prealloc,
            scratch: Vec::new(),
            _lock: lock,
        };
        wal.cut()?;
        Ok(wal)
    }

    /// The metadata of the log in `dir`, read from the first record of its newest segment
    /// (every segment starts with it) without replaying anything.
    pub fn read_metadata(dir: impl AsRef<Path>) -> Result<Vec<u8>> {
        let dir = dir.as_ref();
        let segments = list_segments(dir)?;
        let Some(seg) = segments.last() else {
            return Err(Error::NotFound(dir.to_path_buf()));
        };
        let mut data = Vec::new();
        io(
            "read",
            &seg.path,
            File::open(&seg.path).and_then(|f| f.take(64 << 10).read_to_end(&mut data)),
        )?;
        match decode(&data, 0) {
            Decoded::Record {
                kind: KIND_METADATA,
                payload,
                ..
            } => Ok(payload.to_vec()),
            _ => Err(Error::Corrupt {
                path: seg.path.clone(),
                offset: 0,
                reason: "the segment does not start with the log's metadata".into(),
            }),
        }
    }

    /// Opens the log in `dir`, replaying it; a torn tail is repaired, other damage refused.
    pub fn open(dir: impl AsRef<Path>, opts: Options) -> Result<(Wal, Recovered)> {
        let dir = dir.as_ref().to_path_buf();
        if !dir.is_dir() {
            return Err(Error::NotFound(dir));
        }
        let lock = lock_dir(&dir)?;
        let segments = list_segments(&dir)?;
        let Some(last) = segments.last().cloned() else {
            return Err(Error::NotFound(dir));
        };
        let mut rec = Recovered::default();
        let mut end = 0;
        for (i, seg) in segments.iter().enumerate() {
            let last_index = rec.entries.last().map_or(rec.snapshot.index.0, |e| e.index);
            if i > 0 && last_index.saturating_add(1) < seg.first_index {
                return Err(Error::Corrupt {
                    path: seg.path.clone(),
                    offset: 0,
                    reason: format!(
                        "it starts at entry {} but the segments before end at {last_index}",
                        seg.first_index
                    ),
                });
            }
            end = replay(seg, i + 1 == segments.len(), &mut rec)?;
        }
        let file = io(
            "open",
            &last.path,
            OpenOptions::new().read(true).write(true).open(&last.path),
        )?;
        let len = io("stat", &last.path, file.metadata())?.len();
        if let Some((_, at, _)) = &rec.repaired {
            // Zero the torn bytes so that nothing after the new end can be read as a record.
            let zeros = vec![0u8; (len - at) as usize];
            io("repair", &last.path, file.write_all_at(&zeros, *at))?;
            io("fsync", &last.path, file.sync_data())?;
            tracing::warn!(
                segment = %last.path.display(),
                offset = at,
                "cut off a torn write at the end of the WAL"
            );
        }
        let last_index = rec.entries.last().map_or(rec.snapshot.index.0, |e| e.index);
        let wal = Wal {
            prealloc: Preallocator::start(&dir, opts.segment_size),
            dir,
            opts,
            segments,
            file,
            offset: end,
            len,
            body: 0,
            metadata: rec.metadata.clone(),
            hard_state: rec.hard_state.clone(),
            snapshot: rec.snapshot,
            last_index,
            scratch: Vec::new(),
            _lock: lock,
        };
        Ok((wal, rec))
    }

    /// Appends `entries` (replacing any at or after the first one's index, as raft requires)
    /// and the hard state if given, durable on return if `sync` (one write, one fdatasync).
    pub fn save(
        &mut self,
        hard_state: Option<&HardState>,
        entries: &[Entry],
        sync: bool,
    ) -> Result<()> {
        if hard_state.is_none() && entries.is_empty() {
            return Ok(());
        }
        // One buffer kept from save to save (a lone write's record and hard state, usually).
        let mut buf = mem::take(&mut self.scratch);
        buf.clear();
        for e in entries {
            encode_msg(&mut buf, KIND_ENTRY, |b| raftpb::put_entry(b, e));
        }
        if let Some(hs) = hard_state {
            encode_msg(&mut buf, KIND_HARD_STATE, |b| raftpb::put_hard_state(b, hs));
        }
        fail::fail_point!("wal_before_save");
        let written = self.write(&buf, sync);
        if buf.capacity() <= SCRATCH_KEPT {
            self.scratch = buf;
        }
        written?;
        fail::fail_point!("wal_after_save");
        if let Some(hs) = hard_state {
            self.hard_state = hs.clone();
        }
        if let Some(e) = entries.last() {
            self.last_index = e.index;
        }
        Ok(())
    }

    /// Records that a snapshot at `mark` is saved: replay starts after it. Durable on return.
    pub fn save_snapshot(&mut self, mark: SnapshotMark) -> Result<()> {
        let mut buf = Vec::new();
        encode(&mut buf, KIND_SNAPSHOT, &snapshot_bytes(mark));
        self.write(&buf, true)?;
        self.snapshot = mark;
        self.last_index = self.last_index.max(mark.index.0);
        Ok(())
    }

    /// Drops whole segments holding only entries at or below `index` (covered by a snapshot)
    /// from the log, oldest first, while more than `keep` segments remain; the last segment
    /// always stays. Their files are deleted by [`Purged::remove`], which the caller runs off
    /// the path that writes the log: deleting a 64 MiB file can take tens of milliseconds (on
    /// a filesystem that discards freed blocks, 45–60 ms each here), and until it is done a
    /// restart finds the segments still there and skips them as it would before the purge.
    pub fn purge(&mut self, index: RaftIndex, keep: usize) -> Result<Purged> {
        let mut paths = Vec::new();
        while self.segments.len() > keep.max(1) && self.segments[1].first_index <= index.0 + 1 {
            paths.push(self.segments.remove(0).path);
        }
        Ok(Purged {
            dir: self.dir.clone(),
            paths,
        })
    }

    /// The segment files, oldest first.
    pub fn segment_paths(&self) -> Vec<PathBuf> {
        self.segments.iter().map(|s| s.path.clone()).collect()
    }

    /// The hard state last written.
    pub fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    /// The index of the last entry written (or of the snapshot).
    pub fn last_index(&self) -> RaftIndex {
        RaftIndex(self.last_index)
    }

    fn write(&mut self, buf: &[u8], sync: bool) -> Result<()> {
        if self.offset + buf.len() as u64 > self.len && self.offset > self.body {
            self.cut()?;
        }
        let path = &self.segments[self.segments.len() - 1].path;
        let end = self.offset + buf.len() as u64;
        if end > self.len {
            // A batch larger than a segment: this one grows.
            io("grow", path, self.file.set_len(end))?;
            self.len = end;
        }
        io("write", path, self.file.write_all_at(buf, self.offset))?;
        if sync {
            let t = std::time::Instant::now();
            fail::fail_point!("wal_fsync", |_| io(
                "fdatasync",
                path,
                Err(std::io::Error::other("injected by failpoint wal_fsync"))
            ));
            io("fdatasync", path, self.file.sync_data())?;
            crate::metrics::WAL_FSYNC.observe(t.elapsed().as_secs_f64());
        }
        self.offset = end;
        Ok(())
    }

    fn head(&self) -> Vec<u8> {
        let mut buf = Vec::new();
        encode(&mut buf, KIND_METADATA, &self.metadata);
        encode_msg(&mut buf, KIND_HARD_STATE, |b| {
            raftpb::put_hard_state(b, &self.hard_state)
        });
        encode(&mut buf, KIND_SNAPSHOT, &snapshot_bytes(self.snapshot));
        buf
    }

    /// Starts a new segment from the preallocated file, beginning with the head records.
    fn cut(&mut self) -> Result<()> {
        if let Some(s) = self.segments.last() {
            // Whatever unsynced saves left in the old segment is durable before the new one
            // exists: a crash can never leave a later segment without the earlier data.
            io("fdatasync", &s.path, self.file.sync_data())?;
        }
        let seq = self.segments.last().map_or(0, |s| s.seq + 1);
        let first_index = self.last_index + 1;
        let tmp = self.prealloc.take(&self.dir, self.opts.segment_size)?;
        let path = self.dir.join(segment_name(seq, first_index));
        let head = self.head();
        {
            let f = io(
                "open",
                &tmp,
                OpenOptions::new().read(true).write(true).open(&tmp),
            )?;
            io("write", &tmp, f.write_all_at(&head, 0))?;
            io("fdatasync", &tmp, f.sync_data())?;
        }
        io("rename", &tmp, fs::rename(&tmp, &path))?;
        sync_dir(&self.dir)?;
        self.prealloc.again();
        self.file = io(
            "open",
            &path,
            OpenOptions::new().read(true).write(true).open(&path),
        )?;
        self.len = io("stat", &path, self.file.metadata())?.len();
        self.offset = head.len() as u64;
        self.body = self.offset;
        self.segments.push(Segment {
            seq,
            first_index,
            path,
        });
        Ok(())
    }
}

/// Segments a [`Wal::purge`] dropped from the log, their files not yet deleted.
#[derive(Debug)]
#[must_use = "the purged segments' files stay until `remove` deletes them"]
pub struct Purged {
    dir: PathBuf,
    paths: Vec<PathBuf>,
}

impl Purged {
    /// How many segments were purged.
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    /// Whether none were.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// Deletes the purged segments' files (oldest first) and syncs the directory; how many.
    pub fn remove(self) -> Result<usize> {
        for p in &self.paths {
            io("remove", p, fs::remove_file(p))?;
        }
        if !self.paths.is_empty() {
            sync_dir(&self.dir)?;
        }
        Ok(self.paths.len())
    }
}

/// Bytes a replay reads at a time: a segment is read as far as its records go, and the zeros
/// of its preallocated rest are checked a chunk at a time, never held (a restarted member
/// would otherwise hold a whole 64 MiB segment to find a few records in it).
const READ_CHUNK: u64 = 1 << 20;

/// Appends up to [`READ_CHUNK`] more bytes of `file` to `data`; whether the file ended.
fn read_chunk(file: &mut File, data: &mut Vec<u8>) -> std::io::Result<bool> {
    let n = Read::by_ref(file).take(READ_CHUNK).read_to_end(data)?;
    Ok((n as u64) < READ_CHUNK)
}

/// Reads the rest of `file`, keeping it in `data` only if it is not all zeros (then a damaged
/// tail is judged on every byte, as before).
fn read_rest_if_not_zeros(file: &mut File, data: &mut Vec<u8>) -> std::io::Result<()> {
    let mut zeros = 0usize;
    let mut chunk = Vec::with_capacity(READ_CHUNK as usize);
    loop {
        chunk.clear();
        let ended = read_chunk(file, &mut chunk)?;
        if chunk.iter().any(|&b| b != 0) {
            data.resize(data.len() + zeros, 0);
            data.extend_from_slice(&chunk);
            file.read_to_end(data)?;
            return Ok(());
        }
        if ended {
            return Ok(());
        }
        zeros += chunk.len();
    }
}

/// Replays one segment into `rec`; returns the offset after its last good record.
fn replay(seg: &Segment, is_last: bool, rec: &mut Recovered) -> Result<u64> {
    let mut file = io("open", &seg.path, File::open(&seg.path))?;
    let mut data = Vec::new();
    let mut eof = false;
    let corrupt = |offset: u64, reason: String| Error::Corrupt {
        path: seg.path.clone(),
        offset,
        reason,
    };
    let mut at = 0u64;
    loop {
        let decoded = decode(&data, at);
        if !eof && !matches!(decoded, Decoded::Record { .. }) {
            // The end of what was read so far: read on. At a zero header, the rest is most
            // likely the preallocated zeros.
            let zero_header = matches!(decoded, Decoded::End) && data.len() >= at as usize + HEADER;
            let read = if zero_header {
                read_rest_if_not_zeros(&mut file, &mut data).map(|()| true)
            } else {
                read_chunk(&mut file, &mut data)
            };
            eof = io("read", &seg.path, read)?;
            continue;
        }
        match decoded {
            Decoded::End => {
                // Bytes after the end: what a torn write leaves when the sector holding a
                // record's header was lost but a later one was written.
                let rest = &data[(at as usize).min(data.len())..];
                let Some(first) = rest.iter().position(|&b| b != 0) else {
                    return Ok(at);
                };
                // A record's first non-zero byte may be any of its header's: its length's low
                // bytes can be zeros (and a record of nothing has a zero length).
                let from = (at + first as u64).saturating_sub(HEADER as u64 - 1);
                let followed = record_after(&data, from.max(at + 1));
                if !is_last || followed {
                    let what = if followed {
                        "valid records follow"
                    } else {
                        "bytes follow"
                    };
                    return Err(corrupt(
                        at,
                        format!("the log ends here (a zero record header) but {what} it"),
                    ));
                }
                rec.repaired = Some((seg.path.clone(), at, data.len() as u64 - at));
                return Ok(at);
            }
            Decoded::Record {
                kind,
                payload,
                next,
            } => {
                apply_record(kind, payload, rec).map_err(|r| corrupt(at, r))?;
                at = next;
            }
            Decoded::Bad { reason, torn } => {
                let followed = following_record(&data, at);
                if !is_last || !torn || followed {
                    let why = if followed {
                        format!("{reason}, and valid records follow it")
                    } else {
                        reason
                    };
                    return Err(corrupt(at, why));
                }
                rec.repaired = Some((seg.path.clone(), at, data.len() as u64 - at));
                return Ok(at);
            }
        }
    }
}

/// Whether a valid record starts where the damaged record at `at` claims to end — then the
/// damage is not the tail of the log.
fn following_record(data: &[u8], at: u64) -> bool {
    let claimed = data
        .get(at as usize..at as usize + 4)
        .and_then(|b| b.try_into().ok())
        .map(|b| at + HEADER as u64 + u64::from(u32::from_le_bytes(b)));
    claimed.is_some_and(|o| matches!(decode(data, o), Decoded::Record { .. }))
}

/// Whether a valid record starts anywhere from `from` on (a scan, only for damaged tails).
fn record_after(data: &[u8], from: u64) -> bool {
    let end = data
        .iter()
        .rposition(|&b| b != 0)
        .map_or(0, |i| i as u64 + 1);
    (from..end).any(|o| matches!(decode(data, o), Decoded::Record { .. }))
}

fn apply_record(kind: u8, payload: &[u8], rec: &mut Recovered) -> Result<(), String> {
    match kind {
        KIND_METADATA => rec.metadata = payload.to_vec(),
        KIND_ENTRY => {
            let e = Entry::parse_from_bytes(payload).map_err(|e| format!("entry: {e}"))?;
            if e.index <= rec.snapshot.index.0 {
                return Ok(());
            }
            // Raft replaced the entries from this index on.
            let first = rec.entries.first().map_or(e.index, |f| f.index);
            if e.index < first {
                rec.entries.clear();
            } else {
                rec.entries.truncate((e.index - first) as usize);
            }
            if let Some(last) = rec.entries.last() {
                if last.index.checked_add(1) != Some(e.index) {
                    return Err(format!(
                        "entry {} follows entry {}: a gap in the log",
                        e.index, last.index
                    ));
                }
            }
            rec.entries.push(e);
        }
        KIND_HARD_STATE => {
            rec.hard_state =
                HardState::parse_from_bytes(payload).map_err(|e| format!("hard state: {e}"))?;
        }
        KIND_SNAPSHOT => {
            let b: [u8; 16] = payload
                .try_into()
                .map_err(|_| "a snapshot marker is not 16 bytes".to_string())?;
            let mark = SnapshotMark {
                index: RaftIndex(u64::from_le_bytes(b[..8].try_into().unwrap_or_default())),
                term: u64::from_le_bytes(b[8..].try_into().unwrap_or_default()),
            };
            if mark.index >= rec.snapshot.index {
                rec.snapshot = mark;
                rec.entries.retain(|e| e.index > mark.index.0);
            }
        }
        k => return Err(format!("unknown record kind {k}")),
    }
    Ok(())
}
