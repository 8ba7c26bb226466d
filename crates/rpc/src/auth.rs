//! etcd's authentication and RBAC: users, roles and permissions replicated through raft and
//! kept in the data file, simple and JWT tokens, a client certificate's CN as the user, and
//! the permission check of every request — made before it is proposed and again as it is
//! applied.

mod apply;
mod check;
mod identity;
mod jwt;
mod password;
mod perms;
mod service;
mod token;

pub use apply::{apply, is_auth};
pub use check::{Auth, AuthError, AuthInfo, Check};
pub use identity::{token_of, Creds};
pub use jwt::JwtError;
pub use password::DEFAULT_COST as DEFAULT_BCRYPT_COST;
pub use perms::{Checks, Need};
pub use service::AuthService;
pub use token::{BadAuthToken, SimpleTokens, Tokens};

pub(crate) use perms::{delete_range, put, range, txn};
