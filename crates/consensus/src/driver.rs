//! The Ready loop: raft-rs's `RawNode`, the WAL and the transport, behind one lock. The raft
//! thread takes turns of it (commands, ticks, one Ready each); a sole voter's proposal may take
//! a turn on the proposing thread itself ([`Driver::take_queued`]), sparing two thread wake-ups.

use std::collections::{HashMap, VecDeque};
use std::fs;
use std::mem;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::Mutex;

use raft::eraftpb::{
    ConfChange, ConfChangeSingle, ConfChangeV2, ConfState, Entry, EntryType, HardState, Message,
    MessageType, Snapshot,
};
use raft::{RawNode, ReadOnlyOption, ReadState, SnapshotStatus, StateRole};
use tokio::sync::oneshot;

use crate::apply::{restore_received, Applier, ApplyQueue, ApplyTask};
use crate::log::LogStore;
use crate::member::{Member, Members};
use crate::node::{
    change_type, context, deadline, parse_context, Change, Cmd, Config, Error, Result, Role,
    Shared, Start, StateMachine, TAG_CONF, TAG_MEMBER_UPDATE,
};
use crate::snap::{SnapMeta, Snapshotter};
use crate::transport::{Reporter, SnapshotDone, Transport};
use crate::wal::{SnapshotMark, Wal};

/// Commands taken per turn of the raft loop.
const MAX_BATCH: usize = 4096;

/// The position of the snapshot a new cluster starts from (its configuration, no data).
const BOOTSTRAP_INDEX: u64 = 1;

fn encode_meta(cluster_id: u64, member_id: u64) -> Vec<u8> {
    let mut v = cluster_id.to_le_bytes().to_vec();
    v.extend_from_slice(&member_id.to_le_bytes());
    v
}

/// The (cluster id, member id) whose log is in the member directory `dir`, if it holds one:
/// what a restarting server must use, whatever its flags say now.
pub fn existing_member(dir: &std::path::Path) -> Result<Option<(u64, u64)>> {
    let wal_dir = dir.join("wal");
    if !wal_dir.exists() {
        return Ok(None);
    }
    match decode_meta(&Wal::read_metadata(&wal_dir)?) {
        Some(ids) => Ok(Some(ids)),
        None => Err(Error::Config(format!(
            "{}: the WAL's metadata is not kvd's",
            wal_dir.display()
        ))),
    }
}

fn decode_meta(b: &[u8]) -> Option<(u64, u64)> {
    if b.len() != 16 {
        return None;
    }
    let mut c = [0; 8];
    let mut m = [0; 8];
    c.copy_from_slice(&b[..8]);
    m.copy_from_slice(&b[8..]);
    Some((u64::from_le_bytes(c), u64::from_le_bytes(m)))
}

#[derive(Debug)]
enum Pending {
    Proposal(u64),
    Change(u64),
}

#[derive(Debug)]
struct ReadWaiter {
    reply: oneshot::Sender<Result<u64>>,
    deadline: Instant,
}

#[derive(Debug)]
struct ReadRound {
    ctx: Vec<u8>,
    issued: Instant,
    waiters: Vec<ReadWaiter>,
}

pub(crate) struct Driver<O: Send + 'static> {
    cfg: Config,
    raw: RawNode<LogStore>,
    wal: Wal,
    transport: Box<dyn Transport>,
    reporter: Reporter,
    shared: Arc<Shared<O>>,
    apply: ApplyQueue,
    apply_thread: Option<JoinHandle<()>>,
    /// The configuration and members from each change on, oldest first (the first is the
    /// snapshot's): a snapshot at index i records the last one at or before i.
    history: Vec<(u64, ConfState, Members)>,
    changes: HashMap<u64, oneshot::Sender<Result<Members>>>,
    /// Changes made here, answered when applied: (index, reply, member list).
    changes_applied: Vec<(u64, oneshot::Sender<Result<Members>>, Members)>,
    deadlines: VecDeque<(Instant, Pending)>,
    reads_pending: Vec<ReadWaiter>,
    reads_inflight: Option<ReadRound>,
    reads_ready: Vec<(u64, Vec<ReadWaiter>)>,
    /// Sequence of read rounds and membership changes made here.
    seq: u64,
    applied: u64,
    snapshot_index: u64,
    spooling: bool,
    removed: bool,
    last_leave: Option<Instant>,
    /// The loop has ended (stopped, or failed): no turn is taken any more.
    ended: bool,
}

