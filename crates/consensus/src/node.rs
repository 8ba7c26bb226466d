//! [`RaftNode`]: one raft member — its log on disk, the raft thread that runs raft-rs's Ready
//! loop, and the apply thread that feeds committed entries to the [`StateMachine`].
//!
//! The raft thread persists each Ready (entries and hard state: one WAL write, one fdatasync),
//! sends messages (a leader sends its appends before its own fsync, as raft allows), hands
//! committed entries to the apply thread, and applies membership changes itself (raft needs the
//! new configuration at once; the member list at any index is kept for snapshots). The apply
//! thread applies entries in order, answers the proposals made here, and every
//! `snapshot_count` entries asks the state machine to make its state durable, after which the
//! raft thread records a snapshot and purges the WAL behind it.

use std::any::Any;
use std::future::Future;
use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use raft::eraftpb::{ConfChangeType, Message, MessageType};
use tokio::sync::oneshot;

use crate::codec::{put_u64, Malformed, Reader};
use crate::driver::Driver;
use crate::idmap::IdMap;
use crate::member::{Member, Members};
use crate::snap::{SnapError, Snapshotter};
use crate::transport::Transport;
use crate::wal;
use ids::{ClusterId, MemberId, RaftIndex};

/// A committed entry as the state machine sees it.
#[derive(Debug)]
pub struct Committed<'a> {
    pub index: RaftIndex,
    pub term: u64,
    /// The proposed bytes; `None` for raft's own entries (a new leader's empty entry,
    /// membership changes), which the state machine only counts as applied.
    pub data: Option<&'a [u8]>,
    /// On the member that proposed the entry, what its proposer handed along with the bytes
    /// ([`RaftNode::propose_local`]) while it still waits for the answer: for the state
    /// machine to take instead of decoding `data` again. `None` elsewhere.
    pub local: Option<Local>,
}

/// A proposal's request as its proposer had it before encoding it into the entry's bytes
/// ([`RaftNode::propose_local`], [`Committed::local`]). It must be what the bytes say: other
/// members decode the bytes.
pub type Local = Box<dyn Any + Send>;

/// What a proposer knows of other requests that could share its proposal's turn of the Ready
/// loop ([`RaftNode::propose_local`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Company {
    /// Others may be on their way (calls polled in the same pass as this one): the turn
    /// waits one yield for them.
    Maybe,
    /// The caller knows of no other request in flight on this member (a client's only call).
    /// After [`LONE_TURNS`] turns in a row of one proposal each with none other waiting, the
    /// proposal takes its turn at once, without the yield.
    None,
}

/// Turns in a row, each of one proposal with none other waiting, after which a proposal whose
/// caller knows of no company ([`Company::None`]) takes its turn without a yield. Any sign of
/// company (a proposal made while another waits, a turn of several) starts the count over:
/// the yield is what lets calls made together share a turn and its fsync.
pub const LONE_TURNS: u32 = 8;

