//! etcd's data file — a bbolt file with etcd's buckets — into a store, and a store out as one.
//!
//! The store keeps etcd's schema in its pager file: the same buckets, keys and values (see
//! `store::layout`). Moving between the two is copying entries from one B+tree format into the
//! other — checking on the way in that the file holds nothing but etcd's schema, and adding on
//! the way out what etcd keeps in its file and kvd keeps elsewhere: the member list, the raft
//! configuration and the versions ([`EtcdMeta`]).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};
use crate::revision::Rev;
use crate::store::{Store, CLUSTER_BUCKET, KEY_BUCKET, META_BUCKET};

/// The buckets an etcd 3.4–3.7 data file holds (bbolt keeps them sorted).
pub const ETCD_BUCKETS: [&str; 10] = [
    "alarm",
    "auth",
    "authRoles",
    "authUsers",
    "cluster",
    "key",
    "lease",
    "members",
    "members_removed",
    "meta",
];
const MEMBERS: &[u8] = b"members";
const MEMBERS_REMOVED: &[u8] = b"members_removed";
/// Meta keys etcd writes; those the store keeps itself, and those it leaves to [`EtcdMeta`].
const META_KEPT: [&[u8]; 4] = [
    b"consistent_index",
    b"term",
    b"scheduledCompactRev",
    b"finishedCompactRev",
];
const CONF_STATE: &[u8] = b"confState";
const STORAGE_VERSION: &[u8] = b"storageVersion";
/// Cluster keys etcd writes, both kept by the store.
const CLUSTER_KEYS: [&[u8]; 2] = [crate::cluster::VERSION, crate::cluster::DOWNGRADE];

/// What an etcd data file holds that the store does not keep.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdMeta {
    /// `members`: the member id in hex → etcd's JSON of the member.
    pub members: BTreeMap<Vec<u8>, Vec<u8>>,
    /// `members_removed`: the member id in hex → `removed`.
    pub members_removed: BTreeMap<Vec<u8>, Vec<u8>>,
    /// `meta/confState`: the raft configuration, as etcd's JSON (etcd 3.5 and later).
    pub conf_state: Option<Vec<u8>>,
    /// `meta/storageVersion` (etcd 3.6 and later).
    pub storage_version: Option<String>,
    /// `cluster/clusterVersion` (etcd 3.5 and later): found on import (the store keeps it
    /// too); on export, one to write in place of the store's.
    pub cluster_version: Option<String>,
}

/// What an import found.
#[derive(Debug, Clone, Default)]
pub struct Imported {
    pub etcd: EtcdMeta,
    /// `meta/consistent_index` and `meta/term`: the raft entry the data covers.
    pub consistent_index: u64,
    pub term: u64,
    /// Entries copied, in every bucket.
    pub entries: u64,
}

