//! Watch behaviour: every watcher gets each event of its range once, in revision order, from
//! its start revision on — however writes, watch creation, slow consumers and cancellation
//! interleave — and the etcd cases around it (compaction cancel, progress, filters, prev_kv).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake};
use std::time::{Duration, Instant};

use api::etcdserverpb::watch_create_request::FilterType;
use api::etcdserverpb::{
    request_op, DeleteRangeRequest, PutRequest, RequestOp, TxnRequest, WatchCreateRequest,
};
use api::mvccpb::{event::EventType, Event, KeyValue};
use ids::Revision;
use mvcc::{Error, Store, StoreOptions, WatchResponse, WatchStream};
use proptest::prelude::*;

const WAIT: Duration = Duration::from_secs(10);

/// A fresh store (in a temp dir that lives as long as the returned guard).
fn new_store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("db"), StoreOptions::default()).unwrap();
    (dir, store)
}

fn put(k: &[u8], v: &[u8]) -> PutRequest {
    PutRequest {
        key: k.to_vec(),
        value: v.to_vec(),
        ..Default::default()
    }
}

fn del(k: &[u8], end: &[u8]) -> DeleteRangeRequest {
    DeleteRangeRequest {
        key: k.to_vec(),
        range_end: end.to_vec(),
        ..Default::default()
    }
}

fn watch(key: &[u8], end: &[u8], start: i64) -> WatchCreateRequest {
    WatchCreateRequest {
        key: key.to_vec(),
        range_end: end.to_vec(),
        start_revision: start,
        ..Default::default()
    }
}

/// Receives until `n` events arrived for watch `id` (failing after [`WAIT`]).
fn events_for(s: &WatchStream, id: i64, n: usize) -> Vec<Event> {
    let deadline = Instant::now() + WAIT;
    let mut out = Vec::new();
    while out.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        let r = s
            .recv_timeout(left)
            .unwrap_or_else(|| panic!("watch {id}: {} of {n} events after {WAIT:?}", out.len()));
        assert_eq!(r.watch_id, id, "a response for another watcher: {r:?}");
        out.extend(r.events);
    }
    out
}

/// A value over half the bytes a watcher's queued response gathers: a response holds one, and
/// a stream with room for one response stalls on the next.
fn big(b: u8) -> Vec<u8> {
    vec![b; 600 << 10]
}

fn summary(evs: &[Event]) -> Vec<(EventType, String, i64)> {
    evs.iter()
        .map(|e| {
            let kv = e.kv.as_ref().unwrap();
            (
                e.r#type(),
                String::from_utf8_lossy(&kv.key).into_owned(),
                kv.mod_revision,
            )
        })
        .collect()
}

fn nothing_more(s: &WatchStream) {
    if let Some(r) = s.recv_timeout(Duration::from_millis(200)) {
        panic!("unexpected response {r:?}");
    }
}

#[test]
fn key_prefix_range_and_from_key_watchers_see_their_events() {
    let (_dir, store) = new_store();
    let s = store.watch_stream();
    let key = s.watch(&watch(b"a", b"", 0)).unwrap();
    let prefix = s.watch(&watch(b"p/", b"p0", 0)).unwrap();
    let range = s.watch(&watch(b"b", b"d", 0)).unwrap();
    let from = s.watch(&watch(b"c", b"\0", 0)).unwrap();
    assert_eq!(
        (key, prefix, range, from),
        (0, 1, 2, 3),
        "ids as etcd assigns them"
    );
    let mut w = store.write().unwrap();
    w.put(&put(b"a", b"1")).unwrap(); // 2
    w.put(&put(b"p/x", b"1")).unwrap(); // 3
    w.put(&put(b"c", b"1")).unwrap(); // 4
    w.delete_range(&del(b"a", b"")).unwrap(); // 5
    w.delete_range(&del(b"p/", b"p0")).unwrap(); // 6
    drop(w);
    let mut got: HashMap<i64, Vec<Event>> = HashMap::new();
    let want = [(key, 2), (prefix, 2), (range, 1), (from, 3)];
    let deadline = Instant::now() + WAIT;
    while want
        .iter()
        .any(|&(id, n)| got.get(&id).map_or(0, Vec::len) < n)
    {
        let r = s.recv_timeout(deadline - Instant::now()).expect("events");
        got.entry(r.watch_id).or_default().extend(r.events);
    }
    use EventType::{Delete, Put};
    let s_ = |t, k: &str, r| (t, k.to_string(), r);
    assert_eq!(summary(&got[&key]), [s_(Put, "a", 2), s_(Delete, "a", 5)]);
    assert_eq!(
        summary(&got[&prefix]),
        [s_(Put, "p/x", 3), s_(Delete, "p/x", 6)]
    );
    assert_eq!(summary(&got[&range]), [s_(Put, "c", 4)]);
    assert_eq!(
        summary(&got[&from]),
        [s_(Put, "p/x", 3), s_(Put, "c", 4), s_(Delete, "p/x", 6)]
    );
    nothing_more(&s);
    // A delete event carries only the key and the deleting revision, as etcd's.
    let d = &got[&key][1];
    assert_eq!(
        d.kv,
        Some(KeyValue {
            key: b"a".to_vec(),
            mod_revision: 5,
            ..Default::default()
        })
    );
}

