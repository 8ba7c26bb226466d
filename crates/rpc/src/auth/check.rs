//! Who a request comes from and what it may do: etcd's AuthInfo, its auth errors (codes and
//! texts), the member's auth settings, and the permission check of a request against the
//! replicated users and roles — made before a request is proposed and again when it is
//! applied, as etcd's apply does, so a permission revoked in between is honoured.

use std::collections::HashMap;
use std::sync::Arc;

use mvcc::AuthData;
use parking_lot::Mutex;
use tonic::Status;

use ids::LeaseId;

use super::password::Passwords;
use super::perms::{Checks, Need, Perms};
use super::token::Tokens;

/// Who makes a request (etcd's AuthInfo): a user, and the auth revision its credentials were
/// issued at (a JWT's claim; the current revision for a simple token or a certificate).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AuthInfo {
    pub user: String,
    pub revision: u64,
}

/// etcd's auth errors, answered with etcd's codes and texts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    RootUserNotExist,
    RootRoleNotExist,
    UserAlreadyExist,
    UserEmpty,
    UserNotFound,
    RoleAlreadyExist,
    RoleNotFound,
    RoleEmpty,
    AuthFailed,
    PermissionNotGiven,
    PermissionDenied,
    RoleNotGranted,
    PermissionNotGranted,
    AuthNotEnabled,
    InvalidAuthToken,
    InvalidAuthMgmt,
    AuthOldRevision,
    /// Not one of etcd's gRPC errors: etcd answers it as Unknown with the auth package's text.
    NoPasswordUser,
}

impl AuthError {
    pub fn status(self) -> Status {
        use AuthError as E;
        let (f, m): (fn(String) -> Status, &str) = match self {
            E::RootUserNotExist => (Status::failed_precondition, "root user does not exist"),
            E::RootRoleNotExist => (
                Status::failed_precondition,
                "root user does not have root role",
            ),
            E::UserAlreadyExist => (Status::failed_precondition, "user name already exists"),
            E::UserEmpty => (Status::invalid_argument, "user name is empty"),
            E::UserNotFound => (Status::failed_precondition, "user name not found"),
            E::RoleAlreadyExist => (Status::failed_precondition, "role name already exists"),
            E::RoleNotFound => (Status::failed_precondition, "role name not found"),
            E::RoleEmpty => (Status::invalid_argument, "role name is empty"),
            E::AuthFailed => (
                Status::invalid_argument,
                "authentication failed, invalid user ID or password",
            ),
            E::PermissionNotGiven => (Status::invalid_argument, "permission not given"),
            E::PermissionDenied => (Status::permission_denied, "permission denied"),
            E::RoleNotGranted => (
                Status::failed_precondition,
                "role is not granted to the user",
            ),
            E::PermissionNotGranted => (
                Status::failed_precondition,
                "permission is not granted to the role",
            ),
            E::AuthNotEnabled => (Status::failed_precondition, "authentication is not enabled"),
            E::InvalidAuthToken => (Status::unauthenticated, "invalid auth token"),
            E::InvalidAuthMgmt => (Status::invalid_argument, "invalid auth management"),
            E::AuthOldRevision => (Status::invalid_argument, "revision of auth store is old"),
            E::NoPasswordUser => {
                return Status::unknown(
                    "auth: authentication failed, password was given for no password user",
                )
            }
        };
        f(format!("etcdserver: {m}"))
    }
}

impl From<AuthError> for Status {
    fn from(e: AuthError) -> Status {
        e.status()
    }
}

/// The member's auth machinery: its tokens, password hashing, what `--client-cert-auth` says,
/// and the users' permissions (rebuilt when the auth revision moves).
#[derive(Debug)]
pub struct Auth {
    pub tokens: Tokens,
    pub passwords: Passwords,
    /// With `--client-cert-auth`, a gRPC request without a token is its certificate's CN's.
    pub client_cert_auth: bool,
    perms: Mutex<(u64, HashMap<String, Arc<Perms>>)>,
}

