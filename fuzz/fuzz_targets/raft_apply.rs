//! Raft entries applied: what a log entry carries (kvd's internal request: every etcd write
//! request, lease and auth and alarm and downgrade changes, with or without the caller's
//! header) from arbitrary bytes, as a damaged WAL or a faulty peer could hand them to the
//! state machine. Each entry gets an answer or an error, never a panic; the store flushes,
//! reopens, and checks out.
//!
//! The input is entries, each a little-endian u16 length and that many bytes.
#![no_main]

use std::sync::Arc;

use consensus::{Committed, StateMachine};
use libfuzzer_sys::fuzz_target;
use rpc::auth::{Auth, Tokens};
use rpc::{Backend, KvStateMachine};

fuzz_target!(|data: &[u8]| {
    let mut entries = Vec::new();
    let mut rest = data;
    while rest.len() >= 2 && entries.len() < 64 {
        let n = (u16::from_le_bytes([rest[0], rest[1]]) as usize).min(rest.len() - 2);
        entries.push(&rest[2..2 + n]);
        rest = &rest[2 + n..];
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("db");
    let backend = Arc::new(Backend::open(&path, Default::default()).expect("a new store"));
    let auth = Arc::new(Auth::new(Tokens::None, 4, false));
    let mut sm = KvStateMachine::new(backend.clone(), auth);
    let mut batch: Vec<Committed<'_>> = entries
        .iter()
        .enumerate()
        .map(|(i, d)| committed(i, d))
        .collect();
    // One batch, then each entry again in a batch of its own (already applied: skipped).
    let answers = sm.apply(&mut batch).expect("no entry fails the store");
    assert_eq!(answers.len(), batch.len());
    for (i, d) in entries.iter().enumerate() {
        sm.apply(&mut [committed(i, d)])
            .expect("a re-applied entry is skipped");
    }
    sm.sync().expect("a flush");
    drop(sm);
    drop(backend);
    let reopened = Backend::open(&path, Default::default()).expect("the store reopens");
    assert_eq!(reopened.store().applied().index.0, batch.len() as u64);
    assert!(reopened.store().db().check().is_ok(), "the file checks out");
});

/// The `i`th entry (index `i + 1`), holding `d`, as a follower applies it.
fn committed(i: usize, d: &[u8]) -> Committed<'_> {
    Committed {
        index: consensus::RaftIndex(i as u64 + 1),
        term: 1,
        data: Some(d),
        local: None,
    }
}
