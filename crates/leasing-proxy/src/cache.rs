//! The keys the proxy holds a lease on, with what it knows of their values; bounded in keys
//! and bytes (a CLOCK, the second-chance approximation of LRU, picks the key to give up: a hit
//! only sets a bit).
//!
//! A held key may be answered from here only while all of these hold, each checked under the
//! same lock as the value is read:
//! - its session generation is alive ([`crate::session::Session::valid`]);
//! - no write of the proxy's to it is in flight (its answer would change the value: a read
//!   that overlaps it goes to the cluster);
//! - the value is known at a revision no older than the newest write a watch showed for the
//!   key (a write that bypassed the leasing protocol stops the answers as soon as it shows).
//!
//! Keys being taken are in the map too, so that a revocation of the leasing key seen before
//! the taking txn's answer is not lost ([`Cache::finish_acquire`] then refuses the key).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use api::mvccpb::KeyValue;
use parking_lot::{Mutex, RwLock};

/// One key held.
#[derive(Debug)]
struct Held {
    /// The create revision of the proxy's leasing key for it: its ownership.
    lk_rev: i64,
    /// The session generation the leasing key is attached to.
    generation: u64,
    /// The key-value (None: the key does not exist), as of `known_at`.
    value: Option<KeyValue>,
    /// The revision at which `value` is the key's (0: not known).
    known_at: i64,
    /// The newest revision at which a watch showed the key written.
    latest_event: i64,
    /// Writes of the proxy's to the key in flight, and a count of those ever begun.
    writers: u32,
    write_epoch: u64,
    used: AtomicBool,
}

impl Held {
    fn bytes(&self, key: &[u8]) -> usize {
        entry_bytes(key, self.value.as_ref())
    }

    fn servable(&self) -> bool {
        self.writers == 0 && self.known_at > 0 && self.known_at >= self.latest_event
    }
}

fn entry_bytes(key: &[u8], kv: Option<&KeyValue>) -> usize {
    key.len() + 96 + kv.map_or(0, |kv| kv.key.len() + kv.value.len() + 48)
}

#[derive(Debug)]
enum Slot {
    /// The taking txn is in flight; the newest revision at which the leasing key was revoked
    /// or deleted meanwhile (0: not).
    Acquiring {
        disturbed_at: i64,
    },
    Held(Held),
}

/// What a read found.
#[derive(Debug, PartialEq)]
pub enum Lookup {
    /// Held, servable, session alive: the key-value (None: absent).
    Hit(Option<KeyValue>),
    /// Held, but not servable now (a write in flight, or the value unknown): what a read
    /// answered by the cluster needs to teach the cache the value ([`Cache::learn`]).
    Held {
        lk_rev: i64,
        epoch: u64,
    },
    /// Being taken.
    Acquiring,
    Miss,
}

/// How the taking of a key ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Acquired {
    /// Held from now on.
    Held,
    /// Revoked or deleted before the answer came: the leasing key must be given back.
    Disturbed,
}

/// A key no longer held: its leasing key's create revision and session generation (the
/// leasing key is to be deleted, if that session is still the proxy's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    pub lk_rev: i64,
    pub generation: u64,
}

/// What a revocation of one of the proxy's leasing keys asks.
#[derive(Debug, PartialEq, Eq)]
pub enum Revoked {
    /// The key was held under this leasing key: it is no longer served; delete the leasing key.
    Release(Released),
    /// The key is being taken: the taking gives it back when its answer comes.
    Deferred,
    /// Not a key held: a leftover leasing key of the proxy's; delete it (guarded by its create
    /// revision).
    Stale,
}

/// A write of the proxy's to a key: what it guards with, and whether the key was held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Writing {
    /// The create revision of the proxy's leasing key for it (0: not held).
    pub own: i64,
    pub generation: u64,
}

/// The cache.
#[derive(Debug)]
pub struct Cache {
    map: RwLock<HashMap<Vec<u8>, Slot>>,
    bytes: Mutex<usize>,
    max_keys: usize,
    max_bytes: usize,
    /// Keys given up on another's request, and when: not taken again for a while (etcd's
    /// backoff), growing for a key revoked again soon after (a key written often is not worth
    /// holding).
    revoked: Mutex<HashMap<Vec<u8>, (Instant, Duration)>>,
    backoff: Duration,
    hand: Mutex<usize>,
}

