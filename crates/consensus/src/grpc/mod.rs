//! The peer transport: raft's messages framed on the peer connection (`framed`), and gRPC
//! (tonic, HTTP/2; kvd's own `proto/kvd/peer.proto`) for snapshots, probes, joins and the
//! stream of members from before the framed one.
//!
//! Sending: one task per peer keeps one long-lived stream open and writes batches — everything
//! queued for that peer since the last write goes in one write, so a busy leader pipelines
//! many appends per write. A broken or refused stream is reopened with exponential backoff;
//! raft is told the peer is unreachable and resends what was lost. A peer that does not answer
//! the framed stream's opening gets the gRPC stream. Snapshots go in their own call, in 1 MiB
//! chunks that HTTP/2 flow control paces.
//!
//! Receiving: [`PeerService`] checks every stream's cluster id and target member (the framed
//! stream's opening, a gRPC call's metadata) before anything else is read; a peer from another cluster is refused with
//! FAILED_PRECONDITION naming both clusters, and the sender records and logs that refusal, so
//! both sides say what is wrong.
//!
//! Its parts: `framed` (the framed stream's frames and its sending side), `direct` (a framed
//! stream over plain TCP, written by the sending thread), `receive` (its receiving side: read
//! by a thread of its own while its sender leads, by a task while it follows), `wire` (what
//! both sides share: request metadata, identity checks, limits), `service` (the gRPC calls
//! received), `sender` (the [`Transport`](crate::transport::Transport) with one stream per
//! peer), `probe` (round-trip times), `snapshot` (sending one), `join` (asking a peer for the
//! cluster).

mod direct;
mod framed;
mod join;
mod probe;
mod receive;
mod sender;
mod service;
mod snapshot;
mod ticker;
mod wire;

/// The generated protocol code.
#[allow(missing_debug_implementations, clippy::all)]
pub mod pb {
    tonic::include_proto!("kvdpeer");
}

pub use framed::MAGIC;

/// The framed stream's parsers of what a peer sends, for the fuzz target
/// (`fuzz/fuzz_targets/peer_stream.rs`).
#[doc(hidden)]
pub mod parse {
    use raft::eraftpb::Message;

    /// The raft messages a receiver reads from `chunks` arriving one after another (after the
    /// opening), and the error that ends the stream if one does.
    pub fn frames<'a>(
        chunks: impl IntoIterator<Item = &'a [u8]>,
    ) -> (Vec<Message>, Option<String>) {
        let (mut buf, mut out) = (Vec::new(), Vec::new());
        for c in chunks {
            buf.extend_from_slice(c);
            if let Err(e) = super::framed::decode(&mut buf, &mut out) {
                return (out, Some(e));
            }
        }
        (out, None)
    }

    /// One raft message's bytes as the receiver reads them (`crate::raftpb`, which leaves
    /// what it is not sure of to rust-protobuf).
    pub fn message(bytes: &[u8]) -> Result<Message, String> {
        crate::raftpb::parse_message(bytes).map_err(|e| e.to_string())
    }

    /// A sender's reading of the receiver's records: `Err` is the stream's end (a refusal, or
    /// a record it does not know).
    pub fn records(bytes: &[u8]) -> Result<(), String> {
        super::framed::read_records(&mut bytes.to_vec(), "a peer")
    }
}
pub use join::{fetch_members, FetchError};
pub use sender::GrpcTransport;
pub use service::{MembersFn, PeerService};
pub use wire::MAX_MESSAGE;
