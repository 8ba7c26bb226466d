//! `etcdserverpb.Auth` while authentication is not built: AuthStatus reports it disabled, and
//! every other call answers etcd's "authentication is not enabled", so clients that probe for
//! auth (or were given credentials by mistake) get etcd's answer, not an unknown service.

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
                    auth_revision: 0,
                }))
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
    user_get(AuthUserGetRequest) -> AuthUserGetResponse;
    user_list(AuthUserListRequest) -> AuthUserListResponse;
    user_delete(AuthUserDeleteRequest) -> AuthUserDeleteResponse;
    user_change_password(AuthUserChangePasswordRequest) -> AuthUserChangePasswordResponse;
    user_grant_role(AuthUserGrantRoleRequest) -> AuthUserGrantRoleResponse;
    user_revoke_role(AuthUserRevokeRoleRequest) -> AuthUserRevokeRoleResponse;
    role_add(AuthRoleAddRequest) -> AuthRoleAddResponse;
    role_get(AuthRoleGetRequest) -> AuthRoleGetResponse;
    role_list(AuthRoleListRequest) -> AuthRoleListResponse;
    role_delete(AuthRoleDeleteRequest) -> AuthRoleDeleteResponse;
    role_grant_permission(AuthRoleGrantPermissionRequest) -> AuthRoleGrantPermissionResponse;
    role_revoke_permission(AuthRoleRevokePermissionRequest) -> AuthRoleRevokePermissionResponse;
}
