//! An in-process raft cluster for tests: real nodes with real WAL and snapshot directories, a
//! network the test controls (drop, delay, partition, heal), and a state machine that records
//! what it applied so every test can check that all members applied the same entries, in the
//! same order, each once.
#![allow(dead_code)]

use std::collections::{BTreeMap, BinaryHeap, HashSet};
use std::fs;
use std::io::{self, Cursor, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use consensus::{
    Change, ClusterId, Committed, Config, Inbox, Member, MemberId, Members, Message, MessageType,
    RaftIndex, RaftNode, Reporter, Role, SnapshotDone, Start, StateMachine, Transport,
};
use parking_lot::{Condvar, Mutex};
use rand::Rng;

/// Applied proposals: (index, data).
pub type Log = Vec<(u64, Vec<u8>)>;

/// What a test state machine holds: the data of every proposal applied, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SmState {
    pub applied: u64,
    pub log: Log,
    /// Snapshots restored from the leader.
    pub restores: u64,
    /// Each apply call sleeps this long first (a slow state machine).
    pub apply_delay: Duration,
    /// Count entries only, keep no log (for benchmarks).
    pub light: bool,
    /// Entries applied with their proposer's [`Committed::local`] (each checked to be the
    /// entry's bytes); not kept by a restart.
    pub locals: u64,
}

impl SmState {
    fn encode(&self) -> Vec<u8> {
        let mut b = self.applied.to_le_bytes().to_vec();
        b.extend_from_slice(&(self.log.len() as u64).to_le_bytes());
        for (i, d) in &self.log {
            b.extend_from_slice(&i.to_le_bytes());
            b.extend_from_slice(&(d.len() as u64).to_le_bytes());
            b.extend_from_slice(d);
        }
        b
    }

    fn decode(b: &[u8]) -> io::Result<SmState> {
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "bad state");
        let mut r = Cursor::new(b);
        fn u(r: &mut Cursor<&[u8]>) -> io::Result<u64> {
            let mut a = [0u8; 8];
            r.read_exact(&mut a)?;
            Ok(u64::from_le_bytes(a))
        }
        let applied = u(&mut r)?;
        let n = u(&mut r)?;
        let mut log = Vec::new();
        for _ in 0..n {
            let i = u(&mut r)?;
            let len = u(&mut r)? as usize;
            let pos = r.position() as usize;
            let d = b.get(pos..pos + len).ok_or_else(bad)?.to_vec();
            r.set_position((pos + len) as u64);
            log.push((i, d));
        }
        Ok(SmState {
            applied,
            log,
            ..Default::default()
        })
    }
}

/// A state machine whose durable state is a file written on `sync` (as the pager's
/// unsynced commits, what was applied after the last sync is lost by a restart).
#[derive(Debug)]
pub struct TestSm {
    pub state: Arc<Mutex<SmState>>,
    path: PathBuf,
}

impl TestSm {
    pub fn open(dir: &Path, light: bool) -> TestSm {
        let path = dir.join("sm.state");
        let mut state = match fs::read(&path) {
            Ok(b) => SmState::decode(&b).expect("sm state"),
            Err(_) => SmState::default(),
        };
        state.light = light;
        TestSm {
            state: Arc::new(Mutex::new(state)),
            path,
        }
    }

    fn save(&self, st: &SmState) -> io::Result<()> {
        let tmp = self.path.with_extension("tmp");
        fs::write(&tmp, st.encode())?;
        fs::File::open(&tmp)?.sync_all()?;
        fs::rename(&tmp, &self.path)
    }
}

impl StateMachine for TestSm {
    /// The index the proposal was applied at.
    type Output = u64;

    fn applied(&self) -> RaftIndex {
        RaftIndex(self.state.lock().applied)
    }

