//! The receiving side: raft messages, snapshots and probes from peers into the local node.

use std::io::{self, Read};
use std::pin::Pin;
use std::sync::Arc;

use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use super::pb::peer_server::{Peer, PeerServer};
use super::pb::{Batch, Hello, MembersReply, MembersRequest, PeerMember, SnapshotChunk};
use super::wire::{meta_id, removed, MAX_MESSAGE, META_CLUSTER, META_FROM, META_TO};
use crate::member::Members;
use crate::node::Inbox;
use ids::{ClusterId, MemberId};

/// The receiving side: raft messages from peers into the local node.
#[derive(Clone)]
pub struct PeerService {
    pub(super) id: MemberId,
    pub(super) cluster_id: ClusterId,
    pub(super) inbox: Inbox,
    pub(super) members: Option<MembersFn>,
}

/// Where [`PeerService`] reads the member list it tells joining members.
pub type MembersFn = Arc<dyn Fn() -> Members + Send + Sync>;

impl std::fmt::Debug for PeerService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerService")
            .field("cluster_id", &self.cluster_id)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl PeerService {
    pub fn new(id: MemberId, cluster_id: ClusterId, inbox: Inbox) -> Self {
        PeerService {
            id,
            cluster_id,
            inbox,
            members: None,
        }
    }

    /// Answers `Members` (for joining members) from `members`.
    pub fn with_members(mut self, members: MembersFn) -> Self {
        self.members = Some(members);
        self
    }

    /// The tonic service, to add to a server on the peer listener.
    pub fn into_server(self) -> PeerServer<PeerService> {
        PeerServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE)
    }

    /// Refuses a peer of another cluster, or a request meant for another member.
    fn admit(&self, md: &MetadataMap) -> Result<MemberId, Status> {
        let cluster: ClusterId = meta_id(md, META_CLUSTER)?;
        let from: MemberId = meta_id(md, META_FROM)?;
        let to: MemberId = meta_id(md, META_TO)?;
        self.admit_ids(cluster, from, to)
    }

    /// Refuses a peer of another cluster, a removed member, or a stream meant for another
    /// member: the ids a stream opened with.
    pub(super) fn admit_ids(
        &self,
        cluster: ClusterId,
        from: MemberId,
        to: MemberId,
    ) -> Result<MemberId, Status> {
        if cluster != self.cluster_id {
            tracing::error!(
                peer = %from,
                "refused a peer of cluster {cluster}: this member is in cluster {}",
                self.cluster_id
            );
            return Err(Status::failed_precondition(format!(
                "cluster id mismatch: member {} is in cluster {}, the sender ({from}) in cluster {cluster}",
                self.id, self.cluster_id
            )));
        }
        if self.inbox.is_removed(from) {
            return Err(removed(from, self.cluster_id));
        }
        if to != self.id {
            return Err(Status::failed_precondition(format!(
                "member id mismatch: this is member {}, the sender ({from}) wanted {to}",
                self.id
            )));
        }
        Ok(from)
    }

    /// Whether a peer's message may be stepped here: one for this member, and not a snapshot
    /// without its data (those come through `snapshot`). Any other is logged and dropped.
    pub(super) fn steppable(&self, m: &Message) -> bool {
        let ok = m.to == self.id.0 && m.get_msg_type() != MessageType::MsgSnapshot;
        if !ok {
            tracing::warn!(
                to = m.to,
                "peer message not for this member or a bare snapshot; dropped"
            );
        }
        ok
    }

    fn hello(&self) -> Hello {
        Hello {
            cluster_id: self.cluster_id.0,
            member_id: self.id.0,
        }
    }
}

pub(super) type HelloStream = Pin<Box<dyn Stream<Item = Result<Hello, Status>> + Send>>;

#[tonic::async_trait]
impl Peer for PeerService {
    type StreamStream = HelloStream;

