//! etcdctl v3.6.5 against a kvd process, and the same commands against etcd v3.6.5: what
//! etcdctl prints (stdout, stderr, exit status) must be the same, but for ids, ports and
//! clocks.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{ctl, ctl_input, ctl_ok, normalize, Addrs, LiveCtl, Proc};

/// One step of the script: etcdctl arguments and stdin. `{lease}` is replaced by the id of the
/// lease granted earlier on that server.
const SCRIPT: &[(&str, &str)] = &[
    ("put foo bar", ""),
    ("put foo baz --prev-kv", ""),
    ("get foo", ""),
    ("get foo -w json", ""),
    ("put foo1 one", ""),
    ("put foo2 two", ""),
    ("put zed last", ""),
    ("get foo --prefix", ""),
    ("get foo --prefix --limit 2 -w json", ""),
    (
        "get foo --prefix --keys-only --sort-by=MODIFY --order=DESCEND",
        "",
    ),
    ("get foo --prefix --count-only -w json", ""),
    ("get foo --rev 2", ""),
    ("get foo1 --from-key --print-value-only", ""),
    ("get foo --consistency=s", ""),
    ("get foo --rev 100", ""),
    ("get foo zzz", ""),
    ("put foo1 --ignore-value", ""),
    ("get foo1", ""),
    ("put nosuchkey --ignore-value", ""),
    ("del foo2 --prev-kv", ""),
    ("del nothing", ""),
    ("del foo --prefix", ""),
    (
        "txn",
        "value(\"zed\") = \"last\"\n\nput zed new\nget zed\n\nput zed other\n\n",
    ),
    ("txn -w json", "mod(\"zed\") > \"0\"\n\nget zed\n\n\n"),
    ("txn", "version(\"nope\") = \"0\"\n\ndel zed\n\n\n"),
    ("get zed", ""),
    ("compaction 3", ""),
    ("get foo --rev 2", ""),
    ("compaction 2", ""),
    // Before any lease: the stored values then hold lease ids, which differ by server.
    ("endpoint hashkv -w table", ""),
    ("lease grant 100", ""),
    ("put leased v --lease {lease}", ""),
    ("lease timetolive {lease}", ""),
    ("lease timetolive {lease} --keys", ""),
    ("lease list", ""),
    ("lease keep-alive --once {lease}", ""),
    ("lease revoke {lease}", ""),
    ("get leased", ""),
    ("lease timetolive {lease}", ""),
    ("lease revoke {lease}", ""),
    ("put bad --lease 1234", ""),
    ("alarm list", ""),
];

struct Run {
    lease: String,
    outputs: Vec<String>,
}

fn run_script(endpoint: &str) -> Run {
    let mut run = Run {
        lease: String::new(),
        outputs: Vec::new(),
    };
    for (template, input) in SCRIPT {
        let cmd = template.replace("{lease}", &run.lease);
        let args: Vec<&str> = cmd.split_whitespace().collect();
        let out = ctl_input(endpoint, &args, input);
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        if cmd == "lease grant 100" {
            run.lease = stdout
                .split_whitespace()
                .nth(1)
                .unwrap_or_default()
                .to_string();
        }
        run.outputs.push(format!(
            "$ etcdctl {template}\n[exit {}]\n{}{}",
            out.status.code().unwrap_or(-1),
            normalize(&stdout, endpoint),
            normalize(&String::from_utf8_lossy(&out.stderr), endpoint)
        ));
    }
    run
}

/// `etcdctl watch` from revision 1, which the script has compacted away: what it prints.
fn watch_history(endpoint: &str) -> String {
    let w = LiveCtl::start(
        endpoint,
        &["watch", "--rev", "1", "--prefix", "", "--prev-kv"],
    );
    // Below the compaction the server cancels the watch and etcdctl ends by itself.
    w.finish()
}

