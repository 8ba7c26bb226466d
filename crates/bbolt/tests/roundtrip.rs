//! Files written by `bbolt::write` read back whole through `bbolt::Db`, and files whose pages
//! lie are errors naming the page.

use std::collections::BTreeMap;
use std::path::Path;

use bbolt::{Db, Error, Item};
use proptest::prelude::*;

type Buckets = BTreeMap<Vec<u8>, BTreeMap<Vec<u8>, Vec<u8>>>;

fn write_file(path: &Path, page_size: u32, data: &Buckets) -> bbolt::Layout {
    let mut feed = |s: &mut bbolt::Sink<'_>| -> Result<(), Error> {
        for (name, kvs) in data {
            s.bucket(name)?;
            for (k, v) in kvs {
                s.put(k, v)?;
            }
        }
        Ok(())
    };
    let layout = bbolt::plan(page_size, &mut feed).unwrap();
    let mut f = std::fs::File::create(path).unwrap();
    bbolt::write(&layout, &mut f, &mut feed).unwrap();
    assert_eq!(
        std::fs::metadata(path).unwrap().len(),
        layout.size(),
        "the file is as long as planned"
    );
    layout
}

fn read_all(db: &Db) -> Result<Buckets, Error> {
    let mut out = Buckets::new();
    let mut w = db.walker();
    let mut tops = Vec::new();
    w.for_each(&db.root(), &mut |k, item| {
        match item {
            Item::Bucket(b) => tops.push((k.to_vec(), b)),
            Item::Value(_) => panic!("a value among the top-level buckets"),
        }
        Ok(true)
    })?;
    for (name, b) in tops {
        let kvs = out.entry(name).or_default();
        w.for_each(&b, &mut |k, item| {
            if let Item::Value(v) = item {
                kvs.insert(k.to_vec(), v.to_vec());
            }
            Ok(true)
        })?;
    }
    Ok(out)
}

fn buckets() -> impl Strategy<Value = Buckets> {
    let value = prop_oneof![
        8 => proptest::collection::vec(any::<u8>(), 0..64),
        1 => proptest::collection::vec(any::<u8>(), 2000..20_000),
    ];
    let kvs = proptest::collection::btree_map(
        proptest::collection::vec(any::<u8>(), 1..40),
        value,
        0..400,
    );
    proptest::collection::btree_map(proptest::collection::vec(b'a'..=b'z', 1..12), kvs, 0..6)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn what_is_written_reads_back_and_checks(data in buckets(), big_pages in any::<bool>()) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let ps = if big_pages { 16384 } else { 4096 };
        write_file(&path, ps, &data);
        let db = Db::open(&path).unwrap();
        prop_assert_eq!(db.meta().page_size, ps);
        prop_assert_eq!(&read_all(&db).unwrap(), &data);
        let c = db.check().unwrap();
        prop_assert_eq!(c.buckets, data.len() as u64);
        prop_assert_eq!(c.values, data.values().map(|b| b.len() as u64).sum::<u64>());
        for (name, kvs) in &data {
            let b = db.bucket(name).unwrap().unwrap();
            if let Some((k, v)) = kvs.iter().next() {
                prop_assert_eq!(db.get(&b, k).unwrap(), Some(v.clone()));
            }
        }
    }

    /// Any byte of a page changed: an error or a file that still reads (a flipped value byte
    /// goes unseen: bbolt keeps no page checksums), never a panic or a hang.
    #[test]
    fn a_damaged_file_never_panics(data in buckets(), at in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        write_file(&path, 4096, &data);
        let mut bytes = std::fs::read(&path).unwrap();
        let i = at.index(bytes.len());
        bytes[i] = byte;
        std::fs::write(&path, &bytes).unwrap();
        if let Ok(db) = Db::open(&path) {
            let _ = read_all(&db);
            let _ = db.check();
        }
        let cut = at.index(bytes.len());
        std::fs::write(&path, &bytes[..cut]).unwrap();
        if let Ok(db) = Db::open(&path) {
            let _ = read_all(&db);
        }
    }
}

/// A file of two buckets, the first big enough for a branch page; its layout.
fn sample(path: &Path) -> bbolt::Layout {
    let mut data = Buckets::new();
    let big: BTreeMap<_, _> = (0..2000u32)
        .map(|i| (format!("key{i:06}").into_bytes(), vec![i as u8; 30]))
        .collect();
    data.insert(b"big".to_vec(), big);
    data.insert(
        b"small".to_vec(),
        [(b"a".to_vec(), vec![1u8; 9000])].into_iter().collect(),
    );
    write_file(path, 4096, &data)
}

fn page(bytes: &mut [u8], id: u64) -> &mut [u8] {
    &mut bytes[id as usize * 4096..(id as usize + 1) * 4096]
}

