//! Leases (etcd's lessor): grants with a TTL, keys attached to them, renewals and expiry.
//!
//! Grants, revocations and checkpoints are replicated writes ([`Writer`] methods) and persist in
//! the `lease` bucket with the flush that carries them. The clock is not replicated: only the
//! member that is *primary* (the raft leader) runs expiry clocks, and it only *reports* expired
//! leases ([`Store::expired_leases`]) — the server revokes them through consensus. A member
//! becoming primary (or restarting) gives every lease its remaining TTL afresh, as etcd does.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use api::etcdserverpb::{
    DeleteRangeRequest, LeaseGrantResponse, LeaseLeasesResponse, LeaseRevokeResponse, LeaseStatus,
    LeaseTimeToLiveResponse,
};

use ids::LeaseId;

use crate::error::{Error, Result};
use crate::kv::header;
use crate::store::{Store, Writer};

/// etcd's largest TTL (seconds).
pub const MAX_LEASE_TTL: i64 = 9_000_000_000;

/// A renewal's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewed {
    /// The lease's TTL, which its clock restarted from.
    pub ttl: i64,
    /// It had a checkpointed remaining TTL, which every member must now forget.
    pub checkpointed: bool,
}

/// One granted lease.
#[derive(Debug, Clone, Default)]
pub(crate) struct Lease {
    /// The granted TTL (seconds; at least the minimum).
    pub(crate) ttl: i64,
    /// The TTL left at the last checkpoint (0 = none): what a new primary restarts from.
    pub(crate) remaining: i64,
    /// When it expires, on the primary; None elsewhere.
    pub(crate) expiry: Option<Instant>,
    pub(crate) keys: HashSet<Vec<u8>>,
}

impl Lease {
    /// The persisted form: etcd's `leasepb.Lease` (id, TTL, checkpointed remaining TTL).
    pub(crate) fn encode(&self, id: LeaseId) -> Vec<u8> {
        prost::Message::encode_to_vec(&api::leasepb::Lease {
            id: id.0,
            ttl: self.ttl,
            remaining_ttl: self.remaining,
        })
    }

    /// A persisted lease: etcd's form, or the 16 bytes (TTL and remaining TTL, big-endian)
    /// kvd wrote before it kept etcd's. The two never look alike: a protobuf message does not
    /// start with a zero byte, and a TTL below 2^56 seconds does.
    pub(crate) fn decode(v: &[u8]) -> Option<Lease> {
        let (ttl, remaining) = match v {
            [0, ..] if v.len() == 16 => (
                i64::from_be_bytes(v[..8].try_into().ok()?),
                i64::from_be_bytes(v[8..].try_into().ok()?),
            ),
            _ => {
                let l: api::leasepb::Lease = prost::Message::decode(v).ok()?;
                (l.ttl, l.remaining_ttl)
            }
        };
        Some(Lease {
            ttl,
            remaining,
            ..Default::default()
        })
    }

    fn refresh(&mut self, now: Instant, extend: Duration) {
        let secs = if self.remaining > 0 {
            self.remaining
        } else {
            self.ttl
        };
        self.expiry = Some(now + extend + Duration::from_secs(secs.max(0) as u64));
    }
}

/// The leases and the key → lease attachments.
#[derive(Debug, Default)]
pub(crate) struct Lessor {
    pub(crate) leases: BTreeMap<LeaseId, Lease>,
    key_lease: HashMap<Vec<u8>, LeaseId>,
    /// Whether this member runs expiry clocks.
    primary: bool,
    /// Leases granted, changed or revoked since the last flush (None = revoked).
    pub(crate) dirty: BTreeMap<LeaseId, Option<Vec<u8>>>,
    /// The smallest TTL a grant gets (etcd: 1.5 election timeouts, rounded up; 2 s by default).
    pub(crate) min_ttl: i64,
}

impl Lessor {
    pub(crate) fn new(min_ttl: i64) -> Lessor {
        Lessor {
            min_ttl,
            ..Default::default()
        }
    }

    pub(crate) fn contains(&self, id: LeaseId) -> bool {
        self.leases.contains_key(&id)
    }

