//! A KV server that does no work: the floor under any server's cost per call, for the
//! measurements in docs/measurements.md. Range and Put answer an empty response at once (Put after one
//! 4 KiB `fdatasync` with `NOOP_FSYNC=1`); nothing is stored. With `NOOP_APPEND=<bytes>` as well,
//! a put appends a record of that many bytes to a log-like file and syncs it, where it would
//! overwrite one page: a log's floor (`tests/tools/put1-floor.sh` runs both).
//!
//! `NOOP_STACK=tonic` serves it with tonic's server (hyper + h2 + tower), `NOOP_STACK=wire` (the
//! default) with grpc-wire, as kvd's client port does. It listens on 127.0.0.1:23790 (or
//! `NOOP_CLIENT`) and ignores its arguments, so `tests/tools/server-cpu.sh` drives it like kvd:
//!
//! ```sh
//! cargo build --release -p kvd --example noop-kv
//! NOOP_STACK=tonic tests/tools/server-cpu.sh target/release/examples/noop-kv range-s
//! NOOP_STACK=wire  tests/tools/server-cpu.sh target/release/examples/noop-kv range-s
//! NOOP_FSYNC=1     tests/tools/server-cpu.sh target/release/examples/noop-kv put1
//! ```
//!
//! Three of them make the floor under a three-member cluster's write
//! (`tests/tools/cluster-put1.sh` starts them so): a follower (`NOOP_PEER_LISTEN=addr`) takes
//! each length-prefixed message on a plain TCP connection, does the 4 KiB `fdatasync` and
//! answers one byte; the leader
//! (`NOOP_PEERS=addr,addr`, with `NOOP_FSYNC=1`) sends a put's request to every follower, does
//! its own fsync, and answers once one follower has (a majority of three): raft's messages and
//! fsyncs for a write, and nothing else.
//!
//! It serves Watch too (`watch.rs`): each put's event goes to the watchers of its key, encoded
//! once, with nothing stored: the floor under a watch fan-out (`tests/tools/watch-floor.sh`).
//! With `NOOP_FSYNC=group` a thread makes puts durable together, as a server does its
//! concurrent writes: it takes every put waiting, does the one `fdatasync`, then answers them
//! and hands out their events (the grpc-wire stack only); three of them, given each other's
//! addresses, make a cluster whose every member serves clients (`log.rs`).

mod log;
mod watch;

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use api::etcdserverpb::kv_server::{Kv, KvServer};
use api::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, RangeStreamResponse, ResponseHeader, TxnRequest,
    TxnResponse,
};
use bytes::Bytes;
use prost::Message;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status};

/// The work a put does: nothing, or one `fdatasync` of a 4 KiB overwrite; and with followers,
/// sending them the request and waiting for one to have synced it too.
#[derive(Debug, Clone)]
struct Noop {
    file: Option<Arc<std::fs::File>>,
    peers: Option<Arc<Peers>>,
    /// The revision, and the Watch streams a put's event goes to.
    hub: Arc<watch::Hub>,
    /// With `NOOP_FSYNC=group`: the puts waiting for the syncing thread.
    group: Option<Arc<log::Group>>,
    /// A follower serving clients: the way to the leader for their puts (`log.rs`).
    forward: Option<Arc<log::Forwarder>>,
}

/// A no-op leader's followers: the sending halves of their connections (locked together, so
/// every follower gets the messages in the order of their numbers) and the highest message
/// number any of them has answered.
#[derive(Debug)]
struct Peers {
    out: tokio::sync::Mutex<(u64, Vec<tokio::net::tcp::OwnedWriteHalf>)>,
    acked: tokio::sync::watch::Sender<u64>,
}

/// What a put writes: 4 KiB of ones (the whole page, or the start of it for an appended record).
static ONES: [u8; 4096] = [1; 4096];
/// With `NOOP_APPEND=<bytes>` (at most 4,096): each put appends a record of that many bytes after
/// the last, in a file zero-filled ahead (`APPEND_SPAN`), as a log does; it wraps at its end.
static APPEND: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
static APPEND_AT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
const APPEND_SPAN: u64 = 64 << 20;

