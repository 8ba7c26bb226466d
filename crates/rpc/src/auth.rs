//! `etcdserverpb.Auth` while authentication is not built: AuthStatus reports it disabled, the
//! user and role queries answer what etcd answers with no users or roles, and every other call
//! answers etcd's "authentication is not enabled", so clients that probe for auth (or were
//! given credentials by mistake) get etcd's answer, not an unknown service.

use std::sync::Arc;

use api::etcdserverpb::auth_server::Auth;
use api::etcdserverpb::*;
use tonic::{Request, Response, Status};

use crate::error;
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

    /// The header of a read of the (empty) user and role store: linearizable, as etcd's.
    async fn header(&self) -> Result<Option<ResponseHeader>, Status> {
        self.core.refuse_learner()?;
        self.core.linearize().await?;
        Ok(Some(self.core.header(self.core.backend.store().rev())))
    }
}

/// The Auth impl: `auth_status` answers; every listed method is "not enabled". (async_trait
/// must see the methods themselves, so the macro emits the whole impl.)
macro_rules! auth_impl {
    ($($name:ident($req:ty) -> $resp:ty;)*) => {
        #[tonic::async_trait]
        impl Auth for AuthService {
            async fn auth_status(
                &self,
                _req: Request<AuthStatusRequest>,
            ) -> Result<Response<AuthStatusResponse>, Status> {
                let rev = self.core.backend.store().rev();
                Ok(Response::new(AuthStatusResponse {
                    header: Some(self.core.header(rev)),
                    enabled: false,
                    // A new etcd cluster's auth store starts at revision 1.
                    auth_revision: 1,
                }))
            }

            async fn user_list(
                &self,
                _req: Request<AuthUserListRequest>,
            ) -> Result<Response<AuthUserListResponse>, Status> {
                Ok(Response::new(AuthUserListResponse {
                    header: self.header().await?,
                    users: Vec::new(),
                }))
            }

            async fn role_list(
                &self,
                _req: Request<AuthRoleListRequest>,
            ) -> Result<Response<AuthRoleListResponse>, Status> {
                Ok(Response::new(AuthRoleListResponse {
                    header: self.header().await?,
                    roles: Vec::new(),
                }))
            }

            async fn user_get(
                &self,
                _req: Request<AuthUserGetRequest>,
            ) -> Result<Response<AuthUserGetResponse>, Status> {
                Err(Status::failed_precondition("etcdserver: user name not found"))
            }

            async fn role_get(
                &self,
                _req: Request<AuthRoleGetRequest>,
            ) -> Result<Response<AuthRoleGetResponse>, Status> {
                Err(Status::failed_precondition("etcdserver: role name not found"))
            }

            $(
                async fn $name(&self, _req: Request<$req>) -> Result<Response<$resp>, Status> {
                    Err(error::auth_not_enabled())
                }
            )*
        }
    };
}

auth_impl! {
    auth_enable(AuthEnableRequest) -> AuthEnableResponse;
    auth_disable(AuthDisableRequest) -> AuthDisableResponse;
    authenticate(AuthenticateRequest) -> AuthenticateResponse;
    user_add(AuthUserAddRequest) -> AuthUserAddResponse;
    user_delete(AuthUserDeleteRequest) -> AuthUserDeleteResponse;
    user_change_password(AuthUserChangePasswordRequest) -> AuthUserChangePasswordResponse;
    user_grant_role(AuthUserGrantRoleRequest) -> AuthUserGrantRoleResponse;
    user_revoke_role(AuthUserRevokeRoleRequest) -> AuthUserRevokeRoleResponse;
    role_add(AuthRoleAddRequest) -> AuthRoleAddResponse;
    role_delete(AuthRoleDeleteRequest) -> AuthRoleDeleteResponse;
    role_grant_permission(AuthRoleGrantPermissionRequest) -> AuthRoleGrantPermissionResponse;
    role_revoke_permission(AuthRoleRevokePermissionRequest) -> AuthRoleRevokePermissionResponse;
}
