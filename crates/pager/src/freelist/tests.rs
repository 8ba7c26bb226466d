//! The free sets against each other and a model, and the stored form against damage.

use proptest::prelude::*;

use super::encoding::{decode, encode, encoded_pages};
use super::set::{new_set, runs_of, FreelistKind};
use crate::page::{PageId, HEADER};

fn kinds() -> [FreelistKind; 2] {
    [FreelistKind::Array, FreelistKind::Hashmap]
}

#[test]
fn allocate_splits_and_release_merges_neighbours() {
    for kind in kinds() {
        let mut s = new_set(kind);
        s.release(&[(PageId(10), 3), (PageId(20), 1)]);
        assert_eq!(s.allocate(2), Some(PageId(10)), "{kind:?}");
        assert_eq!(s.runs(), vec![(PageId(12), 1), (PageId(20), 1)], "{kind:?}");
        assert_eq!(s.allocate(2), None, "{kind:?}");
        s.release(&[(PageId(10), 2), (PageId(13), 7)]);
        assert_eq!(s.runs(), vec![(PageId(10), 11)], "{kind:?}");
        assert_eq!(s.count(), 11);
        assert_eq!(s.allocate(11), Some(PageId(10)));
        assert_eq!(s.count(), 0);
    }
}

#[test]
fn encode_decode_roundtrip_and_rejects_damage() {
    let ids = vec![2, 3, 9, 100];
    let pages = encoded_pages(ids.len(), 1024);
    let mut buf = encode(&ids, PageId(5), pages, 1024);
    assert_eq!(decode(&buf, PageId(5), 101).unwrap(), ids);
    assert!(
        decode(&buf, PageId(5), 100).is_err(),
        "id beyond high water accepted"
    );
    assert!(
        decode(&buf, PageId(6), 101).is_err(),
        "misdirected page accepted"
    );
    buf[HEADER + 8] ^= 1;
    assert!(
        decode(&buf, PageId(5), 101).is_err(),
        "flipped byte accepted"
    );
}

proptest! {
    /// Both sets agree with a model (a sorted set of ids) under any allocate/release sequence.
    #[test]
    fn sets_match_model(ops in prop::collection::vec((any::<bool>(), 1u64..6, 0u64..200), 1..200)) {
        for kind in kinds() {
            let mut s = new_set(kind);
            let mut model = std::collections::BTreeSet::new();
            for &(alloc, n, at) in &ops {
                if alloc {
                    let got = s.allocate(n);
                    match got {
                        Some(p) => {
                            for id in p.0..p.0 + n {
                                prop_assert!(model.remove(&id), "{kind:?} handed out non-free page {id}");
                            }
                        }
                        None => {
                            let ids: Vec<u64> = model.iter().copied().collect();
                            prop_assert!(runs_of(&ids).iter().all(|r| r.1 < n), "{kind:?} missed a run of {n}");
                        }
                    }
                } else {
                    let run: Vec<u64> = (at + 2..at + 2 + n).filter(|id| !model.contains(id)).collect();
                    let runs = runs_of(&run);
                    s.release(&runs);
                    model.extend(run);
                }
                let ids: Vec<u64> = model.iter().copied().collect();
                prop_assert_eq!(s.runs(), runs_of(&ids), "{:?}", kind);
                prop_assert_eq!(s.count(), model.len() as u64);
            }
        }
    }
}
