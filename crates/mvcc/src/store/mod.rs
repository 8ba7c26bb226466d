//! The store: the index, the pager file, the write path and consistent read views.
//!
//! Writes never wait on the disk. Each write transaction gets its revision, updates the index
//! and appends its entries (revision key → encoded `KeyValue`) to the *pending* batch, which
//! readers see at once. A flush moves the pending batch into the pager in one commit, together
//! with the applied consensus index it covers. The flush thread runs it when the batch is full
//! and on an interval; [`Store::flush`] and close run it too. Flushes hold their own lock, not
//! the writers', so an fsync never stalls a write — etcd's batched backend without its pause.
//! Only when the disk falls several batches behind do writers flush themselves (backpressure).
//!
//! A reader takes (current revision, pending batches, pager snapshot) under one lock; a pending
//! batch leaves that list only after the commit holding it is published, so every revision a
//! reader may need is in one of the two.
//!
//! Its parts: `open` holds the store's shared state and opens, closes and defragments it;
//! `layout` names its buckets and meta keys; `recovery` rebuilds the index and leases from
//! the file; `pending` holds writes not yet flushed; `flush` moves them into the pager;
//! `compaction` removes history in bounded steps; `read` gives views and range reads;
//! `write` is the writer.

mod compaction;
mod flush;
mod layout;
mod open;
mod pending;
mod read;
mod recovery;
mod write;

pub use flush::init_metrics;
pub(crate) use layout::{compact_rev_value, ALARM_BUCKET, CLUSTER_BUCKET, KEY_BUCKET, META_BUCKET};
pub(crate) use open::{open_filled_db, Inner};
pub use open::{Applied, Defragmented, Store, StoreOptions};
pub(crate) use read::Reader;
pub use read::{RangeOptions, RangeResult, Snapshot};
pub(crate) use recovery::Indexed;
pub use write::Writer;