/// What consensus replicates into. It knows nothing of keys: kvd's implementation applies
/// requests to mvcc.
pub trait StateMachine: Send + 'static {
    /// The answer to a proposal, handed to whoever proposed it on this member.
    type Output: Send + 'static;

    /// The index of the last entry applied (0 for a new state machine). After a restart this is
    /// what the state machine made durable; entries up to it are not given again.
    fn applied(&self) -> RaftIndex;

    /// Applies committed entries, in order: one output per entry. The index of the last one
    /// is applied afterwards. An error stops the member.
    fn apply(&mut self, batch: &mut [Committed<'_>]) -> io::Result<Vec<Self::Output>>;

    /// Makes everything applied durable: the log before it is then deleted.
    fn sync(&mut self) -> io::Result<()>;

    /// The state at `applied()`, as a stream a follower can restore from. Must return quickly
    /// (a consistent view, read lazily); the stream is read on another thread.
    fn snapshot(&mut self) -> io::Result<Box<dyn Read + Send>>;

    /// Replaces the whole state with a snapshot's (the entry at `index`, `term` and all before
    /// it); durable on return, `applied()` is `index` afterwards.
    fn restore(&mut self, index: RaftIndex, term: u64, data: &mut dyn Read) -> io::Result<()>;
}

/// Errors of a node and of its requests.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No leader is known (an election is under way, or this member is cut off).
    #[error("etcdserver: no leader")]
    NoLeader,
    /// The request did not complete in time (its entry may still commit later).
    #[error("etcdserver: request timed out")]
    Timeout,
    #[error("etcdserver: server stopped")]
    Stopped,
    /// Leadership is moving (a transfer is under way); retry.
    #[error("etcdserver: leader changed")]
    LeaderChanged,
    /// This member was removed from the cluster.
    #[error("etcdserver: the member has been permanently removed from the cluster")]
    Removed,
    #[error("etcdserver: unhealthy cluster")]
    Unhealthy,
    #[error("etcdserver: member ID already exist")]
    MemberExists,
    #[error("etcdserver: member not found")]
    MemberNotFound,
    #[error("etcdserver: can only promote a learner member")]
    NotLearner,
    #[error(transparent)]
    Wal(#[from] wal::Error),
    #[error(transparent)]
    Snap(#[from] SnapError),
    #[error("state machine: {0}")]
    StateMachine(#[source] io::Error),
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    #[error("{0}")]
    Malformed(#[from] Malformed),
    /// A file or directory of the member's could not be read or written.
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// One of the node's threads could not be started.
    #[error("cannot start the {thread} thread: {source}")]
    Spawn {
        thread: &'static str,
        #[source]
        source: io::Error,
    },
    /// The data directory holds another member's log.
    #[error(
        "{} belongs to member {found_member} of cluster {found_cluster}, not member \
         {member} of cluster {cluster}",
        dir.display()
    )]
    WrongMember {
        dir: PathBuf,
        found_member: MemberId,
        found_cluster: ClusterId,
        member: MemberId,
        cluster: ClusterId,
    },
    /// The WAL's metadata is not a kvd member's.
    #[error("{}: the WAL's metadata is not kvd's", dir.display())]
    ForeignWal { dir: PathBuf },
    /// A new cluster's members do not include this one.
    #[error("member {0} is not in the initial cluster")]
    NotInInitialCluster(MemberId),
    /// Member id 0 means "none" to raft.
    #[error("member id 0 is reserved")]
    ReservedId,
    /// The log starts after a snapshot the state machine never finished restoring, and it
    /// cannot be restored now.
    #[error(
        "the state machine is at index {applied} but the log starts after a snapshot at \
         {index} that cannot be restored ({source}); refusing to start"
    )]
    Unrestorable {
        applied: RaftIndex,
        index: RaftIndex,
        #[source]
        source: Box<Error>,
    },
    /// `receive_snapshot` was handed a message that is not a snapshot.
    #[error("receive_snapshot: not a snapshot message")]
    NotSnapshot,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Settings of a node; [`Config::new`] gives etcd's defaults.
#[derive(Debug, Clone)]
pub struct Config {
    /// This member's id.
    pub id: MemberId,
    pub cluster_id: ClusterId,
    /// The member directory: `wal/` and `snap/` go under it.
    pub dir: PathBuf,
    /// `--heartbeat-interval`: one raft tick.
    pub heartbeat: Duration,
    /// `--election-timeout`, in ticks.
    pub election_ticks: usize,
    /// `--snapshot-count`: entries applied between snapshots.
    pub snapshot_count: u64,
    /// Entries kept in memory behind a snapshot for slow followers.
    pub snapshot_catchup_entries: u64,
    /// Snapshot files and WAL segments kept (`--max-snapshots`, `--max-wals`).
    pub max_snapshots: usize,
    pub max_wals: usize,
    /// How long a proposal, read or membership change may wait.
    pub request_timeout: Duration,
    pub wal: wal::Options,
    pub max_size_per_msg: u64,
    pub max_inflight_msgs: usize,
    /// How long a leader waits for new entries to carry a new commit index to its followers
    /// before it sends the index alone (a member whose proposals it commits is told at once).
    pub commit_tell_delay: Duration,
}

impl Config {
    pub fn new(id: MemberId, cluster_id: ClusterId, dir: impl Into<PathBuf>) -> Config {
        let heartbeat = Duration::from_millis(100);
        let election_ticks = 10;
        Config {
            id,
            cluster_id,
            dir: dir.into(),
            heartbeat,
            election_ticks,
            snapshot_count: 10_000,
            snapshot_catchup_entries: 5_000,
            max_snapshots: 5,
            max_wals: 5,
            // etcd: 5 s plus two election timeouts.
            request_timeout: Duration::from_secs(5) + heartbeat * (2 * election_ticks as u32),
            wal: wal::Options::default(),
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 512,
            commit_tell_delay: Duration::from_millis(2),
        }
    }
}

/// How a member without data starts (one with data always restarts from it).
#[derive(Debug, Clone)]
pub enum Start {
    /// Bootstrap a new cluster of these members (`--initial-cluster-state new`).
    NewCluster(Vec<Member>),
    /// Join a cluster that already lists this member (`--initial-cluster-state existing`),
    /// whose members (as some member reported them) are these: the transport reaches them
    /// until the leader's snapshot brings the list. A restart ignores them.
    Join(Vec<Member>),
}

/// One membership change (applied through raft's ConfChangeV2).
#[derive(Debug, Clone)]
pub enum Change {
    AddMember(Member),
    AddLearner(Member),
    Promote(MemberId),
    Remove(MemberId),
    /// New peer URLs for a member (a replicated entry, not a configuration change).
    Update(Member),
}

/// Raft role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    #[default]
    Follower,
    PreCandidate,
    Candidate,
    Leader,
}

/// What a node knows right now.
#[derive(Debug, Clone, Default)]
pub struct Status {
    pub id: MemberId,
    pub cluster_id: ClusterId,
    pub leader: Option<MemberId>,
    pub term: u64,
    pub role: Role,
    pub commit: RaftIndex,
    pub applied: RaftIndex,
    pub members: Members,
    /// The last snapshot taken or installed.
    pub snapshot_index: RaftIndex,
    /// The first entry the log in memory holds: a follower that needs an earlier one is sent a
    /// snapshot.
    pub log_first: RaftIndex,
    pub removed: bool,
    /// Why the node stopped on its own (a WAL write or fsync failed, apply failed): it takes
    /// no more turns; the member must stop.
    pub failed: Option<String>,
    /// On the leader: each peer's replication progress (empty elsewhere).
    pub peers: std::collections::BTreeMap<MemberId, PeerProgress>,
    /// On the leader: the last index of its own log.
    pub last_index: RaftIndex,
}

