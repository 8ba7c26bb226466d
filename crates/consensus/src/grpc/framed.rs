//! Raft messages as length-delimited frames on the peer connection itself: the stream every
//! member opens to each peer, without HTTP/2 under it.
//!
//! Why: a member's share of a replicated write is a few small messages, and carrying each
//! batch through tonic and h2 cost a task hand-off at each end (the sender's task into the
//! connection's, the connection's into the receiver's), HTTP/2 framing and flow-control
//! updates — a visible part of a three-member write's CPU against a cluster that only
//! exchanges its messages over TCP. etcd's own peer streams are likewise its encoding of raft
//! messages on a long-lived HTTP/1 body, not gRPC.
//!
//! The conversation, after the connection (and its TLS) is up, all integers little-endian:
//! - the sender: [`MAGIC`], then its cluster id, its member id and the member it means to
//!   reach (`u64` each);
//! - the receiver: [`MAGIC`], then either `OK` with its cluster and member ids (`u64` each) or
//!   `REFUSED` with a `u32` length and the reason (UTF-8) before it closes: the same checks and
//!   words as the gRPC stream's;
//! - then the sender writes frames, each a varint length and one encoded raft message (length
//!   0: a keep-alive), and the receiver writes single records back: `KEEPALIVE`, or `REFUSED`
//!   with its reason (a member removed meanwhile, a message it cannot read) before closing.
//!
//! Each side writes a keep-alive when it has written nothing for [`KEEPALIVE`] and gives the
//! link up when it has read nothing for [`DEAD`] (HTTP/2's pings did this for the gRPC
//! stream). A receiver that does not speak this (an older member's peer port, a gRPC server)
//! answers without the magic: the sender then opens the gRPC stream instead.

use std::time::{Duration, Instant};

use raft::eraftpb::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::ticker::Ticker;
use super::wire::{check_hello, Ident, MAX_MESSAGE, OPEN_TIMEOUT};
use crate::dial::{Dialer, PeerStream};
use ids::MemberId;

/// What both sides write first. It starts with a NUL byte, which begins neither HTTP/2's
/// preface nor any HTTP/1 request: a peer port tells this stream from gRPC by its first byte.
pub const MAGIC: &[u8; 8] = b"\0kvdraft";
/// A receiver's answer and records.
pub(super) const OK: u8 = 1;
pub(super) const REFUSED: u8 = 2;
pub(super) const KEEPALIVE_RECORD: u8 = 0;
/// Write a keep-alive after this long without writing.
pub(super) const KEEPALIVE: Duration = Duration::from_secs(1);
/// Give a link up after this long without reading anything.
pub(super) const DEAD: Duration = Duration::from_secs(10);
/// The longest reason a refusal carries.
pub(super) const MAX_REASON: usize = 4096;

/// Why a framed stream ended.
#[derive(Debug)]
pub(super) enum Ended {
    /// The peer answered the opening without the magic: it serves only gRPC.
    NotFramed,
    /// A failure to report (as the gRPC stream's errors are).
    Failed(String),
}

impl From<String> for Ended {
    fn from(e: String) -> Self {
        Ended::Failed(e)
    }
}

