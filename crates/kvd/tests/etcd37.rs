//! etcd 3.7's additions, kvd beside etcd 3.7.1 (built from the Go module proxy): RangeStream
//! through Go's clientv3 v3.7.1 (`tests/clients/go37`) against both servers and through kvd's
//! leasing proxy, the memory a RangeStream's slow readers hold on the server, silent sockets
//! closed on time, and unix-socket client URLs with etcdctl 3.7.1.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use api::etcdserverpb::RangeRequest;
use common::{Addrs, Proc};

const ETCD: &str = "v3.7.1";

/// A one-member etcd 3.7.1 cluster, ready.
fn single_etcd37(dir: &Path) -> (Addrs, Proc) {
    Proc::single_etcd_of(dir, ETCD)
}

/// `go test` of `tests/clients/go37` with `env`, asserting that each of `tests` passed.
fn go_test(env: &[(&str, String)], tests: &[&str]) {
    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/clients/go37");
    let out = Command::new("go")
        .args(["test", "-count=1", "-timeout=10m", "-v", "."])
        .current_dir(&module)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("GOFLAGS", "-mod=mod")
        .output()
        .expect("run go test (is Go installed?)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "go test failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for t in tests {
        assert!(
            stdout.contains(&format!("--- PASS: {t}")),
            "{t} did not pass:\n{stdout}"
        );
    }
}

/// RangeStream answers every option set as etcd 3.7.1 does — the same keys, counts, errors and
/// chunk boundaries — and as kvd's own Range does; the leasing proxy forwards it; a user's
/// permissions are checked as Range checks them.
#[test]
fn range_stream_answers_as_etcd_3_7() {
    let dir = tempfile::tempdir().unwrap();
    let (e, _etcd) = single_etcd37(dir.path());
    let (k, _kvd) = Proc::single_kvd(dir.path());
    let proxy = Proc::grpc_proxy("proxy", dir.path(), &k.endpoint(), &[]);
    go_test(
        &[
            ("ETCD_ENDPOINT", e.endpoint()),
            ("KVD_ENDPOINT", k.endpoint()),
            ("KVD_PROXY_ENDPOINT", proxy.addrs.endpoint()),
        ],
        &[
            "TestRangeStreamAnswersAsEtcd",
            "TestRangeStreamChecksPermissions",
        ],
    );
}

/// Anonymous memory (heap) of process `pid`, in bytes: the range's pages mapped from the data
/// file are not counted, what a server copies for its clients is.
fn rss_anon(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssAnon in /proc/<pid>/status");
    kb * 1024
}

/// Twenty clients start streaming a 256 MiB range and stop reading after the first chunk: the
/// server holds a few chunks for each (bounded by flow control), not the range. etcd 3.7.1's
/// growth under the same load is printed beside kvd's.
#[test]
fn range_stream_slow_readers_hold_bounded_memory() {
    const KEYS: usize = 1024;
    const VALUE: usize = 256 * 1024;
    const READERS: usize = 20;
    let dir = tempfile::tempdir().unwrap();
    let (e, etcd) = single_etcd37(dir.path());
    let (k, kvd) = Proc::single_kvd(dir.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut growth = Vec::new();
    for (name, m, p) in [("etcd 3.7.1", &e, &etcd), ("kvd", &k, &kvd)] {
        let pid = p.child.as_ref().unwrap().id();
        let url = m.client.clone();
        let grew = rt.block_on(async move {
            let mut kv = common::grpc::kv(&url);
            let value = vec![b'v'; VALUE];
            for i in 0..KEYS {
                let put = api::etcdserverpb::PutRequest {
                    key: format!("big/{i:05}").into_bytes(),
                    value: value.clone(),
                    ..Default::default()
                };
                kv.put(put).await.unwrap();
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
            let before = rss_anon(pid);
            let mut held = Vec::new();
            for _ in 0..READERS {
                // A connection each, so no reader's window holds back another's.
                let mut c = common::grpc::kv(&url);
                let req = RangeRequest {
                    key: b"big/".to_vec(),
                    range_end: b"big0".to_vec(),
                    ..Default::default()
                };
                let mut s = c.range_stream(req).await.unwrap().into_inner();
                let first = s.message().await.unwrap().unwrap();
                assert_eq!(first.range_response.unwrap().kvs.len(), 10);
                held.push((c, s));
            }
            let mut peak = before;
            let until = Instant::now() + Duration::from_secs(5);
            while Instant::now() < until {
                peak = peak.max(rss_anon(pid));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            drop(held);
            peak.saturating_sub(before)
        });
        println!(
            "{name}: {READERS} stalled readers of a {} MiB range grew the heap by {} MiB",
            (KEYS * VALUE) >> 20,
            grew >> 20
        );
        growth.push(grew);
    }
    // Holding the range for each reader would take READERS × 256 MiB = 5 GiB; a few 2.5 MiB
    // chunks each is under 400 MiB.
    let kvd_growth = growth[1];
    assert!(
        kvd_growth < 400 << 20,
        "kvd's heap grew by {} MiB under {READERS} stalled readers",
        kvd_growth >> 20
    );
}

/// Connects `n` sockets to `hostport` that send nothing, each watched by a thread: how long
/// after connecting the server closed each (`None`: still open after `limit`).
fn silent_connections(hostport: &str, n: usize, limit: Duration) -> Vec<Option<Duration>> {
    use std::io::Read;
    let watchers: Vec<_> = (0..n)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(hostport).unwrap();
            let opened = Instant::now();
            s.set_read_timeout(Some(limit)).unwrap();
            std::thread::spawn(move || {
                let mut buf = [0u8; 64];
                loop {
                    match s.read(&mut buf) {
                        Ok(0) => return Some(opened.elapsed()),
                        Ok(_) => continue,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
                        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return None,
                        Err(_) => return Some(opened.elapsed()),
                    }
                }
            })
        })
        .collect();
    watchers.into_iter().map(|w| w.join().unwrap()).collect()
}

/// Silent sockets are closed on time while a real client is served: on a TLS client port
/// after 10 s without a finished handshake (as etcd 3.7.1's), in the clear after 120 s
/// without the first request bytes (grpc-go's connection timeout; etcd 3.7.1 keeps those
/// open).
#[test]
fn silent_connections_are_closed_on_time() {
    use common::pki::Ca;
    let dir = tempfile::tempdir().unwrap();
    let mut ca = Ca::new(&dir.path().join("pki"), "cluster");
    let server = ca.issue("server", "server");
    let alice = ca.issue("alice", "alice");
    let etcd = common::etcd_tools(ETCD).join("etcd");
    let (e, _etcd) = Proc::single_tls(
        &etcd,
        &dir.path().join("etcd-tls"),
        &server,
        &ca.cert,
        &alice,
    );
    let (k, _kvd) = Proc::single_tls(
        Path::new(common::kvd_bin()),
        &dir.path().join("kvd-tls"),
        &server,
        &ca.cert,
        &alice,
    );
    let (plain, _plain) = Proc::single_kvd(dir.path());
    let probes: Vec<_> = [
        (e.client_hostport(), Duration::from_secs(30)),
        (k.client_hostport(), Duration::from_secs(30)),
        (plain.client_hostport(), Duration::from_secs(150)),
    ]
    .into_iter()
    .map(|(hostport, limit)| std::thread::spawn(move || silent_connections(&hostport, 50, limit)))
    .collect();
    // Served meanwhile.
    std::thread::sleep(Duration::from_secs(2));
    let ctl = alice.ctl_flags(&ca.cert);
    let mut args: Vec<&str> = ctl.iter().map(String::as_str).collect();
    args.extend(["put", "served", "yes"]);
    common::ctl_ok(&k.endpoint(), &args);
    common::ctl_ok(&plain.endpoint(), &["put", "served", "yes"]);
    let [etcd_tls, kvd_tls, kvd_plain]: [Vec<Option<Duration>>; 3] = probes
        .into_iter()
        .map(|p| p.join().unwrap())
        .collect::<Vec<_>>()
        .try_into()
        .unwrap();
    let within = |closed: &[Option<Duration>], lo: u64, hi: u64| {
        closed.iter().all(|c| {
            c.is_some_and(|d| d >= Duration::from_secs(lo) && d <= Duration::from_secs(hi))
        })
    };
    assert!(within(&etcd_tls, 9, 20), "etcd 3.7.1, TLS: {etcd_tls:?}");
    assert!(within(&kvd_tls, 9, 20), "kvd, TLS: {kvd_tls:?}");
    assert!(
        within(&kvd_plain, 119, 140),
        "kvd, in the clear: {kvd_plain:?}"
    );
}

/// etcdctl 3.7.1 with `--endpoints` and `args`; its exit status and output, the socket
/// paths and ids made alike.
fn ctl37(endpoints: &str, args: &[&str]) -> (bool, String) {
    let (ok, text) = ctl37_raw(endpoints, args);
    (ok, common::normalize(&text, endpoints))
}

/// etcdctl 3.7.1's exit status and output as printed.
fn ctl37_raw(endpoints: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(common::etcd_tools(ETCD).join("etcdctl"))
        .args(["--endpoints", endpoints, "--command-timeout", "5s"])
        .args(args)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// `bin` (etcd or kvd) as the one member `m` of a cluster, its data in `data`, listening for
/// clients on `listen`.
fn one_member(bin: &Path, data: &Path, listen: &str, m: &Addrs) -> Command {
    let mut c = Command::new(bin);
    c.arg("--data-dir")
        .arg(data)
        .args(["--listen-client-urls", listen])
        .args(["--advertise-client-urls", &m.client])
        .args(["--listen-peer-urls", &m.peer_listen])
        .args(["--initial-advertise-peer-urls", &m.peer])
        .args([
            "--initial-cluster",
            &common::initial_cluster(std::slice::from_ref(m)),
        ]);
    c
}

/// A server (`bin`: etcd 3.7.1 or kvd) listening for clients on TCP, `unix://<dir>/u/localhost`
/// and `unixs://<dir>/us/localhost` (the file name is the name clientv3 verifies the server's
/// certificate against).
fn start_on_sockets(bin: &Path, dir: &Path, server: &common::pki::Pair, ca: &Path) -> Proc {
    let m = Addrs::new("default");
    let (u, us) = (dir.join("u/localhost"), dir.join("us/localhost"));
    for p in [&u, &us] {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    }
    let listen = format!(
        "{},unix://{},unixs://{}",
        m.client,
        u.display(),
        us.display()
    );
    let log = dir.join("server.log");
    let logf = std::fs::File::create(&log).unwrap();
    let child = one_member(bin, &dir.join("data"), &listen, &m)
        .arg(format!("--cert-file={}", server.cert.display()))
        .arg(format!("--key-file={}", server.key.display()))
        .arg(format!("--trusted-ca-file={}", ca.display()))
        .stdin(std::process::Stdio::null())
        .stdout(logf.try_clone().unwrap())
        .stderr(logf)
        .spawn()
        .unwrap();
    let mut p = Proc {
        child: Some(child),
        addrs: m,
        log,
        ctl_flags: Vec::new(),
    };
    p.wait_ready();
    p
}

fn is_socket(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket())
}

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
}

/// `unix://` and `unixs://` client URLs (etcd 3.7) with etcdctl 3.7.1, kvd beside etcd 3.7.1:
/// the same answers in the clear and over TLS, the same refusal of plaintext on the TLS
/// socket, the socket files made alike and removed on a clean exit. kvd replaces the socket
/// a killed member left, refuses to remove another file, and its proxy listens on a socket.
#[test]
fn unix_socket_client_urls_serve_etcdctl_as_etcd_3_7() {
    use common::pki::Ca;
    let dir = tempfile::tempdir().unwrap();
    let mut ca = Ca::new(&dir.path().join("pki"), "cluster");
    let server = ca.issue("server", "server");
    let alice = ca.issue("alice", "alice");
    let mut tls_flags = alice.ctl_flags(&ca.cert);
    let etcd = common::etcd_tools(ETCD).join("etcd");
    tls_flags.extend(["get", "k", "--print-value-only"].map(String::from));
    let tls_args: Vec<&str> = tls_flags.iter().map(String::as_str).collect();
    let mut seen = Vec::new();
    for (name, bin) in [
        ("etcd", etcd.as_path()),
        ("kvd", Path::new(common::kvd_bin())),
    ] {
        let d = dir.path().join(name);
        let mut p = start_on_sockets(bin, &d, &server, &ca.cert);
        let (u, us) = (d.join("u/localhost"), d.join("us/localhost"));
        let plain = format!("unix://{}", u.display());
        let tls = format!("unixs://{}", us.display());
        assert!(is_socket(&u) && is_socket(&us), "{name}: no sockets");
        let mut answers = vec![
            ctl37(&plain, &["put", "k", "v"]),
            ctl37(&plain, &["get", "k", "-w", "json"]),
            ctl37(&tls, &tls_args),
            ctl37(&plain, &["get", "k", "--stream", "--print-value-only"]),
        ];
        // In the clear on the TLS socket: refused, on both.
        let refused = ctl37(&format!("unix://{}", us.display()), &["get", "k"]);
        answers.push((refused.0, String::new()));
        answers.push((true, format!("modes {:o} {:o}", mode(&u), mode(&us))));
        // etcd re-raises the signal as it exits; kvd exits 0.
        let exit = p.terminate();
        assert!(name == "etcd" || exit.success(), "{name}: {exit}");
        answers.push((true, format!("left {} {}", u.exists(), us.exists())));
        seen.push(answers);
    }
    assert_eq!(seen[1], seen[0], "kvd, then etcd 3.7.1");
    assert!(
        seen[1][0].0 && seen[1][2].0 && !seen[1][4].0,
        "{:?}",
        seen[1]
    );
    assert_eq!(seen[1][6].1, "left false false");

    // A killed kvd leaves its sockets; a restart replaces them.
    let d = dir.path().join("kvd");
    let mut p = start_on_sockets(Path::new(common::kvd_bin()), &d, &server, &ca.cert);
    p.kill();
    assert!(is_socket(&d.join("u/localhost")));
    let p = start_on_sockets(Path::new(common::kvd_bin()), &d, &server, &ca.cert);
    let plain = format!("unix://{}", d.join("u/localhost").display());
    let (ok, out) = ctl37(&plain, &["get", "k", "--print-value-only"]);
    assert!(ok && out.trim() == "v", "{out}");

    // Its proxy on a socket.
    let sock = dir.path().join("proxy.sock");
    let listen = format!("unix://{}", sock.display());
    let mut proxy = Command::new(common::kvd_bin())
        .args(["grpc-proxy", "start", "--endpoints", &p.addrs.endpoint()])
        .args(["--listen-addr", &listen])
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(dir.path().join("proxy.log")).unwrap())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    common::wait_for("the proxy's socket", 20, || is_socket(&sock));
    let (ok, out) = ctl37(&listen, &["get", "k", "--print-value-only"]);
    let _ = proxy.kill();
    let _ = proxy.wait();
    assert!(ok && out.trim() == "v", "{out}");
    drop(p);

    // A file that is not a socket where one is asked for: refused, the file kept.
    let d = dir.path().join("kvd-file");
    std::fs::create_dir_all(&d).unwrap();
    let file = d.join("not-a-socket");
    std::fs::write(&file, "data").unwrap();
    let m = Addrs::new("default");
    let listen = format!("unix://{}", file.display());
    let out = one_member(Path::new(common::kvd_bin()), &d.join("data"), &listen, &m)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("is not a socket"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "data");
}

