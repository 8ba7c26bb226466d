//! `etcdserverpb.Cluster`: the member list and membership changes, through consensus.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use api::etcdserverpb::cluster_server::Cluster;
use api::etcdserverpb::{
    Member as PbMember, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse, ResponseHeader,
};
use consensus::{Change, Member, Members};
use tonic::{Request, Response, Status};

use crate::error;
use crate::server::Core;

/// The Cluster service.
#[derive(Debug, Clone)]
pub struct ClusterService {
    core: Arc<Core>,
}

impl ClusterService {
    pub fn new(core: Arc<Core>) -> Self {
        ClusterService { core }
    }

    /// As etcd's cluster server: ids and term, no revision.
    fn header(&self) -> Option<ResponseHeader> {
        Some(self.core.header(0))
    }

    async fn change(&self, c: Change) -> Result<Vec<PbMember>, Status> {
        let members = self
            .core
            .node
            .change_membership(c)
            .await
            .map_err(|e| error::consensus(&e))?;
        Ok(to_pb(&members))
    }
}

/// The member list as etcd's messages.
pub fn to_pb(members: &Members) -> Vec<PbMember> {
    members.iter().map(member_pb).collect()
}

fn member_pb(m: &Member) -> PbMember {
    PbMember {
        id: m.id,
        name: m.name.clone(),
        peer_ur_ls: m.peer_urls.clone(),
        client_ur_ls: m.client_urls.clone(),
        is_learner: m.is_learner,
    }
}

/// etcd accepts `scheme://host:port` peer URLs with scheme http or https, nothing after the port.
fn check_urls(urls: &[String]) -> Result<(), Status> {
    if urls.is_empty() {
        return Err(error::bad_member_urls());
    }
    for u in urls {
        let ok = u.split_once("://").is_some_and(|(scheme, rest)| {
            matches!(scheme, "http" | "https" | "unix" | "unixs")
                && !rest.is_empty()
                && rest.trim_end_matches('/').rsplit_once(':').is_some()
                && !rest.trim_end_matches('/').contains('/')
        });
        if !ok {
            return Err(error::bad_member_urls());
        }
    }
    Ok(())
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(
        &self,
        req: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        let r = req.into_inner();
        check_urls(&r.peer_ur_ls)?;
        let current = self.core.node.members();
        if current
            .iter()
            .any(|m| m.peer_urls.iter().any(|u| r.peer_ur_ls.contains(u)))
        {
            return Err(error::peer_url_exists());
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let member = Member {
            id: consensus::member_id(&r.peer_ur_ls, &self.core.cfg.cluster_token, Some(now)),
            name: String::new(),
            peer_urls: r.peer_ur_ls,
            client_urls: Vec::new(),
            is_learner: r.is_learner,
        };
        let change = if r.is_learner {
            Change::AddLearner(member.clone())
        } else {
            Change::AddMember(member.clone())
        };
        let members = self.change(change).await?;
        Ok(Response::new(MemberAddResponse {
            header: self.header(),
            member: Some(member_pb(&member)),
            members,
        }))
    }

    async fn member_remove(
        &self,
        req: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        let members = self.change(Change::Remove(req.into_inner().id)).await?;
        Ok(Response::new(MemberRemoveResponse {
            header: self.header(),
            members,
        }))
    }

    async fn member_update(
        &self,
        req: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        let r = req.into_inner();
        check_urls(&r.peer_ur_ls)?;
        let current = self.core.node.members();
        if current
            .iter()
            .any(|m| m.id != r.id && m.peer_urls.iter().any(|u| r.peer_ur_ls.contains(u)))
        {
            return Err(error::peer_url_exists());
        }
        let update = Member {
            id: r.id,
            peer_urls: r.peer_ur_ls,
            ..Default::default()
        };
        let members = self.change(Change::Update(update)).await?;
        Ok(Response::new(MemberUpdateResponse {
            header: self.header(),
            members,
        }))
    }

    async fn member_list(
        &self,
        req: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        if req.into_inner().linearizable {
            self.core.linearize().await?;
        }
        Ok(Response::new(MemberListResponse {
            header: self.header(),
            members: to_pb(&self.core.node.members()),
        }))
    }

    async fn member_promote(
        &self,
        req: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        let members = self.change(Change::Promote(req.into_inner().id)).await?;
        Ok(Response::new(MemberPromoteResponse {
            header: self.header(),
            members,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_urls_are_checked_like_etcd() {
        let ok = |u: &str| check_urls(&[u.to_string()]).is_ok();
        assert!(ok("http://127.0.0.1:2380"));
        assert!(ok("https://node-1:2380"));
        assert!(!ok("127.0.0.1:2380"));
        assert!(!ok("ftp://h:1"));
        assert!(!ok("http://h:1/path"));
        assert!(check_urls(&[]).is_err());
    }
}
