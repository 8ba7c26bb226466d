//! `etcdserverpb.Cluster`: the member list and membership changes, through consensus, with
//! etcd's checks: a learner is promoted only once it holds 90 % of the leader's log, and with
//! `--strict-reconfig-check` (on by default) a voter is added or promoted only while enough
//! members are started to keep a quorum, a member added only while the leader has replicated to
//! every voter for 5 s, and a live voter removed only while the other live voters keep a
//! quorum. The leader alone knows that: a follower forwards adds, promotions and removals.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use api::etcdserverpb::cluster_client::ClusterClient;
use api::etcdserverpb::cluster_server::Cluster;
use api::etcdserverpb::{
    Member as PbMember, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse, ResponseHeader,
};
use consensus::{Change, Member, Members};
use ids::{MemberId, Revision};
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
        Some(self.core.header(Revision(0)))
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

/// How long the leader must have replicated to every voter before a member is added (etcd's
/// HealthInterval).
const HEALTH_INTERVAL: Duration = Duration::from_secs(5);
/// The share of the leader's log a learner must hold to be promoted (etcd's).
const LEARNER_READY: f64 = 0.9;

fn unhealthy() -> Status {
    Status::unavailable("etcdserver: unhealthy cluster")
}

fn not_enough_started() -> Status {
    Status::failed_precondition(
        "etcdserver: re-configuration failed due to not enough started members",
    )
}

/// Whether, with one more voter, the started voters (those that published a name) still make
/// a quorum (etcd's IsReadyToAddVotingMember; a one-member cluster may always grow to two).
fn ready_for_one_more_voter(members: &Members) -> bool {
    let voters: Vec<&Member> = members.iter().filter(|m| !m.is_learner).collect();
    let started = voters.iter().filter(|m| !m.name.is_empty()).count();
    let after = voters.len() + 1;
    (started == 1 && after == 2) || started > after / 2
}

/// Whether the started voters other than `id` make a quorum of the voters other than `id`
/// (etcd's IsReadyToRemoveVotingMember).
fn ready_to_remove_voter(members: &Members, id: MemberId) -> bool {
    let rest: Vec<&Member> = members
        .iter()
        .filter(|m| !m.is_learner && m.id != id)
        .collect();
    let started = rest.iter().filter(|m| !m.name.is_empty()).count();
    started > rest.len() / 2
}

/// On the leader: whether peer `id` has been connected for `HEALTH_INTERVAL` (this member always
/// counts), as etcd asks its transport.
fn active(st: &consensus::Status, id: MemberId, since: Option<Instant>) -> bool {
    id == st.id
        || st
            .peers
            .get(&id)
            .and_then(|p| p.active_since)
            .zip(since)
            .is_some_and(|(a, s)| a <= s)
}

impl ClusterService {
    /// On the leader: etcd's checks before adding `learner` or voter.
    fn may_add(&self, learner: bool) -> Result<(), Status> {
        if !self.core.cfg.strict_reconfig_check {
            return Ok(());
        }
        let st = self.core.node.status();
        if !learner && !ready_for_one_more_voter(&st.members) {
            return Err(not_enough_started());
        }
        let since = Instant::now().checked_sub(HEALTH_INTERVAL);
        let healthy = st
            .members
            .iter()
            .filter(|m| !m.is_learner)
            .all(|m| active(&st, m.id, since));
        if !healthy {
            return Err(unhealthy());
        }
        Ok(())
    }

    /// On the leader: etcd's checks before removing member `id`. A learner or a member that is
    /// down may always go; a live voter only if the live voters left keep a quorum.
    fn may_remove(&self, id: MemberId) -> Result<(), Status> {
        if !self.core.cfg.strict_reconfig_check {
            return Ok(());
        }
        let st = self.core.node.status();
        // An unknown id: the change itself answers "member not found".
        if st.members.get(id).is_none_or(|m| m.is_learner) {
            return Ok(());
        }
        if !ready_to_remove_voter(&st.members, id) {
            return Err(not_enough_started());
        }
        let down = st.peers.get(&id).is_none_or(|p| p.active_since.is_none());
        if id != st.id && down {
            return Ok(());
        }
        let since = Instant::now().checked_sub(HEALTH_INTERVAL);
        let voters: Vec<&Member> = st.members.iter().filter(|m| !m.is_learner).collect();
        let live = voters.iter().filter(|m| active(&st, m.id, since)).count();
        if live.saturating_sub(1) < 1 + (voters.len() - 1) / 2 {
            return Err(unhealthy());
        }
        Ok(())
    }

    /// On the leader: etcd's checks before promoting learner `id`.
    fn may_promote(&self, id: MemberId) -> Result<(), Status> {
        let st = self.core.node.status();
        let Some(m) = st.members.get(id) else {
            return Err(error::consensus(&consensus::Error::MemberNotFound));
        };
        if !m.is_learner {
            return Err(Status::failed_precondition(
                "etcdserver: can only promote a learner member",
            ));
        }
        let matched = st.peers.get(&id).map_or(0, |p| p.matched.0);
        if (matched as f64) < st.last_index.0 as f64 * LEARNER_READY {
            return Err(Status::failed_precondition(
                "etcdserver: can only promote a learner member which is in sync with leader",
            ));
        }
        if self.core.cfg.strict_reconfig_check && !ready_for_one_more_voter(&st.members) {
            return Err(not_enough_started());
        }
        Ok(())
    }

    /// etcd's membership check: changes are an admin's (checked where the request arrived:
    /// a change a member forwarded to its leader was checked there).
    async fn admin<T>(&self, req: &Request<T>) -> Result<(), Status> {
        if crate::forwarded(req) {
            return Ok(());
        }
        self.core.admin(self.core.who(req).await?.as_ref())
    }

