//! The crash-child runner: the test binary re-run as a child (its first argument says which
//! part to play), its stdout read line by line as it runs (what it acknowledged), its stderr
//! drained as it runs (a child blocked on a full stderr pipe would never get to its crash), and
//! SIGKILLed at a deadline unless it died first.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often a running child is checked for having died.
const POLL: Duration = Duration::from_millis(2);

/// A running child; [`CrashChild::kill_after`] or [`CrashChild::wait`] ends it.
#[derive(Debug)]
pub struct CrashChild<T> {
    child: Child,
    stdout: Option<JoinHandle<T>>,
    stderr: Option<JoinHandle<String>>,
}

/// How a child ended.
#[derive(Debug)]
pub struct Outcome<T> {
    /// What the stdout reader made of its lines.
    pub seen: T,
    pub stderr: String,
    pub status: ExitStatus,
    /// Whether it was SIGKILLed (it had not died by itself before the deadline).
    pub killed: bool,
}

impl<T: Send + 'static> CrashChild<T> {
    /// Starts this test binary with `args` and `env`; every stdout line goes through `on_line`
    /// into a value that starts as `init`.
    pub fn spawn(
        args: &[&str],
        env: &[(&str, &str)],
        init: T,
        mut on_line: impl FnMut(&mut T, &str) + Send + 'static,
    ) -> CrashChild<T> {
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut child = Command::new(exe)
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the crash child");
        let out = child.stdout.take().expect("a piped stdout");
        let stdout = std::thread::spawn(move || {
            let mut seen = init;
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                on_line(&mut seen, &line);
            }
            seen
        });
        let mut err = child.stderr.take().expect("a piped stderr");
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        CrashChild {
            child,
            stdout: Some(stdout),
            stderr: Some(stderr),
        }
    }

    /// SIGKILLs the child `after` from now, unless it dies first.
    pub fn kill_after(mut self, after: Duration) -> Outcome<T> {
        let deadline = Instant::now() + after;
        let (status, killed) = loop {
            if let Some(s) = self.child.try_wait().expect("poll the crash child") {
                break (s, false);
            }
            if Instant::now() >= deadline {
                self.child.kill().expect("SIGKILL the crash child");
                break (self.child.wait().expect("reap the crash child"), true);
            }
            std::thread::sleep(POLL);
        };
        self.finish(status, killed)
    }

    /// Waits for the child to die by itself.
    pub fn wait(mut self) -> Outcome<T> {
        let status = self.child.wait().expect("wait for the crash child");
        self.finish(status, false)
    }

    fn finish(&mut self, status: ExitStatus, killed: bool) -> Outcome<T> {
        let stdout = self.stdout.take().expect("finished once");
        let stderr = self.stderr.take().expect("finished once");
        Outcome {
            seen: stdout.join().expect("the stdout reader"),
            stderr: stderr.join().expect("the stderr reader"),
            status,
            killed,
        }
    }
}

impl<T> Drop for CrashChild<T> {
    fn drop(&mut self) {
        // A test that fails half-way leaves no child behind.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The child's part: when run as a crash child, acknowledges three writes, then either
    /// hangs (to be killed) or panics.
    #[test]
    fn child_entry() {
        let Ok(how) = std::env::var("TEST_SUPPORT_CHILD") else {
            return;
        };
        for i in 1..=3 {
            println!("acked {i}");
        }
        eprintln!("{}", "x".repeat(1 << 20)); // more than a pipe holds
        if how == "hang" {
            std::thread::sleep(Duration::from_secs(600));
        }
        panic!("the child dies");
    }

    fn spawn(how: &str) -> CrashChild<u64> {
        let args = ["--exact", "child::tests::child_entry", "--nocapture"];
        CrashChild::spawn(&args, &[("TEST_SUPPORT_CHILD", how)], 0, |acked, line| {
            if let Some(n) = line.strip_prefix("acked ") {
                *acked = n.parse().expect("a number");
            }
        })
    }

    #[test]
    fn a_hung_child_is_killed_at_its_deadline_with_what_it_said() {
        let o = spawn("hang").kill_after(Duration::from_secs(2));
        assert!(o.killed);
        assert_eq!(o.seen, 3);
        assert!(o.stderr.len() >= 1 << 20, "stderr drained while it ran");
    }

    #[test]
    fn a_child_that_dies_first_is_not_killed() {
        let start = Instant::now();
        let o = spawn("panic").kill_after(Duration::from_secs(60));
        assert!(!o.killed && !o.status.success());
        assert!(start.elapsed() < Duration::from_secs(60));
        assert_eq!(o.seen, 3);
        assert!(o.stderr.contains("the child dies"), "{}", o.stderr);
        let o = spawn("panic").wait();
        assert!(!o.status.success() && o.seen == 3);
    }
}