/// The metrics etcd's Prometheus mixin (`contrib/mixin`: its alerts and dashboards) reads.
const MIXIN: [&str; 16] = [
    "etcd_disk_backend_commit_duration_seconds",
    "etcd_disk_wal_fsync_duration_seconds",
    "etcd_mvcc_db_total_size_in_bytes",
    "etcd_mvcc_db_total_size_in_use_in_bytes",
    "etcd_network_peer_round_trip_time_seconds",
    "etcd_network_peer_sent_failures_total",
    "etcd_network_client_grpc_received_bytes_total",
    "etcd_network_client_grpc_sent_bytes_total",
    "etcd_server_has_leader",
    "etcd_server_leader_changes_seen_total",
    "etcd_server_proposals_failed_total",
    "etcd_server_quota_backend_bytes",
    "grpc_server_handled_total",
    "grpc_server_handling_seconds",
    "grpc_server_started_total",
    "process_resident_memory_bytes",
];

/// A scrape: each metric (a histogram's series under its own name) with the label names of
/// each of its series, and each sample line's value by its full series text.
struct Scrape {
    names: Vec<(String, Vec<String>)>,
    values: Vec<(String, f64)>,
}

fn scrape(client_url: &str) -> Scrape {
    // HTTP/1.0: the body as it is, not in chunks.
    use std::io::{Read, Write};
    let addr = client_url.trim_start_matches("http://");
    let mut sock = std::net::TcpStream::connect(addr).unwrap();
    write!(sock, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut resp = String::new();
    sock.read_to_string(&mut resp).unwrap();
    let (head, text) = resp.split_once("\r\n\r\n").unwrap();
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200 "),
        "{head}"
    );
    let mut names = Vec::new();
    let mut values = Vec::new();
    for l in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = l.rsplit_once(' ').unwrap();
        let name = series.split('{').next().unwrap();
        let name = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        let mut labels: Vec<String> = series
            .split_once('{')
            .map(|(_, l)| l.trim_end_matches('}'))
            .unwrap_or("")
            .split(',')
            .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.to_string()))
            .filter(|k| k != "le")
            .collect();
        labels.sort();
        names.push((name.to_string(), labels));
        values.push((series.to_string(), value.parse().unwrap_or(f64::NAN)));
    }
    names.sort();
    names.dedup();
    Scrape { names, values }
}

