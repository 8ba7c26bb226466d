//! The receiving end of a framed stream (the conversation is `super::framed`'s): the opening's
//! checks, then each frame read stepped into the node, and the keep-alives.
//!
//! Over plain TCP a stream moves between two readers. From the leader (appends, heartbeats)
//! to a follower no client uses, it is read by a thread of its own, blocked on the socket,
//! which takes the Ready loop's turn for what it reads (the WAL write, the fsync, the answer):
//! no task woken for each frame, no `select!` with its timer, no worker parked and unparked —
//! a quarter of a follower's instructions per write (docs/measurements.md, "A stream from the
//! leader read by a thread"). Otherwise a task reads it. From a follower (a leader's append
//! answers): those arrive while the leader's worker is in its own fsync, and the worker finds
//! them ready when it comes back, without a wake-up; a thread would be woken for each. To a
//! follower that forwards its clients' writes or asks for read points (in the last second):
//! the turn that answers them would wake their tasks from the thread, where a worker taking
//! it polls them itself. Over TLS a task reads the stream.

use std::io::{ErrorKind, Read, Write};
use std::time::Instant;

use raft::eraftpb::MessageType;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::TcpStream;
use tokio::runtime::Handle;

use super::framed::{decode, refusal, write, DEAD, KEEPALIVE, KEEPALIVE_RECORD, MAGIC, OK};
use super::service::PeerService;
use super::ticker::Ticker;
use super::wire::{removed, OPEN_TIMEOUT, REMOVED};
use crate::dial::Conn;
use ids::{ClusterId, MemberId};

/// The bytes a stream's opening carries: [`MAGIC`], then three ids.
const HEAD: usize = MAGIC.len() + 24;

impl PeerService {
    /// Serves one connection that opened with [`MAGIC`] (`first`: the bytes already read from
    /// it, to tell it from gRPC): checks who sent it, then steps the raft messages it carries
    /// into the node until it ends.
    pub async fn serve_framed<T>(self, first: Vec<u8>, mut io: Conn<T>)
    where
        T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let Some(rcv) = self.open_framed(&first, &mut io).await else {
            return;
        };
        match io {
            Conn::Plain(sock) => rcv.run_plain(sock).await,
            tls => drop(rcv.run(tls, false).await),
        }
    }

    /// Reads and checks the opening (the first of it in `first`) and answers it: the
    /// receiving end of an admitted stream, or `None` when it ended there.
    async fn open_framed<S>(self, first: &[u8], io: &mut S) -> Option<Receiving>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let mut head = [0u8; HEAD];
        let have = first.len().min(HEAD);
        head[..have].copy_from_slice(&first[..have]);
        let ok = tokio::time::timeout(OPEN_TIMEOUT, io.read_exact(&mut head[have..])).await;
        if !matches!(ok, Ok(Ok(_))) || &head[..MAGIC.len()] != MAGIC {
            tracing::debug!("a peer connection that is neither gRPC nor a raft stream: closed");
            return None;
        }
        let id = |i: usize| {
            let at = MAGIC.len() + 8 * i;
            u64::from_le_bytes(head[at..at + 8].try_into().unwrap_or_default())
        };
        let (cluster, from, to) = (ClusterId(id(0)), MemberId(id(1)), MemberId(id(2)));
        let mut answer = MAGIC.to_vec();
        let admitted = self.admit_ids(cluster, from, to);
        match &admitted {
            Ok(_) => {
                answer.push(OK);
                answer.extend_from_slice(&self.cluster_id.0.to_le_bytes());
                answer.extend_from_slice(&self.id.0.to_le_bytes());
            }
            Err(s) => answer.extend_from_slice(&refusal(s.message())),
        }
        if write(io, &answer, "a peer").await.is_err() {
            return None;
        }
        let from = admitted.ok()?;
        let received =
            crate::metrics::PEER_RECEIVED_BYTES.with_label_values(&[&crate::metrics::peer(from)]);
        let mut buf = Vec::with_capacity(64 << 10);
        buf.extend_from_slice(&first[have..]);
        let now = Instant::now();
        Some(Receiving {
            svc: self,
            from,
            buf,
            received,
            last_read: now,
            last_write: now,
            leads: false,
        })
    }
}

