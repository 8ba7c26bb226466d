//! The driver's state, and opening it: the WAL replayed into raft-rs's log, the snapshot and
//! configuration restored, the apply thread started.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use raft::eraftpb::ConfState;
use raft::{RawNode, ReadOnlyOption};
use tokio::sync::oneshot;

use crate::apply::{restore_received, Applier, ApplyQueue};
use crate::idmap::IdMap;
use crate::log::LogStore;
use crate::member::Members;
use crate::node::{Config, Error, Result, Shared, Start, StateMachine};
use crate::snap::SnapMeta;
use crate::transport::{Reporter, Transport};
use crate::wal::Wal;
use ids::RaftIndex;

use super::meta::{bootstrap, decode_meta, BOOTSTRAP_INDEX};
use super::reads::{ReadRound, ReadWaiter, RemoteRead};

#[derive(Debug)]
pub(super) enum Pending {
    Proposal(u64),
    Change(u64),
}

pub(crate) struct Driver<O: Send + 'static> {
    pub(super) cfg: Config,
    pub(super) raw: RawNode<LogStore>,
    pub(super) wal: Wal,
    pub(super) transport: Box<dyn Transport>,
    pub(super) reporter: Reporter,
    pub(super) shared: Arc<Shared<O>>,
    pub(super) apply: ApplyQueue,
    pub(super) apply_thread: Option<JoinHandle<()>>,
    /// The configuration and members from each change on, oldest first (the first is the
    /// snapshot's): a snapshot at index i records the last one at or before i.
    pub(super) history: Vec<(u64, ConfState, Members)>,
    pub(super) changes: HashMap<u64, oneshot::Sender<Result<Members>>>,
    /// Changes made here, answered when applied: (index, reply, member list).
    pub(super) changes_applied: Vec<(u64, oneshot::Sender<Result<Members>>, Members)>,
    pub(super) deadlines: VecDeque<(Instant, Pending)>,
    pub(super) reads_pending: Vec<ReadWaiter>,
    pub(super) reads_inflight: Option<ReadRound>,
    /// Followers' read requests waiting for this leader's next round.
    pub(super) reads_remote: Vec<RemoteRead>,
    pub(super) reads_ready: Vec<(u64, Vec<ReadWaiter>)>,
    /// Sequence of read rounds and membership changes made here (from the clock: see
    /// `node::first_seq`).
    pub(super) seq: u64,
    pub(super) applied: u64,
    pub(super) snapshot_index: u64,
    pub(super) spooling: bool,
    pub(super) removed: bool,
    pub(super) last_leave: Option<Instant>,
    /// The loop has ended (stopped, or failed): no turn is taken any more.
    pub(super) ended: bool,
    /// The commit index last sent to each peer, in an append or a heartbeat.
    pub(super) told: IdMap<u64, u64>,
    /// Members whose proposals were committed, by the last of their entries' index: they wait
    /// to be told that commit index (their clients wait for them to apply).
    pub(super) commit_awaited: IdMap<u64, u64>,
    /// A membership change was committed: every member is told at once.
    pub(super) commit_for_all: bool,
    /// The raft thread (a turn elsewhere wakes it when it sets `Shared::commit_due`).
    pub(super) raft_thread: Option<std::thread::ThreadId>,
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
            Some((m, c)) if c == cfg.cluster_id && m == cfg.id => {}
            Some((m, c)) => {
                return Err(Error::WrongMember {
                    dir: cfg.dir.clone(),
                    found_member: m,
                    found_cluster: c,
                    member: cfg.id,
                    cluster: cfg.cluster_id,
                })
            }
            None => return Err(Error::ForeignWal { dir: wal_dir }),
        }
        let meta = if rec.snapshot.index.0 > 0 {
            snapshotter.load(rec.snapshot.index.0)?
        } else {
            SnapMeta::default()
        };
        if sm.applied().0 < meta.index && meta.index > BOOTSTRAP_INDEX {
            // A snapshot from the leader was recorded but the state machine had not finished
            // restoring it: restore it again.
            let at = sm.applied();
            restore_received(&mut sm, &snapshotter, meta.index, meta.term).map_err(|e| {
                Error::Unrestorable {
                    applied: at,
                    index: RaftIndex(meta.index),
                    source: Box::new(e),
                }
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
            id: cfg.id.0,
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
            // A new commit index reaches followers with the next entries, or after
            // `Config::commit_tell_delay` (see `Driver::tell_commit`), not in an empty append
            // each time.
            skip_bcast_commit: true,
            ..Default::default()
        };
        raft_cfg.validate()?;
        let raw = RawNode::new(&raft_cfg, store, &crate::logger::raft_logger(cfg.id))?;
        let (apply_thread, apply) =
            Applier::spawn(sm, shared.clone(), cfg.snapshot_count, meta.index).map_err(
                |source| Error::Spawn {
                    thread: "apply",
                    source,
                },
            )?;
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
            st.snapshot_index = RaftIndex(meta.index);
            st.applied = RaftIndex(meta.index);
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
            reads_remote: Vec::new(),
            reads_ready: Vec::new(),
            seq: crate::node::first_seq(),
            applied: meta.index,
            snapshot_index: meta.index,
            spooling: false,
            removed: false,
            last_leave: None,
            ended: false,
            told: IdMap::default(),
            commit_awaited: IdMap::default(),
            commit_for_all: false,
            raft_thread: None,
        })
    }
}