fn append_len() -> Option<usize> {
    *APPEND.get_or_init(|| {
        let n = std::env::var("NOOP_APPEND").ok()?.parse::<usize>().ok()?;
        Some(n.clamp(1, ONES.len()))
    })
}

/// One 4 KiB overwrite of `f`'s first page (or one appended record), made durable.
fn sync_page(f: &std::fs::File) {
    match append_len() {
        None => f.write_all_at(&ONES, 0).expect("write"),
        Some(n) => {
            let n = n as u64;
            let at = APPEND_AT.fetch_add(n, std::sync::atomic::Ordering::Relaxed)
                % (APPEND_SPAN - APPEND_SPAN % n);
            f.write_all_at(&ONES[..n as usize], at).expect("write")
        }
    }
    f.sync_data().expect("fdatasync");
}

/// Connects to `addr` (retrying for 5 s while it starts), without Nagle's delay.
async fn dial(addr: &str) -> std::io::Result<tokio::net::TcpStream> {
    let mut tries = 0;
    let sock = loop {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(s) => break s,
            Err(_) if tries < 100 => tries += 1,
            Err(e) => return Err(e),
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    sock.set_nodelay(true)?;
    Ok(sock)
}

impl Peers {
    /// Connects to each follower (retrying while they start) and counts their answers.
    async fn connect(addrs: &str) -> std::io::Result<Peers> {
        let (acked, _) = tokio::sync::watch::channel(0);
        let mut out = Vec::new();
        for addr in addrs.split(',') {
            let (mut rd, wr) = dial(addr).await?.into_split();
            out.push(wr);
            let acked = acked.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let (mut n, mut buf) = (0u64, [0u8; 256]);
                while let Ok(k) = rd.read(&mut buf).await {
                    if k == 0 {
                        break;
                    }
                    n += k as u64;
                    acked.send_modify(|a| *a = (*a).max(n));
                }
            });
        }
        Ok(Peers {
            out: tokio::sync::Mutex::new((0, out)),
            acked,
        })
    }

    /// Sends `msg` to every follower, runs `sync` meanwhile, and waits for one follower's answer.
    async fn replicate(&self, msg: &[u8], sync: impl FnOnce()) {
        use tokio::io::AsyncWriteExt;
        let mut frame = (msg.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(msg);
        let mut rx = self.acked.subscribe();
        let seq = {
            let mut out = self.out.lock().await;
            out.0 += 1;
            for w in &mut out.1 {
                w.write_all(&frame).await.expect("send to a follower");
            }
            out.0
        };
        sync();
        rx.wait_for(|a| *a >= seq).await.expect("followers");
    }
}

/// A no-op follower: every message on a connection is synced and answered with one byte; the
/// messages read together share one fsync.
async fn follow(addr: &str, file: Arc<std::fs::File>) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind(addr).await?;
    loop {
        let (sock, _) = l.accept().await?;
        sock.set_nodelay(true)?;
        let file = file.clone();
        tokio::spawn(async move {
            let mut sock = tokio::io::BufReader::new(sock);
            let mut msg = Vec::new();
            loop {
                let mut n = 0;
                loop {
                    let Ok(len) = sock.read_u32().await else {
                        return;
                    };
                    msg.resize(len as usize, 0);
                    if sock.read_exact(&mut msg).await.is_err() {
                        return;
                    }
                    n += 1;
                    if sock.buffer().len() < 4 {
                        break;
                    }
                }
                sync_page(&file);
                if sock.get_mut().write_all(&vec![1; n]).await.is_err() {
                    return;
                }
            }
        });
    }
}

impl Noop {
    fn header(revision: i64) -> Option<ResponseHeader> {
        Some(ResponseHeader {
            revision,
            ..Default::default()
        })
    }

    /// A put: the fsync (if any), then its event to the watchers of its key.
    fn put(&self, req: PutRequest) -> PutResponse {
        if let Some(f) = &self.file {
            sync_page(f);
        }
        self.put_done(req)
    }

    /// A put made durable: its revision, and its event to the watchers of its key.
    fn put_done(&self, req: PutRequest) -> PutResponse {
        PutResponse {
            header: Self::header(self.hub.put(req.key, req.value)),
            ..Default::default()
        }
    }

