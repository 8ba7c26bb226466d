//! Where the leasing keys of a key live, and the compares that guard on them.
//!
//! | holder | leasing key of `k` | value | lease |
//! |---|---|---|---|
//! | exclusive, etcd's proxy | `<prefix>k` | empty | the holder's session |
//! | exclusive, kvd's proxy (etcd's protocol) | `<prefix>k` | `kvd` | the holder's session |
//! | shared (`--leasing-shared`, kvd only) | `<prefix>k` `\0` 16 hex digits of the lease | `SHARED` | the holder's session |
//! | revoked (either) | unchanged | `REVOKE` | unchanged (put with `ignore_lease`) |
//!
//! So every holder of `k` is in `[<prefix>k, <prefix>k\x01)`. That range also holds the
//! exclusive leasing keys of keys that extend `k` with a NUL byte (`k\0…`): a write of `k`
//! then revokes their holders too — needless, never unsafe, and only for keys with NULs.
//! kvd's writers always guard on the whole range, so exclusive and shared kvd proxies can
//! share a prefix; etcd's writers guard on `<prefix>k` alone, so shared leases are safe only
//! when every proxy on the prefix is kvd's. etcd's proxies read no value but `REVOKE`, so
//! kvd's exclusive leasing keys say whose they are, and an etcd proxy's can be told apart
//! (its value is empty).

use api::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use api::etcdserverpb::Compare;

/// The value a writer puts on a leasing key to ask its holder to give the key up.
pub const REVOKE: &[u8] = b"REVOKE";
/// The value of a shared leasing key.
pub const SHARED: &[u8] = b"SHARED";
/// The value of a kvd proxy's exclusive leasing key.
pub const EXCLUSIVE: &[u8] = b"kvd";
/// The hex digits of the lease at the end of a shared leasing key.
const LEASE_HEX: usize = 16;

/// The leasing keys under one prefix, for one proxy's mode.
#[derive(Debug, Clone)]
pub struct LeasingKeys {
    pub prefix: Vec<u8>,
    pub shared: bool,
}

/// A compare `key` (to `range_end`, if any) `target` `result` `value`.
pub fn cmp(key: Vec<u8>, range_end: Vec<u8>, result: CompareResult, v: TargetUnion) -> Compare {
    let target = match v {
        TargetUnion::Version(_) => CompareTarget::Version,
        TargetUnion::CreateRevision(_) => CompareTarget::Create,
        TargetUnion::ModRevision(_) => CompareTarget::Mod,
        TargetUnion::Value(_) => CompareTarget::Value,
        TargetUnion::Lease(_) => CompareTarget::Lease,
    };
    Compare {
        result: result as i32,
        target: target as i32,
        key,
        range_end,
        target_union: Some(v),
    }
}

/// `create_revision(key..end) == 0`: nothing there.
fn none_in(key: Vec<u8>, end: Vec<u8>) -> Compare {
    cmp(
        key,
        end,
        CompareResult::Equal,
        TargetUnion::CreateRevision(0),
    )
}

