//! Writes the seed corpora the fuzz targets start from, into `fuzz/corpus/<target>/`: real
//! database files and WAL segments made by kvd's own code, the bytes a real HTTP/2 client
//! (h2, as tonic uses it) sends for gRPC calls plus hand-made frames for the corners, JSON
//! gateway bodies, and store operation streams. Run `cargo run -p kvd-fuzz --bin seeds`;
//! `tests/tools/fuzz.sh` does it before fuzzing. Seeds are named by their content's hash,
//! so running it twice adds nothing.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

type Seeds = Vec<Vec<u8>>;

fn main() -> io::Result<()> {
    let root = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus"));
    let sets: [(&str, Seeds); 8] = [
        ("pager_open", pager_files()?),
        ("bbolt_open", bbolt_files()?),
        ("wal_open", wal_segments()?),
        ("http2_conn", http2_streams()?),
        ("gateway_json", gateway_bodies()),
        ("store_model", store_streams()),
        ("raft_apply", raft_entries()),
        ("peer_stream", peer_streams()),
    ];
    for (target, seeds) in sets {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir)?;
        for s in &seeds {
            std::fs::write(dir.join(name(s)), s)?;
        }
        println!("{target}: {} seeds in {}", seeds.len(), dir.display());
    }
    Ok(())
}

/// A file name from the content (FNV-1a, 64 bits), as stable as libFuzzer's own names.
fn name(data: &[u8]) -> String {
    let h = data.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100000001b3)
    });
    format!("seed-{h:016x}")
}

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// Database files: empty, small keys in two buckets, values spilling to overflow pages,
/// and one with half its keys deleted (a freelist with runs). The free-set kind is not in
/// the file, so one kind makes them all. Small pages keep them small; the zeros the file
/// grew by are cut back to the shortest length that still opens.
fn pager_files() -> io::Result<Seeds> {
    let mut out = Vec::new();
    for (page_size, shapes) in [(4096, 0..1), (1024, 0..4)] {
        for shape in shapes {
            let dir = tempfile::tempdir()?;
            let path = dir.path().join("db");
            let opts = pager::Options {
                page_size: Some(page_size),
                ..pager::Options::default()
            };
            let db = pager::Db::open(&path, opts).map_err(other)?;
            let fill = |n: u32, size: usize| -> pager::Result<()> {
                let mut w = db.begin_write()?;
                for bucket in [&b"key"[..], b"meta"] {
                    let mut b = w.create_bucket_if_missing(bucket)?;
                    for i in 0..n {
                        b.put(format!("k{i:04}").as_bytes(), &vec![i as u8; size])?;
                    }
                }
                w.commit()
            };
            match shape {
                0 => {}
                1 => fill(40, 16).map_err(other)?,
                2 => fill(3, 2500).map_err(other)?,
                _ => {
                    fill(200, 40).map_err(other)?;
                    let mut w = db.begin_write().map_err(other)?;
                    {
                        let mut b = w.bucket(b"key").map_err(other)?;
                        for i in (0..200).step_by(2) {
                            b.delete(format!("k{i:04}").as_bytes()).map_err(other)?;
                        }
                    }
                    w.commit().map_err(other)?;
                }
            }
            db.close().map_err(other)?;
            out.push(shortest_that_opens(&path, page_size as usize)?);
        }
    }
    Ok(out)
}

/// etcd-shaped bbolt files as kvd writes them, with 1024-byte pages: empty buckets; revisions,
/// leases and meta keys; values spilling to overflow pages; enough keys for branch pages.
/// (The corpus also keeps `etcd-3.6-snapshot`, a snapshot saved from etcd 3.6.5, for the
/// inline buckets and unsynced freelist of files bbolt itself writes.)
fn bbolt_files() -> io::Result<Seeds> {
    let mut out = Vec::new();
    for (n, size) in [(0u32, 0usize), (5, 20), (3, 3000), (300, 30)] {
        let mut feed = |s: &mut bbolt::Sink<'_>| -> Result<(), bbolt::Error> {
            for name in ["key", "lease", "meta"] {
                s.bucket(name.as_bytes())?;
                for i in 0..n {
                    let k = match name {
                        "key" => mvcc::Rev::new(i64::from(i) + 2, 0)
                            .to_key(false)
                            .as_bytes()
                            .to_vec(),
                        _ => (u64::from(i) + 1).to_be_bytes().to_vec(),
                    };
                    s.put(&k, &vec![i as u8; size])?;
                }
            }
            Ok(())
        };
        let layout = bbolt::plan(1024, &mut feed).map_err(other)?;
        let mut file = Vec::new();
        bbolt::write(&layout, &mut file, &mut feed).map_err(other)?;
        out.push(file);
    }
    Ok(out)
}

