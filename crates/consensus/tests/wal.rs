//! The WAL keeps what it acknowledged, repairs a torn tail and refuses real damage.

use std::os::unix::fs::FileExt;
use std::path::Path;

use consensus::wal::{Error, Options, SnapshotMark, Wal};
use consensus::RaftIndex;
use raft::eraftpb::{Entry, HardState};

fn entry(index: u64, term: u64) -> Entry {
    Entry {
        index,
        term,
        data: format!("entry {index} of term {term}").into_bytes().into(),
        ..Default::default()
    }
}

fn hs(term: u64, vote: u64, commit: u64) -> HardState {
    HardState {
        term,
        vote,
        commit,
        ..Default::default()
    }
}

fn small() -> Options {
    Options {
        segment_size: 16 << 10,
    }
}

fn indexes(es: &[Entry]) -> Vec<(u64, u64)> {
    es.iter().map(|e| (e.index, e.term)).collect()
}

#[test]
fn what_was_saved_is_replayed_with_raft_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wal::create(dir.path(), b"cluster 7", small()).unwrap();
    let es: Vec<Entry> = (1..=10).map(|i| entry(i, 1)).collect();
    w.save(Some(&hs(1, 1, 3)), &es, true).unwrap();
    // A new leader replaces 6.. with its own entries.
    let es2: Vec<Entry> = (6..=8).map(|i| entry(i, 2)).collect();
    w.save(Some(&hs(2, 2, 7)), &es2, true).unwrap();
    drop(w);
    let (w, rec) = Wal::open(dir.path(), small()).unwrap();
    assert_eq!(rec.metadata, b"cluster 7");
    assert_eq!(rec.hard_state, hs(2, 2, 7));
    let want: Vec<(u64, u64)> = (1..=5)
        .map(|i| (i, 1))
        .chain((6..=8).map(|i| (i, 2)))
        .collect();
    assert_eq!(indexes(&rec.entries), want);
    assert_eq!(rec.entries[7].data, entry(8, 2).data);
    assert!(rec.repaired.is_none());
    assert_eq!(w.last_index(), RaftIndex(8));
}

#[test]
fn segments_are_cut_and_purged_behind_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wal::create(dir.path(), b"m", small()).unwrap();
    for i in 1..=2000u64 {
        w.save(Some(&hs(1, 1, i)), &[entry(i, 1)], i % 10 == 0)
            .unwrap();
    }
    let segs = w.segment_paths().len();
    assert!(segs > 3, "only {segs} segments");
    w.save_snapshot(SnapshotMark {
        index: RaftIndex(1500),
        term: 1,
    })
    .unwrap();
    let purged = w.purge(RaftIndex(1500), 1).unwrap();
    let paths = w.segment_paths();
    assert_eq!(
        paths.len(),
        segs - purged.len(),
        "dropped from the log at once"
    );
    let on_disk = || {
        std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "wal")
            })
            .count()
    };
    assert_eq!(on_disk(), segs, "the files stay until removed");
    let purged = purged.remove().unwrap();
    assert!(purged >= 1 && purged < segs, "purged {purged} of {segs}");
    assert_eq!(on_disk(), segs - purged);
    drop(w);
    let (w, rec) = Wal::open(dir.path(), small()).unwrap();
    assert_eq!(
        rec.snapshot,
        SnapshotMark {
            index: RaftIndex(1500),
            term: 1
        }
    );
    assert_eq!(rec.metadata, b"m");
    // Read alone, from the newest segment, without a replay.
    assert_eq!(Wal::read_metadata(dir.path()).unwrap(), b"m");
    assert_eq!(rec.hard_state, hs(1, 1, 2000));
    assert_eq!(
        indexes(&rec.entries),
        (1501..=2000).map(|i| (i, 1)).collect::<Vec<_>>()
    );
    assert_eq!(w.segment_paths().len(), segs - purged);
}

/// The newest segment file in `dir`.
fn last_segment(dir: &Path) -> std::path::PathBuf {
    let mut segs: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    segs.sort();
    segs.pop().unwrap()
}

/// A log of entries 1 to 20, one save each: its segment and the segment's bytes.
fn twenty_entries(dir: &Path) -> (std::path::PathBuf, Vec<u8>) {
    let mut w = Wal::create(dir, b"m", Options::default()).unwrap();
    for i in 1..=20 {
        w.save(None, &[entry(i, 1)], true).unwrap();
    }
    drop(w);
    let seg = last_segment(dir);
    let data = std::fs::read(&seg).unwrap();
    (seg, data)
}

