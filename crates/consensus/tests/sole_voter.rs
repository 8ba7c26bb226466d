//! A sole voter takes the Ready loop's turn on the proposing thread (`RaftNode::propose`):
//! proposals made in one pass of their caller share that turn's WAL fsync, a lone caller's
//! proposal takes it at once while proposals come one at a time, and a stopped node answers a
//! proposal instead of leaving it waiting. Alone in its binary, its tests one at a time: they
//! count the process's WAL fsyncs.

mod harness;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;

use consensus::metrics::WAL_FSYNC;
use consensus::{Company, Error, RaftNode, LONE_TURNS};
use harness::{fast, Cluster};

type Proposal<'a> = Pin<Box<dyn Future<Output = consensus::Result<u64>> + 'a>>;

/// Both tests count the process's WAL fsyncs: they run one at a time, or each would count the
/// other's.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Polls every future in turn, as one connection polls its calls, until all are done.
async fn poll_together(futs: Vec<Proposal<'_>>) -> Vec<consensus::Result<u64>> {
    let out = poll_together_noting_first(futs).await;
    out.into_iter().map(|(r, _)| r).collect()
}

/// [`poll_together`], with whether each future's first poll finished it (its turn taken at
/// once, not after a yield).
async fn poll_together_noting_first(
    mut futs: Vec<Proposal<'_>>,
) -> Vec<(consensus::Result<u64>, bool)> {
    let mut out: Vec<Option<consensus::Result<u64>>> = futs.iter().map(|_| None).collect();
    let mut first: Vec<Option<bool>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        for ((f, o), first) in futs.iter_mut().zip(out.iter_mut()).zip(first.iter_mut()) {
            if o.is_none() {
                let p = f.as_mut().poll(cx);
                first.get_or_insert(p.is_ready());
                if let Poll::Ready(r) = p {
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
    out.into_iter()
        .flatten()
        .zip(first.into_iter().flatten())
        .collect()
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
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
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

/// A proposal (of a value of its own) whose caller says it has `company` or none, made when
/// first polled.
fn proposal(node: &RaftNode<u64>, company: Company) -> Proposal<'_> {
    static MADE: AtomicU64 = AtomicU64::new(0);
    let n = MADE.fetch_add(1, Ordering::Relaxed);
    Box::pin(async move {
        let data = format!("lone-{n}").into_bytes();
        node.propose_local(data.clone(), Box::new(data), company)
            .await
    })
}

/// Runs `f` to its end: whether its first poll finished it (the turn taken at once, not after
/// a yield).
fn done_in_first_poll(c: &Cluster, f: Proposal<'_>) -> bool {
    let (r, first) = c.rt.block_on(poll_together_noting_first(vec![f])).remove(0);
    r.unwrap();
    first
}

#[test]
fn a_lone_callers_proposal_takes_its_turn_at_once_until_company_comes() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::new(1, fast);
    c.leader();
    let node = c.node(1);
    // Until LONE_TURNS turns in a row each took one proposal, a lone caller's yields first.
    let mut at_once = Vec::new();
    for _ in 0..=LONE_TURNS {
        at_once.push(done_in_first_poll(&c, proposal(node, Company::None)));
    }
    let yields = usize::try_from(LONE_TURNS).unwrap();
    assert!(at_once[..yields].iter().all(|&a| !a), "{at_once:?}");
    assert!(
        at_once[yields],
        "a lone caller's proposal waited: {at_once:?}"
    );
    // A caller that may have company yields still.
    assert!(!done_in_first_poll(&c, proposal(node, Company::Maybe)));

    // Proposals made together (a connection's calls polled in one pass): the first, made
    // while none waits, cannot know of the others, but its caller can (`Company::Maybe`): it
    // yields, and one turn takes them all.
    let before = WAL_FSYNC.get_sample_count();
    let together = (0..10).map(|_| proposal(node, Company::Maybe)).collect();
    for r in c.rt.block_on(poll_together(together)) {
        r.unwrap();
    }
    assert!(WAL_FSYNC.get_sample_count() - before <= 2);
    // That company starts the count over: a lone caller's next proposal yields.
    assert!(!done_in_first_poll(&c, proposal(node, Company::None)));

    // Two made together, one by a caller that knows of no other: neither takes its turn at
    // once (the other waits), and the count starts over.
    for _ in 0..LONE_TURNS {
        done_in_first_poll(&c, proposal(node, Company::None));
    }
    let two = vec![
        proposal(node, Company::Maybe),
        proposal(node, Company::None),
    ];
    let firsts: Vec<bool> =
        c.rt.block_on(poll_together_noting_first(two))
            .into_iter()
            .map(|(r, first)| r.map(|_| first).unwrap())
            .collect();
    assert_eq!(firsts, [false, false], "neither took its turn at once");
    assert!(!done_in_first_poll(&c, proposal(node, Company::None)));
    c.check();
}