#[test]
fn filters_and_prev_kv() {
    let (_dir, store) = new_store();
    let s = store.watch_stream();
    let no_put = s
        .watch(&WatchCreateRequest {
            filters: vec![FilterType::Noput as i32],
            ..watch(b"k", b"", 0)
        })
        .unwrap();
    let prev = s
        .watch(&WatchCreateRequest {
            prev_kv: true,
            filters: vec![FilterType::Nodelete as i32],
            ..watch(b"k", b"", 0)
        })
        .unwrap();
    let mut w = store.write().unwrap();
    w.put(&put(b"k", b"1")).unwrap(); // 2: a create, no prev_kv
    w.put(&put(b"k", b"2")).unwrap(); // 3: prev_kv = the version at 2
    w.delete_range(&del(b"k", b"")).unwrap(); // 4
    drop(w);
    let mut by_id: HashMap<i64, Vec<Event>> = HashMap::new();
    let deadline = Instant::now() + WAIT;
    while by_id.get(&no_put).map_or(0, Vec::len) < 1 || by_id.get(&prev).map_or(0, Vec::len) < 2 {
        let r = s.recv_timeout(deadline - Instant::now()).expect("events");
        assert!(
            !r.events.is_empty(),
            "a filtered-out response must not be sent"
        );
        by_id.entry(r.watch_id).or_default().extend(r.events);
    }
    nothing_more(&s);
    let np = &by_id[&no_put];
    assert_eq!(summary(np), [(EventType::Delete, "k".into(), 4)]);
    assert_eq!(np[0].prev_kv, None, "prev_kv only when asked");
    let p = &by_id[&prev];
    assert_eq!(p[0].prev_kv, None, "a creation has no previous version");
    let pk = p[1].prev_kv.as_ref().expect("prev_kv of an update");
    assert_eq!(
        (pk.value.as_slice(), pk.mod_revision, pk.version),
        (&b"1"[..], 2, 1)
    );
}

#[test]
fn watch_from_a_past_revision_replays_history_then_follows() {
    let (_dir, store) = new_store();
    for i in 0..50 {
        store
            .write()
            .unwrap()
            .put(&put(format!("k{}", i % 5).as_bytes(), b"v"))
            .unwrap();
    }
    store.flush().unwrap(); // half the history from the pager, half pending
    for i in 50..100 {
        store
            .write()
            .unwrap()
            .put(&put(format!("k{}", i % 5).as_bytes(), b"v"))
            .unwrap();
    }
    let s = store.watch_stream();
    let id = s.watch(&watch(b"k1", b"", 10)).unwrap();
    for _ in 0..10 {
        store.write().unwrap().put(&put(b"k1", b"later")).unwrap();
    }
    let evs = events_for(&s, id, 18 + 10);
    let revs: Vec<i64> = evs
        .iter()
        .map(|e| e.kv.as_ref().unwrap().mod_revision)
        .collect();
    let want: Vec<i64> = (10..=101)
        .filter(|r| (r - 2) % 5 == 1)
        .chain(102..112)
        .collect();
    assert_eq!(revs, want);
    nothing_more(&s);
}

/// A watcher far behind catches up over several rounds (each reads a bounded slice of the
/// history); a revision is never split between two responses, nor an event lost at the seams.
#[test]
fn catch_up_in_bounded_rounds_keeps_revisions_whole() {
    let (_dir, store) = new_store();
    const TXNS: usize = 5_000;
    for i in 0..TXNS {
        let success = (0..3)
            .map(|j| RequestOp {
                request: Some(request_op::Request::RequestPut(put(
                    format!("p/{j}").as_bytes(),
                    i.to_string().as_bytes(),
                ))),
            })
            .collect();
        store
            .write()
            .unwrap()
            .txn(&TxnRequest {
                success,
                ..Default::default()
            })
            .unwrap();
    }
    let s = store.watch_stream();
    let id = s.watch(&watch(b"p/", b"p0", 1)).unwrap();
    let mut seen_in: HashMap<i64, usize> = HashMap::new();
    let mut all = Vec::new();
    let deadline = Instant::now() + WAIT;
    for response in 0.. {
        if all.len() == 3 * TXNS {
            break;
        }
        let r = s.recv_timeout(deadline - Instant::now()).expect("events");
        assert_eq!(r.watch_id, id);
        for e in &r.events {
            let rev = e.kv.as_ref().unwrap().mod_revision;
            let first = *seen_in.entry(rev).or_insert(response);
            assert_eq!(first, response, "revision {rev} split between responses");
        }
        all.extend(r.events);
    }
    assert!(
        seen_in.values().max() > Some(&0),
        "caught up in one response"
    );
    for (i, e) in all.iter().enumerate() {
        let kv = e.kv.as_ref().unwrap();
        assert_eq!(kv.mod_revision, (i / 3) as i64 + 2);
        assert_eq!(kv.key, format!("p/{}", i % 3).as_bytes());
    }
    nothing_more(&s);
}

