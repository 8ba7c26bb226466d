//! Nodes: a page as the writer edits it, and one view over pages and edited nodes.

use crate::page::{
    self, Bad, Kind, NodePage, PageId, RawVal, BRANCH_ELEM, HEADER, LEAF_ELEM, OVERFLOW_REF,
};

/// Where a child lives: in the file, or edited in this write transaction's arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NodeRef {
    Page(PageId),
    Mem(usize),
}

/// A leaf value held by an edited node.
#[derive(Clone, Debug)]
pub(crate) enum Val {
    /// Bytes in the node's buffer.
    Inline { off: u32, len: u32 },
    /// A value already in an overflow run in the file.
    Overflow { page: PageId, len: usize },
    /// A large value that needs a new overflow run at commit.
    Big(Vec<u8>),
}

impl Val {
    fn stored_len(&self) -> usize {
        match self {
            Val::Inline { len, .. } => *len as usize,
            Val::Overflow { .. } | Val::Big(_) => OVERFLOW_REF,
        }
    }

    fn inline_len(&self) -> usize {
        match self {
            Val::Inline { len, .. } => *len as usize,
            Val::Overflow { .. } | Val::Big(_) => 0,
        }
    }
}

/// A value to store.
pub(crate) enum NewVal<'a> {
    Inline(&'a [u8]),
    Big(Vec<u8>),
    /// A value already written in an overflow run (a build writes runs as values come).
    Stored {
        page: PageId,
        len: usize,
    },
}

impl NewVal<'_> {
    /// Bytes the value takes in its leaf.
    pub fn stored_len(&self) -> usize {
        match self {
            NewVal::Inline(b) => b.len(),
            NewVal::Big(_) | NewVal::Stored { .. } => OVERFLOW_REF,
        }
    }
}

/// Where an entry's key lies in the node's buffer, with its search prefix.
#[derive(Clone, Copy, Debug)]
struct Ent {
    prefix: u64,
    off: u32,
    len: u32,
}

fn at(data: &[u8], off: u32, len: u32) -> &[u8] {
    &data[off as usize..(off + len) as usize]
}

/// A branch or leaf being edited: entries point into one byte buffer (a copy of the page it came
/// from, plus whatever edits appended), so touching a page costs one copy, not one allocation per
/// key and value. `size` is its serialized size, kept current by every edit.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub leaf: bool,
    ents: Vec<Ent>,
    /// Leaf values, one per entry.
    pub vals: Vec<Val>,
    /// Branch children, one per entry.
    pub kids: Vec<NodeRef>,
    data: Vec<u8>,
    /// Bytes of `data` no entry points at any more.
    garbage: usize,
    pub size: usize,
}

impl Node {
    pub fn empty_leaf() -> Node {
        Node {
            leaf: true,
            ents: Vec::new(),
            vals: Vec::new(),
            kids: Vec::new(),
            data: Vec::new(),
            garbage: 0,
            size: HEADER,
        }
    }

    pub fn branch(keys: &[&[u8]], kids: &[NodeRef]) -> Node {
        let mut n = Node {
            leaf: false,
            ..Node::empty_leaf()
        };
        for (i, (k, kid)) in keys.iter().zip(kids).enumerate() {
            n.insert_kid(i, k, *kid);
        }
        n
    }

    pub fn len(&self) -> usize {
        self.ents.len()
    }

    pub fn key(&self, i: usize) -> &[u8] {
        let e = self.ents[i];
        at(&self.data, e.off, e.len)
    }