impl LeasingKeys {
    /// `<prefix>k`: etcd's (exclusive) leasing key.
    pub fn exclusive(&self, key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + key.len());
        k.extend_from_slice(&self.prefix);
        k.extend_from_slice(key);
        k
    }

    /// `<prefix>k\0<lease>`: the shared leasing key of `lease`.
    pub fn shared(&self, key: &[u8], lease: i64) -> Vec<u8> {
        let mut k = self.exclusive(key);
        k.push(0);
        k.extend_from_slice(format!("{:016x}", lease as u64).as_bytes());
        k
    }

    /// The leasing key this proxy takes `key` with, under `lease`.
    pub fn own(&self, key: &[u8], lease: i64) -> Vec<u8> {
        if self.shared {
            self.shared(key, lease)
        } else {
            self.exclusive(key)
        }
    }

    /// The value this proxy's leasing keys carry.
    pub fn own_value(&self) -> Vec<u8> {
        if self.shared {
            SHARED.to_vec()
        } else {
            EXCLUSIVE.to_vec()
        }
    }

    /// `[<prefix>k, <prefix>k\x01)`: every holder of `k`.
    pub fn holders(&self, key: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let lk = self.exclusive(key);
        let mut end = lk.clone();
        end.push(1);
        (lk, end)
    }

    /// The leasing keys of the keys in `[key, end)` (etcd's range conventions), holders of
    /// every kind. The holders of a key `p` in the range whose end extends it with a NUL byte
    /// (`end` = `p\0…`) run past `<prefix>end`, to `<prefix>p\x01`: the range is widened to
    /// the shortest such `p` (taking in holders of keys past the end: needless, not unsafe).
    pub fn holders_of_range(&self, key: &[u8], end: &[u8]) -> (Vec<u8>, Vec<u8>) {
        match end {
            [] => self.holders(key),
            [0] => (
                self.exclusive(key),
                crate::namespace::prefix_end(&self.prefix),
            ),
            e => {
                let widened = (0..e.len())
                    .find(|&j| e[j] == 0 && &e[..j] >= key)
                    .map(|j| {
                        let mut w = self.exclusive(&e[..j]);
                        w.push(1);
                        w
                    });
                (
                    self.exclusive(key),
                    widened.unwrap_or_else(|| self.exclusive(e)),
                )
            }
        }
    }

    /// The compares of a taking txn for `key` under `lease`: no holder in the way (in
    /// exclusive mode, none at all; in shared mode, no exclusive holder and no leasing key of
    /// this lease left over), and no lease on the key itself (a key that can vanish without a
    /// write is never held).
    pub fn acquire_guard(&self, key: &[u8], lease: i64) -> Vec<Compare> {
        let (lk, end) = self.holders(key);
        let no_lease = cmp(
            key.to_vec(),
            Vec::new(),
            CompareResult::Equal,
            TargetUnion::Lease(0),
        );
        if self.shared {
            vec![
                none_in(lk, Vec::new()),
                none_in(self.shared(key, lease), Vec::new()),
                no_lease,
            ]
        } else {
            let mut shared_start = lk.clone();
            shared_start.push(0);
            vec![
                none_in(lk, Vec::new()),
                none_in(shared_start, end),
                no_lease,
            ]
        }
    }

    /// The compares that let a write of `key` through: no holder but this proxy's own leasing
    /// key (created at `own`, 0 if none) is there. Shared mode leaves a gap in the range for
    /// the proxy's own leasing key.
    pub fn write_guard(&self, key: &[u8], own: i64, lease: i64) -> Vec<Compare> {
        let (lk, end) = self.holders(key);
        let mut shared_start = lk.clone();
        shared_start.push(0);
        if self.shared && lease != 0 {
            let mine = self.shared(key, lease);
            let mut after_mine = mine.clone();
            after_mine.push(0);
            vec![
                none_in(lk, Vec::new()),
                none_in(shared_start, mine.clone()),
                none_in(after_mine, end),
                cmp(
                    mine,
                    Vec::new(),
                    CompareResult::Less,
                    TargetUnion::CreateRevision(own + 1),
                ),
            ]
        } else {
            vec![
                cmp(
                    lk,
                    Vec::new(),
                    CompareResult::Less,
                    TargetUnion::CreateRevision(own + 1),
                ),
                none_in(shared_start, end),
            ]
        }
    }

    /// What an event on leasing key `lk` is to a proxy whose session lease is `lease`: the
    /// key it would hold `k` with, so `Some(k)`; `None` for another holder's leasing key.
    /// In exclusive mode every `<prefix>k` is a candidate (a deletion does not carry the
    /// lease; the cache compares revisions).
    pub fn key_of<'a>(&self, lk: &'a [u8], lease: i64) -> Option<&'a [u8]> {
        let rest = lk.strip_prefix(self.prefix.as_slice())?;
        if !self.shared {
            return Some(rest);
        }
        let suffix = format!("{:016x}", lease as u64);
        let cut = rest.len().checked_sub(LEASE_HEX + 1)?;
        (rest[cut] == 0 && &rest[cut + 1..] == suffix.as_bytes()).then_some(&rest[..cut])
    }

    /// Whether a leasing key was taken by an etcd proxy: what `--leasing-shared` refuses to
    /// start beside.
    pub fn is_etcd_holder(value: &[u8]) -> bool {
        value.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_holder_of_a_key_is_in_its_range_and_no_other_keys_are() {
        let x = LeasingKeys {
            prefix: b"_l/".to_vec(),
            shared: false,
        };
        let s = LeasingKeys {
            prefix: b"_l/".to_vec(),
            shared: true,
        };
        let (lo, hi) = x.holders(b"k");
        for held in [x.exclusive(b"k"), s.shared(b"k", 0x12), s.shared(b"k", -1)] {
            assert!(held >= lo && held < hi, "{held:?}");
        }
        for other in [x.exclusive(b"j"), x.exclusive(b"k0"), x.exclusive(b"ka")] {
            assert!(!(other >= lo && other < hi), "{other:?}");
        }
        assert_eq!(s.shared(b"k", 0x12), b"_l/k\x000000000000000012");
        assert_eq!(s.key_of(&s.shared(b"k", 0x12), 0x12), Some(&b"k"[..]));
        assert_eq!(s.key_of(&s.shared(b"k", 0x12), 0x13), None);
        assert_eq!(s.key_of(&x.exclusive(b"k"), 0x12), None);
        assert_eq!(x.key_of(b"_l/k", 7), Some(&b"k"[..]));
        assert_eq!(x.key_of(b"other", 7), None);
        assert_eq!(
            x.holders_of_range(b"a", &[0]),
            (b"_l/a".to_vec(), b"_l0".to_vec())
        );
        assert_eq!(
            x.holders_of_range(b"a", b"c"),
            (b"_l/a".to_vec(), b"_l/c".to_vec())
        );
        // A range that ends at `k\0` (the key `k` alone) still covers `k`'s shared holders.
        let (lo, hi) = x.holders_of_range(b"k", b"k\0");
        let held = s.shared(b"k", 0x12);
        assert!(held >= lo && held < hi);
        let (lo, hi) = x.holders_of_range(b"a", b"k\0z");
        assert!(held >= lo && held < hi);
        let (_, hi) = x.holders_of_range(b"a\0b", b"a\0c");
        assert_eq!(hi, b"_l/a\0c");
    }
}