/// The leader's view of one peer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerProgress {
    /// The highest log index known to be replicated there.
    pub matched: RaftIndex,
    /// Since when the leader's link to it has been up without a break, if it is
    /// ([`crate::Transport::active_since`]).
    pub active_since: Option<std::time::Instant>,
}

/// A proposal made on this member, waiting for its answer, and what it handed its apply.
pub(crate) struct Waiter<O> {
    pub(crate) answer: oneshot::Sender<Result<O>>,
    pub(crate) local: Option<Local>,
}

/// State shared by the handle, the raft thread and the apply thread.
pub(crate) struct Shared<O> {
    pub(crate) id: MemberId,
    pub(crate) tx: Sender<Cmd>,
    pub(crate) waiters: Mutex<IdMap<u64, Waiter<O>>>,
    next_seq: AtomicU64,
    pub(crate) status: Mutex<Status>,
    /// Terms in which this member was leader.
    pub(crate) led: Mutex<Vec<u64>>,
    pub(crate) snapshotter: Snapshotter,
    /// Members removed while this node ran (or in the log it replayed): peers refuse their
    /// messages, so a removed member that never got its own removal learns of it.
    pub(crate) removed_ids: Arc<Mutex<std::collections::HashSet<MemberId>>>,
    /// The last index the apply thread applied. The raft thread reads it on every turn; it is
    /// woken with `Cmd::Applied` only while `applied_wanted` says something waits for it (a read,
    /// a membership change), so a plain write costs the raft thread no extra wake-up.
    applied: AtomicU64,
    applied_wanted: AtomicBool,
    /// Raft's commit index, published by the raft thread before `sole_leader` turns true.
    committed: AtomicU64,
    /// This member leads, is the only voter and has committed an entry of its term: no other
    /// member can hold a newer write, so a linearizable read needs no round through raft.
    sole_leader: AtomicBool,
    /// Where proposals take their turn of the Ready loop (see [`RaftNode::propose`]), a
    /// [`ProposeAt`]. Published by the raft thread.
    propose_at: AtomicU8,
    /// Proposals waiting for the next turn of the Ready loop: taken on the proposer's thread
    /// when the loop is free (see [`QueuedTurn`]), else by the raft thread.
    pub(crate) queued: Mutex<Vec<(u64, Vec<u8>)>>,
    /// Messages from peers waiting for the next turn: taken on the thread that received them
    /// when the loop is free (see [`Inbox::step_all`]), else by the raft thread.
    pub(crate) stepped: Mutex<Vec<Message>>,
    /// Reads waiting for the next turn to join a round (see [`RaftNode::read_index`] and
    /// [`RaftNode::confirm_leader`]): the reply, and whether it waits for the apply.
    pub(crate) reads_queued: Mutex<Vec<(oneshot::Sender<Result<u64>>, bool)>>,
    /// When the raft thread must look whether followers wait to be told a commit index (see
    /// `Driver::tell_commit`), besides its ticks.
    pub(crate) commit_due: Mutex<Option<std::time::Instant>>,
    /// Entries went out since `commit_due` was set: they carry the commit index. Set in a
    /// turn; the raft thread, woken by a passed `commit_due`, takes it without a turn (see
    /// `Driver::run`).
    pub(crate) appended_since_due: AtomicBool,
    /// Work was queued for a turn by a thread that found the loop in one: whoever holds the
    /// loop takes another turn after letting go (see [`take_turn`]). A turn clears it before
    /// it takes what is queued.
    pub(crate) turn_wanted: AtomicBool,
    /// Turns in a row (up to [`LONE_TURNS`]) that each took one proposal, none other waiting
    /// when it was made (see [`Company::None`]).
    pub(crate) lone_turns: AtomicU32,
    /// When a request of this member's own (a proposal, a linearizable read) last went to the
    /// Ready loop: milliseconds after `started`, plus one (0: never). See
    /// [`Inbox::asked_lately`].
    asked_at: AtomicU64,
    started: Instant,
}

/// How long a member's own request counts as recent for [`Inbox::asked_lately`].
const ASKED_LATELY: Duration = Duration::from_secs(1);

impl<O> Shared<O> {
    fn millis(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
    }

    fn note_asked(&self) {
        self.asked_at.store(self.millis(), Ordering::Relaxed);
    }

    fn asked_lately(&self) -> bool {
        let at = self.asked_at.load(Ordering::Relaxed);
        at != 0 && self.millis().saturating_sub(at) < ASKED_LATELY.as_millis() as u64
    }
}

impl<O> std::fmt::Debug for Shared<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("id", &self.id).finish()
    }
}

