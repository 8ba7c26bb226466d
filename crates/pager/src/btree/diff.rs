//! The difference between two committed states of one tree, found without reading what they
//! share.
//!
//! Copy-on-write never changes a page that a live snapshot reaches: an edit writes new pages
//! for the changed node and each of its ancestors, and the freed pages wait for the last
//! reader that could see them. So while both snapshots are held, a page id reached from both
//! names the same bytes, and a subtree rooted there holds the same entries. The diff walks the
//! two trees side by side in key order and steps over every subtree the two share; only the
//! paths to what changed are read. Its cost follows the change, not the tree.

use std::cmp::Ordering;

use super::node::ValRef;
use super::{Snap, MAX_DEPTH};
use crate::error::{Error, Result};
use crate::page::{self, NodePage, PageId, RawVal};

/// One key whose presence or value differs.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Change<'o, 'n> {
    /// Present in the new state (added, or with another value): the new value.
    Put(&'n [u8], ValRef<'n>),
    /// Present in the old state only.
    Delete(&'o [u8]),
}

/// What the front of one side's walk is: a subtree not yet opened, an entry, or the end.
#[derive(Clone, Copy)]
enum Front<'a> {
    /// A subtree: its root page, its height (1: a leaf), and a lower bound of its keys (`None`:
    /// none known beyond the parent's, as for a branch's first child).
    Sub {
        id: PageId,
        height: usize,
        low: Option<&'a [u8]>,
    },
    Entry(&'a [u8], ValRef<'a>),
    End,
}

/// One side of the walk: the path of opened nodes, each with the index of its next element.
struct Side<'a> {
    snap: &'a Snap,
    /// (node, next index, the node's height, its lower bound).
    stack: Vec<(NodePage<'a>, usize, usize, Option<&'a [u8]>)>,
    /// The root, until it is opened or stepped over.
    root: Option<(PageId, usize)>,
    nodes_read: u64,
}

impl<'a> Side<'a> {
    fn new(snap: &'a Snap, root: PageId) -> Result<Side<'a>> {
        // The height: all leaves are at one depth, so the leftmost path measures it.
        let mut height = 1;
        let mut n = snap.node(root)?;
        while !n.leaf {
            if height >= MAX_DEPTH || n.count == 0 {
                return Err(bad(
                    snap,
                    root,
                    "a branch path deeper than a tree can be, or an empty branch",
                ));
            }
            n = snap.node(n.child(0))?;
            height += 1;
        }
        Ok(Side {
            snap,
            stack: Vec::with_capacity(height),
            root: Some((root, height)),
            nodes_read: height as u64,
        })
    }

    fn front(&mut self) -> Result<Front<'a>> {
        if let Some((id, height)) = self.root {
            return Ok(Front::Sub {
                id,
                height,
                low: None,
            });
        }
        let corrupt = |b| self.snap.corrupt(b);
        loop {
            let Some(&(n, i, height, low)) = self.stack.last() else {
                return Ok(Front::End);
            };
            if i >= n.count {
                self.stack.pop();
                self.step();
                continue;
            }
            return Ok(if n.leaf {
                let v = match n.value(i).map_err(corrupt)? {
                    RawVal::Inline(v) => ValRef::Bytes(v),
                    RawVal::Overflow { page, len } => ValRef::Overflow { page, len },
                };
                Front::Entry(n.key(i).map_err(corrupt)?, v)
            } else {
                let id = n.child(i);
                let low = if i == 0 {
                    low
                } else {
                    Some(n.key(i).map_err(corrupt)?)
                };
                Front::Sub {
                    id,
                    height: height - 1,
                    low,
                }
            });
        }
    }

    /// Steps past the front (an entry, or a subtree left unopened).
    fn step(&mut self) {
        if self.root.take().is_none() {
            if let Some(top) = self.stack.last_mut() {
                top.1 += 1;
            }
        }
    }

    /// Opens the subtree at the front.
    fn open(&mut self, id: PageId, height: usize, low: Option<&'a [u8]>) -> Result<()> {
        self.root = None;
        if self.stack.len() >= MAX_DEPTH {
            return Err(bad(
                self.snap,
                id,
                "a branch path deeper than a tree can be",
            ));
        }
        let n = self.snap.node(id)?;
        self.nodes_read += 1;
        if n.leaf != (height == 1) {
            return Err(bad(self.snap, id, "leaves at different depths"));
        }
        self.stack.push((n, 0, height, low));
        Ok(())
    }
}

fn bad(snap: &Snap, id: PageId, what: &str) -> Error {
    snap.corrupt(page::bad(id, what.to_string()))
}

/// Two values are the same if both are the same bytes, or the same overflow run (which cannot
/// have changed while a snapshot reaches it).
fn same(a: ValRef<'_>, b: ValRef<'_>) -> bool {
    match (a, b) {
        (ValRef::Bytes(x), ValRef::Bytes(y)) => x == y,
        (ValRef::Overflow { page: p, len: l }, ValRef::Overflow { page: q, len: m }) => {
            p == q && l == m
        }
        _ => false,
    }
}

/// Calls `f` for every key whose presence or value differs between `old` and `new`, in key
/// order, and returns the number of nodes read. The trees are given by their root pages in
/// two committed states of one file, read through snapshots held for the whole call.
pub(crate) fn diff<'o, 'n>(
    old: (&'o Snap, PageId),
    new: (&'n Snap, PageId),
    mut f: impl FnMut(Change<'o, 'n>) -> Result<()>,
) -> Result<u64> {
    let (mut a, mut b) = (Side::new(old.0, old.1)?, Side::new(new.0, new.1)?);
    loop {
        match (a.front()?, b.front()?) {
            (Front::End, Front::End) => break,
            (Front::Sub { id: x, .. }, Front::Sub { id: y, .. }) if x == y => {
                a.step();
                b.step();
            }
            (
                Front::Sub {
                    id: x,
                    height: hx,
                    low: lx,
                },
                Front::Sub {
                    id: y,
                    height: hy,
                    low: ly,
                },
            ) => {
                // Open the taller one, so that the two sides meet at one height where a
                // shared subtree shows as one page id.
                if hx >= hy {
                    a.open(x, hx, lx)?;
                }
                if hy >= hx {
                    b.open(y, hy, ly)?;
                }
            }
            // An entry below all of the other side's rest is on one side only.
            (Front::Sub { low: Some(l), .. }, Front::Entry(k, v)) if k < l => {
                f(Change::Put(k, v))?;
                b.step();
            }
            (Front::Entry(k, _), Front::Sub { low: Some(l), .. }) if k < l => {
                f(Change::Delete(k))?;
                a.step();
            }
            (Front::Sub { id, height, low }, _) => a.open(id, height, low)?,
            (_, Front::Sub { id, height, low }) => b.open(id, height, low)?,
            (Front::Entry(k, _), Front::End) => {
                f(Change::Delete(k))?;
                a.step();
            }
            (Front::End, Front::Entry(k, v)) => {
                f(Change::Put(k, v))?;
                b.step();
            }
            (Front::Entry(k, v), Front::Entry(l, w)) => match k.cmp(l) {
                Ordering::Less => {
                    f(Change::Delete(k))?;
                    a.step();
                }
                Ordering::Greater => {
                    f(Change::Put(l, w))?;
                    b.step();
                }
                Ordering::Equal => {
                    if !same(v, w) {
                        f(Change::Put(l, w))?;
                    }
                    a.step();
                    b.step();
                }
            },
        }
    }
    Ok(a.nodes_read + b.nodes_read)
}
