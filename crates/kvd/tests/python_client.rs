//! A Python client generated from `proto/` with grpcio-tools (installed into a private
//! virtualenv under target/) exercising KV, Watch and Lease against a kvd process.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::pki::Ca;
use common::{run, Proc};

/// A virtualenv with grpcio-tools, made once per target directory.
fn venv() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-venv");
    let python = dir.join("bin/python");
    let reqs =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/clients/python/requirements.txt");
    let stamp = dir.join("installed");
    if !stamp.exists() {
        run(
            Command::new("python3").args(["-m", "venv"]).arg(&dir),
            "python3 -m venv",
        );
        run(
            Command::new(&python)
                .args(["-m", "pip", "install", "--quiet", "-r"])
                .arg(&reqs),
            "pip install grpcio-tools",
        );
        std::fs::write(&stamp, "").unwrap();
    }
    python
}

/// Runs the client script against `endpoint` with `env`, asserting it passed.
fn run_client(python: &Path, gen: &Path, endpoint: String, env: &[(&str, String)]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(python)
        .arg(root.join("tests/clients/python/test_client.py"))
        .env("GEN_DIR", gen)
        .env("KVD_ENDPOINT", endpoint)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("KV, Watch and Lease OK"));
}

#[test]
fn a_python_client_generated_from_our_protos_uses_kv_watch_and_lease() {
    let python = venv();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempfile::tempdir().unwrap();
    let gen = dir.path().join("gen");
    std::fs::create_dir_all(&gen).unwrap();
    run(
        Command::new(&python)
            .args(["-m", "grpc_tools.protoc", "-I"])
            .arg(root.join("proto"))
            .arg(format!("--python_out={}", gen.display()))
            .arg(format!("--grpc_python_out={}", gen.display()))
            .args([
                "etcd/api/mvccpb/kv.proto",
                "etcd/api/authpb/auth.proto",
                "etcd/api/etcdserverpb/rpc.proto",
            ]),
        "generate the Python client",
    );
    let (m, kvd) = Proc::single_kvd(dir.path());
    run_client(&python, &gen, m.endpoint(), &[]);
    drop(kvd);

    // Over mutual TLS (gRPC C-core's TLS against kvd's rustls).
    let mut ca = Ca::new(&dir.path().join("pki"), "cluster");
    let server = ca.issue("server", "server");
    let client = ca.issue("client", "client");
    let (m, _kvd) = Proc::single_kvd_tls(dir.path(), &server, &ca.cert, &client);
    let env = [
        ("KVD_CACERT", ca.cert.display().to_string()),
        ("KVD_CERT", client.cert.display().to_string()),
        ("KVD_KEY", client.key.display().to_string()),
    ];
    run_client(&python, &gen, m.client_hostport(), &env);
}