fn flags(bytes: &[u8], id: u64) -> u16 {
    let at = id as usize * 4096 + 8;
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

fn corrupt_reason(path: &Path) -> String {
    let err = Db::open(path)
        .and_then(|db| {
            read_all(&db)
                .map(|_| ())
                .and_then(|()| db.check().map(|_| ()))
        })
        .unwrap_err();
    let s = err.to_string();
    assert!(
        s.contains(&path.display().to_string()),
        "{s} names the file"
    );
    s
}

#[test]
fn pages_that_lie_are_errors_that_say_how() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let layout = sample(&path);
    let good = std::fs::read(&path).unwrap();
    let branch = (2..layout.pages)
        .find(|&id| flags(&good, id) == 0x01)
        .unwrap();

    // A branch's child pointing back at the branch: a cycle.
    let mut b = good.clone();
    page(&mut b, branch)[16 + 8..16 + 16].copy_from_slice(&branch.to_le_bytes());
    std::fs::write(&path, &b).unwrap();
    let s = corrupt_reason(&path);
    assert!(s.contains("reached twice"), "{s}");

    // A child past the high-water mark.
    let mut b = good.clone();
    page(&mut b, branch)[16 + 8..16 + 16].copy_from_slice(&(layout.pages + 7).to_le_bytes());
    std::fs::write(&path, &b).unwrap();
    let s = corrupt_reason(&path);
    assert!(s.contains("outside the pages in use"), "{s}");

    // A leaf running on past the end.
    let mut b = good.clone();
    let leaf = (2..layout.pages)
        .find(|&id| flags(&good, id) == 0x02)
        .unwrap();
    page(&mut b, leaf)[12..16].copy_from_slice(&(u32::MAX).to_le_bytes());
    std::fs::write(&path, &b).unwrap();
    let s = corrupt_reason(&path);
    assert!(s.contains("past the pages in use"), "{s}");

    // An element whose key lies past its page.
    let mut b = good.clone();
    page(&mut b, leaf)[16 + 4..16 + 8].copy_from_slice(&(1u32 << 20).to_le_bytes());
    std::fs::write(&path, &b).unwrap();
    let s = corrupt_reason(&path);
    assert!(s.contains("past the page's end"), "{s}");

    // Two leaves swapped in their branch: keys out of order.
    let mut b = good.clone();
    let p = page(&mut b, branch);
    let (c0, c1): ([u8; 8], [u8; 8]) =
        (p[24..32].try_into().unwrap(), p[40..48].try_into().unwrap());
    p[24..32].copy_from_slice(&c1);
    p[40..48].copy_from_slice(&c0);
    std::fs::write(&path, &b).unwrap();
    let s = corrupt_reason(&path);
    assert!(s.contains("out of order"), "{s}");

    // A page moved: its header names another page.
    let mut b = good.clone();
    page(&mut b, leaf)[..8].copy_from_slice(&(leaf + 1).to_le_bytes());
    std::fs::write(&path, &b).unwrap();
    let s = corrupt_reason(&path);
    assert!(
        s.contains(&format!("it says it is page {}", leaf + 1)),
        "{s}"
    );

    // A page neither in a tree nor free.
    let mut b = good.clone();
    let fl = layout.freelist;
    b.extend_from_slice(&vec![0u8; 4096]);
    page(&mut b, layout.pages)[..8].copy_from_slice(&layout.pages.to_le_bytes());
    // The metas now count one more page: rewrite both with the new high-water mark.
    for id in 0..2u64 {
        let p = page(&mut b, id);
        p[16 + 40..16 + 48].copy_from_slice(&(layout.pages + 1).to_le_bytes());
        let sum = fnv(&p[16..72]);
        p[72..80].copy_from_slice(&sum.to_le_bytes());
    }
    std::fs::write(&path, &b).unwrap();
    let s = corrupt_reason(&path);
    assert!(
        s.contains("neither reached from the root nor free"),
        "{s} (freelist {fl})"
    );

    // Truncated.
    std::fs::write(&path, &good[..good.len() - 4096]).unwrap();
    let s = corrupt_reason(&path);
    assert!(s.contains("truncated"), "{s}");

    // Not bbolt at all.
    std::fs::write(&path, b"KVDSNAP1 and then some bytes").unwrap();
    let s = corrupt_reason(&path);
    assert!(s.contains("not a bbolt database"), "{s}");
}

#[test]
fn one_damaged_meta_page_falls_back_to_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    sample(&path);
    let good = std::fs::read(&path).unwrap();
    for id in 0..2 {
        let mut b = good.clone();
        page(&mut b, id)[20] ^= 0xff;
        std::fs::write(&path, &b).unwrap();
        let db = Db::open(&path).unwrap();
        assert_eq!(db.meta().txid, 1 - id, "meta {id} damaged");
        db.check().unwrap();
    }
}

fn fnv(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &c in b {
        h ^= u64::from(c);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}
