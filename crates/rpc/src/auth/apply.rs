//! Applying the auth store's changes, with etcd's rules and errors: every member applies the
//! same committed changes in the same order, so every member's users and roles agree.

use api::authpb::{Permission, Role, User, UserAddOptions};
use api::etcdserverpb::{
    AuthRoleDeleteRequest, AuthRoleGrantPermissionRequest, AuthRoleRevokePermissionRequest,
    AuthUserAddRequest, AuthUserChangePasswordRequest, AuthUserDeleteRequest,
    AuthUserGrantRoleRequest, AuthUserRevokeRoleRequest,
};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use mvcc::Writer;

use super::check::{Auth, AuthError};
use ids::RaftIndex;

use super::perms::{valid_permission_range, ROOT};
use super::token::Tokens;
use crate::request::{InternalAuthenticate, Op, Response};

type Result<T> = std::result::Result<T, AuthError>;

/// Applies auth op `op` (an op for which [`is_auth`] holds) in the entry at `index`.
pub fn apply(w: &mut Writer<'_>, auth: &Auth, op: Op, index: RaftIndex) -> Result<Response> {
    match op {
        Op::AuthEnable(_) => enable(w).map(|()| Response::AuthDone),
        Op::AuthDisable(_) => {
            if w.auth().enabled {
                w.auth_set_enabled(false);
                w.auth_bump_revision();
                if let Tokens::Simple(t) = &auth.tokens {
                    t.clear();
                }
                tracing::info!("disabled authentication");
            }
            Ok(Response::AuthDone)
        }
        Op::Authenticate(a) => authenticate(w, auth, a, index),
        Op::UserAdd(r) => user_add(w, r),
        Op::UserDelete(r) => user_delete(w, auth, r),
        Op::UserChangePassword(r) => change_password(w, auth, r),
        Op::UserGrantRole(r) => grant_role(w, r),
        Op::UserRevokeRole(r) => revoke_role(w, r),
        Op::RoleAdd(r) => {
            if r.name.is_empty() {
                return Err(AuthError::RoleEmpty);
            }
            if w.auth().roles.contains_key(&r.name) {
                return Err(AuthError::RoleAlreadyExist);
            }
            w.auth_put_role(Role {
                name: r.name.clone().into_bytes(),
                key_permission: Vec::new(),
            });
            w.auth_bump_revision();
            tracing::info!(role = %r.name, "created a role");
            Ok(Response::AuthDone)
        }
        Op::RoleDelete(r) => role_delete(w, r),
        Op::RoleGrantPermission(r) => grant_permission(w, r),
        Op::RoleRevokePermission(r) => revoke_permission(w, r),
        other => {
            tracing::error!(op = ?std::mem::discriminant(&other), "not an auth change");
            Err(AuthError::InvalidAuthMgmt)
        }
    }
}

/// Whether `op` changes the auth store (applied by [`apply`]).
pub fn is_auth(op: &Op) -> bool {
    op.needs_admin() || matches!(op, Op::Authenticate(_))
}

fn enable(w: &mut Writer<'_>) -> Result<()> {
    let data = w.auth();
    if data.enabled {
        tracing::info!("authentication is already enabled; ignored auth enable request");
        return Ok(());
    }
    let root = data.users.get(ROOT).ok_or(AuthError::RootUserNotExist)?;
    if !root.roles.iter().any(|r| r == ROOT) {
        return Err(AuthError::RootRoleNotExist);
    }
    // As etcd: enabling does not move the auth revision.
    w.auth_set_enabled(true);
    tracing::info!("enabled authentication");
    Ok(())
}

