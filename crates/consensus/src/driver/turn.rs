//! The Ready loop's turns: commands, proposals, ticks and their deadlines, one Ready each, its
//! messages sent and its committed entries handed to the apply thread.

use std::mem;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Instant;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use raft::eraftpb::{
    ConfChange, ConfChangeSingle, ConfChangeV2, Entry, EntryType, Message, MessageType,
};
use raft::{ProgressState, SnapshotStatus, StateRole};

use crate::apply::ApplyTask;
use crate::node::{
    context, deadline, parse_context, Cmd, Error, ProposeAt, Result, Role, Shared,
    TAG_MEMBER_UPDATE,
};
use crate::transport::SnapshotDone;
use ids::{MemberId, RaftIndex};

use super::open::{Driver, Pending};
use super::reads::{ReadWaiter, RemoteRead};

/// Commands taken per turn of the raft loop.
const MAX_BATCH: usize = 4096;

/// The context of an append that only tells a commit index to a follower whose log the leader
/// knows holds everything up to the append's index: its answer would tell the leader nothing
/// (raft-rs's leader takes an answer at or below what it knows to match as a no-op), so the
/// follower does not send it. raft-rs reads no context on appends; a member without this
/// answers as before.
const COMMIT_ONLY: &[u8] = b"commit-only";