/// Opens the framed stream to peer `to` at `url` and checks who answered: the connection,
/// with nothing of it read past the answer.
pub(super) async fn open(
    ident: Ident,
    dialer: &Dialer,
    to: MemberId,
    url: &str,
) -> Result<PeerStream, Ended> {
    let open = async {
        let mut io = dialer
            .stream(url)
            .await
            .map_err(|e| format!("cannot connect to {url}: {e}"))?;
        let mut hello = Vec::with_capacity(MAGIC.len() + 24);
        hello.extend_from_slice(MAGIC);
        for id in [ident.cluster.0, ident.me.0, to.0] {
            hello.extend_from_slice(&id.to_le_bytes());
        }
        let io_err = |e: std::io::Error| format!("{url}: {e}");
        io.write_all(&hello).await.map_err(io_err)?;
        io.flush().await.map_err(io_err)?;
        let mut magic = [0u8; MAGIC.len()];
        if io.read_exact(&mut magic).await.is_err() || &magic != MAGIC {
            return Err(Ended::NotFramed);
        }
        match io.read_u8().await.map_err(io_err)? {
            OK => {
                let cluster = io.read_u64_le().await.map_err(io_err)?;
                let member = io.read_u64_le().await.map_err(io_err)?;
                let h = super::pb::Hello {
                    cluster_id: cluster,
                    member_id: member,
                };
                check_hello(ident, to, url, &h)?;
            }
            REFUSED => {
                let why = read_reason(&mut io).await.map_err(io_err)?;
                return Err(refused(url, &why).into());
            }
            b => return Err(format!("{url}: unexpected answer {b}").into()),
        }
        Ok::<_, Ended>(io)
    };
    match tokio::time::timeout(OPEN_TIMEOUT, open).await {
        Ok(r) => r,
        Err(_) => Err(format!("{url} did not answer within {OPEN_TIMEOUT:?}").into()),
    }
}

/// Writes what `rx` brings to the open stream until the node drops the link (`Ok`) or the
/// stream fails; `sent` counts the bytes. (A stream over plain TCP is written by the sending
/// thread itself instead: `super::direct`.)
pub(super) async fn pump(
    link: PeerStream,
    url: &str,
    rx: &mut mpsc::Receiver<Message>,
    sent: &prometheus::IntCounter,
) -> Result<(), String> {
    let (mut r, mut w) = tokio::io::split(link);
    let mut records = Vec::new();
    let mut buf = Vec::new();
    let mut last_read = Instant::now();
    let mut last_write = Instant::now();
    let mut tick = Ticker::new(KEEPALIVE);
    loop {
        tokio::select! {
            m = rx.recv() => {
                let Some(m) = m else { return Ok(()) };
                let mut next = Some(m);
                while let Some(m) = next {
                    encode(&m, &mut buf)?;
                    next = if buf.len() < super::sender::BATCH_BYTES {
                        rx.try_recv().ok()
                    } else {
                        None
                    };
                }
                write(&mut w, &buf, url).await?;
                sent.inc_by(buf.len() as u64);
                buf.clear();
                last_write = Instant::now();
            }
            n = r.read_buf(&mut records) => {
                match n {
                    Ok(0) | Err(_) => return Err(format!("{url} ended the stream")),
                    Ok(_) => {
                        last_read = Instant::now();
                        read_records(&mut records, url)?;
                    }
                }
            }
            _ = tick.tick() => {
                if last_read.elapsed() >= DEAD {
                    return Err(format!("{url}: nothing heard for {DEAD:?}"));
                }
                if last_write.elapsed() >= KEEPALIVE {
                    write(&mut w, &[0], url).await?;
                    last_write = Instant::now();
                }
            }
        }
    }
}

/// The receiver's records at the front of `b`, as read so far: keep-alives are consumed; a
/// refusal (once whole) is the link's end.
pub(super) fn read_records(b: &mut Vec<u8>, url: &str) -> Result<(), String> {
    let keepalives = b.iter().take_while(|&&x| x == KEEPALIVE_RECORD).count();
    b.drain(..keepalives);
    match b.first() {
        None => Ok(()),
        Some(&REFUSED) => {
            let Some(len) = b.get(1..5) else {
                return Ok(());
            };
            let n = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
            match b.get(5..5 + n.min(MAX_REASON)) {
                Some(why) => Err(refused(url, &String::from_utf8_lossy(why))),
                None => Ok(()),
            }
        }
        Some(x) => Err(format!("{url}: unexpected record {x}")),
    }
}

/// The error a refusal reads as (the gRPC stream's words, so a removal reads the same).
pub(super) fn refused(url: &str, why: &str) -> String {
    format!("{url} refused the stream: {why}")
}

/// Appends `m` as a frame.
pub(super) fn encode(m: &Message, buf: &mut Vec<u8>) -> Result<(), String> {
    crate::raftpb::put_message_delimited(buf, m).map_err(|e| format!("encode: {e}"))
}

