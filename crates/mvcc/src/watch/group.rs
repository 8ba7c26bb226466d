//! Finding the watchers of a key, fast enough to run on every write with 100,000 watchers.
//!
//! A watcher watches one key, a prefix (`[p, prefix_end(p))`, what `etcdctl watch --prefix`
//! and Kubernetes ask for), or any other range. Single keys are one hash lookup; prefixes one
//! lookup per distinct prefix length in use (a handful in practice); other ranges are scanned by
//! start key, so their cost grows with how many distinct ranges start at or before the key.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Bound::{Included, Unbounded};
use std::sync::Arc;

use crate::index::KeyRange;

use super::event::Spec;

/// A set of watchers (by handle) indexed for lookup by key.
#[derive(Debug, Default)]
pub(super) struct Group {
    keys: HashMap<Vec<u8>, HashSet<u64>>,
    prefixes: HashMap<Vec<u8>, HashSet<u64>>,
    /// Distinct prefix lengths in `prefixes`, with how many prefixes have each.
    prefix_lens: BTreeMap<usize, usize>,
    /// Other ranges by start key.
    ranges: BTreeMap<Vec<u8>, HashMap<u64, Arc<Spec>>>,
    len: usize,
}

/// How a watcher's keys are looked up.
enum Shape<'a> {
    Key(&'a [u8]),
    Prefix(&'a [u8]),
    Range(&'a [u8]),
}

/// etcd's prefix end: the smallest key greater than every key starting with `p` (`None` when
/// `p` is all 0xff, where etcd falls back to "from key").
fn prefix_end(p: &[u8]) -> Option<Vec<u8>> {
    let i = p.iter().rposition(|&b| b < 0xff)?;
    let mut end = p[..=i].to_vec();
    end[i] += 1;
    Some(end)
}

fn shape(spec: &Spec) -> Shape<'_> {
    match spec.range() {
        KeyRange::One(k) => Shape::Key(k),
        KeyRange::Between(k, e) if prefix_end(k).as_deref() == Some(e) => Shape::Prefix(k),
        KeyRange::From(k) | KeyRange::Between(k, _) => Shape::Range(k),
    }
}

impl Group {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn add(&mut self, h: u64, spec: &Arc<Spec>) {
        let added = match shape(spec) {
            Shape::Key(k) => self.keys.entry(k.to_vec()).or_default().insert(h),
            Shape::Prefix(p) => {
                let set = self.prefixes.entry(p.to_vec()).or_default();
                if set.is_empty() {
                    *self.prefix_lens.entry(p.len()).or_default() += 1;
                }
                set.insert(h)
            }
            Shape::Range(start) => self
                .ranges
                .entry(start.to_vec())
                .or_default()
                .insert(h, spec.clone())
                .is_none(),
        };
        self.len += usize::from(added);
    }

    pub(super) fn remove(&mut self, h: u64, spec: &Spec) {
        let removed = match shape(spec) {
            Shape::Key(k) => remove_from(&mut self.keys, k, |s| s.remove(&h), HashSet::is_empty),
            Shape::Prefix(p) => {
                let removed =
                    remove_from(&mut self.prefixes, p, |s| s.remove(&h), HashSet::is_empty);
                if removed && !self.prefixes.contains_key(p) {
                    if let Some(n) = self.prefix_lens.get_mut(&p.len()) {
                        *n -= 1;
                        if *n == 0 {
                            self.prefix_lens.remove(&p.len());
                        }
                    }
                }
                removed
            }
            Shape::Range(start) => remove_from(
                &mut self.ranges,
                start,
                |m| m.remove(&h).is_some(),
                HashMap::is_empty,
            ),
        };
        self.len -= usize::from(removed);
    }

    /// Appends the handle of every watcher whose range holds `key` to `out`.
    pub(super) fn matches(&self, key: &[u8], out: &mut Vec<u64>) {
        if let Some(set) = self.keys.get(key) {
            out.extend(set.iter().copied());
        }
        for &n in self.prefix_lens.keys() {
            if n > key.len() {
                break;
            }
            if let Some(set) = self.prefixes.get(&key[..n]) {
                out.extend(set.iter().copied());
            }
        }
        for (_, m) in self.ranges.range::<[u8], _>((Unbounded, Included(key))) {
            out.extend(
                m.iter()
                    .filter(|(_, s)| s.range().contains(key))
                    .map(|(&h, _)| h),
            );
        }
    }

    /// Whether any watcher's range holds `key`.
    pub(super) fn any(&self, key: &[u8]) -> bool {
        self.keys.contains_key(key)
            || self
                .prefix_lens
                .keys()
                .take_while(|&&n| n <= key.len())
                .any(|&n| self.prefixes.contains_key(&key[..n]))
            || self
                .ranges
                .range::<[u8], _>((Unbounded, Included(key)))
                .any(|(_, m)| m.values().any(|s| s.range().contains(key)))
    }
}

/// Removes from the set under `k` and drops the set when it empties; true if removed.
fn remove_from<S>(
    map: &mut (impl MapLike<S> + ?Sized),
    k: &[u8],
    remove: impl FnOnce(&mut S) -> bool,
    empty: impl Fn(&S) -> bool,
) -> bool {
    let Some(set) = map.get_mut_(k) else {
        return false;
    };
    let removed = remove(set);
    if empty(set) {
        map.remove_(k);
    }
    removed
}

/// The two map types a group keeps sets in.
trait MapLike<S> {
    fn get_mut_(&mut self, k: &[u8]) -> Option<&mut S>;
    fn remove_(&mut self, k: &[u8]);
}

impl<S> MapLike<S> for HashMap<Vec<u8>, S> {
    fn get_mut_(&mut self, k: &[u8]) -> Option<&mut S> {
        self.get_mut(k)
    }
    fn remove_(&mut self, k: &[u8]) {
        self.remove(k);
    }
}

impl<S> MapLike<S> for BTreeMap<Vec<u8>, S> {
    fn get_mut_(&mut self, k: &[u8]) -> Option<&mut S> {
        self.get_mut(k)
    }
    fn remove_(&mut self, k: &[u8]) {
        self.remove(k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_etcds() {
        assert_eq!(prefix_end(b"a"), Some(b"b".to_vec()));
        assert_eq!(prefix_end(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_end(b"\xff\xff"), None);
    }

    #[test]
    fn matches_each_shape_and_forgets_removed() {
        let specs: Vec<Arc<Spec>> = [
            (&b"k"[..], &b""[..]),
            (b"pre/", b"pre0"),
            (b"b", b"d"),
            (b"m", b"\0"),
        ]
        .iter()
        .map(|(k, e)| Arc::new(Spec::for_test(k, e)))
        .collect();
        let mut g = Group::default();
        for (h, s) in specs.iter().enumerate() {
            g.add(h as u64, s);
        }
        let hits = |g: &Group, key: &[u8]| {
            let mut out = Vec::new();
            g.matches(key, &mut out);
            out.sort_unstable();
            assert_eq!(g.any(key), !out.is_empty());
            out
        };
        assert_eq!(hits(&g, b"k"), vec![0]);
        assert_eq!(hits(&g, b"pre/x"), vec![1, 3]);
        assert_eq!(hits(&g, b"c"), vec![2]);
        assert_eq!(hits(&g, b"d"), Vec::<u64>::new());
        assert_eq!(hits(&g, b"a"), Vec::<u64>::new());
        for (h, s) in specs.iter().enumerate() {
            g.remove(h as u64, s);
        }
        assert_eq!(g.len(), 0);
        assert!(g.prefix_lens.is_empty() && g.keys.is_empty() && g.ranges.is_empty());
    }
}
