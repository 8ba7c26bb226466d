//! Membership: changes proposed here, configuration changes and member updates as they commit,
//! the configuration history snapshots record, leaving a joint configuration.

use std::time::Instant;

use raft::eraftpb::{ConfChangeSingle, ConfChangeV2, ConfState};
use raft::StateRole;
use tokio::sync::oneshot;

use crate::member::{Member, Members};
use crate::node::{
    change_type, context, deadline, Change, Error, Result, TAG_CONF, TAG_MEMBER_UPDATE,
};
use ids::MemberId;

use super::open::{Driver, Pending};

impl<O: Send + 'static> Driver<O> {
    pub(super) fn members(&self) -> &Members {
        &self.history[self.history.len() - 1].2
    }

    pub(super) fn change(&mut self, change: Change, reply: oneshot::Sender<Result<Members>>) {
        let members = self.members();
        let check = match &change {
            Change::AddMember(m) | Change::AddLearner(m) if members.get(m.id).is_some() => {
                Err(Error::MemberExists)
            }
            Change::AddMember(m) | Change::AddLearner(m) if m.id == MemberId::NONE => {
                Err(Error::ReservedId)
            }
            Change::Promote(id) => match members.get(*id) {
                None => Err(Error::MemberNotFound),
                Some(m) if !m.is_learner => Err(Error::NotLearner),
                Some(_) => Ok(()),
            },
            Change::Remove(id) | Change::Update(Member { id, .. })
                if members.get(*id).is_none() =>
            {
                Err(Error::MemberNotFound)
            }
            _ if self.removed => Err(Error::Removed),
            _ => Ok(()),
        };
        if let Err(e) = check {
            let _ = reply.send(Err(e));
            return;
        }
        let seq = self.next_seq();
        let r = match (&change, change_type(&change)) {
            (Change::Update(m), _) => self
                .raw
                .propose(
                    context(TAG_MEMBER_UPDATE, self.cfg.id.0, seq, Some(m)),
                    vec![],
                )
                .map_err(|_| self.dropped()),
            (_, Some((kind, id))) => {
                if self.raw.raft.state == StateRole::Leader
                    && self.raw.raft.pending_conf_index > self.raw.raft.raft_log.applied
                {
                    let _ = reply.send(Err(Error::Unhealthy));
                    return;
                }
                let member = match &change {
                    Change::AddMember(m) => Some(Member {
                        is_learner: false,
                        ..m.clone()
                    }),
                    Change::AddLearner(m) => Some(Member {
                        is_learner: true,
                        ..m.clone()
                    }),
                    _ => None,
                };
                let mut single = ConfChangeSingle::default();
                single.set_change_type(kind);
                single.node_id = id.0;
                let mut cc = ConfChangeV2::default();
                cc.mut_changes().push(single);
                let ctx = context(TAG_CONF, self.cfg.id.0, seq, member.as_ref());
                self.raw
                    .propose_conf_change(ctx, cc)
                    .map_err(|_| self.dropped())
            }
            (_, None) => Ok(()),
        };
        match r {
            Ok(()) => {
                self.changes.insert(seq, reply);
                self.deadlines
                    .push_back((deadline(self.cfg.request_timeout), Pending::Change(seq)));
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }

    /// raft-rs leaves a joint configuration by itself only if the leader that entered it is
    /// still leader when it applies it; any later leader does it here.
    pub(super) fn maybe_leave_joint(&mut self, now: Instant) {
        let joint = !self.history[self.history.len() - 1]
            .1
            .voters_outgoing
            .is_empty();
        let r = &self.raw.raft;
        if !joint || r.state != StateRole::Leader || r.pending_conf_index > r.raft_log.applied {
            return;
        }
        let timeout = self.cfg.heartbeat * self.cfg.election_ticks as u32;
        if self
            .last_leave
            .is_some_and(|t| now.duration_since(t) < timeout)
        {
            return;
        }
        self.last_leave = Some(now);
        tracing::info!("leaving the joint configuration");
        if let Err(e) = self
            .raw
            .propose_conf_change(vec![], ConfChangeV2::default())
        {
            tracing::warn!("cannot propose leaving the joint configuration: {e}");
        }
    }

    pub(super) fn set_members(&mut self, index: u64, cs: ConfState, members: Members) {
        let was_member = self.members().get(self.cfg.id).is_some();
        {
            let mut gone = self.shared.removed_ids.lock();
            gone.extend(
                self.members()
                    .iter()
                    .map(|m| m.id)
                    .filter(|id| members.get(*id).is_none()),
            );
        }
        self.transport.update_members(&members);
        self.shared.status.lock().members = members.clone();
        if was_member && members.get(self.cfg.id).is_none() {
            tracing::warn!(member = %self.cfg.id, "this member was removed from the cluster");
            self.removed = true;
            self.shared.fail_all(|| Error::Removed);
        }
        self.history.push((index, cs, members));
    }

    pub(super) fn apply_conf_change(
        &mut self,
        index: u64,
        cc: ConfChangeV2,
        ctx: Option<crate::node::Context>,
    ) {
        let (origin, seq, member) = match ctx {
            Some((TAG_CONF, origin, seq, member)) => (origin, seq, member),
            _ => (0, 0, None),
        };
        let reply = (origin == self.cfg.id.0)
            .then(|| self.changes.remove(&seq))
            .flatten();
        // Reads go through raft again until the new configuration is known.
        self.shared.publish_sole_leader(false, 0);
        let cs = match self.raw.apply_conf_change(&cc) {
            Ok(cs) => cs,
            Err(e) => {
                tracing::warn!(index, "membership change not applied: {e}");
                if let Some(r) = reply {
                    let _ = r.send(Err(Error::Raft(e)));
                }
                return;
            }
        };
        let mut members = self.members().clone();
        for ch in cc.get_changes() {
            use raft::eraftpb::ConfChangeType::*;
            let id = MemberId(ch.node_id);
            let learner = ch.get_change_type() == AddLearnerNode;
            match ch.get_change_type() {
                AddNode | AddLearnerNode => {
                    let m = members.0.entry(id).or_insert_with(|| {
                        member.clone().filter(|m| m.id == id).unwrap_or(Member {
                            id,
                            ..Default::default()
                        })
                    });
                    m.is_learner = learner;
                }
                RemoveNode => {
                    members.0.remove(&id);
                }
            }
        }
        tracing::info!(index, voters = ?cs.voters, learners = ?cs.learners, outgoing = ?cs.voters_outgoing, "membership changed");
        self.set_members(index, cs, members.clone());
        if let Some(r) = reply {
            // Answered once applied: raft then accepts the next change at once.
            self.changes_applied.push((index, r, members));
        }
    }

    pub(super) fn update_member(&mut self, index: u64, origin: u64, seq: u64, m: Member) {
        let reply = (origin == self.cfg.id.0)
            .then(|| self.changes.remove(&seq))
            .flatten();
        let mut members = self.members().clone();
        let Some(cur) = members.0.get_mut(&m.id) else {
            if let Some(r) = reply {
                let _ = r.send(Err(Error::MemberNotFound));
            }
            return;
        };
        cur.peer_urls = m.peer_urls;
        if !m.name.is_empty() {
            cur.name = m.name;
        }
        if !m.client_urls.is_empty() {
            cur.client_urls = m.client_urls;
        }
        let cs = self.history[self.history.len() - 1].1.clone();
        self.set_members(index, cs, members.clone());
        if let Some(r) = reply {
            // Answered once applied: raft then accepts the next change at once.
            self.changes_applied.push((index, r, members));
        }
    }

    /// The configuration and members in effect at `index`, if still known.
    pub(super) fn conf_at(&self, index: u64) -> Option<(ConfState, Members)> {
        let h = self.history.iter().rev().find(|h| h.0 <= index)?;
        Some((h.1.clone(), h.2.clone()))
    }
}
