//! The auth store's data, as etcd keeps it: whether authentication is on, the auth revision
//! (bumped by every change of users or roles), and the users and roles (`authpb` messages).
//! Changes are replicated writes ([`Writer`] methods, the rules being the server's); they
//! persist with the flush that carries them, in etcd's buckets — `auth` (`authEnabled`,
//! `authRevision`), `authUsers` and `authRoles`, keyed by name — so the store survives a
//! restart and travels in snapshots.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use api::authpb::{Role, User};
use prost::Message;

use crate::error::{Error, Result};
use crate::store::{Store, Writer};

pub(crate) const AUTH_BUCKET: &[u8] = b"auth";
pub(crate) const USERS_BUCKET: &[u8] = b"authUsers";
pub(crate) const ROLES_BUCKET: &[u8] = b"authRoles";
const ENABLED: &[u8] = b"authEnabled";
const REVISION: &[u8] = b"authRevision";

/// Users and roles, and whether authentication is on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AuthData {
    pub enabled: bool,
    /// etcd's auth revision: 1 for a new store, bumped by each change of a user or a role
    /// (and by disabling auth).
    pub revision: u64,
    pub users: BTreeMap<String, User>,
    pub roles: BTreeMap<String, Role>,
}

/// The store's auth data, and what changed since the last flush.
#[derive(Debug, Default)]
pub(crate) struct AuthSet {
    /// Shared with readers; a change makes a new copy (changes are rare).
    pub(crate) data: Arc<AuthData>,
    pub(crate) dirty: AuthDirty,
}

/// Changes not yet flushed: a user or role to write (`Some`) or delete (`None`).
#[derive(Debug, Default)]
pub(crate) struct AuthDirty {
    pub(crate) meta: bool,
    pub(crate) users: BTreeMap<String, Option<Vec<u8>>>,
    pub(crate) roles: BTreeMap<String, Option<Vec<u8>>>,
}

impl AuthDirty {
    pub(crate) fn is_empty(&self) -> bool {
        !self.meta && self.users.is_empty() && self.roles.is_empty()
    }

