//! Free-page tracking. A [`FreeSet`] holds pages that can be handed out now; [`Freelist`] adds the
//! pages each commit freed, which stay *pending* until no reader can still see them and a sync has
//! made a newer meta durable.
//!
//! Two free sets, chosen at open by [`FreelistKind`]:
//! - [`Array`]: bbolt's original — sorted ids; allocation scans for a run, release merge-sorts.
//! - [`Hashmap`]: runs segregated by length, with start→run and end→run maps so a freed run merges
//!   with both neighbours in O(1); allocation takes an exact-size run or splits the next larger.
//!
//! Both persist as the same sorted list of ids (see [`encode`]), so a file written with one opens
//! with the other.
//!
//! Its parts: `set` (the interface and the choice), `array` and `hashmap` (the two sets),
//! `pending` (a database's [`Freelist`]), `encoding` (the stored list).

mod array;
mod encoding;
mod hashmap;
mod pending;
mod set;
#[cfg(test)]
mod tests;

pub use array::Array;
pub(crate) use encoding::{decode, encode, encoded_pages};
pub use hashmap::Hashmap;
pub(crate) use pending::Freelist;
pub use set::{new_set, runs_of, FreeSet, FreelistKind, Run};
