//! etcd 3.7's `KV.RangeStream`: Range's answer in chunks. Each chunk is read in a view of its
//! own at the revision of the first, so a long stream pins no pages; chunks are sized as
//! etcd sizes them (10 keys first, then doubled or halved toward half the request limit), and
//! one is read only when the client has taken the last, so a slow reader holds the server to
//! a chunk or two.

use std::pin::Pin;
use std::sync::Arc;

use api::etcdserverpb::range_request::{SortOrder, SortTarget};
use api::etcdserverpb::{RangeRequest, RangeResponse, RangeStreamResponse};
use futures_util::Stream;
use ids::Revision;
use mvcc::validate;
use prost::Message;
use tonic::Status;

use crate::auth::{self, AuthInfo};
use crate::error;
use crate::server::Core;
use crate::version::Version;

/// The chunks of one RangeStream call.
pub type Chunks = Pin<Box<dyn Stream<Item = Result<RangeStreamResponse, Status>> + Send>>;

/// The key limit of the first chunk (etcd's `initialStreamChunkLimit`).
const FIRST_CHUNK_KEYS: i64 = 10;

/// Checks `r` as etcd 3.7 checks a RangeStream request, waits for the read index (unless
/// serializable), checks the caller may read the range, and returns the answer's chunks.
pub(crate) async fn range_stream(
    core: Arc<Core>,
    who: Option<AuthInfo>,
    r: RangeRequest,
) -> Result<Chunks, Status> {
    // A cluster at 3.6 (downgrading) answers as etcd 3.6's members, which have no such call.
    // etcd 3.7.1 serves it whatever the cluster version.
    if core.cluster_below(Version::RANGE_STREAM) {
        return Err(Status::unimplemented(
            "unknown method RangeStream for service etcdserverpb.KV",
        ));
    }
    validate::check_range(&r).map_err(|e| error::mvcc(&e))?;
    let by_key = r.sort_order == SortOrder::None as i32
        || (r.sort_target == SortTarget::Key as i32 && r.sort_order == SortOrder::Ascend as i32);
    if !by_key {
        return Err(Status::unimplemented(
            "RangeStream does not support custom sort orders",
        ));
    }
    let filtered = r.min_mod_revision != 0
        || r.max_mod_revision != 0
        || r.min_create_revision != 0
        || r.max_create_revision != 0;
    if filtered {
        return Err(Status::unimplemented(
            "RangeStream does not support revision filters",
        ));
    }
    if !r.serializable {
        core.refuse_learner()?;
        core.linearize().await?;
    }
    core.permitted(who.as_ref(), |c| auth::range(c, &r))?;
    let state = Progress {
        total_limit: if r.limit > 0 { r.limit } else { i64::MAX },
        sent: 0,
        header_rev: None,
        done: false,
        core,
        who,
        r,
    };
    Ok(Box::pin(futures_util::stream::unfold(
        state,
        |mut s| async move { s.next().map(|chunk| (chunk, s)) },
    )))
}

/// Where a stream is: the request of the next chunk, what was sent.
struct Progress {
    core: Arc<Core>,
    who: Option<AuthInfo>,
    /// The next chunk's request: its key, limit and (after the first) revision.
    r: RangeRequest,
    total_limit: i64,
    /// Keys sent so far.
    sent: i64,
    /// The store's revision when the first chunk was read: every chunk's header says it.
    header_rev: Option<i64>,
    done: bool,
}

impl Progress {
    fn next(&mut self) -> Option<Result<RangeStreamResponse, Status>> {
        if self.done {
            return None;
        }
        let chunk = self.chunk();
        self.done |= chunk.is_err();
        Some(chunk.map(|resp| RangeStreamResponse {
            range_response: Some(resp),
        }))
    }

    /// Reads at the pinned revision: a chunk, or (`count`) the number of keys.
    fn read(&self, r: &RangeRequest, count: bool) -> Result<RangeResponse, Status> {
        let store = self.core.backend.store();
        let mut view = store.read().map_err(|e| error::mvcc(&e))?;
        let resp = if count {
            view.range(r)
        } else {
            view.range_chunk(r)
        };
        let resp = resp.map_err(|e| error::mvcc(&e))?;
        self.core.auth_unchanged(self.who.as_ref())?;
        Ok(resp)
    }

    fn chunk(&mut self) -> Result<RangeResponse, Status> {
        if self.r.count_only {
            self.done = true;
            let resp = self.read(&self.r, true)?;
            let rev = resp.header.map_or(0, |h| h.revision);
            return Ok(RangeResponse {
                header: Some(self.core.header(Revision(rev))),
                count: resp.count,
                ..Default::default()
            });
        }
        if self.header_rev.is_none() {
            self.r.limit = FIRST_CHUNK_KEYS.min(self.total_limit);
        }
        let resp = self.read(&self.r, false)?;
        let size = resp.encoded_len();
        let header_rev = *self
            .header_rev
            .get_or_insert(resp.header.as_ref().map_or(0, |h| h.revision));
        if self.r.revision == 0 {
            self.r.revision = header_rev;
        }
        self.sent += resp.kvs.len() as i64;
        // The key after the last one sent, when the range has more.
        let after = match (resp.more, resp.kvs.last()) {
            (true, Some(last)) => {
                let mut k = last.key.clone();
                k.push(0);
                Some(k)
            }
            _ => None,
        };
        let mut out = RangeResponse {
            kvs: resp.kvs,
            ..Default::default()
        };
        match after {
            Some(after) if self.sent < self.total_limit => {
                self.r.key = after;
                self.r.limit = next_limit(self.r.limit, size, self.core.cfg.max_request_bytes)
                    .min(self.total_limit - self.sent);
            }
            after => {
                // The last chunk: the header, and the count of the whole range.
                self.done = true;
                out.header = Some(self.core.header(Revision(header_rev)));
                out.more = resp.more;
                out.count = self.sent;
                if let Some(after) = after {
                    let rest = RangeRequest {
                        key: after,
                        range_end: self.r.range_end.clone(),
                        revision: self.r.revision,
                        count_only: true,
                        ..Default::default()
                    };
                    out.count += self.read(&rest, true)?.count;
                }
            }
        }
        Ok(out)
    }
}

/// The next chunk's key limit: doubled when the last chunk was under half of `target` bytes,
/// halved when over twice it, never below one (etcd's `adjustChunkLimit`).
fn next_limit(limit: i64, size: usize, target: usize) -> i64 {
    let limit = if size < target / 2 {
        limit.saturating_mul(2)
    } else if size > target.saturating_mul(2) {
        limit / 2
    } else {
        limit
    };
    limit.max(1)
}

#[cfg(test)]
mod tests {
    use super::next_limit;

    #[test]
    fn chunk_limits_move_toward_the_target_size() {
        let target = 1000;
        assert_eq!(next_limit(10, 100, target), 20);
        assert_eq!(next_limit(10, 499, target), 20);
        assert_eq!(next_limit(10, 500, target), 10);
        assert_eq!(next_limit(10, 2000, target), 10);
        assert_eq!(next_limit(10, 2001, target), 5);
        assert_eq!(next_limit(1, 5000, target), 1);
        assert_eq!(next_limit(i64::MAX, 0, target), i64::MAX);
    }
}