fn authenticate(
    w: &mut Writer<'_>,
    auth: &Auth,
    a: InternalAuthenticate,
    index: RaftIndex,
) -> Result<Response> {
    let data = w.auth();
    if !data.enabled {
        return Err(AuthError::AuthNotEnabled);
    }
    let user = data.users.get(&a.name).ok_or(AuthError::AuthFailed)?;
    if user.options.as_ref().is_some_and(|o| o.no_password) {
        return Err(AuthError::AuthFailed);
    }
    let simple_token = match &auth.tokens {
        Tokens::Simple(t) => Some(t.assign(&a.simple_token, index, &a.name)),
        Tokens::Jwt(_) => None,
        Tokens::None => return Err(AuthError::AuthFailed),
    };
    Ok(Response::Authenticated {
        user: a.name,
        revision: data.revision,
        simple_token,
    })
}

/// The stored password of a user added or changed: the hash the request carries (etcd's
/// selectPassword; a password in the clear comes only from etcd before 3.5, and is hashed
/// here as etcd does).
fn password(plain: &str, hashed: &str, auth_cost: u32) -> Result<Vec<u8>> {
    if !plain.is_empty() && hashed.is_empty() {
        return bcrypt::hash_with_result(plain, auth_cost)
            .map(|h| h.format_for_version(bcrypt::Version::TwoA).into_bytes())
            .map_err(|_| AuthError::NoPasswordUser);
    }
    B64.decode(hashed).map_err(|_| AuthError::NoPasswordUser)
}

fn user_add(w: &mut Writer<'_>, r: AuthUserAddRequest) -> Result<Response> {
    if r.name.is_empty() {
        return Err(AuthError::UserEmpty);
    }
    if w.auth().users.contains_key(&r.name) {
        return Err(AuthError::UserAlreadyExist);
    }
    let options = r.options.unwrap_or(UserAddOptions { no_password: false });
    let pw = if options.no_password {
        Vec::new()
    } else {
        password(
            &r.password,
            &r.hashed_password,
            super::password::DEFAULT_COST,
        )?
    };
    w.auth_put_user(User {
        name: r.name.clone().into_bytes(),
        password: pw,
        roles: Vec::new(),
        options: Some(options),
    });
    w.auth_bump_revision();
    tracing::info!(user = %r.name, "added a user");
    Ok(Response::AuthDone)
}

fn user_delete(w: &mut Writer<'_>, auth: &Auth, r: AuthUserDeleteRequest) -> Result<Response> {
    let data = w.auth();
    if data.enabled && r.name == ROOT {
        return Err(AuthError::InvalidAuthMgmt);
    }
    if !data.users.contains_key(&r.name) {
        return Err(AuthError::UserNotFound);
    }
    w.auth_delete_user(&r.name);
    w.auth_bump_revision();
    if let Tokens::Simple(t) = &auth.tokens {
        t.invalidate_user(&r.name);
    }
    tracing::info!(user = %r.name, "deleted a user");
    Ok(Response::AuthDone)
}

fn change_password(
    w: &mut Writer<'_>,
    auth: &Auth,
    r: AuthUserChangePasswordRequest,
) -> Result<Response> {
    let mut user = w
        .auth()
        .users
        .get(&r.name)
        .cloned()
        .ok_or(AuthError::UserNotFound)?;
    if !user.options.as_ref().is_some_and(|o| o.no_password) {
        user.password = password(
            &r.password,
            &r.hashed_password,
            super::password::DEFAULT_COST,
        )?;
    } else {
        user.password = Vec::new();
    }
    w.auth_put_user(user);
    w.auth_bump_revision();
    if let Tokens::Simple(t) = &auth.tokens {
        t.invalidate_user(&r.name);
    }
    tracing::info!(user = %r.name, "changed a password of a user");
    Ok(Response::AuthDone)
}

fn grant_role(w: &mut Writer<'_>, r: AuthUserGrantRoleRequest) -> Result<Response> {
    let data = w.auth();
    let mut user = data
        .users
        .get(&r.user)
        .cloned()
        .ok_or(AuthError::UserNotFound)?;
    if r.role != ROOT && !data.roles.contains_key(&r.role) {
        return Err(AuthError::RoleNotFound);
    }
    match user.roles.binary_search(&r.role) {
        Ok(_) => {
            tracing::warn!(user = %r.user, role = %r.role, "ignored grant role request to a user: already granted");
            return Ok(Response::AuthDone);
        }
        Err(i) => user.roles.insert(i, r.role.clone()),
    }
    w.auth_put_user(user);
    w.auth_bump_revision();
    tracing::info!(user = %r.user, role = %r.role, "granted a role to a user");
    Ok(Response::AuthDone)
}