/// A log of entries 1 and 2, its segment, and where its records end.
fn two_entries(dir: &Path) -> (std::path::PathBuf, usize) {
    let mut w = Wal::create(dir, b"m", Options::default()).unwrap();
    w.save(Some(&hs(1, 1, 1)), &[entry(1, 1), entry(2, 1)], true)
        .unwrap();
    drop(w);
    // The end of the log: the first offset after which the file is all zeros.
    let seg = last_segment(dir);
    let data = std::fs::read(&seg).unwrap();
    let end = data.iter().rposition(|&b| b != 0).unwrap() + 1;
    (seg, end)
}

/// The record of a 2,000-byte entry 3, with a checksum that does not match (it is torn).
fn torn_record() -> Vec<u8> {
    use protobuf::Message;
    let big = Entry {
        data: vec![0x5a; 2000].into(),
        ..entry(3, 1)
    };
    let payload = big.write_to_bytes().unwrap();
    let mut rec = Vec::new();
    rec.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    rec.extend_from_slice(&0xdead_beefu32.to_le_bytes());
    rec.push(2);
    rec.extend_from_slice(&payload);
    rec
}

/// Writes `bytes` at `offset` of `path`.
fn write_at(path: &Path, bytes: &[u8], offset: usize) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset as u64).unwrap();
}

/// The log in `dir` opens with its tail after `end` cut off, takes entry 3, and opens again
/// with nothing to repair.
fn cut_off_and_goes_on(dir: &Path, seg: &Path, end: usize) {
    let (mut w, r) = Wal::open(dir, Options::default()).unwrap();
    let (path, at, _) = r.repaired.clone().expect("the tail was repaired");
    assert_eq!((path.as_path(), at), (seg, end as u64));
    assert_eq!(indexes(&r.entries), [(1, 1), (2, 1)]);
    w.save(None, &[entry(3, 1)], true).unwrap();
    drop(w);
    let (_, r) = Wal::open(dir, Options::default()).unwrap();
    assert!(r.repaired.is_none());
    assert_eq!(indexes(&r.entries), [(1, 1), (2, 1), (3, 1)]);
}

#[test]
fn a_torn_tail_is_cut_off_and_the_log_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (seg, end) = two_entries(dir.path());
    // Only the first sector of the record reached the disk.
    let cut = 512 - end % 512;
    write_at(&seg, &torn_record()[..cut], end);
    cut_off_and_goes_on(dir.path(), &seg, end);
}

/// The offsets of the records of the segment `data`, up to its first zero header.
fn record_offsets(data: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut at = 0;
    while data[at..at + 9].iter().any(|&b| b != 0) {
        out.push(at);
        at += 9 + u32::from_le_bytes(data[at..at + 4].try_into().unwrap()) as usize;
    }
    out
}

/// Found by the `wal_open` fuzz target: a torn write whose first sector (holding the record
/// header) never reached the disk while a later one did. The log ends at the zero header;
/// the bytes after it are a torn tail, zeroed at open, so the next append cannot run into
/// them and the log keeps opening.
#[test]
fn a_torn_write_that_lost_its_header_sector_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let (seg, end) = two_entries(dir.path());
    // Only the sectors after the first one the record touches were written.
    let skip = (512 - end % 512) % 512 + 512;
    write_at(&seg, &torn_record()[skip..], end + skip);
    cut_off_and_goes_on(dir.path(), &seg, end);
}

/// A record header zeroed in the middle of the log, with valid records after it, is damage,
/// not the end of the log: refused, naming the file and offset, rather than cut off.
#[test]
fn a_zeroed_header_before_valid_records_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (seg, data) = twenty_entries(dir.path());
    let victim = record_offsets(&data)[10];
    write_at(&seg, &[0; 9], victim);
    match Wal::open(dir.path(), Options::default()) {
        Err(Error::Corrupt {
            path,
            offset,
            reason,
        }) => {
            assert_eq!((path, offset), (seg, victim as u64));
            assert!(reason.contains("valid records follow"), "{reason}");
        }
        Err(e) => panic!("{e}"),
        Ok((_, r)) => panic!("opened with {} entries", r.entries.len()),
    }
}

