//! Auth tokens, as etcd's `--auth-token` chooses them: `simple` (a random prefix and the raft
//! index of the Authenticate that assigned it, known to every member that applied it, valid
//! until unused for `--auth-token-ttl`), `jwt,…` (signed, self-contained), or none.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ids::RaftIndex;
use parking_lot::Mutex;
use rand::Rng;

use super::jwt::Jwt;

/// How the member makes and reads tokens.
#[derive(Debug)]
pub enum Tokens {
    Simple(SimpleTokens),
    Jwt(Box<Jwt>),
    /// `--auth-token ""`: no token is ever valid (etcd's nop provider).
    None,
}

/// Why `--auth-token` was refused.
#[derive(Debug, thiserror::Error)]
pub enum BadAuthToken {
    #[error("--auth-token {opts:?}: invalid option {option:?} (want key=value)")]
    Option { opts: String, option: String },
    #[error("--auth-token {opts:?}: option {key:?} given twice")]
    Twice { opts: String, key: String },
    #[error("--auth-token {key}={file}: {source}")]
    Key {
        key: String,
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("--auth-token ttl={value}: {source}")]
    Ttl {
        value: String,
        #[source]
        source: crate::BadDuration,
    },
    #[error("--auth-token: {0}")]
    Jwt(#[source] super::jwt::JwtError),
    #[error("--auth-token {0:?}: unknown token type (want simple, jwt,… or \"\")")]
    Kind(String),
}

impl Tokens {
    /// From etcd's `--auth-token` value and `--auth-token-ttl`.
    pub fn parse(opts: &str, simple_ttl: Duration) -> Result<Tokens, BadAuthToken> {
        let mut parts = opts.split(',');
        let kind = parts.next().unwrap_or_default();
        let mut map: HashMap<&str, &str> = HashMap::new();
        for p in parts {
            let (k, v) = p
                .split_once('=')
                .filter(|(_, v)| !v.contains('='))
                .ok_or_else(|| BadAuthToken::Option {
                    opts: opts.to_string(),
                    option: p.to_string(),
                })?;
            if map.insert(k, v).is_some() {
                return Err(BadAuthToken::Twice {
                    opts: opts.to_string(),
                    key: k.to_string(),
                });
            }
        }
        match kind {
            "simple" => Ok(Tokens::Simple(SimpleTokens::new(simple_ttl))),
            "" => Ok(Tokens::None),
            "jwt" => {
                for k in map.keys() {
                    if !["sign-method", "pub-key", "priv-key", "ttl"].contains(k) {
                        tracing::warn!(option = k, "unknown JWT option");
                    }
                }
                let read = |k: &str| -> Result<Option<Vec<u8>>, BadAuthToken> {
                    map.get(k)
                        .map(|f| {
                            std::fs::read(f).map_err(|source| BadAuthToken::Key {
                                key: k.to_string(),
                                file: f.to_string(),
                                source,
                            })
                        })
                        .transpose()
                };
                let ttl = match map.get("ttl") {
                    None | Some(&"") => super::jwt::DEFAULT_TTL,
                    Some(t) => crate::parse_duration(t).map_err(|source| BadAuthToken::Ttl {
                        value: t.to_string(),
                        source,
                    })?,
                };
                let method = map.get("sign-method").copied().unwrap_or_default();
                let jwt = Jwt::new(
                    method,
                    read("pub-key")?.as_deref(),
                    read("priv-key")?.as_deref(),
                    ttl,
                )
                .map_err(BadAuthToken::Jwt)?;
                Ok(Tokens::Jwt(Box::new(jwt)))
            }
            other => Err(BadAuthToken::Kind(other.to_string())),
        }
    }
}

const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// Simple tokens: `prefix.index` → user, each forgotten once unused for the TTL.
#[derive(Debug)]
pub struct SimpleTokens {
    ttl: Duration,
    tokens: Mutex<HashMap<String, (String, Instant)>>,
}

impl SimpleTokens {
    pub fn new(ttl: Duration) -> SimpleTokens {
        SimpleTokens {
            ttl: if ttl.is_zero() {
                Duration::from_secs(300)
            } else {
                ttl
            },
            tokens: Mutex::new(HashMap::new()),
        }
    }

    /// A random prefix for a new token (16 letters, as etcd's).
    pub fn prefix() -> String {
        let mut rng = rand::thread_rng();
        (0..16)
            .map(|_| LETTERS[rng.gen_range(0..LETTERS.len())] as char)
            .collect()
    }

    /// Records the token of an applied Authenticate (every member does).
    pub fn assign(&self, prefix: &str, index: RaftIndex, user: &str) -> String {
        let token = format!("{prefix}.{index}");
        let now = Instant::now();
        let mut t = self.tokens.lock();
        // Forget expired tokens as new ones come (no thread of its own).
        if t.len() % 64 == 63 {
            t.retain(|_, (_, until)| *until > now);
        }
        t.insert(token.clone(), (user.to_string(), now + self.ttl));
        token
    }

    /// The user of `token`, if it is known and alive; its TTL starts again (etcd's).
    pub fn user(&self, token: &str) -> Option<String> {
        let now = Instant::now();
        let mut t = self.tokens.lock();
        let (user, until) = t.get_mut(token)?;
        if *until <= now {
            t.remove(token);
            return None;
        }
        *until = now + self.ttl;
        Some(user.clone())
    }

    /// The raft index a well-formed token names (the member must have applied it to know it).
    pub fn index(token: &str) -> Option<RaftIndex> {
        let (_, index) = token.split_once('.')?;
        index.parse().ok().map(RaftIndex)
    }

    /// Forgets `user`'s tokens (deleted, or its password changed).
    pub fn invalidate_user(&self, user: &str) {
        self.tokens.lock().retain(|_, (u, _)| u != user);
    }

    /// Forgets every token (auth disabled).
    pub fn clear(&self) {
        self.tokens.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_tokens_expire_unless_used_and_go_with_their_user() {
        let t = SimpleTokens::new(Duration::from_millis(200));
        let p = SimpleTokens::prefix();
        assert_eq!(p.len(), 16);
        let a = t.assign(&p, RaftIndex(12), "alice");
        assert_eq!(a, format!("{p}.12"));
        assert_eq!(SimpleTokens::index(&a), Some(RaftIndex(12)));
        let b = t.assign(&SimpleTokens::prefix(), RaftIndex(13), "bob");
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(100));
            assert_eq!(t.user(&a).as_deref(), Some("alice"), "kept alive by use");
        }
        assert_eq!(t.user(&b), None, "expired unused");
        t.invalidate_user("alice");
        assert_eq!(t.user(&a), None);
        assert_eq!(t.user("nope"), None);
    }

    #[test]
    fn auth_token_options() {
        let ttl = Duration::from_secs(300);
        assert!(matches!(
            Tokens::parse("simple", ttl),
            Ok(Tokens::Simple(_))
        ));
        assert!(matches!(Tokens::parse("", ttl), Ok(Tokens::None)));
        assert!(Tokens::parse("bogus", ttl).is_err());
        assert!(Tokens::parse("jwt,sign-method", ttl).is_err());
        assert!(Tokens::parse("jwt,ttl=1m,ttl=2m", ttl).is_err());
        let e = Tokens::parse("jwt,sign-method=RS256,priv-key=/nonexistent", ttl).unwrap_err();
        assert!(e.to_string().contains("/nonexistent"), "{e}");
    }
}
