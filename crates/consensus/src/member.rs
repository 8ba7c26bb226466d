//! Cluster members: who they are, where their peers listen, and the ids derived from that.

use std::collections::BTreeMap;

use crate::codec::{put_bytes, put_u64, Malformed, Reader};
use ids::{ClusterId, MemberId};

/// One member of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Member {
    /// Its raft id (never 0).
    pub id: MemberId,
    /// `--name`; empty until the member has started and published it.
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    /// A learner receives the log but does not vote.
    pub is_learner: bool,
}

impl Member {
    pub(crate) fn encode(&self, buf: &mut Vec<u8>) {
        put_u64(buf, self.id.0);
        put_bytes(buf, self.name.as_bytes());
        put_u64(buf, self.peer_urls.len() as u64);
        for u in &self.peer_urls {
            put_bytes(buf, u.as_bytes());
        }
        put_u64(buf, self.client_urls.len() as u64);
        for u in &self.client_urls {
            put_bytes(buf, u.as_bytes());
        }
        buf.push(self.is_learner as u8);
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Member, Malformed> {
        let id = MemberId(r.u64()?);
        let name = r.string()?;
        let mut urls = || -> Result<Vec<String>, Malformed> {
            let n = r.u64()?;
            (0..n).map(|_| r.string()).collect()
        };
        let peer_urls = urls()?;
        let client_urls = urls()?;
        let is_learner = r.u8()? != 0;
        Ok(Member {
            id,
            name,
            peer_urls,
            client_urls,
            is_learner,
        })
    }
}

/// The member list, by id.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Members(pub BTreeMap<MemberId, Member>);

impl Members {
    pub fn new(members: impl IntoIterator<Item = Member>) -> Members {
        Members(members.into_iter().map(|m| (m.id, m)).collect())
    }

    pub fn get(&self, id: MemberId) -> Option<&Member> {
        self.0.get(&id)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Member> {
        self.0.values()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut buf = Vec::new();
        put_u64(&mut buf, self.0.len() as u64);
        for m in self.0.values() {
            m.encode(&mut buf);
        }
        buf
    }

    pub(crate) fn decode(buf: &[u8]) -> Result<Members, Malformed> {
        let mut r = Reader::new(buf, "member list");
        let n = r.u64()?;
        let mut out = BTreeMap::new();
        for _ in 0..n {
            let m = Member::decode(&mut r)?;
            out.insert(m.id, m);
        }
        r.finish()?;
        Ok(Members(out))
    }
}

/// The first 8 bytes of a SHA-1, big-endian: how etcd turns what names a member or a cluster
/// into its id (never 0, raft's "no member", which etcd would give once in 2^64).
fn sha1_id(parts: &[&[u8]]) -> u64 {
    use sha1::Digest;
    let mut h = sha1::Sha1::new();
    for p in parts {
        h.update(p);
    }
    let d = h.finalize();
    u64::from_be_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]).max(1)
}

/// The id of a member with these peer URLs in the cluster named `token`
/// (`--initial-cluster-token`): etcd's, so the same flags give the same ids as etcd (the SHA-1
/// of the sorted URLs joined, then the token). As etcd, a member added later also mixes in the
/// time it was added (`added_at`, Unix nanoseconds here, seconds in etcd), so re-adding the
/// same URLs gives a new id.
pub fn member_id(peer_urls: &[String], token: &str, added_at: Option<u64>) -> MemberId {
    let mut urls: Vec<&str> = peer_urls.iter().map(|s| s.as_str()).collect();
    urls.sort_unstable();
    let time = added_at.map(|t| t.to_string()).unwrap_or_default();
    MemberId(sha1_id(&[
        urls.concat().as_bytes(),
        token.as_bytes(),
        time.as_bytes(),
    ]))
}

/// The id of a cluster bootstrapped with these members: etcd's (the SHA-1 of the sorted member
/// ids, 8 bytes big-endian each). The token is already in every member id.
pub fn cluster_id(member_ids: &[MemberId]) -> ClusterId {
    let mut ids = member_ids.to_vec();
    ids.sort_unstable();
    let bytes: Vec<u8> = ids.iter().flat_map(|i| i.0.to_be_bytes()).collect();
    ClusterId(sha1_id(&[&bytes]))
}

/// Why `--initial-cluster` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadInitialCluster {
    #[error("--initial-cluster: {0:?} is not name=URL")]
    NotNameUrl(String),
    #[error("--initial-cluster: {0:?} has no member name")]
    NoName(String),
    #[error("--initial-cluster: {0:?} is not a URL (scheme://host:port)")]
    NotUrl(String),
    #[error("--initial-cluster: URL {0} is given twice")]
    UrlTwice(String),
    #[error("--initial-cluster is empty")]
    Empty,
}

