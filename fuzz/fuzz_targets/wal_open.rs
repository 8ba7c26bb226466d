//! WAL replay of arbitrary segment bytes: an error naming the file (corrupt, not a log) or the
//! recovered records, never a panic; a log that opens takes an append and opens again.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let seg = dir.path().join("0000000000000000-0000000000000000.wal");
    std::fs::write(&seg, data).expect("write the segment");
    let opts = consensus::wal::Options {
        segment_size: 1 << 16,
    };
    let _ = consensus::wal::Wal::read_metadata(dir.path());
    let Ok((mut wal, rec)) = consensus::wal::Wal::open(dir.path(), opts) else {
        return;
    };
    let e = raft::eraftpb::Entry {
        index: rec
            .entries
            .last()
            .map_or(rec.snapshot.index.0, |e| e.index)
            .saturating_add(1),
        term: rec.hard_state.term.max(1),
        ..Default::default()
    };
    if wal.save(None, &[e], false).is_ok() {
        drop(wal);
        assert!(
            consensus::wal::Wal::open(dir.path(), opts).is_ok(),
            "a log that opened and took an append no longer opens"
        );
    }
});