impl Cache {
    pub fn new(max_keys: usize, max_bytes: usize, backoff: Duration) -> Cache {
        Cache {
            map: RwLock::new(HashMap::new()),
            bytes: Mutex::new(0),
            max_keys: max_keys.max(1),
            max_bytes: max_bytes.max(1),
            revoked: Mutex::new(HashMap::new()),
            backoff,
            hand: Mutex::new(0),
        }
    }

    /// A read of `key`, if the session `valid` says its generation is alive.
    pub fn lookup(&self, key: &[u8], valid: impl Fn(u64) -> bool) -> Lookup {
        let map = self.map.read();
        match map.get(key) {
            None => Lookup::Miss,
            Some(Slot::Acquiring { .. }) => Lookup::Acquiring,
            Some(Slot::Held(h)) if !valid(h.generation) => Lookup::Miss,
            Some(Slot::Held(h)) => {
                h.used.store(true, Ordering::Relaxed);
                if h.servable() {
                    Lookup::Hit(h.value.clone())
                } else {
                    Lookup::Held {
                        lk_rev: h.lk_rev,
                        epoch: h.write_epoch,
                    }
                }
            }
        }
    }

    /// Marks `key` as being taken; false if it is held or being taken already.
    pub fn begin_acquire(&self, key: &[u8]) -> bool {
        let mut map = self.map.write();
        if map.contains_key(key) {
            return false;
        }
        map.insert(key.to_vec(), Slot::Acquiring { disturbed_at: 0 });
        true
    }

    /// The taking txn failed or lost: the key is not held.
    pub fn abort_acquire(&self, key: &[u8]) {
        let mut map = self.map.write();
        if matches!(map.get(key), Some(Slot::Acquiring { .. })) {
            map.remove(key);
        }
    }

    /// The taking txn succeeded at revision `at`, creating the leasing key (so `lk_rev` =
    /// `at`) under session `generation`, and read `value` there.
    pub fn finish_acquire(
        &self,
        key: &[u8],
        lk_rev: i64,
        generation: u64,
        value: Option<KeyValue>,
        at: i64,
    ) -> Acquired {
        let mut map = self.map.write();
        match map.get(key) {
            Some(Slot::Acquiring { disturbed_at }) if *disturbed_at <= lk_rev => {}
            _ => {
                if matches!(map.get(key), Some(Slot::Acquiring { .. })) {
                    map.remove(key);
                }
                return Acquired::Disturbed;
            }
        }
        let h = Held {
            lk_rev,
            generation,
            value,
            known_at: at,
            latest_event: 0,
            writers: 0,
            write_epoch: 0,
            used: AtomicBool::new(true),
        };
        *self.bytes.lock() += h.bytes(key);
        map.insert(key.to_vec(), Slot::Held(h));
        Acquired::Held
    }

    /// A revocation (`REVOKE` put) of the proxy's leasing key for `key`, created at
    /// `create_rev`, seen at `mod_rev`. A released key is no longer served when this returns.
    pub fn on_revoke(&self, key: &[u8], create_rev: i64, mod_rev: i64) -> Revoked {
        let mut map = self.map.write();
        match map.get_mut(key) {
            Some(Slot::Acquiring { disturbed_at }) => {
                *disturbed_at = (*disturbed_at).max(mod_rev);
                Revoked::Deferred
            }
            Some(Slot::Held(h)) if h.lk_rev == create_rev => {
                match remove_held(&mut map, key, &self.bytes) {
                    Some(r) => Revoked::Release(r),
                    None => Revoked::Stale,
                }
            }
            _ => Revoked::Stale,
        }
    }

    /// The proxy's leasing key for `key` was deleted at `mod_rev` (not by the proxy: it stops
    /// holding a key before it deletes the leasing key). True if the key was held.
    pub fn on_lk_deleted(&self, key: &[u8], mod_rev: i64) -> bool {
        let mut map = self.map.write();
        match map.get_mut(key) {
            Some(Slot::Acquiring { disturbed_at }) => {
                *disturbed_at = (*disturbed_at).max(mod_rev);
                false
            }
            Some(Slot::Held(h)) if h.lk_rev < mod_rev => {
                remove_held(&mut map, key, &self.bytes);
                true
            }
            _ => false,
        }
    }

