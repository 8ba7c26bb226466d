//! The peer port's framed raft stream as a peer (or anyone who knows the cluster id) could send
//! it after the opening, arriving in pieces of any size: the same messages and the same error
//! as when it arrives whole, never a panic; the records a sender reads back; and one message's
//! bytes, read as rust-protobuf reads them.
#![no_main]

use consensus::grpc::parse;
use libfuzzer_sys::fuzz_target;
use protobuf::Message as _;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 1 {
        let _ = parse::records(rest);
        return;
    }
    if mode & 2 == 2 {
        let ours = parse::message(rest);
        let theirs = raft::eraftpb::Message::parse_from_bytes(rest);
        assert_eq!(ours.is_ok(), theirs.is_ok(), "{ours:?} {theirs:?}");
        if let (Ok(ours), Ok(theirs)) = (ours, theirs) {
            assert_eq!(ours, theirs);
        }
        return;
    }
    // Piece sizes from 1 to 64 bytes, chosen by the input's own bytes.
    let mut chunks = Vec::new();
    let (mut at, mut i) = (0, 0);
    while at < rest.len() {
        let n = (usize::from(rest[i % rest.len()] ^ mode) % 64 + 1).min(rest.len() - at);
        chunks.push(&rest[at..at + n]);
        at += n;
        i += 1;
    }
    let (pieces, pieces_err) = parse::frames(chunks);
    let (whole, whole_err) = parse::frames([rest]);
    assert_eq!(
        pieces_err.is_some(),
        whole_err.is_some(),
        "{pieces_err:?} {whole_err:?}"
    );
    let bytes = |ms: &[raft::eraftpb::Message]| -> Vec<Vec<u8>> {
        ms.iter()
            .map(|m| m.write_to_bytes().expect("a decoded message encodes"))
            .collect()
    };
    assert_eq!(bytes(&pieces), bytes(&whole));
});
