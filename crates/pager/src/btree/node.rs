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
    Inline(Vec<u8>),
    /// A value already in an overflow run in the file.
    Overflow {
        page: PageId,
        len: usize,
    },
    /// A large value that needs a new overflow run at commit.
    Big(Vec<u8>),
}

impl Val {
    fn stored_len(&self) -> usize {
        match self {
            Val::Inline(v) => v.len(),
            Val::Overflow { .. } | Val::Big(_) => OVERFLOW_REF,
        }
    }
}

/// A branch or leaf being edited. `size` is its serialized size, kept current by every edit.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub leaf: bool,
    pub keys: Vec<Vec<u8>>,
    pub vals: Vec<Val>,
    pub kids: Vec<NodeRef>,
    pub size: usize,
}

impl Node {
    pub fn empty_leaf() -> Node {
        Node {
            leaf: true,
            keys: Vec::new(),
            vals: Vec::new(),
            kids: Vec::new(),
            size: HEADER,
        }
    }

    pub fn branch(keys: Vec<Vec<u8>>, kids: Vec<NodeRef>) -> Node {
        let mut n = Node {
            leaf: false,
            keys,
            vals: Vec::new(),
            kids,
            size: 0,
        };
        n.size = n.compute_size();
        n
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn entry_size(&self, i: usize) -> usize {
        if self.leaf {
            LEAF_ELEM + self.keys[i].len() + self.vals[i].stored_len()
        } else {
            BRANCH_ELEM + self.keys[i].len()
        }
    }

    pub fn compute_size(&self) -> usize {
        HEADER + (0..self.len()).map(|i| self.entry_size(i)).sum::<usize>()
    }

    /// Copies a page into an editable node.
    pub fn from_page(p: &NodePage<'_>) -> Result<Node, Bad> {
        let mut n = Node {
            leaf: p.leaf,
            keys: Vec::with_capacity(p.count + 1),
            vals: Vec::new(),
            kids: Vec::new(),
            size: 0,
        };
        if p.leaf {
            n.vals.reserve(p.count + 1);
        } else {
            n.kids.reserve(p.count + 1);
        }
        for i in 0..p.count {
            n.keys.push(p.key(i)?.to_vec());
            if p.leaf {
                n.vals.push(match p.value(i)? {
                    RawVal::Inline(v) => Val::Inline(v.to_vec()),
                    RawVal::Overflow { page, len } => Val::Overflow { page, len },
                });
            } else {
                n.kids.push(NodeRef::Page(p.child(i)));
            }
        }
        n.size = n.compute_size();
        Ok(n)
    }

    pub fn search(&self, key: &[u8]) -> (usize, bool) {
        match self.keys.binary_search_by(|k| k.as_slice().cmp(key)) {
            Ok(i) => (i, true),
            Err(i) => (i, false),
        }
    }

    /// Moves entries `at..` into a new node.
    pub fn split_off(&mut self, at: usize) -> Node {
        let mut right = Node {
            leaf: self.leaf,
            keys: self.keys.split_off(at),
            vals: if self.leaf {
                self.vals.split_off(at)
            } else {
                Vec::new()
            },
            kids: if self.leaf {
                Vec::new()
            } else {
                self.kids.split_off(at)
            },
            size: 0,
        };
        right.size = right.compute_size();
        self.size -= right.size - HEADER;
        right
    }

    /// Appends all of `right`'s entries.
    pub fn append(&mut self, mut right: Node) {
        self.size += right.size - HEADER;
        self.keys.append(&mut right.keys);
        self.vals.append(&mut right.vals);
        self.kids.append(&mut right.kids);
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
        for (i, key) in self.keys.iter().enumerate() {
            let e = HEADER + i * elem;
            page::put_elem_key(buf, e, key, pos);
            buf[pos..pos + key.len()].copy_from_slice(key);
            pos += key.len();
            if self.leaf {
                match &self.vals[i] {
                    Val::Inline(v) => {
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
            NodeView::Mem(n) => Ok(&n.keys[i]),
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
            NodeView::Mem(n) => Ok(match &n.vals[i] {
                Val::Inline(v) | Val::Big(v) => ValRef::Bytes(v),
                Val::Overflow { page, len } => ValRef::Overflow {
                    page: *page,
                    len: *len,
                },
            }),
        }
    }

    pub fn search(&self, key: &[u8]) -> Result<(usize, bool), Bad> {
        match self {
            NodeView::Page(p) => p.search(key),
            NodeView::Mem(n) => Ok(n.search(key)),
        }
    }
}