/// A replay reads a segment a chunk (1 MiB) at a time: records that straddle chunks come back
/// whole, and a valid record far into the preallocated zeros is still found and refused —
/// also when its length's low byte is zero (the scan for it began at its first non-zero byte
/// and missed it: such a log was cut off as a torn tail, losing the record).
#[test]
fn a_segment_is_replayed_across_read_chunks_and_judged_to_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wal::create(dir.path(), b"m", Options::default()).unwrap();
    let big = |i: u64| Entry {
        data: vec![i as u8; 1000 + (i as usize % 7) * 100].into(),
        ..entry(i, 1)
    };
    for first in (1..=3000).step_by(100) {
        let es: Vec<Entry> = (first..first + 100).map(big).collect();
        w.save(Some(&hs(1, 1, first + 99)), &es, true).unwrap();
    }
    drop(w);
    let (_, r) = Wal::open(dir.path(), Options::default()).unwrap();
    assert!(r.repaired.is_none());
    assert_eq!(r.entries.len(), 3000);
    assert!(r
        .entries
        .iter()
        .zip(1..)
        .all(|(e, i)| e.index == i && e.data == big(i).data));

    // A copy of a record far past the end of the log, in what should be zeros: one whose
    // length starts with a non-zero byte, then (alone) one whose length's low byte is zero.
    let seg = last_segment(dir.path());
    let data = std::fs::read(&seg).unwrap();
    let end = data.iter().rposition(|&b| b != 0).unwrap() + 1;
    let offsets = record_offsets(&data);
    let record = |low_zero: bool| {
        let at = *(offsets.iter())
            .find(|&&o| o > 0 && (data[o] == 0) == low_zero)
            .expect("such a record");
        let len = 9 + u32::from_le_bytes(data[at..at + 4].try_into().unwrap()) as usize;
        &data[at..at + len]
    };
    for (low_zero, far) in [(false, 10 << 20), (true, 20 << 20)] {
        let copy = record(low_zero);
        write_at(&seg, copy, far);
        match Wal::open(dir.path(), Options::default()) {
            Err(Error::Corrupt { offset, reason, .. }) => {
                assert_eq!(offset, end as u64);
                assert!(reason.contains("valid records follow"), "{reason}");
            }
            Err(e) => panic!("{e}"),
            Ok((_, r)) => panic!("opened with {} entries", r.entries.len()),
        }
        write_at(&seg, &vec![0; copy.len()], far);
    }
}

fn flip(path: &Path, offset: u64) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    b[0] ^= 0x40;
    f.write_all_at(&b, offset).unwrap();
}

#[test]
fn a_flipped_byte_is_refused_with_file_and_offset() {
    for victim in [2u64, 20] {
        let dir = tempfile::tempdir().unwrap();
        let (seg, data) = twenty_entries(dir.path());
        // The record of entry `victim`: find its data text and flip a byte in it.
        let needle = format!("entry {victim} of term 1");
        let at = data
            .windows(needle.len())
            .position(|w| w == needle.as_bytes())
            .unwrap();
        flip(&seg, at as u64 + 3);
        let err = Wal::open(dir.path(), Options::default()).unwrap_err();
        match &err {
            Error::Corrupt { path, .. } => assert_eq!(path, &seg),
            other => panic!("victim {victim}: {other}"),
        }
        let msg = err.to_string();
        assert!(
            msg.contains("checksum") && msg.contains("refusing to start"),
            "{msg}"
        );
    }
}

#[test]
fn one_process_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let _w = Wal::create(dir.path(), b"m", small()).unwrap();
    assert!(matches!(
        Wal::open(dir.path(), small()),
        Err(Error::Locked(_))
    ));
    assert!(matches!(
        Wal::create(tempfile::tempdir().unwrap().path().join("x"), b"", small()).map(|_| ()),
        Ok(())
    ));
}

#[test]
fn a_missing_segment_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wal::create(dir.path(), b"m", small()).unwrap();
    for i in 1..=1000u64 {
        w.save(None, &[entry(i, 1)], false).unwrap();
    }
    let segs = w.segment_paths();
    drop(w);
    std::fs::remove_file(&segs[1]).unwrap();
    let err = Wal::open(dir.path(), small()).unwrap_err().to_string();
    assert!(err.contains("missing"), "{err}");
}
