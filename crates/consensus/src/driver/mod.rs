//! The Ready loop: raft-rs's `RawNode`, the WAL and the transport, behind one lock. The raft
//! thread takes turns of it (commands, ticks, one Ready each); a sole voter's proposal may take
//! a turn on the proposing thread itself ([`Driver::take_queued`]), sparing two thread wake-ups.
//!
//! Its parts: `open` (the driver's state, and opening it), `turn` (the loop's turns: commands,
//! ticks, Readies), `reads` (ReadIndex rounds and answers waiting on the apply thread),
//! `membership`, `snapshots`, `meta` (the member's identity in its WAL, a new member's log).

mod membership;
mod meta;
mod open;
mod reads;
mod snapshots;
mod turn;

pub use meta::{existing_member, write_imported_log, ImportedEntry, ImportedLog, ImportedOp};
pub(crate) use open::Driver;