impl<O> Shared<O> {
    /// The apply thread: `index` is applied. Wakes the raft thread if `wake`, or if it waits
    /// for that.
    pub(crate) fn publish_applied(&self, index: u64, wake: bool) {
        // SeqCst pairs with `want_applied`: either the raft thread's load sees this index or this
        // load sees its flag, never neither.
        self.applied.fetch_max(index, Ordering::SeqCst);
        if wake || self.applied_wanted.load(Ordering::SeqCst) {
            let _ = self.tx.send(Cmd::Applied(index));
        }
    }

    /// The raft thread: whether it needs to hear of applied entries now; returns what is
    /// applied so far (read after the flag is set, so nothing published later goes unheard).
    pub(crate) fn want_applied(&self, want: bool) -> u64 {
        self.applied_wanted.store(want, Ordering::SeqCst);
        self.applied.load(Ordering::SeqCst)
    }

    pub(crate) fn applied(&self) -> u64 {
        self.applied.load(Ordering::SeqCst)
    }

    /// A passed commit deadline moves `period` on if entries went out since it was set (they
    /// carried the commit index: writes go on): whether it did. By a turn
    /// (`Driver::tell_commit`), and by the raft thread the deadline woke, without one.
    pub(crate) fn move_commit_due_on(&self, now: Instant, period: Duration) -> bool {
        let mut due = self.commit_due.lock();
        let moved =
            due.is_some_and(|d| now >= d) && self.appended_since_due.swap(false, Ordering::Relaxed);
        if moved {
            *due = Some(now + period);
        }
        moved
    }

    /// The raft thread: whether linearizable reads may skip it (see `sole_leader`).
    pub(crate) fn publish_sole_leader(&self, sole: bool, committed: u64) {
        if sole {
            self.committed.store(committed, Ordering::SeqCst);
        }
        self.sole_leader.store(sole, Ordering::SeqCst);
    }

    /// The raft thread: where proposals take their turn.
    pub(crate) fn publish_propose_at(&self, at: ProposeAt) {
        self.propose_at.store(at as u8, Ordering::SeqCst);
    }

    /// A read point needing no raft round: while this member is the sole leader, every write
    /// acknowledged in its term was acknowledged here after it was applied; once the commit index
    /// (which covers what earlier terms acknowledged) is applied too, the applied index is a
    /// read point.
    fn sole_read_point(&self) -> Option<u64> {
        if !self.sole_leader.load(Ordering::SeqCst) {
            return None;
        }
        let committed = self.committed.load(Ordering::SeqCst);
        let applied = self.applied();
        (applied >= committed).then_some(applied)
    }

    /// Answers every outstanding proposal with `err` (the node is going away).
    pub(crate) fn fail_all(&self, err: impl Fn() -> Error) {
        for (_, w) in self.waiters.lock().drain() {
            let _ = w.answer.send(Err(err()));
        }
    }

    /// The loop has ended: what waits for a turn (proposals, peer messages, reads) and every
    /// proposal's waiter is dropped or failed.
    pub(crate) fn fail_queued(&self) {
        self.queued.lock().clear();
        self.stepped.lock().clear();
        for (reply, _) in std::mem::take(&mut *self.reads_queued.lock()) {
            let _ = reply.send(Err(Error::Stopped));
        }
        self.fail_all(|| Error::Stopped);
    }
}

/// Where a proposal takes its turn of the Ready loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum ProposeAt {
    /// Sent to the raft thread.
    RaftThread,
    /// On the proposer's thread when the loop is free.
    Here,
    /// On the proposer's thread when no other proposal of this member awaits its answer,
    /// else sent to the raft thread.
    HereAlone,
}

/// Commands to the raft thread.
#[derive(Debug)]
pub(crate) enum Cmd {
    Propose {
        seq: u64,
        data: Vec<u8>,
    },
    Change {
        change: Change,
        reply: oneshot::Sender<Result<Members>>,
    },
    TransferLeader(u64),
    Campaign,
    Unreachable(u64),
    /// A peer refused this member's messages: it was removed from the cluster.
    RemovedByPeer(u64),
    SnapshotStatus(u64, bool),
    /// From the apply thread: everything up to here is applied.
    Applied(u64),
    /// From the apply thread: the state machine is durable up to here; record a snapshot.
    Durable(u64),
    /// The state machine's data at this index is spooled for followers (or failed to be).
    Spooled(Option<u64>),
    /// The apply thread failed; stop.
    Fatal(Error),
    /// Proposals are queued for a turn ([`Shared::queued`]).
    Kick,
    /// [`Shared::commit_due`] moved earlier: the raft thread looks again at when to wake.
    Deadline,
    Stop,
}

/// Entry contexts: `tag | origin member | sequence` and, for membership, the member.
pub(crate) const TAG_PROPOSAL: u8 = 1;
pub(crate) const TAG_CONF: u8 = 2;
pub(crate) const TAG_MEMBER_UPDATE: u8 = 3;

/// Where a member's sequence numbers start: the clock, so that a number from an earlier run of
/// the member (in an entry of the log, in a read request a leader still holds) is not taken
/// for one of this run's, and members' numbers are apart.
pub(crate) fn first_seq() -> u64 {
    (SystemTime::now().duration_since(UNIX_EPOCH)).map_or(1, |d| d.as_nanos() as u64)
}

