//! A sole voter takes the Ready loop's turn on the proposing thread (`RaftNode::propose`):
//! proposals made in one pass of their caller share that turn's WAL fsync, and a stopped node
//! answers a proposal instead of leaving it waiting. Alone in its binary: it counts the
//! process's WAL fsyncs.

mod harness;

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use consensus::metrics::WAL_FSYNC;
use consensus::{Error, RaftNode};
use harness::{fast, Cluster};

type Proposal<'a> = Pin<Box<dyn Future<Output = consensus::Result<u64>> + 'a>>;

/// Polls every future in turn, as one connection polls its calls, until all are done.
async fn poll_together(mut futs: Vec<Proposal<'_>>) -> Vec<consensus::Result<u64>> {
    let mut out: Vec<Option<consensus::Result<u64>>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                if let Poll::Ready(r) = f.as_mut().poll(cx) {
                    *o = Some(r);
                }
            }
        }
        if out.iter().all(Option::is_some) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

/// `n` proposals, each made when its future is first polled (as a server's call makes it).
fn lazy_proposals(node: &RaftNode<u64>, n: usize) -> Vec<Proposal<'_>> {
    (0..n)
        .map(|i| {
            Box::pin(async move { node.propose(format!("v{i}").into_bytes()).await })
                as Proposal<'_>
        })
        .collect()
}

#[test]
fn proposals_made_together_share_one_fsync_and_a_stopped_node_answers() {
    let mut c = Cluster::new(1, fast);
    c.leader();
    // The first write of its term makes the member a sole leader (see `RaftNode::read_index`).
    c.propose(1, b"first".to_vec()).unwrap();

    let n = 100;
    let before = WAL_FSYNC.get_sample_count();
    let results = c.rt.block_on(poll_together(lazy_proposals(c.node(1), n)));
    let fsyncs = WAL_FSYNC.get_sample_count() - before;
    let mut indexes: Vec<u64> = results.into_iter().map(|r| r.unwrap()).collect();
    indexes.sort_unstable();
    indexes.dedup();
    assert_eq!(indexes.len(), n, "each proposal has its own entry");
    // Made one by one, each would take its own turn: n fsyncs.
    assert!(
        fsyncs <= 3,
        "{n} proposals made in one pass took {fsyncs} fsyncs"
    );

    // One at a time, each is answered (and applied) by the turn its own future takes.
    for i in 0..20 {
        c.propose(1, format!("one-{i}").into_bytes()).unwrap();
    }

    // Stopped, the node answers at once: its loop has ended, nothing takes the turn.
    c.nodes.get_mut(&1).unwrap().stop();
    let after_stop = c.rt.block_on(poll_together(lazy_proposals(c.node(1), 3)));
    for r in after_stop {
        assert!(matches!(r, Err(Error::Stopped)), "{r:?}");
    }
    c.restart(1);
    c.leader();
    c.check();
}
