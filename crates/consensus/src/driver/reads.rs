//! ReadIndex rounds, and the answers that wait for the apply thread: reads at their index,
//! membership changes once applied.

use std::mem;
use std::time::Instant;

use raft::ReadState;
use tokio::sync::oneshot;

use crate::node::Result;

use super::open::Driver;

#[derive(Debug)]
pub(super) struct ReadWaiter {
    pub(super) reply: oneshot::Sender<Result<u64>>,
    pub(super) deadline: Instant,
}

#[derive(Debug)]
pub(super) struct ReadRound {
    pub(super) ctx: Vec<u8>,
    pub(super) issued: Instant,
    pub(super) waiters: Vec<ReadWaiter>,
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

    pub(super) fn issue_reads(&mut self) {
        if self.reads_inflight.is_some() || self.reads_pending.is_empty() {
            return;
        }
        let ctx = self.next_seq().to_le_bytes().to_vec();
        self.raw.read_index(ctx.clone());
        self.reads_inflight = Some(ReadRound {
            ctx,
            issued: Instant::now(),
            waiters: mem::take(&mut self.reads_pending),
        });
    }

    pub(super) fn on_read_states(&mut self, states: Vec<ReadState>) {
        for rs in states {
            if self
                .reads_inflight
                .as_ref()
                .is_some_and(|r| r.ctx == rs.request_ctx)
            {
                if let Some(round) = self.reads_inflight.take() {
                    self.reads_ready.push((rs.index, round.waiters));
                }
            }
        }
        self.answer_applied();
    }
}