    fn range(&self) -> RangeResponse {
        RangeResponse {
            header: Self::header(self.hub.rev()),
            ..Default::default()
        }
    }
}

/// The same, as a tonic service.
#[derive(Debug)]
struct TonicNoop(Arc<Noop>);

#[tonic::async_trait]
impl Kv for TonicNoop {
    async fn range(&self, _: Request<RangeRequest>) -> Result<Response<RangeResponse>, Status> {
        Ok(Response::new(self.0.range()))
    }
    type RangeStreamStream = tonic::codegen::BoxStream<RangeStreamResponse>;
    async fn range_stream(
        &self,
        _: Request<RangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        Err(Status::unimplemented("not served"))
    }
    async fn put(&self, req: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        Ok(Response::new(self.0.put(req.into_inner())))
    }
    async fn delete_range(
        &self,
        _: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        Err(Status::unimplemented("noop"))
    }
    async fn txn(&self, _: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        Err(Status::unimplemented("noop"))
    }
    async fn compact(
        &self,
        _: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        Err(Status::unimplemented("noop"))
    }
}

impl grpc_wire::Unary for Noop {
    fn route(&self, path: &[u8]) -> Option<usize> {
        match path {
            b"/etcdserverpb.KV/Range" => Some(0),
            b"/etcdserverpb.KV/Put" => Some(1),
            _ => None,
        }
    }

    fn call(
        &self,
        id: usize,
        msg: Bytes,
        _head: grpc_wire::CallHead<'_>,
    ) -> grpc_wire::UnaryFuture {
        // Decoded as a real server would (a range's request then dropped).
        if id == 0 {
            drop(RangeRequest::decode(msg));
            let out = self.range().encode_to_vec();
            return Box::pin(std::future::ready(Ok(Bytes::from(out))));
        }
        let req = match PutRequest::decode(msg.clone()) {
            Ok(req) => req,
            Err(e) => return Box::pin(std::future::ready(Err(Status::internal(e.to_string())))),
        };
        // With a log (`NOOP_FSYNC=group`): a follower forwards the put, a leader queues it.
        if let Some(leader) = &self.forward {
            return answered_by_log(leader.forward(&msg));
        }
        if let Some(group) = &self.group {
            return answered_by_log(group.submit(msg, req));
        }
        let Some(peers) = self.peers.clone() else {
            let out = self.put(req).encode_to_vec();
            return Box::pin(std::future::ready(Ok(Bytes::from(out))));
        };
        // A leader: its followers and its own fsync.
        let (file, noop) = (self.file.clone(), self.clone());
        Box::pin(async move {
            peers
                .replicate(&msg, || file.iter().for_each(|f| sync_page(f)))
                .await;
            Ok(Bytes::from(noop.put_done(req).encode_to_vec()))
        })
    }
}

/// A put's answer from the log, encoded.
fn answered_by_log(
    answered: tokio::sync::oneshot::Receiver<PutResponse>,
) -> grpc_wire::UnaryFuture {
    Box::pin(async move {
        let resp = answered
            .await
            .map_err(|_| Status::unavailable("noop: no log"))?;
        Ok(Bytes::from(resp.encode_to_vec()))
    })
}

