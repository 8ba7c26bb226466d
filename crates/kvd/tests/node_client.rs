//! A Node.js client — @grpc/grpc-js, whose HTTP/2 is Node's nghttp2, another HTTP/2 stack
//! beside grpc-go's, gRPC C-core's and tonic's h2 — loading `proto/` at run time, against kvd
//! and, with the same expectations, against etcd: KV with etcd's errors, messages over HTTP/2's
//! default windows, 200 calls at once on one connection, Watch, Lease and a Snapshot stream.
//! The packages of `tests/clients/node/package-lock.json` are installed under target/.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::pki::Ca;
use common::{run, Addrs, Proc};

/// `node_modules` with the locked packages, installed once per target directory (again when
/// the lock file changes).
fn node_modules() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/clients/node");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("node-client");
    let lock = std::fs::read(src.join("package-lock.json")).unwrap();
    let stamp = dir.join("installed.lock");
    if std::fs::read(&stamp).ok().as_ref() != Some(&lock) {
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["package.json", "package-lock.json"] {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
        run(
            Command::new("npm")
                .args(["ci", "--ignore-scripts", "--no-audit", "--no-fund"])
                .current_dir(&dir),
            "npm ci (is Node.js installed?)",
        );
        std::fs::write(&stamp, &lock).unwrap();
    }
    dir.join("node_modules")
}

/// Runs the client against `server` (with `env`: the TLS files, for an https one).
fn client_against(server: &Addrs, what: &str, env: &[(&str, String)]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("node")
        .arg(root.join("tests/clients/node/test_client.js"))
        .env("NODE_PATH", node_modules())
        .env("PROTO_DIR", root.join("proto"))
        .env("KVD_ENDPOINT", server.client_hostport())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("KV, Watch, Lease and Snapshot OK"),
        "the Node.js client failed against {what}:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_node_grpc_js_client_works_against_kvd_as_against_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let (m, kvd) = Proc::single_kvd(dir.path());
    client_against(&m, "kvd", &[]);
    drop(kvd);
    let (e, etcd) = Proc::single_etcd(dir.path());
    client_against(&e, "etcd", &[]);
    drop(etcd);

    // Over mutual TLS: Node's TLS (OpenSSL) against kvd's rustls, and against etcd.
    let mut ca = Ca::new(&dir.path().join("pki"), "cluster");
    let server = ca.issue("server", "server");
    let client = ca.issue("client", "client");
    let env = [
        ("KVD_CACERT", ca.cert.display().to_string()),
        ("KVD_CERT", client.cert.display().to_string()),
        ("KVD_KEY", client.key.display().to_string()),
    ];
    let (m, _kvd) = Proc::single_kvd_tls(dir.path(), &server, &ca.cert, &client);
    client_against(&m, "kvd over TLS", &env);
    let (e, _etcd) = Proc::single_etcd_tls(dir.path(), &server, &ca.cert, &client);
    client_against(&e, "etcd over TLS", &env);
}