    /// A watch showed `key` written at `mod_rev`: unless the value is known at that revision
    /// or later (the proxy's own write), it is no longer served. True if that made a held
    /// key unservable.
    pub fn on_key_event(&self, key: &[u8], mod_rev: i64) -> bool {
        let mut map = self.map.write();
        let Some(Slot::Held(h)) = map.get_mut(key) else {
            return false;
        };
        h.latest_event = h.latest_event.max(mod_rev);
        h.writers == 0 && h.known_at < mod_rev
    }

    /// A write of the proxy's to `key` begins: no answers from the cache for it until
    /// [`Cache::end_write`].
    pub fn begin_write(&self, key: &[u8]) -> Writing {
        let mut map = self.map.write();
        match map.get_mut(key) {
            Some(Slot::Held(h)) => {
                h.writers += 1;
                h.write_epoch += 1;
                Writing {
                    own: h.lk_rev,
                    generation: h.generation,
                }
            }
            _ => Writing {
                own: 0,
                generation: 0,
            },
        }
    }

    /// The write `w` to `key` ended. `outcome`: the key's value and the revision it is known
    /// at, if the write succeeded with the leasing key still the proxy's; `None` leaves the
    /// value unknown (the next read asks the cluster). Returns the key given up, when the
    /// outcome was [`WriteOutcome::Lost`].
    pub fn end_write(&self, key: &[u8], w: Writing, outcome: WriteOutcome) -> Option<Released> {
        let mut map = self.map.write();
        let Some(Slot::Held(h)) = map.get_mut(key) else {
            return None;
        };
        if h.lk_rev != w.own || w.own == 0 {
            return None;
        }
        h.writers = h.writers.saturating_sub(1);
        match outcome {
            WriteOutcome::Known { value, at } => {
                if at > h.known_at {
                    let before = h.bytes(key);
                    h.value = value;
                    h.known_at = at;
                    let after = h.bytes(key);
                    let mut b = self.bytes.lock();
                    *b = (*b + after).saturating_sub(before);
                }
                None
            }
            WriteOutcome::Unknown { at } => {
                // Known again only from a read at `at` or later.
                h.latest_event = h.latest_event.max(at);
                None
            }
            WriteOutcome::NotApplied => None,
            WriteOutcome::Lost => remove_held(&mut map, key, &self.bytes),
        }
    }

    /// A read answered by the cluster at revision `at` with `value`, sent while the key was
    /// held as `lk_rev` with write epoch `epoch`: the value, if the key is still held so and
    /// no write of the proxy's began since.
    pub fn learn(&self, key: &[u8], lk_rev: i64, epoch: u64, value: Option<KeyValue>, at: i64) {
        let mut map = self.map.write();
        let Some(Slot::Held(h)) = map.get_mut(key) else {
            return;
        };
        if h.lk_rev != lk_rev || h.write_epoch != epoch || h.writers != 0 || at <= h.known_at {
            return;
        }
        if at < h.latest_event {
            return;
        }
        let before = h.bytes(key);
        h.value = value;
        h.known_at = at;
        let after = h.bytes(key);
        let mut b = self.bytes.lock();
        *b = (*b + after).saturating_sub(before);
    }

    /// Stops holding `key`: what it was held as, if it was.
    pub fn remove(&self, key: &[u8]) -> Option<Released> {
        let mut map = self.map.write();
        remove_held(&mut map, key, &self.bytes)
    }

    /// The create revision of the proxy's leasing key for `key`, if held.
    pub fn held_as(&self, key: &[u8]) -> Option<i64> {
        match self.map.read().get(key) {
            Some(Slot::Held(h)) => Some(h.lk_rev),
            _ => None,
        }
    }

    /// Every key held, with what it was held as; the cache is left empty (keys being taken
    /// stay: their taking is of a session that is gone, or ends as any other).
    pub fn drain(&self) -> Vec<(Vec<u8>, Released)> {
        let mut map = self.map.write();
        let keys: Vec<Vec<u8>> = map
            .iter()
            .filter(|(_, s)| matches!(s, Slot::Held(_)))
            .map(|(k, _)| k.clone())
            .collect();
        keys.into_iter()
            .filter_map(|k| remove_held(&mut map, &k, &self.bytes).map(|r| (k, r)))
            .collect()
    }