    pub(crate) fn attach(&mut self, id: LeaseId, key: &[u8]) {
        if let Some(l) = self.leases.get_mut(&id) {
            l.keys.insert(key.to_vec());
            self.key_lease.insert(key.to_vec(), id);
        }
    }

    /// Detaches `key` from its lease, if it has one.
    pub(crate) fn detach(&mut self, key: &[u8]) {
        if self.key_lease.is_empty() {
            return;
        }
        if let Some(id) = self.key_lease.remove(key) {
            if let Some(l) = self.leases.get_mut(&id) {
                l.keys.remove(key);
            }
        }
    }

    /// Restores a persisted lease at open.
    pub(crate) fn restore(&mut self, id: LeaseId, lease: Lease) {
        self.leases.insert(id, lease);
    }
}

fn lease_keys(le: &Lessor, id: LeaseId) -> Option<Vec<Vec<u8>>> {
    let mut keys: Vec<Vec<u8>> = le.leases.get(&id)?.keys.iter().cloned().collect();
    keys.sort();
    Some(keys)
}

impl Writer<'_> {
    /// The keys attached to lease `id` as this writer left them (None: no such lease).
    pub fn lease_keys(&self, id: LeaseId) -> Option<Vec<Vec<u8>>> {
        lease_keys(&self.inner().lessor.lock(), id)
    }

    /// LeaseGrant: `id` is chosen by the proposer (nonzero); a TTL below the minimum is raised
    /// to it.
    pub fn lease_grant(&mut self, id: LeaseId, ttl: i64) -> Result<LeaseGrantResponse> {
        if id == LeaseId::NONE {
            return Err(Error::LeaseNotFound);
        }
        if ttl > MAX_LEASE_TTL {
            return Err(Error::LeaseTtlTooLarge);
        }
        let rev = self.state().rev;
        let mut le = self.inner().lessor.lock();
        if le.contains(id) {
            return Err(Error::LeaseExists);
        }
        let mut lease = Lease {
            ttl: ttl.max(le.min_ttl),
            ..Default::default()
        };
        if le.primary {
            lease.refresh(Instant::now(), Duration::ZERO);
        }
        let ttl = lease.ttl;
        le.dirty.insert(id, Some(lease.encode(id)));
        le.leases.insert(id, lease);
        Ok(LeaseGrantResponse {
            header: header(rev),
            id: id.0,
            ttl,
            error: String::new(),
        })
    }

    /// LeaseRevoke: deletes every key attached to the lease in one revision, then the lease.
    pub fn lease_revoke(&mut self, id: LeaseId) -> Result<LeaseRevokeResponse> {
        let mut keys: Vec<Vec<u8>> = {
            let le = self.inner().lessor.lock();
            let lease = le.leases.get(&id).ok_or(Error::LeaseNotFound)?;
            lease.keys.iter().cloned().collect()
        };
        keys.sort();
        let reqs: Vec<_> = keys
            .into_iter()
            .map(|key| DeleteRangeRequest {
                key,
                ..Default::default()
            })
            .collect();
        self.delete_keys(&reqs)?;
        let rev = self.state().rev;
        let mut le = self.inner().lessor.lock();
        le.leases.remove(&id);
        le.dirty.insert(id, None);
        Ok(LeaseRevokeResponse {
            header: header(rev),
        })
    }

    /// LeaseCheckpoint: records a lease's remaining TTL so a new primary does not restart it
    /// from the full TTL.
    pub fn lease_checkpoint(&mut self, id: LeaseId, remaining: i64) -> Result<()> {
        let mut le = self.inner().lessor.lock();
        let lease = le.leases.get_mut(&id).ok_or(Error::LeaseNotFound)?;
        lease.remaining = remaining;
        let enc = lease.encode(id);
        le.dirty.insert(id, Some(enc));
        Ok(())
    }
}

