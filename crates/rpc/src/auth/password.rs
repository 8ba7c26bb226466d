//! Passwords: bcrypt hashes (`--bcrypt-cost`, Go's `$2a$` format, as etcd stores them) made
//! and checked on blocking threads, never more at once than the machine has cores — a flood
//! of Authenticate calls slows other Authenticate calls, not the rest of the server — and,
//! beyond etcd, a growing delay for a user whose password was given wrong several times in a
//! row (no lockout, which would let anyone lock a user out).

use std::collections::HashMap;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use parking_lot::Mutex;
use tokio::sync::Semaphore;
use tonic::Status;

/// etcd's default cost (Go's bcrypt.DefaultCost), and bcrypt's bounds.
pub const DEFAULT_COST: u32 = 10;
const MIN_COST: u32 = 4;
const MAX_COST: u32 = 31;
/// Failures in a row after which a user's attempts wait, and the longest wait.
const FREE_FAILURES: u32 = 3;
const FIRST_DELAY: Duration = Duration::from_millis(250);
const MAX_DELAY: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct Passwords {
    cost: u32,
    slots: Semaphore,
    failures: Mutex<HashMap<String, u32>>,
}

impl Passwords {
    /// A cost outside bcrypt's bounds falls back to the default, as etcd's does.
    pub fn new(cost: u32) -> Passwords {
        let cost = if (MIN_COST..=MAX_COST).contains(&cost) {
            cost
        } else {
            tracing::warn!(
                given = cost,
                default = DEFAULT_COST,
                "--bcrypt-cost out of bcrypt's range 4..=31: using the default"
            );
            DEFAULT_COST
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Passwords {
            cost,
            slots: Semaphore::new(cores),
            failures: Mutex::new(HashMap::new()),
        }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Status> {
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| Status::unavailable("etcdserver: server stopped"))?;
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| Status::internal(format!("password hashing: {e}")))
    }

    /// The hash of `password` as a request carries it (base64 of the bcrypt string).
    pub async fn hash(&self, password: String) -> Result<String, Status> {
        let cost = self.cost;
        let h = self
            .blocking(move || bcrypt::hash_with_result(password, cost))
            .await?
            .map_err(|e| Status::internal(format!("bcrypt: {e}")))?;
        Ok(B64.encode(h.format_for_version(bcrypt::Version::TwoA)))
    }

    /// Whether `password` is `user`'s, whose stored hash is `hash`. After a few failures in
    /// a row, each attempt for that user waits longer before it is checked.
    pub async fn check(&self, user: &str, hash: Vec<u8>, password: String) -> Result<bool, Status> {
        let failed = self.failures.lock().get(user).copied().unwrap_or(0);
        if failed >= FREE_FAILURES {
            let d = FIRST_DELAY.saturating_mul(1 << (failed - FREE_FAILURES).min(16));
            tokio::time::sleep(d.min(MAX_DELAY)).await;
        }
        let ok = self
            .blocking(move || {
                std::str::from_utf8(&hash)
                    .ok()
                    .is_some_and(|h| bcrypt::verify(password, h).unwrap_or(false))
            })
            .await?;
        let mut f = self.failures.lock();
        if ok {
            f.remove(user);
        } else {
            *f.entry(user.to_string()).or_insert(0) += 1;
        }
        Ok(ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn hashes_check_and_failures_slow_down() {
        let p = Passwords::new(MIN_COST);
        let h = p.hash("secret".into()).await.unwrap();
        let stored = B64.decode(&h).unwrap();
        assert!(
            stored.starts_with(b"$2a$04$"),
            "{}",
            String::from_utf8_lossy(&stored)
        );
        assert!(p.check("u", stored.clone(), "secret".into()).await.unwrap());
        for _ in 0..FREE_FAILURES {
            assert!(!p.check("u", stored.clone(), "nope".into()).await.unwrap());
        }
        let t = std::time::Instant::now();
        assert!(p.check("u", stored.clone(), "secret".into()).await.unwrap());
        assert!(
            t.elapsed() >= FIRST_DELAY,
            "no delay after {FREE_FAILURES} failures"
        );
        // A success resets the count.
        let t = std::time::Instant::now();
        assert!(p.check("u", stored, "secret".into()).await.unwrap());
        assert!(t.elapsed() < FIRST_DELAY);
        assert_eq!(Passwords::new(99).cost, DEFAULT_COST);
    }
}