pub(crate) fn context(tag: u8, origin: u64, seq: u64, member: Option<&Member>) -> Vec<u8> {
    let mut buf = Vec::with_capacity(17);
    buf.push(tag);
    put_u64(&mut buf, origin);
    put_u64(&mut buf, seq);
    if let Some(m) = member {
        m.encode(&mut buf);
    }
    buf
}

/// An entry context decoded: (tag, origin, seq, member).
pub(crate) type Context = (u8, u64, u64, Option<Member>);

pub(crate) fn parse_context(ctx: &[u8]) -> Result<Context, Malformed> {
    let mut r = Reader::new(ctx, "entry context");
    let tag = r.u8()?;
    let origin = r.u64()?;
    let seq = r.u64()?;
    let member = if r.is_empty() {
        None
    } else {
        Some(Member::decode(&mut r)?)
    };
    r.finish()?;
    Ok((tag, origin, seq, member))
}

/// A running raft member. Dropping it stops it.
pub struct RaftNode<O: Send + 'static> {
    shared: Arc<Shared<O>>,
    /// The Ready loop's state, `None` once the raft thread has ended.
    driver: Arc<Mutex<Option<Driver<O>>>>,
    thread: Option<JoinHandle<()>>,
}

impl<O: Send + 'static> std::fmt::Debug for RaftNode<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftNode")
            .field("id", &self.shared.id)
            .finish()
    }
}

