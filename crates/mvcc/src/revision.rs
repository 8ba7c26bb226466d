//! Revisions and their byte form, the key of the `key` bucket.
//!
//! The byte form is etcd's: 8 bytes of main revision, `_`, 8 bytes of sub revision, all big
//! endian, so byte order is revision order; a tombstone appends `t`. Keeping etcd's form (and
//! etcd's `KeyValue` encoding as the value) makes [`crate::Store::hash_kv`] hash the same bytes
//! etcd hashes.

use std::fmt;

/// Length of a revision key without the tombstone mark.
pub const REV_KEY_LEN: usize = 17;
/// Length of a tombstone's revision key.
pub const TOMBSTONE_KEY_LEN: usize = 18;

/// A point in the store's history: `main` counts write transactions, `sub` the writes in one.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Rev {
    pub main: i64,
    pub sub: i64,
}

impl fmt::Debug for Rev {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.main, self.sub)
    }
}

impl Rev {
    pub const fn new(main: i64, sub: i64) -> Rev {
        Rev { main, sub }
    }

    /// The `key` bucket key of this revision; `tombstone` appends the mark.
    pub fn to_key(self, tombstone: bool) -> RevKey {
        let mut b = [0u8; TOMBSTONE_KEY_LEN];
        b[..8].copy_from_slice(&self.main.to_be_bytes());
        b[8] = b'_';
        b[9..17].copy_from_slice(&self.sub.to_be_bytes());
        if tombstone {
            b[17] = b't';
        }
        RevKey {
            bytes: b,
            len: if tombstone {
                TOMBSTONE_KEY_LEN
            } else {
                REV_KEY_LEN
            } as u8,
        }
    }

    /// Parses a `key` bucket key; `None` if it is not a revision key.
    pub fn from_key(k: &[u8]) -> Option<(Rev, bool)> {
        let tombstone = match k.len() {
            REV_KEY_LEN => false,
            TOMBSTONE_KEY_LEN if k[17] == b't' => true,
            _ => return None,
        };
        if k[8] != b'_' {
            return None;
        }
        let main = i64::from_be_bytes(k[..8].try_into().ok()?);
        let sub = i64::from_be_bytes(k[9..17].try_into().ok()?);
        Some((Rev { main, sub }, tombstone))
    }
}

/// The byte form of a revision (with or without the tombstone mark).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RevKey {
    bytes: [u8; TOMBSTONE_KEY_LEN],
    len: u8,
}

impl RevKey {
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl fmt::Debug for RevKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Rev::from_key(self.as_bytes()) {
            Some((r, t)) => write!(f, "{r:?}{}", if t { "t" } else { "" }),
            None => write!(f, "{:?}", self.as_bytes()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_order_is_revision_order_and_round_trips() {
        let revs = [
            Rev::new(1, 0),
            Rev::new(1, 1),
            Rev::new(2, 0),
            Rev::new(256, 3),
            Rev::new(i64::MAX, 0),
        ];
        for w in revs.windows(2) {
            assert!(w[0].to_key(false).as_bytes() < w[1].to_key(false).as_bytes());
            assert!(w[0].to_key(true).as_bytes() < w[1].to_key(false).as_bytes());
        }
        for r in revs {
            for t in [false, true] {
                assert_eq!(Rev::from_key(r.to_key(t).as_bytes()), Some((r, t)));
            }
        }
        assert_eq!(Rev::from_key(b"short"), None);
        assert_eq!(Rev::from_key(&[0u8; 18]), None);
    }
}
