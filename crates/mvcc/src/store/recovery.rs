//! Opening a store's file: the index rebuilt from the `key` bucket, the leases and their keys,
//! the meta bucket's revisions and consensus position.

use std::collections::HashMap;
use std::path::Path;

use ids::{LeaseId, RaftIndex};

use super::layout::{
    be_i64, compact_rev, corrupt, CONSISTENT_INDEX, FINISHED_COMPACT, KEY_BUCKET, LEASE_BUCKET,
    META_BUCKET, SCHEDULED_COMPACT, TERM,
};
use super::open::Applied;
use crate::error::Result;
use crate::index::Index;
use crate::lease::{Lease, Lessor};
use crate::revision::Rev;

/// What a store's file holds besides its revisions' values.
pub(super) struct Recovered {
    pub(super) index: Index,
    /// The newest revision stored (at least the compaction revisions).
    pub(super) rev: i64,
    /// The revision the last finished compaction reached (-1 before any).
    pub(super) finished_compaction: i64,
    /// The revision of the last compaction scheduled, finished or not (-1 before any).
    pub(super) scheduled_compaction: i64,
    pub(super) applied: Applied,
    /// The leases, with the keys attached to them.
    pub(super) lessor: Lessor,
}

/// Rebuilds the index from the `key` bucket and the leases from theirs; reads the meta bucket.
/// The map's resident pages are released after every `release_every` bytes of revisions read.
pub(super) fn restore(db: &pager::Db, path: &Path, release_every: usize) -> Result<Recovered> {
    let tx = db.begin_read()?;
    let meta = tx.bucket(META_BUCKET)?;
    // A meta value, parsed by `parse`; `what` it should be, for the error.
    let read = |k: &[u8], parse: fn(&[u8]) -> Option<i64>, what: &str| -> Result<Option<i64>> {
        match meta.get(k)? {
            None => Ok(None),
            Some(v) => parse(v).map(Some).ok_or_else(|| {
                let k = String::from_utf8_lossy(k);
                corrupt(path, format!("meta value {k} is not {what}"))
            }),
        }
    };
    let read_i64 = |k: &[u8]| read(k, be_i64, "8 bytes");
    let read_rev = |k: &[u8]| read(k, compact_rev, "a revision");
    let compacted = read_rev(FINISHED_COMPACT)?.unwrap_or(-1);
    let scheduled = read_rev(SCHEDULED_COMPACT)?.unwrap_or(-1);
    let applied = Applied {
        index: RaftIndex(read_i64(CONSISTENT_INDEX)?.map_or(0, |v| v as u64)),
        term: read_i64(TERM)?.map_or(0, |v| v as u64),
    };
    let mut lessor = Lessor::new(0);
    for e in tx.bucket(LEASE_BUCKET)?.iter() {
        let (k, v) = e?;
        let id = be_i64(k)
            .map(LeaseId)
            .ok_or_else(|| corrupt(path, format!("lease bucket key {k:?} is not an id")))?;
        let lease =
            Lease::decode(v).ok_or_else(|| corrupt(path, format!("lease {id} is damaged")))?;
        lessor.restore(id, lease);
    }
    let mut key_lease: HashMap<Vec<u8>, LeaseId> = HashMap::new();
    let mut index = Index::new();
    let mut rev = 1;
    // Each release walks the whole map's page tables: at most 64 of them, however large the
    // file (a fixed step would cost the square of its size).
    let release_every = release_every.max(usize::try_from(db.space().size / 64).unwrap_or(0));
    let mut read = 0;
    for e in tx.bucket(KEY_BUCKET)?.iter() {
        let (k, v) = e?;
        read += k.len() + v.len();
        if read >= release_every {
            // The pages read so far, and those the kernel mapped around them, leave this
            // process (they stay in the page cache).
            read = 0;
            if let Err(e) = db.release_resident() {
                tracing::debug!("during the index rebuild: {e}");
            }
        }
        let (r, tomb) = Rev::from_key(k)
            .ok_or_else(|| corrupt(path, format!("key bucket entry {k:?} is not a revision")))?;
        let kv = Indexed::decode(v).map_err(|e| {
            corrupt(
                path,
                format!("revision {r:?} does not hold a KeyValue: {e}"),
            )
        })?;
        if tomb {
            index.restore_tombstone(kv.key, r);
            key_lease.remove(kv.key);
        } else {
            index.restore_put(kv.key, r, kv.create_revision, kv.version);
            if kv.lease != 0 {
                key_lease.insert(kv.key.to_vec(), LeaseId(kv.lease));
            } else {
                key_lease.remove(kv.key);
            }
        }
        rev = r.main;
    }
    for (key, id) in key_lease {
        lessor.attach(id, &key);
    }
    drop(tx);
    index.pack();
    // None of the pages the scan read is needed in memory for that.
    if let Err(e) = db.release_resident() {
        tracing::debug!("after the index rebuild: {e}");
    }
    let rev = rev.max(compacted).max(scheduled);
    Ok(Recovered {
        index,
        rev,
        finished_compaction: compacted,
        scheduled_compaction: scheduled,
        applied,
        lessor,
    })
}

