//! Kubernetes across a migration: a kube-apiserver built from the Go module proxy writes its
//! objects into a three-member etcd cluster; the cluster is stopped, migrated member by member
//! and started as kvd; the kube-apiserver, pointed at kvd, sees every object at the same
//! resourceVersion, lists at a resourceVersion from before the move as before it, and takes
//! writes above it.

use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::migrate::{cluster, endpoints, migrate};
use super::*;

const TOKEN: &str = "kvd-test-token";

fn kube_apiserver_bin() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/tools/kube-apiserver.sh");
        let out = Command::new("bash")
            .arg(&script)
            .stderr(Stdio::inherit())
            .output()
            .expect("run tests/tools/kube-apiserver.sh");
        assert!(out.status.success(), "building kube-apiserver failed");
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()).join("kube-apiserver")
    })
}

/// A kube-apiserver on a free port in front of `etcd` (comma-separated client URLs).
struct Apiserver {
    proc: Proc,
    port: u16,
}

impl Apiserver {
    fn start(dir: &Path, etcd: &str) -> Apiserver {
        std::fs::create_dir_all(dir).unwrap();
        // Service-account keys and a static token: what the apiserver needs to start.
        let key = rcgen::KeyPair::generate().unwrap();
        std::fs::write(dir.join("sa.key"), key.serialize_pem()).unwrap();
        std::fs::write(dir.join("sa.pub"), key.public_key_pem()).unwrap();
        std::fs::write(
            dir.join("tokens.csv"),
            format!("{TOKEN},admin,admin,system:masters\n"),
        )
        .unwrap();
        let port = common::free_port();
        let log = dir.join("apiserver.log");
        let logf = std::fs::File::create(&log).unwrap();
        let child = Command::new(kube_apiserver_bin())
            .arg(format!("--etcd-servers={etcd}"))
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg(format!(
                "--service-account-key-file={}",
                dir.join("sa.pub").display()
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                dir.join("sa.key").display()
            ))
            .arg("--service-cluster-ip-range=10.0.0.0/24")
            .arg("--authorization-mode=AlwaysAllow")
            .arg(format!(
                "--token-auth-file={}",
                dir.join("tokens.csv").display()
            ))
            .arg(format!("--secure-port={port}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--cert-dir={}", dir.join("certs").display()))
            .stdout(logf.try_clone().unwrap())
            .stderr(logf)
            .spawn()
            .expect("start kube-apiserver");
        let a = Apiserver {
            proc: Proc {
                child: Some(child),
                addrs: Addrs::new("kube-apiserver"),
                log,
                ctl_flags: Vec::new(),
            },
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while a.request("GET", "/readyz", None).0 != 200 {
            assert!(
                Instant::now() < deadline,
                "kube-apiserver not ready:\n{}",
                a.proc.log_tail()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        a
    }

    /// A request with the admin token: (HTTP status, body).
    fn request(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let mut c = Command::new("curl");
        c.args(["-sk", "-m", "30", "-X", method, "-w", "\n%{http_code}"])
            .args(["-H", &format!("Authorization: Bearer {TOKEN}")])
            .args(["-H", "Content-Type: application/json"]);
        if let Some(b) = body {
            c.args(["--data", b]);
        }
        let out = c
            .arg(format!("https://127.0.0.1:{}{path}", self.port))
            .output()
            .unwrap();
        let s = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = s.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    fn json(&self, method: &str, path: &str, body: Option<&str>) -> serde_json::Value {
        let (code, b) = self.request(method, path, body);
        assert!((200..300).contains(&code), "{method} {path}: {code} {b}");
        serde_json::from_str(&b).unwrap()
    }
}

/// The config maps of namespace `ns` (at resourceVersion `at`, exactly: read from the store's
/// history): (name, resourceVersion, data), sorted; and the list's resourceVersion.
fn config_maps(
    a: &Apiserver,
    ns: &str,
    at: Option<&str>,
) -> (Vec<(String, String, String)>, String) {
    let query = at.map_or_else(String::new, |rv| {
        format!("?resourceVersion={rv}&resourceVersionMatch=Exact")
    });
    let v = a.json(
        "GET",
        &format!("/api/v1/namespaces/{ns}/configmaps{query}"),
        None,
    );
    let mut items: Vec<(String, String, String)> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["metadata"]["name"].as_str().unwrap().to_string(),
                i["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .to_string(),
                i["data"].to_string(),
            )
        })
        .collect();
    items.sort();
    (
        items,
        v["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string(),
    )
}

#[test]
fn a_kube_apiserver_sees_the_same_objects_at_the_same_resource_versions_after_the_move() {
    let dir = tempfile::tempdir().unwrap();
    let ms: Vec<Addrs> = (1..=3).map(|i| Addrs::new(&format!("m{i}"))).collect();
    let etcd_bin = etcd_tools("v3.6.5").join("etcd");
    let mut etcds: Vec<Proc> = cluster(dir.path(), &ms, &etcd_bin)
        .into_iter()
        .map(|p| ready(p, false))
        .collect();
    let urls = ms
        .iter()
        .map(|m| m.client.clone())
        .collect::<Vec<_>>()
        .join(",");
    let mut api = Apiserver::start(&dir.path().join("apiserver"), &urls);
    api.json(
        "POST",
        "/api/v1/namespaces",
        Some(r#"{"metadata":{"name":"moving"}}"#),
    );
    let mut early_rv = String::new();
    for i in 0..20 {
        let cm = format!(r#"{{"metadata":{{"name":"cm{i:02}"}},"data":{{"n":"{i}"}}}}"#);
        let made = api.json("POST", "/api/v1/namespaces/moving/configmaps", Some(&cm));
        early_rv = made["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
    }
    // Updated objects (newer resourceVersions than their creation) and a deleted one.
    for i in 0..5 {
        let cm = format!(r#"{{"metadata":{{"name":"cm{i:02}"}},"data":{{"n":"updated {i}"}}}}"#);
        api.json(
            "PUT",
            &format!("/api/v1/namespaces/moving/configmaps/cm{i:02}"),
            Some(&cm),
        );
    }
    api.json("DELETE", "/api/v1/namespaces/moving/configmaps/cm19", None);
    let (want, list_rv) = config_maps(&api, "moving", None);
    let (early, _) = config_maps(&api, "moving", Some(&early_rv));
    assert_ne!(early, want, "the early list is from before the updates");
    let namespaces =
        api.json("GET", "/api/v1/namespaces/moving", None)["metadata"]["resourceVersion"].clone();
    api.proc.terminate();
    for p in &mut etcds {
        p.terminate();
    }
    for m in &ms {
        ok(migrate(&dir.path().join(&m.name)), "kvd migrate");
    }
    let kvd_bin = PathBuf::from(common::kvd_bin());
    let _kvds: Vec<Proc> = cluster(dir.path(), &ms, &kvd_bin)
        .into_iter()
        .map(|p| ready(p, false))
        .collect();
    let _ = endpoints(&ms);
    let api = Apiserver::start(&dir.path().join("apiserver-kvd"), &urls);
    let (got, _) = config_maps(&api, "moving", None);
    assert_eq!(got, want, "every object at the same resourceVersion");
    assert_eq!(
        config_maps(&api, "moving", Some(&early_rv)).0,
        early,
        "a list at resourceVersion {early_rv}, from before the move"
    );
    assert_eq!(
        api.json("GET", "/api/v1/namespaces/moving", None)["metadata"]["resourceVersion"],
        namespaces
    );
    let created = api.json(
        "POST",
        "/api/v1/namespaces/moving/configmaps",
        Some(r#"{"metadata":{"name":"after-the-move"},"data":{"n":"new"}}"#),
    );
    let new_rv = created["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(new_rv.parse::<u64>().unwrap() > list_rv.parse::<u64>().unwrap());
}