/// Writes `bytes` (and flushes: TLS holds what it is given until then), within [`DEAD`]: a
/// peer that stops reading must not hold the link forever.
pub(super) async fn write<W: AsyncWrite + Unpin>(
    w: &mut W,
    bytes: &[u8],
    url: &str,
) -> Result<(), String> {
    let go = async {
        w.write_all(bytes).await?;
        w.flush().await
    };
    match tokio::time::timeout(DEAD, go).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("stream to {url} closed: {e}")),
        Err(_) => Err(format!("stream to {url}: a write took over {DEAD:?}")),
    }
}

async fn read_reason<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<String> {
    let n = r.read_u32_le().await? as usize;
    let mut why = vec![0u8; n.min(MAX_REASON)];
    r.read_exact(&mut why).await?;
    Ok(String::from_utf8_lossy(&why).into_owned())
}

pub(super) fn refusal(why: &str) -> Vec<u8> {
    let why = &why.as_bytes()[..why.len().min(MAX_REASON)];
    let mut b = vec![REFUSED];
    b.extend_from_slice(&(why.len() as u32).to_le_bytes());
    b.extend_from_slice(why);
    b
}

/// The frames at the front of `buf`: each complete one is decoded and removed; a partial one
/// stays. A frame longer than [`MAX_MESSAGE`] or a message that does not decode is an error.
pub(super) fn decode(buf: &mut Vec<u8>, out: &mut Vec<Message>) -> Result<(), String> {
    let mut at = 0;
    let result = loop {
        let Some((len, n)) = varint(&buf[at..]) else {
            break Ok(());
        };
        if len > MAX_MESSAGE as u64 {
            break Err(format!(
                "a frame of {len} bytes (the most is {MAX_MESSAGE})"
            ));
        }
        let end = at + n + len as usize;
        if buf.len() < end {
            break Ok(());
        }
        if len > 0 {
            match crate::raftpb::parse_message(&buf[at + n..end]) {
                Ok(m) => out.push(m),
                Err(e) => break Err(format!("bad raft message: {e}")),
            }
        }
        at = end;
    };
    buf.drain(..at);
    result
}

/// A varint at the front of `b`: its value and length, `None` while incomplete (a varint of
/// more than ten bytes reads as an impossible length).
fn varint(b: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, &x) in b.iter().enumerate().take(10) {
        v |= u64::from(x & 0x7f) << (7 * i);
        if x & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    (b.len() >= 10).then_some((u64::MAX, 10))
}

#[cfg(test)]
mod tests {
    use super::super::wire::REMOVED;
    use super::*;
    use ids::ClusterId;
    use raft::eraftpb::MessageType;
    use tokio::net::TcpListener;

