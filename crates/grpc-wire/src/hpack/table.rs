//! HPACK's header tables (RFC 7541, section 2.3): the static table and a dynamic table.

use std::collections::VecDeque;

use bytes::Bytes;

/// The static table (RFC 7541, Appendix A); index `i` is entry `i + 1`.
pub(crate) const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// An entry's size as the table counts it: its name and value and 32 bytes of overhead.
pub(crate) fn entry_size(name: &[u8], value: &[u8]) -> usize {
    name.len() + value.len() + 32
}

/// A dynamic table: newest entry first, evicted from the back to stay within `max_size`.
#[derive(Debug)]
pub(crate) struct Dynamic {
    entries: VecDeque<(Bytes, Bytes)>,
    size: usize,
    max_size: usize,
    /// Insertions and size changes so far.
    changes: u64,
}

impl Dynamic {
    pub(crate) fn new(max_size: usize) -> Dynamic {
        Dynamic {
            entries: VecDeque::new(),
            size: 0,
            max_size,
            changes: 0,
        }
    }

    /// How many times entries were added or the size set: references to the table mean
    /// what they meant while this stays the same.
    pub(crate) fn changes(&self) -> u64 {
        self.changes
    }

    pub(crate) fn max_size(&self) -> usize {
        self.max_size
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn set_max_size(&mut self, max: usize) {
        self.changes += 1;
        self.max_size = max;
        self.evict(0);
    }

    /// Adds an entry; one larger than the whole table empties it (RFC 7541, 4.4).
    pub(crate) fn insert(&mut self, name: Bytes, value: Bytes) {
        self.changes += 1;
        let size = entry_size(&name, &value);
        self.evict(size);
        if size <= self.max_size {
            self.size += size;
            self.entries.push_front((name, value));
        }
    }

    /// Entry `i` of the dynamic table, 0 being the newest.
    pub(crate) fn get(&self, i: usize) -> Option<&(Bytes, Bytes)> {
        self.entries.get(i)
    }

    /// The position of (name, value), 0 being the newest.
    pub(crate) fn find(&self, name: &[u8], value: &[u8]) -> Option<usize> {
        self.entries
            .iter()
            .position(|(n, v)| n.as_ref() == name && v.as_ref() == value)
    }

    fn evict(&mut self, room: usize) {
        while self.size + room > self.max_size {
            match self.entries.pop_back() {
                Some((n, v)) => self.size -= entry_size(&n, &v),
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_keeps_the_size_bound() {
        let mut t = Dynamic::new(100);
        t.insert(Bytes::from_static(b"aaaa"), Bytes::from_static(b"1111")); // 40
        t.insert(Bytes::from_static(b"bbbb"), Bytes::from_static(b"2222")); // 80
        t.insert(Bytes::from_static(b"cccc"), Bytes::from_static(b"3333")); // evicts a
        assert_eq!(t.len(), 2);
        assert_eq!(t.get(0).unwrap().0.as_ref(), b"cccc");
        assert_eq!(t.find(b"bbbb", b"2222"), Some(1));
        assert_eq!(t.find(b"aaaa", b"1111"), None);
        t.insert(Bytes::from(vec![b'x'; 100]), Bytes::new()); // larger than the table
        assert_eq!(t.len(), 0);
        t.insert(Bytes::from_static(b"dddd"), Bytes::from_static(b"4444"));
        t.set_max_size(0);
        assert_eq!(t.len(), 0);
    }
}