impl<O: Send + 'static> RaftNode<O> {
    /// Starts a member: restarts from `cfg.dir` if it holds a log, otherwise starts as `start`
    /// says. Returns once the log is replayed and the threads run.
    pub fn start<S>(cfg: Config, start: Start, sm: S, transport: impl Transport) -> Result<Self>
    where
        S: StateMachine<Output = O>,
    {
        if cfg.id == MemberId::NONE {
            return Err(Error::ReservedId);
        }
        let snapshotter = Snapshotter::new(cfg.dir.join("snap"))?;
        let (tx, rx) = mpsc::channel();
        let seq0 = first_seq();
        let shared = Arc::new(Shared {
            id: cfg.id,
            tx,
            waiters: Mutex::new(IdMap::default()),
            next_seq: AtomicU64::new(seq0),
            status: Mutex::new(Status {
                id: cfg.id,
                cluster_id: cfg.cluster_id,
                ..Default::default()
            }),
            led: Mutex::new(Vec::new()),
            snapshotter,
            removed_ids: Default::default(),
            applied: AtomicU64::new(0),
            applied_wanted: AtomicBool::new(false),
            committed: AtomicU64::new(0),
            sole_leader: AtomicBool::new(false),
            propose_at: AtomicU8::new(ProposeAt::RaftThread as u8),
            queued: Mutex::new(Vec::new()),
            stepped: Mutex::new(Vec::new()),
            reads_queued: Mutex::new(Vec::new()),
            commit_due: Mutex::new(None),
            appended_since_due: AtomicBool::new(false),
            turn_wanted: AtomicBool::new(false),
            lone_turns: AtomicU32::new(0),
            asked_at: AtomicU64::new(0),
            started: Instant::now(),
        });
        let driver = Driver::open(cfg, start, sm, transport, shared.clone())?;
        let driver = Arc::new(Mutex::new(Some(driver)));
        let d = driver.clone();
        let thread = std::thread::Builder::new()
            .name(format!("raft-{}", shared.id))
            .spawn(move || Driver::run(&d, rx))
            .map_err(|source| Error::Spawn {
                thread: "raft",
                source,
            })?;
        Ok(RaftNode {
            shared,
            driver,
            thread: Some(thread),
        })
    }

    pub fn id(&self) -> MemberId {
        self.shared.id
    }

    fn send(&self, cmd: Cmd) -> Result<()> {
        self.shared.tx.send(cmd).map_err(|_| Error::Stopped)
    }

    /// Proposes `data`; resolves with the state machine's output once this member applied it.
    /// Followers forward proposals to the leader.
    ///
    /// A proposal is queued, and the future takes the Ready loop's turn for it on the caller's
    /// thread when the raft thread is not in one: a sole voter's WAL write and fsync and a
    /// small apply (the answer is ready when the turn ends), a follower's forwarding to the
    /// leader, a lone write's appends to a leader's followers and its own fsync, happen there
    /// — no hand-off to the raft thread and back (two wake-ups, the larger part of a lone
    /// client's write on a small machine). The future first yields once, so proposals made
    /// together (the calls of one connection's read) share the turn and its fsync; a lone
    /// client's, whose caller says so ([`propose_local`](Self::propose_local) with
    /// [`Company::None`]), takes it at once while proposals come one at a time.
    ///
    /// A leader with followers takes the turn here only for a proposal made while none of its
    /// others awaits an answer, and only while every link writes its messages on the sending
    /// thread ([`Transport::sends_inline`]): a link's task would be held back by a worker
    /// blocked in that fsync, and under many writers a worker blocked in each turn's fsync
    /// serves the clients' calls no more, where the raft thread's fsync leaves both free.
    /// (Measured on three members, the two ways' put100 and txn-put differ within noise; the
    /// busy case keeps the path it had. A lone write through the leader: 10 % less CPU.)
    pub fn propose(&self, data: Vec<u8>) -> impl Future<Output = Result<O>> + Send + 'static {
        self.propose_with(data, None, Company::Maybe)
    }

    /// [`propose`](Self::propose), handing this member's apply `local` with the entry
    /// ([`Committed::local`]) if the proposal still waits when it applies: the request `data`
    /// encodes, which the state machine then need not decode. `company`: what the caller
    /// knows of other requests that could share the turn.
    pub fn propose_local(
        &self,
        data: Vec<u8>,
        local: Local,
        company: Company,
    ) -> impl Future<Output = Result<O>> + Send + 'static {
        self.propose_with(data, Some(local), company)
    }

    fn propose_with(
        &self,
        data: Vec<u8>,
        local: Option<Local>,
        company: Company,
    ) -> impl Future<Output = Result<O>> + Send + 'static {
        let seq = self.shared.next_seq.fetch_add(1, Ordering::Relaxed);
        self.shared.note_asked();
        let (answer, rx) = oneshot::channel();
        let alone = {
            let mut waiters = self.shared.waiters.lock();
            waiters.insert(seq, Waiter { answer, local });
            waiters.len() == 1
        };
        if !alone && self.shared.lone_turns.load(Ordering::Relaxed) != 0 {
            // (Written only when it changes: under many writers every proposal comes here.)
            self.shared.lone_turns.store(0, Ordering::Relaxed);
        }
        let here = match self.shared.propose_at.load(Ordering::SeqCst) {
            at if at == ProposeAt::Here as u8 => true,
            at if at == ProposeAt::HereAlone as u8 => alone,
            _ => false,
        };
        let turn = if here {
            self.shared.queued.lock().push((seq, data));
            let at_once = company == Company::None
                && alone
                && self.shared.lone_turns.load(Ordering::Relaxed) >= LONE_TURNS;
            Some(self.queued_turn(at_once))
        } else {
            if self.send(Cmd::Propose { seq, data }).is_err() {
                self.shared.waiters.lock().remove(&seq);
            }
            None
        };
        async move {
            if let Some(turn) = turn {
                turn.await;
            }
            rx.await.unwrap_or(Err(Error::Stopped))
        }
    }

    /// The turn for a proposal just queued: `at_once`, taken in its first poll; else after
    /// one yield.
    fn queued_turn(&self, at_once: bool) -> QueuedTurn<O> {
        QueuedTurn {
            driver: self.driver.clone(),
            shared: self.shared.clone(),
            state: if at_once {
                TurnState::Take
            } else {
                TurnState::Yield
            },
        }
    }

    /// A linearizable read point: resolves with a commit index once this member has applied
    /// at least that far, so a local read then sees every write acknowledged before the call.
    /// Reads waiting together share one round of heartbeats; a leader that is the only voter
    /// answers at once when it has applied its commit index.
    pub fn read_index(&self) -> impl Future<Output = Result<RaftIndex>> + Send + 'static {
        self.read_round(self.shared.sole_read_point(), true)
    }

    /// Resolves once a quorum has confirmed this member's leader in a round of heartbeats
    /// begun after the call (at once for a leader that is the only voter), without waiting
    /// for the apply: etcd's leadership check before a lease renewal.
    pub fn confirm_leader(&self) -> impl Future<Output = Result<()>> + Send + 'static {
        let sole = self.shared.sole_leader.load(Ordering::SeqCst).then_some(0);
        let round = self.read_round(sole, false);
        async move { round.await.map(|_| ()) }
    }

    /// `point` if some, else the index of the next round of heartbeats, `applied`: once this
    /// member has applied that far.
    fn read_round(
        &self,
        point: Option<u64>,
        applied: bool,
    ) -> impl Future<Output = Result<RaftIndex>> + Send + 'static {
        // Ok: a read point now; Err: the answer to wait for, after a turn of the Ready loop
        // that asks for it (on this thread when the loop is free, as for a sole leader's
        // proposals: the round's messages leave with no hand-off to the raft thread).
        let point = point.ok_or_else(|| {
            self.shared.note_asked();
            let (tx, rx) = oneshot::channel();
            self.shared.reads_queued.lock().push((tx, applied));
            (self.queued_turn(false), rx)
        });
        async move {
            match point {
                Ok(index) => Ok(RaftIndex(index)),
                Err((turn, rx)) => {
                    turn.await;
                    rx.await.unwrap_or(Err(Error::Stopped)).map(RaftIndex)
                }
            }
        }
    }

    /// Changes the membership; resolves with the member list once the change is applied here.
    pub fn change_membership(
        &self,
        change: Change,
    ) -> impl Future<Output = Result<Members>> + Send + 'static {
        let (tx, rx) = oneshot::channel();
        let _ = self.send(Cmd::Change { change, reply: tx });
        async move { rx.await.unwrap_or(Err(Error::Stopped)) }
    }

    /// Asks the leader to hand leadership to `id` (best effort; watch [`RaftNode::status`]).
    pub fn transfer_leader(&self, id: MemberId) -> Result<()> {
        self.send(Cmd::TransferLeader(id.0))
    }

    /// Starts an election now (tests and tools).
    pub fn campaign(&self) -> Result<()> {
        self.send(Cmd::Campaign)
    }

    /// Where the transport delivers messages from peers to this node.
    pub fn inbox(&self) -> Inbox {
        Inbox {
            turn: Arc::new(PeerTurn {
                driver: self.driver.clone(),
                shared: self.shared.clone(),
            }),
            snapshotter: self.shared.snapshotter.clone(),
            removed: self.shared.removed_ids.clone(),
        }
    }

    pub fn status(&self) -> Status {
        self.shared.status.lock().clone()
    }

    /// The current term (cheaper than [`RaftNode::status`]: nothing is cloned).
    pub fn term(&self) -> u64 {
        self.shared.status.lock().term
    }

    /// The known leader and this member's role (cheap, as [`RaftNode::term`]).
    pub fn leader(&self) -> (Option<MemberId>, Role) {
        let s = self.shared.status.lock();
        (s.leader, s.role)
    }

    /// The commit and applied indexes (cheap, as [`RaftNode::term`]).
    pub fn progress(&self) -> (RaftIndex, RaftIndex) {
        let s = self.shared.status.lock();
        (s.commit, s.applied)
    }

    /// Whether this member is a learner (cheap, as [`RaftNode::term`]).
    pub fn is_learner(&self) -> bool {
        let s = self.shared.status.lock();
        s.members.get(s.id).is_some_and(|m| m.is_learner)
    }

    pub fn members(&self) -> Members {
        self.shared.status.lock().members.clone()
    }

    /// The terms in which this member has been leader (to check: never two leaders in a term).
    pub fn led_terms(&self) -> Vec<u64> {
        self.shared.led.lock().clone()
    }

    /// Stops the node and waits for its threads. Outstanding requests get [`Error::Stopped`].
    pub fn stop(&mut self) {
        let _ = self.shared.tx.send(Cmd::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.shared.fail_all(|| Error::Stopped);
    }
}