    /// A peer port on loopback whose one connection reads the opening, answers `answer` and
    /// then reads all it gets without a word: the bytes it read after the opening.
    async fn fake_peer(answer: Vec<u8>) -> (String, tokio::task::JoinHandle<usize>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut head = [0u8; MAGIC.len() + 24];
            s.read_exact(&mut head).await.unwrap();
            assert_eq!(&head[..MAGIC.len()], MAGIC);
            s.write_all(&answer).await.unwrap();
            let (mut sink, mut got) = (vec![0u8; 4096], 0);
            while let Ok(n) = s.read(&mut sink).await {
                if n == 0 {
                    break;
                }
                got += n;
            }
            got
        });
        (url, task)
    }

    const ME: Ident = Ident {
        cluster: ClusterId(7),
        me: MemberId(1),
    };

    #[tokio::test]
    async fn a_peer_gone_silent_is_given_up_and_kept_alive_meanwhile() {
        let mut ok = MAGIC.to_vec();
        ok.push(OK);
        ok.extend_from_slice(&7u64.to_le_bytes());
        ok.extend_from_slice(&2u64.to_le_bytes());
        let (url, peer) = fake_peer(ok).await;
        let crate::dial::Conn::Plain(tcp) =
            open(ME, &Dialer::plain(), MemberId(2), &url).await.unwrap()
        else {
            panic!("a plain connection")
        };
        let sent = prometheus::IntCounter::new("t", "t").unwrap();
        let d = super::super::direct::Direct::new(tcp.into_tcp(), sent.clone());
        // Written by the sending thread: the frame is on the wire before the task runs.
        let mut frame = Vec::new();
        encode(&msg(2, 5), &mut frame).unwrap();
        assert!(d.send(&[msg(2, 5)]));
        assert_eq!(sent.get(), frame.len() as u64);
        let (_tx, mut rx) = mpsc::channel(1);
        let e = super::super::direct::pump(&d, &url, &mut rx)
            .await
            .unwrap_err();
        assert!(e.contains("nothing heard"), "{e}");
        drop(d); // the connection closes: the peer tells what it read
                 // It wrote a keep-alive each second it had nothing else to write.
        assert!(peer.await.unwrap() >= frame.len() + 5);
    }

    #[tokio::test]
    async fn a_refusal_and_a_peer_without_framed_streams_read_as_such() {
        let why = super::super::wire::removed(MemberId(1), ClusterId(7));
        let mut no = MAGIC.to_vec();
        no.extend_from_slice(&refusal(why.message()));
        let (url, _peer) = fake_peer(no).await;
        match open(ME, &Dialer::plain(), MemberId(2), &url).await {
            Err(Ended::Failed(e)) => assert!(e.contains(REMOVED), "{e}"),
            _ => panic!("want a refusal"),
        }
        // An HTTP/2 server answers the opening with frames of its own.
        let (url, _peer) = fake_peer(b"\0\0\x12\x04\0\0\0\0\0".to_vec()).await;
        let r = open(ME, &Dialer::plain(), MemberId(2), &url).await;
        assert!(matches!(r, Err(Ended::NotFramed)));
    }

    fn msg(to: u64, index: u64) -> Message {
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgAppend);
        m.to = to;
        m.index = index;
        m
    }

    #[test]
    fn frames_decode_whole_and_wait_for_the_rest() {
        let mut all = Vec::new();
        for i in 0..3 {
            encode(&msg(2, i), &mut all).unwrap();
        }
        all.push(0); // a keep-alive
        encode(&msg(2, 300), &mut all).unwrap();
        // Fed a byte at a time, every message comes out once, in order, and nothing is left.
        let (mut buf, mut out) = (Vec::new(), Vec::new());
        for b in &all {
            buf.push(*b);
            decode(&mut buf, &mut out).unwrap();
        }
        assert!(buf.is_empty());
        let idx: Vec<u64> = out.iter().map(|m| m.index).collect();
        assert_eq!(idx, [0, 1, 2, 300]);
    }

    #[test]
    fn an_oversized_or_garbled_frame_is_an_error() {
        let mut buf = vec![0xff; 9];
        buf.push(0x01); // 10-byte varint: far over the limit
        assert!(decode(&mut buf, &mut Vec::new()).is_err());
        let mut buf = vec![0xff; 11]; // an endless varint
        assert!(decode(&mut buf, &mut Vec::new()).is_err());
        let mut buf = vec![3, 0xff, 0xff, 0xff]; // three bytes that are no message
        assert!(decode(&mut buf, &mut Vec::new()).is_err());
        let mut buf = vec![0x80]; // incomplete: wait
        assert!(decode(&mut buf, &mut Vec::new()).is_ok());
        assert_eq!(buf, [0x80]);
    }

    #[test]
    fn records_are_read_whole() {
        let mut b = vec![0, 0, REFUSED, 3, 0];
        assert!(read_records(&mut b, "u").is_ok());
        assert_eq!(b, [REFUSED, 3, 0]);
        b.extend_from_slice(&[0, 0, b'n', b'o']);
        assert!(read_records(&mut b, "u").is_ok(), "still one byte short");
        b.push(b'!');
        let e = read_records(&mut b, "u").unwrap_err();
        assert!(e.ends_with("refused the stream: no!"), "{e}");
        assert!(read_records(&mut vec![9], "u").is_err());
    }
}