#[test]
fn etcdctl_prints_against_kvd_what_it_prints_against_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let (k, mut kvd) = Proc::single_kvd(dir.path());
    let (e, etcd) = Proc::single_etcd(dir.path());

    let want = run_script(&e.endpoint());
    let got = run_script(&k.endpoint());
    let mut diffs = Vec::new();
    for (w, g) in want.outputs.iter().zip(&got.outputs) {
        if w != g {
            diffs.push(format!("--- etcd:\n{w}\n--- kvd:\n{g}\n"));
        }
    }
    assert!(
        diffs.is_empty(),
        "{} of {} commands differ:\n{}",
        diffs.len(),
        SCRIPT.len(),
        diffs.join("\n")
    );

    // Watching from revision 1, below the compaction, is answered the same way by both.
    let (w, g) = (watch_history(&e.endpoint()), watch_history(&k.endpoint()));
    assert_eq!(normalize(&g, &k.endpoint()), normalize(&w, &e.endpoint()));
    assert!(w.contains("compacted"), "{w}");

    // Health and status answer.
    assert!(ctl_ok(&k.endpoint(), &["endpoint", "health"]).contains("is healthy"));
    let status = ctl_ok(&k.endpoint(), &["endpoint", "status", "-w", "json"]);
    assert!(status.contains("\"leader\""), "{status}");
    // (The quota Status reports changed in 3.7: compared with etcd 3.7.1 in corners.rs.)
    let members = ctl_ok(&k.endpoint(), &["member", "list"]);
    assert!(
        members.contains(&format!(
            "started, default, {}, {}, false",
            k.peer, k.client
        )),
        "{members}"
    );
    drop(etcd);

    // A clean stop on SIGTERM.
    assert!(kvd.terminate().success(), "{}", kvd.log_tail());
}

#[test]
fn the_same_flags_give_the_same_member_and_cluster_ids_as_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let m = Addrs::new("default");
    let ids = |p: &mut Proc| {
        p.wait_ready();
        let ep = m.endpoint();
        let id = |field| common::status_number(&ep, field);
        (id("cluster_id"), id("member_id"))
    };
    // One after the other, on the same URLs (ids derive from the peer URLs and the token).
    let mut etcd = Proc::etcd(&m, &dir.path().join("etcd"), std::slice::from_ref(&m), &[]);
    let want = ids(&mut etcd);
    drop(etcd);
    let mut kvd = Proc::kvd(
        &m,
        &dir.path().join("kvd"),
        std::slice::from_ref(&m),
        "new",
        &[],
    );
    assert_eq!(
        ids(&mut kvd),
        want,
        "(cluster id, member id): kvd's, etcd's"
    );
}

#[test]
fn watch_sees_new_events_with_prev_kv_from_a_revision() {
    let dir = tempfile::tempdir().unwrap();
    let (k, _kvd) = Proc::single_kvd(dir.path());
    let ep = k.endpoint();
    ctl_ok(&ep, &["put", "w", "1"]);
    // From revision 2 the watch replays what came before it started: no need to wait for it
    // to start before writing, only for what it prints.
    let w = LiveCtl::start(&ep, &["watch", "w", "--rev", "2", "--prev-kv"]);
    ctl_ok(&ep, &["put", "w", "2"]);
    ctl_ok(&ep, &["del", "w"]);
    let want = "PUT\nw\n1\nPUT\nw\n1\nw\n2\nDELETE\nw\n2\nw\n\n";
    test_support::wait_for_or(
        "the watch to print three events",
        20,
        || w.printed() == want,
        || w.printed(),
    );
    w.stop();
    let bad = ctl(&ep, &["put", "", "x"]);
    assert!(!bad.status.success());
}

#[test]
fn snapshot_save_and_kvd_snapshot_restore_rebuild_the_keys_and_their_history() {
    let dir = tempfile::tempdir().unwrap();
    let (k, _kvd) = Proc::single_kvd(dir.path());
    let ep = k.endpoint();
    for i in 0..200 {
        ctl_ok(&ep, &["put", &format!("s{:03}", i % 50), &format!("v{i}")]);
    }
    ctl_ok(&ep, &["del", "s000"]);
    let file = dir.path().join("snap.db");
    let saved = ctl_ok(&ep, &["snapshot", "save", file.to_str().unwrap()]);
    assert!(saved.contains("Snapshot saved at"), "{saved}");
    let want = ctl_ok(&ep, &["get", "s", "--prefix", "-w", "json"]);

    // A damaged file is refused and leaves nothing behind.
    let mut bad = std::fs::read(&file).unwrap();
    let n = bad.len();
    bad[n / 2] ^= 0x40;
    let bad_file = dir.path().join("bad.db");
    std::fs::write(&bad_file, &bad).unwrap();
    let r = Addrs::new("restored");
    let restore = |file: &std::path::Path, data: &std::path::Path| {
        Command::new(common::kvd_bin())
            .args(["snapshot", "restore"])
            .arg(file)
            .arg("--data-dir")
            .arg(data)
            .args(["--name", &r.name])
            .args(["--initial-cluster", &format!("{}={}", r.name, r.peer)])
            .args(["--initial-advertise-peer-urls", &r.peer])
            .output()
            .unwrap()
    };
    let out = restore(&bad_file, &dir.path().join("bad"));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("SHA-256 does not match"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!dir.path().join("bad").exists());

    let data = dir.path().join("restored");
    let out = restore(&file, &data);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut p = Proc::kvd(&r, &data, std::slice::from_ref(&r), "new", &[]);
    p.wait_ready();
    let got = ctl_ok(&r.endpoint(), &["get", "s", "--prefix", "-w", "json"]);
    // Same keys, values, versions and revisions; only the header's ids differ.
    let body = |s: &str| s[s.find("\"kvs\"").unwrap()..].to_string();
    assert_eq!(body(&got), body(&want));
    // Put i went in at revision i + 2: the history survives the restore.
    let at = |rev: &str| ctl_ok(&r.endpoint(), &["get", "s001", "--rev", rev]);
    assert_eq!(at("52"), "s001\nv1\n");
    assert_eq!(at("53"), "s001\nv51\n");
}