#[test]
fn resume_after_reconnect_from_the_next_revision() {
    let (_dir, store) = new_store();
    let s = store.watch_stream();
    let id = s.watch(&watch(b"k", b"", 0)).unwrap();
    for i in 0..5 {
        store.write().unwrap().put(&put(b"k", &[b'0' + i])).unwrap();
    }
    // Three or more (the responses may gather several revisions each).
    let first = events_for(&s, id, 3);
    let last = first.last().unwrap().kv.as_ref().unwrap().mod_revision;
    drop(s); // the client disconnects, perhaps with events undelivered
    for i in 5..8 {
        store.write().unwrap().put(&put(b"k", &[b'0' + i])).unwrap();
    }
    let s = store.watch_stream();
    let id = s.watch(&watch(b"k", b"", last + 1)).unwrap();
    let rest = events_for(&s, id, 8 - first.len());
    let values: Vec<u8> = first
        .iter()
        .chain(&rest)
        .map(|e| e.kv.as_ref().unwrap().value[0])
        .collect();
    assert_eq!(values, b"01234567");
    nothing_more(&s);
}

#[test]
fn a_watcher_behind_the_compaction_is_cancelled_with_its_revision() {
    let (_dir, store) = new_store();
    for i in 0..10u8 {
        store.write().unwrap().put(&put(b"k", &[i])).unwrap();
    }
    store.write().unwrap().compact(Revision(6)).unwrap();
    let s = store.watch_stream();
    let old = s.watch(&watch(b"k", b"", 5)).unwrap();
    let r = s.recv_timeout(WAIT).expect("a compaction response");
    assert_eq!(
        (r.watch_id, r.compact_revision.0, r.events.len()),
        (old, 6, 0)
    );
    // At the compaction revision itself the history is still there.
    let at = s.watch(&watch(b"k", b"", 6)).unwrap();
    let evs = events_for(&s, at, 6);
    assert_eq!(evs[0].kv.as_ref().unwrap().mod_revision, 6);
    nothing_more(&s);

    // A watcher whose consumer stalls while compaction passes it is cancelled too.
    let slow = store.watch_stream_with_capacity(1);
    let id = slow.watch(&watch(b"k", b"", 0)).unwrap();
    for i in 0..20u8 {
        store.write().unwrap().put(&put(b"k", &big(i))).unwrap();
    }
    let rev = store.rev();
    store.write().unwrap().compact(rev).unwrap();
    let first = slow.recv_timeout(WAIT).expect("the one queued response");
    assert_eq!((first.watch_id, first.events.len()), (id, 1));
    let r = slow.recv_timeout(WAIT).expect("a compaction response");
    assert_eq!((r.watch_id, r.compact_revision), (id, rev));
    nothing_more(&slow);
}

#[test]
fn a_slow_consumer_blocks_neither_writes_nor_other_watchers_and_misses_nothing() {
    let (_dir, store) = new_store();
    let slow = store.watch_stream_with_capacity(2);
    let fast = store.watch_stream();
    let slow_id = slow.watch(&watch(b"k", b"", 0)).unwrap();
    let fast_id = fast.watch(&watch(b"k", b"", 0)).unwrap();
    // More writes than the ring of recent events holds, so the slow watcher's catch-up reads
    // the store's history; nobody reads `slow` meanwhile.
    const N: usize = 40_000;
    let received = std::thread::scope(|sc| {
        let reader = sc.spawn(|| events_for(&fast, fast_id, N));
        for i in 0..N {
            store
                .write()
                .unwrap()
                .put(&put(b"k", i.to_string().as_bytes()))
                .unwrap();
        }
        reader.join().unwrap()
    });
    let check = |evs: &[Event]| {
        assert_eq!(evs.len(), N);
        for (i, e) in evs.iter().enumerate() {
            let kv = e.kv.as_ref().unwrap();
            assert_eq!(kv.value, i.to_string().as_bytes());
            assert_eq!(kv.mod_revision, i as i64 + 2);
        }
    };
    check(&received);
    check(&events_for(&slow, slow_id, N));
    nothing_more(&slow);
}