    pub fn value(&self, i: usize) -> ValRef<'_> {
        match &self.vals[i] {
            Val::Inline { off, len } => ValRef::Bytes(at(&self.data, *off, *len)),
            Val::Big(v) => ValRef::Bytes(v),
            Val::Overflow { page, len } => ValRef::Overflow {
                page: *page,
                len: *len,
            },
        }
    }

    pub fn entry_size(&self, i: usize) -> usize {
        let klen = self.ents[i].len as usize;
        if self.leaf {
            LEAF_ELEM + klen + self.vals[i].stored_len()
        } else {
            BRANCH_ELEM + klen
        }
    }

    fn push_bytes(&mut self, b: &[u8]) -> u32 {
        let off = self.data.len() as u32;
        self.data.extend_from_slice(b);
        off
    }

    fn ent(&mut self, key: &[u8]) -> Ent {
        Ent {
            prefix: page::prefix(key),
            off: self.push_bytes(key),
            len: key.len() as u32,
        }
    }

    fn new_val(&mut self, v: NewVal<'_>) -> Val {
        match v {
            NewVal::Inline(b) => Val::Inline {
                off: self.push_bytes(b),
                len: b.len() as u32,
            },
            NewVal::Big(b) => Val::Big(b),
            NewVal::Stored { page, len } => Val::Overflow { page, len },
        }
    }

    /// Accounts for bytes no longer referenced; compacts the buffer when they dominate it.
    fn drop_bytes(&mut self, n: usize) {
        self.garbage += n;
        if self.garbage > 2048 && self.garbage * 2 > self.data.len() {
            self.compact();
        }
    }

    /// Bytes of the buffer that entries point at.
    fn live_bytes(&self) -> usize {
        self.ents.iter().map(|e| e.len as usize).sum::<usize>()
            + self.vals.iter().map(Val::inline_len).sum::<usize>()
    }

    /// Rewrites the buffer with only the bytes entries point at.
    fn compact(&mut self) {
        let mut data = Vec::with_capacity(self.live_bytes());
        for e in self.ents.iter_mut() {
            let off = data.len() as u32;
            data.extend_from_slice(at(&self.data, e.off, e.len));
            e.off = off;
        }
        for v in self.vals.iter_mut() {
            if let Val::Inline { off, len } = v {
                let to = data.len() as u32;
                data.extend_from_slice(at(&self.data, *off, *len));
                *off = to;
            }
        }
        self.data = data;
        self.garbage = 0;
    }

    /// Inserts a leaf entry at `i`.
    pub fn insert(&mut self, i: usize, key: &[u8], v: NewVal<'_>) {
        let e = self.ent(key);
        let v = self.new_val(v);
        self.ents.insert(i, e);
        self.vals.insert(i, v);
        self.size += self.entry_size(i);
    }

    /// Inserts a branch entry at `i`.
    pub fn insert_kid(&mut self, i: usize, key: &[u8], kid: NodeRef) {
        let e = self.ent(key);
        self.ents.insert(i, e);
        self.kids.insert(i, kid);
        self.size += self.entry_size(i);
    }

    /// Replaces the value of leaf entry `i`; returns the old one.
    pub fn set_val(&mut self, i: usize, v: NewVal<'_>) -> Val {
        let v = self.new_val(v);
        self.replace_val(i, v)
    }

    fn replace_val(&mut self, i: usize, v: Val) -> Val {
        let before = self.entry_size(i);
        let old = std::mem::replace(&mut self.vals[i], v);
        self.size = self.size + self.entry_size(i) - before;
        self.drop_bytes(old.inline_len());
        old
    }

    /// Replaces the key of entry `i` (a branch's first key).
    pub fn set_key(&mut self, i: usize, key: &[u8]) {
        let before = self.entry_size(i);
        let old = self.ents[i].len as usize;
        self.ents[i] = self.ent(key);
        self.size = self.size + self.entry_size(i) - before;
        self.drop_bytes(old);
    }

    /// Removes entry `i`; returns its value (leaves).
    pub fn remove(&mut self, i: usize) -> Option<Val> {
        self.size -= self.entry_size(i);
        let e = self.ents.remove(i);
        let v = if self.leaf {
            Some(self.vals.remove(i))
        } else {
            self.kids.remove(i);
            None
        };
        self.drop_bytes(e.len as usize + v.as_ref().map_or(0, Val::inline_len));
        v
    }

    /// Copies a page into an editable node.
    pub fn from_page(p: &NodePage<'_>) -> Result<Node, Bad> {
        let base = p.buf.as_ptr() as usize;
        let off = |s: &[u8]| (s.as_ptr() as usize - base) as u32;
        let mut n = Node {
            leaf: p.leaf,
            ents: Vec::with_capacity(p.count + 1),
            data: p.buf.to_vec(),
            ..Node::empty_leaf()
        };
        if p.leaf {
            n.vals.reserve(p.count + 1);
        } else {
            n.kids.reserve(p.count + 1);
        }
        for i in 0..p.count {
            let k = p.key(i)?;
            n.ents.push(Ent {
                prefix: page::prefix(k),
                off: off(k),
                len: k.len() as u32,
            });
            if p.leaf {
                n.vals.push(match p.value(i)? {
                    RawVal::Inline(v) => Val::Inline {
                        off: off(v),
                        len: v.len() as u32,
                    },
                    RawVal::Overflow { page, len } => Val::Overflow { page, len },
                });
            } else {
                n.kids.push(NodeRef::Page(p.child(i)));
            }
            n.size += n.entry_size(i);
        }
        // What the page spends on its header and element table is not referenced.
        n.garbage = n.data.len() - n.live_bytes();
        Ok(n)
    }

    pub fn search(&self, key: &[u8]) -> (usize, bool) {
        let want = page::prefix(key);
        let found = self.ents.binary_search_by(|e| {
            e.prefix
                .cmp(&want)
                .then_with(|| at(&self.data, e.off, e.len).cmp(key))
        });
        match found {
            Ok(i) => (i, true),
            Err(i) => (i, false),
        }
    }

    /// Appends a copy of entry `i` of `src` (its bytes into this node's buffer).
    fn push_from(&mut self, src: &Node, i: usize) {
        let e = src.ents[i];
        let ent = self.ent(at(&src.data, e.off, e.len));
        self.ents.push(ent);
        if self.leaf {
            let v = match &src.vals[i] {
                Val::Inline { off, len } => Val::Inline {
                    off: self.push_bytes(at(&src.data, *off, *len)),
                    len: *len,
                },
                other => other.clone(),
            };
            self.vals.push(v);
        } else {
            self.kids.push(src.kids[i]);
        }
        self.size += self.entry_size(self.len() - 1);
    }

    /// Moves entries `from..` into a new node.
    pub fn split_off(&mut self, from: usize) -> Node {
        let mut right = Node {
            leaf: self.leaf,
            ..Node::empty_leaf()
        };
        for i in from..self.len() {
            right.push_from(self, i);
        }
        self.ents.truncate(from);
        self.vals.truncate(if self.leaf { from } else { 0 });
        self.kids.truncate(if self.leaf { 0 } else { from });
        self.size -= right.size - HEADER;
        self.garbage = self.data.len() - self.live_bytes();
        self.drop_bytes(0);
        right
    }

    /// Appends all of `right`'s entries.
    pub fn append(&mut self, right: Node) {
        for i in 0..right.len() {
            self.push_from(&right, i);
        }
    }

    /// Serializes into `buf` (one page, zeroed by the caller) as page `id`. Every child and value
    /// must already have a page (no `Mem` child, no `Big` value).
    pub fn write(&self, buf: &mut [u8], id: PageId) {
        debug_assert!(
            self.size <= buf.len(),
            "node of {} bytes in a page of {}",
            self.size,
            buf.len()
        );
        let kind = if self.leaf { Kind::Leaf } else { Kind::Branch };
        page::write_header(buf, id, kind, self.len() as u16, 0);
        let elem = if self.leaf { LEAF_ELEM } else { BRANCH_ELEM };
        let mut pos = HEADER + self.len() * elem;
        for i in 0..self.len() {
            let key = self.key(i);
            let e = HEADER + i * elem;
            page::put_elem_key(buf, e, key, pos);
            buf[pos..pos + key.len()].copy_from_slice(key);
            pos += key.len();
            if self.leaf {
                match &self.vals[i] {
                    Val::Inline { off, len } => {
                        let v = at(&self.data, *off, *len);
                        page::put_leaf_val(buf, e, false, v.len());
                        buf[pos..pos + v.len()].copy_from_slice(v);
                        pos += v.len();
                    }
                    Val::Overflow { page: p, len } => {
                        page::put_leaf_val(buf, e, true, *len);
                        page::put_u64(buf, pos, p.0);
                        pos += OVERFLOW_REF;
                    }
                    Val::Big(_) => unreachable!(
                        "large values get their overflow run before the leaf is written"
                    ),
                }
            } else {
                let NodeRef::Page(child) = self.kids[i] else {
                    unreachable!("children are written before their parent")
                };
                page::put_branch_child(buf, e, child);
            }
        }
        page::seal(buf);
    }
}

