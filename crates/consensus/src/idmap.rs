//! Maps keyed by member ids and proposal numbers, hashed with one multiplication.
//!
//! The standard map's SipHash (built to resist keys chosen by an attacker) cost a leader about
//! 4,000 instructions per replicated write, in the few maps its Ready loop reads on every turn.
//! Their keys are not an attacker's to choose: member ids are random 64-bit numbers drawn by
//! the cluster, proposal numbers count up from one.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map from integer ids (see the module's note).
pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// Multiplies the key by 2⁶⁴/φ: the low bits a table indexes by stay distinct for keys that
/// count up, the high bits it tags entries with depend on the whole key.
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

const PHI: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(PHI);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(PHI);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_that_count_up_or_are_random_spread_over_a_table() {
        // The bucket a table of 64 takes from the low bits, and the 7-bit tag from the top.
        let hash = |k: u64| {
            let mut h = IdHasher::default();
            h.write_u64(k);
            h.finish()
        };
        let buckets: std::collections::HashSet<u64> = (1..=64).map(|k| hash(k) & 63).collect();
        assert_eq!(buckets.len(), 64, "counting keys land in distinct buckets");
        let tags: std::collections::HashSet<u64> = (1..=64).map(|k| hash(k) >> 57).collect();
        assert!(
            tags.len() > 32,
            "tags of counting keys vary: {}",
            tags.len()
        );
        let mut m: IdMap<u64, u64> = IdMap::default();
        for k in 0..10_000u64 {
            m.insert(k.wrapping_mul(0x2545_f491_4f6c_dd1d), k);
        }
        assert!((0..10_000u64).all(|k| m[&k.wrapping_mul(0x2545_f491_4f6c_dd1d)] == k));
    }
}