    /// The held keys in `[key, end)` (etcd's range conventions; `end` empty: `key` alone;
    /// `[0]`: every key from `key`).
    pub fn held_in(&self, key: &[u8], end: &[u8]) -> Vec<Vec<u8>> {
        let map = self.map.read();
        if end.is_empty() {
            return map
                .get_key_value(key)
                .filter(|(_, s)| matches!(s, Slot::Held(_)))
                .map(|(k, _)| vec![k.clone()])
                .unwrap_or_default();
        }
        map.iter()
            .filter(|(_, s)| matches!(s, Slot::Held(_)))
            .map(|(k, _)| k)
            .filter(|k| in_range(k, key, end))
            .cloned()
            .collect()
    }

    /// Keys held (or being taken).
    pub fn keys(&self) -> usize {
        self.map.read().len()
    }

    /// Bytes the held values take (an estimate: keys, values and bookkeeping).
    pub fn bytes(&self) -> usize {
        *self.bytes.lock()
    }

    /// Whether one more key fits.
    pub fn has_room(&self) -> bool {
        self.keys() < self.max_keys && self.bytes() < self.max_bytes
    }

    /// A held key to give up for room: the first the hand finds not read since it last
    /// passed.
    pub fn victim(&self) -> Option<Vec<u8>> {
        let map = self.map.read();
        let keys: Vec<(&Vec<u8>, &Held)> = map
            .iter()
            .filter_map(|(k, s)| match s {
                Slot::Held(h) => Some((k, h)),
                Slot::Acquiring { .. } => None,
            })
            .collect();
        if keys.is_empty() {
            return None;
        }
        let mut hand = self.hand.lock();
        for _ in 0..2 * keys.len() {
            *hand = (*hand + 1) % keys.len();
            let (k, h) = keys[*hand];
            if !h.used.swap(false, Ordering::Relaxed) {
                return Some(k.clone());
            }
        }
        Some(keys[0].0.clone())
    }

    /// `key` was given up on another's request, or could not be taken (another holds it, or
    /// it has a lease): not taken again for the backoff, doubled (up to 32 times) when it
    /// happens again within twice its last backoff.
    pub fn backoff(&self, key: &[u8]) {
        let mut r = self.revoked.lock();
        let now = Instant::now();
        if r.len() > 100_000 {
            r.retain(|_, (t, d)| now.duration_since(*t) < *d * 2);
        }
        let next = match r.get(key) {
            Some((t, d)) if now.duration_since(*t) < *d * 2 => (*d * 2).min(self.backoff * 32),
            _ => self.backoff,
        };
        r.insert(key.to_vec(), (now, next));
    }

    /// Whether `key` may be taken now (not given up within its backoff).
    pub fn may_acquire(&self, key: &[u8]) -> bool {
        self.revoked
            .lock()
            .get(key)
            .is_none_or(|(t, d)| t.elapsed() >= *d)
    }
}

/// How a write of the proxy's to a held key ended (see [`Cache::end_write`]).
#[derive(Debug)]
pub enum WriteOutcome {
    /// Applied, with the leasing key still the proxy's: the key's value at revision `at`.
    Known { value: Option<KeyValue>, at: i64 },
    /// Applied at `at`, the value not known from the answer (a txn).
    Unknown { at: i64 },
    /// Certainly not applied (its guard failed).
    NotApplied,
    /// Failed in a way that leaves it unknown whether, or when, it applies; or the leasing
    /// key is no longer the proxy's.
    Lost,
}

fn remove_held(
    map: &mut HashMap<Vec<u8>, Slot>,
    key: &[u8],
    bytes: &Mutex<usize>,
) -> Option<Released> {
    match map.get(key) {
        Some(Slot::Held(_)) => {}
        _ => return None,
    }
    let Some(Slot::Held(h)) = map.remove(key) else {
        return None;
    };
    let mut b = bytes.lock();
    *b = b.saturating_sub(h.bytes(key));
    Some(Released {
        lk_rev: h.lk_rev,
        generation: h.generation,
    })
}

