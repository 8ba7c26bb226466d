//! Many upstream watchers on one upstream Watch stream. A watcher is created with etcd's
//! create request and answered with its id, the created response and a channel of its
//! responses; dropping the [`Watcher`] cancels it upstream. When the stream breaks, every
//! watcher's channel ends (its owner watches again from where it was), and the next create
//! opens a new stream.
//!
//! The channels are unbounded, so one slow owner never holds the stream up for the others;
//! owners are the proxy's own tasks, which drain them at once (a client's watch is fed by a
//! broadcast task that bounds what it keeps per client: `watch.rs`).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use api::etcdserverpb::watch_client::WatchClient;
use api::etcdserverpb::watch_request::RequestUnion;
use api::etcdserverpb::{WatchCancelRequest, WatchCreateRequest, WatchRequest, WatchResponse};
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use crate::calls::Calls;
use crate::upstream::Creds;

/// A created watcher: its upstream id, the created response, and its later responses.
#[derive(Debug)]
pub struct Watcher {
    pub id: i64,
    pub created: WatchResponse,
    pub rx: mpsc::UnboundedReceiver<WatchResponse>,
    cancel: Option<(mpsc::UnboundedSender<Cmd>, u64)>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if let Some((tx, stream)) = self.cancel.take() {
            let _ = tx.send(Cmd::Cancel(self.id, stream));
        }
    }
}

type Created = oneshot::Sender<Result<Watcher, Status>>;

#[derive(Debug)]
enum Cmd {
    Create(WatchCreateRequest, Created),
    /// A watcher's owner let it go: its id, on the stream of that number.
    Cancel(i64, u64),
}

/// The multiplexer: cheap to clone; its stream ends when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct WatchMux {
    tx: mpsc::UnboundedSender<Cmd>,
}

impl WatchMux {
    /// Runs one upstream stream at a time (a new one when the last broke) through `calls`,
    /// with the credentials `creds` (the cluster checks each create against them).
    pub fn new(calls: Calls, creds: Creds) -> WatchMux {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(calls, creds, tx.downgrade(), rx));
        WatchMux { tx }
    }

    /// Creates a watcher upstream. etcd's refusals (a compacted start revision, a permission
    /// denied) come back in `created`: canceled, with the reason.
    pub async fn watch(&self, req: WatchCreateRequest) -> Result<Watcher, Status> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Cmd::Create(req, tx))
            .map_err(|_| Status::unavailable("the proxy is stopping"))?;
        rx.await
            .map_err(|_| Status::unavailable("upstream watch stream broke"))?
    }
}

async fn run(
    calls: Calls,
    creds: Creds,
    me: mpsc::WeakUnboundedSender<Cmd>,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
) {
    let mut stream_no = 0u64;
    // A create waiting for a stream (the first, or the next after one broke).
    let mut carry: Option<(WatchCreateRequest, Created)> = None;
    loop {
        let first = match carry.take() {
            Some(c) => c,
            None => loop {
                match cmds.recv().await {
                    Some(Cmd::Create(r, tx)) => break (r, tx),
                    Some(Cmd::Cancel(..)) => continue,
                    None => return,
                }
            },
        };
        stream_no += 1;
        let s = Stream {
            calls: &calls,
            creds: &creds,
            me: me.clone(),
            no: stream_no,
        };
        match s.serve(&mut cmds, first).await {
            Ended::Closed => return,
            Ended::Broke(c) => carry = c,
        }
    }
}

enum Ended {
    /// Every handle is gone.
    Closed,
    /// The stream broke; a create that found it broken is handed back.
    Broke(Option<(WatchCreateRequest, Created)>),
}

struct Stream<'a> {
    calls: &'a Calls,
    creds: &'a Creds,
    /// Weak: a stream alone does not keep the multiplexer alive.
    me: mpsc::WeakUnboundedSender<Cmd>,
    no: u64,
}

impl Stream<'_> {
    async fn serve(
        self,
        cmds: &mut mpsc::UnboundedReceiver<Cmd>,
        first: (WatchCreateRequest, Created),
    ) -> Ended {
        let up = &self.calls.up;
        let (i, ch) = up.channel();
        let (req_tx, req_rx) = mpsc::unbounded_channel::<WatchRequest>();
        let ns = &self.calls.ns;
        let create = |mut r: WatchCreateRequest| {
            ns.watch(&mut r);
            WatchRequest {
                request_union: Some(RequestUnion::CreateRequest(r)),
            }
        };
        // Sent before the stream opens: the open waits for the server's headers, which some
        // servers send only with the first response.
        let _ = req_tx.send(create(first.0.clone()));
        self.calls.metrics.upstream.inc();
        let opened = WatchClient::new(ch)
            .max_decoding_message_size(self.calls.max_recv)
            .watch(
                self.creds
                    .request(tokio_stream::wrappers::UnboundedReceiverStream::new(req_rx)),
            )
            .await;
        let mut resps = match opened {
            Ok(r) => r.into_inner(),
            Err(s) => {
                up.failed(i, &s);
                let _ = first.1.send(Err(s));
                tokio::time::sleep(Duration::from_millis(100)).await;
                return Ended::Broke(None);
            }
        };
        let mut pending: VecDeque<Created> = VecDeque::from([first.1]);
        let mut watchers: HashMap<i64, mpsc::UnboundedSender<WatchResponse>> = HashMap::new();
        loop {
            tokio::select! {
                c = cmds.recv() => match c {
                    Some(Cmd::Create(r, tx)) => {
                        if req_tx.send(create(r.clone())).is_err() {
                            return Ended::Broke(Some((r, tx)));
                        }
                        pending.push_back(tx);
                    }
                    Some(Cmd::Cancel(id, no)) => {
                        if no == self.no && watchers.remove(&id).is_some() {
                            let _ = req_tx.send(cancel(id));
                        }
                    }
                    None => return Ended::Closed,
                },
                m = resps.message() => match m {
                    Ok(Some(mut r)) => {
                        up.saw(r.header.as_ref());
                        ns.watch_resp(&mut r);
                        if r.created {
                            let Some(tx) = pending.pop_front() else { continue };
                            let (wtx, wrx) = mpsc::unbounded_channel();
                            let id = r.watch_id;
                            let live = !r.canceled;
                            if live {
                                watchers.insert(id, wtx);
                            }
                            let w = Watcher {
                                id,
                                created: r,
                                rx: wrx,
                                cancel: self.me.upgrade().filter(|_| live).map(|me| (me, self.no)),
                            };
                            // A creator gone meanwhile drops the watcher: it cancels itself.
                            let _ = tx.send(Ok(w));
                            continue;
                        }
                        let id = r.watch_id;
                        let end = r.canceled;
                        let gone = watchers.get(&id).is_some_and(|w| w.send(r).is_err());
                        if end {
                            watchers.remove(&id);
                        } else if gone {
                            watchers.remove(&id);
                            let _ = req_tx.send(cancel(id));
                        }
                    }
                    Ok(None) | Err(_) => {
                        if let Err(s) = &m {
                            up.failed(i, s);
                            tracing::debug!("upstream watch stream broke: {}", s.message());
                        }
                        // Every watcher's channel closes with `watchers`; waiting creates fail.
                        for tx in pending {
                            let _ = tx.send(Err(Status::unavailable("upstream watch stream broke")));
                        }
                        return Ended::Broke(None);
                    }
                },
            }
        }
    }
}

fn cancel(id: i64) -> WatchRequest {
    WatchRequest {
        request_union: Some(RequestUnion::CancelRequest(WatchCancelRequest {
            watch_id: id,
        })),
    }
}
