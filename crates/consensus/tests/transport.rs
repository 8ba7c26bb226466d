//! The peer transport on loopback: members in one process, each with its own peer server on a
//! free port, talking over real connections — framed raft streams where both ends speak them,
//! gRPC (HTTP/2) where the receiving end serves only that.

mod harness;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use consensus::grpc::{GrpcTransport, PeerService};
use consensus::{ClusterId, Config, Member, MemberId, RaftNode, Role, Start};
use harness::{wait_for, SmState, TestSm};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

struct Running {
    node: RaftNode<u64>,
    state: Arc<Mutex<SmState>>,
    errors: Arc<Mutex<std::collections::HashMap<MemberId, String>>>,
    shutdown: Option<oneshot::Sender<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.node.stop();
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
    }
}

struct Net {
    rt: tokio::runtime::Runtime,
    dir: tempfile::TempDir,
    listeners: BTreeMap<u64, std::net::TcpListener>,
    members: Vec<Member>,
    /// Peer servers that serve only gRPC, as a member from before the framed stream.
    grpc_only: bool,
    /// Connections the peer servers took as framed raft streams.
    framed: Arc<AtomicUsize>,
}

impl Net {
    /// Binds a free loopback port for each member id.
    fn new(ids: &[u64]) -> Net {
        let mut listeners = BTreeMap::new();
        let mut members = Vec::new();
        for &id in ids {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.set_nonblocking(true).unwrap();
            members.push(Member {
                id: MemberId(id),
                name: format!("m{id}"),
                peer_urls: vec![format!("http://{}", l.local_addr().unwrap())],
                ..Default::default()
            });
            listeners.insert(id, l);
        }
        Net {
            rt: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap(),
            dir: tempfile::tempdir().unwrap(),
            listeners,
            members,
            grpc_only: false,
            framed: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn grpc_only(mut self) -> Net {
        self.grpc_only = true;
        self
    }

    /// Puts a URL where nothing listens before member `id`'s own: a free port below the
    /// ephemeral range, which no outgoing connection of this or another test takes as its
    /// source port (a port `bind(0)` handed out and released could be).
    fn dead_url_first(mut self, id: u64) -> Net {
        let dead = test_support::free_port();
        let m = self
            .members
            .iter_mut()
            .find(|m| m.id == MemberId(id))
            .unwrap();
        m.peer_urls.insert(0, format!("http://127.0.0.1:{dead}"));
        self
    }

    fn start(&mut self, n: u64, cluster: u64, tune: fn(&mut Config)) -> Running {
        let (id, cluster) = (MemberId(n), ClusterId(cluster));
        let dir = self.dir.path().join(format!("m{n}"));
        std::fs::create_dir_all(&dir).unwrap();
        let sm = TestSm::open(&dir, false);
        let state = sm.state.clone();
        let mut cfg = Config::new(id, cluster, &dir);
        tune(&mut cfg);
        let t = GrpcTransport::new(
            id,
            cluster,
            consensus::Dialer::plain(),
            self.rt.handle().clone(),
        );
        let errors = t.errors();
        let node = RaftNode::start(cfg, Start::NewCluster(self.members.clone()), sm, t).unwrap();
        let raft = PeerService::new(id, cluster, node.inbox());
        let svc = raft.clone().into_server();
        let listener = self.listeners.remove(&n).unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        // As kvd's peer port: a connection whose first byte is the framed stream's goes to
        // it, any other to the gRPC server.
        let (conns, incoming) = tokio::sync::mpsc::channel(16);
        let (grpc_only, framed) = (self.grpc_only, self.framed.clone());
        let accept = self.rt.spawn(async move {
            let l = TcpListener::from_std(listener).unwrap();
            while let Ok((mut sock, _)) = l.accept().await {
                let (conns, raft, framed) = (conns.clone(), raft.clone(), framed.clone());
                tokio::spawn(async move {
                    let Ok((_, first)) = grpc_wire::sniff(&mut sock).await else {
                        return;
                    };
                    let is_framed = first.first() == consensus::grpc::MAGIC.first();
                    if is_framed && !grpc_only {
                        framed.fetch_add(1, Ordering::Relaxed);
                        let sock = consensus::dial::Conn::<tokio::net::TcpStream>::Plain(sock);
                        raft.serve_framed(first, sock).await;
                    } else {
                        let sock = grpc_wire::Rewind::new(first, sock);
                        let _ = conns.send(Ok::<_, std::io::Error>(sock)).await;
                    }
                });
            }
        });
        self.rt.spawn(async move {
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::ReceiverStream::new(incoming),
                    async {
                        let _ = rx.await;
                    },
                )
                .await
                .unwrap();
            accept.abort();
        });
        Running {
            node,
            state,
            errors,
            shutdown: Some(tx),
        }
    }
}

fn tune(c: &mut Config) {
    harness::fast(c);
    c.snapshot_count = 100;
    c.snapshot_catchup_entries = 10;
}

#[test]
fn a_cluster_over_framed_streams_replicates_and_sends_snapshots() {
    let net = Net::new(&[1, 2, 3]);
    let framed = net.framed.clone();
    member_3_catches_up_by_snapshot(net);
    // Every member's link to each of its two peers.
    assert!(framed.load(Ordering::Relaxed) >= 6, "{framed:?}");
}

#[test]
fn a_cluster_replicates_over_grpc_where_peers_serve_only_grpc() {
    member_3_catches_up_by_snapshot(Net::new(&[1, 2, 3]).grpc_only());
}

#[test]
fn a_snapshot_reaches_a_member_through_its_second_url_when_the_first_is_down() {
    member_3_catches_up_by_snapshot(Net::new(&[1, 2, 3]).dead_url_first(3));
}

/// The names of this process's threads that read a framed stream from member `from` on
/// member `to` (`recv-{from}-{to}`, ids in hex, as the receiver names them).
fn readers(from: u64, to: u64) -> usize {
    let name = format!("recv-{from:x}-{to:x}");
    let tasks = std::fs::read_dir("/proc/self/task").unwrap();
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

/// A stream from the leader is read by a thread on each follower (but for a second after the
/// follower forwards a write), and a stream from a follower by a task on the leader; when the
/// leadership moves, each stream changes hands with its sender's role, and the writes through
/// the new leader reach every member. (Ids of their own: the other tests in this process name
/// their threads by theirs.)
#[test]
fn a_stream_is_read_by_a_thread_while_its_sender_leads() {
    let mut net = Net::new(&[0x51, 0x52, 0x53]);
    let ms: BTreeMap<u64, Running> = [0x51, 0x52, 0x53]
        .into_iter()
        .map(|id| (id, net.start(id, 7, tune)))
        .collect();
    let leader = || {
        ms.iter()
            .find(|(_, m)| m.node.status().role == Role::Leader)
            .map(|(id, _)| *id)
    };
    wait_for("a leader", 20, || leader().is_some());
    let mut want = 0;
    let mut write = |l: u64, round: u32| {
        // The index each write was applied at (the leader's status may not show the last
        // one yet: it is published when the turn that applied it ends).
        for i in 0..20 {
            let f = ms[&l].node.propose(format!("{round}-{i}").into_bytes());
            want = want.max(net.rt.block_on(f).unwrap());
        }
        for m in ms.values() {
            wait_for("every member to apply the writes", 20, || {
                m.state.lock().applied >= want
            });
        }
    };
    let (mut l, mut round) = (leader().unwrap(), 0);
    for _ in 0..2 {
        write(l, round);
        round += 1;
        let followers: Vec<u64> = ms.keys().copied().filter(|&id| id != l).collect();
        wait_for(
            "the leader's streams read by threads, the followers' by tasks",
            10,
            || {
                followers
                    .iter()
                    .all(|&f| readers(l, f) == 1 && readers(f, l) == 0)
            },
        );
        // A follower that forwards a write reads its leader's stream on a task for the
        // second after (the answer is made in a turn for the leader's messages), then on a
        // thread again.
        let f = followers[1];
        net.rt
            .block_on(ms[&f].node.propose(format!("{round}-f").into_bytes()))
            .unwrap();
        wait_for("a forwarding follower's stream read by a task", 10, || {
            readers(l, f) == 0
        });
        wait_for("its stream read by a thread again", 10, || {
            readers(l, f) == 1
        });
        // The leadership moves to a follower: its old leader's stream (now answers) goes
        // back to a task, and the new leader's streams to threads.
        let next = followers[0];
        ms[&l].node.transfer_leader(MemberId(next)).unwrap();
        wait_for("the new leader", 20, || leader() == Some(next));
        (l, round) = (next, round + 1);
    }
    write(l, round);
    let logs: Vec<_> = ms.values().map(|m| m.state.lock().log.clone()).collect();
    assert_eq!(logs[0], logs[1]);
    assert_eq!(logs[0], logs[2]);
    assert_eq!(logs[0].len(), 62);
}

/// Members 1 and 2 commit 600 entries while 3 is down, compacting their logs past it; 3 then
/// starts and catches up by a snapshot, and all three hold the same log.
fn member_3_catches_up_by_snapshot(mut net: Net) {
    let mut ms: BTreeMap<u64, Running> = BTreeMap::new();
    for id in [1, 2] {
        ms.insert(id, net.start(id, 7, tune));
    }
    wait_for("a leader", 20, || {
        ms.values().any(|m| m.node.status().role == Role::Leader)
    });
    let l = *ms
        .iter()
        .find(|(_, m)| m.node.status().role == Role::Leader)
        .unwrap()
        .0;
    // Member 3 is down: the leader reports it unreachable and keeps going; its log is
    // compacted well past anything 3 has.
    let mut acked = Vec::new();
    for round in 0..6 {
        let futs: Vec<_> = (0..100)
            .map(|i| ms[&l].node.propose(format!("{round}-{i}").into_bytes()))
            .collect();
        for f in futs {
            acked.push(net.rt.block_on(f).unwrap());
        }
    }
    wait_for("the leader to record why 3 is unreachable", 10, || {
        ms[&l].errors.lock().contains_key(&MemberId(3))
    });
    ms.insert(3, net.start(3, 7, tune));
    let want = acked.iter().copied().max().unwrap_or_default();
    wait_for("member 3 to catch up by snapshot", 20, || {
        ms[&3].state.lock().applied >= want
    });
    assert!(ms[&3].state.lock().restores >= 1, "3 restored a snapshot");
    for m in ms.values() {
        wait_for("convergence", 20, || m.state.lock().applied >= want);
    }
    let logs: Vec<_> = ms.values().map(|m| m.state.lock().log.clone()).collect();
    assert_eq!(logs[0], logs[1]);
    assert_eq!(logs[0], logs[2]);
    assert_eq!(logs[0].len(), 600);
    // The leader stops recording an error for 3 once the stream is up.
    wait_for("the leader's link to 3", 10, || {
        !ms[&l].errors.lock().contains_key(&MemberId(3))
    });
    drop(ms);
}

#[test]
fn a_peer_from_another_cluster_is_refused_on_both_sides() {
    another_cluster_is_refused(Net::new(&[1, 2]));
}

#[test]
fn a_peer_from_another_cluster_is_refused_on_both_sides_over_grpc() {
    another_cluster_is_refused(Net::new(&[1, 2]).grpc_only());
}

fn another_cluster_is_refused(mut net: Net) {
    // Same member ids and URLs, different cluster ids (say, another --initial-cluster-token).
    let a = net.start(1, 0xaaaa, harness::fast);
    let b = net.start(2, 0xbbbb, harness::fast);
    let refused = |m: &Running, peer: u64| {
        let errors = m.errors.lock();
        errors
            .get(&MemberId(peer))
            .is_some_and(|e| e.contains("cluster id mismatch"))
    };
    wait_for("both sides to see the mismatch", 20, || {
        refused(&a, 2) && refused(&b, 1)
    });
    let e = a.errors.lock()[&MemberId(2)].clone();
    assert!(e.contains("aaaa") && e.contains("bbbb"), "{e}");
    // Nothing crossed: no leader anywhere (each side needs the other's vote).
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(a.node.status().leader, None);
    assert_eq!(b.node.status().leader, None);
}
