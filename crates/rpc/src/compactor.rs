//! Auto-compaction (`--auto-compaction-mode`, `--auto-compaction-retention`), run by the
//! leader and proposed through consensus like a client's Compact.

use std::collections::VecDeque;
use std::sync::Weak;
use std::time::Duration;

use api::etcdserverpb::CompactionRequest;
use tokio::time::Instant;

use crate::request::Op;
use crate::server::Core;

/// etcd's revision-mode interval between compactions.
const REVISION_INTERVAL: Duration = Duration::from_secs(300);

/// What history auto-compaction keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoCompaction {
    Off,
    /// Keep this much time of history.
    Periodic(Duration),
    /// Keep this many revisions.
    Revision(i64),
}

/// A value that is not a Go-style duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a duration (e.g. 10m, 1h, 500ms)")]
pub struct BadDuration(pub String);

/// Why `--auto-compaction-mode` and `--auto-compaction-retention` were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadAutoCompaction {
    #[error("--auto-compaction-retention: {0}")]
    Period(#[source] BadDuration),
    #[error("--auto-compaction-retention {0:?}: not a revision count")]
    Revisions(String),
    #[error("--auto-compaction-mode {0:?}: want periodic or revision")]
    Mode(String),
}

impl AutoCompaction {
    /// Parses etcd's flags: periodic retention is a duration (`1h`, `30m`) or a number of hours;
    /// revision retention a number of revisions; `0` turns it off.
    pub fn parse(mode: &str, retention: &str) -> Result<AutoCompaction, BadAutoCompaction> {
        let retention = retention.trim();
        if retention.is_empty() || retention == "0" {
            return Ok(AutoCompaction::Off);
        }
        match mode {
            "periodic" => {
                if let Ok(hours) = retention.parse::<u64>() {
                    return Ok(AutoCompaction::Periodic(Duration::from_secs(hours * 3600)));
                }
                parse_duration(retention)
                    .map(AutoCompaction::Periodic)
                    .map_err(BadAutoCompaction::Period)
            }
            "revision" => retention
                .parse::<i64>()
                .ok()
                .filter(|n| *n > 0)
                .map(AutoCompaction::Revision)
                .ok_or_else(|| BadAutoCompaction::Revisions(retention.to_string())),
            other => Err(BadAutoCompaction::Mode(other.to_string())),
        }
    }
}

/// Parses a Go-style duration (`10m`, `1h30m`, `500ms`, `2s`).
pub fn parse_duration(s: &str) -> Result<Duration, BadDuration> {
    let bad = || BadDuration(s.to_string());
    let mut total = Duration::ZERO;
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .ok_or_else(bad)?;
        let (num, tail) = rest.split_at(digits);
        let n: f64 = num.parse().map_err(|_| bad())?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let secs = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += Duration::from_secs_f64(n * secs);
        rest = tail;
    }
    Ok(total)
}

/// Runs auto-compaction until the core is dropped (a no-op when it is off).
pub async fn run(core: Weak<Core>, mode: AutoCompaction) {
    let (interval, keep) = match mode {
        AutoCompaction::Off => return,
        // Sample the revision ten times per retention period; compact to the sample that is a
        // whole period old.
        AutoCompaction::Periodic(d) => ((d / 10).max(Duration::from_secs(1)), d),
        AutoCompaction::Revision(_) => (REVISION_INTERVAL, Duration::ZERO),
    };
    let mut samples: VecDeque<(Instant, i64)> = VecDeque::new();
    let mut tick = tokio::time::interval(interval);
    loop {
        tick.tick().await;
        let Some(core) = core.upgrade() else {
            return;
        };
        let store = core.backend.store();
        let now = Instant::now();
        samples.push_back((now, store.rev().0));
        if !core.is_leader() {
            continue;
        }
        let target = match mode {
            AutoCompaction::Revision(n) => store.rev().0 - n,
            _ => {
                let mut target = 0;
                while let Some(&(at, rev)) = samples.front() {
                    if now.duration_since(at) < keep {
                        break;
                    }
                    target = rev;
                    samples.pop_front();
                }
                target
            }
        };
        if target <= store.compacted().0 || target <= 0 {
            continue;
        }
        let req = CompactionRequest {
            revision: target,
            physical: false,
        };
        match core.propose_internal(Op::Compaction(req)).await {
            Ok(_) => tracing::info!(revision = target, "auto-compacted"),
            Err(e) => tracing::warn!(revision = target, "auto-compaction failed: {}", e.message()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_as_etcds() {
        use AutoCompaction::*;
        assert_eq!(AutoCompaction::parse("periodic", "0").unwrap(), Off);
        assert_eq!(
            AutoCompaction::parse("periodic", "1").unwrap(),
            Periodic(Duration::from_secs(3600))
        );
        assert_eq!(
            AutoCompaction::parse("periodic", "1h30m").unwrap(),
            Periodic(Duration::from_secs(5400))
        );
        assert_eq!(
            AutoCompaction::parse("revision", "1000").unwrap(),
            Revision(1000)
        );
        assert!(AutoCompaction::parse("revision", "1h").is_err());
        assert!(AutoCompaction::parse("hourly", "1").is_err());
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5x").is_err());
    }
}
