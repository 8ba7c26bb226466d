//! `etcdserverpb.Auth`: changes of users and roles go through consensus (checked for an
//! admin before they are proposed and again as they are applied); reads answer from the
//! replicated store after a ReadIndex round, with etcd's rules of who may read what;
//! Authenticate checks the password here, then proposes the token's assignment.

use std::sync::Arc;

use api::authpb::{permission::Type as PermType, Permission};
use api::etcdserverpb::auth_server::Auth as AuthApi;
use api::etcdserverpb::*;
use tonic::{Request, Response, Status};

use super::check::{AuthError, AuthInfo};
use super::perms::ROOT;
use super::token::{SimpleTokens, Tokens};
use crate::request::{InternalAuthenticate, Op, Response as Applied};
use crate::server::Core;

/// The Auth service.
#[derive(Debug, Clone)]
pub struct AuthService {
    core: Arc<Core>,
}

impl AuthService {
    pub fn new(core: Arc<Core>) -> Self {
        AuthService { core }
    }

    fn header(&self) -> Option<ResponseHeader> {
        Some(self.core.header(self.core.backend.store().rev()))
    }

    /// Proposes an admin's change of the auth store; its answer's header.
    async fn change(
        &self,
        who: Option<&AuthInfo>,
        op: Op,
    ) -> Result<Option<ResponseHeader>, Status> {
        self.core.refuse_learner()?;
        self.core.admin(who)?;
        match self.core.propose(op, who).await? {
            Applied::AuthDone => Ok(self.header()),
            other => Err(other.unexpected()),
        }
    }

    /// A linearizable read of the auth store (etcd reads it through raft; a ReadIndex round
    /// answers the same).
    async fn read(&self) -> Result<Arc<mvcc::AuthData>, Status> {
        self.core.refuse_learner()?;
        self.core.linearize().await?;
        Ok(self.core.backend.store().auth())
    }
}

/// etcd's answer to reading the `root` role: every key, read and write.
fn root_perm() -> Permission {
    Permission {
        perm_type: PermType::Readwrite as i32,
        key: Vec::new(),
        range_end: vec![0],
    }
}

#[tonic::async_trait]
impl AuthApi for AuthService {
    async fn auth_enable(
        &self,
        req: Request<AuthEnableRequest>,
    ) -> Result<Response<AuthEnableResponse>, Status> {
        let who = self.core.who(&req).await?;
        let header = self
            .change(who.as_ref(), Op::AuthEnable(req.into_inner()))
            .await?;
        Ok(Response::new(AuthEnableResponse { header }))
    }

    async fn auth_disable(
        &self,
        req: Request<AuthDisableRequest>,
    ) -> Result<Response<AuthDisableResponse>, Status> {
        let who = self.core.who(&req).await?;
        let header = self
            .change(who.as_ref(), Op::AuthDisable(req.into_inner()))
            .await?;
        Ok(Response::new(AuthDisableResponse { header }))
    }

    /// As etcd's: an admin's call once auth is on.
    async fn auth_status(
        &self,
        req: Request<AuthStatusRequest>,
    ) -> Result<Response<AuthStatusResponse>, Status> {
        // As etcd 3.7: any caller may ask (a token, if sent, must still be valid).
        self.core.who(&req).await?;
        let data = self.read().await?;
        Ok(Response::new(AuthStatusResponse {
            header: self.header(),
            enabled: data.enabled,
            auth_revision: data.revision,
        }))
    }