impl<O: Send + 'static> Drop for RaftNode<O> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Takes a turn of the Ready loop for queued proposals (see [`RaftNode::propose`]): after one
/// yield, on this thread if the loop is free, else by waking the raft thread; dropped before
/// then, it wakes the raft thread, which takes the proposal (the caller may have gone, the
/// proposal was made).
struct QueuedTurn<O: Send + 'static> {
    driver: Arc<Mutex<Option<Driver<O>>>>,
    shared: Arc<Shared<O>>,
    state: TurnState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TurnState {
    Yield,
    Take,
    Done,
}

impl<O: Send + 'static> QueuedTurn<O> {
    fn take(&mut self) {
        self.state = TurnState::Done;
        let _ = take_turn(&self.driver, &self.shared, true);
    }
}

impl<O: Send + 'static> Future for QueuedTurn<O> {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        match self.state {
            TurnState::Yield => {
                // Others polled in the same pass queue their proposals before the turn.
                self.state = TurnState::Take;
                cx.waker().wake_by_ref();
                std::task::Poll::Pending
            }
            TurnState::Take => {
                self.take();
                std::task::Poll::Ready(())
            }
            TurnState::Done => std::task::Poll::Ready(()),
        }
    }
}

impl<O: Send + 'static> Drop for QueuedTurn<O> {
    fn drop(&mut self) {
        if self.state != TurnState::Done {
            let _ = self.shared.tx.send(Cmd::Kick);
        }
    }
}

/// Turns a thread takes in a row for work others queued meanwhile before it leaves the rest
/// to the raft thread (a client's worker is not held by a flood of turns).
const TURNS_IN_A_ROW: usize = 4;

/// Takes the Ready loop's turn for what is queued for one, on this thread if `here` and the
/// loop is free; if another thread is in a turn, that thread takes one more when it lets go
/// (no wake-up of the raft thread, two context switches a message on a small machine); if
/// not `here`, by waking the raft thread. `Err(Stopped)` when the loop has ended (what was
/// queued is then failed).
fn take_turn<O: Send + 'static>(
    driver: &Mutex<Option<Driver<O>>>,
    shared: &Shared<O>,
    here: bool,
) -> Result<()> {
    if !here {
        return kick(driver, shared);
    }
    // Set before looking at the lock, and looked at by the holder after it lets go: one of
    // the two sees the other (the fences order the flag and the lock's word).
    shared.turn_wanted.store(true, Ordering::SeqCst);
    std::sync::atomic::fence(Ordering::SeqCst);
    for _ in 0..TURNS_IN_A_ROW {
        let Some(mut slot) = driver.try_lock() else {
            return Ok(());
        };
        let live = slot.is_some();
        Driver::take_queued(&mut slot, shared);
        drop(slot);
        if !live {
            return Err(Error::Stopped);
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        if !shared.turn_wanted.load(Ordering::SeqCst) {
            return Ok(());
        }
    }
    kick(driver, shared)
}

/// Wakes the raft thread to take a turn.
fn kick<O: Send + 'static>(driver: &Mutex<Option<Driver<O>>>, shared: &Shared<O>) -> Result<()> {
    if shared.tx.send(Cmd::Kick).is_ok() {
        return Ok(());
    }
    // The raft thread is winding down and reads no more commands: the lock is soon free,
    // and the loop ended (what was queued is failed).
    Driver::take_queued(&mut driver.lock(), shared);
    Err(Error::Stopped)
}