/// The file at `path` cut after its last page holding anything but zeros, then grown a page
/// at a time until the pager opens it (its meta says how many pages it must have).
fn shortest_that_opens(path: &Path, page_size: usize) -> io::Result<Vec<u8>> {
    let full = std::fs::read(path)?;
    let used = full.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
    let mut len = used.next_multiple_of(page_size);
    let probe = path.with_extension("probe");
    while len < full.len() {
        std::fs::write(&probe, &full[..len])?;
        if pager::Db::open(&probe, pager::Options::default()).is_ok() {
            break;
        }
        std::fs::remove_file(&probe)?;
        len += page_size;
    }
    Ok(full[..len.min(full.len())].to_vec())
}

/// WAL segments: metadata only; entries and hard states; entries overwritten by a later
/// term; a snapshot mark with entries after it. Trailing zeros (preallocation) are cut.
fn wal_segments() -> io::Result<Seeds> {
    use raft::eraftpb::{Entry, HardState};
    let entry = |index: u64, term: u64, data: &[u8]| Entry {
        index,
        term,
        data: data.to_vec().into(),
        ..Default::default()
    };
    let hard = |term: u64, commit: u64| HardState {
        term,
        vote: 1,
        commit,
        ..Default::default()
    };
    let mut out = Vec::new();
    for shape in 0..4 {
        let dir = tempfile::tempdir()?;
        let opts = consensus::wal::Options {
            segment_size: 1 << 16,
        };
        let mut wal =
            consensus::wal::Wal::create(dir.path(), b"cluster=1 member=1", opts).map_err(other)?;
        let es: Vec<Entry> = (1..=5).map(|i| entry(i, 1, b"put a=1")).collect();
        match shape {
            0 => {}
            1 => wal.save(Some(&hard(1, 3)), &es, true).map_err(other)?,
            2 => {
                wal.save(Some(&hard(1, 2)), &es, true).map_err(other)?;
                let newer = [entry(3, 2, b"put b=2"), entry(4, 2, b"")];
                wal.save(Some(&hard(2, 4)), &newer, true).map_err(other)?;
            }
            _ => {
                wal.save(Some(&hard(1, 5)), &es, true).map_err(other)?;
                let mark = consensus::wal::SnapshotMark {
                    index: consensus::RaftIndex(4),
                    term: 1,
                };
                wal.save_snapshot(mark).map_err(other)?;
                wal.save(None, &[entry(6, 1, b"put c=3")], true)
                    .map_err(other)?;
            }
        }
        let segs = wal.segment_paths();
        drop(wal);
        let mut data = std::fs::read(segs.last().ok_or_else(|| other("no segment"))?)?;
        let end = data.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
        data.truncate(end.next_multiple_of(8));
        out.push(data);
    }
    Ok(out)
}

/// A transport that keeps a copy of everything written to it.
struct Recorder<T> {
    inner: T,
    sent: Arc<Mutex<Vec<u8>>>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Recorder<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Recorder<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.sent
                .lock()
                .map_err(|_| other("poisoned"))?
                .extend_from_slice(&buf[..n]);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Answers every unary call with its own request message (as the `http2_conn` target does).
#[derive(Debug)]
struct Echo;

impl grpc_wire::Unary for Echo {
    fn route(&self, path: &[u8]) -> Option<usize> {
        path.starts_with(b"/echo").then_some(0)
    }

