//! Watch: etcd's watchable store, without its stalls.
//!
//! A watcher is *synced* when it has every event up to the store's revision; each write
//! transaction then hands it the matching events of its revision (one push onto its stream's
//! queue: a shared, reference-counted batch, no copy). A watcher that starts in the past, or
//! whose stream's queue is full when a write comes, is *unsynced* and catches up on the watch
//! thread: from a ring of recent event batches when it is only a little behind, otherwise from
//! the store's history, read from a snapshot with no lock held, so writers never wait for it
//! (etcd reads that history under the store lock writers need). A slow consumer therefore costs
//! writers one failed push and a set move, never a wait, and other watchers nothing.
//!
//! Every revision passes through [`Hub::notify`] in order, under the hub lock, so a watcher
//! moves between the two sets at a revision boundary: it never misses or repeats an event.
//!
//! Its parts: `event` (what watchers are sent), `events` (a response's events, shared), `hub`
//! (the watchers and their two sets), `group` (the synced set, by key range), `sync` (the watch
//! thread), `stream` (a watch stream and its queue).

mod event;
mod events;
mod group;
mod hub;
mod stream;
mod sync;

pub use events::WatchEvents;
pub(crate) use hub::Hub;
pub use hub::WatchCounts;
pub use stream::{WatchResponse, WatchStream};
pub(crate) use sync::sync_loop;
