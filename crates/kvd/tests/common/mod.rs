//! Real processes for the kvd tests: kvd members (and etcd, to compare with) on free loopback
//! ports in temporary directories, etcdctl built from the Go module proxy by the project's own
//! script, and cleanup (SIGKILL and wait) when a handle is dropped.

#![allow(dead_code)]

pub mod pki;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The directory holding etcdctl and etcd v3.6.5 (built on first use).
pub fn tools() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/tools/etcd-tools.sh");
        let out = Command::new("bash")
            .arg(&script)
            .stderr(Stdio::inherit())
            .output()
            .expect("run tests/tools/etcd-tools.sh");
        assert!(out.status.success(), "building etcdctl failed");
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

/// The directory holding etcd, etcdctl and etcdutl of etcd `version` (e.g. `v3.7.1`), built
/// on first use by the same script.
pub fn etcd_tools(version: &str) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, dir)) = built.iter().find(|(v, _)| v == version) {
        return dir.clone();
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/tools/etcd-tools.sh");
    let out = Command::new("bash")
        .arg(&script)
        .args(["--with-etcdutl", "--no-h2spec"])
        .env("KVD_ETCD_VERSION", version)
        .stderr(Stdio::inherit())
        .output()
        .expect("run tests/tools/etcd-tools.sh");
    assert!(out.status.success(), "building etcd {version} failed");
    let dir = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    built.push((version.to_string(), dir.clone()));
    dir
}

pub fn kvd_bin() -> &'static str {
    env!("CARGO_BIN_EXE_kvd")
}

// Shared with every kvd test binary; not every one waits on something.
#[allow(unused_imports)]
pub use test_support::{free_port, wait_for};

/// One member's addresses.
#[derive(Debug, Clone)]
pub struct Addrs {
    pub name: String,
    pub client: String,
    /// The advertised peer URL (what the others dial).
    pub peer: String,
    /// Where the member listens for peers (the same unless a proxy sits in between).
    pub peer_listen: String,
}

impl Addrs {
    pub fn new(name: &str) -> Addrs {
        let peer = format!("http://127.0.0.1:{}", free_port());
        Addrs {
            name: name.into(),
            client: format!("http://127.0.0.1:{}", free_port()),
            peer_listen: peer.clone(),
            peer,
        }
    }

    /// A member whose client and peer URLs are `https://`.
    pub fn new_tls(name: &str) -> Addrs {
        let mut m = Addrs::new(name);
        for u in [&mut m.client, &mut m.peer, &mut m.peer_listen] {
            *u = u.replacen("http://", "https://", 1);
        }
        m
    }

    /// The same member behind a proxy for its inbound peer traffic: the others dial the proxy.
    pub fn behind_proxy(name: &str) -> (Addrs, Proxy) {
        let mut m = Addrs::new(name);
        let proxy = Proxy::start(m.peer_listen.trim_start_matches("http://").to_string());
        m.peer = format!("http://{}", proxy.addr);
        (m, proxy)
    }

    /// The endpoint etcdctl takes: host:port, or the https:// URL.
    pub fn endpoint(&self) -> String {
        self.client.trim_start_matches("http://").to_string()
    }

    /// host:port of the client URL.
    pub fn client_hostport(&self) -> String {
        self.client
            .split_once("://")
            .map_or(&*self.client, |(_, h)| h)
            .to_string()
    }

    /// host:port of the peer URL the member listens on.
    pub fn peer_hostport(&self) -> String {
        let u = &self.peer_listen;
        u.split_once("://").map_or(&**u, |(_, h)| h).to_string()
    }
}

/// `--initial-cluster` for these members.
pub fn initial_cluster(ms: &[Addrs]) -> String {
    ms.iter()
        .map(|m| format!("{}={}", m.name, m.peer))
        .collect::<Vec<_>>()
        .join(",")
}