fn not_etcd(path: &Path, reason: impl Into<String>) -> Error {
    Error::NotEtcd {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

fn utf8(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}

/// Builds a store's pager file at `dst` (which must not exist) from the etcd data file `src`;
/// nothing is left at `dst` unless the whole file was read and found to be etcd's. The members
/// and the raft configuration are returned, not stored (the caller's consensus keeps them).
pub fn import(src: &bbolt::Db, dst: &Path) -> Result<Imported> {
    let r = build(src, dst);
    if r.is_err() {
        let _ = std::fs::remove_file(dst);
    }
    r
}

fn build(src: &bbolt::Db, dst: &Path) -> Result<Imported> {
    let path = src.path();
    let buckets = src.buckets()?;
    for (name, _) in &buckets {
        if !ETCD_BUCKETS.contains(&utf8(name).as_str()) {
            return Err(not_etcd(
                path,
                format!(
                    "it has a bucket {:?}, which etcd does not write",
                    utf8(name)
                ),
            ));
        }
    }
    if !buckets.iter().any(|(n, _)| n == KEY_BUCKET) {
        return Err(not_etcd(path, "it has no key bucket"));
    }
    // Built front to back: etcd's buckets and keys come in order.
    let mut fill = pager::Builder::create(dst, None)?;
    let mut out = Imported::default();
    let mut walk = src.walker();
    for (name, bucket) in &buckets {
        let name = name.as_slice();
        let mut bad = None;
        if ![MEMBERS, MEMBERS_REMOVED].contains(&name) {
            fill.bucket(name)?;
        }
        let mut copy = |k: &[u8], v: &[u8]| -> Result<()> {
            out.entries += 1;
            fill.put(k, v).map_err(Error::from)
        };
        walk.for_each(bucket, &mut |k, item| {
            let bbolt::Item::Value(v) = item else {
                bad = Some(format!(
                    "bucket {:?} holds a bucket {:?}",
                    utf8(name),
                    utf8(k)
                ));
                return Ok(false);
            };
            let r = match name {
                KEY_BUCKET => match (Rev::from_key(k), crate::store::Indexed::decode(v)) {
                    (Some(_), Ok(_)) => copy(k, v),
                    (None, _) => {
                        bad = Some(format!("key bucket entry {k:?} is not a revision"));
                        return Ok(false);
                    }
                    (Some((r, _)), Err(e)) => {
                        bad = Some(format!("revision {r:?} does not hold a KeyValue: {e}"));
                        return Ok(false);
                    }
                },
                META_BUCKET if META_KEPT.contains(&k) => copy(k, v),
                META_BUCKET if k == CONF_STATE => {
                    out.etcd.conf_state = Some(v.to_vec());
                    Ok(())
                }
                META_BUCKET if k == STORAGE_VERSION => {
                    out.etcd.storage_version = Some(utf8(v));
                    Ok(())
                }
                META_BUCKET => {
                    bad = Some(format!(
                        "the meta bucket has a key {:?}, which etcd does not write",
                        utf8(k)
                    ));
                    return Ok(false);
                }
                CLUSTER_BUCKET if k == crate::cluster::VERSION => {
                    out.etcd.cluster_version = Some(utf8(v));
                    copy(k, v)
                }
                CLUSTER_BUCKET if CLUSTER_KEYS.contains(&k) => copy(k, v),
                CLUSTER_BUCKET => {
                    bad = Some(format!(
                        "the cluster bucket has a key {:?}, which etcd does not write",
                        utf8(k)
                    ));
                    return Ok(false);
                }
                MEMBERS => {
                    out.etcd.members.insert(k.to_vec(), v.to_vec());
                    Ok(())
                }
                MEMBERS_REMOVED => {
                    out.etcd.members_removed.insert(k.to_vec(), v.to_vec());
                    Ok(())
                }
                _ => copy(k, v),
            };
            // A store error ends the walk; it is returned below.
            match r {
                Ok(()) => Ok(true),
                Err(e) => {
                    bad = Some(e.to_string());
                    Ok(false)
                }
            }
        })?;
        if let Some(reason) = bad {
            return Err(not_etcd(path, reason));
        }
    }
    let meta = src.bucket(META_BUCKET)?;
    let meta_u64 = |k: &[u8]| -> Result<u64> {
        let Some(m) = &meta else { return Ok(0) };
        match src.get(m, k)? {
            None => Ok(0),
            Some(v) => <[u8; 8]>::try_from(v.as_slice())
                .map(u64::from_be_bytes)
                .map_err(|_| not_etcd(path, format!("meta {} is not 8 bytes", utf8(k)))),
        }
    };
    out.consistent_index = meta_u64(b"consistent_index")?;
    out.term = meta_u64(b"term")?;
    fill.finish()?;
    Ok(out)
}

/// A restored store file made ready for a member starting a new log: at the closed store
/// file `path`, the raft position is forgotten, and with `bump` > 0, etcdutl's
/// `--bump-revision N --mark-compacted`: an empty entry at the newest revision plus N, and a
/// compaction scheduled at it — clients see every revision they knew as compacted, and new
/// writes above them. Returns the revision bumped to.
pub fn finish_restore(path: &Path, bump: u64) -> Result<Option<i64>> {
    let db = pager::Db::open(path, pager::Options::default())?;
    let mut tx = db.begin_write()?;
    {
        let mut meta = tx.bucket(META_BUCKET)?;
        meta.delete(b"consistent_index")?;
        meta.delete(b"term")?;
    }
    let mut to = None;
    if bump > 0 {
        let latest = match tx.bucket(KEY_BUCKET)?.cursor().last()? {
            Some((k, _)) => Rev::from_key(k).map_or(0, |(r, _)| r.main),
            None => 0,
        };
        let rev = latest.saturating_add(i64::try_from(bump).unwrap_or(i64::MAX));
        tx.bucket(KEY_BUCKET)?
            .put(Rev::new(rev, 0).to_key(false).as_bytes(), &[])?;
        tx.bucket(META_BUCKET)?.put(
            b"scheduledCompactRev",
            crate::store::compact_rev_value(rev).as_bytes(),
        )?;
        to = Some(rev);
    }
    tx.commit()?;
    db.close()?;
    Ok(to)
}

/// Entries added to (`Some`) or left out of (`None`) the store's buckets, by bucket.
type Overlay = BTreeMap<Vec<u8>, BTreeMap<Vec<u8>, Option<Vec<u8>>>>;

/// A store as an etcd data file: one read snapshot of its pager file, laid out as bbolt.
#[derive(Debug)]
pub struct EtcdFile {
    txn: pager::ReadTxn,
    overlay: Overlay,
    layout: bbolt::Layout,
}

impl Store {
    /// The store as etcd's data file, with `etcd`'s members, configuration and versions.
    /// Flushed first, so it holds every applied write.
    pub fn etcd_file(&self, etcd: &EtcdMeta) -> Result<EtcdFile> {
        self.flush()?;
        let txn = self.db().begin_read()?;
        let mut overlay: Overlay = BTreeMap::new();
        let set = |o: &mut BTreeMap<_, BTreeMap<_, _>>, b: &[u8], k: &[u8], v: Option<Vec<u8>>| {
            o.entry(b.to_vec()).or_default().insert(k.to_vec(), v);
        };
        for (k, v) in &etcd.members {
            set(&mut overlay, MEMBERS, k, Some(v.clone()));
        }
        overlay.entry(MEMBERS.to_vec()).or_default();
        for (k, v) in &etcd.members_removed {
            set(&mut overlay, MEMBERS_REMOVED, k, Some(v.clone()));
        }
        overlay.entry(MEMBERS_REMOVED.to_vec()).or_default();
        if let Some(c) = &etcd.conf_state {
            set(&mut overlay, META_BUCKET, CONF_STATE, Some(c.clone()));
        }
        if let Some(v) = &etcd.storage_version {
            set(
                &mut overlay,
                META_BUCKET,
                STORAGE_VERSION,
                Some(v.clone().into_bytes()),
            );
        }
        if let Some(v) = &etcd.cluster_version {
            set(
                &mut overlay,
                CLUSTER_BUCKET,
                crate::cluster::VERSION,
                Some(v.clone().into_bytes()),
            );
        }
        // What a file of kvd's before etcd's forms may still hold in the meta bucket.
        set(&mut overlay, META_BUCKET, crate::cluster::DOWNGRADE, None);
        let layout = bbolt::plan(4096, &mut |s| feed(&txn, &overlay, s))?;
        Ok(EtcdFile {
            txn,
            overlay,
            layout,
        })
    }
}

impl EtcdFile {
    /// The file's size in bytes.
    pub fn size(&self) -> u64 {
        self.layout.size()
    }

    /// Writes the file to `out`, front to back.
    pub fn write_to(&self, out: &mut dyn Write) -> Result<()> {
        bbolt::write(&self.layout, out, &mut |s| {
            feed(&self.txn, &self.overlay, s)
        })
    }
}

type Extras<'a> =
    std::iter::Peekable<std::collections::btree_map::Iter<'a, Vec<u8>, Option<Vec<u8>>>>;

/// Puts the overlay's entries below `key` (all of them: `None`), leaving out those it removes.
fn put_below(s: &mut bbolt::Sink<'_>, extra: &mut Extras<'_>, key: Option<&[u8]>) -> Result<()> {
    while let Some((k, v)) = extra.next_if(|(k, _)| key.is_none_or(|key| k.as_slice() < key)) {
        if let Some(v) = v {
            s.put(k, v)?;
        }
    }
    Ok(())
}

/// Gives the sink the store's buckets merged with `overlay`, in order.
fn feed(txn: &pager::ReadTxn, overlay: &Overlay, s: &mut bbolt::Sink<'_>) -> Result<()> {
    let mut names: Vec<Vec<u8>> = txn.buckets()?;
    names.extend(overlay.keys().cloned());
    names.sort();
    names.dedup();
    let none = BTreeMap::new();
    for name in names {
        s.bucket(&name)?;
        let mut extra = overlay.get(&name).unwrap_or(&none).iter().peekable();
        let bucket = match txn.bucket(&name) {
            Ok(b) => Some(b),
            Err(pager::Error::BucketNotFound(_)) => None,
            Err(e) => return Err(e.into()),
        };
        if let Some(b) = bucket {
            for e in b.iter() {
                let (k, v) = e?;
                put_below(s, &mut extra, Some(k))?;
                match extra.next_if(|(ek, _)| ek.as_slice() == k) {
                    Some((_, Some(ov))) => s.put(k, ov)?,
                    Some((_, None)) => {}
                    None => s.put(k, v)?,
                }
            }
        }
        put_below(s, &mut extra, None)?;
    }
    Ok(())
}
