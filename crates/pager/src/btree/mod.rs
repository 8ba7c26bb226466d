//! The copy-on-write B+tree: reading (`Tree`, `Cursor`) and editing (`edit`).

pub(crate) mod cursor;
pub(crate) mod diff;
pub(crate) mod edit;
pub(crate) mod node;
mod tree;

pub(crate) use tree::{Snap, Tree, MAX_DEPTH};
