//! The framed stream over plain TCP, written by the thread that sends: the thread in the Ready
//! loop's turn encodes a peer's messages and writes them to the socket itself (a non-blocking
//! write), instead of queueing them for the link's task and waking it: a task's wake-up and
//! turn per batch on every member, 7–10 % of a three-member write's CPU (docs/measurements.md,
//! "The sending thread writes the frames").
//!
//! What the socket does not take at once stays in the link's backlog, in order, and the link's
//! task writes it when the socket is writable again; until the backlog is empty, new frames
//! join it rather than jumping ahead. The task also reads the receiver's keep-alives and
//! refusals, writes keep-alives when nothing else was written for a second, and gives the link
//! up as the framed stream's does. A stream over TLS is written by its task (`framed::pump`).

use std::io::ErrorKind;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use raft::eraftpb::Message;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify};

use super::framed::{encode, read_records, DEAD, KEEPALIVE, KEEPALIVE_RECORD};
use super::ticker::Ticker;

/// The most bytes a link's backlog holds: past it the peer is not reading, and raft is told
/// it is unreachable (as when the link's queue is full).
const BACKLOG_MAX: usize = 64 << 20;

/// A peer's framed stream over plain TCP, shared by the senders and the link's task.
#[derive(Debug)]
pub(super) struct Direct {
    sock: TcpStream,
    out: Mutex<Out>,
    /// The task has a backlog to write (or a failure to report).
    wake: Notify,
    sent: prometheus::IntCounter,
}

#[derive(Debug, Default)]
struct Out {
    /// Frames not yet written, in order.
    backlog: Vec<u8>,
    /// A write failed: the link is done.
    failed: Option<String>,
    /// Something was written since the task last looked (no keep-alive needed).
    wrote: bool,
}

/// Where a peer's direct stream is, while it is up.
pub(super) type Slot = Arc<Mutex<Option<Arc<Direct>>>>;

impl Direct {
    pub(super) fn new(sock: TcpStream, sent: prometheus::IntCounter) -> Self {
        Direct {
            sock,
            out: Mutex::new(Out::default()),
            wake: Notify::new(),
            sent,
        }
    }

    /// Sends `msgs` from the calling thread: written now if the socket takes them and nothing
    /// is waiting before them, else left to the task. `false`: the link has failed or the
    /// peer reads nothing (the caller reports it unreachable; raft resends).
    pub(super) fn send(&self, msgs: &[Message]) -> bool {
        self.put(|b| {
            for m in msgs {
                if let Err(e) = encode(m, b) {
                    tracing::warn!(to = m.to, "a raft message not sent: {e}");
                }
            }
        })
    }

    fn put(&self, frames: impl FnOnce(&mut Vec<u8>)) -> bool {
        let mut out = self.out.lock();
        if out.failed.is_some() || out.backlog.len() > BACKLOG_MAX {
            return false;
        }
        let waiting = !out.backlog.is_empty();
        frames(&mut out.backlog);
        if !waiting && !self.write_some(&mut out) {
            self.wake.notify_one();
        }
        true
    }

    /// Writes the backlog while the socket takes it: whether it is all written.
    fn write_some(&self, out: &mut Out) -> bool {
        while !out.backlog.is_empty() {
            match self.sock.try_write(&out.backlog) {
                Ok(n) => {
                    out.backlog.drain(..n);
                    out.wrote = true;
                    self.sent.inc_by(n as u64);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
                Err(e) => {
                    out.failed = Some(e.to_string());
                    out.backlog = Vec::new();
                    return false;
                }
            }
        }
        true
    }

    /// Why the stream takes nothing more: a failed write, or a peer that reads nothing.
    fn stuck(&self, url: &str) -> String {
        match &self.out.lock().failed {
            Some(e) => format!("stream to {url} closed: {e}"),
            None => format!("stream to {url}: over {BACKLOG_MAX} bytes the peer did not read"),
        }
    }

    /// The task: writes the backlog out, waiting for the socket as needed, within [`DEAD`].
    async fn drain(&self, url: &str) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + DEAD;
        loop {
            {
                let mut out = self.out.lock();
                if let Some(e) = &out.failed {
                    return Err(format!("stream to {url} closed: {e}"));
                }
                if self.write_some(&mut out) {
                    return Ok(());
                }
                if let Some(e) = &out.failed {
                    return Err(format!("stream to {url} closed: {e}"));
                }
            }
            match tokio::time::timeout_at(deadline, self.sock.writable()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(format!("stream to {url} closed: {e}")),
                Err(_) => return Err(format!("stream to {url}: a write took over {DEAD:?}")),
            }
        }
    }
}

/// Publishes a direct stream in its peer's slot for as long as it lives.
pub(super) struct Published<'a> {
    slot: &'a Slot,
    direct: Arc<Direct>,
}

impl<'a> Published<'a> {
    pub(super) fn new(slot: &'a Slot, direct: Arc<Direct>) -> Self {
        *slot.lock() = Some(direct.clone());
        Published { slot, direct }
    }
}

impl Drop for Published<'_> {
    fn drop(&mut self) {
        let mut slot = self.slot.lock();
        if slot.as_ref().is_some_and(|d| Arc::ptr_eq(d, &self.direct)) {
            *slot = None;
        }
    }
}

/// The link's task while its stream is direct: sends what still comes through `rx` (queued
/// before the stream was published), writes the backlog the senders leave, reads the
/// receiver's records, keeps the link alive. `Ok`: the node dropped the link.
pub(super) async fn pump(
    d: &Direct,
    url: &str,
    rx: &mut mpsc::Receiver<Message>,
) -> Result<(), String> {
    let mut records = Vec::new();
    let mut last_read = Instant::now();
    let mut tick = Ticker::new(KEEPALIVE);
    loop {
        tokio::select! {
            _ = d.wake.notified() => d.drain(url).await?,
            m = rx.recv() => {
                let Some(m) = m else { return Ok(()) };
                let mut msgs = vec![m];
                while let Ok(m) = rx.try_recv() {
                    msgs.push(m);
                }
                if !d.send(&msgs) {
                    return Err(d.stuck(url));
                }
            }
            r = d.sock.readable() => {
                r.map_err(|e| format!("{url}: {e}"))?;
                let mut b = [0u8; 1024];
                match d.sock.try_read(&mut b) {
                    Ok(0) => return Err(format!("{url} ended the stream")),
                    Ok(n) => {
                        last_read = Instant::now();
                        records.extend_from_slice(&b[..n]);
                        read_records(&mut records, url)?;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => return Err(format!("{url}: {e}")),
                }
            }
            _ = tick.tick() => {
                if last_read.elapsed() >= DEAD {
                    return Err(format!("{url}: nothing heard for {DEAD:?}"));
                }
                let wrote = std::mem::take(&mut d.out.lock().wrote);
                if !wrote && !d.put(|b| b.push(KEEPALIVE_RECORD)) {
                    return Err(d.stuck(url));
                }
            }
        }
    }
}