    async fn stream(
        &self,
        req: Request<Streaming<Batch>>,
    ) -> Result<Response<HelloStream>, Status> {
        let from = self.admit(req.metadata())?;
        let mut incoming = req.into_inner();
        let (tx, rx) = mpsc::channel(1);
        let _ = tx.send(Ok(self.hello())).await;
        let me = self.clone();
        let received =
            crate::metrics::PEER_RECEIVED_BYTES.with_label_values(&[&crate::metrics::peer(from)]);
        tokio::spawn(async move {
            loop {
                let batch = match incoming.message().await {
                    Ok(Some(b)) => b,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(peer = %from, "peer stream ended: {e}");
                        break;
                    }
                };
                if me.inbox.is_removed(from) {
                    let _ = tx.send(Err(removed(from, me.cluster_id))).await;
                    break;
                }
                if batch.cluster_id != me.cluster_id.0 || batch.to != me.id.0 {
                    let _ = tx
                        .send(Err(Status::failed_precondition(
                            "cluster or member id mismatch",
                        )))
                        .await;
                    break;
                }
                let bytes: usize = batch.messages.iter().map(Vec::len).sum();
                received.inc_by(bytes as u64);
                let mut msgs = Vec::with_capacity(batch.messages.len());
                for raw in &batch.messages {
                    match Message::parse_from_bytes(raw) {
                        Ok(m) if me.steppable(&m) => msgs.push(m),
                        Ok(_) => {}
                        Err(e) => {
                            let _ = tx
                                .send(Err(Status::invalid_argument(format!(
                                    "bad raft message: {e}"
                                ))))
                                .await;
                            return;
                        }
                    }
                }
                // One turn of the Ready loop for the batch, on this task's thread when free.
                if me.inbox.step_all(msgs).is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn members(
        &self,
        _req: Request<MembersRequest>,
    ) -> Result<Response<MembersReply>, Status> {
        let Some(f) = &self.members else {
            return Err(Status::unimplemented(
                "this member does not publish its member list",
            ));
        };
        let members = f()
            .iter()
            .map(|m| PeerMember {
                id: m.id.0,
                name: m.name.clone(),
                peer_urls: m.peer_urls.clone(),
                client_urls: m.client_urls.clone(),
                is_learner: m.is_learner,
            })
            .collect();
        Ok(Response::new(MembersReply {
            cluster_id: self.cluster_id.0,
            members,
        }))
    }

    async fn probe(&self, req: Request<Hello>) -> Result<Response<Hello>, Status> {
        self.admit(req.metadata())?;
        Ok(Response::new(self.hello()))
    }

    async fn snapshot(
        &self,
        req: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<Hello>, Status> {
        let from = self.admit(req.metadata())?;
        let mut incoming = req.into_inner();
        let first = incoming
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("empty snapshot stream"))?;
        let msg = Message::parse_from_bytes(&first.message)
            .map_err(|e| Status::invalid_argument(format!("bad snapshot message: {e}")))?;
        if msg.get_msg_type() != MessageType::MsgSnapshot || msg.to != self.id.0 {
            return Err(Status::invalid_argument(
                "not a snapshot message for this member",
            ));
        }
        let index = msg.get_snapshot().get_metadata().index;
        tracing::info!(peer = %from, index, "receiving a snapshot");
        // The node reads the data on a blocking thread; chunks reach it through a small
        // channel, so a slow disk slows the sender (HTTP/2 flow control) instead of buffering.
        let (tx, rx) = mpsc::channel::<io::Result<Vec<u8>>>(4);
        let inbox = self.inbox.clone();
        let writer = tokio::task::spawn_blocking(move || {
            let mut r = ChunkReader {
                rx,
                cur: Vec::new(),
                pos: 0,
            };
            inbox.receive_snapshot(msg, &mut r)
        });
        if !first.data.is_empty() {
            let _ = tx.send(Ok(first.data)).await;
        }
        loop {
            match incoming.message().await {
                Ok(Some(c)) => {
                    if tx.send(Ok(c.data)).await.is_err() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    // A cut-off transfer must not look complete.
                    let _ = tx.send(Err(io::Error::other(e.to_string()))).await;
                    break;
                }
            }
        }
        drop(tx);
        match writer.await {
            Ok(Ok(())) => Ok(Response::new(self.hello())),
            Ok(Err(e)) => Err(Status::internal(format!("snapshot not saved: {e}"))),
            Err(e) => Err(Status::internal(format!("snapshot not saved: {e}"))),
        }
    }
}

/// Reads chunks from the async side on a blocking thread.
pub(super) struct ChunkReader {
    pub(super) rx: mpsc::Receiver<io::Result<Vec<u8>>>,
    pub(super) cur: Vec<u8>,
    pub(super) pos: usize,
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.cur.len() {
            match self.rx.blocking_recv() {
                Some(Ok(c)) => {
                    self.cur = c;
                    self.pos = 0;
                }
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len() - self.pos);
        buf[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}