/// Parses `--initial-cluster` (`name=url,name=url,…`; a name may repeat to give a member
/// several peer URLs) into members, with ids from their URLs and the cluster `token`, in the
/// order first named.
pub fn parse_initial_cluster(s: &str, token: &str) -> Result<Vec<Member>, BadInitialCluster> {
    let mut by_name: Vec<(String, Vec<String>)> = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((name, url)) = part.split_once('=') else {
            return Err(BadInitialCluster::NotNameUrl(part.to_string()));
        };
        let (name, url) = (name.trim(), url.trim());
        if name.is_empty() {
            return Err(BadInitialCluster::NoName(part.to_string()));
        }
        let valid = url.split_once("://").is_some_and(|(scheme, rest)| {
            matches!(scheme, "http" | "https" | "unix" | "unixs") && !rest.is_empty()
        });
        if !valid {
            return Err(BadInitialCluster::NotUrl(url.to_string()));
        }
        if by_name
            .iter()
            .any(|(_, urls)| urls.iter().any(|u| u == url))
        {
            return Err(BadInitialCluster::UrlTwice(url.to_string()));
        }
        match by_name.iter_mut().find(|(n, _)| n == name) {
            Some((_, urls)) => urls.push(url.to_string()),
            None => by_name.push((name.to_string(), vec![url.to_string()])),
        }
    }
    if by_name.is_empty() {
        return Err(BadInitialCluster::Empty);
    }
    Ok(by_name
        .into_iter()
        .map(|(name, peer_urls)| Member {
            id: member_id(&peer_urls, token, None),
            name,
            peer_urls,
            client_urls: Vec::new(),
            is_learner: false,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initial_cluster_parses_like_etcd_and_refuses_nonsense() {
        let ms = parse_initial_cluster(
            "a=http://127.0.0.1:2380,b=http://127.0.0.1:2381,a=http://10.0.0.1:2380",
            "tok",
        )
        .unwrap();
        assert_eq!(ms.len(), 2);
        assert_eq!(ms[0].name, "a");
        assert_eq!(ms[0].peer_urls.len(), 2);
        assert_eq!(ms[0].id, member_id(&ms[0].peer_urls, "tok", None));
        assert_ne!(ms[0].id, ms[1].id);
        for bad in ["", "a", "=http://x:1", "a=x:1", "a=http://x:1,b=http://x:1"] {
            assert!(parse_initial_cluster(bad, "t").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn members_round_trip_and_reject_garbage() {
        let ms = Members::new([
            Member {
                id: MemberId(7),
                name: "a".into(),
                peer_urls: vec!["http://127.0.0.1:2380".into()],
                client_urls: vec![],
                is_learner: false,
            },
            Member {
                id: MemberId(9),
                is_learner: true,
                ..Default::default()
            },
        ]);
        let buf = ms.encode();
        assert_eq!(Members::decode(&buf).unwrap(), ms);
        for cut in 0..buf.len() {
            assert!(Members::decode(&buf[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn ids_are_stable_and_order_free() {
        let a = vec!["http://a:1".to_string(), "http://b:2".to_string()];
        let b = vec!["http://b:2".to_string(), "http://a:1".to_string()];
        assert_eq!(member_id(&a, "t", None), member_id(&b, "t", None));
        assert_ne!(member_id(&a, "t", None), member_id(&a, "u", None));
        assert_ne!(member_id(&a, "t", None), member_id(&a, "t", Some(1)));
        let ids = |v: [u64; 2]| v.map(MemberId);
        assert_eq!(cluster_id(&ids([1, 2])), cluster_id(&ids([2, 1])));
        assert_ne!(cluster_id(&ids([1, 2])), cluster_id(&ids([1, 3])));
    }

    /// Ids etcd v3.6.5 gave (`etcdctl member list -w json`) to clusters started with these
    /// `--initial-cluster` and `--initial-cluster-token` flags.
    #[test]
    fn ids_are_etcds() {
        let url = |p: u16| vec![format!("http://127.0.0.1:{p}")];
        let one = member_id(&url(23801), "etcd-cluster", None);
        assert_eq!(one, MemberId(13668033151171901709));
        assert_eq!(cluster_id(&[one]), ClusterId(15118495548433857066));
        let three: Vec<MemberId> = [23801, 23802, 23803]
            .into_iter()
            .map(|p| member_id(&url(p), "tok-3", None))
            .collect();
        assert_eq!(
            three,
            [
                13641927914827662408,
                7652125314392780625,
                5100081602425780903
            ]
            .map(MemberId)
        );
        assert_eq!(cluster_id(&three), ClusterId(16423275000539813071));
    }
}