/// The keys under `prefix`: a lock's waiters and an election's candidates each hold one.
fn keys_under(endpoint: &str, prefix: &str) -> usize {
    common::ctl_ok(endpoint, &["get", "--prefix", "--keys-only", prefix])
        .lines()
        .filter(|l| l.starts_with(prefix))
        .count()
}

/// Two `etcdctl lock`s and two `etcdctl elect` candidates with an observer, taking turns; each
/// step waits for the one before to show (a lock's or a candidate's key, a line printed: a
/// holder or leader prints its key once its call returned, and is stopped only then).
fn lock_and_elect(endpoint: &str) -> String {
    let mut t = String::new();

    let holder = LiveCtl::start(endpoint, &["lock", "lk"]);
    holder.wait_printed("lk/");
    let mut second = LiveCtl::start(endpoint, &["lock", "lk", "echo", "second holds it"]);
    common::wait_for("the second lock's key", 20, || {
        keys_under(endpoint, "lk/") == 2
    });
    let waiting = second.running();
    t += &format!("$ etcdctl lock lk\n{}\n", holder.stop());
    t += &format!("second waited: {waiting}\n");
    t += &format!("$ etcdctl lock lk echo ..\n{}\n", second.finish());

    let first = LiveCtl::start(endpoint, &["elect", "el", "p1"]);
    first.wait_printed("p1");
    let observer = LiveCtl::start(endpoint, &["elect", "-l", "el"]);
    observer.wait_printed("p1");
    let second = LiveCtl::start(endpoint, &["elect", "el", "p2"]);
    common::wait_for("the second candidate's key", 20, || {
        keys_under(endpoint, "el/") == 2
    });
    t += &format!("$ etcdctl elect el p1\n{}\n", first.stop());
    second.wait_printed("p2");
    observer.wait_printed("p2");
    t += &format!("$ etcdctl elect el p2\n{}\n", second.stop());
    t += &format!("$ etcdctl elect -l el\n{}\n", observer.stop());
    normalize(&t, endpoint)
}

#[test]
fn etcdctl_lock_and_elect_print_against_kvd_what_they_print_against_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let (k, _kvd) = Proc::single_kvd(dir.path());
    let (e, _etcd) = Proc::single_etcd(dir.path());
    let want = lock_and_elect(&e.endpoint());
    let got = lock_and_elect(&k.endpoint());
    assert_eq!(got, want, "kvd:\n{got}\netcd:\n{want}");
    // Not vacuous: the second lock and the second candidate got their turn, and the observer
    // saw both leaders.
    assert!(want.contains("second waited: true\n"), "{want}");
    assert!(want.contains("second holds it"), "{want}");
    assert!(want.contains("el/<id>\np2"), "{want}");
}

/// The data file's size as `etcdctl endpoint status` reports it.
fn db_size(endpoint: &str) -> u64 {
    common::status_number(endpoint, "dbSize")
}

