//! ReadIndex rounds, and the answers that wait for the apply thread: reads at their index,
//! membership changes once applied.
//!
//! A leader's round also answers its followers' reads. raft-rs gives every follower's
//! `MsgReadIndex` a heartbeat round of its own, beside the leader's round for its own reads;
//! here a follower's request waits, like a local read, for the leader's next round (one issued
//! after the request arrived, so its index is at least the commit index the request found),
//! and is answered with that round's index. With reads arriving at every member, one round of
//! heartbeats serves all three members' batches instead of three rounds.

use std::mem;
use std::time::Instant;

use raft::eraftpb::{Message, MessageType};
use raft::{ReadState, StateRole};
use tokio::sync::oneshot;

use crate::node::Result;

use super::open::Driver;

#[derive(Debug)]
pub(super) struct ReadWaiter {
    pub(super) reply: oneshot::Sender<Result<u64>>,
    pub(super) deadline: Instant,
    /// Answered once this member has applied the round's index (a read point); else as soon
    /// as the round returns (the leadership confirmed).
    pub(super) applied: bool,
}

#[derive(Debug)]
pub(super) struct ReadRound {
    pub(super) ctx: Vec<u8>,
    pub(super) issued: Instant,
    pub(super) waiters: Vec<ReadWaiter>,
    /// Followers' requests the round answers (a leader's round only).
    pub(super) remote: Vec<RemoteRead>,
}

/// A follower's `MsgReadIndex`, waiting at the leader for a round.
#[derive(Debug)]
pub(super) struct RemoteRead {
    pub(super) req: Message,
    pub(super) arrived: Instant,
}

impl<O: Send + 'static> Driver<O> {
    pub(super) fn on_applied(&mut self, index: u64) {
        self.take_applied(index);
        self.answer_applied();
    }

    pub(super) fn take_applied(&mut self, index: u64) {
        self.applied = self.applied.max(index);
        let log = &self.raw.raft.raft_log;
        let to = self.applied.min(log.committed).min(log.persisted);
        if to > log.applied {
            self.raw.advance_apply_to(to);
            // Alone in the configuration (no voter, learner or joint member but this one), no
            // follower reads the log: what is applied goes (`LogStore::trim`).
            let prs = self.raw.raft.prs();
            if prs.iter().count() == 1 && prs.get(self.cfg.id.0).is_some() {
                self.raw.mut_store().trim(to);
            }
        }
    }

    /// Takes in what the apply thread applied, answers the membership changes and reads waiting
    /// for it, and tells the apply thread whether to wake this thread when it applies more.
    pub(super) fn answer_applied(&mut self) {
        self.take_applied(self.shared.applied());
        loop {
            self.answer_applied_now();
            let want = !self.changes_applied.is_empty()
                || !self.reads_ready.is_empty()
                || self.raw.raft.has_pending_conf();
            let applied = self.shared.want_applied(want);
            if !want || applied <= self.applied {
                break;
            }
            self.take_applied(applied);
        }
    }

    pub(super) fn answer_applied_now(&mut self) {
        if self.changes_applied.is_empty() && self.reads_ready.is_empty() {
            return;
        }
        let applied = self.applied;
        let (done, wait): (Vec<_>, Vec<_>) = mem::take(&mut self.changes_applied)
            .into_iter()
            .partition(|c| c.0 <= applied);
        self.changes_applied = wait;
        for (_, r, members) in done {
            let _ = r.send(Ok(members));
        }
        let (done, wait): (Vec<_>, Vec<_>) = mem::take(&mut self.reads_ready)
            .into_iter()
            .partition(|(i, _)| *i <= applied);
        self.reads_ready = wait;
        for (i, ws) in done {
            for w in ws {
                let _ = w.reply.send(Ok(i));
            }
        }
    }

    /// Takes a follower's read request into the leader's next round; gives it back when it is
    /// not for this member to keep (not the leader, the request its own, or one with a term,
    /// which raft-rs's followers never set on it): raft-rs handles it then.
    pub(super) fn keep_remote_read(&mut self, m: Message) -> Option<Message> {
        let r = &self.raw.raft;
        if r.state != StateRole::Leader || m.from == r.id || m.from == 0 || m.term != 0 {
            return Some(m);
        }
        self.reads_remote.push(RemoteRead {
            req: m,
            arrived: Instant::now(),
        });
        None
    }

    pub(super) fn issue_reads(&mut self) {
        if self.raw.raft.state != StateRole::Leader && !self.reads_remote.is_empty() {
            // Leadership moved on: the followers ask again (they retry a round unanswered).
            self.reads_remote.clear();
        }
        if self.reads_inflight.is_some()
            || (self.reads_pending.is_empty() && self.reads_remote.is_empty())
        {
            return;
        }
        let ctx = self.next_seq().to_le_bytes().to_vec();
        self.raw.read_index(ctx.clone());
        self.reads_inflight = Some(ReadRound {
            ctx,
            issued: Instant::now(),
            waiters: mem::take(&mut self.reads_pending),
            remote: mem::take(&mut self.reads_remote),
        });
    }

    /// Answers followers' requests with a round's index, as raft-rs's leader does.
    fn answer_remote(&mut self, index: u64, remote: Vec<RemoteRead>) {
        let (me, term) = (self.raw.raft.id, self.raw.raft.term);
        let answers = (remote.into_iter())
            .map(|mut r| {
                let mut m = Message::default();
                m.set_msg_type(MessageType::MsgReadIndexResp);
                (m.to, m.from, m.term, m.index) = (r.req.from, me, term, index);
                m.set_entries(r.req.take_entries());
                m
            })
            .collect();
        self.send(answers);
    }

    pub(super) fn on_read_states(&mut self, states: Vec<ReadState>) {
        for rs in states {
            if self
                .reads_inflight
                .as_ref()
                .is_some_and(|r| r.ctx == rs.request_ctx)
            {
                if let Some(round) = self.reads_inflight.take() {
                    self.answer_remote(rs.index, round.remote);
                    let (applied, confirmed): (Vec<_>, Vec<_>) =
                        round.waiters.into_iter().partition(|w| w.applied);
                    for w in confirmed {
                        let _ = w.reply.send(Ok(rs.index));
                    }
                    if !applied.is_empty() {
                        self.reads_ready.push((rs.index, applied));
                    }
                }
            }
        }
        self.answer_applied();
    }
}