/// Creates the log of a member that has none, in a temporary directory renamed into place, so
/// a crash half-way leaves no log rather than half a one.
fn bootstrap(cfg: &Config, start: &Start, snapshotter: &Snapshotter) -> Result<()> {
    let tmp = cfg.dir.join("wal.tmp");
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(|e| Error::Config(format!("{}: {e}", tmp.display())))?;
    }
    let mut wal = Wal::create(&tmp, &encode_meta(cfg.cluster_id, cfg.id), cfg.wal)?;
    match start {
        Start::NewCluster(members) => {
            if !members.iter().any(|m| m.id == cfg.id) {
                return Err(Error::Config(format!(
                    "member {:x} is not in the initial cluster",
                    cfg.id
                )));
            }
            let members = Members::new(members.iter().cloned());
            let mut cs = ConfState::default();
            for m in members.iter() {
                if m.is_learner {
                    cs.learners.push(m.id);
                } else {
                    cs.voters.push(m.id);
                }
            }
            snapshotter.save(&SnapMeta {
                index: BOOTSTRAP_INDEX,
                term: 1,
                conf_state: cs,
                members,
            })?;
            wal.save_snapshot(SnapshotMark {
                index: BOOTSTRAP_INDEX,
                term: 1,
            })?;
            let hs = HardState {
                term: 1,
                commit: BOOTSTRAP_INDEX,
                ..Default::default()
            };
            wal.save(Some(&hs), &[], true)?;
        }
        Start::Join(_) => {}
    }
    drop(wal);
    let dst = cfg.dir.join("wal");
    fs::rename(&tmp, &dst).map_err(|e| Error::Config(format!("{}: {e}", dst.display())))?;
    fs::File::open(&cfg.dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::Config(format!("{}: {e}", cfg.dir.display())))?;
    Ok(())
}