#[test]
fn etcdctl_defrag_shrinks_the_data_file_while_writes_go_on() {
    use api::etcdserverpb::{CompactionRequest, DeleteRangeRequest, PutRequest};
    let dir = tempfile::tempdir().unwrap();
    let (k, _kvd) = Proc::single_kvd(dir.path());
    let ep = k.endpoint();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // 8 MB of values, all deleted and compacted away: the file keeps its size until defrag.
    rt.block_on(async {
        let mut kv = common::grpc::kv(&k.client);
        for i in 0..4000 {
            let put = PutRequest {
                key: format!("big{i:05}").into(),
                value: vec![b'v'; 2000],
                ..Default::default()
            };
            kv.put(put).await.unwrap();
        }
        let del = DeleteRangeRequest {
            key: b"big".to_vec(),
            range_end: b"bih".to_vec(),
            ..Default::default()
        };
        let rev = kv
            .delete_range(del)
            .await
            .unwrap()
            .into_inner()
            .header
            .unwrap()
            .revision;
        let compact = CompactionRequest {
            revision: rev,
            physical: true,
        };
        kv.compact(compact).await.unwrap();
    });
    let before = db_size(&ep);
    // The compacted space is free inside the file: in use is a fraction of it, as etcd reports.
    let in_use = common::status_number(&ep, "dbSizeInUse");
    assert!(in_use * 3 < before, "{in_use} in use of {before} bytes");

    // A writer keeps going through the defragmentation; none of its writes fails.
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let count = std::sync::Arc::new(AtomicUsize::new(0));
    let writer = {
        let (stop, count, url) = (stop.clone(), count.clone(), k.client.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async {
                let mut kv = common::grpc::kv(&url);
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let put = PutRequest {
                        key: format!("during{n:06}").into(),
                        value: b"x".to_vec(),
                        ..Default::default()
                    };
                    kv.put(put).await.expect("a write during defrag");
                    n += 1;
                    count.store(n, Ordering::SeqCst);
                }
                n
            })
        })
    };
    let written_now = || count.load(Ordering::SeqCst);
    common::wait_for("the writer's first writes", 30, || written_now() >= 10);
    let out = ctl_ok(&ep, &["defrag"]);
    assert!(
        out.starts_with(&format!("Finished defragmenting etcd member[{ep}]")),
        "{out}"
    );
    let after_defrag = written_now();
    common::wait_for("writes after the defragmentation", 30, || {
        written_now() >= after_defrag + 10
    });
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    let after = db_size(&ep);
    assert!(after * 3 < before, "defrag left {after} of {before} bytes");
    assert!(common::status_number(&ep, "dbSizeInUse") <= after);
    let count = ctl_ok(
        &ep,
        &["get", "during", "--prefix", "--count-only", "-w", "fields"],
    );
    assert!(
        count.contains(&format!("\"Count\" : {written}\n")),
        "{written} writes: {count}"
    );
}