/// An admitted stream's receiving end, whatever reads it.
struct Receiving {
    svc: PeerService,
    from: MemberId,
    /// What was read and not yet decoded: a frame's first part.
    buf: Vec<u8>,
    received: prometheus::IntCounter,
    last_read: Instant,
    last_write: Instant,
    /// The peer sends as this member's leader (appends, heartbeats), as far as the last
    /// messages from it tell.
    leads: bool,
}

/// What a stream does next.
enum Next {
    Go,
    /// End without a word: the peer closed it, or the node stopped.
    End,
    /// Tell the peer why, and end.
    Refuse(String),
}

/// What the clock asks of a stream between reads.
enum Due {
    Nothing,
    KeepAlive,
    /// Nothing read for [`DEAD`]: give it up.
    Dead,
}

impl Receiving {
    /// `n` more bytes read into `buf` (0: the peer closed the stream): steps the messages of
    /// the frames they complete.
    fn read(&mut self, n: usize) -> Next {
        if n == 0 {
            return Next::End;
        }
        self.received.inc_by(n as u64);
        self.last_read = Instant::now();
        if self.svc.inbox.is_removed(self.from) {
            return Next::Refuse(
                removed(self.from, self.svc.cluster_id)
                    .message()
                    .to_string(),
            );
        }
        let mut msgs = Vec::new();
        let bad = decode(&mut self.buf, &mut msgs).err();
        msgs.retain(|m| self.svc.steppable(m));
        for m in &msgs {
            match m.get_msg_type() {
                MessageType::MsgAppend | MessageType::MsgHeartbeat => self.leads = true,
                MessageType::MsgAppendResponse | MessageType::MsgHeartbeatResponse => {
                    self.leads = false
                }
                _ => {}
            }
        }
        // One turn of the Ready loop for what arrived, on this thread when the loop is free.
        if !msgs.is_empty() && self.svc.inbox.step_all(msgs).is_err() {
            return Next::End;
        }
        if let Some(e) = bad {
            return Next::Refuse(e);
        }
        if self.buf.capacity() - self.buf.len() < 4096 {
            self.buf.reserve(64 << 10);
        }
        Next::Go
    }

    /// Whether a thread of its own is to read the stream (over plain TCP): while its sender
    /// leads, and no request of this member's own waits on what it sends (see the module's
    /// notes).
    fn threaded(&self) -> bool {
        self.leads && !self.svc.inbox.asked_lately()
    }

    fn due(&self, now: Instant) -> Due {
        if now.saturating_duration_since(self.last_read) >= DEAD {
            tracing::debug!(peer = %self.from, "nothing heard for {DEAD:?}: stream closed");
            Due::Dead
        } else if now.saturating_duration_since(self.last_write) >= KEEPALIVE {
            Due::KeepAlive
        } else {
            Due::Nothing
        }
    }

    /// The record that ends a refused stream.
    fn refusal(&self, why: &str) -> Vec<u8> {
        if !why.contains(REMOVED) {
            tracing::warn!(peer = %self.from, "peer stream refused: {why}");
        }
        refusal(why)
    }