/// A running server process; SIGKILLed and reaped on drop.
#[derive(Debug)]
pub struct Proc {
    pub child: Option<Child>,
    pub addrs: Addrs,
    pub log: PathBuf,
    /// etcdctl flags this member needs (TLS, a user), used by [`Proc::wait_ready`].
    pub ctl_flags: Vec<String>,
}

impl Proc {
    /// Starts `bin` as member `m` with data in `dir`, the cluster's members `all`, and `extra`
    /// flags. kvd and etcd take the same flags.
    pub fn start(
        bin: &Path,
        m: &Addrs,
        dir: &Path,
        all: &[Addrs],
        state: &str,
        extra: &[&str],
    ) -> Proc {
        Proc::start_env(bin, m, dir, all, state, extra, &[])
    }

    /// The same with environment variables `env` set for the process.
    pub fn start_env(
        bin: &Path,
        m: &Addrs,
        dir: &Path,
        all: &[Addrs],
        state: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Proc {
        std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
        let log = dir.with_extension("log");
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = Command::new(bin)
            .args(["--name", &m.name])
            .arg("--data-dir")
            .arg(dir)
            .args(["--listen-client-urls", &m.client])
            .args(["--advertise-client-urls", &m.client])
            .args(["--listen-peer-urls", &m.peer_listen])
            .args(["--initial-advertise-peer-urls", &m.peer])
            .args(["--initial-cluster", &initial_cluster(all)])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", "kvd-test"])
            .args(["--log-level", "info"])
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        Proc {
            child: Some(child),
            addrs: m.clone(),
            log,
            ctl_flags: Vec::new(),
        }
    }

    pub fn kvd(m: &Addrs, dir: &Path, all: &[Addrs], state: &str, extra: &[&str]) -> Proc {
        Proc::start(Path::new(kvd_bin()), m, dir, all, state, extra)
    }

    /// A one-member kvd cluster named `default` in `dir/kvd`, ready.
    pub fn single_kvd(dir: &Path) -> (Addrs, Proc) {
        Proc::single_kvd_with(dir, &[])
    }

    /// The same with `extra` flags.
    pub fn single_kvd_with(dir: &Path, extra: &[&str]) -> (Addrs, Proc) {
        let m = Addrs::new("default");
        let mut p = Proc::kvd(&m, &dir.join("kvd"), std::slice::from_ref(&m), "new", extra);
        p.wait_ready();
        (m, p)
    }

    /// A one-member kvd in `dir/kvd-tls` serving `server` on an https client URL (its peer
    /// URL in the clear), requiring client certificates of `ca`; ready (checked with
    /// `client`, which etcdctl presents through `ctl_flags`).
    pub fn single_kvd_tls(
        dir: &Path,
        server: &pki::Pair,
        ca: &Path,
        client: &pki::Pair,
    ) -> (Addrs, Proc) {
        Proc::single_tls(
            Path::new(kvd_bin()),
            &dir.join("kvd-tls"),
            server,
            ca,
            client,
        )
    }

    /// The same with etcd, in `dir/etcd-tls`.
    pub fn single_etcd_tls(
        dir: &Path,
        server: &pki::Pair,
        ca: &Path,
        client: &pki::Pair,
    ) -> (Addrs, Proc) {
        Proc::single_tls(
            &tools().join("etcd"),
            &dir.join("etcd-tls"),
            server,
            ca,
            client,
        )
    }

    pub fn single_tls(
        bin: &Path,
        dir: &Path,
        server: &pki::Pair,
        ca: &Path,
        client: &pki::Pair,
    ) -> (Addrs, Proc) {
        let m = Addrs::new_tls("default");
        let m = Addrs {
            peer: m.peer.replacen("https://", "http://", 1),
            peer_listen: m.peer_listen.replacen("https://", "http://", 1),
            ..m
        };
        let flags = [
            format!("--cert-file={}", server.cert.display()),
            format!("--key-file={}", server.key.display()),
            format!("--trusted-ca-file={}", ca.display()),
            "--client-cert-auth".to_string(),
        ];
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let mut p = Proc::start(bin, &m, dir, std::slice::from_ref(&m), "new", &flags);
        p.ctl_flags = client.ctl_flags(ca);
        p.wait_ready();
        (m, p)
    }

    pub fn etcd(m: &Addrs, dir: &Path, all: &[Addrs], extra: &[&str]) -> Proc {
        Proc::start(&tools().join("etcd"), m, dir, all, "new", extra)
    }

    /// A one-member etcd cluster named `default` in `dir/etcd`, ready: what kvd is compared with.
    pub fn single_etcd(dir: &Path) -> (Addrs, Proc) {
        let m = Addrs::new("default");
        let mut p = Proc::etcd(&m, &dir.join("etcd"), std::slice::from_ref(&m), &[]);
        p.wait_ready();
        (m, p)
    }

    /// The same with etcd `version` (`v3.7.1`), in `dir/etcd-<version>`.
    pub fn single_etcd_of(dir: &Path, version: &str) -> (Addrs, Proc) {
        let m = Addrs::new("default");
        let bin = etcd_tools(version).join("etcd");
        let data = dir.join(format!("etcd-{version}"));
        let mut p = Proc::start(&bin, &m, &data, std::slice::from_ref(&m), "new", &[]);
        p.wait_ready();
        (m, p)
    }

    /// `kvd grpc-proxy start` in front of `endpoints` (etcd's `--endpoints`), listening on a
    /// free port, its log in `dir/<name>.log`; started, not checked ready (its cluster may
    /// be down on purpose).
    pub fn grpc_proxy(name: &str, dir: &Path, endpoints: &str, extra: &[&str]) -> Proc {
        Proc::any_grpc_proxy(Path::new(kvd_bin()), name, dir, endpoints, extra)
    }

    /// etcd 3.6.5's `etcd grpc-proxy start`, the same way.
    pub fn etcd_grpc_proxy(name: &str, dir: &Path, endpoints: &str, extra: &[&str]) -> Proc {
        Proc::any_grpc_proxy(&tools().join("etcd"), name, dir, endpoints, extra)
    }

    fn any_grpc_proxy(bin: &Path, name: &str, dir: &Path, endpoints: &str, extra: &[&str]) -> Proc {
        std::fs::create_dir_all(dir).unwrap();
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let log = dir.join(format!("{name}.log"));
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let kvd = bin == Path::new(kvd_bin());
        let child = Command::new(bin)
            .args(["grpc-proxy", "start", "--endpoints", endpoints])
            .args(["--listen-addr", &addr, "--advertise-client-url", &addr])
            .args(if kvd {
                &[
                    "--log-format",
                    "text",
                    "--log-level",
                    "info,leasing_proxy=debug",
                ][..]
            } else {
                &[][..]
            })
            .args(extra)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        let p = Proc {
            child: Some(child),
            addrs: Addrs {
                name: name.into(),
                client: format!("http://{addr}"),
                peer: String::new(),
                peer_listen: String::new(),
            },
            log,
            ctl_flags: Vec::new(),
        };
        p.wait_for("the proxy to listen", 20, || {
            std::net::TcpStream::connect(&addr).is_ok()
        });
        p
    }

    /// A counter or gauge of this process's `/metrics` (0 when absent).
    pub fn metric(&self, name: &str) -> u64 {
        let (_, body) = http_get(&self.addrs.client, "/metrics");
        metric_in(&body, name)
    }

    /// SIGSTOP or SIGCONT.
    pub fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        run(Command::new("kill").args([sig, &pid]), "kill");
    }

