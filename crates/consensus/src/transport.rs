//! How raft messages leave a member. The node hands messages to a [`Transport`] and learns of
//! failures through a [`Reporter`]; messages arriving from peers go in through
//! [`crate::RaftNode::step`] and [`crate::RaftNode::receive_snapshot`].

use std::path::PathBuf;
use std::sync::mpsc::Sender;

use raft::eraftpb::Message;

use crate::member::Members;
use crate::node::Cmd;
use ids::MemberId;

/// Carries raft messages to peers. Called from the raft thread: no method may block.
pub trait Transport: Send + 'static {
    /// Called once, before any message is sent.
    fn start(&mut self, reporter: Reporter);
    /// Sends messages (never `MsgSnapshot`), best effort: a message may be lost, raft resends.
    fn send(&mut self, msgs: Vec<Message>);
    /// Sends a snapshot message with the state machine's data read from the file at `data`;
    /// `done` must be told whether the follower got it.
    fn send_snapshot(&mut self, msg: Message, data: PathBuf, done: SnapshotDone);
    /// The member list changed: connect to new peers, drop removed ones.
    fn update_members(&mut self, members: &Members);
    /// Since when the link to `peer` has been up without a break (etcd's transport
    /// `ActiveSince`): the leader's membership checks count a peer as live only once it has
    /// been for a while. `None`: not connected now (or a transport that cannot tell, whose
    /// peers then never count as live).
    fn active_since(&self, _peer: MemberId) -> Option<std::time::Instant> {
        None
    }
    /// Whether `send` now writes every peer's messages out on the calling thread, with no task
    /// of the runtime to carry them: a leader's proposals may then take the Ready loop's turn
    /// on the proposer's thread (a worker blocked in that turn's fsync holds nothing back).
    fn sends_inline(&self) -> bool {
        false
    }
}

/// Tells the node what became of messages it sent.
#[derive(Debug, Clone)]
pub struct Reporter {
    pub(crate) tx: Sender<Cmd>,
}

impl Reporter {
    /// `id` could not be reached (raft slows down sending to it).
    pub fn unreachable(&self, id: MemberId) {
        let _ = self.tx.send(Cmd::Unreachable(id.0));
    }

    /// Peer `by` refused this member's messages because it was removed from the cluster.
    pub fn removed_by(&self, by: MemberId) {
        let _ = self.tx.send(Cmd::RemovedByPeer(by.0));
    }
}

/// The outcome of one snapshot transfer, reported exactly once (a dropped `SnapshotDone` reports
/// a failure, so raft never waits forever for it).
#[derive(Debug)]
pub struct SnapshotDone {
    reporter: Reporter,
    to: u64,
    sent: bool,
}

impl SnapshotDone {
    pub(crate) fn new(reporter: Reporter, to: u64) -> Self {
        SnapshotDone {
            reporter,
            to,
            sent: false,
        }
    }

    pub fn finish(mut self, delivered: bool) {
        self.sent = true;
        let _ = self
            .reporter
            .tx
            .send(Cmd::SnapshotStatus(self.to, delivered));
    }
}

impl Drop for SnapshotDone {
    fn drop(&mut self) {
        if !self.sent {
            let _ = self.reporter.tx.send(Cmd::SnapshotStatus(self.to, false));
        }
    }
}