    /// Reads the stream on this task until it ends, or, with `hand_off`, until a thread is
    /// to read it ([`Self::threaded`]): then the stream is given back.
    async fn run<S: AsyncRead + AsyncWrite + Unpin>(
        mut self,
        mut io: S,
        hand_off: bool,
    ) -> Option<(Self, S)> {
        let mut tick = Ticker::new(KEEPALIVE);
        let why = loop {
            tokio::select! {
                n = io.read_buf(&mut self.buf) => {
                    let n = match n {
                        Ok(n) => n,
                        Err(e) => {
                            tracing::debug!(peer = %self.from, "peer stream ended: {e}");
                            return None;
                        }
                    };
                    match self.read(n) {
                        Next::Go if hand_off && self.threaded() => return Some((self, io)),
                        Next::Go => {}
                        Next::End => return None,
                        Next::Refuse(why) => break why,
                    }
                }
                _ = tick.tick() => match self.due(Instant::now()) {
                    Due::Nothing => {}
                    Due::Dead => return None,
                    Due::KeepAlive => {
                        if write(&mut io, &[KEEPALIVE_RECORD], "a peer").await.is_err() {
                            return None;
                        }
                        self.last_write = Instant::now();
                    }
                },
            }
        };
        let _ = write(&mut io, &self.refusal(&why), "a peer").await;
        None
    }

    /// Reads a stream over plain TCP: on a thread of its own while [`Self::threaded`], else
    /// on this task.
    async fn run_plain(self, sock: TcpStream) {
        let Some((rcv, sock)) = self.run(sock, true).await else {
            return;
        };
        let (from, me) = (rcv.from, rcv.svc.id);
        let handle = Handle::current();
        let sock = match sock.into_std() {
            Ok(s) => s,
            Err(e) => return tracing::warn!(peer = %from, "a peer stream's socket: {e}"),
        };
        let spawned = std::thread::Builder::new()
            .name(format!("recv-{from}-{me}"))
            .spawn(move || rcv.run_blocking(sock, handle));
        if let Err(e) = spawned {
            tracing::warn!(peer = %from, "no thread to read a peer stream (it closes): {e}");
        }
    }

    /// Reads the stream on this thread, blocked on the socket, until it ends or a thread is
    /// no longer to read it: then a task on `rt` reads it again.
    fn run_blocking(mut self, mut sock: std::net::TcpStream, rt: Handle) {
        // The turns taken here may start tasks, as on a worker.
        let _rt = rt.enter();
        // Reads wait at most a keep-alive's period, for the clock's checks; a write waits no
        // longer than a silent peer is given.
        let set = sock
            .set_nonblocking(false)
            .and_then(|()| sock.set_read_timeout(Some(KEEPALIVE)))
            .and_then(|()| sock.set_write_timeout(Some(DEAD)));
        if let Err(e) = set {
            return tracing::warn!(peer = %self.from, "a peer stream's socket: {e}");
        }
        let mut chunk = vec![0u8; 64 << 10];
        let mut next_tick = Instant::now() + KEEPALIVE;
        let why = loop {
            match sock.read(&mut chunk) {
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    match self.read(n) {
                        Next::Go if self.threaded() => {}
                        Next::Go => return self.hand_back(sock, &rt),
                        Next::End => return,
                        Next::Refuse(why) => break why,
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return tracing::debug!(peer = %self.from, "peer stream ended: {e}"),
            }
            let now = Instant::now();
            if now < next_tick {
                continue;
            }
            next_tick = now + KEEPALIVE;
            // A stopped node's streams end here (a task's end with its runtime).
            if self.svc.inbox.is_stopped() {
                return;
            }
            match self.due(now) {
                Due::Nothing => {}
                Due::Dead => return,
                Due::KeepAlive => {
                    if sock.write_all(&[KEEPALIVE_RECORD]).is_err() {
                        return;
                    }
                    self.last_write = now;
                }
            }
        };
        let _ = sock.write_all(&self.refusal(&why));
    }

    /// Gives the stream back to a task on `rt`. Called in `rt`'s
    /// context (`run_blocking` entered it), which registering the socket needs.
    fn hand_back(self, sock: std::net::TcpStream, rt: &Handle) {
        match sock
            .set_nonblocking(true)
            .and_then(|()| TcpStream::from_std(sock))
        {
            Ok(sock) => drop(rt.spawn(self.run_plain(sock))),
            Err(e) => tracing::warn!(peer = %self.from, "a peer stream's socket: {e}"),
        }
    }
}