#[test]
fn a_lagging_consumer_gets_each_watchers_revisions_gathered_in_order() {
    let (_dir, store) = new_store();
    let s = store.watch_stream_with_capacity(4);
    let one = s.watch(&watch(b"k", b"", 0)).unwrap();
    let all = s.watch(&watch(b"", b"\0", 0)).unwrap();
    for i in 0..50u8 {
        store.write().unwrap().put(&put(b"k", &[i])).unwrap();
        store.write().unwrap().put(&put(b"other", &[i])).unwrap();
    }
    // Nobody read while they were written: each watcher's revisions wait in one response.
    let mut got: HashMap<i64, Vec<WatchResponse>> = HashMap::new();
    for _ in 0..2 {
        let r = s.recv_timeout(WAIT).expect("a response per watcher");
        got.entry(r.watch_id).or_default().push(r);
    }
    nothing_more(&s);
    // Each response is current to its last event's revision, as one per revision would be.
    let revs = |id: i64| -> Vec<i64> {
        let rs = &got[&id];
        assert_eq!(rs.len(), 1, "watch {id}: {} responses", rs.len());
        let evs: Vec<i64> = (rs[0].events.iter())
            .map(|e| e.kv.as_ref().unwrap().mod_revision)
            .collect();
        assert_eq!(Some(&rs[0].revision.0), evs.last());
        evs
    };
    assert_eq!(revs(one), (0..50).map(|i| 2 + 2 * i).collect::<Vec<_>>());
    assert_eq!(revs(all), (2..=101).collect::<Vec<_>>());

    // Once taken, a response gathers nothing more: the next revision is a response of its own.
    store.write().unwrap().put(&put(b"k", b"next")).unwrap();
    let a = s.recv_timeout(WAIT).unwrap();
    let b = s.recv_timeout(WAIT).unwrap();
    for r in [a, b] {
        assert_eq!((r.events.len(), r.revision.0), (1, 102));
    }
    nothing_more(&s);
}

#[test]
fn gathered_responses_count_against_the_streams_bytes() {
    // 1,000 revisions of 100 KiB for one watcher nobody reads: ten gather in each response,
    // so a hundred responses, far from the stream's count, hold 100 MB, past its byte bound.
    // The watcher falls behind and catches up from the store, missing nothing.
    let (_dir, store) = new_store();
    let s = store.watch_stream_with_capacity(1024);
    let id = s.watch(&watch(b"k", b"", 0)).unwrap();
    const N: usize = 1000;
    for i in 0..N {
        let v = vec![i as u8; 100 << 10];
        store.write().unwrap().put(&put(b"k", &v)).unwrap();
    }
    assert!(
        !s.request_progress(id),
        "a watcher past the byte bound is not synced"
    );
    let evs = events_for(&s, id, N);
    for (i, e) in evs.iter().enumerate() {
        let kv = e.kv.as_ref().unwrap();
        assert_eq!((kv.mod_revision, kv.value[0]), (i as i64 + 2, i as u8));
    }
    nothing_more(&s);
}

#[test]
fn progress_notifications_only_when_synced() {
    let (_dir, store) = new_store();
    store.write().unwrap().put(&put(b"k", b"1")).unwrap();
    let s = store.watch_stream();
    // No watchers: nothing to report, and nothing is sent (as etcd).
    assert!(s.request_progress_all());
    nothing_more(&s);
    let id = s.watch(&watch(b"k", b"", 0)).unwrap();
    assert!(s.request_progress(id));
    let r = s.recv_timeout(WAIT).unwrap();
    assert_eq!(
        r,
        WatchResponse {
            watch_id: id,
            revision: Revision(2),
            ..Default::default()
        }
    );
    assert!(s.request_progress_all());
    let r = s.recv_timeout(WAIT).unwrap();
    assert_eq!((r.watch_id, r.revision.0, r.events.len()), (-1, 2, 0));
    // A watcher on a future revision is not synced until the store reaches it.
    let future = s.watch(&watch(b"k", b"", 10)).unwrap();
    assert!(!s.request_progress(future));
    assert!(!s.request_progress_all());
    assert!(!s.request_progress(99), "no such watcher");

    // A stalled watcher is not synced either, until its consumer catches up.
    let slow = store.watch_stream_with_capacity(1);
    let sid = slow.watch(&watch(b"k", b"", 0)).unwrap();
    for _ in 0..3 {
        store.write().unwrap().put(&put(b"k", &big(b'x'))).unwrap();
    }
    assert!(!slow.request_progress(sid));
    let got = events_for(&slow, sid, 3);
    assert_eq!(got.len(), 3);
    let deadline = Instant::now() + WAIT;
    while !slow.request_progress(sid) {
        assert!(Instant::now() < deadline, "never synced");
        std::thread::sleep(Duration::from_millis(5));
    }
    let r = slow.recv_timeout(WAIT).unwrap();
    assert_eq!((r.watch_id, r.revision.0), (sid, 5));

    // Progress requests on a stream nobody reads queue up to twice its bound, then fail.
    let unread = store.watch_stream_with_capacity(2);
    let uid = unread.watch(&watch(b"k", b"", 0)).unwrap();
    let queued = (0..100)
        .take_while(|_| unread.request_progress(uid))
        .count();
    assert_eq!(queued, 4);
}