/// After the same calls, every metric of etcd's mixin that etcd 3.7.1 serves is served by kvd
/// with the same label names (with `--metrics=extensive`, both), so is 3.7's request-duration
/// histogram, and the gRPC calls are counted alike: by method, type and status code.
#[test]
fn the_metrics_etcds_mixin_reads_are_served_as_etcd_3_7_serves_them() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = common::etcd_tools(ETCD).join("etcd");
    let mut servers = Vec::new();
    for (name, bin) in [
        ("etcd", etcd.as_path()),
        ("kvd", Path::new(common::kvd_bin())),
    ] {
        let m = Addrs::new("default");
        let one = [m.clone()];
        let mut p = Proc::start(
            bin,
            &m,
            &dir.path().join(name),
            &one,
            "new",
            &["--metrics", "extensive"],
        );
        p.wait_ready();
        let ep = m.endpoint();
        assert!(ctl37(&ep, &["put", "a", "1"]).0);
        assert!(ctl37(&ep, &["get", "a", "--stream"]).0);
        assert!(!ctl37(&ep, &["get", "a", "--stream", "--rev", "99"]).0);
        let (ok, lease) = ctl37_raw(&ep, &["lease", "grant", "60"]);
        assert!(ok, "{lease}");
        let id = lease.split_whitespace().nth(1).unwrap().to_string();
        assert!(ctl37(&ep, &["lease", "keep-alive", "--once", &id]).0);
        // The keep-alive stream is counted once the server sees its client gone (with the
        // code of whichever end closed first: a race on both servers).
        test_support::wait_for_or(
            &format!("{name} to count the keep-alive stream"),
            20,
            || {
                scrape(&m.client).values.iter().any(|(s, v)| {
                    s.starts_with("grpc_server_handled_total{")
                        && s.contains("grpc_method=\"LeaseKeepAlive\"")
                        && *v > 0.0
                })
            },
            || format!("{:?}", keep_alive_series(&m.client)),
        );
        servers.push((p, scrape(&m.client)));
    }
    let (etcd_names, etcd_values) = (&servers[0].1.names, &servers[0].1.values);
    let (kvd_names, kvd_values) = (&servers[1].1.names, &servers[1].1.values);
    let series = |names: &[(String, Vec<String>)], m: &str| -> Vec<Vec<String>> {
        names
            .iter()
            .filter(|(n, _)| n == m)
            .map(|(_, l)| l.clone())
            .collect()
    };
    let mut served = 0;
    for m in MIXIN {
        let want = series(etcd_names, m);
        if want.is_empty() {
            continue;
        }
        served += 1;
        assert_eq!(
            series(kvd_names, m),
            want,
            "{m}: kvd's label names, then etcd's"
        );
    }
    assert!(
        served >= 13,
        "etcd 3.7.1 served {served} of the mixin's metrics"
    );
    // 3.7's new request-duration histogram, by type and success.
    let m = "etcd_server_request_duration_seconds";
    assert_eq!(series(kvd_names, m), series(etcd_names, m), "{m}");
    let timed = |values: &[(String, f64)], t: &str| {
        values.iter().any(|(s, v)| {
            s.starts_with("etcd_server_request_duration_seconds_count")
                && s.contains(&format!("type=\"{t}\""))
                && s.contains("success=\"true\"")
                && *v > 0.0
        })
    };
    for t in ["Put", "LeaseGrant", "Range"] {
        assert!(timed(etcd_values, t) && timed(kvd_values, t), "{m}: {t}");
    }
    // The calls made above, counted alike (health checks and readiness probes aside).
    let calls = |values: &[(String, f64)]| -> Vec<String> {
        let mut v: Vec<String> = values
            .iter()
            .filter(|(s, v)| {
                // A keep-alive stream's code is whichever end closed first: not compared.
                (s.starts_with("grpc_server_started_total")
                    || (s.starts_with("grpc_server_handled_total")
                        && !s.contains("\"LeaseKeepAlive\"")))
                    && *v > 0.0
                    && [
                        "\"Put\"",
                        "\"RangeStream\"",
                        "\"LeaseGrant\"",
                        "\"LeaseKeepAlive\"",
                    ]
                    .iter()
                    .any(|m| s.contains(m))
            })
            .map(|(s, v)| format!("{s} {v}"))
            .collect();
        v.sort();
        v
    };
    let want = calls(etcd_values);
    assert!(want.len() >= 7, "{want:?}");
    assert_eq!(calls(kvd_values), want, "kvd's calls, then etcd's");
}

