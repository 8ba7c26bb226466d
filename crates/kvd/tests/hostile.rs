//! kvd's client port attacked as a hostile client would (tests/clients/go/cmd/h2abuse: one
//! raw HTTP/2 connection per attack, with grpc-go's framer and HPACK encoder), while a
//! well-behaved grpc-go client puts and reads a key every 50 ms beside it. Each attack must
//! leave kvd's resident memory within a stated bound, every call of the second client
//! answered and every write it saw acknowledged readable; the floods must be sent away with
//! GOAWAY(ENHANCE_YOUR_CALM); once the attacks are over the memory must go back to the OS.
//! The malformed gRPC requests of the battery get the answers etcd 3.6.5 gives.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::Proc;
use serde_json::Value;

/// What one attack may add to kvd's resident memory at its peak: the per-connection bound on
/// each side (16 MiB of unsent answers, 16 MiB of request state), one answer past it, and the
/// allocator's share. Without the bounds the first three attacks took +450 MiB, +2.8 GiB and
/// +325 MiB.
const PEAK_BOUND_MIB: f64 = 64.0;

/// h2abuse, built once.
fn h2abuse() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/clients/go");
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("h2abuse");
        common::run(
            Command::new("go")
                .args(["build", "-o"])
                .arg(&out)
                .arg("./cmd/h2abuse")
                .current_dir(&module)
                .env("GOFLAGS", "-mod=mod"),
            "go build ./cmd/h2abuse",
        );
        out
    })
}

/// Runs attack `name` at `endpoint` (host:port) for `secs`, sampling process `pid`.
fn attack(endpoint: &str, pid: Option<u32>, name: &str, secs: u32) -> Value {
    let mut cmd = Command::new(h2abuse());
    cmd.args(["-endpoint", endpoint, "-attack", name])
        .arg(format!("-duration={secs}s"))
        .arg("-settle=0s");
    if let Some(p) = pid {
        cmd.arg(format!("-pid={p}"));
    }
    let out = cmd.output().expect("run h2abuse");
    assert!(
        out.status.success(),
        "h2abuse {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "h2abuse {name} printed {:?}: {e}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb / 1024.0
}

#[test]
fn every_attack_is_held_within_its_bounds_while_another_client_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let (m, kvd) = Proc::single_kvd(dir.path());
    let pid = kvd.child.as_ref().unwrap().id();
    let endpoint = m.endpoint();
    let start = rss_mib(pid);
    // (attack, the GOAWAY text it must end with; none where the attacker does not read, or
    // is honest enough to keep its connection)
    let battery = [
        ("streams", Some("too_many_refused_streams")),
        ("range-noread", None),
        ("tiny-window", None),
        ("empty-data", Some("too_many_empty_frames")),
        ("empty-continuation", Some("too_many_empty_frames")),
        ("empty-fields", Some("too_many_empty_header_fields")),
        ("rapid-reset", Some("too_many_resets")),
        ("reset-paired", Some("too_many_resets")),
        ("reset-reconnect", Some("too_many_resets")),
        ("ping", Some("too_many_pings")),
        ("settings", Some("too_many_settings")),
        ("header-list", Some("header block too large")),
    ];
    let mut report = Vec::new();
    for (name, goaway) in battery {
        let r = attack(&endpoint, Some(pid), name, 4);
        let grew = r["rss_peak_mib"].as_f64().unwrap() - r["rss_before_mib"].as_f64().unwrap();
        report.push(format!("{name}: +{grew:.0} MiB, {r}"));
        assert!(grew < PEAK_BOUND_MIB, "{name}: +{grew:.0} MiB\n{r}");
        assert_eq!(r["probe_failed"], 0, "{name}: the other client failed\n{r}");
        assert_eq!(
            r["probe_lost"], 0,
            "{name}: an acknowledged write was lost\n{r}"
        );
        assert!(r["probe_ok"].as_u64().unwrap() > 0, "{name}: no probe\n{r}");
        if let Some(why) = goaway {
            assert_eq!(
                (r["goaway"].as_str(), r["goaway_debug"].as_str()),
                (Some("ENHANCE_YOUR_CALM"), Some(why)),
                "{name}\n{r}"
            );
        }
    }
    eprintln!("{}", report.join("\n"));
    // The memory goes back to the OS within seconds, idle as the member now is.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = rss_mib(pid);
        if now < start + 24.0 {
            eprintln!("{now:.0} MiB resident after the attacks (started at {start:.0})");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{now:.0} MiB resident 30 s after the attacks (started at {start:.0}):\n{}",
            report.join("\n")
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Every connection sent away was counted.
    let metrics = common::http_get(&m.client, "/metrics").1;
    let away = metrics
        .lines()
        .find(|l| {
            l.starts_with(r#"kvd_client_connections_sent_away_total{reason="ENHANCE_YOUR_CALM"}"#)
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(away >= 10, "{away} counted:\n{metrics}");
    assert!(
        kvd.log_tail().contains("sent a client connection away"),
        "{}",
        kvd.log_tail()
    );
}

/// An answer's fields as a client reads them: grpc-message percent-decoded, the sizes of
/// DATA frames and a content-length (which differ by design) left out.
fn answer(r: &Value) -> Vec<String> {
    r["answer"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .filter(|f| !f.starts_with("DATA ") && !f.starts_with("content-length:"))
        .filter(|f| f != "grpc-message: ")
        .map(|f| match f.strip_prefix("grpc-message: ") {
            Some(m) => format!("grpc-message: {}", percent_decoded(m)),
            None => f,
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

fn percent_decoded(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let hex = (b[i] == b'%' && i + 2 < b.len())
            .then(|| u8::from_str_radix(&s[i + 1..i + 3], 16).ok())
            .flatten();
        match hex {
            Some(c) => {
                out.push(c);
                i += 3;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn malformed_grpc_requests_get_etcds_answers() {
    let dir = tempfile::tempdir().unwrap();
    let (k, _kvd) = Proc::single_kvd(dir.path());
    let (e, _etcd) = Proc::single_etcd(dir.path());
    let requests = [
        "content-type",
        "no-content-type",
        "grpc-web",
        "short-body",
        "long-body",
        "two-messages",
        "empty-body",
        "unknown-method",
        "unknown-service",
        "malformed-path",
    ];
    let run = |endpoint: &str| -> Vec<String> {
        requests
            .iter()
            .map(|r| format!("{r}: {:?}", answer(&attack(endpoint, None, r, 1))))
            .collect()
    };
    let want = run(&e.endpoint());
    let got = run(&k.endpoint());
    common::assert_same_answers(&want, &got);
    assert!(want[0].contains(":status: 415"), "{want:?}");
}