#[test]
fn ids_cancel_and_bad_requests() {
    let (_dir, store) = new_store();
    let s = store.watch_stream();
    let chosen = s
        .watch(&WatchCreateRequest {
            watch_id: 7,
            ..watch(b"k", b"", 0)
        })
        .unwrap();
    assert_eq!(chosen, 7);
    let dup = s.watch(&WatchCreateRequest {
        watch_id: 7,
        ..watch(b"j", b"", 0)
    });
    assert!(matches!(dup, Err(Error::DuplicateWatchId)), "{dup:?}");
    assert_eq!(
        dup.unwrap_err().to_string(),
        "mvcc: duplicate watch ID provided on the WatchStream"
    );
    let empty = s.watch(&watch(b"b", b"a", 0)).unwrap_err();
    assert_eq!(empty.to_string(), "mvcc: watcher range is empty");
    assert!(matches!(
        s.watch(&watch(b"b", b"b", 0)),
        Err(Error::EmptyWatcherRange)
    ));
    // An empty key watches from "\0": with range_end "\0", everything.
    let all = s.watch(&watch(b"", b"\0", 0)).unwrap();
    assert_eq!(all, 0);

    store.write().unwrap().put(&put(b"k", b"1")).unwrap();
    s.cancel(chosen).unwrap();
    assert!(matches!(s.cancel(chosen), Err(Error::WatcherNotExist)));
    store.write().unwrap().put(&put(b"k", b"2")).unwrap();
    // The event queued for `chosen` before the cancel is dropped; `all` sees both.
    let evs = events_for(&s, all, 2);
    assert_eq!(evs.len(), 2);
    nothing_more(&s);
}

/// Watchers created while a writer runs flat out: each sees every later write to its key once,
/// in order, with no gap — whichever way its creation raced the writer's transactions.
#[test]
fn watchers_created_during_writes_miss_nothing() {
    let (_dir, store) = new_store();
    /// Stops the writer however the checks end (a failed assertion must not leave the scope
    /// waiting for it forever).
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let stop = AtomicBool::new(false);
    let last = AtomicI64::new(0);
    std::thread::scope(|sc| {
        let _stop = Stop(&stop);
        sc.spawn(|| {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let r = store
                    .write()
                    .unwrap()
                    .put(&put(b"k", i.to_string().as_bytes()))
                    .unwrap();
                last.store(r.header.unwrap().revision, Ordering::Release);
                i += 1;
            }
        });
        let mut checked = 0;
        for round in 0..500 {
            let s = store.watch_stream();
            // Half from now, half from a recent revision (the ring, or history).
            let start = if round % 2 == 0 {
                0
            } else {
                (last.load(Ordering::Acquire) - round).max(1)
            };
            let id = s.watch(&watch(b"k", b"", start)).unwrap();
            // Watchers have been notified up to here: the watcher has everything after it.
            let notified = s.rev().0;
            let evs = events_for(&s, id, 5);
            let revs: Vec<i64> = evs
                .iter()
                .map(|e| e.kv.as_ref().unwrap().mod_revision)
                .collect();
            if start > 0 {
                assert_eq!(revs[0], start, "round {round}");
            } else {
                assert!(
                    revs[0] <= notified + 1,
                    "round {round}: missed {notified}+1: {revs:?}"
                );
            }
            for w in revs.windows(2) {
                assert_eq!(w[1], w[0] + 1, "round {round}: a gap or a repeat: {revs:?}");
            }
            checked += 1;
        }
        assert_eq!(checked, 500);
    });
}