/// Whether `k` is in `[key, end)` (etcd's conventions: `end` `[0]` means no end).
pub fn in_range(k: &[u8], key: &[u8], end: &[u8]) -> bool {
    match end {
        [] => k == key,
        [0] => k >= key,
        e => k >= key && k < e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(k: &str, v: &str, rev: i64) -> Option<KeyValue> {
        Some(KeyValue {
            key: k.into(),
            value: v.into(),
            mod_revision: rev,
            create_revision: rev,
            version: 1,
            lease: 0,
        })
    }

    fn cache() -> Cache {
        Cache::new(10, 1 << 20, Duration::from_millis(100))
    }

    fn held(c: &Cache, key: &str, lk_rev: i64, value: Option<KeyValue>) {
        assert!(c.begin_acquire(key.as_bytes()));
        assert_eq!(
            c.finish_acquire(key.as_bytes(), lk_rev, 1, value, lk_rev),
            Acquired::Held
        );
    }

    fn hit(c: &Cache, key: &str) -> Option<Option<KeyValue>> {
        match c.lookup(key.as_bytes(), |g| g == 1) {
            Lookup::Hit(v) => Some(v),
            _ => None,
        }
    }

    #[test]
    fn a_held_key_is_served_while_its_session_lives() {
        let c = cache();
        held(&c, "a", 6, kv("a", "1", 5));
        held(&c, "gone", 7, None);
        assert_eq!(hit(&c, "a").unwrap().unwrap().value, b"1");
        assert_eq!(hit(&c, "gone"), Some(None));
        assert_eq!(c.lookup(b"a", |_| false), Lookup::Miss, "session not alive");
        assert_eq!(c.lookup(b"b", |_| true), Lookup::Miss);
        assert_eq!(c.held_as(b"a"), Some(6));
        assert_eq!(c.remove(b"a").map(|r| r.lk_rev), Some(6));
        assert_eq!(
            c.remove(b"gone").map(|r| (r.lk_rev, r.generation)),
            Some((7, 1))
        );
        assert_eq!((c.keys(), c.bytes()), (0, 0));
    }

    #[test]
    fn no_answer_from_the_cache_while_a_write_of_the_proxys_is_in_flight() {
        let c = cache();
        held(&c, "a", 6, kv("a", "1", 5));
        let w = c.begin_write(b"a");
        assert_eq!(w.own, 6);
        assert!(matches!(
            c.lookup(b"a", |_| true),
            Lookup::Held {
                lk_rev: 6,
                epoch: 1
            }
        ));
        // A read answered by the cluster meanwhile teaches nothing: the write may be before
        // or after it.
        c.learn(b"a", 6, 1, kv("a", "0", 4), 7);
        assert!(hit(&c, "a").is_none());
        let outcome = WriteOutcome::Known {
            value: kv("a", "2", 9),
            at: 9,
        };
        assert_eq!(c.end_write(b"a", w, outcome), None);
        assert_eq!(hit(&c, "a").unwrap().unwrap().value, b"2");
    }

    #[test]
    fn a_write_that_may_apply_later_gives_the_key_up() {
        let c = cache();
        held(&c, "a", 6, kv("a", "1", 5));
        let w = c.begin_write(b"a");
        assert_eq!(
            c.end_write(b"a", w, WriteOutcome::Lost).map(|r| r.lk_rev),
            Some(6)
        );
        assert_eq!(c.lookup(b"a", |_| true), Lookup::Miss);
        assert_eq!(c.bytes(), 0);
    }

    #[test]
    fn a_txn_leaves_the_value_unknown_until_a_read_after_it() {
        let c = cache();
        held(&c, "a", 6, kv("a", "1", 5));
        let w = c.begin_write(b"a");
        c.end_write(b"a", w, WriteOutcome::Unknown { at: 10 });
        let Lookup::Held { lk_rev, epoch } = c.lookup(b"a", |_| true) else {
            panic!("servable after a txn")
        };
        // A read from before the txn's revision is not the value.
        c.learn(b"a", lk_rev, epoch, kv("a", "1", 5), 9);
        assert!(hit(&c, "a").is_none());
        c.learn(b"a", lk_rev, epoch, kv("a", "3", 10), 10);
        assert_eq!(hit(&c, "a").unwrap().unwrap().value, b"3");
    }

    #[test]
    fn a_write_seen_by_the_watch_stops_the_answers_unless_it_was_the_proxys() {
        let c = cache();
        held(&c, "a", 6, kv("a", "1", 5));
        // The proxy's own write, seen by the watch after its answer.
        let w = c.begin_write(b"a");
        c.end_write(
            b"a",
            w,
            WriteOutcome::Known {
                value: kv("a", "2", 8),
                at: 8,
            },
        );
        assert!(!c.on_key_event(b"a", 8));
        assert!(hit(&c, "a").is_some());
        // A write that bypassed the protocol.
        assert!(c.on_key_event(b"a", 11));
        assert!(hit(&c, "a").is_none());
        // Seen during a write of the proxy's that applied before it: still not served.
        let c = cache();
        held(&c, "b", 6, kv("b", "1", 5));
        let w = c.begin_write(b"b");
        c.on_key_event(b"b", 12);
        c.end_write(
            b"b",
            w,
            WriteOutcome::Known {
                value: kv("b", "2", 9),
                at: 9,
            },
        );
        assert!(hit(&c, "b").is_none());
    }

    #[test]
    fn a_revocation_before_the_taking_answer_refuses_the_key() {
        let c = cache();
        assert!(c.begin_acquire(b"a"));
        assert!(!c.begin_acquire(b"a"), "taken twice at once");
        assert_eq!(c.lookup(b"a", |_| true), Lookup::Acquiring);
        // The REVOKE of the leasing key the taking txn is creating (at 7), seen first.
        assert_eq!(c.on_revoke(b"a", 7, 9), Revoked::Deferred);
        assert_eq!(
            c.finish_acquire(b"a", 7, 1, kv("a", "1", 5), 7),
            Acquired::Disturbed
        );
        assert_eq!(c.lookup(b"a", |_| true), Lookup::Miss);
        // A deletion of an older leasing key does not.
        assert!(c.begin_acquire(b"a"));
        assert!(!c.on_lk_deleted(b"a", 6));
        assert_eq!(
            c.finish_acquire(b"a", 7, 1, kv("a", "1", 5), 7),
            Acquired::Held
        );
        // Held: a REVOKE of this leasing key releases it; of another, is a leftover's.
        assert_eq!(c.on_revoke(b"a", 3, 12), Revoked::Stale);
        assert!(matches!(c.on_revoke(b"a", 7, 12), Revoked::Release(r) if r.lk_rev == 7));
        assert_eq!(c.lookup(b"a", |_| true), Lookup::Miss);
        assert_eq!(c.on_revoke(b"zzz", 7, 12), Revoked::Stale);
    }

    #[test]
    fn the_leasing_key_deleted_by_another_lets_the_key_go() {
        let c = cache();
        held(&c, "a", 6, kv("a", "1", 5));
        assert!(c.on_lk_deleted(b"a", 9));
        assert_eq!(c.lookup(b"a", |_| true), Lookup::Miss);
    }

    #[test]
    fn the_coldest_key_goes_first_and_a_key_revoked_often_waits_longer() {
        let c = Cache::new(2, 1 << 20, Duration::from_millis(50));
        held(&c, "hot", 2, kv("hot", "v", 1));
        held(&c, "cold", 3, kv("cold", "v", 1));
        assert!(!c.has_room());
        // Both start used: one pass of the hand clears them; a read of "hot" keeps it.
        let _ = c.victim();
        let _ = c.lookup(b"hot", |_| true);
        assert_eq!(c.victim().unwrap(), b"cold");
        c.backoff(b"cold");
        assert!(!c.may_acquire(b"cold"));
        std::thread::sleep(Duration::from_millis(60));
        assert!(c.may_acquire(b"cold"));
        // Revoked again soon after: twice as long.
        c.backoff(b"cold");
        std::thread::sleep(Duration::from_millis(60));
        assert!(!c.may_acquire(b"cold"));
        std::thread::sleep(Duration::from_millis(50));
        assert!(c.may_acquire(b"cold"));
    }

    #[test]
    fn the_byte_bound_counts_values() {
        let c = Cache::new(100, 600, Duration::from_millis(50));
        held(&c, "a", 2, kv("a", &"x".repeat(300), 1));
        assert!(c.has_room());
        held(&c, "b", 3, kv("b", &"x".repeat(300), 1));
        assert!(!c.has_room());
        c.remove(b"a");
        assert!(c.has_room());
        assert_eq!(c.held_in(b"a", b"c"), [b"b".to_vec()]);
        assert_eq!(c.held_in(b"b", b""), [b"b".to_vec()]);
        assert!(c.held_in(b"c", &[0]).is_empty());
        let drained = c.drain();
        assert_eq!(drained.len(), 1);
        assert_eq!(
            (drained[0].0.as_slice(), drained[0].1.lk_rev),
            (&b"b"[..], 3)
        );
        assert_eq!(c.bytes(), 0);
    }
}