    /// A client of the leader's Cluster service, for what only the leader can check.
    fn leader(&self) -> Result<ClusterClient<tonic::transport::Channel>, Status> {
        Ok(ClusterClient::new(self.core.leader_channel()?))
    }
}

/// The leader's answer to a forwarded request, under this member's header (etcd fills every
/// header on the member that answers the client).
fn forwarded<T>(
    r: Result<Response<T>, Status>,
    header: impl FnOnce(&mut T) -> &mut Option<ResponseHeader>,
    own: Option<ResponseHeader>,
) -> Result<Response<T>, Status> {
    let mut r = r.map_err(|s| error::forward_failed(&s))?;
    *header(r.get_mut()) = own;
    Ok(r)
}

/// The member list as etcd's messages.
pub fn to_pb(members: &Members) -> Vec<PbMember> {
    members.iter().map(member_pb).collect()
}

fn member_pb(m: &Member) -> PbMember {
    PbMember {
        id: m.id.0,
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
        self.admin(&req).await?;
        let r = req.into_inner();
        check_urls(&r.peer_ur_ls)?;
        let current = self.core.node.members();
        if current
            .iter()
            .any(|m| m.peer_urls.iter().any(|u| r.peer_ur_ls.contains(u)))
        {
            return Err(error::peer_url_exists());
        }
        if !self.core.is_leader() {
            let answer = self.leader()?.member_add(self.core.to_leader(r)).await;
            return forwarded(answer, |r| &mut r.header, self.header());
        }
        self.may_add(r.is_learner)?;
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
        self.admin(&req).await?;
        let id = req.into_inner().id;
        if !self.core.is_leader() {
            let mut leader = self.leader()?;
            let answer = leader
                .member_remove(self.core.to_leader(MemberRemoveRequest { id }))
                .await;
            return forwarded(answer, |r| &mut r.header, self.header());
        }
        self.may_remove(MemberId(id))?;
        let members = self.change(Change::Remove(MemberId(id))).await?;
        Ok(Response::new(MemberRemoveResponse {
            header: self.header(),
            members,
        }))
    }

    async fn member_update(
        &self,
        req: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        self.admin(&req).await?;
        let r = req.into_inner();
        check_urls(&r.peer_ur_ls)?;
        let current = self.core.node.members();
        if current
            .iter()
            .any(|m| m.id != MemberId(r.id) && m.peer_urls.iter().any(|u| r.peer_ur_ls.contains(u)))
        {
            return Err(error::peer_url_exists());
        }
        let update = Member {
            id: MemberId(r.id),
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
        let who = self.core.who(&req).await?;
        if req.into_inner().linearizable {
            self.core.linearize().await?;
        }
        // As etcd 3.7: any user (clients find moved members through it).
        self.core.signed_in(who.as_ref())?;
        Ok(Response::new(MemberListResponse {
            header: self.header(),
            members: to_pb(&self.core.node.members()),
        }))
    }

    async fn member_promote(
        &self,
        req: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        self.admin(&req).await?;
        let id = req.into_inner().id;
        if !self.core.is_leader() {
            let mut leader = self.leader()?;
            let answer = leader
                .member_promote(self.core.to_leader(MemberPromoteRequest { id }))
                .await;
            return forwarded(answer, |r| &mut r.header, self.header());
        }
        self.may_promote(MemberId(id))?;
        let members = self.change(Change::Promote(MemberId(id))).await?;
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
    fn a_voter_is_added_only_while_started_voters_keep_a_quorum() {
        let m = |id: u64, name: &str, learner: bool| Member {
            id: MemberId(id),
            name: name.into(),
            peer_urls: vec![format!("http://h:{id}")],
            client_urls: Vec::new(),
            is_learner: learner,
        };
        let ms = Members::new;
        // One started member may always grow to two (etcd's restore path).
        assert!(ready_for_one_more_voter(&ms(vec![m(1, "a", false)])));
        // 3 started of 4 after the add: a quorum (3) stays started.
        assert!(ready_for_one_more_voter(&ms(vec![
            m(1, "a", false),
            m(2, "b", false),
            m(3, "c", false)
        ])));
        // 3 started of 5 after the add (one voter never started): still 3 = quorum.
        assert!(ready_for_one_more_voter(&ms(vec![
            m(1, "a", false),
            m(2, "b", false),
            m(3, "c", false),
            m(4, "", false)
        ])));
        // 2 started of 4 after the add: below the quorum of 3.
        assert!(!ready_for_one_more_voter(&ms(vec![
            m(1, "a", false),
            m(2, "b", false),
            m(4, "", false)
        ])));
        // Learners do not count either way.
        assert!(ready_for_one_more_voter(&ms(vec![
            m(1, "a", false),
            m(2, "b", false),
            m(5, "", true)
        ])));
    }

    #[test]
    fn a_voter_is_removed_only_while_the_other_started_voters_keep_a_quorum() {
        let m = |id: u64, name: &str| Member {
            id: MemberId(id),
            name: name.into(),
            peer_urls: vec![format!("http://h:{id}")],
            client_urls: Vec::new(),
            is_learner: false,
        };
        let ms = Members::new;
        // 2 others, both started: a quorum of 2.
        assert!(ready_to_remove_voter(
            &ms(vec![m(1, "a"), m(2, "b"), m(3, "c")]),
            MemberId(3)
        ));
        // 2 others, one never started: 1 of 2 is no quorum.
        assert!(!ready_to_remove_voter(
            &ms(vec![m(1, "a"), m(2, ""), m(3, "c")]),
            MemberId(3)
        ));
        // Removing the member that never started leaves 2 started of 2.
        assert!(ready_to_remove_voter(
            &ms(vec![m(1, "a"), m(2, ""), m(3, "c")]),
            MemberId(2)
        ));
    }

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
