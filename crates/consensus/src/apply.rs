//! The apply thread: feeds committed entries to the state machine in order, answers the
//! proposals made on this member, restores snapshots from the leader, and asks for durability
//! every `snapshot_count` entries. While it idles, the raft thread applies a small batch itself
//! ([`ApplyQueue::entries`]): a lone client's write then costs one thread wake-up less.

use std::fs::{self, File};
use std::io::BufReader;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

use raft::eraftpb::{Entry, EntryType};

use crate::node::{
    parse_context, Cmd, Committed, Error, Result, Shared, StateMachine, TAG_PROPOSAL,
};
use crate::snap::Snapshotter;
use ids::RaftIndex;

/// Restores the state machine from the snapshot data received for (`index`, `term`), then
/// deletes that data (kept until now so a crash during the restore can redo it at restart).
pub(crate) fn restore_received<S: StateMachine>(
    sm: &mut S,
    snapshotter: &Snapshotter,
    index: u64,
    term: u64,
) -> Result<()> {
    let path = snapshotter.recv_path(index);
    let file = File::open(&path).map_err(|e| {
        Error::StateMachine(std::io::Error::other(format!(
            "snapshot data {}: {e}",
            path.display()
        )))
    })?;
    sm.restore(RaftIndex(index), term, &mut BufReader::new(file))
        .map_err(Error::StateMachine)?;
    fail::fail_point!("raft_snapshot_apply");
    if let Err(e) = fs::remove_file(&path) {
        tracing::warn!("cannot remove {}: {e}", path.display());
    }
    Ok(())
}

/// Work for the apply thread, in log order.
#[derive(Debug)]
pub(crate) enum ApplyTask {
    Entries(Vec<Entry>),
    /// Restore the state machine from the received data of the snapshot at this index/term.
    Restore {
        index: u64,
        term: u64,
    },
    /// Spool the state machine's current state for followers.
    Spool,
    Stop,
}

pub(crate) struct Applier<S: StateMachine> {
    sm: S,
    shared: Arc<Shared<S::Output>>,
    snapshot_count: u64,
    /// The last index the state machine made durable.
    durable: u64,
}

/// The most entries, and bytes, the raft thread applies itself.
const INLINE_ENTRIES: usize = 16;
const INLINE_BYTES: usize = 64 << 10;

/// The raft thread's way to the state machine: the apply thread's queue, or the state machine
/// itself while that thread has nothing to do.
pub(crate) struct ApplyQueue {
    tx: Sender<ApplyTask>,
    /// Tasks sent and not finished. Only the raft thread adds, and the apply thread subtracts
    /// after letting go of the state machine: 0 means it idles and will until the next send.
    pending: Arc<AtomicUsize>,
    /// Applies a batch on the calling thread, unless the state machine is busy or the batch
    /// would make it sync (slow: left to the apply thread).
    inline: Box<Inline>,
}

type Inline = dyn FnMut(&[Entry]) -> Option<Result<()>> + Send;

impl std::fmt::Debug for ApplyQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApplyQueue")
            .field("pending", &self.pending)
            .finish()
    }
}

impl ApplyQueue {
    pub(crate) fn send(&self, task: ApplyTask) -> Result<()> {
        self.pending.fetch_add(1, Ordering::SeqCst);
        self.tx.send(task).map_err(|_| {
            self.pending.fetch_sub(1, Ordering::SeqCst);
            Error::Stopped
        })
    }

    /// Committed entries, in log order after everything sent before.
    pub(crate) fn entries(&mut self, entries: Vec<Entry>) -> Result<()> {
        let small = entries.len() <= INLINE_ENTRIES
            && entries.iter().map(|e| e.data.len()).sum::<usize>() <= INLINE_BYTES;
        if small && self.pending.load(Ordering::SeqCst) == 0 {
            if let Some(r) = (self.inline)(&entries) {
                return r;
            }
        }
        self.send(ApplyTask::Entries(entries))
    }
}