/// What the index needs of a stored `KeyValue`, read in place: the value is skipped by its
/// length, not copied (`KeyValue::decode` copied every value, the whole database in a restart;
/// the kernel's read-ahead still brings the value's pages in). Accepts exactly what
/// `KeyValue::decode` accepts.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Indexed<'a> {
    key: &'a [u8],
    create_revision: i64,
    version: i64,
    lease: i64,
}

impl<'a> Indexed<'a> {
    pub(crate) fn decode(mut buf: &'a [u8]) -> std::result::Result<Self, String> {
        use prost::encoding::{decode_key, decode_varint, skip_field, DecodeContext, WireType};
        let mut kv = Indexed::default();
        while !buf.is_empty() {
            let (tag, wire) = decode_key(&mut buf).map_err(|e| e.to_string())?;
            let known = match tag {
                1 | 5 => Some(WireType::LengthDelimited),
                2 | 3 | 4 | 6 => Some(WireType::Varint),
                _ => None,
            };
            if known.is_some_and(|w| w != wire) {
                return Err(format!("field {tag} has wire type {wire:?}"));
            }
            let varint = |buf: &mut &'a [u8]| decode_varint(buf).map(|v| v as i64);
            match tag {
                1 => {
                    let len = decode_varint(&mut buf).map_err(|e| e.to_string())?;
                    let len = (usize::try_from(len).ok())
                        .filter(|&len| len <= buf.len())
                        .ok_or("the key runs past the record")?;
                    (kv.key, buf) = buf.split_at(len);
                }
                2 => kv.create_revision = varint(&mut buf).map_err(|e| e.to_string())?,
                4 => kv.version = varint(&mut buf).map_err(|e| e.to_string())?,
                6 => kv.lease = varint(&mut buf).map_err(|e| e.to_string())?,
                _ => skip_field(wire, tag, &mut buf, DecodeContext::default())
                    .map_err(|e| e.to_string())?,
            }
        }
        Ok(kv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::mvccpb::KeyValue;
    use proptest::prelude::*;
    use prost::Message;

    fn record() -> impl Strategy<Value = KeyValue> {
        let field = prop_oneof![Just(0i64), any::<i64>()];
        (
            any::<Vec<u8>>(),
            field.clone(),
            field.clone(),
            field.clone(),
            any::<Vec<u8>>(),
            field,
        )
            .prop_map(
                |(key, create_revision, mod_revision, version, value, lease)| KeyValue {
                    key,
                    create_revision,
                    mod_revision,
                    version,
                    value,
                    lease,
                },
            )
    }

    proptest! {
        /// Read in place, a stored record gives the index what a full decode gives.
        #[test]
        fn the_fields_are_the_decoded_ones(kv in record()) {
            let buf = kv.encode_to_vec();
            let got = Indexed::decode(&buf).unwrap();
            prop_assert_eq!(got, Indexed {
                key: &kv.key,
                create_revision: kv.create_revision,
                version: kv.version,
                lease: kv.lease,
            });
        }

        /// Damaged records: refused exactly when a full decode refuses them, and read alike
        /// when it does not.
        #[test]
        fn damage_is_refused_as_a_full_decode_refuses_it(
            kv in record(),
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
            cut in any::<prop::sample::Index>(),
            tail in proptest::collection::vec(any::<u8>(), 0..6),
        ) {
            let mut buf = kv.encode_to_vec();
            if !buf.is_empty() {
                for (at, byte) in edits {
                    let i = at.index(buf.len());
                    buf[i] = byte;
                }
                buf.truncate(cut.index(buf.len() + 1));
            }
            buf.extend(tail);
            match (KeyValue::decode(buf.as_slice()), Indexed::decode(&buf)) {
                (Ok(full), Ok(got)) => prop_assert_eq!(got, Indexed {
                    key: &full.key,
                    create_revision: full.create_revision,
                    version: full.version,
                    lease: full.lease,
                }),
                (Err(_), Err(_)) => {}
                (full, got) => prop_assert!(false, "full decode {full:?}, in place {got:?}"),
            }
        }
    }
}