    fn call(&self, _: usize, msg: Bytes, _: grpc_wire::CallHead<'_>) -> grpc_wire::UnaryFuture {
        Box::pin(std::future::ready(Ok(msg)))
    }
}

/// A gRPC message: the compressed flag, the length, the payload.
fn grpc_msg(compressed: u8, declared: u32, payload: &[u8]) -> Vec<u8> {
    let mut m = vec![compressed];
    m.extend_from_slice(&declared.to_be_bytes());
    m.extend_from_slice(payload);
    m
}

/// What a real h2 client sends after the preface for `calls` gRPC calls on one connection
/// (the second and later reuse HPACK's dynamic table), the last one reset if `reset`.
async fn record(calls: usize, split: bool, reset: bool) -> io::Result<Vec<u8>> {
    let (client, server) = tokio::io::duplex(1 << 20);
    let sent = Arc::new(Mutex::new(Vec::new()));
    let rec = Recorder {
        inner: client,
        sent: sent.clone(),
    };
    let server = tokio::spawn(grpc_wire::serve(
        server,
        b"",
        Arc::new(grpc_wire::Config::default()),
        Arc::new(Echo),
        axum::Router::new(),
        http::Extensions::new(),
        std::future::pending(),
    ));
    let (mut h2c, conn) = h2::client::handshake(rec).await.map_err(other)?;
    let driver = tokio::spawn(conn);
    for i in 0..calls {
        let req = http::Request::post(format!("http://kvd/echo/{i}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("grpc-timeout", "5S")
            .body(())
            .map_err(other)?;
        h2c = h2c.ready().await.map_err(other)?;
        let (resp, mut body) = h2c.send_request(req, false).map_err(other)?;
        let msg = grpc_msg(0, 3, b"abc");
        if reset && i + 1 == calls {
            body.send_reset(h2::Reason::CANCEL);
            continue;
        }
        if split {
            body.send_data(Bytes::copy_from_slice(&msg[..4]), false)
                .map_err(other)?;
            body.send_data(Bytes::copy_from_slice(&msg[4..]), true)
                .map_err(other)?;
        } else {
            body.send_data(msg.into(), true).map_err(other)?;
        }
        let mut resp = resp.await.map_err(other)?.into_body();
        while let Some(chunk) = resp.data().await {
            let chunk = chunk.map_err(other)?;
            let _ = resp.flow_control().release_capacity(chunk.len());
        }
        let _ = resp.trailers().await;
    }
    drop(h2c);
    let _ = driver.await;
    server.abort();
    let bytes = sent.lock().map_err(|_| other("poisoned"))?.clone();
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    Ok(bytes.strip_prefix(PREFACE).unwrap_or(&bytes).to_vec())
}

/// One frame: length, type, flags, stream, payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.push(kind);
    f.push(flags);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A header block of literal fields without indexing, new names, no Huffman coding.
fn hpack(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut b = Vec::new();
    for (n, v) in fields {
        b.push(0);
        for s in [n, v] {
            assert!(s.len() < 127, "short strings only");
            b.push(s.len() as u8);
            b.extend_from_slice(s.as_bytes());
        }
    }
    b
}

fn request_head(path: &str, content_type: &str) -> Vec<u8> {
    hpack(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "kvd"),
        ("content-type", content_type),
        ("te", "trailers"),
    ])
}

const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// Hand-made frame sequences for what a well-behaved client never sends: a header block
/// continued, a wrong content-type, a message longer than its body, a compressed message,
/// unknown methods, resets, pings, window updates, empty frames, a GOAWAY.
fn handmade() -> Seeds {
    let settings = frame(4, 0, 0, &[]);
    let head = request_head("/echo/x", "application/grpc");
    let call = |stream: u32, head: &[u8], body: &[u8]| {
        let mut s = frame(1, END_HEADERS, stream, head);
        s.extend(frame(0, END_STREAM, stream, body));
        s
    };
    let with = |parts: &[Vec<u8>]| {
        let mut s = settings.clone();
        parts.iter().for_each(|p| s.extend_from_slice(p));
        s
    };
    let msg = grpc_msg(0, 3, b"abc");
    let (h1, h2) = head.split_at(head.len() / 2);
    vec![
        with(&[call(1, &head, &msg)]),
        with(&[
            frame(1, 0, 1, h1),
            frame(9, 0, 1, &[]),
            frame(9, END_HEADERS, 1, h2),
            frame(0, END_STREAM, 1, &msg),
        ]),
        with(&[call(1, &request_head("/echo/x", "text/plain"), &msg)]),
        with(&[call(1, &head, &grpc_msg(0, 10, b"abc"))]),
        with(&[call(1, &head, &grpc_msg(1, 3, b"abc"))]),
        with(&[call(
            1,
            &request_head("/nosuch/Method", "application/grpc"),
            &msg,
        )]),
        with(&[
            frame(1, END_HEADERS, 1, &head),
            frame(3, 0, 1, &8u32.to_be_bytes()),
        ]),
        with(&[
            frame(6, 0, 0, &[1, 2, 3, 4, 5, 6, 7, 8]),
            frame(8, 0, 0, &65535u32.to_be_bytes()),
            frame(0, 0, 1, &[]),
            call(3, &head, &msg),
        ]),
        with(&[
            frame(1, END_HEADERS, 1, &head),
            frame(0, 0, 1, &[]),
            frame(0, 0, 1, &[]),
            frame(0, END_STREAM, 1, &msg),
            frame(7, 0, 0, &[0, 0, 0, 0, 0, 0, 0, 0]),
        ]),
        with(&[frame(
            1,
            END_HEADERS,
            1,
            &hpack(&[("", ""), ("", ""), ("", ""), (":path", "/echo")]),
        )]),
        with(&[frame(4, 0, 0, &[0, 4, 0, 0, 0, 1, 0, 3, 0, 0, 0, 2])]),
    ]
}

fn http2_streams() -> io::Result<Seeds> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut out = handmade();
    for (calls, split, reset) in [(1, false, false), (3, true, false), (2, false, true)] {
        out.push(rt.block_on(record(calls, split, reset))?);
    }
    Ok(out)
}

