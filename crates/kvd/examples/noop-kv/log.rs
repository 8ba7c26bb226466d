//! The no-op's log for `NOOP_FSYNC=group`: a thread makes the puts waiting durable together
//! (one `fdatasync`), then answers them and hands out their events, as a server does its
//! concurrent writes. Three of them make a cluster whose every member serves clients — the
//! floor under a three-member watch fan-out (`tests/tools/watch-floor.sh` with `MEMBERS=3`):
//!
//! - the leader (`NOOP_LOG_PEERS=addr,addr`) sends each batch to both followers before its own
//!   fsync and waits for one of them (a majority of three) before answering; it takes the puts
//!   the followers' clients send on `NOOP_FORWARD_LISTEN`;
//! - a follower (`NOOP_LOG_LISTEN=addr`, with `NOOP_LEADER=` the leader's forwarding address)
//!   syncs each batch, answers it, and applies its puts in order, handing their events to its
//!   own watchers (its revisions are the leader's: every member starts at the same one); its
//!   clients' puts go to the leader, and are answered when the leader answers.
//!
//! Raft's messages, fsyncs and forwarding, and nothing else: no terms, elections or commit
//! index (a follower applies what it synced, sooner than a real one may), one batch in flight.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use api::etcdserverpb::{PutRequest, PutResponse};
use bytes::Bytes;
use parking_lot::{Condvar, Mutex};
use prost::encoding::encode_varint;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use crate::{sync_page, Noop};

type Answer = oneshot::Sender<PutResponse>;

/// Puts waiting for the one fsync that makes them durable together — each as it came (its
/// bytes, which the followers are sent) and decoded — and their answers' way back.
#[derive(Debug, Default)]
pub(crate) struct Group {
    waiting: Mutex<Vec<(Bytes, PutRequest, Answer)>>,
    cv: Condvar,
}

impl Group {
    /// Queues a put; answered once it is durable (on a majority, with followers).
    pub(crate) fn submit(&self, msg: Bytes, req: PutRequest) -> oneshot::Receiver<PutResponse> {
        let (answer, answered) = oneshot::channel();
        self.waiting.lock().push((msg, req, answer));
        self.cv.notify_one();
        answered
    }

    /// The syncing thread: every put waiting, sent to the followers (if any), one fsync, one
    /// follower's answer, then the puts' answers and events.
    pub(crate) fn sync_forever(
        &self,
        noop: &Noop,
        file: &std::fs::File,
        mut followers: Option<Followers>,
    ) {
        let mut frame = Vec::new();
        loop {
            let puts = {
                let mut waiting = self.waiting.lock();
                while waiting.is_empty() {
                    self.cv.wait(&mut waiting);
                }
                std::mem::take(&mut *waiting)
            };
            let sent = followers.as_mut().map(|f| {
                frame.clear();
                frame.extend_from_slice(&[0; 4]);
                for (msg, _, _) in &puts {
                    encode_varint(msg.len() as u64, &mut frame);
                    frame.extend_from_slice(msg);
                }
                let len = u32::try_from(frame.len() - 4).expect("a batch under 4 GiB");
                frame[..4].copy_from_slice(&len.to_be_bytes());
                f.send(&frame)
            });
            sync_page(file);
            if let (Some(f), Some(n)) = (&followers, sent) {
                f.wait(n);
            }
            for (_, req, answer) in puts {
                let _ = answer.send(noop.put_done(req));
            }
        }
    }
}

/// A leader's connections to its followers, and how many batches the quicker has answered.
#[derive(Debug)]
pub(crate) struct Followers {
    conns: Vec<TcpStream>,
    sent: u64,
    acked: Arc<(Mutex<u64>, Condvar)>,
}

impl Followers {
    /// Connects to each follower (retrying while they start); a thread each counts its answers.
    pub(crate) fn connect(addrs: &str) -> std::io::Result<Followers> {
        let acked = Arc::new((Mutex::new(0), Condvar::new()));
        let mut conns = Vec::new();
        for addr in addrs.split(',') {
            let sock = connect_retrying(addr)?;
            let mut rd = sock.try_clone()?;
            conns.push(sock);
            let acked = acked.clone();
            std::thread::spawn(move || {
                let (mut n, mut buf) = (0u64, [0u8; 64]);
                while let Ok(k @ 1..) = rd.read(&mut buf) {
                    n += k as u64;
                    let (m, cv) = &*acked;
                    let mut a = m.lock();
                    if n > *a {
                        *a = n;
                        cv.notify_all();
                    }
                }
            });
        }
        Ok(Followers {
            conns,
            sent: 0,
            acked,
        })
    }

    /// Sends a batch to every follower; its number.
    fn send(&mut self, frame: &[u8]) -> u64 {
        for c in &mut self.conns {
            c.write_all(frame).expect("send to a follower");
        }
        self.sent += 1;
        self.sent
    }