    fn apply(&mut self, batch: &mut [Committed<'_>]) -> io::Result<Vec<u64>> {
        let delay = self.state.lock().apply_delay;
        std::thread::sleep(delay);
        let mut st = self.state.lock();
        let mut out = Vec::with_capacity(batch.len());
        for c in batch.iter_mut() {
            let index = c.index.0;
            assert!(index > st.applied, "applied {index} after {}", st.applied);
            st.applied = index;
            if let Some(local) = c.local.take() {
                let local = local
                    .downcast::<Vec<u8>>()
                    .expect("the harness hands its data");
                assert_eq!(
                    Some(&local[..]),
                    c.data,
                    "entry {index}: a local not its bytes"
                );
                st.locals += 1;
            }
            if let Some(d) = c.data.filter(|_| !st.light) {
                st.log.push((index, d.to_vec()));
            }
            out.push(index);
        }
        Ok(out)
    }

    fn sync(&mut self) -> io::Result<()> {
        let st = self.state.lock().clone();
        self.save(&st)
    }

    fn snapshot(&mut self) -> io::Result<Box<dyn Read + Send>> {
        Ok(Box::new(Cursor::new(self.state.lock().encode())))
    }

    fn restore(&mut self, index: RaftIndex, _term: u64, data: &mut dyn Read) -> io::Result<()> {
        let index = index.0;
        let mut b = Vec::new();
        data.read_to_end(&mut b)?;
        let mut new = SmState::decode(&b)?;
        assert_eq!(new.applied, index, "snapshot data at the snapshot's index");
        let mut st = self.state.lock();
        new.restores = st.restores + 1;
        new.apply_delay = st.apply_delay;
        new.light = st.light;
        self.save(&new)?;
        *st = new;
        Ok(())
    }
}

/// A read round's context, as its heartbeats carry it.
type Context = Vec<u8>;

/// The network between the members.
#[derive(Debug, Default)]
pub struct Net {
    inboxes: Mutex<BTreeMap<u64, Inbox>>,
    /// Links that drop everything (from, to).
    cut: Mutex<HashSet<(u64, u64)>>,
    /// Whether heartbeats' answers are dropped (on every link).
    mute_heartbeat_answers: AtomicBool,
    /// Heartbeats sent, on every link, whether delivered or not.
    heartbeats: AtomicU64,
    /// Per mille of messages dropped.
    drop_per_mille: AtomicU64,
    delay_ms: AtomicU64,
    queue: Mutex<BinaryHeap<Delayed>>,
    wake: Condvar,
    seq: AtomicU64,
    stop: AtomicBool,
    pub delivered: AtomicU64,
    pub snapshots: AtomicU64,
    /// Appends sent, by (from, to), whether delivered or not.
    appends: Mutex<BTreeMap<(u64, u64), u64>>,
    /// Answers to appends sent, by (from, to), whether delivered or not.
    answers: Mutex<BTreeMap<(u64, u64), u64>>,
    /// The read contexts heartbeats carried, by (from, to), in order sent: a round's context
    /// rides on its own heartbeats and on those the leader sends while the round is out.
    read_contexts: Mutex<BTreeMap<(u64, u64), Vec<Context>>>,
}

#[derive(Debug)]
struct Delayed {
    at: Instant,
    seq: u64,
    msg: Message,
}

impl PartialEq for Delayed {
    fn eq(&self, o: &Self) -> bool {
        self.seq == o.seq
    }
}
impl Eq for Delayed {}
impl PartialOrd for Delayed {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Delayed {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

impl Net {
    fn blocked(&self, from: u64, to: u64) -> bool {
        self.cut.lock().contains(&(from, to))
    }

