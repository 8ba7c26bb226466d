//! Editing a tree inside a write transaction.
//!
//! A page is copied into the arena the first time the transaction changes it ("touch"); its page
//! goes on the freed list, and the path from the root to it is touched too, so that parents point
//! at arena nodes. Nodes split as soon as they outgrow a page and merge with a sibling as soon as
//! they fall under a quarter page, so every arena node fits one page and commit only has to
//! allocate and serialize ("spill") them bottom-up.

use super::node::{NewVal, Node, NodeRef, Val};
use super::{Snap, Tree, MAX_DEPTH};
use crate::error::Result;
use crate::freelist::Run;
use crate::page::{self, PageId, RawVal, HEADER};

#[derive(Debug)]
pub(crate) struct Editor {
    pub arena: Vec<Node>,
    /// Runs of the committed state that this transaction stopped using.
    pub freed: Vec<Run>,
    page_size: usize,
    /// Bytes the left part of a split keeps (the fill percent of a page).
    split_at: usize,
}

/// A page (or overflow run) written by a commit.
pub(crate) struct Write {
    pub id: PageId,
    pub buf: Vec<u8>,
}

impl Editor {
    pub fn new(page_size: usize, fill_percent: f64) -> Editor {
        let fill = fill_percent.clamp(0.1, 1.0);
        Editor {
            arena: Vec::new(),
            freed: Vec::new(),
            page_size,
            split_at: ((page_size as f64 * fill) as usize).max(HEADER + 1),
        }
    }

    pub fn is_dirty(&self) -> bool {
        !self.arena.is_empty() || !self.freed.is_empty()
    }

    /// Allocates a new, empty leaf for a new tree.
    pub fn new_leaf(&mut self) -> NodeRef {
        self.arena.push(Node::empty_leaf());
        NodeRef::Mem(self.arena.len() - 1)
    }

    /// The arena node for `r`, copying it from its page first if needed.
    fn touch(&mut self, snap: &Snap, r: NodeRef) -> Result<usize> {
        match r {
            NodeRef::Mem(i) => Ok(i),
            NodeRef::Page(id) => {
                let p = snap.node(id)?;
                let n = Node::from_page(&p).map_err(|b| snap.corrupt(b))?;
                self.freed.push((id, 1));
                self.arena.push(n);
                Ok(self.arena.len() - 1)
            }
        }
    }

    /// Touches the path to the leaf that holds (or would hold) `key`: returns the leaf and, for
    /// each branch above it, (branch, index of the child taken).
    fn touch_path(
        &mut self,
        snap: &Snap,
        root: &mut NodeRef,
        key: &[u8],
    ) -> Result<(usize, Vec<(usize, usize)>)> {
        let mut path = Vec::with_capacity(8);
        let mut idx = self.touch(snap, *root)?;
        *root = NodeRef::Mem(idx);
        while !self.arena[idx].leaf {
            if path.len() >= MAX_DEPTH {
                return Err(Tree {
                    snap,
                    arena: &self.arena,
                    root: *root,
                }
                .too_deep());
            }
            let n = &mut self.arena[idx];
            let pos = page::child_index(n.search(key));
            if pos == 0 && key < n.key(0) {
                // Keep a branch's first key at or below its subtree's smallest key, so that the
                // separators a split of the first child adds stay above it.
                n.set_key(0, key);
            }
            let child = self.touch(snap, self.arena[idx].kids[pos])?;
            self.arena[idx].kids[pos] = NodeRef::Mem(child);
            path.push((idx, pos));
            idx = child;
        }
        Ok((idx, path))
    }

    fn free_val(&mut self, v: &Val) {
        if let Val::Overflow { page, len } = v {
            self.freed
                .push((*page, page::run_pages(*len, self.page_size)));
        }
    }