/// Takes a turn of the Ready loop for messages from peers (see [`Inbox::step_all`]).
trait TakeTurn: Send + Sync {
    fn deliver(&self, msgs: Vec<Message>) -> Result<()>;
    /// The node's loop has ended (a loop busy in a turn has not).
    fn stopped(&self) -> bool;
    /// See [`Inbox::asked_lately`].
    fn asked_lately(&self) -> bool;
}

struct PeerTurn<O: Send + 'static> {
    driver: Arc<Mutex<Option<Driver<O>>>>,
    shared: Arc<Shared<O>>,
}

impl<O: Send + 'static> TakeTurn for PeerTurn<O> {
    fn deliver(&self, msgs: Vec<Message>) -> Result<()> {
        if msgs.is_empty() {
            return Ok(());
        }
        // A snapshot from the leader is left to the raft thread: installing it saves it and
        // marks the WAL (two fsyncs a client's worker should not wait for; the restore itself
        // is the apply thread's). Another receiver's turn that starts first takes it too.
        let inline = !msgs
            .iter()
            .any(|m| m.get_msg_type() == MessageType::MsgSnapshot);
        {
            // Handed over as they are when nothing else waits (the turn takes the list).
            let mut stepped = self.shared.stepped.lock();
            if stepped.is_empty() {
                *stepped = msgs;
            } else {
                stepped.extend(msgs);
            }
        }
        take_turn(&self.driver, &self.shared, inline)
    }

    fn stopped(&self) -> bool {
        self.driver.try_lock().is_some_and(|d| d.is_none())
    }

    fn asked_lately(&self) -> bool {
        self.shared.asked_lately()
    }
}

/// Delivers messages from peers to a node (cheap to clone; outlives the node harmlessly).
#[derive(Clone)]
pub struct Inbox {
    turn: Arc<dyn TakeTurn>,
    snapshotter: Snapshotter,
    removed: Arc<Mutex<std::collections::HashSet<MemberId>>>,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox").finish_non_exhaustive()
    }
}

impl Inbox {
    /// Whether `id` was removed from the cluster (its messages are refused).
    pub fn is_removed(&self, id: MemberId) -> bool {
        self.removed.lock().contains(&id)
    }

    /// Whether the node has stopped: what a receiver that outlives it looks at between
    /// messages.
    pub fn is_stopped(&self) -> bool {
        self.turn.stopped()
    }

    /// Whether a request of this member's own (a proposal, a linearizable read; on a
    /// follower, one it forwards) went to the Ready loop in the last second: its answer is
    /// then made in a turn for the leader's messages, and wakes the task that waits for it
    /// unless that turn is taken on a tokio worker (see `grpc::receive`).
    pub fn asked_lately(&self) -> bool {
        self.turn.asked_lately()
    }

    /// A message from a peer.
    pub fn step(&self, msg: Message) -> Result<()> {
        self.step_all(vec![msg])
    }

    /// Messages from a peer, in order. They are queued for the Ready loop, and the loop's
    /// turn for them is taken on this thread if the raft thread is not in one (a follower's
    /// WAL write and fsync for an append, a leader's commit and small apply for an append's
    /// answer, happen here): no hand-off to the raft thread and back, the wake-ups that were
    /// most of a write's CPU on three members. Else the raft thread is woken to take them.
    pub fn step_all(&self, msgs: Vec<Message>) -> Result<()> {
        self.turn.deliver(msgs)
    }

    /// A snapshot message from the leader with the state machine's data: the data is saved
    /// (durably) before raft sees the message. Runs on the caller's thread.
    pub fn receive_snapshot(&self, msg: Message, data: &mut dyn Read) -> Result<()> {
        if msg.get_msg_type() != MessageType::MsgSnapshot {
            return Err(Error::NotSnapshot);
        }
        Members::decode(&msg.get_snapshot().data)?;
        let index = msg.get_snapshot().get_metadata().index;
        crate::snap::write_atomic(&self.snapshotter.recv_path(index), data)?;
        self.step(msg)
    }
}

/// The raft-rs change type for a membership change.
pub(crate) fn change_type(c: &Change) -> Option<(ConfChangeType, MemberId)> {
    match c {
        Change::AddMember(m) => Some((ConfChangeType::AddNode, m.id)),
        Change::AddLearner(m) => Some((ConfChangeType::AddLearnerNode, m.id)),
        Change::Promote(id) => Some((ConfChangeType::AddNode, *id)),
        Change::Remove(id) => Some((ConfChangeType::RemoveNode, *id)),
        Change::Update(_) => None,
    }
}

/// A deadline `timeout` from now.
pub(crate) fn deadline(timeout: Duration) -> Instant {
    Instant::now() + timeout
}