/// What differs between two three-member clusters by design, beyond [`normalize`]'s ids: the
/// ports, and the order of members (etcd lists them by id, and ids differ).
fn normalize_cluster(s: &str, endpoints: &str) -> String {
    // etcdctl prints ids with `%16x`: a shorter one is padded with spaces.
    let mut out = normalize(s, endpoints);
    while out.contains("  <id>") {
        out = out.replace("  <id>", " <id>");
    }
    // Ports: every "127.0.0.1:<digits>".
    let mut fixed = String::new();
    let mut rest = out.as_str();
    while let Some(i) = rest.find("127.0.0.1:") {
        let (head, tail) = rest.split_at(i + "127.0.0.1:".len());
        fixed.push_str(head);
        fixed.push_str("<port>");
        rest = tail.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    fixed.push_str(rest);
    out = fixed;
    // Member order: the lines of a member list, and the entries of ETCD_INITIAL_CLUSTER.
    let mut lines: Vec<String> = out
        .lines()
        .map(|l| match l.strip_prefix("ETCD_INITIAL_CLUSTER=\"") {
            Some(v) => {
                let mut parts: Vec<&str> = v.trim_end_matches('"').split(',').collect();
                parts.sort_unstable();
                format!("ETCD_INITIAL_CLUSTER=\"{}\"", parts.join(","))
            }
            None => l.to_string(),
        })
        .collect();
    if lines.iter().all(|l| l.starts_with("<id>, ")) {
        lines.sort();
    }
    lines.join("\n")
}

/// etcdctl's cluster commands against a three-member cluster: add and remove a member and a
/// learner, promote a learner that never started, remove an unknown member, move leadership.
/// Runs etcdctl against `eps`, adding the command and its normalized answer to `out`; returns
/// its standard output as printed.
fn transcribe(out: &mut Vec<String>, eps: &str, args: &[&str]) -> String {
    let o = ctl(eps, args);
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    out.push(format!(
        "$ etcdctl {}\n[exit {}]\n{}{}",
        normalize_cluster(&args.join(" "), eps),
        o.status.code().unwrap_or(-1),
        normalize_cluster(&stdout, eps),
        normalize_cluster(&String::from_utf8_lossy(&o.stderr), eps)
    ));
    stdout
}

fn cluster_script(ms: &[Addrs]) -> Vec<String> {
    let eps: Vec<String> = ms.iter().map(Addrs::endpoint).collect();
    let eps = eps.join(",");
    let peer = || format!("http://127.0.0.1:{}", common::free_port());
    let mut out = Vec::new();
    let mut run = |args: &[&str]| transcribe(&mut out, &eps, args);
    let id_of = |added: &str| added.split_whitespace().nth(1).unwrap_or("0").to_string();
    let added = run(&["member", "add", "d", "--peer-urls", &peer()]);
    run(&["member", "list"]);
    run(&["member", "remove", &id_of(&added)]);
    let learner = run(&["member", "add", "e", "--learner", "--peer-urls", &peer()]);
    run(&["member", "list"]);
    run(&["member", "promote", &id_of(&learner)]);
    run(&["member", "remove", &id_of(&learner)]);
    run(&["member", "remove", "1234"]);
    run(&["member", "list"]);
    out
}

#[test]
fn etcdctl_member_commands_print_against_kvd_what_they_print_against_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let names = ["a", "b", "c"];
    let es: Vec<Addrs> = names.iter().map(|n| Addrs::new(n)).collect();
    let ks: Vec<Addrs> = names.iter().map(|n| Addrs::new(n)).collect();
    let mut etcds: Vec<Proc> = es
        .iter()
        .map(|m| Proc::etcd(m, &dir.path().join("etcd").join(&m.name), &es, &[]))
        .collect();
    let mut kvds: Vec<Proc> = ks
        .iter()
        .map(|m| Proc::kvd(m, &dir.path().join("kvd").join(&m.name), &ks, "new", &[]))
        .collect();
    for p in etcds.iter_mut().chain(kvds.iter_mut()) {
        p.wait_ready();
    }
    // etcd takes members only once its leader has been connected to every voter for 5 s.
    std::thread::sleep(Duration::from_secs(6));
    let want = cluster_script(&es);
    let got = cluster_script(&ks);
    common::assert_same_answers(&want, &got);
    let all = want.join("\n");
    assert!(all.contains("added to cluster"), "{all}");
    assert!(all.contains("removed from cluster"), "{all}");

    // With one follower down, removing the other live follower would leave one live voter of
    // two: refused ("unhealthy cluster"); removing the member that is down is fine.
    let want = with_a_follower_down(&es, &mut etcds);
    let got = with_a_follower_down(&ks, &mut kvds);
    common::assert_same_answers(&want, &got);
    let all = want.join("\n");
    assert!(all.contains("unhealthy cluster"), "{all}");
}

/// Kills a follower of the cluster `ms` (run by `procs`), then tries removing the other
/// follower and the one that is down; etcdctl's answers (the two members left are checked).
fn with_a_follower_down(ms: &[Addrs], procs: &mut [Proc]) -> Vec<String> {
    let ids: Vec<u64> = ms
        .iter()
        .map(|m| common::status_number(&m.endpoint(), "member_id"))
        .collect();
    let leader = common::status_number(&ms[0].endpoint(), "leader");
    let followers: Vec<usize> = (0..ms.len()).filter(|&i| ids[i] != leader).collect();
    let (down, live) = (followers[0], followers[1]);
    procs[down].kill();
    // Until the leader sees the member gone: its stream there is down (etcd's gauge of active
    // peer connections, which both serve).
    let l = ids.iter().position(|&id| id == leader).unwrap();
    let gone = format!(
        "etcd_network_active_peers{{Local=\"{leader:x}\",Remote=\"{:x}\"}} 0",
        ids[down]
    );
    common::wait_for("the leader to see the member down", 30, || {
        common::http_get(&ms[l].client, "/metrics")
            .1
            .lines()
            .any(|line| line == gone)
    });
    // Either live member answers (a follower forwards removals to its leader).
    let ep = format!("{},{}", ms[l].endpoint(), ms[live].endpoint());
    let mut out = Vec::new();
    let (live, down) = (format!("{:x}", ids[live]), format!("{:x}", ids[down]));
    transcribe(&mut out, &ep, &["member", "remove", &live]);
    transcribe(&mut out, &ep, &["member", "remove", &down]);
    // Which members are left depends on the election: their number does not.
    let list = ctl_ok(&ep, &["member", "list"]);
    assert_eq!(list.lines().count(), 2, "{list}");
    assert!(!list.contains(&down), "{list}");
    out
}