    /// Inserts or replaces `key`.
    pub fn put(
        &mut self,
        snap: &Snap,
        root: &mut NodeRef,
        key: &[u8],
        val: NewVal<'_>,
    ) -> Result<()> {
        let (leaf, path) = self.touch_path(snap, root, key)?;
        let n = &mut self.arena[leaf];
        match n.search(key) {
            (i, true) => {
                let old = n.set_val(i, val);
                self.free_val(&old);
            }
            (i, false) => n.insert(i, key, val),
        }
        self.split_up(root, path, leaf);
        Ok(())
    }

    /// Removes `key`; false if it was not there (and then nothing is touched).
    pub fn delete(&mut self, snap: &Snap, root: &mut NodeRef, key: &[u8]) -> Result<bool> {
        let present = Tree {
            snap,
            arena: &self.arena,
            root: *root,
        }
        .find(key)?
        .2;
        if !present {
            return Ok(false);
        }
        let (leaf, path) = self.touch_path(snap, root, key)?;
        let n = &mut self.arena[leaf];
        let (i, found) = n.search(key);
        debug_assert!(found, "key found by the read-only search");
        let old = n.remove(i).expect("a leaf entry has a value");
        self.free_val(&old);
        self.rebalance(snap, root, path, leaf)?;
        Ok(true)
    }

    /// Splits `idx` into pieces that each fit a page; returns the new right-hand pieces.
    fn split(&mut self, idx: usize) -> Vec<usize> {
        let mut pieces = Vec::new();
        let mut cur = idx;
        while self.arena[cur].size > self.page_size {
            let n = &self.arena[cur];
            // The left part keeps entries `..at` while they fit the fill (at least one, so it
            // stays within a page: an entry is at most a quarter page), the right at least one.
            let mut size = HEADER + n.entry_size(0);
            let mut at = 1;
            while at < n.len() - 1 && size + n.entry_size(at) <= self.split_at {
                size += n.entry_size(at);
                at += 1;
            }
            let right = self.arena[cur].split_off(at);
            self.arena.push(right);
            cur = self.arena.len() - 1;
            pieces.push(cur);
        }
        pieces
    }

    /// Puts split pieces into `parent` right after child `pos`.
    fn adopt(&mut self, parent: usize, pos: usize, pieces: &[usize]) {
        for (k, &p) in pieces.iter().enumerate() {
            let key = self.arena[p].key(0).to_vec();
            self.arena[parent].insert_kid(pos + 1 + k, &key, NodeRef::Mem(p));
        }
    }

    /// Splits `idx` and its ancestors on `path` where they overflow a page (an ancestor can
    /// overflow on its own when its first key grew); grows a new root if the root splits.
    fn split_up(&mut self, root: &mut NodeRef, mut path: Vec<(usize, usize)>, mut idx: usize) {
        loop {
            let pieces = self.split(idx);
            match path.pop() {
                Some((parent, pos)) => {
                    self.adopt(parent, pos, &pieces);
                    idx = parent;
                }
                None if pieces.is_empty() => return,
                None => {
                    let kids: Vec<NodeRef> = std::iter::once(idx)
                        .chain(pieces)
                        .map(NodeRef::Mem)
                        .collect();
                    let keys: Vec<Vec<u8>> = kids
                        .iter()
                        .map(|k| match k {
                            NodeRef::Mem(i) => self.arena[*i].key(0).to_vec(),
                            NodeRef::Page(_) => unreachable!("split pieces are in the arena"),
                        })
                        .collect();
                    let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
                    self.arena.push(Node::branch(&keys, &kids));
                    idx = self.arena.len() - 1;
                    *root = NodeRef::Mem(idx);
                }
            }
        }
    }