    async fn authenticate(
        &self,
        req: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        let r = req.into_inner();
        self.core.refuse_learner()?;
        self.core.linearize().await?;
        loop {
            // etcd's CheckPassword, then the token's assignment through raft; if the store
            // changed in between (a password changed), again.
            let data = self.core.backend.store().auth();
            if !data.enabled {
                return Err(AuthError::AuthNotEnabled.status());
            }
            let user = data.users.get(&r.name).ok_or(AuthError::AuthFailed)?;
            if user.options.as_ref().is_some_and(|o| o.no_password) {
                return Err(AuthError::NoPasswordUser.status());
            }
            let ok = self
                .core
                .auth
                .passwords
                .check(&r.name, user.password.clone(), r.password.clone())
                .await?;
            if !ok {
                tracing::info!(user = %r.name, "invalid password");
                return Err(AuthError::AuthFailed.status());
            }
            let prefix = match &self.core.auth.tokens {
                Tokens::Simple(_) => SimpleTokens::prefix(),
                _ => String::new(),
            };
            let op = Op::Authenticate(InternalAuthenticate {
                name: r.name.clone(),
                simple_token: prefix,
            });
            let (user, revision, simple) = match self.core.propose(op, None).await? {
                Applied::Authenticated {
                    user,
                    revision,
                    simple_token,
                } => (user, revision, simple_token),
                other => return Err(other.unexpected()),
            };
            if revision != data.revision {
                tracing::info!("revision when password checked became stale; retrying");
                continue;
            }
            let token = match (&self.core.auth.tokens, simple) {
                (Tokens::Jwt(jwt), _) => jwt
                    .sign(&user, revision)
                    .map_err(|e| Status::internal(format!("signing a token: {e}")))?,
                (_, Some(t)) => t,
                _ => return Err(AuthError::AuthFailed.status()),
            };
            return Ok(Response::new(AuthenticateResponse {
                header: self.header(),
                token,
            }));
        }
    }

    async fn user_add(
        &self,
        req: Request<AuthUserAddRequest>,
    ) -> Result<Response<AuthUserAddResponse>, Status> {
        let who = self.core.who(&req).await?;
        self.core.admin(who.as_ref())?;
        let mut r = req.into_inner();
        // As etcd: the password is hashed here; only its hash enters the log.
        if !r.options.as_ref().is_some_and(|o| o.no_password) {
            let pw = std::mem::take(&mut r.password);
            r.hashed_password = self.core.auth.passwords.hash(pw).await?;
        }
        let header = self.change(who.as_ref(), Op::UserAdd(r)).await?;
        Ok(Response::new(AuthUserAddResponse { header }))
    }

    async fn user_get(
        &self,
        req: Request<AuthUserGetRequest>,
    ) -> Result<Response<AuthUserGetResponse>, Status> {
        let who = self.core.who(&req).await?;
        let r = req.into_inner();
        // As etcd: an admin, or the user itself.
        self.core.permitted(who.as_ref(), |c| {
            c.admin()
                .or_else(|e| if c.is(&r.name) { Ok(()) } else { Err(e) })
        })?;
        let data = self.read().await?;
        let user = data.users.get(&r.name).ok_or(AuthError::UserNotFound)?;
        Ok(Response::new(AuthUserGetResponse {
            header: self.header(),
            roles: user.roles.clone(),
        }))
    }

    async fn user_list(
        &self,
        req: Request<AuthUserListRequest>,
    ) -> Result<Response<AuthUserListResponse>, Status> {
        let who = self.core.who(&req).await?;
        self.core.admin(who.as_ref())?;
        let data = self.read().await?;
        Ok(Response::new(AuthUserListResponse {
            header: self.header(),
            users: data.users.keys().cloned().collect(),
        }))
    }

    async fn user_delete(
        &self,
        req: Request<AuthUserDeleteRequest>,
    ) -> Result<Response<AuthUserDeleteResponse>, Status> {
        let who = self.core.who(&req).await?;
        let header = self
            .change(who.as_ref(), Op::UserDelete(req.into_inner()))
            .await?;
        Ok(Response::new(AuthUserDeleteResponse { header }))
    }

