//! kvd's container image, run for real with podman: the image built by `tests/tools/image.sh`
//! (from this test's kvd binary), three members on a podman network addressed by their
//! container names, a named volume each, etcdctl from the host through published ports. A
//! leader stopped with `podman stop` (SIGTERM) exits cleanly and catches up when started again
//! on its volume; a member SIGKILLed under a write load loses no acknowledged write; SIGINT
//! stops one cleanly too; the image runs as a non-root user and has no shell. Every container, network, volume and the image
//! are removed when the test ends, failed or not.
//!
//! podman is installed with apt-get when it is missing (`apt-get install -y podman runc`).

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{ctl, ctl_ok, free_port, wait_for};

/// podman as this machine runs it (runc, cgroupfs, limits within the machine's).
fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .arg("--cgroup-manager=cgroupfs")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run podman")
}

fn podman_ok(args: &[&str]) -> String {
    let out = podman(args);
    assert!(
        out.status.success(),
        "podman {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

const RUN: &[&str] = &[
    "--runtime",
    "runc",
    "--ulimit",
    "nofile=20000:20000",
    "--ulimit",
    "nproc=4096:4096",
];

/// podman, installed if missing.
fn ensure_podman() {
    if Command::new("podman").arg("--version").output().is_ok() {
        return;
    }
    let out = Command::new("apt-get")
        .args(["install", "-y", "podman", "runc"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output()
        .expect("podman is missing and apt-get cannot run");
    assert!(
        out.status.success(),
        "installing podman: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What the test made, removed on drop.
struct Made {
    tag: String,
    network: String,
    containers: Vec<String>,
    volumes: Vec<String>,
}

impl Drop for Made {
    fn drop(&mut self) {
        for c in &self.containers {
            let _ = podman(&["rm", "-f", "-t", "0", c]);
        }
        for v in &self.volumes {
            let _ = podman(&["volume", "rm", "-f", v]);
        }
        let _ = podman(&["network", "rm", "-f", &self.network]);
        let _ = podman(&["rmi", "-f", &self.tag]);
    }
}

struct Member {
    name: String,
    /// host:port of its published client port.
    endpoint: String,
}

#[test]
fn a_three_member_cluster_of_containers() {
    ensure_podman();
    let id = format!("kvdtest{}", std::process::id());
    let mut made = Made {
        tag: format!("localhost/{id}:test"),
        network: format!("{id}-net"),
        containers: Vec::new(),
        volumes: Vec::new(),
    };
    // The image, as a user builds it (from this test's binary rather than a release build).
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/tools/image.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(&made.tag)
        .env("KVD_BIN", common::kvd_bin())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "image.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Non-root, no shell.
    assert_eq!(
        podman_ok(&[
            "image",
            "inspect",
            &made.tag,
            "--format",
            "{{.Config.User}}"
        ]),
        "65532:65532"
    );
    let mut sh = vec!["run", "--rm"];
    sh.extend_from_slice(RUN);
    sh.extend(["--entrypoint", "sh", &made.tag, "-c", "true"]);
    let out = podman(&sh);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("executable file not found"),
        "{err}"
    );
    let mut version = vec!["run", "--rm"];
    version.extend_from_slice(RUN);
    version.extend([made.tag.as_str(), "--version"]);
    assert!(podman_ok(&version).starts_with("kvd Version"));

    podman_ok(&["network", "create", &made.network]);
    let names: Vec<String> = (1..=3).map(|i| format!("{id}-m{i}")).collect();
    let initial = names
        .iter()
        .map(|n| format!("{n}=http://{n}:2380"))
        .collect::<Vec<_>>()
        .join(",");
    let members: Vec<Member> = names
        .iter()
        .map(|n| Member {
            name: n.clone(),
            endpoint: format!("127.0.0.1:{}", free_port()),
        })
        .collect();
    for m in &members {
        let volume = format!("{}-data", m.name);
        podman_ok(&["volume", "create", &volume]);
        made.volumes.push(volume.clone());
        let publish = format!("{}:2379", m.endpoint);
        let env = [
            format!("ETCD_NAME={}", m.name),
            format!("ETCD_INITIAL_ADVERTISE_PEER_URLS=http://{}:2380", m.name),
            format!("ETCD_ADVERTISE_CLIENT_URLS=http://{}:2379", m.name),
            format!("ETCD_INITIAL_CLUSTER={initial}"),
            "ETCD_INITIAL_CLUSTER_TOKEN=container-test".to_string(),
            "ETCD_LOG_FORMAT=text".to_string(),
        ];
        let mut args = vec!["run", "-d", "--name", &m.name, "--network", &made.network];
        args.extend_from_slice(RUN);
        let mount = format!("{volume}:/var/lib/kvd");
        args.extend(["-v", &mount, "-p", &publish]);
        for e in &env {
            args.extend(["-e", e]);
        }
        args.push(&made.tag);
        podman_ok(&args);
        made.containers.push(m.name.clone());
    }
    let all: String = members
        .iter()
        .map(|m| m.endpoint.clone())
        .collect::<Vec<_>>()
        .join(",");
    wait_for("the cluster to take a write", 60, || {
        ctl(&all, &["put", "hello", "world"]).status.success()
    });
    for m in &members {
        assert_eq!(
            ctl_ok(&m.endpoint, &["get", "hello", "--print-value-only"]),
            "world\n"
        );
    }
    // Three members, one leader.
    let leader_of = || -> Option<usize> {
        let mut leaders = Vec::new();
        for (i, m) in members.iter().enumerate() {
            let out = ctl(&m.endpoint, &["endpoint", "status", "-w", "json"]);
            let s = String::from_utf8_lossy(&out.stdout).to_string();
            let (l, me) = (
                common::json_number(&s, "leader"),
                common::json_number(&s, "member_id"),
            );
            if l.is_some() && l == me {
                leaders.push(i);
            }
        }
        (leaders.len() == 1).then(|| leaders[0])
    };
    let mut leader = None;
    wait_for("one leader", 30, || {
        leader = leader_of();
        leader.is_some()
    });
    let leader = leader.unwrap();
    let list = ctl_ok(&members[0].endpoint, &["member", "list"]);
    assert_eq!(list.lines().count(), 3, "{list}");
    // The leader stopped as a runtime stops it (SIGTERM): a clean exit, within the grace
    // period; the others elect a leader and take writes.
    let stopped = Instant::now();
    podman_ok(&["stop", "-t", "20", &members[leader].name]);
    assert!(stopped.elapsed() < Duration::from_secs(20));
    assert_eq!(
        podman_ok(&[
            "inspect",
            &members[leader].name,
            "--format",
            "{{.State.ExitCode}}"
        ]),
        "0"
    );
    let others: String = members
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != leader)
        .map(|(_, m)| m.endpoint.clone())
        .collect::<Vec<_>>()
        .join(",");
    wait_for("the others to take writes", 30, || {
        ctl(&others, &["put", "after-stop", "1"]).status.success()
    });
    for i in 0..50 {
        ctl_ok(&others, &["put", &format!("while-down-{i}"), "v"]);
    }
    // Started again on its volume: it catches up with every write.
    podman_ok(&["start", &members[leader].name]);
    let hashes = || -> Vec<u64> {
        members
            .iter()
            .filter_map(|m| {
                let out = ctl(&m.endpoint, &["endpoint", "hashkv", "-w", "json"]);
                common::json_number(&String::from_utf8_lossy(&out.stdout), "hash")
            })
            .collect()
    };
    wait_for(
        "the restarted member to catch up (HashKV equal)",
        60,
        || {
            let h = hashes();
            h.len() == 3 && h.iter().all(|x| *x == h[0])
        },
    );
    assert_eq!(
        ctl_ok(
            &members[leader].endpoint,
            &[
                "get",
                "while-down-49",
                "--print-value-only",
                "--consistency=s"
            ]
        ),
        "v\n"
    );
    // A member SIGKILLed under a write load: nothing acknowledged is lost.
    let victim = (leader + 1) % 3;
    let writer_endpoints = all.clone();
    let count = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (counted, stopped) = (count.clone(), stop.clone());
    let writer = std::thread::spawn(move || {
        let mut acked = Vec::new();
        let mut i = 0;
        while !stopped.load(Ordering::SeqCst) {
            let key = format!("load-{i}");
            if ctl(&writer_endpoints, &["put", &key, "v"]).status.success() {
                acked.push(key);
                counted.fetch_add(1, Ordering::SeqCst);
            }
            i += 1;
        }
        acked
    });
    let acked_now = || count.load(Ordering::SeqCst);
    wait_for("writes acknowledged before the kill", 30, || {
        acked_now() >= 5
    });
    podman_ok(&["kill", &members[victim].name]);
    // The member stays down while writes go on without it.
    let at_kill = acked_now();
    wait_for("writes acknowledged with a member down", 30, || {
        acked_now() >= at_kill + 3
    });
    podman_ok(&["start", &members[victim].name]);
    let at_start = acked_now();
    wait_for("writes acknowledged while the member restarts", 30, || {
        acked_now() >= at_start + 3
    });
    stop.store(true, Ordering::SeqCst);
    let acked = writer.join().unwrap();
    assert!(acked.len() > 10, "{} writes acknowledged", acked.len());
    wait_for("the killed member to catch up", 60, || {
        let h = hashes();
        h.len() == 3 && h.iter().all(|x| *x == h[0])
    });
    for key in &acked {
        let v = ctl_ok(
            &members[victim].endpoint,
            &["get", key, "--print-value-only", "--consistency=s"],
        );
        assert_eq!(v, "v\n", "{key} acknowledged, then lost");
    }
    // SIGINT (a terminal's ^C, `docker kill -s INT`) stops a member cleanly too.
    podman_ok(&["kill", "--signal", "INT", &members[victim].name]);
    wait_for("the member to stop on SIGINT", 20, || {
        podman_ok(&[
            "inspect",
            &members[victim].name,
            "--format",
            "{{.State.Running}}",
        ]) == "false"
    });
    assert_eq!(
        podman_ok(&[
            "inspect",
            &members[victim].name,
            "--format",
            "{{.State.ExitCode}}"
        ]),
        "0"
    );
}