impl<O: Send + 'static> Driver<O> {
    pub(crate) fn open<S: StateMachine<Output = O>>(
        cfg: Config,
        start: Start,
        mut sm: S,
        transport: impl Transport,
        shared: Arc<Shared<O>>,
    ) -> Result<Self> {
        let wal_dir = cfg.dir.join("wal");
        let snapshotter = shared.snapshotter.clone();
        if !wal_dir.exists() {
            bootstrap(&cfg, &start, &snapshotter)?;
        }
        let (wal, rec) = Wal::open(&wal_dir, cfg.wal)?;
        match decode_meta(&rec.metadata) {
            Some((c, m)) if c == cfg.cluster_id && m == cfg.id => {}
            Some((c, m)) => {
                return Err(Error::Config(format!(
                    "{} belongs to member {m:x} of cluster {c:x}, not member {:x} of cluster {:x}",
                    cfg.dir.display(),
                    cfg.id,
                    cfg.cluster_id
                )))
            }
            None => return Err(Error::Config("the WAL's metadata is not kvd's".into())),
        }
        let meta = if rec.snapshot.index > 0 {
            snapshotter.load(rec.snapshot.index)?
        } else {
            SnapMeta::default()
        };
        if sm.applied() < meta.index && meta.index > BOOTSTRAP_INDEX {
            // A snapshot from the leader was recorded but the state machine had not finished
            // restoring it: restore it again.
            let at = sm.applied();
            restore_received(&mut sm, &snapshotter, meta.index, meta.term).map_err(|e| {
                Error::Config(format!(
                    "the state machine is at index {at} but the log starts after a snapshot at {} \
                     that cannot be restored ({e}); refusing to start",
                    meta.index
                ))
            })?;
        }
        let mut hs = rec.hard_state.clone();
        // The snapshot record and the hard state after it are separate writes.
        hs.commit = hs.commit.max(meta.index);
        hs.term = hs.term.max(meta.term);
        let last = rec.entries.last().map_or(meta.index, |e| e.index);
        if hs.commit > last {
            tracing::warn!(
                commit = hs.commit,
                last,
                "commit index past the log; lowered"
            );
            hs.commit = last;
        }
        let mut store = LogStore::new(meta.index, meta.term, meta.conf_state.clone(), hs);
        store.append(rec.entries);
        let raft_cfg = raft::Config {
            id: cfg.id,
            election_tick: cfg.election_ticks,
            heartbeat_tick: 1,
            // Committed entries after the snapshot are handed out again: membership changes
            // must reach raft; the state machine skips what it already holds.
            applied: meta.index,
            max_size_per_msg: cfg.max_size_per_msg,
            max_inflight_msgs: cfg.max_inflight_msgs,
            check_quorum: true,
            pre_vote: true,
            read_only_option: ReadOnlyOption::Safe,
            ..Default::default()
        };
        raft_cfg.validate()?;
        let raw = RawNode::new(&raft_cfg, store, &crate::logger::raft_logger(cfg.id))?;
        let (apply_thread, apply) =
            Applier::spawn(sm, shared.clone(), cfg.snapshot_count, meta.index)
                .map_err(|e| Error::Config(format!("cannot start the apply thread: {e}")))?;
        let reporter = Reporter {
            tx: shared.tx.clone(),
        };
        let mut transport: Box<dyn Transport> = Box::new(transport);
        transport.start(reporter.clone());
        match &start {
            // Joining: nothing on disk names the peers yet.
            Start::Join(known) if meta.members.is_empty() => {
                transport.update_members(&Members::new(known.iter().cloned()))
            }
            _ => transport.update_members(&meta.members),
        }
        {
            let mut st = shared.status.lock();
            st.members = meta.members.clone();
            st.snapshot_index = meta.index;
            st.applied = meta.index;
        }
        if let Some((path, at, n)) = &rec.repaired {
            tracing::warn!(segment = %path.display(), offset = at, bytes = n, "WAL torn tail repaired");
        }
        Ok(Driver {
            history: vec![(meta.index, meta.conf_state, meta.members)],
            cfg,
            raw,
            wal,
            transport,
            reporter,
            shared,
            apply,
            apply_thread: Some(apply_thread),
            changes: HashMap::new(),
            changes_applied: Vec::new(),
            deadlines: VecDeque::new(),
            reads_pending: Vec::new(),
            reads_inflight: None,
            reads_ready: Vec::new(),
            seq: 0,
            applied: meta.index,
            snapshot_index: meta.index,
            spooling: false,
            removed: false,
            last_leave: None,
            ended: false,
        })
    }

    /// The raft thread: waits for commands or the next tick, and takes a turn for each wake-up,
    /// until stopped or failed; then stops the apply thread, fails what waits and drops the
    /// driver (its WAL, its transport), leaving `None`.
    pub(crate) fn run(slot: &Mutex<Option<Self>>, rx: Receiver<Cmd>) {
        let tick = slot.lock().as_ref().map(|d| d.cfg.heartbeat);
        let Some(tick) = tick else { return };
        let mut next_tick = Instant::now() + tick;
        let result = loop {
            let wait = next_tick.saturating_duration_since(Instant::now());
            let first = match rx.recv_timeout(wait) {
                Ok(cmd) => Some(cmd),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break Ok(()),
            };
            let now = Instant::now();
            let tick_due = now >= next_tick;
            if tick_due {
                next_tick = (next_tick + tick).max(now);
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
            tracing::error!(member = %format!("{:x}", d.cfg.id), "raft node stopped: {e}");
        }
        d.ended = true;
        d.shared.publish_sole_leader(false, 0);
        let _ = d.apply.send(ApplyTask::Stop);
        if let Some(t) = d.apply_thread.take() {
            let _ = t.join();
        }
        d.fail_everything();
    }

    /// A turn on a proposer's thread, for the proposals queued for one ([`Shared::queued`]);
    /// with the loop ended (`None`, or failed), they are failed. A failure stops the node, as
    /// on the raft thread.
    pub(crate) fn take_queued(slot: &mut Option<Self>, shared: &Shared<O>) {
        match slot {
            Some(d) if !d.ended => {
                if let Err(e) = d.turn(&mut std::iter::empty(), false) {
                    tracing::error!(member = %format!("{:x}", d.cfg.id), "raft node stopped: {e}");
                    // No more turns; the raft thread, woken, winds the node down.
                    d.ended = true;
                    let _ = shared.tx.send(Cmd::Stop);
                }
            }
            _ => {
                shared.queued.lock().clear();
                shared.fail_all(|| Error::Stopped);
            }
        }
    }

    /// One turn: the commands, the proposals queued for a turn, a tick if one is due (only the
    /// raft thread keeps time), then one Ready (one WAL write and fsync for all of it).
    /// `Ok(false)`: stop.
    fn turn(&mut self, cmds: &mut dyn Iterator<Item = Cmd>, tick: bool) -> Result<bool> {
        if self.ended {
            return Ok(false);
        }
        for cmd in cmds {
            if !self.handle(cmd)? {
                return Ok(false);
            }
        }
        self.propose_queued();
        if tick {
            self.raw.tick();
            self.on_tick(Instant::now());
        }
        self.issue_reads();
        self.on_ready()?;
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

    fn propose_queued(&mut self) {
        let queued = mem::take(&mut *self.shared.queued.lock());
        for (seq, data) in queued {
            self.propose(seq, data);
        }
    }

    fn fail_everything(&mut self) {
        self.shared.queued.lock().clear();
        self.shared.fail_all(|| Error::Stopped);
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
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn handle(&mut self, cmd: Cmd) -> Result<bool> {
        match cmd {
            Cmd::Propose { seq, data } => self.propose(seq, data),
            Cmd::Change { change, reply } => self.change(change, reply),
            Cmd::ReadIndex(reply) => {
                if self.removed {
                    let _ = reply.send(Err(Error::Removed));
                } else {
                    self.reads_pending.push(ReadWaiter {
                        reply,
                        deadline: deadline(self.cfg.request_timeout),
                    });
                }
            }
            Cmd::Step(m) => self.step(m),
            Cmd::TransferLeader(id) => self.raw.transfer_leader(id),
            Cmd::Campaign => {
                if let Err(e) = self.raw.campaign() {
                    tracing::info!("campaign refused: {e}");
                }
            }
            Cmd::Unreachable(id) => self.raw.report_unreachable(id),
            Cmd::RemovedByPeer(by) => {
                if !self.removed {
                    tracing::warn!(member = %format!("{:x}", self.cfg.id), peer = %format!("{by:x}"), "a peer says this member was removed from the cluster");
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
        }
        Ok(true)
    }

    fn leader(&self) -> Option<u64> {
        let l = self.raw.raft.leader_id;
        (l != 0).then_some(l)
    }

    fn dropped(&self) -> Error {
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

    fn propose(&mut self, seq: u64, data: Vec<u8>) {
        let ctx = context(crate::node::TAG_PROPOSAL, self.cfg.id, seq, None);
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
                    let _ = w.send(Err(e));
                }
            }
        }
    }

    fn members(&self) -> &Members {
        &self.history[self.history.len() - 1].2
    }

    fn change(&mut self, change: Change, reply: oneshot::Sender<Result<Members>>) {
        let members = self.members();
        let check = match &change {
            Change::AddMember(m) | Change::AddLearner(m) if members.get(m.id).is_some() => {
                Err(Error::MemberExists)
            }
            Change::AddMember(m) | Change::AddLearner(m) if m.id == 0 => {
                Err(Error::Config("member id 0 is reserved".into()))
            }
            Change::Promote(id) => match members.get(*id) {
                None => Err(Error::MemberNotFound),
                Some(m) if !m.is_learner => Err(Error::NotLearner),
                Some(_) => Ok(()),
            },
            Change::Remove(id) | Change::Update(Member { id, .. })
                if members.get(*id).is_none() =>
            {
                Err(Error::MemberNotFound)
            }
            _ if self.removed => Err(Error::Removed),
            _ => Ok(()),
        };
        if let Err(e) = check {
            let _ = reply.send(Err(e));
            return;
        }
        let seq = self.next_seq();
        let r = match (&change, change_type(&change)) {
            (Change::Update(m), _) => self
                .raw
                .propose(
                    context(TAG_MEMBER_UPDATE, self.cfg.id, seq, Some(m)),
                    vec![],
                )
                .map_err(|_| self.dropped()),
            (_, Some((kind, id))) => {
                if self.raw.raft.state == StateRole::Leader
                    && self.raw.raft.pending_conf_index > self.raw.raft.raft_log.applied
                {
                    let _ = reply.send(Err(Error::Unhealthy));
                    return;
                }
                let member = match &change {
                    Change::AddMember(m) => Some(Member {
                        is_learner: false,
                        ..m.clone()
                    }),
                    Change::AddLearner(m) => Some(Member {
                        is_learner: true,
                        ..m.clone()
                    }),
                    _ => None,
                };
                let mut single = ConfChangeSingle::default();
                single.set_change_type(kind);
                single.node_id = id;
                let mut cc = ConfChangeV2::default();
                cc.mut_changes().push(single);
                let ctx = context(TAG_CONF, self.cfg.id, seq, member.as_ref());
                self.raw
                    .propose_conf_change(ctx, cc)
                    .map_err(|_| self.dropped())
            }
            (_, None) => Ok(()),
        };
        match r {
            Ok(()) => {
                self.changes.insert(seq, reply);
                self.deadlines
                    .push_back((deadline(self.cfg.request_timeout), Pending::Change(seq)));
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }

    fn step(&mut self, m: Message) {
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

    fn on_applied(&mut self, index: u64) {
        self.take_applied(index);
        self.answer_applied();
    }

    fn take_applied(&mut self, index: u64) {
        self.applied = self.applied.max(index);
        let log = &self.raw.raft.raft_log;
        let to = self.applied.min(log.committed).min(log.persisted);
        if to > log.applied {
            self.raw.advance_apply_to(to);
        }
    }

    /// Takes in what the apply thread applied, answers the membership changes and reads waiting
    /// for it, and tells the apply thread whether to wake this thread when it applies more.
    fn answer_applied(&mut self) {
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

    fn answer_applied_now(&mut self) {
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

    fn on_tick(&mut self, now: Instant) {
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
                        let _ = w.send(Err(Error::Timeout));
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
        // term): ask again after a few heartbeats.
        let retry = self.cfg.heartbeat * 5;
        if let Some(round) = &mut self.reads_inflight {
            expire(&mut round.waiters);
            if round.waiters.is_empty() || now.duration_since(round.issued) >= retry {
                if let Some(r) = self.reads_inflight.take() {
                    self.reads_pending.extend(r.waiters);
                }
            }
        }
        self.maybe_leave_joint(now);
    }

    /// raft-rs leaves a joint configuration by itself only if the leader that entered it is
    /// still leader when it applies it; any later leader does it here.
    fn maybe_leave_joint(&mut self, now: Instant) {
        let joint = !self.history[self.history.len() - 1]
            .1
            .voters_outgoing
            .is_empty();
        let r = &self.raw.raft;
        if !joint || r.state != StateRole::Leader || r.pending_conf_index > r.raft_log.applied {
            return;
        }
        let timeout = self.cfg.heartbeat * self.cfg.election_ticks as u32;
        if self
            .last_leave
            .is_some_and(|t| now.duration_since(t) < timeout)
        {
            return;
        }
        self.last_leave = Some(now);
        tracing::info!("leaving the joint configuration");
        if let Err(e) = self
            .raw
            .propose_conf_change(vec![], ConfChangeV2::default())
        {
            tracing::warn!("cannot propose leaving the joint configuration: {e}");
        }
    }

    fn issue_reads(&mut self) {
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

    fn on_read_states(&mut self, states: Vec<ReadState>) {
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

    fn send(&mut self, msgs: Vec<Message>) {
        if msgs.is_empty() {
            return;
        }
        let mut plain = Vec::with_capacity(msgs.len());
        for m in msgs {
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

    fn on_ready(&mut self) -> Result<()> {
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
        self.wal.save(hs.as_ref(), &entries, rd.must_sync())?;
        if let Some(hs) = hs {
            self.raw.mut_store().set_hard_state(hs);
        }
        self.raw.mut_store().append(entries);
        self.send(rd.take_persisted_messages());
        self.handoff(rd.take_committed_entries())?;
        self.on_read_states(rd.take_read_states());
        let mut light = self.raw.advance_append(rd);
        if let Some(commit) = light.commit_index() {
            // The commit index reaches the WAL before the entries it covers are applied.
            let saved = self.raw.store().hard_state().commit;
            self.raw.mut_store().set_commit(commit);
            if commit > saved {
                let hs = self.raw.store().hard_state().clone();
                self.wal.save(Some(&hs), &[], false)?;
            }
        }
        self.send(light.take_messages());
        self.handoff(light.take_committed_entries())?;
        Ok(())
    }

    /// Committed entries go to the apply thread; membership changes take effect here first.
    fn handoff(&mut self, entries: Vec<Entry>) -> Result<()> {
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

    fn set_members(&mut self, index: u64, cs: ConfState, members: Members) {
        let was_member = self.members().get(self.cfg.id).is_some();
        {
            let mut gone = self.shared.removed_ids.lock();
            gone.extend(
                self.members()
                    .iter()
                    .map(|m| m.id)
                    .filter(|id| members.get(*id).is_none()),
            );
        }
        self.transport.update_members(&members);
        self.shared.status.lock().members = members.clone();
        if was_member && members.get(self.cfg.id).is_none() {
            tracing::warn!(member = %format!("{:x}", self.cfg.id), "this member was removed from the cluster");
            self.removed = true;
            self.shared.fail_all(|| Error::Removed);
        }
        self.history.push((index, cs, members));
    }

    fn apply_conf_change(
        &mut self,
        index: u64,
        cc: ConfChangeV2,
        ctx: Option<crate::node::Context>,
    ) {
        let (origin, seq, member) = match ctx {
            Some((TAG_CONF, origin, seq, member)) => (origin, seq, member),
            _ => (0, 0, None),
        };
        let reply = (origin == self.cfg.id)
            .then(|| self.changes.remove(&seq))
            .flatten();
        // Reads go through raft again until the new configuration is known.
        self.shared.publish_sole_leader(false, 0);
        let cs = match self.raw.apply_conf_change(&cc) {
            Ok(cs) => cs,
            Err(e) => {
                tracing::warn!(index, "membership change not applied: {e}");
                if let Some(r) = reply {
                    let _ = r.send(Err(Error::Raft(e)));
                }
                return;
            }
        };
        let mut members = self.members().clone();
        for ch in cc.get_changes() {
            use raft::eraftpb::ConfChangeType::*;
            let id = ch.node_id;
            let learner = ch.get_change_type() == AddLearnerNode;
            match ch.get_change_type() {
                AddNode | AddLearnerNode => {
                    let m = members.0.entry(id).or_insert_with(|| {
                        member.clone().filter(|m| m.id == id).unwrap_or(Member {
                            id,
                            ..Default::default()
                        })
                    });
                    m.is_learner = learner;
                }
                RemoveNode => {
                    members.0.remove(&id);
                }
            }
        }
        tracing::info!(index, voters = ?cs.voters, learners = ?cs.learners, outgoing = ?cs.voters_outgoing, "membership changed");
        self.set_members(index, cs, members.clone());
        if let Some(r) = reply {
            // Answered once applied: raft then accepts the next change at once.
            self.changes_applied.push((index, r, members));
        }
    }

    fn update_member(&mut self, index: u64, origin: u64, seq: u64, m: Member) {
        let reply = (origin == self.cfg.id)
            .then(|| self.changes.remove(&seq))
            .flatten();
        let mut members = self.members().clone();
        let Some(cur) = members.0.get_mut(&m.id) else {
            if let Some(r) = reply {
                let _ = r.send(Err(Error::MemberNotFound));
            }
            return;
        };
        cur.peer_urls = m.peer_urls;
        if !m.name.is_empty() {
            cur.name = m.name;
        }
        if !m.client_urls.is_empty() {
            cur.client_urls = m.client_urls;
        }
        let cs = self.history[self.history.len() - 1].1.clone();
        self.set_members(index, cs, members.clone());
        if let Some(r) = reply {
            // Answered once applied: raft then accepts the next change at once.
            self.changes_applied.push((index, r, members));
        }
    }

    /// The configuration and members in effect at `index`, if still known.
    fn conf_at(&self, index: u64) -> Option<(ConfState, Members)> {
        let h = self.history.iter().rev().find(|h| h.0 <= index)?;
        Some((h.1.clone(), h.2.clone()))
    }

    /// A snapshot from the leader, in a Ready: record it, then restore the state machine.
    fn install_snapshot(&mut self, snap: Snapshot) -> Result<()> {
        let meta = snap.get_metadata().clone();
        let members = Members::decode(&snap.data).unwrap_or_else(|e| {
            tracing::error!("snapshot {}: {e}; keeping the member list", meta.index);
            self.members().clone()
        });
        let cs = meta.get_conf_state().clone();
        self.shared.snapshotter.save(&SnapMeta {
            index: meta.index,
            term: meta.term,
            conf_state: cs.clone(),
            members: members.clone(),
        })?;
        fail::fail_point!("raft_snapshot_save");
        self.wal.save_snapshot(SnapshotMark {
            index: meta.index,
            term: meta.term,
        })?;
        self.raw.mut_store().apply_snapshot(&meta);
        self.set_members(meta.index, cs, members);
        let last = self.history.len() - 1;
        self.history.drain(..last);
        self.snapshot_index = meta.index;
        tracing::info!(
            index = meta.index,
            term = meta.term,
            "installing the leader's snapshot"
        );
        self.apply.send(ApplyTask::Restore {
            index: meta.index,
            term: meta.term,
        })
    }

    /// The state machine is durable up to `index`: record a snapshot there and drop the log
    /// behind it (keeping some entries in memory for followers that are a little behind).
    fn record_snapshot(&mut self, index: u64) -> Result<()> {
        let Some(term) = self.raw.store().term_of(index) else {
            tracing::warn!(index, "no term for the snapshot index; skipped");
            return Ok(());
        };
        let Some((conf_state, members)) = self.conf_at(index) else {
            tracing::warn!(
                index,
                "no configuration known at the snapshot index; skipped"
            );
            return Ok(());
        };
        self.shared.snapshotter.save(&SnapMeta {
            index,
            term,
            conf_state,
            members,
        })?;
        fail::fail_point!("raft_snapshot_save");
        self.wal.save_snapshot(SnapshotMark { index, term })?;
        let keep_from = index.saturating_sub(self.cfg.snapshot_catchup_entries);
        self.raw.mut_store().compact(keep_from);
        let wals = self.wal.purge(index, self.cfg.max_wals)?;
        let prepared = self.raw.store().prepared_index();
        let snaps = self
            .shared
            .snapshotter
            .purge(self.cfg.max_snapshots, (prepared > 0).then_some(prepared))?;
        self.purge_received(index);
        // Keep the last configuration at or before the snapshot and every later one.
        let first = self.history.iter().rposition(|h| h.0 <= index).unwrap_or(0);
        self.history.drain(..first);
        self.snapshot_index = index;
        tracing::info!(index, term, wals, snaps, "snapshot saved; log compacted");
        Ok(())
    }

    /// Deletes snapshot data received for positions before `index` (the state machine is
    /// durable at `index`, so anything older was restored already or refused by raft as stale;
    /// a restore still queued is always for a later position).
    fn purge_received(&self, index: u64) {
        if let Err(e) = self.shared.snapshotter.purge_received(index) {
            tracing::warn!("cannot purge received snapshots: {e}");
        }
    }

    /// The state machine's data at `index` is spooled: offer it to followers.
    fn prepare_snapshot(&mut self, index: Option<u64>) {
        self.spooling = false;
        let Some(index) = index else { return };
        if !self.shared.snapshotter.spool_path(index).exists() {
            // Purged by a snapshot recorded before this news arrived: raft-rs asks again.
            tracing::warn!(index, "spooled snapshot data is gone; another will be made");
            return;
        }
        let (Some(term), Some((cs, members))) =
            (self.raw.store().term_of(index), self.conf_at(index))
        else {
            tracing::warn!(
                index,
                "spooled snapshot is behind the log; another will be made"
            );
            return;
        };
        let mut snap = Snapshot::default();
        let meta = snap.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(cs);
        snap.data = SnapMeta::envelope(&members).into();
        self.raw.mut_store().set_prepared(snap);
        if let Err(e) = self
            .shared
            .snapshotter
            .purge(self.cfg.max_snapshots, Some(index))
        {
            tracing::warn!("cannot purge old snapshots: {e}");
        }
    }

    fn publish_status(&mut self) {
        let r = &self.raw.raft;
        let sole = r.state == StateRole::Leader
            && r.prs().is_singleton()
            && r.commit_to_current_term()
            && !self.removed;
        self.shared.publish_sole_leader(sole, r.raft_log.committed);
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
        let leader = (r.leader_id != 0).then_some(r.leader_id);
        if leader.is_some() && leader != st.leader {
            crate::metrics::LEADER_CHANGES.inc();
        }
        st.leader = leader;
        st.term = r.term;
        st.role = role;
        st.commit = r.raft_log.committed;
        st.applied = self.applied;
        st.snapshot_index = self.snapshot_index;
        st.removed = self.removed;
        if role == Role::Leader {
            let prs = r.prs();
            st.peers.retain(|id, _| prs.get(*id).is_some());
            for (&id, pr) in prs.iter() {
                if id == r.id {
                    continue;
                }
                let p = st.peers.entry(id).or_default();
                p.matched = pr.matched;
                p.active_since = self.transport.active_since(id);
            }
            st.last_index = r.raft_log.last_index();
        } else if !st.peers.is_empty() {
            st.peers.clear();
        }
    }
}