/// `NOOP_FSYNC=group`: the syncing thread, and a three-member no-op's log (`log.rs`): a
/// follower's (`NOOP_LOG_LISTEN`, `NOOP_LEADER`) or a leader's (`NOOP_LOG_PEERS`,
/// `NOOP_FORWARD_LISTEN`).
async fn start_log(noop: &mut Noop, file: Arc<std::fs::File>) -> std::io::Result<()> {
    if let Ok(addr) = std::env::var("NOOP_LOG_LISTEN") {
        let n = noop.clone();
        std::thread::spawn(move || {
            if let Err(e) = log::follow_forever(&addr, &n, &file) {
                eprintln!("noop-kv: the log on {addr}: {e}");
                std::process::exit(1);
            }
        });
        let leader = std::env::var("NOOP_LEADER").map_err(std::io::Error::other)?;
        noop.forward = Some(log::Forwarder::connect(&leader).await?);
        return Ok(());
    }
    let followers = match std::env::var("NOOP_LOG_PEERS") {
        Ok(addrs) => Some(tokio::task::block_in_place(|| {
            log::Followers::connect(&addrs)
        })?),
        Err(_) => None,
    };
    let group = Arc::new(log::Group::default());
    let (g, n) = (group.clone(), noop.clone());
    std::thread::spawn(move || g.sync_forever(&n, &file, followers));
    if let Ok(addr) = std::env::var("NOOP_FORWARD_LISTEN") {
        tokio::spawn(log::serve_forwarded(addr, group.clone()));
    }
    noop.group = Some(group);
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = match std::env::var_os("NOOP_FSYNC").or(std::env::var_os("NOOP_PEER_LISTEN")) {
        None => None,
        Some(_) => {
            let f = tempfile::tempfile()?;
            match append_len() {
                None => f.write_all_at(&[0; 4096], 0)?,
                Some(_) => {
                    // In 64 KiB writes, as kvd's WAL zero-fills its segments: the page cache
                    // keeps a file in folios the size of the writes that made them, and
                    // appends into larger ones cost the kernel more.
                    let zeros = vec![0; 64 << 10];
                    for i in 0..APPEND_SPAN / zeros.len() as u64 {
                        f.write_all_at(&zeros, i * zeros.len() as u64)?;
                    }
                }
            }
            f.sync_all()?;
            Some(Arc::new(f))
        }
    };
    let tonic_stack = std::env::var("NOOP_STACK").is_ok_and(|s| s == "tonic");
    let client = std::env::var("NOOP_CLIENT").unwrap_or_else(|_| "127.0.0.1:23790".into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let hub = Arc::new(watch::Hub::new());
    rt.block_on(async move {
        // SIGTERM ends it through `exit`, as it ends kvd: what runs at exit runs (a counting
        // build's profile, tests/tools/pgo-build.sh). What its watchers were sent goes to
        // stderr.
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let watched = hub.clone();
        tokio::spawn(async move {
            term.recv().await;
            eprintln!("{}", watched.summary());
            std::process::exit(0)
        });
        if let (Ok(addr), Some(file)) = (std::env::var("NOOP_PEER_LISTEN"), &file) {
            follow(&addr, file.clone()).await?;
            return Ok(());
        }
        let peers = match std::env::var("NOOP_PEERS") {
            Ok(addrs) => Some(Arc::new(Peers::connect(&addrs).await?)),
            Err(_) => None,
        };
        let mut noop = Noop {
            file,
            peers,
            hub: hub.clone(),
            group: None,
            forward: None,
        };
        if std::env::var("NOOP_FSYNC").is_ok_and(|v| v == "group") {
            if let Some(file) = noop.file.take() {
                start_log(&mut noop, file).await?;
            }
        }
        let noop = Arc::new(noop);
        let watch = watch::WatchServer(hub);
        let l = tokio::net::TcpListener::bind(&client).await?;
        if tonic_stack {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(l)
                .map(|s| s.inspect(|s| drop(s.set_nodelay(true))));
            tonic::transport::Server::builder()
                .add_service(KvServer::new(TonicNoop(noop)))
                .add_service(watch)
                .serve_with_incoming(incoming)
                .await?;
            return Ok(());
        }
        let cfg = Arc::new(grpc_wire::Config::default());
        let unary: Arc<dyn grpc_wire::Unary> = noop;
        loop {
            let (mut sock, _) = l.accept().await?;
            sock.set_nodelay(true)?;
            let (cfg, unary, watch) = (cfg.clone(), unary.clone(), watch.clone());
            tokio::spawn(async move {
                if let Ok((grpc_wire::Protocol::Http2, first)) = grpc_wire::sniff(&mut sock).await {
                    let never = std::future::pending();
                    let _ = grpc_wire::serve(
                        sock,
                        &first,
                        cfg,
                        unary,
                        watch,
                        Default::default(),
                        never,
                    )
                    .await;
                }
            });
        }
    })
}