fn revoke_role(w: &mut Writer<'_>, r: AuthUserRevokeRoleRequest) -> Result<Response> {
    let data = w.auth();
    if data.enabled && r.name == ROOT && r.role == ROOT {
        return Err(AuthError::InvalidAuthMgmt);
    }
    let mut user = data
        .users
        .get(&r.name)
        .cloned()
        .ok_or(AuthError::UserNotFound)?;
    let before = user.roles.len();
    user.roles.retain(|x| *x != r.role);
    if user.roles.len() == before {
        return Err(AuthError::RoleNotGranted);
    }
    w.auth_put_user(user);
    w.auth_bump_revision();
    tracing::info!(user = %r.name, role = %r.role, "revoked a role from a user");
    Ok(Response::AuthDone)
}

fn role_delete(w: &mut Writer<'_>, r: AuthRoleDeleteRequest) -> Result<Response> {
    let data = w.auth();
    if data.enabled && r.role == ROOT {
        return Err(AuthError::InvalidAuthMgmt);
    }
    if !data.roles.contains_key(&r.role) {
        return Err(AuthError::RoleNotFound);
    }
    w.auth_delete_role(&r.role);
    for user in data.users.values() {
        if user.roles.contains(&r.role) {
            let mut u = user.clone();
            u.roles.retain(|x| *x != r.role);
            w.auth_put_user(u);
        }
    }
    w.auth_bump_revision();
    tracing::info!(role = %r.role, "deleted a role");
    Ok(Response::AuthDone)
}

fn grant_permission(w: &mut Writer<'_>, r: AuthRoleGrantPermissionRequest) -> Result<Response> {
    let perm = r.perm.ok_or(AuthError::PermissionNotGiven)?;
    if !valid_permission_range(&perm.key, &perm.range_end) {
        return Err(AuthError::InvalidAuthMgmt);
    }
    let mut role = w
        .auth()
        .roles
        .get(&r.name)
        .cloned()
        .ok_or(AuthError::RoleNotFound)?;
    let at = role
        .key_permission
        .partition_point(|p| p.key.as_slice() < perm.key.as_slice());
    match role.key_permission.get_mut(at) {
        Some(p) if p.key == perm.key && p.range_end == perm.range_end => {
            p.perm_type = perm.perm_type;
        }
        _ => {
            role.key_permission.push(Permission {
                perm_type: perm.perm_type,
                key: perm.key.clone(),
                range_end: perm.range_end.clone(),
            });
            // Go's sort.Sort (not stable) by key; equal keys keep this order here.
            role.key_permission.sort_by(|a, b| a.key.cmp(&b.key));
        }
    }
    w.auth_put_role(role);
    w.auth_bump_revision();
    tracing::info!(role = %r.name, key = %String::from_utf8_lossy(&perm.key), range_end = %String::from_utf8_lossy(&perm.range_end), "granted/updated a permission to a role");
    Ok(Response::AuthDone)
}

fn revoke_permission(w: &mut Writer<'_>, r: AuthRoleRevokePermissionRequest) -> Result<Response> {
    let mut role = w
        .auth()
        .roles
        .get(&r.role)
        .cloned()
        .ok_or(AuthError::RoleNotFound)?;
    let before = role.key_permission.len();
    role.key_permission
        .retain(|p| p.key != r.key || p.range_end != r.range_end);
    if role.key_permission.len() == before {
        return Err(AuthError::PermissionNotGranted);
    }
    w.auth_put_role(role);
    w.auth_bump_revision();
    tracing::info!(role = %r.role, key = %String::from_utf8_lossy(&r.key), "revoked a permission on range");
    Ok(Response::AuthDone)
}