/// The keep-alive method's gRPC series on a server, for a failure's message.
fn keep_alive_series(client_url: &str) -> Vec<(String, f64)> {
    scrape(client_url)
        .values
        .into_iter()
        .filter(|(s, _)| s.contains("LeaseKeepAlive") && !s.contains("_bucket"))
        .collect()
}

/// What a RangeStream of every key answers on `client_url`: Ok, or the error's code.
fn range_stream_code(client_url: &str) -> tonic::Code {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let req = RangeRequest {
            key: vec![0],
            range_end: vec![0],
            ..Default::default()
        };
        let mut kv = common::grpc::kv(client_url);
        match kv.range_stream(req).await {
            Err(s) => s.code(),
            Ok(r) => {
                let mut s = r.into_inner();
                loop {
                    match s.message().await {
                        Ok(Some(_)) => {}
                        Ok(None) => return tonic::Code::Ok,
                        Err(e) => return e.code(),
                    }
                }
            }
        }
    })
}

/// `/version` on `m`.
fn versions(m: &Addrs) -> String {
    common::http_get(&m.client, "/version").1
}

/// Waits until every member of `ms` reports cluster and storage version `v` (`3.6.0`).
fn wait_versions(ms: &[Addrs], v: &str) {
    let want = format!(r#"{{"etcdserver":"3.7.1","etcdcluster":"{v}","storage":"{v}"}}"#);
    for m in ms {
        common::wait_for(&format!("{} at {v}", m.name), 30, || versions(m) == want);
    }
}

/// A downgrade is the cluster's: `downgrade enable 3.6` on one member of three brings every
/// member's cluster and storage versions to 3.6 and RangeStream to etcd 3.6's answer
/// (Unimplemented), through a restart of every member, until a cancel on another member
/// brings them back to 3.7. etcd 3.7.1 keeps serving RangeStream while downgraded (checked
/// here, so a change of etcd's shows).
#[test]
fn a_downgrade_to_3_6_is_the_clusters_and_survives_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let ms: Vec<Addrs> = (1..=3).map(|i| Addrs::new(&format!("m{i}"))).collect();
    let start = |m: &Addrs, state: &str| Proc::kvd(m, &dir.path().join(&m.name), &ms, state, &[]);
    let mut ps: Vec<Proc> = ms.iter().map(|m| start(m, "new")).collect();
    for p in &mut ps {
        p.wait_ready();
    }
    common::ctl_ok(&ms[0].endpoint(), &["put", "a", "1"]);
    wait_versions(&ms, "3.7.0");
    for m in &ms {
        assert_eq!(range_stream_code(&m.client), tonic::Code::Ok, "{}", m.name);
    }

    let out = common::ctl_ok(&ms[0].endpoint(), &["downgrade", "enable", "3.6"]);
    assert!(out.contains("Downgrade enable success"), "{out}");
    wait_versions(&ms, "3.6.0");
    for m in &ms {
        assert_eq!(
            range_stream_code(&m.client),
            tonic::Code::Unimplemented,
            "{}",
            m.name
        );
    }
    let status = common::ctl_ok(&ms[2].endpoint(), &["endpoint", "status", "-w", "json"]);
    assert!(
        status.contains(r#""storageVersion":"3.6.0""#)
            && status.contains(r#""downgradeInfo":{"enabled":true,"targetVersion":"3.6.0"}"#),
        "{status}"
    );

    // Kept where etcd keeps it: after every member restarts, 3.6 from the first answer on.
    for p in &mut ps {
        p.kill();
    }
    let mut ps: Vec<Proc> = ms.iter().map(|m| start(m, "existing")).collect();
    for p in &mut ps {
        p.wait_ready();
    }
    for m in &ms {
        assert!(
            versions(m).contains(r#""etcdcluster":"3.6.0""#),
            "{}",
            versions(m)
        );
        assert_eq!(
            range_stream_code(&m.client),
            tonic::Code::Unimplemented,
            "{}",
            m.name
        );
    }

    let out = common::ctl_ok(&ms[1].endpoint(), &["downgrade", "cancel"]);
    assert!(out.contains("Downgrade cancel success"), "{out}");
    wait_versions(&ms, "3.7.0");
    for m in &ms {
        assert_eq!(range_stream_code(&m.client), tonic::Code::Ok, "{}", m.name);
    }
    drop(ps);

    let (e, _etcd) = single_etcd37(dir.path());
    common::ctl_ok(&e.endpoint(), &["downgrade", "enable", "3.6"]);
    wait_versions(std::slice::from_ref(&e), "3.6.0");
    assert_eq!(
        range_stream_code(&e.client),
        tonic::Code::Ok,
        "etcd 3.7.1 downgraded"
    );
}
