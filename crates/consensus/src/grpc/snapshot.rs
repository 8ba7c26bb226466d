//! Sending a snapshot: its own call, in 1 MiB chunks that HTTP/2 flow control paces, read from
//! the spooled file on a blocking thread.

use std::io::{self, Read};
use std::path::PathBuf;

use protobuf::Message as _;
use raft::eraftpb::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::pb::SnapshotChunk;
use super::wire::{check_hello, connect, refused, request, Ident};
use crate::dial::Dialer;
use ids::MemberId;

/// The bytes of snapshot data in one chunk.
pub(super) const CHUNK: usize = 1 << 20;

pub(super) async fn send_snapshot(
    ident: Ident,
    dialer: &Dialer,
    urls: &[String],
    msg: Message,
    data: PathBuf,
) -> Result<(), String> {
    let to = MemberId(msg.to);
    // The first of the peer's URLs that takes a connection (as the message stream goes round
    // them): one that is down must not keep a lagging member from ever catching up.
    let mut tried = Err(String::from("no peer URL"));
    for url in urls {
        tried = connect(dialer, url).await.map(|c| (url, c));
        if tried.is_ok() {
            break;
        }
    }
    let (url, mut client) = tried?;
    // etcd's raftBeforeLeaderSendSnapshot-like points: a leader that dies around a send.
    fail::fail_point!("raft_before_snapshot_send");
    let encoded = msg.write_to_bytes().map_err(|e| format!("encode: {e}"))?;
    let (tx, rx) = mpsc::channel::<SnapshotChunk>(4);
    let reader = tokio::task::spawn_blocking(move || -> io::Result<u64> {
        let mut f = std::fs::File::open(&data)?;
        let mut first = Some(encoded);
        let mut total = 0;
        loop {
            let mut buf = vec![0; CHUNK];
            let mut n = 0;
            while n < CHUNK {
                let k = f.read(&mut buf[n..])?;
                if k == 0 {
                    break;
                }
                n += k;
            }
            buf.truncate(n);
            total += n as u64;
            let last = n < CHUNK;
            let chunk = SnapshotChunk {
                cluster_id: ident.cluster.0,
                from: ident.me.0,
                to: to.0,
                message: first.take().unwrap_or_default(),
                data: buf,
            };
            if tx.blocking_send(chunk).is_err() || last {
                return Ok(total);
            }
        }
    });
    let req = request(ReceiverStream::new(rx), ident, to);
    let resp = client.snapshot(req).await.map_err(|s| refused(url, s))?;
    check_hello(ident, to, url, resp.get_ref())?;
    let bytes = reader
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("reading the snapshot: {e}"))?;
    tracing::info!(peer = %to, bytes, "snapshot sent");
    fail::fail_point!("raft_after_snapshot_send");
    Ok(())
}
