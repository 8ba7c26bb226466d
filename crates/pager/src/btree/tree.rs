//! A tree as one snapshot sees it: its pages read from the map, checked as they are read.

use std::path::Path;
use std::sync::Arc;

use super::node::{Node, NodeRef, NodeView, ValRef};
use crate::error::{Error, Result};
use crate::map::{Map, Reach};
use crate::page::{self, Bad, Kind, NodePage, PageId, HEADER};
use crate::unreached::Unreached;

/// Deeper than this is a cycle or garbage, not a tree: 64 levels of even two-way fan-out hold
/// more pages than any file can.
pub(crate) const MAX_DEPTH: usize = 64;

/// The pages of one committed state: a map, the high-water mark that bounds valid page ids, and
/// the pages below it that the commit does not reach.
#[derive(Clone, Debug)]
pub(crate) struct Snap {
    pub map: Arc<Map>,
    pub high_water: u64,
    pub unreached: Arc<Unreached>,
    pub page_size: usize,
    pub path: Arc<Path>,
}

impl Snap {
    pub fn corrupt(&self, b: Bad) -> Error {
        Error::Corrupt {
            path: self.path.to_path_buf(),
            page: b.page,
            reason: b.reason,
        }
    }

    /// The bytes of pages `id..id + pages`, refused unless this commit reaches them all.
    pub fn run(&self, id: PageId, pages: u64) -> Result<&[u8]> {
        let reach = Reach {
            high_water: self.high_water,
            unreached: &self.unreached,
            page_size: self.page_size,
        };
        self.map
            .pages(&reach, id, pages)
            .map_err(|b| self.corrupt(b))
    }

    pub fn node(&self, id: PageId) -> Result<NodePage<'_>> {
        NodePage::parse(self.run(id, 1)?, id).map_err(|b| self.corrupt(b))
    }

    /// The value stored in the overflow run at `id`.
    pub fn overflow(&self, id: PageId, len: usize) -> Result<&[u8]> {
        let pages = page::run_pages(len, self.page_size);
        let buf = self.run(id, pages)?;
        let h = page::header(buf, id).map_err(|b| self.corrupt(b))?;
        if h.kind != Kind::Overflow || u64::from(h.overflow) + 1 != pages {
            return Err(self.corrupt(page::bad(
                id,
                format!(
                    "expected an overflow run of {pages} pages, found {:?} of {}",
                    h.kind,
                    u64::from(h.overflow) + 1
                ),
            )));
        }
        Ok(&buf[HEADER..HEADER + len])
    }
}

/// Read access to one tree: pages from a snapshot, edited nodes from a writer's arena.
#[derive(Clone, Copy)]
pub(crate) struct Tree<'a> {
    pub snap: &'a Snap,
    pub arena: &'a [Node],
    pub root: NodeRef,
}

impl<'a> Tree<'a> {
    pub fn node(&self, r: NodeRef) -> Result<NodeView<'a>> {
        Ok(match r {
            NodeRef::Page(id) => NodeView::Page(self.snap.node(id)?),
            NodeRef::Mem(i) => NodeView::Mem(&self.arena[i]),
        })
    }

    pub fn resolve(&self, v: ValRef<'a>) -> Result<&'a [u8]> {
        match v {
            ValRef::Bytes(b) => Ok(b),
            ValRef::Overflow { page, len } => self.snap.overflow(page, len),
        }
    }

    /// The leaf that may hold `key` and the search result in it.
    pub fn find(&self, key: &[u8]) -> Result<(NodeView<'a>, usize, bool)> {
        let mut n = self.node(self.root)?;
        for _ in 0..MAX_DEPTH {
            let found = n.search(key).map_err(|b| self.snap.corrupt(b))?;
            if n.leaf() {
                return Ok((n, found.0, found.1));
            }
            n = self.node(n.child(page::child_index(found)))?;
        }
        Err(self.too_deep())
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<&'a [u8]>> {
        match self.find(key)? {
            (n, i, true) => Ok(Some(
                self.resolve(n.value(i).map_err(|b| self.snap.corrupt(b))?)?,
            )),
            _ => Ok(None),
        }
    }

    pub fn too_deep(&self) -> Error {
        let page = match self.root {
            NodeRef::Page(p) => p,
            NodeRef::Mem(_) => PageId(0),
        };
        self.snap.corrupt(page::bad(
            page,
            format!("tree deeper than {MAX_DEPTH} levels: a cycle of pages"),
        ))
    }
}