    /// Writes the changes into `tx`'s buckets.
    pub(crate) fn write(&self, data: &AuthData, tx: &mut pager::WriteTxn<'_>) -> Result<()> {
        if self.meta {
            let mut b = tx.bucket(AUTH_BUCKET)?;
            b.put(ENABLED, &[u8::from(data.enabled)])?;
            b.put(REVISION, &data.revision.to_be_bytes())?;
        }
        for (bucket, changes) in [(USERS_BUCKET, &self.users), (ROLES_BUCKET, &self.roles)] {
            if changes.is_empty() {
                continue;
            }
            let mut b = tx.bucket(bucket)?;
            for (name, v) in changes {
                match v {
                    Some(v) => b.put(name.as_bytes(), v)?,
                    None => {
                        b.delete(name.as_bytes())?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn corrupt(path: &Path, reason: String) -> Error {
    Error::Corrupt {
        path: path.display().to_string(),
        reason,
    }
}

/// The auth data stored in `db`. A store that never held any is at revision 1, as etcd's.
pub(crate) fn restore(db: &pager::Db, path: &Path) -> Result<AuthData> {
    let tx = db.begin_read()?;
    let meta = tx.bucket(AUTH_BUCKET)?;
    let enabled = matches!(meta.get(ENABLED)?, Some([1]));
    let revision = match meta.get(REVISION)? {
        None => 0,
        Some(v) => u64::from_be_bytes(
            v.try_into()
                .map_err(|_| corrupt(path, format!("authRevision is {} bytes, not 8", v.len())))?,
        ),
    };
    let mut data = AuthData {
        enabled,
        revision: revision.max(1),
        ..AuthData::default()
    };
    for e in tx.bucket(USERS_BUCKET)?.iter() {
        let (k, v) = e?;
        let u = User::decode(v).map_err(|e| {
            corrupt(
                path,
                format!("user {:?} is damaged: {e}", String::from_utf8_lossy(k)),
            )
        })?;
        data.users
            .insert(String::from_utf8_lossy(k).into_owned(), u);
    }
    for e in tx.bucket(ROLES_BUCKET)?.iter() {
        let (k, v) = e?;
        let r = Role::decode(v).map_err(|e| {
            corrupt(
                path,
                format!("role {:?} is damaged: {e}", String::from_utf8_lossy(k)),
            )
        })?;
        data.roles
            .insert(String::from_utf8_lossy(k).into_owned(), r);
    }
    Ok(data)
}

impl Writer<'_> {
    /// Changes the auth data with `f` (in the writer's order with every other write).
    fn auth_change(&mut self, f: impl FnOnce(&mut AuthData, &mut AuthDirty)) {
        let inner = self.inner();
        let mut a = inner.auth.lock();
        let set = &mut *a;
        f(Arc::make_mut(&mut set.data), &mut set.dirty);
        inner
            .auth_enabled
            .store(set.data.enabled, Ordering::Release);
    }

    /// Adds or replaces user `u`.
    pub fn auth_put_user(&mut self, u: User) {
        self.auth_change(|d, dirty| {
            let name = String::from_utf8_lossy(&u.name).into_owned();
            dirty.users.insert(name.clone(), Some(u.encode_to_vec()));
            d.users.insert(name, u);
        });
    }

    pub fn auth_delete_user(&mut self, name: &str) {
        self.auth_change(|d, dirty| {
            d.users.remove(name);
            dirty.users.insert(name.to_string(), None);
        });
    }

    /// Adds or replaces role `r`.
    pub fn auth_put_role(&mut self, r: Role) {
        self.auth_change(|d, dirty| {
            let name = String::from_utf8_lossy(&r.name).into_owned();
            dirty.roles.insert(name.clone(), Some(r.encode_to_vec()));
            d.roles.insert(name, r);
        });
    }

    pub fn auth_delete_role(&mut self, name: &str) {
        self.auth_change(|d, dirty| {
            d.roles.remove(name);
            dirty.roles.insert(name.to_string(), None);
        });
    }

    pub fn auth_set_enabled(&mut self, enabled: bool) {
        self.auth_change(|d, dirty| {
            d.enabled = enabled;
            dirty.meta = true;
        });
    }

    /// Bumps the auth revision (etcd's commitRevision); the new one.
    pub fn auth_bump_revision(&mut self) -> u64 {
        let mut rev = 0;
        self.auth_change(|d, dirty| {
            d.revision += 1;
            rev = d.revision;
            dirty.meta = true;
        });
        rev
    }

    /// The auth data as this writer's changes left it.
    pub fn auth(&self) -> Arc<AuthData> {
        self.inner().auth.lock().data.clone()
    }
}

impl Store {
    /// The auth data now (a shared copy: changes after the call do not show in it).
    pub fn auth(&self) -> Arc<AuthData> {
        self.inner.auth.lock().data.clone()
    }

    /// Whether authentication is on (no lock: checked on every request).
    pub fn auth_enabled(&self) -> bool {
        self.inner.auth_enabled.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoreOptions;

    fn user(name: &str, roles: &[&str]) -> User {
        User {
            name: name.as_bytes().to_vec(),
            password: b"$2a$04$hash".to_vec(),
            roles: roles.iter().map(|r| r.to_string()).collect(),
            options: None,
        }
    }

    #[test]
    fn users_roles_and_the_switch_survive_a_reopen_in_etcds_buckets() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        {
            let store = Store::open(&path, StoreOptions::default()).unwrap();
            assert_eq!(
                store.auth().revision,
                1,
                "a new store is at auth revision 1"
            );
            assert!(!store.auth_enabled());
            let mut w = store.write().unwrap();
            w.auth_put_user(user("root", &["root"]));
            w.auth_put_user(user("alice", &["r"]));
            w.auth_put_role(Role {
                name: b"r".to_vec(),
                key_permission: Vec::new(),
            });
            w.auth_put_user(user("gone", &[]));
            w.auth_delete_user("gone");
            assert_eq!(w.auth_bump_revision(), 2);
            w.auth_set_enabled(true);
            drop(w);
            assert!(store.auth_enabled());
            store.close().unwrap();
        }
        let store = Store::open(&path, StoreOptions::default()).unwrap();
        let a = store.auth();
        assert!(a.enabled && store.auth_enabled());
        assert_eq!(a.revision, 2);
        assert_eq!(a.users.keys().collect::<Vec<_>>(), ["alice", "root"]);
        assert_eq!(a.users["alice"], user("alice", &["r"]));
        assert!(a.roles.contains_key("r"));
        // etcd's buckets and keys.
        let tx = store.db().begin_read().unwrap();
        assert_eq!(
            tx.bucket(AUTH_BUCKET).unwrap().get(REVISION).unwrap(),
            Some(&2u64.to_be_bytes()[..])
        );
        assert!(tx
            .bucket(USERS_BUCKET)
            .unwrap()
            .get(b"root")
            .unwrap()
            .is_some());
    }
}