impl Store {
    /// LeaseKeepAlive on the primary: restarts the lease's clock. A lease with a checkpointed
    /// remaining TTL restarts from its full TTL here at once; the server clears the checkpoint
    /// on every member through consensus (`Renewed::checkpointed`), as etcd does.
    pub fn lease_renew(&self, id: LeaseId, now: Instant) -> Result<Renewed> {
        let mut le = self.inner.lessor.lock();
        let primary = le.primary;
        let lease = le.leases.get_mut(&id).ok_or(Error::LeaseNotFound)?;
        if primary && lease.expiry.is_some_and(|e| e <= now) {
            return Err(Error::LeaseNotFound);
        }
        let checkpointed = lease.remaining > 0;
        lease.remaining = 0;
        if primary {
            lease.expiry = Some(now + Duration::from_secs(lease.ttl as u64));
        }
        Ok(Renewed {
            ttl: lease.ttl,
            checkpointed,
        })
    }

    /// LeaseTimeToLive: remaining and granted TTL, and the keys when asked; TTL -1 for a lease
    /// that does not exist (etcd answers so rather than failing).
    pub fn lease_time_to_live(
        &self,
        id: LeaseId,
        keys: bool,
        now: Instant,
    ) -> LeaseTimeToLiveResponse {
        let rev = self.rev().0;
        let le = self.inner.lessor.lock();
        let Some(lease) = le.leases.get(&id) else {
            return LeaseTimeToLiveResponse {
                header: header(rev),
                id: id.0,
                ttl: -1,
                ..Default::default()
            };
        };
        let ttl = match lease.expiry {
            Some(e) => e.saturating_duration_since(now).as_secs() as i64,
            None if lease.remaining > 0 => lease.remaining,
            None => lease.ttl,
        };
        let mut ks: Vec<Vec<u8>> = if keys {
            lease.keys.iter().cloned().collect()
        } else {
            Vec::new()
        };
        ks.sort();
        LeaseTimeToLiveResponse {
            header: header(rev),
            id: id.0,
            ttl,
            granted_ttl: lease.ttl,
            keys: ks,
        }
    }

    /// The keys attached to lease `id`, sorted (None: no such lease).
    pub fn lease_keys(&self, id: LeaseId) -> Option<Vec<Vec<u8>>> {
        lease_keys(&self.inner.lessor.lock(), id)
    }

    /// Whether lease `id` exists (as applied here).
    pub fn lease_exists(&self, id: LeaseId) -> bool {
        self.inner.lessor.lock().leases.contains_key(&id)
    }

    /// LeaseLeases: every lease id.
    pub fn leases(&self) -> LeaseLeasesResponse {
        let rev = self.rev().0;
        let le = self.inner.lessor.lock();
        let leases = le
            .leases
            .keys()
            .map(|id| LeaseStatus { id: id.0 })
            .collect();
        LeaseLeasesResponse {
            header: header(rev),
            leases,
        }
    }

    /// Up to `limit` leases whose clock ran out by `now` (primary only): the server proposes
    /// their revocation.
    pub fn expired_leases(&self, now: Instant, limit: usize) -> Vec<LeaseId> {
        let le = self.inner.lessor.lock();
        if !le.primary {
            return Vec::new();
        }
        le.leases
            .iter()
            .filter(|(_, l)| l.expiry.is_some_and(|e| e <= now))
            .map(|(&id, _)| id)
            .take(limit)
            .collect()
    }

    /// This member became primary: every lease's clock starts at its remaining TTL (checkpointed
    /// or full) plus `extend` (etcd extends by an election timeout after a leader change).
    pub fn lease_promote(&self, now: Instant, extend: Duration) {
        let mut le = self.inner.lessor.lock();
        le.primary = true;
        for l in le.leases.values_mut() {
            l.refresh(now, extend);
        }
    }

    /// This member is no longer primary: clocks stop.
    pub fn lease_demote(&self) {
        let mut le = self.inner.lessor.lock();
        le.primary = false;
        for l in le.leases.values_mut() {
            l.expiry = None;
        }
    }

    /// The remaining TTL of each lease with a running clock, for checkpoints.
    pub fn lease_remaining(&self, now: Instant) -> Vec<(LeaseId, i64)> {
        let le = self.inner.lessor.lock();
        le.leases
            .iter()
            .filter_map(|(&id, l)| {
                Some((
                    id,
                    l.expiry?.saturating_duration_since(now).as_secs() as i64,
                ))
            })
            .collect()
    }
}