    fn deliver(&self, m: Message) {
        let inbox = self.inboxes.lock().get(&m.to).cloned();
        if let Some(i) = inbox {
            if i.step(m).is_ok() {
                self.delivered.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn send(&self, m: Message) {
        if m.get_msg_type() == MessageType::MsgAppend {
            *self.appends.lock().entry((m.from, m.to)).or_default() += 1;
        }
        if m.get_msg_type() == MessageType::MsgHeartbeat {
            self.heartbeats.fetch_add(1, Ordering::Relaxed);
            if !m.context.is_empty() {
                let mut seen = self.read_contexts.lock();
                seen.entry((m.from, m.to))
                    .or_default()
                    .push(m.context.to_vec());
            }
        }
        if m.get_msg_type() == MessageType::MsgAppendResponse {
            *self.answers.lock().entry((m.from, m.to)).or_default() += 1;
        }
        if self.blocked(m.from, m.to) {
            return;
        }
        if m.get_msg_type() == MessageType::MsgHeartbeatResponse
            && self.mute_heartbeat_answers.load(Ordering::Relaxed)
        {
            return;
        }
        let p = self.drop_per_mille.load(Ordering::Relaxed);
        if p > 0 && rand::thread_rng().gen_range(0..1000) < p {
            return;
        }
        let delay = self.delay_ms.load(Ordering::Relaxed);
        if delay == 0 {
            self.deliver(m);
            return;
        }
        let d = Delayed {
            at: Instant::now() + Duration::from_millis(delay),
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            msg: m,
        };
        self.queue.lock().push(d);
        self.wake.notify_one();
    }

    fn run_delays(self: Arc<Self>) {
        let mut q = self.queue.lock();
        while !self.stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            match q.peek() {
                Some(d) if d.at <= now => {
                    let Some(d) = q.pop() else { continue };
                    drop(q);
                    if !self.blocked(d.msg.from, d.msg.to) {
                        self.deliver(d.msg);
                    }
                    q = self.queue.lock();
                }
                Some(d) => {
                    let at = d.at;
                    self.wake.wait_until(&mut q, at);
                }
                None => {
                    self.wake.wait_for(&mut q, Duration::from_millis(50));
                }
            }
        }
    }

    /// The appends `from` has sent `to` so far.
    pub fn appends(&self, from: u64, to: u64) -> u64 {
        self.appends.lock().get(&(from, to)).copied().unwrap_or(0)
    }

    /// The answers to appends `from` has sent `to` so far.
    pub fn answers(&self, from: u64, to: u64) -> u64 {
        self.answers.lock().get(&(from, to)).copied().unwrap_or(0)
    }

    /// The read contexts of the heartbeats `from` has sent `to` so far.
    pub fn read_contexts(&self, from: u64, to: u64) -> Vec<Context> {
        (self.read_contexts.lock().get(&(from, to)).cloned()).unwrap_or_default()
    }

    /// Cuts every link between `a` and the rest.
    pub fn isolate(&self, a: u64, all: &[u64]) {
        let mut cut = self.cut.lock();
        for &b in all.iter().filter(|&&b| b != a) {
            cut.insert((a, b));
            cut.insert((b, a));
        }
    }

    /// Splits the members into two sides that cannot talk.
    pub fn partition(&self, side: &[u64], other: &[u64]) {
        let mut cut = self.cut.lock();
        for &a in side {
            for &b in other {
                cut.insert((a, b));
                cut.insert((b, a));
            }
        }
    }

    pub fn heal(&self) {
        self.cut.lock().clear();
    }

    /// Drops (or again delivers) every heartbeat's answer. A leader answered by a heartbeat
    /// of a follower behind it sends that follower an append at once (raft-rs); with the
    /// answers gone, the appends a test counts are those its writes caused.
    pub fn mute_heartbeat_answers(&self, mute: bool) {
        self.mute_heartbeat_answers.store(mute, Ordering::Relaxed);
    }

    /// The heartbeats sent so far, on every link.
    pub fn heartbeats(&self) -> u64 {
        self.heartbeats.load(Ordering::Relaxed)
    }

    pub fn set_drop(&self, per_mille: u64) {
        self.drop_per_mille.store(per_mille, Ordering::Relaxed);
    }

    pub fn set_delay(&self, ms: u64) {
        self.delay_ms.store(ms, Ordering::Relaxed);
    }
}

/// One member's side of the network.
#[derive(Debug)]
pub struct NetTransport {
    id: u64,
    net: Arc<Net>,
}

impl Transport for NetTransport {
    fn start(&mut self, _reporter: Reporter) {}

    fn send(&mut self, msgs: Vec<Message>) {
        for m in msgs {
            self.net.send(m);
        }
    }

    fn send_snapshot(&mut self, msg: Message, data: PathBuf, done: SnapshotDone) {
        let net = self.net.clone();
        let id = self.id;
        std::thread::spawn(move || {
            if net.blocked(id, msg.to) {
                return done.finish(false);
            }
            let inbox = net.inboxes.lock().get(&msg.to).cloned();
            let ok = match (inbox, fs::File::open(&data)) {
                (Some(i), Ok(mut f)) => i.receive_snapshot(msg, &mut f).is_ok(),
                _ => false,
            };
            if ok {
                net.snapshots.fetch_add(1, Ordering::Relaxed);
            }
            done.finish(ok);
        });
    }

    fn update_members(&mut self, _members: &Members) {}

    /// Delivered on the sending thread, as kvd's direct streams write theirs.
    fn sends_inline(&self) -> bool {
        true
    }
}

/// A cluster of in-process members.
pub struct Cluster {
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    pub net: Arc<Net>,
    pub nodes: BTreeMap<u64, RaftNode<u64>>,
    pub states: BTreeMap<u64, Arc<Mutex<SmState>>>,
    pub ids: Vec<u64>,
    pub tune: fn(&mut Config),
    /// State machines keep no log (benchmarks).
    pub light: bool,
    /// Every proposal acknowledged to a client: (data, index).
    pub acked: Mutex<Vec<(Vec<u8>, u64)>>,
    /// Every leader seen: term → member.
    leaders: Mutex<BTreeMap<u64, u64>>,
    delay_thread: Option<JoinHandle<()>>,
    pub rt: tokio::runtime::Runtime,
}

pub const CLUSTER_ID: ClusterId = ClusterId(0x6b7664);

pub fn fast(c: &mut Config) {
    c.heartbeat = Duration::from_millis(10);
    c.election_ticks = 10;
    c.request_timeout = Duration::from_secs(3);
    c.wal.segment_size = 1 << 20;
}

pub fn member(id: u64) -> Member {
    Member {
        id: MemberId(id),
        name: format!("m{id}"),
        peer_urls: vec![format!("http://127.0.0.1:{}", 2380 + id)],
        client_urls: vec![],
        is_learner: false,
    }
}

impl Cluster {
    /// Starts `n` members (ids 1..=n) bootstrapping a new cluster.
    pub fn new(n: u64, tune: fn(&mut Config)) -> Cluster {
        Self::in_temp_dir(n, tune, false)
    }

    /// As `new`, with state machines that keep no log (benchmarks).
    pub fn new_light(n: u64, tune: fn(&mut Config)) -> Cluster {
        Self::in_temp_dir(n, tune, true)
    }

    fn in_temp_dir(n: u64, tune: fn(&mut Config), light: bool) -> Cluster {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut c = Self::open_with(tmp.path(), n, tune, light);
        c._tmp = Some(tmp);
        c
    }

    /// Members 1..=n with their data under `dir`: restarted from it if it holds theirs.
    pub fn open(dir: &Path, n: u64, tune: fn(&mut Config)) -> Cluster {
        Self::open_with(dir, n, tune, false)
    }

    fn open_with(dir: &Path, n: u64, tune: fn(&mut Config), light: bool) -> Cluster {
        let net = Arc::new(Net::default());
        let n2 = net.clone();
        let delay_thread = Some(std::thread::spawn(move || n2.run_delays()));
        let mut c = Cluster {
            dir: dir.to_path_buf(),
            _tmp: None,
            net,
            nodes: BTreeMap::new(),
            states: BTreeMap::new(),
            ids: (1..=n).collect(),
            tune,
            light,
            acked: Mutex::new(Vec::new()),
            leaders: Mutex::new(BTreeMap::new()),
            delay_thread,
            rt: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime"),
        };
        let members: Vec<Member> = c.ids.iter().map(|&i| member(i)).collect();
        for id in c.ids.clone() {
            c.start(id, Start::NewCluster(members.clone()));
        }
        c
    }

    pub fn member_dir(&self, id: u64) -> PathBuf {
        self.dir.join(format!("m{id}"))
    }

    pub fn config(&self, id: u64) -> Config {
        let mut cfg = Config::new(MemberId(id), CLUSTER_ID, self.member_dir(id));
        (self.tune)(&mut cfg);
        cfg
    }

    /// Starts (or restarts, if it has data) member `id`.
    pub fn start(&mut self, id: u64, start: Start) {
        let dir = self.member_dir(id);
        fs::create_dir_all(&dir).expect("member dir");
        let sm = TestSm::open(&dir, self.light);
        self.states.insert(id, sm.state.clone());
        let t = NetTransport {
            id,
            net: self.net.clone(),
        };
        let node = RaftNode::start(self.config(id), start, sm, t).expect("start node");
        self.net.inboxes.lock().insert(id, node.inbox());
        self.nodes.insert(id, node);
        if !self.ids.contains(&id) {
            self.ids.push(id);
        }
    }

    pub fn restart(&mut self, id: u64) {
        self.start(id, Start::Join(Vec::new()));
    }

    /// Stops member `id` (as a crash: what it had not synced is gone when it restarts).
    pub fn stop(&mut self, id: u64) {
        self.record_leaders();
        self.net.inboxes.lock().remove(&id);
        if let Some(mut n) = self.nodes.remove(&id) {
            n.stop();
        }
    }

    pub fn node(&self, id: u64) -> &RaftNode<u64> {
        &self.nodes[&id]
    }

    fn record_leaders(&self) {
        let mut seen = self.leaders.lock();
        for (id, n) in &self.nodes {
            for t in n.led_terms() {
                let prev = seen.insert(t, *id);
                assert!(
                    prev.is_none() || prev == Some(*id),
                    "two leaders in term {t}: {prev:?} and {id}"
                );
            }
        }
    }

    /// Waits until the running members agree on one leader; returns it.
    pub fn leader(&self) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            self.record_leaders();
            let mut leaders: Vec<(u64, u64)> = self
                .nodes
                .values()
                .map(|n| n.status())
                .filter(|s| s.role == Role::Leader)
                .map(|s| (s.term, s.id.0))
                .collect();
            leaders.sort();
            if let Some(&(term, id)) = leaders.last() {
                let agreed = self
                    .nodes
                    .values()
                    .map(|n| n.status())
                    .filter(|s| !s.removed && s.members.get(s.id).is_some_and(|m| !m.is_learner))
                    .all(|s| s.leader == Some(MemberId(id)) && s.term == term);
                if agreed {
                    return id;
                }
            }
            assert!(Instant::now() < deadline, "no leader within 20 s");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Proposes through member `via`, handing its apply the data as the proposal's local
    /// ([`RaftNode::propose_local`]); an acknowledged proposal is remembered for the checks.
    pub fn propose(&self, via: u64, data: Vec<u8>) -> consensus::Result<u64> {
        let fut = self.node(via).propose_local(
            data.clone(),
            Box::new(data.clone()),
            consensus::Company::Maybe,
        );
        let r = self.rt.block_on(fut);
        if let Ok(index) = r {
            self.acked.lock().push((data, index));
        }
        r
    }

    /// Proposes `n` values through `via`, concurrently (with no local), retrying each until
    /// acknowledged.
    pub fn propose_many(&self, via: u64, prefix: &str, n: usize) {
        let futs: Vec<_> = (0..n)
            .map(|i| {
                let data = format!("{prefix}-{i}").into_bytes();
                (data.clone(), self.node(via).propose(data))
            })
            .collect();
        let results = self.rt.block_on(async move {
            let mut out = Vec::new();
            for (d, f) in futs {
                out.push((d, f.await));
            }
            out
        });
        for (d, r) in results {
            match r {
                Ok(i) => self.acked.lock().push((d, i)),
                Err(_) => {
                    let leader = self.leader();
                    self.propose(leader, d).expect("retry on the leader");
                }
            }
        }
    }

    pub fn read_index(&self, via: u64) -> consensus::Result<u64> {
        self.rt.block_on(self.node(via).read_index()).map(|i| i.0)
    }

    pub fn change(&self, via: u64, change: Change) -> consensus::Result<Members> {
        self.rt.block_on(self.node(via).change_membership(change))
    }

    /// Waits until every running member has applied everything the leader committed.
    pub fn converge(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // A status is published after the Ready that committed an entry, which can be
            // after the entry is applied: the target is the furthest of both. A leader's whole
            // log is in it too: a new leader commits its predecessors' last entries only with
            // its own first one, so every member can agree on a commit short of them for a
            // moment (found by raft_crash: the followers applied three more entries between
            // this wait and the comparison of the logs).
            let statuses: Vec<_> = self.nodes.values().map(|n| n.status()).collect();
            let commits: Vec<u64> = statuses.iter().map(|s| s.commit.0).collect();
            let applied: Vec<u64> = self
                .nodes
                .keys()
                .map(|id| self.states[id].lock().applied)
                .collect();
            let logs = statuses
                .iter()
                .filter(|s| s.role == Role::Leader)
                .map(|s| s.last_index.0);
            let target = commits
                .iter()
                .chain(&applied)
                .copied()
                .chain(logs)
                .max()
                .unwrap_or(0);
            if commits.iter().chain(&applied).all(|&i| i >= target) {
                return;
            }
            if Instant::now() >= deadline {
                let status: Vec<String> = self
                    .nodes
                    .iter()
                    .map(|(id, n)| {
                        let s = n.status();
                        format!(
                            "{id}: {:?} of leader {:?} in term {}, commit {}, applied {}, snapshot {}, peers {:?}",
                            s.role, s.leader, s.term, s.commit, s.applied, s.snapshot_index, s.peers
                        )
                    })
                    .collect();
                panic!(
                    "members did not converge: commits {commits:?}, applied {applied:?}\n{}",
                    status.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The checks every test ends with: one leader per term; every running member applied the
    /// same entries in the same order, each once; every acknowledged proposal is among them.
    pub fn check(&self) {
        self.converge();
        self.record_leaders();
        let logs: Vec<(u64, Log)> = self
            .nodes
            .keys()
            .map(|id| (*id, self.states[id].lock().log.clone()))
            .collect();
        let (first_id, first) = &logs[0];
        for (id, log) in &logs[1..] {
            if log != first {
                let at = first.iter().zip(log).position(|(a, b)| a != b);
                let at = at.unwrap_or(first.len().min(log.len()));
                let show = |l: &Log| {
                    l.get(at.saturating_sub(2)..(at + 3).min(l.len()))
                        .unwrap_or_default()
                        .iter()
                        .map(|(i, d)| format!("{i}:{}", String::from_utf8_lossy(d)))
                        .collect::<Vec<_>>()
                };
                panic!(
                    "members {first_id} and {id} applied different logs ({} vs {} entries); \
                     from position {at}: {:?} vs {:?}; statuses {:?}",
                    first.len(),
                    log.len(),
                    show(first),
                    show(log),
                    self.nodes
                        .values()
                        .map(|n| n.status())
                        .map(|s| (s.id, s.commit, s.applied, s.snapshot_index, s.term))
                        .collect::<Vec<_>>()
                );
            }
        }
        let mut seen = HashSet::new();
        for (i, d) in first {
            assert!(
                seen.insert(d.clone()),
                "{:?} applied twice (again at {i})",
                String::from_utf8_lossy(d)
            );
        }
        let by_data: BTreeMap<&[u8], u64> = first.iter().map(|(i, d)| (&d[..], *i)).collect();
        for (d, i) in self.acked.lock().iter() {
            assert_eq!(
                by_data.get(&d[..]),
                Some(i),
                "acknowledged {:?} at {i} not applied there",
                String::from_utf8_lossy(d)
            );
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for id in self.nodes.keys().copied().collect::<Vec<_>>() {
            self.stop(id);
        }
        self.net.stop.store(true, Ordering::Relaxed);
        self.net.wake.notify_all();
        if let Some(t) = self.delay_thread.take() {
            let _ = t.join();
        }
    }
}

// Not every test binary that includes the harness waits on something.
#[allow(unused_imports)]
pub use test_support::wait_for;
