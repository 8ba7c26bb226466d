//! Waiting on an observable condition, the alternative to a fixed sleep.

use std::time::{Duration, Instant};

/// How often a condition is polled.
const POLL: Duration = Duration::from_millis(20);

/// Polls `f` until it holds; after `secs` seconds, fails the test naming `what`.
pub fn wait_for(what: &str, secs: u64, f: impl FnMut() -> bool) {
    wait_for_or(what, secs, f, String::new);
}

/// As [`wait_for`], with `context` (say, a server's log) in the failure.
pub fn wait_for_or(
    what: &str,
    secs: u64,
    mut f: impl FnMut() -> bool,
    context: impl FnOnce() -> String,
) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        if Instant::now() >= deadline {
            panic!("timed out after {secs} s waiting for {what}\n{}", context());
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_that_comes_true_ends_the_wait() {
        let start = Instant::now();
        wait_for("the third poll", 10, {
            let mut n = 0;
            move || {
                n += 1;
                n == 3
            }
        });
        assert!(start.elapsed() < Duration::from_secs(10));
    }

    #[test]
    #[should_panic(expected = "timed out after 0 s waiting for never\nits log")]
    fn a_condition_that_never_holds_fails_with_its_context() {
        wait_for_or("never", 0, || false, || "its log".to_string());
    }
}