    async fn user_change_password(
        &self,
        req: Request<AuthUserChangePasswordRequest>,
    ) -> Result<Response<AuthUserChangePasswordResponse>, Status> {
        let who = self.core.who(&req).await?;
        self.core.admin(who.as_ref())?;
        let mut r = req.into_inner();
        if !r.password.is_empty() {
            let pw = std::mem::take(&mut r.password);
            r.hashed_password = self.core.auth.passwords.hash(pw).await?;
        }
        let header = self.change(who.as_ref(), Op::UserChangePassword(r)).await?;
        Ok(Response::new(AuthUserChangePasswordResponse { header }))
    }

    async fn user_grant_role(
        &self,
        req: Request<AuthUserGrantRoleRequest>,
    ) -> Result<Response<AuthUserGrantRoleResponse>, Status> {
        let who = self.core.who(&req).await?;
        let header = self
            .change(who.as_ref(), Op::UserGrantRole(req.into_inner()))
            .await?;
        Ok(Response::new(AuthUserGrantRoleResponse { header }))
    }

    async fn user_revoke_role(
        &self,
        req: Request<AuthUserRevokeRoleRequest>,
    ) -> Result<Response<AuthUserRevokeRoleResponse>, Status> {
        let who = self.core.who(&req).await?;
        let header = self
            .change(who.as_ref(), Op::UserRevokeRole(req.into_inner()))
            .await?;
        Ok(Response::new(AuthUserRevokeRoleResponse { header }))
    }

    async fn role_add(
        &self,
        req: Request<AuthRoleAddRequest>,
    ) -> Result<Response<AuthRoleAddResponse>, Status> {
        let who = self.core.who(&req).await?;
        let header = self
            .change(who.as_ref(), Op::RoleAdd(req.into_inner()))
            .await?;
        Ok(Response::new(AuthRoleAddResponse { header }))
    }

    async fn role_get(
        &self,
        req: Request<AuthRoleGetRequest>,
    ) -> Result<Response<AuthRoleGetResponse>, Status> {
        let who = self.core.who(&req).await?;
        let r = req.into_inner();
        // As etcd: an admin, or a user the role is granted to.
        self.core.permitted(who.as_ref(), |c| {
            c.admin()
                .or_else(|e| if c.has_role(&r.role) { Ok(()) } else { Err(e) })
        })?;
        let data = self.read().await?;
        let role = data.roles.get(&r.role).ok_or(AuthError::RoleNotFound)?;
        let perm = if r.role == ROOT {
            vec![root_perm()]
        } else {
            role.key_permission.clone()
        };
        Ok(Response::new(AuthRoleGetResponse {
            header: self.header(),
            perm,
        }))
    }

    async fn role_list(
        &self,
        req: Request<AuthRoleListRequest>,
    ) -> Result<Response<AuthRoleListResponse>, Status> {
        let who = self.core.who(&req).await?;
        self.core.admin(who.as_ref())?;
        let data = self.read().await?;
        Ok(Response::new(AuthRoleListResponse {
            header: self.header(),
            roles: data.roles.keys().cloned().collect(),
        }))
    }

    async fn role_delete(
        &self,
        req: Request<AuthRoleDeleteRequest>,
    ) -> Result<Response<AuthRoleDeleteResponse>, Status> {
        let who = self.core.who(&req).await?;
        let header = self
            .change(who.as_ref(), Op::RoleDelete(req.into_inner()))
            .await?;
        Ok(Response::new(AuthRoleDeleteResponse { header }))
    }

    async fn role_grant_permission(
        &self,
        req: Request<AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<AuthRoleGrantPermissionResponse>, Status> {
        let who = self.core.who(&req).await?;
        let header = self
            .change(who.as_ref(), Op::RoleGrantPermission(req.into_inner()))
            .await?;
        Ok(Response::new(AuthRoleGrantPermissionResponse { header }))
    }

    async fn role_revoke_permission(
        &self,
        req: Request<AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<AuthRoleRevokePermissionResponse>, Status> {
        let who = self.core.who(&req).await?;
        let header = self
            .change(who.as_ref(), Op::RoleRevokePermission(req.into_inner()))
            .await?;
        Ok(Response::new(AuthRoleRevokePermissionResponse { header }))
    }
}