impl Auth {
    pub fn new(tokens: Tokens, bcrypt_cost: u32, client_cert_auth: bool) -> Auth {
        Auth {
            tokens,
            passwords: Passwords::new(bcrypt_cost),
            client_cert_auth,
            perms: Mutex::new((0, HashMap::new())),
        }
    }

    /// `user`'s permissions in `data` (None: no such user).
    fn perms(&self, data: &AuthData, user: &str) -> Option<Arc<Perms>> {
        let u = data.users.get(user)?;
        let mut cache = self.perms.lock();
        if cache.0 != data.revision {
            *cache = (data.revision, HashMap::new());
        }
        Some(
            cache
                .1
                .entry(user.to_string())
                .or_insert_with(|| Arc::new(Perms::of(u, &data.roles)))
                .clone(),
        )
    }

    /// The checker of a request from `who` against `data`; `lease_keys` finds the keys of a
    /// lease (the store's, or the writer's while applying).
    pub fn check<'a>(
        &'a self,
        data: &'a AuthData,
        who: Option<&'a AuthInfo>,
        lease_keys: &'a LeaseKeys<'a>,
    ) -> Check<'a> {
        Check {
            auth: self,
            data,
            who,
            lease_keys,
            perms: None,
        }
    }
}

/// Finds the keys attached to a lease (None: no such lease).
pub type LeaseKeys<'a> = dyn Fn(LeaseId) -> Option<Vec<Vec<u8>>> + 'a;

/// The permission checks of one request.
pub struct Check<'a> {
    auth: &'a Auth,
    data: &'a AuthData,
    who: Option<&'a AuthInfo>,
    lease_keys: &'a LeaseKeys<'a>,
    perms: Option<Arc<Perms>>,
}

impl std::fmt::Debug for Check<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Check")
            .field("who", &self.who)
            .finish_non_exhaustive()
    }
}

impl Check<'_> {
    /// etcd's IsAdminPermitted: with auth on, only users with the `root` role (and no check
    /// of the credentials' revision, as etcd).
    pub fn admin(&self) -> Result<(), AuthError> {
        if !self.data.enabled {
            return Ok(());
        }
        let who = self
            .who
            .filter(|w| !w.user.is_empty())
            .ok_or(AuthError::UserEmpty)?;
        let user = self
            .data
            .users
            .get(&who.user)
            .ok_or(AuthError::UserNotFound)?;
        if !user.roles.iter().any(|r| r == super::perms::ROOT) {
            return Err(AuthError::PermissionDenied);
        }
        Ok(())
    }

    /// Whether the caller is `user` (etcd lets a user read its own user and roles).
    pub fn is(&self, user: &str) -> bool {
        self.who.is_some_and(|w| w.user == user)
    }

    /// Whether the caller has role `role`.
    pub fn has_role(&self, role: &str) -> bool {
        self.who
            .and_then(|w| self.data.users.get(&w.user))
            .is_some_and(|u| u.roles.iter().any(|r| r == role))
    }
}

