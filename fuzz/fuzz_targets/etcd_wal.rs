//! etcd's WAL read from arbitrary bytes, as `kvd migrate` reads an etcd member's log: frames,
//! records, the CRC chain, entries and membership changes, torn tails. An error or a log,
//! never a panic or a hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let wal = dir.path().join("member").join("wal");
    std::fs::create_dir_all(&wal).expect("create the WAL directory");
    std::fs::write(wal.join("0000000000000000-0000000000000000.wal"), data)
        .expect("write the segment");
    if let Ok(log) = consensus::etcd_log::read_etcd_log(&dir.path().join("member")) {
        let mut members = consensus::Members::default();
        let _ = rpc::migrate::translate(&log.entries, &mut members);
    }
});