/// A value as a reader sees it, before an overflow run is resolved to its bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ValRef<'a> {
    Bytes(&'a [u8]),
    Overflow { page: PageId, len: usize },
}

/// One node, whether on a page or in the writer's arena.
#[derive(Clone, Copy)]
pub(crate) enum NodeView<'a> {
    Page(NodePage<'a>),
    Mem(&'a Node),
}

impl<'a> NodeView<'a> {
    pub fn leaf(&self) -> bool {
        match self {
            NodeView::Page(p) => p.leaf,
            NodeView::Mem(n) => n.leaf,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            NodeView::Page(p) => p.count,
            NodeView::Mem(n) => n.len(),
        }
    }

    pub fn key(&self, i: usize) -> Result<&'a [u8], Bad> {
        match self {
            NodeView::Page(p) => p.key(i),
            NodeView::Mem(n) => Ok(n.key(i)),
        }
    }

    pub fn child(&self, i: usize) -> NodeRef {
        match self {
            NodeView::Page(p) => NodeRef::Page(p.child(i)),
            NodeView::Mem(n) => n.kids[i],
        }
    }

    pub fn value(&self, i: usize) -> Result<ValRef<'a>, Bad> {
        match self {
            NodeView::Page(p) => Ok(match p.value(i)? {
                RawVal::Inline(v) => ValRef::Bytes(v),
                RawVal::Overflow { page, len } => ValRef::Overflow { page, len },
            }),
            NodeView::Mem(n) => Ok(n.value(i)),
        }
    }

    pub fn search(&self, key: &[u8]) -> Result<(usize, bool), Bad> {
        match self {
            NodeView::Page(p) => p.search(key),
            NodeView::Mem(n) => Ok(n.search(key)),
        }
    }
}
