//! A request's caller, as etcd finds it: a token in the request's metadata (`token`, or the
//! gateway's `authorization`), or else, with `--client-cert-auth`, the CN of the client
//! certificate its gRPC connection presented; and the checks of what the caller may do.

use tonic::metadata::MetadataMap;
use tonic::Status;

use super::check::{AuthError, AuthInfo, Check};
use super::token::{SimpleTokens, Tokens};
use crate::server::Core;
use crate::ClientCert;

/// The token a request carries: etcd's clients send `token`; its JSON gateway passes the
/// `Authorization` header as `authorization`.
pub fn token_of(md: &MetadataMap) -> Option<&str> {
    md.get("token")
        .or_else(|| md.get("authorization"))
        .and_then(|v| v.to_str().ok())
}

/// What a request carries to say who it is from: a token, and (over gRPC) the client
/// certificate of its connection.
#[derive(Debug, Clone, Default)]
pub struct Creds {
    pub token: Option<String>,
    pub cert: Option<ClientCert>,
}

impl Creds {
    /// A request carrying these credentials (for a call made on the caller's behalf).
    pub fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Some(t) = self.token.as_deref().and_then(|t| t.parse().ok()) {
            r.metadata_mut().insert("token", t);
        }
        if let Some(c) = &self.cert {
            r.extensions_mut().insert(c.clone());
        }
        r
    }

    /// A gRPC request's.
    pub fn of<T>(req: &tonic::Request<T>) -> Creds {
        Creds {
            token: token_of(req.metadata()).map(String::from),
            cert: req.extensions().get::<ClientCert>().cloned(),
        }
    }
}

impl Core {
    /// The caller of a gRPC request (None: no credentials, or auth is off).
    pub async fn who<T>(&self, req: &tonic::Request<T>) -> Result<Option<AuthInfo>, Status> {
        self.identify(&Creds::of(req)).await
    }

    /// The caller with `creds`' token or, failing that, its certificate (None: neither, or
    /// auth is off). A token that is not valid is an error, etcd's "invalid auth token".
    pub async fn identify(&self, creds: &Creds) -> Result<Option<AuthInfo>, Status> {
        let store = self.backend.store();
        if !store.auth_enabled() {
            return Ok(None);
        }
        if let Some(t) = &creds.token {
            return self.token_user(t).await.map(Some);
        }
        match &creds.cert {
            Some(c) if self.auth.client_cert_auth => Ok(Some(AuthInfo {
                user: c.common_name.clone(),
                revision: store.auth().revision,
            })),
            _ => Ok(None),
        }
    }

    async fn token_user(&self, t: &str) -> Result<AuthInfo, Status> {
        let invalid = || {
            tracing::debug!("invalid auth token");
            AuthError::InvalidAuthToken.status()
        };
        match &self.auth.tokens {
            Tokens::Simple(tokens) => {
                let index = SimpleTokens::index(t).ok_or_else(invalid)?;
                let mut user = tokens.user(t);
                if user.is_none() && index > self.node.progress().1 {
                    // Assigned by an entry this member has not applied yet (the client
                    // authenticated through another member): wait for it, as etcd does.
                    self.linearize().await?;
                    user = tokens.user(t);
                }
                let user = user.ok_or_else(invalid)?;
                Ok(AuthInfo {
                    user,
                    revision: self.backend.store().auth().revision,
                })
            }
            Tokens::Jwt(jwt) => jwt
                .check(t)
                .map(|c| AuthInfo {
                    user: c.username,
                    revision: c.revision,
                })
                .ok_or_else(invalid),
            Tokens::None => Err(invalid()),
        }
    }

    /// Runs `f`'s checks of a request from `who` against the auth store as it is now.
    pub fn permitted(
        &self,
        who: Option<&AuthInfo>,
        f: impl FnOnce(&mut Check<'_>) -> Result<(), AuthError>,
    ) -> Result<(), Status> {
        let store = self.backend.store();
        if !store.auth_enabled() {
            return Ok(());
        }
        let data = store.auth();
        let keys = |id| store.lease_keys(id);
        let mut c = self.auth.check(&data, who, &keys);
        f(&mut c).map_err(AuthError::status)
    }

    /// etcd's check after a read (doSerialize): credentials of an auth revision that moved
    /// while the read ran are old ("revision of auth store is old"; clients authenticate
    /// again).
    pub fn auth_unchanged(&self, who: Option<&AuthInfo>) -> Result<(), Status> {
        let store = self.backend.store();
        match who {
            Some(w) if store.auth_enabled() && w.revision != store.auth().revision => {
                Err(AuthError::AuthOldRevision.status())
            }
            _ => Ok(()),
        }
    }

    /// etcd 3.7's check of the calls any user may make (`requireAuthInfo`): with auth on, the
    /// caller must be someone ("user name is empty" otherwise).
    pub fn signed_in(&self, who: Option<&AuthInfo>) -> Result<(), Status> {
        if who.is_none() && self.backend.store().auth_enabled() {
            return Err(AuthError::UserEmpty.status());
        }
        Ok(())
    }

    /// etcd's admin check: with auth on, only a user with the `root` role.
    pub fn admin(&self, who: Option<&AuthInfo>) -> Result<(), Status> {
        self.permitted(who, |c| c.admin())
    }
}