/// Gateway bodies: the first byte picks the route (the `gateway_json` target's list).
fn gateway_bodies() -> Seeds {
    let bodies: &[(u8, &str)] = &[
        (
            0,
            r#"{"key":"YQ==","range_end":"AA==","limit":"10","sort_order":"DESCEND"}"#,
        ),
        (
            1,
            r#"{"key":"YQ==","value":"MQ==","lease":"7587","prev_kv":true}"#,
        ),
        (2, r#"{"key":"YQ==","range_end":"Yg=="}"#),
        (
            3,
            r#"{"compare":[{"key":"YQ==","target":"VERSION","result":"EQUAL","version":"0"}],"success":[{"request_put":{"key":"YQ==","value":"Yg=="}}],"failure":[{"request_range":{"key":"YQ=="}}]}"#,
        ),
        (4, r#"{"revision":"3","physical":true}"#),
        (
            5,
            r#"{"create_request":{"key":"YQ==","start_revision":"1","filters":["NOPUT"]}}"#,
        ),
        (6, r#"{"TTL":"5","ID":0}"#),
        (7, r#"{"ID":"7587"}"#),
        (8, r#"{"ID":"7587","keys":true}"#),
        (
            9,
            r#"{"peerURLs":["http://127.0.0.1:2380"],"isLearner":false}"#,
        ),
        (10, "{}"),
        (11, ""),
        (
            12,
            r#"{"name":"root","password":"secret","options":{"no_password":false}}"#,
        ),
        (
            13,
            r#"{"name":"r","perm":{"permType":"READWRITE","key":"YQ==","range_end":"Yg=="}}"#,
        ),
        (14, r#"{"name":"bG9jaw==","lease":"1"}"#),
        (15, r#"{"name":"ZWw=","lease":"1","value":"dg=="}"#),
        (16, r#"{"name":"ZWw="}"#),
        (17, r#"{"x":1}"#),
        (0, r#"{"key":"YQ==""#),
        (1, r#"{"key":12,"value":null}"#),
    ];
    bodies
        .iter()
        .map(|(route, body)| {
            let mut s = vec![*route];
            s.extend_from_slice(body.as_bytes());
            s
        })
        .collect()
}

/// Operation streams for `store_model`: pseudo-random bytes (xorshift), each a different
/// mix of puts, deletes, ranges, txns, compactions and reopens.
fn store_streams() -> Seeds {
    let mut x = 0x9e3779b97f4a7c15u64;
    (0..8)
        .map(|_| {
            (0..256)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect()
        })
        .collect()
}

/// Raft entries as kvd writes them: an internal request of every kind, the member's own and a
/// client's (with the caller's header), in batches of a few.
/// The framed raft stream after its opening (mode byte 0): appends with entries, heartbeats,
/// votes and their answers, keep-alives between them; and the receiver's records (mode byte
/// 1): keep-alives, then a refusal.
fn peer_streams() -> Seeds {
    use protobuf::Message as _;
    use raft::eraftpb::{Entry, Message, MessageType};
    let msg = |t: MessageType, index: u64, entries: usize| {
        let mut m = Message::default();
        m.set_msg_type(t);
        (m.from, m.to, m.term, m.index, m.log_term, m.commit) = (1, 2, 3, index, 3, index);
        for i in 0..entries {
            let mut e = Entry::default();
            (e.index, e.term, e.data) = (index + 1 + i as u64, 3, vec![b'x'; 40].into());
            m.mut_entries().push(e);
        }
        m
    };
    let frames = |ms: &[Message]| {
        let mut b = vec![0u8];
        for m in ms {
            m.write_length_delimited_to_vec(&mut b)
                .expect("a message encodes");
            b.push(0); // a keep-alive
        }
        b
    };
    let mut refusal = vec![1u8, 0, 0, 2];
    let why = b"cluster id mismatch";
    refusal.extend_from_slice(&(why.len() as u32).to_le_bytes());
    refusal.extend_from_slice(why);
    vec![
        frames(&[msg(MessageType::MsgAppend, 5, 3)]),
        frames(&[
            msg(MessageType::MsgHeartbeat, 8, 0),
            msg(MessageType::MsgAppend, 8, 1),
            msg(MessageType::MsgRequestVote, 9, 0),
        ]),
        frames(&[msg(MessageType::MsgAppendResponse, 9, 0)]),
        refusal,
    ]
}

fn raft_entries() -> Seeds {
    use api::etcdserverpb::*;
    use rpc::request::{InternalAuthenticate, InternalRequest, Op, RequestHeader};
    let put = |k: &[u8], lease: i64| PutRequest {
        key: k.to_vec(),
        value: b"v".to_vec(),
        lease,
        prev_kv: true,
        ..Default::default()
    };
    let ops = vec![
        Op::Put(put(b"a", 0)),
        Op::DeleteRange(DeleteRangeRequest {
            key: b"a".to_vec(),
            range_end: vec![0],
            prev_kv: true,
        }),
        Op::Txn(TxnRequest {
            compare: vec![Compare {
                key: b"a".to_vec(),
                target: compare::CompareTarget::Version as i32,
                target_union: Some(compare::TargetUnion::Version(0)),
                ..Default::default()
            }],
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestPut(put(b"b", 0))),
            }],
            failure: vec![RequestOp {
                request: Some(request_op::Request::RequestRange(RangeRequest {
                    key: b"a".to_vec(),
                    ..Default::default()
                })),
            }],
        }),
        Op::Compaction(CompactionRequest {
            revision: 2,
            physical: true,
        }),
        Op::LeaseGrant(LeaseGrantRequest { ttl: 60, id: 7 }),
        Op::Put(put(b"leased", 7)),
        Op::LeaseCheckpoint(LeaseCheckpointRequest {
            checkpoints: vec![LeaseCheckpoint {
                id: 7,
                remaining_ttl: 30,
            }],
        }),
        Op::LeaseRevoke(LeaseRevokeRequest { id: 7 }),
        Op::Alarm(AlarmRequest {
            action: 1,
            member_id: 1,
            alarm: 1,
        }),
        Op::UserAdd(AuthUserAddRequest {
            name: "root".into(),
            options: Some(api::authpb::UserAddOptions { no_password: true }),
            ..Default::default()
        }),
        Op::RoleAdd(AuthRoleAddRequest {
            name: "root".into(),
        }),
        Op::UserGrantRole(AuthUserGrantRoleRequest {
            user: "root".into(),
            role: "root".into(),
        }),
        Op::RoleGrantPermission(AuthRoleGrantPermissionRequest {
            name: "root".into(),
            perm: Some(api::authpb::Permission {
                perm_type: 2,
                key: b"a".to_vec(),
                range_end: vec![0],
            }),
        }),
        Op::AuthEnable(AuthEnableRequest {}),
        Op::Authenticate(InternalAuthenticate {
            name: "root".into(),
            simple_token: "tok".into(),
        }),
        Op::DowngradeInfoSet(DowngradeInfo {
            enabled: true,
            target_version: "3.5.0".into(),
        }),
        Op::AuthDisable(AuthDisableRequest {}),
    ];
    let encoded: Vec<Vec<u8>> = ops
        .iter()
        .enumerate()
        .map(|(i, op)| match i % 3 {
            0 => InternalRequest::encode_from(
                op.clone(),
                RequestHeader {
                    username: "root".into(),
                    auth_revision: 1,
                },
            ),
            _ => InternalRequest::encode(op.clone()),
        })
        .collect();
    let frame = |entries: &[Vec<u8>]| -> Vec<u8> {
        let mut out = Vec::new();
        for e in entries {
            out.extend_from_slice(&(e.len() as u16).to_le_bytes());
            out.extend_from_slice(e);
        }
        out
    };
    let mut seeds: Seeds = encoded
        .iter()
        .map(|e| frame(std::slice::from_ref(e)))
        .collect();
    seeds.push(frame(&encoded));
    seeds.push(frame(&encoded[..6]));
    seeds.push(frame(&encoded[9..]));
    seeds
}
