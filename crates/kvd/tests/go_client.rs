//! Go's clientv3 and its concurrency package (mutex, election, STM) against kvd: runs the Go
//! test module in `tests/clients/go` with a kvd process's endpoint.

mod common;

use std::path::Path;
use std::process::Command;

use common::Proc;

#[test]
fn go_clientv3_and_concurrency_work_against_kvd() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _kvd) = Proc::single_kvd(dir.path());
    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/clients/go");
    let out = Command::new("go")
        .args(["test", "-count=1", "-v", "./..."])
        .current_dir(&module)
        .env("KVD_ENDPOINTS", m.endpoint())
        .env("GOFLAGS", "-mod=mod")
        .output()
        .expect("run go test (is Go installed?)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "go test failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every test ran (none skipped for want of the endpoint).
    for t in [
        "TestKVTxnAndErrors",
        "TestWatchAndLease",
        "TestLeaseExpires",
        "TestMutexExcludes",
        "TestElection",
        "TestSTMTransfersConserveTheTotal",
    ] {
        assert!(
            stdout.contains(&format!("--- PASS: {t}")),
            "{t} did not pass:\n{stdout}"
        );
    }
}