#[test]
fn a_hundred_thousand_watchers() {
    let (_dir, store) = new_store();
    const STREAMS: usize = 10;
    const PER: usize = 10_000;
    let streams: Vec<WatchStream> = (0..STREAMS).map(|_| store.watch_stream()).collect();
    for (n, s) in streams.iter().enumerate() {
        for i in 0..PER {
            // Each watches its own key; a tenth also watch the shared prefix "shared/".
            let k = format!("key/{n}/{i}");
            s.watch(&watch(k.as_bytes(), b"", 0)).unwrap();
        }
        for _ in 0..PER / 10 {
            s.watch(&watch(b"shared/", b"shared0", 0)).unwrap();
        }
    }
    // Writes to keys nobody watches cost a lookup, not a scan of the watchers.
    for i in 0..1000 {
        store
            .write()
            .unwrap()
            .put(&put(format!("other/{i}").as_bytes(), b"v"))
            .unwrap();
    }
    // One write each watcher of the shared prefix sees; one write per stream to one key.
    store.write().unwrap().put(&put(b"shared/x", b"v")).unwrap();
    for n in 0..STREAMS {
        store
            .write()
            .unwrap()
            .put(&put(format!("key/{n}/{}", n * 7).as_bytes(), b"v"))
            .unwrap();
    }
    for (n, s) in streams.iter().enumerate() {
        let mut shared = 0;
        let mut own = Vec::new();
        let deadline = Instant::now() + WAIT;
        while shared < PER / 10 || own.is_empty() {
            let r = s.recv_timeout(deadline - Instant::now()).expect("events");
            assert_eq!(r.events.len(), 1);
            let key = &r.events[0].kv.as_ref().unwrap().key;
            if key == b"shared/x" {
                shared += 1;
            } else {
                own.push((r.watch_id, key.clone()));
            }
        }
        assert_eq!(
            own,
            [((n * 7) as i64, format!("key/{n}/{}", n * 7).into_bytes())]
        );
        nothing_more(s);
    }
}

#[test]
fn async_receive_wakes_the_task_and_ends_when_the_store_closes() {
    struct Flag(AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::Release);
        }
    }
    let (_dir, store) = new_store();
    let s = store.watch_stream();
    let id = s.watch(&watch(b"k", b"", 0)).unwrap();
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let waker = flag.clone().into();
    let mut cx = Context::from_waker(&waker);
    assert!(s.poll_recv(&mut cx).is_pending());
    store.write().unwrap().put(&put(b"k", b"v")).unwrap();
    assert!(flag.0.load(Ordering::Acquire), "the put woke the task");
    match s.poll_recv(&mut cx) {
        Poll::Ready(Some(r)) => assert_eq!((r.watch_id, r.events.len()), (id, 1)),
        other => panic!("{other:?}"),
    }
    assert!(s.poll_recv(&mut cx).is_pending());
    flag.0.store(false, Ordering::Release);
    drop(store);
    assert!(flag.0.load(Ordering::Acquire), "closing woke the task");
    assert!(matches!(s.poll_recv(&mut cx), Poll::Ready(None)));
}

/// The model: every write's events, as etcd would emit them (with prev_kv).
#[derive(Default)]
struct Model {
    rev: i64,
    kvs: BTreeMap<Vec<u8>, KeyValue>,
    history: Vec<Event>,
}

impl Model {
    fn new() -> Model {
        Model {
            rev: 1,
            ..Default::default()
        }
    }

    fn apply(&mut self, op: &WriteOp) {
        let rev = self.rev + 1;
        let mut wrote = false;
        let mut put = |m: &mut Model, k: &[u8], v: &[u8]| {
            let prev = m.kvs.get(k).cloned();
            let kv = KeyValue {
                key: k.to_vec(),
                create_revision: prev.as_ref().map_or(rev, |p| p.create_revision),
                mod_revision: rev,
                version: prev.as_ref().map_or(1, |p| p.version + 1),
                value: v.to_vec(),
                lease: 0,
            };
            m.kvs.insert(k.to_vec(), kv.clone());
            m.history.push(Event {
                r#type: EventType::Put as i32,
                kv: Some(kv),
                prev_kv: prev,
            });
            wrote = true;
        };
        match op {
            WriteOp::Put(k, v) => put(self, KEYS[*k], &[*v]),
            WriteOp::Txn(a, b, v) => {
                put(self, KEYS[*a], &[*v]);
                if a != b {
                    put(self, KEYS[*b], &[*v]);
                }
            }
            WriteOp::Delete(k, end) => {
                let (k, end) = (KEYS[*k], RANGE_ENDS[*end]);
                let doomed: Vec<Vec<u8>> = self
                    .kvs
                    .keys()
                    .filter(|key| in_range(key, k, end))
                    .cloned()
                    .collect();
                for key in doomed {
                    let prev = self.kvs.remove(&key);
                    self.history.push(Event {
                        r#type: EventType::Delete as i32,
                        kv: Some(KeyValue {
                            key,
                            mod_revision: rev,
                            ..Default::default()
                        }),
                        prev_kv: prev,
                    });
                    wrote = true;
                }
            }
        }
        if wrote {
            self.rev = rev;
        }
    }
}