impl<S: StateMachine> Applier<S> {
    /// Starts the apply thread over `sm`; returns it and the queue to it.
    pub(crate) fn spawn(
        sm: S,
        shared: Arc<Shared<S::Output>>,
        snapshot_count: u64,
        durable: u64,
    ) -> std::io::Result<(JoinHandle<()>, ApplyQueue)> {
        let name = format!("apply-{}", shared.id);
        let id = shared.id;
        let a = Arc::new(Mutex::new(Applier {
            sm,
            shared,
            snapshot_count: snapshot_count.max(1),
            durable,
        }));
        let pending = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::channel();
        let (a2, pending2) = (a.clone(), pending.clone());
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            while let Ok(task) = rx.recv() {
                let mut a = a2.lock();
                let r = match task {
                    ApplyTask::Entries(es) => a.apply(&es),
                    ApplyTask::Restore { index, term } => a.restore(index, term),
                    ApplyTask::Spool => a.spool(),
                    ApplyTask::Stop => break,
                };
                if let Err(e) = r {
                    tracing::error!(member = %id, "apply failed: {e}");
                    let _ = a.shared.tx.send(Cmd::Fatal(e));
                    break;
                }
                drop(a);
                pending2.fetch_sub(1, Ordering::SeqCst);
            }
        })?;
        let inline = Box::new(move |es: &[Entry]| {
            let mut a = a.try_lock()?;
            let syncs = es
                .last()
                .is_some_and(|e| e.index >= a.durable + a.snapshot_count);
            if syncs {
                return None;
            }
            Some(a.apply(es).inspect_err(|e| {
                tracing::error!(member = %id, "apply failed: {e}");
            }))
        });
        Ok((
            thread,
            ApplyQueue {
                tx,
                pending,
                inline,
            },
        ))
    }

    fn apply(&mut self, entries: &[Entry]) -> Result<()> {
        let Some(last) = entries.last().map(|e| e.index) else {
            return Ok(());
        };
        let applied = self.sm.applied().0;
        let mut batch = Vec::with_capacity(entries.len());
        let mut origins = Vec::with_capacity(entries.len());
        for e in entries.iter().filter(|e| e.index > applied) {
            let mut origin = None;
            let mut data = None;
            if e.get_entry_type() == EntryType::EntryNormal && !e.context.is_empty() {
                match parse_context(&e.context) {
                    Ok((TAG_PROPOSAL, from, seq, _)) => {
                        origin = Some((from, seq));
                        data = Some(&e.data[..]);
                    }
                    Ok(_) => {}
                    Err(err) => {
                        tracing::warn!(index = e.index, "entry with {err}: applied as empty")
                    }
                }
            }
            batch.push(Committed {
                index: RaftIndex(e.index),
                term: e.term,
                data,
                local: None,
            });
            origins.push(origin);
        }
        // What this member's waiting proposers handed along, for the state machine to take.
        let me = self.shared.id.0;
        if origins.iter().flatten().any(|o| o.0 == me) {
            let mut waiters = self.shared.waiters.lock();
            for (c, origin) in batch.iter_mut().zip(&origins) {
                if let Some((_, seq)) = origin.filter(|o| o.0 == me) {
                    c.local = waiters.get_mut(&seq).and_then(|w| w.local.take());
                }
            }
        }
        let outs = if batch.is_empty() {
            Vec::new()
        } else {
            fail::fail_point!("raft_before_apply");
            let outs = self.sm.apply(&mut batch).map_err(Error::StateMachine)?;
            fail::fail_point!("raft_after_apply");
            if outs.len() != batch.len() {
                return Err(Error::StateMachine(std::io::Error::other(format!(
                    "the state machine returned {} outputs for {} entries",
                    outs.len(),
                    batch.len()
                ))));
            }
            outs
        };
        // Published before anyone hears of it: a read point taken after an acknowledgement
        // covers it.
        self.shared.publish_applied(last, false);
        if !outs.is_empty() {
            let mut waiters = self.shared.waiters.lock();
            for (origin, out) in origins.into_iter().zip(outs) {
                if let Some((_, seq)) = origin.filter(|o| o.0 == me) {
                    if let Some(w) = waiters.remove(&seq) {
                        let _ = w.answer.send(Ok(out));
                    }
                }
            }
        }
        let applied = self.sm.applied().0;
        if applied >= self.durable + self.snapshot_count {
            self.sm.sync().map_err(Error::StateMachine)?;
            self.durable = applied;
            let _ = self.shared.tx.send(Cmd::Durable(applied));
        }
        Ok(())
    }

    fn restore(&mut self, index: u64, term: u64) -> Result<()> {
        restore_received(&mut self.sm, &self.shared.snapshotter, index, term)?;
        self.durable = index;
        tracing::info!(
            index,
            term,
            "restored the state machine from the leader's snapshot"
        );
        // A restore is rare and moves the applied index far: the raft thread hears of it at once.
        self.shared.publish_applied(index, true);
        Ok(())
    }

    /// Starts copying the current state to a spool file on its own thread (it may be large).
    fn spool(&mut self) -> Result<()> {
        let index = self.sm.applied().0;
        let mut reader = self.sm.snapshot().map_err(Error::StateMachine)?;
        let path = self.shared.snapshotter.spool_path(index);
        let tx = self.shared.tx.clone();
        let spawned = std::thread::Builder::new()
            .name("snapshot-spool".into())
            .spawn(
                move || match crate::snap::write_atomic(&path, &mut reader) {
                    Ok(bytes) => {
                        tracing::info!(index, bytes, "spooled a snapshot for followers");
                        let _ = tx.send(Cmd::Spooled(Some(index)));
                    }
                    Err(e) => {
                        tracing::error!("cannot spool a snapshot: {e}");
                        let _ = tx.send(Cmd::Spooled(None));
                    }
                },
            );
        if let Err(e) = spawned {
            tracing::error!("cannot start the spool thread: {e}");
            let _ = self.shared.tx.send(Cmd::Spooled(None));
        }
        Ok(())
    }
}
