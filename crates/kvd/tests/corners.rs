//! The last corners of etcd's behaviour, each against kvd and etcd v3.6.5 side by side: the
//! member list right after a start, which fields the maintenance answers carry (Defragment,
//! MoveLeader, the Snapshot stream, Status), and etcdctl's `downgrade validate|enable|cancel`.

mod common;

use std::time::{Duration, Instant};

use api::etcdserverpb::{
    DefragmentRequest, DowngradeRequest, MoveLeaderRequest, SnapshotRequest, StatusRequest,
};
use common::{ctl, ctl_ok, Addrs, Proc};

/// Starts a one-member cluster of `bin` and reads its member list as soon as it answers: the
/// first answer (JSON) and how long it took.
fn first_member_list(bin: &str, dir: &std::path::Path) -> (String, Duration, Proc) {
    let m = Addrs::new("default");
    let t0 = Instant::now();
    let p = Proc::start(
        std::path::Path::new(bin),
        &m,
        &dir.join(bin.rsplit('/').next().unwrap()),
        std::slice::from_ref(&m),
        "new",
        &[],
    );
    loop {
        let out = ctl(
            &m.endpoint(),
            &["--command-timeout=1s", "member", "list", "-w", "json"],
        );
        if out.status.success() {
            return (
                String::from_utf8_lossy(&out.stdout).into_owned(),
                t0.elapsed(),
                p,
            );
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", p.log_tail());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_member_list_never_shows_a_started_member_without_its_client_urls() {
    let dir = tempfile::tempdir().unwrap();
    for bin in [
        common::kvd_bin().to_string(),
        format!("{}/etcd", common::tools().display()),
    ] {
        let (list, took, _p) = first_member_list(&bin, dir.path());
        // The first answer the member gives already lists its own client URL.
        assert!(
            list.contains(r#""clientURLs":["http://127.0.0.1:"#),
            "{bin}'s first member list, {took:?} after its start: {list}"
        );
    }
}

/// Which fields an answer carries, as a line: the header's presence, and the rest.
fn maintenance_fields(client_url: &str) -> Vec<String> {
    // Once the leader's monitor has set the cluster version (and with it the storage version).
    common::wait_for("the cluster version", 30, || {
        common::http_get(client_url, "/version")
            .1
            .contains(r#""storage":"3.7.0""#)
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut m = common::grpc::maintenance(client_url);
        let mut out = Vec::new();
        let status = m.status(StatusRequest {}).await.unwrap().into_inner();
        out.push(format!(
            "status: header {} storage_version {} downgrade_info {:?} db_size_quota {}",
            status.header.is_some(),
            status.storage_version,
            status.downgrade_info,
            status.db_size_quota
        ));
        let d = m
            .defragment(DefragmentRequest {})
            .await
            .unwrap()
            .into_inner();
        out.push(format!("defragment: header {}", d.header.is_some()));
        let me = status.header.unwrap().member_id;
        let ml = m
            .move_leader(MoveLeaderRequest { target_id: me })
            .await
            .unwrap()
            .into_inner();
        out.push(format!(
            "move_leader to itself: header {}",
            ml.header.is_some()
        ));
        let mut snap = m.snapshot(SnapshotRequest {}).await.unwrap().into_inner();
        let mut n = 0;
        let mut fields = std::collections::BTreeSet::new();
        while let Some(r) = snap.message().await.unwrap() {
            n += 1;
            fields.insert(format!(
                "header {} version {:?}",
                r.header.is_some(),
                r.version
            ));
        }
        assert!(n >= 1, "a snapshot");
        out.push(format!("snapshot: every message has {fields:?}"));
        let dg = m
            .downgrade(DowngradeRequest {
                action: 0,
                version: "3.6".into(),
            })
            .await
            .unwrap()
            .into_inner();
        out.push(format!(
            "downgrade validate: header {} version {}",
            dg.header.is_some(),
            dg.version
        ));
        out
    })
}

#[test]
fn maintenance_answers_carry_the_fields_etcds_carry() {
    let dir = tempfile::tempdir().unwrap();
    let (k, _kvd) = Proc::single_kvd(dir.path());
    let (e, _etcd) = Proc::single_etcd_of(dir.path(), "v3.7.1");
    let want = maintenance_fields(&e.client);
    let got = maintenance_fields(&k.client);
    common::assert_same_answers(&want, &got);
    // Not vacuous: etcd leaves the header out of these.
    assert!(
        want.contains(&"defragment: header false".to_string()),
        "{want:?}"
    );
}

/// etcdctl's downgrade commands in order, and what each printed (the downgrade job as
/// `endpoint status` shows it).
fn downgrade_transcript(endpoint: &str) -> Vec<String> {
    let steps: &[&[&str]] = &[
        &["downgrade", "validate", "3.6"],
        &["downgrade", "validate", "3.5"],
        &["downgrade", "validate", "3.8"],
        &["downgrade", "validate", "v3.6"],
        &["downgrade", "cancel"],
        &["downgrade", "enable", "3.7"],
        &["downgrade", "enable", "3.6"],
        &["status"],
        &["wait", "3.6.0"],
        &["downgrade", "validate", "3.6"],
        &["downgrade", "enable", "3.6.2"],
        &["downgrade", "cancel"],
        &["status"],
        &["wait", "3.7.0"],
        &["downgrade", "cancel"],
        &["downgrade", "enable", "3.6.2"],
        &["status"],
        &["wait", "3.6.0"],
    ];
    let mut out = Vec::new();
    for step in steps {
        let line = if let ["wait", version] = step {
            // The leader's monitor moves the cluster version a few seconds later.
            let needle = format!(r#""etcdcluster":"{version}""#);
            common::wait_for(&format!("cluster version {version}"), 30, || {
                common::http_get(&format!("http://{endpoint}"), "/version")
                    .1
                    .contains(&needle)
            });
            format!("cluster version {version}")
        } else if step == &["status"] {
            let json = ctl_ok(endpoint, &["endpoint", "status", "-w", "json"]);
            let at = json.find("\"downgradeInfo\"").expect("downgradeInfo");
            let end = at + json[at..].find('}').unwrap() + 1;
            json[at..end].to_string()
        } else {
            let o = ctl(endpoint, step);
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .filter(|l| l.starts_with("Error:"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            format!(
                "{} -> {} {}",
                step.join(" "),
                o.status.success(),
                text.trim()
            )
        };
        out.push(line);
    }
    out
}

#[test]
fn etcdctl_downgrade_behaves_as_with_etcd_and_the_job_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (k, mut kvd) = Proc::single_kvd(dir.path());
    let (e, _etcd) = Proc::single_etcd_of(dir.path(), "v3.7.1");
    let want = downgrade_transcript(&e.endpoint());
    let got = downgrade_transcript(&k.endpoint());
    common::assert_same_answers(&want, &got);
    assert!(
        want.contains(&r#""downgradeInfo":{"enabled":true,"targetVersion":"3.6.0"}"#.to_string()),
        "{want:?}"
    );
    // The job is replicated state: it is there after a restart.
    kvd.kill();
    let mut kvd = Proc::kvd(
        &k,
        &dir.path().join("kvd"),
        std::slice::from_ref(&k),
        "new",
        &[],
    );
    kvd.wait_ready();
    let status = ctl_ok(&k.endpoint(), &["endpoint", "status", "-w", "json"]);
    assert!(
        status.contains(r#""downgradeInfo":{"enabled":true,"targetVersion":"3.6.0"}"#),
        "{status}"
    );
}