const KEYS: [&[u8]; 7] = [b"a", b"b", b"c", b"d", b"p/1", b"p/2", b"p/3"];
const RANGE_ENDS: [&[u8]; 4] = [b"", b"\0", b"d", b"p0"];

fn in_range(key: &[u8], k: &[u8], end: &[u8]) -> bool {
    match end {
        [] => key == k,
        [0] => key >= k,
        e => key >= k && key < e,
    }
}

#[derive(Debug, Clone)]
enum WriteOp {
    Put(usize, u8),
    Delete(usize, usize),
    Txn(usize, usize, u8),
}

#[derive(Debug, Clone)]
enum Op {
    Write(WriteOp),
    /// Create a watcher on a stream: key, range end, start back from now (-1 = 0, the next
    /// revision; -2 = two ahead), filters, prev_kv.
    Watch {
        stream: usize,
        key: usize,
        end: usize,
        back: i64,
        no_put: bool,
        no_delete: bool,
        prev_kv: bool,
    },
    Drain(usize, usize),
    Cancel(usize),
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    let write = prop_oneof![
        4 => (0..KEYS.len(), any::<u8>()).prop_map(|(k, v)| WriteOp::Put(k, v)),
        1 => (0..KEYS.len(), 0..RANGE_ENDS.len()).prop_map(|(k, e)| WriteOp::Delete(k, e)),
        1 => (0..KEYS.len(), 0..KEYS.len(), any::<u8>()).prop_map(|(a, b, v)| WriteOp::Txn(a, b, v)),
    ];
    prop_oneof![
        6 => write.prop_map(Op::Write),
        2 => (0..3usize, 0..KEYS.len(), 0..RANGE_ENDS.len(), -2..6i64, any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(|(stream, key, end, back, no_put, no_delete, prev_kv)| Op::Watch {
                stream, key, end, back, no_put, no_delete, prev_kv,
            }),
        2 => (0..3usize, 0..4usize).prop_map(|(s, n)| Op::Drain(s, n)),
        1 => (0..20usize).prop_map(Op::Cancel),
        1 => Just(Op::Flush),
    ]
}

struct Tracked {
    stream: usize,
    id: i64,
    key: &'static [u8],
    end: &'static [u8],
    start: i64,
    no_put: bool,
    no_delete: bool,
    prev_kv: bool,
    /// The model revision when it was cancelled.
    canceled_at: Option<i64>,
}

impl Tracked {
    fn expected(&self, m: &Model) -> Vec<Event> {
        m.history
            .iter()
            .filter(|e| {
                let kv = e.kv.as_ref().unwrap();
                let put = e.r#type == EventType::Put as i32;
                kv.mod_revision >= self.start
                    && self.canceled_at.is_none_or(|c| kv.mod_revision <= c)
                    && in_range(&kv.key, self.key, self.end)
                    && if put { !self.no_put } else { !self.no_delete }
            })
            .map(|e| {
                let mut e = e.clone();
                let kv = e.kv.as_ref().unwrap();
                let create =
                    e.r#type == EventType::Put as i32 && kv.create_revision == kv.mod_revision;
                if !self.prev_kv || create {
                    e.prev_kv = None;
                }
                e
            })
            .collect()
    }
}

fn receive(s: &WatchStream, got: &mut HashMap<(usize, i64), Vec<Event>>, n: usize, idx: usize) {
    for _ in 0..n {
        let Some(r) = s.try_recv() else { return };
        record(got, idx, r);
    }
}

fn record(got: &mut HashMap<(usize, i64), Vec<Event>>, stream: usize, r: WatchResponse) {
    assert_eq!(r.compact_revision.0, 0);
    assert!(!r.events.is_empty(), "an empty event response: {r:?}");
    let revs: Vec<i64> = r
        .events
        .iter()
        .map(|e| e.kv.as_ref().unwrap().mod_revision)
        .collect();
    assert!(
        revs.windows(2).all(|w| w[0] <= w[1]),
        "out of order: {revs:?}"
    );
    assert!(r.revision.0 >= *revs.last().unwrap());
    got.entry((stream, r.watch_id))
        .or_default()
        .extend(r.events);
}

fn run_model(ops: &[Op]) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path().join("db"),
        StoreOptions {
            batch_limit: 7,
            ..Default::default()
        },
    )
    .unwrap();
    // Capacities that force every path: always full, sometimes full, never full.
    let streams = [1, 3, 1024].map(|c| store.watch_stream_with_capacity(c));
    let mut model = Model::new();
    let mut watchers: Vec<Tracked> = Vec::new();
    let mut got: HashMap<(usize, i64), Vec<Event>> = HashMap::new();
    for op in ops {
        match op {
            Op::Write(w) => {
                let mut wr = store.write().unwrap();
                match w {
                    WriteOp::Put(k, v) => {
                        wr.put(&put(KEYS[*k], &[*v])).unwrap();
                    }
                    WriteOp::Delete(k, e) => {
                        wr.delete_range(&del(KEYS[*k], RANGE_ENDS[*e])).unwrap();
                    }
                    WriteOp::Txn(a, b, v) => {
                        let op = |k: usize| RequestOp {
                            request: Some(request_op::Request::RequestPut(put(KEYS[k], &[*v]))),
                        };
                        let mut success = vec![op(*a)];
                        if a != b {
                            success.push(op(*b));
                        }
                        wr.txn(&TxnRequest {
                            success,
                            ..Default::default()
                        })
                        .unwrap();
                    }
                }
                drop(wr);
                model.apply(w);
                assert_eq!(store.rev().0, model.rev);
            }
            Op::Watch {
                stream,
                key,
                end,
                back,
                no_put,
                no_delete,
                prev_kv,
            } => {
                let (k, e) = (KEYS[*key], RANGE_ENDS[*end]);
                if !e.is_empty() && e != b"\0" && k >= e {
                    continue;
                }
                let (req_start, start) = match *back {
                    -1 => (0, model.rev + 1),
                    -2 => (model.rev + 2, model.rev + 2),
                    b => {
                        let s = (model.rev - b).max(1);
                        (s, s)
                    }
                };
                let mut filters = Vec::new();
                if *no_put {
                    filters.push(FilterType::Noput as i32);
                }
                if *no_delete {
                    filters.push(FilterType::Nodelete as i32);
                }
                let id = streams[*stream]
                    .watch(&WatchCreateRequest {
                        filters,
                        prev_kv: *prev_kv,
                        ..watch(k, e, req_start)
                    })
                    .unwrap();
                watchers.push(Tracked {
                    stream: *stream,
                    id,
                    key: k,
                    end: e,
                    start,
                    no_put: *no_put,
                    no_delete: *no_delete,
                    prev_kv: *prev_kv,
                    canceled_at: None,
                });
            }
            Op::Drain(s, n) => receive(&streams[*s], &mut got, *n, *s),
            Op::Cancel(i) => {
                if let Some(w) = watchers.get_mut(*i) {
                    if w.canceled_at.is_none() {
                        streams[w.stream].cancel(w.id).unwrap();
                        w.canceled_at = Some(model.rev);
                    }
                }
            }
            Op::Flush => store.flush().unwrap(),
        }
    }
    // Drain until every live watcher has all its events.
    let deadline = Instant::now() + WAIT;
    for w in watchers.iter().filter(|w| w.canceled_at.is_none()) {
        let want = w.expected(&model).len();
        while got.get(&(w.stream, w.id)).map_or(0, Vec::len) < want {
            assert!(
                Instant::now() < deadline,
                "watcher {} of stream {} starved",
                w.id,
                w.stream
            );
            for (i, s) in streams.iter().enumerate() {
                if let Some(r) = s.recv_timeout(Duration::from_millis(1)) {
                    record(&mut got, i, r);
                }
            }
        }
    }
    for (i, s) in streams.iter().enumerate() {
        while let Some(r) = s.recv_timeout(Duration::from_millis(20)) {
            record(&mut got, i, r);
        }
    }
    for w in &watchers {
        let want = w.expected(&model);
        let have = got.remove(&(w.stream, w.id)).unwrap_or_default();
        if w.canceled_at.is_some() {
            // Events queued but not received before the cancel are dropped: a prefix.
            assert!(
                have.len() <= want.len() && have[..] == want[..have.len()],
                "cancelled watcher {} of stream {}: {:?} is not a prefix of {:?}",
                w.id,
                w.stream,
                summary(&have),
                summary(&want)
            );
        } else {
            assert_eq!(have, want, "watcher {} of stream {}", w.id, w.stream);
        }
    }
    assert!(
        got.is_empty(),
        "responses for unknown watchers: {:?}",
        got.keys()
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, max_shrink_time: 60_000, ..ProptestConfig::default() })]

    #[test]
    fn every_watcher_gets_its_events_once_in_order(ops in proptest::collection::vec(op(), 1..80)) {
        run_model(&ops);
    }
}