impl Checks for Check<'_> {
    type Error = AuthError;

    /// etcd's isOpPermitted.
    fn need(&mut self, need: Need, key: &[u8], range_end: &[u8]) -> Result<(), AuthError> {
        if !self.data.enabled {
            return Ok(());
        }
        let who = self
            .who
            .filter(|w| w.revision != 0)
            .ok_or(AuthError::UserEmpty)?;
        if who.revision < self.data.revision {
            return Err(AuthError::AuthOldRevision);
        }
        if self.perms.is_none() {
            self.perms = Some(
                self.auth
                    .perms(self.data, &who.user)
                    .ok_or(AuthError::PermissionDenied)?,
            );
        }
        match &self.perms {
            Some(p) if p.allows(need, key, range_end) => Ok(()),
            _ => Err(AuthError::PermissionDenied),
        }
    }

    /// etcd's checkLeasePuts: the lease's keys must all be writable, unless the caller is an
    /// admin (a lease that does not exist has none).
    fn lease(&mut self, id: LeaseId) -> Result<(), AuthError> {
        if self.admin().is_ok() {
            return Ok(());
        }
        for key in (self.lease_keys)(id).unwrap_or_default() {
            self.need(Need::Write, &key, &[])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::authpb::{Permission, Role, User};

    fn data(enabled: bool) -> AuthData {
        let mut d = AuthData {
            enabled,
            revision: 5,
            ..AuthData::default()
        };
        for (name, roles) in [
            ("root", vec!["root"]),
            ("alice", vec!["r"]),
            ("bob", vec![]),
        ] {
            d.users.insert(
                name.into(),
                User {
                    name: name.into(),
                    roles: roles.into_iter().map(String::from).collect(),
                    ..Default::default()
                },
            );
        }
        d.roles.insert(
            "r".into(),
            Role {
                name: b"r".to_vec(),
                key_permission: vec![Permission {
                    perm_type: 0,
                    key: b"a".to_vec(),
                    range_end: b"b".to_vec(),
                }],
            },
        );
        d
    }

    fn who(user: &str, revision: u64) -> AuthInfo {
        AuthInfo {
            user: user.into(),
            revision,
        }
    }

    #[test]
    fn etcds_order_of_refusals() {
        let auth = Auth::new(Tokens::None, 4, false);
        let d = data(true);
        let none = |_| None;
        let need = |w: Option<&AuthInfo>| auth.check(&d, w, &none).need(Need::Read, b"a1", b"");
        assert_eq!(need(None), Err(AuthError::UserEmpty));
        assert_eq!(need(Some(&who("alice", 0))), Err(AuthError::UserEmpty));
        assert_eq!(
            need(Some(&who("alice", 4))),
            Err(AuthError::AuthOldRevision)
        );
        assert_eq!(need(Some(&who("alice", 5))), Ok(()));
        assert_eq!(
            need(Some(&who("nobody", 5))),
            Err(AuthError::PermissionDenied)
        );
        assert_eq!(need(Some(&who("bob", 5))), Err(AuthError::PermissionDenied));
        assert_eq!(need(Some(&who("root", 5))), Ok(()));
        let admin = |w: Option<&AuthInfo>| auth.check(&d, w, &none).admin();
        assert_eq!(admin(None), Err(AuthError::UserEmpty));
        assert_eq!(admin(Some(&who("nobody", 5))), Err(AuthError::UserNotFound));
        assert_eq!(
            admin(Some(&who("alice", 5))),
            Err(AuthError::PermissionDenied)
        );
        assert_eq!(admin(Some(&who("root", 1))), Ok(()), "no revision check");
        // Auth off: everything goes.
        let off = data(false);
        assert_eq!(
            auth.check(&off, None, &none).need(Need::Write, b"z", b""),
            Ok(())
        );
        assert_eq!(auth.check(&off, None, &none).admin(), Ok(()));
    }

    #[test]
    fn a_lease_needs_write_on_its_keys_unless_admin() {
        let auth = Auth::new(Tokens::None, 4, false);
        let mut d = data(true);
        d.roles.get_mut("r").unwrap().key_permission[0].perm_type = 2;
        let keys = |id| (id == LeaseId(1)).then(|| vec![b"a1".to_vec(), b"zz".to_vec()]);
        let alice = who("alice", 5);
        assert_eq!(
            auth.check(&d, Some(&alice), &keys).lease(LeaseId(1)),
            Err(AuthError::PermissionDenied)
        );
        assert_eq!(
            auth.check(&d, Some(&alice), &keys).lease(LeaseId(2)),
            Ok(())
        );
        assert_eq!(
            auth.check(&d, Some(&who("root", 5)), &keys)
                .lease(LeaseId(1)),
            Ok(())
        );
    }

    #[test]
    fn statuses_are_etcds() {
        let s = AuthError::PermissionDenied.status();
        assert_eq!(s.code(), tonic::Code::PermissionDenied);
        assert_eq!(s.message(), "etcdserver: permission denied");
        let s = AuthError::InvalidAuthToken.status();
        assert_eq!(s.code(), tonic::Code::Unauthenticated);
        assert_eq!(s.message(), "etcdserver: invalid auth token");
        assert_eq!(
            AuthError::AuthOldRevision.status().message(),
            "etcdserver: revision of auth store is old"
        );
    }
}
