//! Cursors: ordered traversal of one tree, forwards and backwards.

use std::ops::Bound;

use super::node::NodeView;
use super::{Tree, MAX_DEPTH};
use crate::error::Result;
use crate::page;

/// A position in a bucket. Keys and values borrow from the transaction (zero copy for read
/// transactions: they point into the memory map).
///
/// Every move returns the entry it lands on, or `None` past either end.
pub struct Cursor<'a> {
    tree: Tree<'a>,
    /// Nodes from the root to the current leaf, each with the index taken in it.
    stack: Vec<(NodeView<'a>, usize)>,
}

impl std::fmt::Debug for Cursor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cursor")
            .field("depth", &self.stack.len())
            .finish()
    }
}

/// A key and its value.
pub type Entry<'a> = (&'a [u8], &'a [u8]);

impl<'a> Cursor<'a> {
    pub(crate) fn new(tree: Tree<'a>) -> Self {
        Cursor {
            tree,
            stack: Vec::with_capacity(8),
        }
    }

    fn push(&mut self, n: NodeView<'a>, i: usize) -> Result<()> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(self.tree.too_deep());
        }
        self.stack.push((n, i));
        Ok(())
    }

    /// Descends from the top of the stack to a leaf along the first (or last) children.
    fn descend(&mut self, last: bool) -> Result<()> {
        while let Some(&(n, i)) = self.stack.last() {
            if n.leaf() {
                break;
            }
            let c = self.tree.node(n.child(i))?;
            let at = if last { c.len().saturating_sub(1) } else { 0 };
            self.push(c, at)?;
        }
        Ok(())
    }

    /// The entry under the cursor, moving on past an empty leaf in `forward`'s direction.
    fn settle(&mut self, forward: bool) -> Result<Option<Entry<'a>>> {
        loop {
            let Some(&(n, i)) = self.stack.last() else {
                return Ok(None);
            };
            if i < n.len() {
                return self.current().map(Some);
            }
            // Past this leaf's end (or an empty leaf): climb to the next sibling subtree.
            if !self.climb(forward)? {
                return Ok(None);
            }
        }
    }

    /// Moves to the neighbouring leaf; false (and an empty stack) past the tree's end.
    fn climb(&mut self, forward: bool) -> Result<bool> {
        self.stack.pop();
        while let Some((n, i)) = self.stack.pop() {
            let next = if forward { i + 1 < n.len() } else { i > 0 };
            if next {
                let j = if forward { i + 1 } else { i - 1 };
                self.stack.push((n, j));
                let c = self.tree.node(n.child(j))?;
                let at = if forward {
                    0
                } else {
                    c.len().saturating_sub(1)
                };
                self.push(c, at)?;
                self.descend(!forward)?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn current(&self) -> Result<Entry<'a>> {
        let &(n, i) = self
            .stack
            .last()
            .expect("current is called on a positioned cursor");
        let corrupt = |b| self.tree.snap.corrupt(b);
        let k = n.key(i).map_err(corrupt)?;
        let v = self.tree.resolve(n.value(i).map_err(corrupt)?)?;
        Ok((k, v))
    }

    /// The first entry.
    pub fn first(&mut self) -> Result<Option<Entry<'a>>> {
        self.stack.clear();
        let root = self.tree.node(self.tree.root)?;
        self.push(root, 0)?;
        self.descend(false)?;
        self.settle(true)
    }

    /// The last entry.
    pub fn last(&mut self) -> Result<Option<Entry<'a>>> {
        self.stack.clear();
        let root = self.tree.node(self.tree.root)?;
        self.push(root, root.len().saturating_sub(1))?;
        self.descend(true)?;
        if let Some(&(n, _)) = self.stack.last() {
            if n.len() == 0 {
                return self.prev_from_empty();
            }
        }
        self.settle(false)
    }

    fn prev_from_empty(&mut self) -> Result<Option<Entry<'a>>> {
        if self.climb(false)? {
            self.settle(false)
        } else {
            Ok(None)
        }
    }

    /// The first entry with key ≥ `key`.
    pub fn seek(&mut self, key: &[u8]) -> Result<Option<Entry<'a>>> {
        self.stack.clear();
        let mut n = self.tree.node(self.tree.root)?;
        loop {
            let found = n.search(key).map_err(|b| self.tree.snap.corrupt(b))?;
            if n.leaf() {
                self.push(n, found.0)?;
                return self.settle(true);
            }
            let i = page::child_index(found);
            self.push(n, i)?;
            n = self.tree.node(n.child(i))?;
        }
    }

    /// The entry after the current one.
    // Not `Iterator::next`: a cursor also moves backwards and seeks; `Range` is the iterator.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Entry<'a>>> {
        match self.stack.last_mut() {
            None => Ok(None),
            Some((_, i)) => {
                *i += 1;
                self.settle(true)
            }
        }
    }

    /// The entry before the current one.
    pub fn prev(&mut self) -> Result<Option<Entry<'a>>> {
        match self.stack.last_mut() {
            None => Ok(None),
            Some((_, 0)) => self.prev_from_empty(),
            Some((_, i)) => {
                *i -= 1;
                self.settle(false)
            }
        }
    }
}

/// The entries of a key range in order; see [`crate::Bucket::range`].
pub struct Range<'a> {
    cursor: Cursor<'a>,
    start: Option<Bound<Vec<u8>>>,
    end: Bound<Vec<u8>>,
    done: bool,
}

impl std::fmt::Debug for Range<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Range")
            .field("end", &self.end)
            .field("done", &self.done)
            .finish()
    }
}

impl<'a> Range<'a> {
    pub(crate) fn new(tree: Tree<'a>, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Self {
        Range {
            cursor: Cursor::new(tree),
            start: Some(start.map(<[u8]>::to_vec)),
            end: end.map(<[u8]>::to_vec),
            done: false,
        }
    }

    fn step(&mut self) -> Result<Option<Entry<'a>>> {
        let e = match self.start.take() {
            Some(Bound::Unbounded) => self.cursor.first()?,
            Some(Bound::Included(k)) => self.cursor.seek(&k)?,
            Some(Bound::Excluded(k)) => match self.cursor.seek(&k)? {
                Some((found, _)) if found == k.as_slice() => self.cursor.next()?,
                e => e,
            },
            None => self.cursor.next()?,
        };
        Ok(e.filter(|(k, _)| match &self.end {
            Bound::Unbounded => true,
            Bound::Included(e) => *k <= e.as_slice(),
            Bound::Excluded(e) => *k < e.as_slice(),
        }))
    }
}

impl<'a> Iterator for Range<'a> {
    type Item = Result<Entry<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let r = self.step().transpose();
        if !matches!(r, Some(Ok(_))) {
            self.done = true;
        }
        r
    }
}