    /// After a delete: merges underfull nodes with a sibling, bottom-up, and drops a root branch
    /// left with one child.
    fn rebalance(
        &mut self,
        snap: &Snap,
        root: &mut NodeRef,
        mut path: Vec<(usize, usize)>,
        mut idx: usize,
    ) -> Result<()> {
        let min = self.page_size / 4;
        while let Some((parent, pos)) = path.pop() {
            let n = &self.arena[idx];
            let underfull = n.size < min || n.len() < if n.leaf { 1 } else { 2 };
            if !underfull || self.arena[parent].kids.len() < 2 {
                idx = parent;
                continue;
            }
            let left_pos = pos.saturating_sub(1);
            let l = self.touch(snap, self.arena[parent].kids[left_pos])?;
            let r = self.touch(snap, self.arena[parent].kids[left_pos + 1])?;
            let mut right = std::mem::replace(&mut self.arena[r], Node::empty_leaf());
            if !right.leaf && right.len() > 0 {
                // The parent's separator bounds the right node's first subtree from below.
                let sep = self.arena[parent].key(left_pos + 1).to_vec();
                right.set_key(0, &sep);
            }
            self.arena[l].append(right);
            let p = &mut self.arena[parent];
            p.kids[left_pos] = NodeRef::Mem(l);
            p.remove(left_pos + 1);
            // A merge of two nearly full nodes overflows: split it again (redistribution).
            let pieces = self.split(l);
            self.adopt(parent, left_pos, &pieces);
            if self.arena[parent].size > self.page_size {
                self.split_up(root, path, parent);
                return Ok(());
            }
            idx = parent;
        }
        // `idx` is the root now.
        while let NodeRef::Mem(i) = *root {
            let n = &self.arena[i];
            if n.leaf || n.kids.len() != 1 {
                break;
            }
            *root = n.kids[0];
        }
        Ok(())
    }

    /// Frees every page of the tree under `r` (for a deleted bucket), reading pages in place.
    pub fn free_tree(&mut self, snap: &Snap, r: NodeRef, depth: usize) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(Tree {
                snap,
                arena: &self.arena,
                root: r,
            }
            .too_deep());
        }
        match r {
            NodeRef::Mem(i) => {
                let n = std::mem::replace(&mut self.arena[i], Node::empty_leaf());
                for v in &n.vals {
                    self.free_val(v);
                }
                for &k in &n.kids {
                    self.free_tree(snap, k, depth + 1)?;
                }
            }
            NodeRef::Page(id) => {
                let p = snap.node(id)?;
                self.freed.push((id, 1));
                for i in 0..p.count {
                    if !p.leaf {
                        self.free_tree(snap, NodeRef::Page(p.child(i)), depth + 1)?;
                    } else if let RawVal::Overflow { page, len } =
                        p.value(i).map_err(|b| snap.corrupt(b))?
                    {
                        self.freed
                            .push((page, page::run_pages(len, self.page_size)));
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes the arena nodes under `r` to newly allocated pages, children first; returns the
    /// page of `r`. `alloc(n)` hands out a run of n pages.
    pub fn spill(
        &mut self,
        r: NodeRef,
        alloc: &mut dyn FnMut(u64) -> PageId,
        out: &mut Vec<Write>,
    ) -> PageId {
        let idx = match r {
            NodeRef::Page(id) => return id,
            NodeRef::Mem(i) => i,
        };
        let mut n = std::mem::replace(&mut self.arena[idx], Node::empty_leaf());
        for k in n.kids.iter_mut() {
            *k = NodeRef::Page(self.spill(*k, alloc, out));
        }
        for v in n.vals.iter_mut() {
            if let Val::Big(bytes) = v {
                let pages = page::run_pages(bytes.len(), self.page_size);
                let id = alloc(pages);
                let mut buf = vec![0u8; pages as usize * self.page_size];
                page::write_overflow(&mut buf, id, pages, bytes);
                out.push(Write { id, buf });
                *v = Val::Overflow {
                    page: id,
                    len: bytes.len(),
                };
            }
        }
        let id = alloc(1);
        let mut buf = vec![0u8; self.page_size];
        n.write(&mut buf, id);
        out.push(Write { id, buf });
        id
    }
}