    /// SIGKILL now.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for a clean exit; the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = c.try_wait().unwrap() {
                return s;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                panic!("{} did not exit on SIGTERM", self.addrs.name);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits up to `secs` for the process to exit on its own (`what`: why it should); its
    /// status and its whole log.
    pub fn wait_exit(&mut self, what: &str, secs: u64) -> (std::process::ExitStatus, String) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let status = loop {
            if let Some(s) = self.child.as_mut().expect("running").try_wait().unwrap() {
                self.child = None;
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit ({what}):\n{}",
                self.addrs.name,
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        (
            status,
            std::fs::read_to_string(&self.log).unwrap_or_default(),
        )
    }

    /// The process's log so far (for failure messages).
    pub fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Polls `f` until it holds; on timeout, fails with this process's log.
    pub fn wait_for(&self, what: &str, secs: u64, f: impl FnMut() -> bool) {
        test_support::wait_for_or(what, secs, f, || {
            format!("{}'s log:\n{}", self.addrs.name, self.log_tail())
        });
    }

    /// Waits until the member answers a linearizable read (it has a leader).
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut args: Vec<&str> = self.ctl_flags.iter().map(String::as_str).collect();
        args.extend(["get", "x"]);
        loop {
            let out = ctl(&self.addrs.endpoint(), &args);
            if out.status.success() {
                return;
            }
            if let Some(c) = self.child.as_mut() {
                if let Some(s) = c.try_wait().unwrap() {
                    panic!("{} exited ({s}):\n{}", self.addrs.name, self.log_tail());
                }
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready: {}\n{}",
                self.addrs.name,
                String::from_utf8_lossy(&out.stderr),
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs etcdctl against `endpoints` (comma-separated host:port).
pub fn ctl(endpoints: &str, args: &[&str]) -> Output {
    ctl_input(endpoints, args, "")
}

/// Runs etcdctl with `input` on its stdin.
pub fn ctl_input(endpoints: &str, args: &[&str], input: &str) -> Output {
    use std::io::Write;
    let mut c = Command::new(tools().join("etcdctl"))
        .args(["--endpoints", endpoints, "--command-timeout", "10s"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    c.wait_with_output().unwrap()
}

/// etcdctl started and left running (a watch, a lock, an election): its stdout read line by
/// line as it prints, its stderr drained; killed when dropped.
pub struct LiveCtl {
    child: Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// Lines [`LiveCtl::next`] has handed out.
    taken: std::cell::Cell<usize>,
    stdout: Option<std::thread::JoinHandle<()>>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl LiveCtl {
    pub fn start(endpoint: &str, args: &[&str]) -> LiveCtl {
        use std::io::{BufRead, Read};
        let mut child = Command::new(tools().join("etcdctl"))
            .args(["--endpoints", endpoint])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = lines.clone();
        let stdout = std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(l);
            }
        });
        let mut err = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        LiveCtl {
            child,
            lines,
            taken: std::cell::Cell::new(0),
            stdout: Some(stdout),
            stderr: Some(stderr),
        }
    }

    fn count(&self) -> usize {
        self.lines.lock().unwrap().len()
    }

    /// The next `n` lines not handed out yet, within 10 s.
    pub fn next(&self, n: usize) -> Vec<String> {
        let from = self.taken.get();
        wait_for(&format!("{n} more lines from etcdctl"), 10, || {
            self.count() >= from + n
        });
        self.taken.set(from + n);
        self.lines.lock().unwrap()[from..from + n].to_vec()
    }

    /// Whether it prints no new line for `d`.
    pub fn quiet_for(&self, d: Duration) -> bool {
        let (before, deadline) = (self.count(), Instant::now() + d);
        while Instant::now() < deadline {
            if self.count() > before {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.count() == before
    }

    /// What it printed so far, a newline after each line.
    pub fn printed(&self) -> String {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .map(|l| format!("{l}\n"))
            .collect()
    }

    /// Waits for a line starting with `start`.
    pub fn wait_printed(&self, start: &str) {
        wait_for(&format!("etcdctl to print {start}…"), 20, || {
            self.lines
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.starts_with(start))
        });
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// SIGTERM (etcdctl lock and elect let go of their hold on it), then [`LiveCtl::finish`].
    pub fn stop(self) -> String {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        self.finish()
    }

    /// Waits (20 s at most, then SIGKILL) for it to end: its exit code, stdout and stderr.
    pub fn finish(mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                break self.child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.stdout.take().unwrap().join().unwrap();
        let err = self.stderr.take().unwrap().join().unwrap();
        format!("[exit {:?}]\n{}{err}", status.code(), self.printed())
    }
}

impl Drop for LiveCtl {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// etcdctl's stdout, asserting success.
pub fn ctl_ok(endpoints: &str, args: &[&str]) -> String {
    let out = ctl(endpoints, args);
    assert!(
        out.status.success(),
        "etcdctl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs `cmd` to its end, asserting success (its output in the message if not).
pub fn run(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// gRPC clients of one member, from kvd's own generated code.
pub mod grpc {
    use api::etcdserverpb::kv_client::KvClient;
    use api::etcdserverpb::maintenance_client::MaintenanceClient;
    use tonic::transport::{Channel, Endpoint};

    pub fn channel(client_url: &str) -> Channel {
        Endpoint::from_shared(client_url.to_string())
            .unwrap()
            .connect_timeout(std::time::Duration::from_secs(1))
            .timeout(std::time::Duration::from_secs(10))
            .connect_lazy()
    }

    pub fn kv(client_url: &str) -> KvClient<Channel> {
        KvClient::new(channel(client_url))
    }

    pub fn maintenance(client_url: &str) -> MaintenanceClient<Channel> {
        MaintenanceClient::new(channel(client_url))
    }
}

/// A TCP proxy the test controls: forwards connections to `upstream` until cut; cutting closes
/// every open connection and refuses new ones until healed.
#[derive(Debug)]
pub struct Proxy {
    pub addr: String,
    /// Connections accepted so far (refused ones too, while cut).
    pub accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Proxy {
    pub fn start(upstream: String) -> Proxy {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Mutex};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let cut = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<std::net::TcpStream>>> = Arc::default();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (c, s, k, n) = (cut.clone(), stop.clone(), conns.clone(), accepted.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let (down, _) = match l.accept() {
                    Ok(x) => x,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                };
                n.fetch_add(1, Ordering::Relaxed);
                if c.load(Ordering::Relaxed) {
                    continue; // dropped: refused while cut
                }
                down.set_nonblocking(false).unwrap();
                let Ok(up) = std::net::TcpStream::connect(&upstream) else {
                    continue;
                };
                let _ = down.set_nodelay(true);
                let _ = up.set_nodelay(true);
                let mut list = k.lock().unwrap();
                list.push(down.try_clone().unwrap());
                list.push(up.try_clone().unwrap());
                drop(list);
                for (mut from, mut to) in [
                    (down.try_clone().unwrap(), up.try_clone().unwrap()),
                    (up, down),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Proxy {
            addr,
            accepted,
            cut,
            conns,
            stop,
        }
    }

    /// Drops every connection and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::Relaxed);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }

    pub fn heal(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.cut();
    }
}

/// Two transcripts of the same requests, etcd's and kvd's, answer for answer; on failure, each
/// pair that differs and kvd's whole transcript.
pub fn assert_same_answers(want: &[String], got: &[String]) {
    let diffs: Vec<String> = want
        .iter()
        .zip(got)
        .filter(|(w, g)| w != g)
        .map(|(w, g)| format!("etcd: {w}\n kvd: {g}\n"))
        .collect();
    assert!(
        diffs.is_empty() && want.len() == got.len(),
        "{} of {} answers differ ({} vs {} answers):\n{}\nkvd's transcript:\n{}",
        diffs.len(),
        want.len(),
        want.len(),
        got.len(),
        diffs.join("\n"),
        got.join("\n")
    );
}

/// A counter or gauge in a `/metrics` text (0 when absent).
pub fn metric_in(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// A GET over HTTP/1.1: (status code, body).
pub fn http_get(client_url: &str, path: &str) -> (u16, String) {
    http_request(client_url, "GET", path, &[], "")
}

/// An HTTP/1.1 request with `headers` (`name: value`) and `body`: (status code, body).
pub fn http_request(
    client_url: &str,
    method: &str,
    path: &str,
    headers: &[String],
    body: &str,
) -> (u16, String) {
    let addr = client_url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    use std::io::{Read, Write};
    let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let code = resp.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = resp
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (code, body)
}

/// A number field (`leader`, `dbSize`, …) of `etcdctl endpoint status -w json` at `endpoint`.
pub fn status_number(endpoint: &str, field: &str) -> u64 {
    let s = ctl_ok(endpoint, &["endpoint", "status", "-w", "json"]);
    json_number(&s, field).unwrap_or_else(|| panic!("no {field} in {s}"))
}

/// The first number field named `field` in etcdctl's JSON output (`None`: absent, as Go
/// omits zero values).
pub fn json_number(json: &str, field: &str) -> Option<u64> {
    let pat = format!("\"{field}\":");
    let i = json.find(&pat)? + pat.len();
    json[i..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()
}

/// Replaces what differs between two servers by design: member, cluster and lease ids, the
/// endpoint, raft terms and clocks.
pub fn normalize(s: &str, endpoint: &str) -> String {
    let s = s.replace(endpoint, "<endpoint>");
    let mut out = String::new();
    let mut token = String::new();
    let flush = |token: &mut String, out: &mut String| {
        // Ids print as 16 hex digits (or as 19-20 decimal ones in JSON); a hash as decimal.
        let hexish = token.len() >= 12
            && token.chars().all(|c| c.is_ascii_hexdigit())
            && (token.len() >= 15 || token.chars().any(|c| c.is_ascii_alphabetic()));
        let id_number = token.len() >= 15 && token.chars().all(|c| c.is_ascii_digit());
        if hexish || id_number {
            out.push_str("<id>");
        } else {
            out.push_str(token);
        }
        token.clear();
    };
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            token.push(c);
        } else {
            flush(&mut token, &mut out);
            out.push(c);
        }
    }
    flush(&mut token, &mut out);
    // A lease's remaining TTL depends on when it is asked; raft terms on elections.
    let mut lines = Vec::new();
    for l in out.lines() {
        // The client's retry warnings carry a clock and a pointer: keep their error only.
        if l.starts_with("{\"level\":\"warn\"") {
            let err = l.split("\"error\":").nth(1).unwrap_or_default();
            lines.push(format!("<client warning: {err}"));
            continue;
        }
        let l = match l.find("remaining(") {
            Some(i) => format!(
                "{}remaining(N){}",
                &l[..i],
                &l[l[i..].find(')').map_or(l.len(), |j| i + j + 1)..]
            ),
            None => l.to_string(),
        };
        lines.push(without_json_field(&table_cells(&l), "raft_term"));
    }
    lines.join("\n")
}

/// A line of an etcdctl table without its padding: columns are as wide as their widest cell,
/// and a member id prints as 15 hex digits or 16 (the leading zero left out).
fn table_cells(l: &str) -> String {
    if l.starts_with('+') && l.chars().all(|c| c == '+' || c == '-') {
        return l
            .split('+')
            .map(|c| if c.is_empty() { "" } else { "-" })
            .collect::<Vec<_>>()
            .join("+");
    }
    if l.starts_with('|') {
        return l.split('|').map(str::trim).collect::<Vec<_>>().join("|");
    }
    l.to_string()
}

/// Drops `"field":<number>` from JSON output.
pub fn without_json_field(l: &str, field: &str) -> String {
    let pat = format!("\"{field}\":");
    let Some(i) = l.find(&pat) else {
        return l.to_string();
    };
    let rest = &l[i + pat.len()..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    format!("{}\"{field}\":N{}", &l[..i], &rest[end..])
}