impl<O: Send + 'static> Driver<O> {
    /// The raft thread: waits for commands or the next tick, and takes a turn for each wake-up,
    /// until stopped or failed; then stops the apply thread, fails what waits and drops the
    /// driver (its WAL, its transport), leaving `None`.
    pub(crate) fn run(slot: &Mutex<Option<Self>>, rx: Receiver<Cmd>) {
        let started = slot.lock().as_mut().map(|d| {
            d.raft_thread = Some(std::thread::current().id());
            (d.cfg.heartbeat, d.cfg.commit_tell_delay, d.shared.clone())
        });
        let Some((tick, commit_tell_delay, shared)) = started else {
            return;
        };
        let mut next_tick = Instant::now() + tick;
        let result = loop {
            let due = *shared.commit_due.lock();
            let until = due.map_or(next_tick, |d| d.min(next_tick));
            // Another thread queued work while this one was in a turn (see `take_turn`): no wait.
            std::sync::atomic::fence(Ordering::SeqCst);
            let wait = match shared.turn_wanted.load(Ordering::SeqCst) {
                true => std::time::Duration::ZERO,
                false => until.saturating_duration_since(Instant::now()),
            };
            let mut first = match rx.recv_timeout(wait) {
                Ok(cmd) => Some(cmd),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break Ok(()),
            };
            // A deadline moved earlier asks for no turn, only a sleep to the new one (below).
            while let Some(Cmd::Deadline) = first {
                first = rx.try_recv().ok();
            }
            let now = Instant::now();
            let tick_due = now >= next_tick;
            if tick_due {
                next_tick = (next_tick + tick).max(now);
            }
            // Woken by the commit deadline alone, or told it moved earlier: the first needs a
            // turn only if no entries went out since it was set (while writes go on, the next
            // entries carry the commit index and the deadline only moves a period on), the
            // second none. A turn would wait for the loop, which a proposer's turn holds
            // through its fsync (and a parked waiter costs the holder a wake-up when it lets
            // go).
            if first.is_none() && !tick_due && !shared.turn_wanted.load(Ordering::SeqCst) {
                let due = *shared.commit_due.lock();
                // Not passed (moved on or disarmed by a turn meanwhile), or moved on now.
                if due.is_none_or(|d| now < d) || shared.move_commit_due_on(now, commit_tell_delay)
                {
                    continue;
                }
                // Passed with nothing gone out: the turn tells the followers.
            }
            // Take what is queued, up to a bound (a flood must not hold off ticks and Readies):
            // one Ready, one fsync, serves the whole batch.
            let more = std::iter::from_fn(|| rx.try_recv().ok());
            let mut cmds = first.into_iter().chain(more).take(MAX_BATCH);
            let r = match slot.lock().as_mut() {
                Some(d) => d.turn(&mut cmds, tick_due),
                None => Ok(false),
            };
            match r {
                Ok(true) => {}
                Ok(false) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        // From here a proposer that finds the loop busy cannot leave its proposal to the raft
        // thread: it waits for the lock instead (see `QueuedTurn`), and finds the loop ended.
        drop(rx);
        let mut slot = slot.lock();
        let Some(mut d) = slot.take() else { return };
        if let Err(e) = &result {
            tracing::error!(member = %d.cfg.id, "raft node stopped: {e}");
            d.shared.status.lock().failed = Some(e.to_string());
        }
        if result.is_ok() {
            if let Err(e) = d.save_commit() {
                tracing::warn!(member = %d.cfg.id, "commit index not saved at stop: {e}");
            }
        }
        d.ended = true;
        d.shared.publish_sole_leader(false, 0);
        let _ = d.apply.send(ApplyTask::Stop);
        if let Some(t) = d.apply_thread.take() {
            let _ = t.join();
        }
        d.fail_everything();
        drop(slot);
        // What a thread queued while this one held the loop, finding it busy.
        std::sync::atomic::fence(Ordering::SeqCst);
        shared.fail_queued();
    }

    /// A turn on a proposer's thread, for the proposals queued for one ([`Shared::queued`]),
    /// or on a receiver's, for peer messages ([`Shared::stepped`]); with the loop ended
    /// (`None`, or failed), what waits is failed. A failure stops the node, as
    /// on the raft thread.
    pub(crate) fn take_queued(slot: &mut Option<Self>, shared: &Shared<O>) {
        match slot {
            Some(d) if !d.ended => {
                if let Err(e) = d.turn(&mut std::iter::empty(), false) {
                    tracing::error!(member = %d.cfg.id, "raft node stopped: {e}");
                    shared.status.lock().failed = Some(e.to_string());
                    // No more turns; the raft thread, woken, winds the node down.
                    d.ended = true;
                    let _ = shared.tx.send(Cmd::Stop);
                }
            }
            _ => shared.fail_queued(),
        }
    }

    /// One turn: the commands, the peer messages and proposals queued for a turn, a tick if
    /// one is due (only the raft thread keeps time), then one Ready (one WAL write and fsync
    /// for all of it).
    /// `Ok(false)`: stop.
    pub(super) fn turn(&mut self, cmds: &mut dyn Iterator<Item = Cmd>, tick: bool) -> Result<bool> {
        if self.ended {
            return Ok(false);
        }
        // Cleared before the queues are taken: work queued after this sets it again.
        self.shared.turn_wanted.store(false, Ordering::SeqCst);
        for cmd in cmds {
            if !self.handle(cmd)? {
                return Ok(false);
            }
        }
        let stepped = mem::take(&mut *self.shared.stepped.lock());
        for m in stepped {
            self.step(m);
        }
        let reads = mem::take(&mut *self.shared.reads_queued.lock());
        for (reply, applied) in reads {
            self.queue_read(reply, applied);
        }
        self.propose_queued();
        if tick {
            self.raw.tick();
            self.on_tick(Instant::now());
            self.save_commit()?;
        }
        self.issue_reads();
        let round_out = self.reads_inflight.is_some();
        self.on_ready()?;
        if round_out && self.reads_inflight.is_none() {
            // A round answered in that Ready: the reads that waited for it go out now, not at
            // the next message or tick.
            self.issue_reads();
            self.on_ready()?;
        }
        self.tell_commit(Instant::now())?;
        self.answer_applied();
        if !self.spooling {
            if let Some(want) = self.raw.store().take_wanted() {
                tracing::debug!(want, "a follower needs a snapshot; spooling one");
                self.spooling = self.apply.send(ApplyTask::Spool).is_ok();
            }
        }
        self.publish_status();
        Ok(true)
    }

    /// A leader tells its followers a new commit index with the entries that follow it, not in
    /// an empty append of its own each time (raft-rs's `skip_bcast_commit`): under load every
    /// append carries it, and a lone client's write costs four peer messages, not eight. The
    /// index goes alone to a member whose proposals were just committed (it waits to answer
    /// its client), to every member for a membership change, and to every follower
    /// `Config::commit_tell_delay` after it was first left untold if no entries went out
    /// meanwhile (the writes stopped: followers' reads and watchers then lag by that at most).
    pub(super) fn tell_commit(&mut self, now: Instant) -> Result<()> {
        if self.raw.raft.state != StateRole::Leader {
            self.commit_awaited.clear();
            self.commit_for_all = false;
            self.set_commit_due(None);
            return Ok(());
        }
        if mem::take(&mut self.commit_for_all) {
            self.commit_awaited.clear();
            self.raw.raft.bcast_append();
            self.on_ready()?;
        }
        // A member is told once its log holds the index (the leader may commit on another
        // follower's answer before this one's).
        let tell: Vec<u64> = (self.commit_awaited.keys().copied())
            .filter(|id| self.untold(*id))
            .collect();
        if !tell.is_empty() {
            for &id in &tell {
                self.raw.raft.send_append(id);
            }
            self.on_ready()?;
        }
        let (told, prs) = (&self.told, self.raw.raft.prs());
        (self.commit_awaited)
            .retain(|id, index| prs.get(*id).is_some() && told.get(id).is_none_or(|t| t < index));
        let me = self.raw.raft.id;
        let untold = (self.raw.raft.prs().iter()).any(|(id, _)| *id != me && self.untold(*id));
        let due = *self.shared.commit_due.lock();
        let period = self.cfg.commit_tell_delay;
        if !untold {
            // Left armed until it passes: a write that leaves a follower untold again before
            // then needs no wake-up of the raft thread to arm it (one per write, else). Passed
            // while entries went out, it is armed again here: writes go on, the next commit
            // will leave one untold, and arming it then would take a wake-up of its own.
            if due.is_some_and(|due| now >= due) && !self.shared.move_commit_due_on(now, period) {
                self.set_commit_due(None);
            }
            return Ok(());
        }
        match due {
            Some(due) if now < due => {}
            // Writes go on: the next entries carry it; look again a period later.
            Some(_) if self.shared.move_commit_due_on(now, period) => {}
            None => {
                (self.shared.appended_since_due).store(false, Ordering::Relaxed);
                self.set_commit_due(Some(now + period));
            }
            Some(_) => {
                self.raw.raft.bcast_append();
                self.on_ready()?;
                self.set_commit_due(None);
            }
        }
        Ok(())
    }

    /// Whether this leader knows follower `id`'s log to hold everything up to `index`, with
    /// the follower's appends flowing (so an answer at `index` would change nothing).
    fn matches(&self, id: u64, index: u64) -> bool {
        let r = &self.raw.raft;
        r.state == StateRole::Leader
            && (r.prs().get(id))
                .is_some_and(|pr| pr.state == ProgressState::Replicate && pr.matched >= index)
    }

    /// Whether follower `id` has not been sent the commit index it can take (the leader's,
    /// as far as its log matches).
    fn untold(&self, id: u64) -> bool {
        let r = &self.raw.raft;
        let told = self.told.get(&id).copied().unwrap_or(0);
        (r.prs().get(id)).is_some_and(|pr| told < r.raft_log.committed.min(pr.matched))
    }

    /// Sets when the raft thread must take a turn to tell the commit index (see
    /// `Shared::commit_due`, which its loop reads).
    fn set_commit_due(&self, due: Option<Instant>) {
        let old = std::mem::replace(&mut *self.shared.commit_due.lock(), due);
        let earlier = match (due, old) {
            (Some(d), Some(old)) => d < old,
            (Some(_), None) => true,
            _ => false,
        };
        // The raft thread sleeps until its next tick: wake it to sleep until `due` instead.
        if earlier && self.raft_thread != Some(std::thread::current().id()) {
            let _ = self.shared.tx.send(Cmd::Deadline);
        }
    }

    /// A linearizable read (`applied`: answered once applied to its index) or a leadership
    /// check joins the next round of heartbeats.
    pub(super) fn queue_read(&mut self, reply: oneshot::Sender<Result<u64>>, applied: bool) {
        if self.removed {
            let _ = reply.send(Err(Error::Removed));
        } else {
            self.reads_pending.push(ReadWaiter {
                reply,
                deadline: deadline(self.cfg.request_timeout),
                applied,
            });
        }
    }

    pub(super) fn propose_queued(&mut self) {
        let queued = mem::take(&mut *self.shared.queued.lock());
        // Counts the turns of a lone proposal in a row (see `Company::None`); a turn of
        // several starts the count over, one of none (a peer's, a tick's) leaves it.
        let lone = &self.shared.lone_turns;
        match queued.len() {
            0 => {}
            1 => {
                let n = lone.load(Ordering::Relaxed);
                lone.store((n + 1).min(crate::node::LONE_TURNS), Ordering::Relaxed);
            }
            _ => lone.store(0, Ordering::Relaxed),
        }
        for (seq, data) in queued {
            self.propose(seq, data);
        }
    }

    pub(super) fn fail_everything(&mut self) {
        self.shared.fail_queued();
        let changes = self.changes.drain().map(|(_, r)| r);
        for r in changes.chain(self.changes_applied.drain(..).map(|c| c.1)) {
            let _ = r.send(Err(Error::Stopped));
        }
        let reads = mem::take(&mut self.reads_pending)
            .into_iter()
            .chain(
                self.reads_inflight
                    .take()
                    .into_iter()
                    .flat_map(|r| r.waiters),
            )
            .chain(
                mem::take(&mut self.reads_ready)
                    .into_iter()
                    .flat_map(|r| r.1),
            );
        for w in reads {
            let _ = w.reply.send(Err(Error::Stopped));
        }
        // Followers' requests are not answered: they time out there.
        self.reads_remote.clear();
    }

    pub(super) fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    pub(super) fn handle(&mut self, cmd: Cmd) -> Result<bool> {
        match cmd {
            Cmd::Propose { seq, data } => self.propose(seq, data),
            Cmd::Change { change, reply } => self.change(change, reply),
            Cmd::TransferLeader(id) => self.raw.transfer_leader(id),
            Cmd::Campaign => {
                if let Err(e) = self.raw.campaign() {
                    tracing::info!("campaign refused: {e}");
                }
            }
            Cmd::Unreachable(id) => self.raw.report_unreachable(id),
            Cmd::RemovedByPeer(by) => {
                if !self.removed {
                    tracing::warn!(member = %self.cfg.id, peer = %MemberId(by), "a peer says this member was removed from the cluster");
                    self.removed = true;
                    self.shared.fail_all(|| Error::Removed);
                    self.publish_status();
                }
            }
            Cmd::SnapshotStatus(id, ok) => {
                let status = if ok {
                    SnapshotStatus::Finish
                } else {
                    SnapshotStatus::Failure
                };
                self.raw.report_snapshot(id, status);
            }
            Cmd::Applied(index) => self.on_applied(index),
            Cmd::Durable(index) => self.record_snapshot(index)?,
            Cmd::Spooled(index) => self.prepare_snapshot(index),
            Cmd::Fatal(e) => return Err(e),
            Cmd::Stop => return Ok(false),
            // Proposals are queued for a turn: this one takes them.
            Cmd::Kick => {}
            // Read by the raft thread's loop before it sleeps again.
            Cmd::Deadline => {}
        }
        Ok(true)
    }

    pub(super) fn leader(&self) -> Option<u64> {
        let l = self.raw.raft.leader_id;
        (l != 0).then_some(l)
    }

    pub(super) fn dropped(&self) -> Error {
        if self.removed {
            Error::Removed
        } else {
            match self.leader() {
                None => Error::NoLeader,
                // A leader transfer is under way.
                Some(_) => Error::LeaderChanged,
            }
        }
    }

    pub(super) fn propose(&mut self, seq: u64, data: Vec<u8>) {
        let ctx = context(crate::node::TAG_PROPOSAL, self.cfg.id.0, seq, None);
        let r = if self.removed {
            Err(Error::Removed)
        } else {
            self.raw.propose(ctx, data).map_err(|_| self.dropped())
        };
        match r {
            Ok(()) => self
                .deadlines
                .push_back((deadline(self.cfg.request_timeout), Pending::Proposal(seq))),
            Err(e) => {
                if let Some(w) = self.shared.waiters.lock().remove(&seq) {
                    let _ = w.answer.send(Err(e));
                }
            }
        }
    }

    pub(super) fn step(&mut self, m: Message) {
        if m.get_msg_type() == MessageType::MsgAppend && m.context == COMMIT_ONLY {
            self.step_commit_only(m);
            return;
        }
        if m.get_msg_type() == MessageType::MsgReadIndex && m.entries.len() != 1 {
            // raft-rs's leader would index a missing context and panic.
            tracing::warn!(from = m.from, "read request without one context; dropped");
            return;
        }
        let m = match m.get_msg_type() {
            MessageType::MsgReadIndex => match self.keep_remote_read(m) {
                Some(m) => m,
                None => return,
            },
            _ => m,
        };
        if m.get_msg_type() == MessageType::MsgSnapshot {
            let index = m.get_snapshot().get_metadata().index;
            if !self.shared.snapshotter.recv_path(index).exists() {
                tracing::warn!(
                    from = m.from,
                    index,
                    "snapshot message without its data; dropped"
                );
                return;
            }
        }
        if let Err(e) = self.raw.step(m) {
            tracing::debug!("message not taken: {e}");
        }
    }

    /// Steps a leader's commit-only append (see [`COMMIT_ONLY`]) and drops raft-rs's answer to
    /// it when that answer only acknowledges the append's own index in its own term. Any other
    /// answer goes out: a rejection (the log does not match after all), one at another index
    /// (raft-rs answers an append below its commit index with that commit index), one in a
    /// higher term (to a stale leader), or more than one message.
    fn step_commit_only(&mut self, mut m: Message) {
        m.context.clear();
        let (from, term, index) = (m.from, m.term, m.index);
        let had = self.raw.raft.msgs.len();
        if let Err(e) = self.raw.step(m) {
            tracing::debug!("message not taken: {e}");
        }
        let msgs = &mut self.raw.raft.msgs;
        let redundant = msgs.len() == had + 1
            && msgs.last().is_some_and(|a| {
                a.get_msg_type() == MessageType::MsgAppendResponse
                    && !a.reject
                    && a.to == from
                    && a.term == term
                    && a.index == index
            });
        if redundant {
            msgs.pop();
        }
    }

    pub(super) fn on_tick(&mut self, now: Instant) {
        while let Some((d, _)) = self.deadlines.front() {
            if *d > now {
                break;
            }
            let Some((_, p)) = self.deadlines.pop_front() else {
                break;
            };
            match p {
                Pending::Proposal(seq) => {
                    if let Some(w) = self.shared.waiters.lock().remove(&seq) {
                        let _ = w.answer.send(Err(Error::Timeout));
                    }
                }
                Pending::Change(seq) => {
                    if let Some(r) = self.changes.remove(&seq) {
                        let _ = r.send(Err(Error::Timeout));
                    }
                }
            }
        }
        let expire = |ws: &mut Vec<ReadWaiter>| {
            let (gone, keep): (Vec<_>, Vec<_>) =
                mem::take(ws).into_iter().partition(|w| w.deadline <= now);
            *ws = keep;
            for w in gone {
                let _ = w.reply.send(Err(Error::Timeout));
            }
        };
        expire(&mut self.reads_pending);
        for (_, ws) in &mut self.reads_ready {
            expire(ws);
        }
        self.reads_ready.retain(|(_, ws)| !ws.is_empty());
        // raft-rs drops a read silently (no leader; a new leader that has not committed in its
        // term): ask again after a few heartbeats. A follower does so with its own requests,
        // so a leader keeps theirs no longer than that.
        let retry = self.cfg.heartbeat * 5;
        let fresh = |r: &RemoteRead| now.duration_since(r.arrived) < retry;
        self.reads_remote.retain(fresh);
        if let Some(round) = &mut self.reads_inflight {
            expire(&mut round.waiters);
            round.remote.retain(fresh);
            let idle = round.waiters.is_empty() && round.remote.is_empty();
            if idle || now.duration_since(round.issued) >= retry {
                if let Some(r) = self.reads_inflight.take() {
                    self.reads_pending.extend(r.waiters);
                    self.reads_remote.extend(r.remote);
                }
            }
        }
        self.maybe_leave_joint(now);
    }

    pub(super) fn send(&mut self, msgs: Vec<Message>) {
        if msgs.is_empty() {
            return;
        }
        let mut plain = Vec::with_capacity(msgs.len());
        for mut m in msgs {
            match m.get_msg_type() {
                MessageType::MsgAppend | MessageType::MsgHeartbeat => {
                    let told = self.told.entry(m.to).or_default();
                    *told = (*told).max(m.commit);
                    if !m.entries.is_empty() {
                        self.shared
                            .appended_since_due
                            .store(true, Ordering::Relaxed);
                    } else if m.get_msg_type() == MessageType::MsgAppend
                        && self.matches(m.to, m.index)
                    {
                        m.context = COMMIT_ONLY.to_vec().into();
                    }
                }
                _ => {}
            }
            if m.get_msg_type() != MessageType::MsgSnapshot {
                plain.push(m);
                continue;
            }
            let index = m.get_snapshot().get_metadata().index;
            let path = self.shared.snapshotter.spool_path(index);
            let to = m.to;
            if path.exists() {
                let done = SnapshotDone::new(self.reporter.clone(), to);
                self.transport.send_snapshot(m, path, done);
            } else {
                // Without this, raft-rs would be handed the same snapshot at every try.
                tracing::warn!(to, index, "snapshot data is gone; will prepare another");
                self.raw.mut_store().clear_prepared();
                self.raw.report_snapshot(to, SnapshotStatus::Failure);
            }
        }
        if !plain.is_empty() {
            self.transport.send(plain);
        }
    }

    pub(super) fn on_ready(&mut self) -> Result<()> {
        if !self.raw.has_ready() {
            return Ok(());
        }
        let mut rd = self.raw.ready();
        // A leader sends its appends before its own fsync (raft thesis 10.2.1).
        self.send(rd.take_messages());
        if !rd.snapshot().is_empty() {
            self.install_snapshot(rd.snapshot().clone())?;
        }
        let entries = rd.take_entries();
        let mut hs = rd.hs().cloned();
        if hs.is_none() && !entries.is_empty() && self.commit_unsaved() {
            // A commit index not yet in the WAL rides with these entries.
            hs = Some(self.raw.store().hard_state().clone());
        }
        // A sole voter's entries are committed once durable: the hard state written with them
        // says so, sparing the write of the commit index that raft computes after this save.
        // (A leader appends in its own term; committing its last entry commits all before.)
        let r = &self.raw.raft;
        if let (StateRole::Leader, true, Some(last)) =
            (r.state, r.prs().is_singleton(), entries.last())
        {
            let mut h = hs.unwrap_or_else(|| self.raw.store().hard_state().clone());
            h.commit = h.commit.max(last.index);
            hs = Some(h);
        }
        // A hard state whose commit index alone moved, with no entries, is not written now:
        // the index rides with the next entries or hard state, or the next tick writes it
        // (`save_commit`) — a write less for each of a leader's commits. A restart that finds
        // the WAL's commit index behind what was applied loses nothing: the entries past it
        // are in the log (a leader's own before it counts them; a follower's before it
        // answers), raft commits them again, and the state machine skips what it already
        // holds — as after a power loss, where this write was never synced either.
        let saved = self.wal.hard_state();
        let written = hs
            .as_ref()
            .filter(|h| !entries.is_empty() || h.term != saved.term || h.vote != saved.vote);
        self.wal.save(written, &entries, rd.must_sync())?;
        if let Some(hs) = hs {
            self.raw.mut_store().set_hard_state(hs);
        }
        self.raw.mut_store().append(entries);
        self.send(rd.take_persisted_messages());
        self.handoff(rd.take_committed_entries())?;
        self.on_read_states(rd.take_read_states());
        let mut light = self.raw.advance_append(rd);
        if let Some(commit) = light.commit_index() {
            // Written later, as above.
            self.raw.mut_store().set_commit(commit);
        }
        self.send(light.take_messages());
        self.handoff(light.take_committed_entries())?;
        Ok(())
    }

    /// Whether the commit index is ahead of the one the WAL holds.
    fn commit_unsaved(&self) -> bool {
        self.wal.hard_state().commit < self.raw.store().hard_state().commit
    }

    /// Writes the commit index if the WAL's is behind (not synced, as raft-rs asks of a hard
    /// state whose commit alone moved): at each tick, and when the node stops.
    pub(super) fn save_commit(&mut self) -> Result<()> {
        if self.commit_unsaved() {
            let hs = self.raw.store().hard_state().clone();
            self.wal.save(Some(&hs), &[], false)?;
        }
        Ok(())
    }

    /// Committed entries go to the apply thread; membership changes take effect here first.
    pub(super) fn handoff(&mut self, entries: Vec<Entry>) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        for e in &entries {
            let ctx = if e.context.is_empty() {
                None
            } else {
                parse_context(&e.context)
                    .map_err(|err| tracing::warn!(index = e.index, "entry with {err}"))
                    .ok()
            };
            match (&ctx, e.get_entry_type()) {
                (_, EntryType::EntryConfChange | EntryType::EntryConfChangeV2) => {
                    self.commit_for_all = true;
                }
                (Some(c), _) if c.1 != self.cfg.id.0 => {
                    self.commit_awaited.insert(c.1, e.index);
                }
                _ => {}
            }
            match e.get_entry_type() {
                EntryType::EntryNormal => {
                    if let Some((TAG_MEMBER_UPDATE, origin, seq, Some(m))) = ctx {
                        self.update_member(e.index, origin, seq, m);
                    }
                }
                EntryType::EntryConfChange => match protobuf::Message::parse_from_bytes(&e.data) {
                    Ok(cc) => {
                        let cc: ConfChange = cc;
                        let mut single = ConfChangeSingle::default();
                        single.set_change_type(cc.get_change_type());
                        single.node_id = cc.node_id;
                        let mut v2 = ConfChangeV2::default();
                        v2.mut_changes().push(single);
                        self.apply_conf_change(e.index, v2, ctx);
                    }
                    Err(err) => tracing::error!(index = e.index, "bad conf change: {err}"),
                },
                EntryType::EntryConfChangeV2 => {
                    match protobuf::Message::parse_from_bytes(&e.data) {
                        Ok(cc) => self.apply_conf_change(e.index, cc, ctx),
                        Err(err) => tracing::error!(index = e.index, "bad conf change: {err}"),
                    }
                }
            }
        }
        self.apply.entries(entries)
    }

    pub(super) fn publish_status(&mut self) {
        let r = &self.raw.raft;
        let sole = r.state == StateRole::Leader
            && r.prs().is_singleton()
            && r.commit_to_current_term()
            && !self.removed;
        self.shared.publish_sole_leader(sole, r.raft_log.committed);
        let replicates = r.state == StateRole::Leader && r.prs().iter().any(|(id, _)| *id != r.id);
        self.shared.publish_propose_at(match replicates {
            false => ProposeAt::Here,
            true if self.transport.sends_inline() => ProposeAt::HereAlone,
            true => ProposeAt::RaftThread,
        });
        let role = match r.state {
            StateRole::Follower => Role::Follower,
            StateRole::PreCandidate => Role::PreCandidate,
            StateRole::Candidate => Role::Candidate,
            StateRole::Leader => Role::Leader,
        };
        if role == Role::Leader {
            let mut led = self.shared.led.lock();
            if led.last() != Some(&r.term) {
                led.push(r.term);
            }
        }
        let mut st = self.shared.status.lock();
        let leader = (r.leader_id != 0).then_some(MemberId(r.leader_id));
        if leader.is_some() && leader != st.leader {
            crate::metrics::LEADER_CHANGES.inc();
        }
        st.leader = leader;
        st.term = r.term;
        st.role = role;
        st.commit = RaftIndex(r.raft_log.committed);
        st.applied = RaftIndex(self.applied);
        st.snapshot_index = RaftIndex(self.snapshot_index);
        st.log_first = RaftIndex(r.raft_log.first_index());
        st.removed = self.removed;
        if role == Role::Leader {
            let prs = r.prs();
            st.peers.retain(|id, _| prs.get(id.0).is_some());
            for (&id, pr) in prs.iter() {
                if id == r.id {
                    continue;
                }
                let p = st.peers.entry(MemberId(id)).or_default();
                p.matched = RaftIndex(pr.matched);
                p.active_since = self.transport.active_since(MemberId(id));
            }
            st.last_index = RaftIndex(r.raft_log.last_index());
        } else if !st.peers.is_empty() {
            st.peers.clear();
        }
    }
}