    /// Waits until a follower has answered batch `n`.
    fn wait(&self, n: u64) {
        let (m, cv) = &*self.acked;
        let mut a = m.lock();
        while *a < n {
            cv.wait(&mut a);
        }
    }
}

fn connect_retrying(addr: &str) -> std::io::Result<TcpStream> {
    let mut tries = 0;
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(_) if tries < 100 => tries += 1,
            Err(e) => return Err(e),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A follower's log: takes the leader's connection on `addr`, syncs each batch, answers it with
/// one byte, then applies its puts.
pub(crate) fn follow_forever(addr: &str, noop: &Noop, file: &std::fs::File) -> std::io::Result<()> {
    let l = std::net::TcpListener::bind(addr)?;
    let (mut sock, _) = l.accept()?;
    sock.set_nodelay(true)?;
    let mut rd = std::io::BufReader::new(sock.try_clone()?);
    let mut body = Vec::new();
    loop {
        let mut len = [0u8; 4];
        if rd.read_exact(&mut len).is_err() {
            return Ok(());
        }
        body.resize(u32::from_be_bytes(len) as usize, 0);
        rd.read_exact(&mut body)?;
        sync_page(file);
        sock.write_all(&[1])?;
        let mut batch = body.as_slice();
        while !batch.is_empty() {
            let req = PutRequest::decode_length_delimited(&mut batch)?;
            noop.put_done(req);
        }
    }
}

/// A follower's way to the leader for its clients' puts: each sent with a number, answered
/// with that number and the put's revision.
#[derive(Debug)]
pub(crate) struct Forwarder {
    out: mpsc::UnboundedSender<Vec<u8>>,
    pending: Mutex<HashMap<u64, Answer>>,
    next: AtomicU64,
}

impl Forwarder {
    /// Connects to the leader's forwarding address (retrying while it starts).
    pub(crate) async fn connect(addr: &str) -> std::io::Result<Arc<Forwarder>> {
        let (rd, mut wr) = crate::dial(addr).await?.into_split();
        let (out, mut frames) = mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(async move {
            while let Some(f) = frames.recv().await {
                if wr.write_all(&f).await.is_err() {
                    return;
                }
            }
        });
        let fwd = Arc::new(Forwarder {
            out,
            pending: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
        });
        let answers = fwd.clone();
        tokio::spawn(async move {
            let mut rd = tokio::io::BufReader::new(rd);
            while let (Ok(id), Ok(rev)) = (rd.read_u64().await, rd.read_i64().await) {
                if let Some(answer) = answers.pending.lock().remove(&id) {
                    let _ = answer.send(PutResponse {
                        header: Noop::header(rev),
                        ..Default::default()
                    });
                }
            }
        });
        Ok(fwd)
    }

    /// Sends a put (its request's bytes) to the leader.
    pub(crate) fn forward(&self, msg: &[u8]) -> oneshot::Receiver<PutResponse> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        self.pending.lock().insert(id, answer);
        let mut frame = Vec::with_capacity(12 + msg.len());
        frame.extend_from_slice(&id.to_be_bytes());
        frame.extend_from_slice(&u32::try_from(msg.len()).unwrap_or(u32::MAX).to_be_bytes());
        frame.extend_from_slice(msg);
        let _ = self.out.send(frame);
        answered
    }
}

/// The leader's side of forwarding: each follower's puts queued in `group`, answered with
/// their numbers and revisions once durable.
pub(crate) async fn serve_forwarded(addr: String, group: Arc<Group>) -> std::io::Result<()> {
    let l = tokio::net::TcpListener::bind(&addr).await?;
    loop {
        let (sock, _) = l.accept().await?;
        sock.set_nodelay(true)?;
        let group = group.clone();
        tokio::spawn(async move {
            let (rd, mut wr) = sock.into_split();
            let (tx, mut answers) = mpsc::unbounded_channel::<[u8; 16]>();
            tokio::spawn(async move {
                while let Some(a) = answers.recv().await {
                    if wr.write_all(&a).await.is_err() {
                        return;
                    }
                }
            });
            let mut rd = tokio::io::BufReader::new(rd);
            while let (Ok(id), Ok(len)) = (rd.read_u64().await, rd.read_u32().await) {
                let mut msg = vec![0; len as usize];
                if rd.read_exact(&mut msg).await.is_err() {
                    return;
                }
                let msg = Bytes::from(msg);
                let Ok(req) = PutRequest::decode(msg.clone()) else {
                    return;
                };
                let answered = group.submit(msg, req);
                let tx = tx.clone();
                tokio::spawn(async move {
                    if let Ok(resp) = answered.await {
                        let rev = resp.header.map_or(0, |h| h.revision);
                        let mut a = [0u8; 16];
                        a[..8].copy_from_slice(&id.to_be_bytes());
                        a[8..].copy_from_slice(&rev.to_be_bytes());
                        let _ = tx.send(a);
                    }
                });
            }
        });
    }
}
