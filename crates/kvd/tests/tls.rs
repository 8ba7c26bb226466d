//! TLS on kvd's client and peer ports with etcd's flags: etcdctl over mutual TLS against kvd
//! and etcd v3.6.5 with the same certificates, clients refused for the reasons etcd refuses
//! them (no certificate, another CA, a revoked one, plaintext), certificates and CRLs renewed
//! on disk without a restart, TLS versions and cipher suites, `--auto-tls`, the split HTTP and
//! metrics URLs, and a three-member cluster over peer TLS that refuses a member with a
//! certificate from another CA.
//!
//! Certificates are made here (rcgen), fresh for every test.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::pki::{Ca, Pair};
use common::{ctl_input, normalize, Addrs, Proc};

/// etcd's flags serving `server` on the client port, requiring client certificates of `ca`.
fn client_tls(server: &Pair, ca: &Path) -> Vec<String> {
    vec![
        format!("--cert-file={}", server.cert.display()),
        format!("--key-file={}", server.key.display()),
        format!("--trusted-ca-file={}", ca.display()),
        "--client-cert-auth".into(),
    ]
}

/// etcd's flags serving `server` on the peer port, requiring peer certificates of `ca`.
fn peer_tls(server: &Pair, ca: &Path) -> Vec<String> {
    vec![
        format!("--peer-cert-file={}", server.cert.display()),
        format!("--peer-key-file={}", server.key.display()),
        format!("--peer-trusted-ca-file={}", ca.display()),
        "--peer-client-cert-auth".into(),
    ]
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A one-member cluster of `bin`'s at https client URLs with `extra` flags, ready.
fn start_tls(bin: &str, dir: &Path, extra: &[String], ctl: &[String]) -> (Addrs, Proc) {
    let m = Addrs::new_tls("default");
    // The peer URL stays plain: these tests are about the client port.
    let m = Addrs {
        peer: m.peer.replacen("https://", "http://", 1),
        peer_listen: m.peer_listen.replacen("https://", "http://", 1),
        ..m
    };
    let dir = dir.join(bin);
    let mut p = match bin {
        "kvd" => Proc::kvd(&m, &dir, std::slice::from_ref(&m), "new", &strs(extra)),
        _ => Proc::etcd(&m, &dir, std::slice::from_ref(&m), &strs(extra)),
    };
    p.ctl_flags = ctl.to_vec();
    p.wait_ready();
    (m, p)
}

/// etcdctl `args` with `flags` first: (exit code, stdout, stderr).
fn run(endpoint: &str, flags: &[String], args: &[&str]) -> (i32, String, String) {
    run_input(endpoint, flags, args, "")
}

fn run_input(
    endpoint: &str,
    flags: &[String],
    args: &[&str],
    input: &str,
) -> (i32, String, String) {
    let mut all = strs(flags);
    all.extend_from_slice(args);
    let out = ctl_input(endpoint, &all, input);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// What etcdctl prints for a script of commands over TLS, normalized for comparison.
fn transcript(m: &Addrs, flags: &[String]) -> Vec<String> {
    let endpoint = &m.endpoint();
    let script: &[(&[&str], &str)] = &[
        (&["put", "k", "v1"], ""),
        (&["put", "k", "v2", "--prev-kv"], ""),
        (&["get", "k", "-w", "json"], ""),
        (&["get", "k", "--consistency=s"], ""),
        (
            &["txn"],
            "value(\"k\") = \"v2\"\n\nput k v3\n\nput k no\n\n",
        ),
        (&["del", "k", "--prev-kv"], ""),
        (&["get", "k", "--rev", "2"], ""),
        (&["endpoint", "health"], ""),
        (&["member", "list", "-w", "table"], ""),
    ];
    script
        .iter()
        .map(|(args, input)| {
            let (code, out, err) = run_input(endpoint, flags, args, input);
            let out = normalize(&format!("{out}{err}"), endpoint).replace(&m.peer, "<peer>");
            // Health lines carry the time taken.
            let out: String = out
                .lines()
                .map(
                    |l| match l.find(": successfully committed proposal: took = ") {
                        Some(i) => format!("{}: healthy\n", &l[..i]),
                        None => format!("{l}\n"),
                    },
                )
                .collect();
            format!("$ etcdctl {}\n[exit {code}]\n{out}", args.join(" "))
        })
        .collect()
}

#[test]
fn etcdctl_over_mutual_tls_prints_against_kvd_what_it_prints_against_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let mut ca = Ca::new(&dir.path().join("pki"), "cluster");
    let server = ca.issue("server", "server");
    let alice = ca.issue("alice", "alice");
    let mut other = Ca::new(&dir.path().join("pki"), "other");
    let stranger = other.issue("stranger", "stranger");
    let flags = client_tls(&server, &ca.cert);
    let ctl = alice.ctl_flags(&ca.cert);
    let (k, _kvd) = start_tls("kvd", dir.path(), &flags, &ctl);
    let (e, _etcd) = start_tls("etcd", dir.path(), &flags, &ctl);

    let want = transcript(&e, &ctl);
    let got = transcript(&k, &ctl);
    common::assert_same_answers(&want, &got);

    // Refused, by both, for the same reasons; kvd's words say which.
    let refused = |ep: &str, flags: &[String]| {
        let (code, out, err) = run(
            ep,
            flags,
            &["get", "k", "--dial-timeout=2s", "--command-timeout=3s"],
        );
        assert_ne!(code, 0, "{ep} answered: {out}");
        err
    };
    // No client certificate.
    let no_cert = vec![format!("--cacert={}", ca.cert.display())];
    refused(&e.endpoint(), &no_cert);
    let err = refused(&k.endpoint(), &no_cert);
    assert!(err.contains("certificate required"), "{err}");
    // A certificate of a CA the cluster does not trust.
    let foreign = stranger.ctl_flags(&ca.cert);
    refused(&e.endpoint(), &foreign);
    let err = refused(&k.endpoint(), &foreign);
    assert!(err.contains("unknown certificate authority"), "{err}");
    // A client that does not trust the server's CA.
    let distrust = vec![format!("--cacert={}", other.cert.display())];
    refused(&e.endpoint(), &distrust);
    let err = refused(&k.endpoint(), &distrust);
    assert!(
        err.contains("certificate signed by unknown authority"),
        "{err}"
    );
    // A plaintext client on the TLS port: told to use TLS.
    let plain = |a: &Addrs| a.client.replacen("https://", "http://", 1);
    refused(&plain(&e), &[]);
    let err = refused(&plain(&k), &[]);
    assert!(err.contains("requires TLS"), "{err}");
    // And the server goes on.
    let (code, out, _) = run(&k.endpoint(), &ctl, &["put", "after", "ok"]);
    assert_eq!((code, out.trim()), (0, "OK"));
}

/// etcd closes such a connection ("authentication handshake failed: EOF"); kvd answers as Go's
/// HTTP server answers anything that is not HTTP, so the client says what went wrong.
#[test]
fn a_tls_client_on_a_plaintext_port_is_told_it_is_not_tls() {
    let dir = tempfile::tempdir().unwrap();
    let mut ca = Ca::new(&dir.path().join("pki"), "cluster");
    let alice = ca.issue("alice", "alice");
    let (k, _kvd) = Proc::single_kvd(dir.path());
    let (e, _etcd) = Proc::single_etcd(dir.path());
    let tls = alice.ctl_flags(&ca.cert);
    let answer = |a: &Addrs| {
        let ep = format!("https://{}", a.client_hostport());
        let (code, out, err) = run(
            &ep,
            &tls,
            &["get", "k", "--dial-timeout=2s", "--command-timeout=3s"],
        );
        assert_ne!(code, 0, "{out}");
        err
    };
    let (etcd_err, got) = (answer(&e), answer(&k));
    assert!(etcd_err.contains("handshake failed"), "etcd: {etcd_err}");
    assert!(
        got.contains("tls: first record does not look like a TLS handshake"),
        "kvd: {got}"
    );
    // The plaintext port still serves.
    assert_eq!(
        common::ctl_ok(&k.endpoint(), &["put", "a", "b"]).trim(),
        "OK"
    );
}

/// A client of `addr` trusting `ca`, presenting `client` (if any), offering `alpn`, limited to
/// `versions` and, when given, the TLS 1.2 `suites`.
fn tls_client(
    ca: &Path,
    client: Option<&Pair>,
    versions: &[&'static rustls::SupportedProtocolVersion],
    suites: Option<&[rustls::SupportedCipherSuite]>,
) -> Arc<rustls::ClientConfig> {
    use rustls_pki_types::pem::PemObject;
    let mut provider = rustls::crypto::ring::default_provider();
    if let Some(s) = suites {
        provider.cipher_suites = s.to_vec();
    }
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let b = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots);
    let mut cfg = match client {
        Some(p) => {
            let chain = rustls_pki_types::CertificateDer::pem_file_iter(&p.cert)
                .unwrap()
                .map(Result::unwrap)
                .collect();
            let key = rustls_pki_types::PrivateKeyDer::from_pem_file(&p.key).unwrap();
            b.with_client_auth_cert(chain, key).unwrap()
        }
        None => b.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(cfg)
}

/// Connects to `hostport` with `cfg` and sends HTTP/2's preface: the serial of the certificate
/// the server presented once it answers with its SETTINGS, or why not (the handshake failed,
/// an alert came — with TLS 1.3 the server checks the client's certificate after the client
/// is done — or the server closed the connection).
fn handshake(hostport: &str, cfg: Arc<rustls::ClientConfig>) -> Result<u64, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(hostport)
            .await
            .map_err(|e| e.to_string())?;
        let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut s = tokio_rustls::TlsConnector::from(cfg)
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        let cert = s.get_ref().1.peer_certificates().unwrap()[0].clone();
        let serial = serial_of(&cert);
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
            .await
            .map_err(|e| e.to_string())?;
        let mut head = [0u8; 9];
        match tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut head)).await {
            Err(_) => Err("no answer to the preface".to_string()),
            Ok(Err(e)) => Err(e.to_string()),
            Ok(Ok(_)) if head[3] == 4 => Ok(serial),
            Ok(Ok(_)) => Err(format!("not a SETTINGS frame: {head:?}")),
        }
    })
}

fn serial_of(cert: &rustls_pki_types::CertificateDer<'_>) -> u64 {
    use x509_cert::der::Decode;
    let c = x509_cert::Certificate::from_der(cert.as_ref()).unwrap();
    c.tbs_certificate
        .serial_number
        .as_bytes()
        .iter()
        .fold(0u64, |n, b| n << 8 | u64::from(*b))
}

const BOTH: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

#[test]
fn a_certificate_renewed_on_disk_is_served_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut ca = Ca::new(&dir.path().join("pki"), "cluster");
    let server = ca.issue("server", "server");
    let alice = ca.issue("alice", "alice");
    let ctl = alice.ctl_flags(&ca.cert);
    let (k, kvd) = start_tls("kvd", dir.path(), &client_tls(&server, &ca.cert), &ctl);
    let ca_file = ca.cert.clone();
    let client = || tls_client(&ca_file, Some(&alice), BOTH, None);
    assert_eq!(
        handshake(&k.client_hostport(), client()).unwrap(),
        server.serial
    );
    // Renewed: a new pair written over the old files (as cert-manager or a script would).
    let renewed = ca.issue("renewed", "server");
    std::fs::copy(&renewed.key, &server.key).unwrap();
    std::fs::copy(&renewed.cert, &server.cert).unwrap();
    kvd.wait_for("the renewed certificate", 10, || {
        handshake(&k.client_hostport(), client()).is_ok_and(|s| s == renewed.serial)
    });
    let (code, out, err) = run(&k.endpoint(), &ctl, &["put", "k", "v"]);
    assert_eq!(code, 0, "{out}{err}");
    // A half-written renewal (a key that does not match the certificate) is not taken: the
    // last good pair is still served.
    let third = ca.issue("third", "server");
    std::fs::copy(&third.cert, &server.cert).unwrap();
    assert_eq!(
        handshake(&k.client_hostport(), client()).unwrap(),
        renewed.serial
    );
    std::fs::copy(&third.key, &server.key).unwrap();
    assert_eq!(
        handshake(&k.client_hostport(), client()).unwrap(),
        third.serial
    );
}

#[test]
fn a_revoked_client_certificate_is_refused_and_the_crl_is_read_again_when_renewed() {
    let dir = tempfile::tempdir().unwrap();
    let mut ca = Ca::new(&dir.path().join("pki"), "cluster");
    let server = ca.issue("server", "server");
    let alice = ca.issue("alice", "alice");
    let bob = ca.issue("bob", "bob");
    let crl = ca.crl("crl", &[&alice]);
    let mut flags = client_tls(&server, &ca.cert);
    flags.push(format!("--client-crl-file={}", crl.display()));
    let (k, _kvd) = start_tls("kvd", dir.path(), &flags, &bob.ctl_flags(&ca.cert));
    let get = |p: &Pair| {
        run(
            &k.endpoint(),
            &p.ctl_flags(&ca.cert),
            &["get", "k", "--dial-timeout=2s", "--command-timeout=3s"],
        )
    };
    let (code, _, err) = get(&alice);
    assert_ne!(code, 0);
    assert!(err.contains("revoked"), "{err}");
    assert_eq!(get(&bob).0, 0);
    // A new CRL on disk revokes bob too, without a restart.
    let newer = ca.crl("crl-2", &[&alice, &bob]);
    std::fs::copy(&newer, &crl).unwrap();
    common::wait_for("bob's revocation", 10, || get(&bob).0 != 0);
    let (_, _, err) = get(&bob);
    assert!(err.contains("revoked"), "{err}");
}

#[test]
fn tls_versions_and_cipher_suites_are_etcds_flags() {
    use rustls::crypto::ring::cipher_suite as cs;
    let dir = tempfile::tempdir().unwrap();
    let mut ca = Ca::new(&dir.path().join("pki"), "cluster");
    let server = ca.issue("server", "server");
    let alice = ca.issue("alice", "alice");
    let mut flags = client_tls(&server, &ca.cert);
    flags.extend([
        "--tls-max-version=TLS1.2".to_string(),
        "--cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384".to_string(),
    ]);
    let (k, _kvd) = start_tls("kvd", dir.path(), &flags, &alice.ctl_flags(&ca.cert));
    let hs = |versions, suites: Option<&[rustls::SupportedCipherSuite]>| {
        handshake(
            &k.client_hostport(),
            tls_client(&ca.cert, Some(&alice), versions, suites),
        )
    };
    const TLS13: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];
    const TLS12: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS12];
    assert!(hs(TLS13, None).is_err(), "TLS 1.3 taken");
    let aes128 = [cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256];
    assert!(
        hs(TLS12, Some(&aes128)).is_err(),
        "a suite not listed taken"
    );
    let aes256 = [cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384];
    assert!(hs(TLS12, Some(&aes256)).is_ok());

    // Bad combinations stop kvd with etcd's words (or, for what rustls lacks, kvd's).
    let refused = |extra: &[&str]| {
        let m = Addrs::new("bad");
        let client = format!("--listen-client-urls={}", m.client);
        let urls = [client.as_str(), "--listen-peer-urls", &m.peer];
        let urls = if extra.iter().any(|a| a.starts_with("--listen-client-urls")) {
            &urls[1..]
        } else {
            &urls[..]
        };
        let out = std::process::Command::new(common::kvd_bin())
            .args(["--data-dir", dir.path().join("bad").to_str().unwrap()])
            .args(urls)
            .args(extra)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let e = refused(&[
        "--tls-min-version=TLS1.3",
        "--cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    ]);
    assert!(
        e.contains("cipher suites cannot be configured when only TLS1.3 is enabled"),
        "{e}"
    );
    let e = refused(&["--tls-min-version=TLS1.3", "--tls-max-version=TLS1.2"]);
    assert!(e.contains("is greater than max version"), "{e}");
    let e = refused(&["--cipher-suites=TLS_RSA_WITH_AES_128_CBC_SHA"]);
    assert!(
        e.contains("TLS_RSA_WITH_AES_128_CBC_SHA") && e.contains("not supported"),
        "{e}"
    );
    let e = refused(&["--listen-client-urls=https://127.0.0.1:1"]);
    assert!(
        e.contains("--cert-file, --key-file") && e.contains("must be provided"),
        "{e}"
    );
}

#[test]
fn auto_tls_serves_a_self_signed_certificate_kept_in_the_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let insecure = vec!["--insecure-skip-tls-verify".to_string()];
    let (k, mut kvd) = start_tls("kvd", dir.path(), &["--auto-tls".to_string()], &insecure);
    let (code, out, err) = run(&k.endpoint(), &insecure, &["put", "k", "v"]);
    assert_eq!(code, 0, "{out}{err}");
    let fixtures = dir.path().join("kvd").join("fixtures").join("client");
    let cert = std::fs::read(fixtures.join("cert.pem")).unwrap();
    assert!(fixtures.join("key.pem").exists());
    // Without skipping verification, the self-signed certificate is not trusted.
    let (code, _, err) = run(
        &k.endpoint(),
        &[],
        &["get", "k", "--dial-timeout=2s", "--command-timeout=3s"],
    );
    assert_ne!(code, 0);
    assert!(err.contains("certificate"), "{err}");
    // A restart keeps the same certificate.
    kvd.kill();
    let mut again = Proc::kvd(
        &k,
        &dir.path().join("kvd"),
        std::slice::from_ref(&k),
        "new",
        &["--auto-tls"],
    );
    again.ctl_flags = insecure;
    again.wait_ready();
    assert_eq!(std::fs::read(fixtures.join("cert.pem")).unwrap(), cert);
}

/// An HTTP/1.1 GET of `path` at `url` (http or https with `cfg`): the status code.
fn get_status(url: &str, path: &str, cfg: Option<Arc<rustls::ClientConfig>>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let hostport = url.split_once("://").unwrap().1.to_string();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(&hostport).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\n\r\n");
        let mut resp = Vec::new();
        match cfg {
            None => {
                let mut s = tcp;
                s.write_all(req.as_bytes()).await.unwrap();
                s.read_to_end(&mut resp).await.unwrap();
            }
            Some(cfg) => {
                let mut cfg = (*cfg).clone();
                cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
                let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
                let mut s = tokio_rustls::TlsConnector::from(Arc::new(cfg))
                    .connect(name, tcp)
                    .await
                    .unwrap();
                s.write_all(req.as_bytes()).await.unwrap();
                let _ = s.read_to_end(&mut resp).await;
            }
        }
        let text = String::from_utf8_lossy(&resp);
        text.split_whitespace().nth(1).unwrap().parse().unwrap()
    })
}

#[test]
fn http_and_metrics_urls_of_their_own_split_the_traffic_as_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let mut ca = Ca::new(&dir.path().join("pki"), "cluster");
    let server = ca.issue("server", "server");
    let alice = ca.issue("alice", "alice");
    let http_url = format!("https://127.0.0.1:{}", common::free_port());
    let metrics_url = format!("http://127.0.0.1:{}", common::free_port());
    let mut flags = client_tls(&server, &ca.cert);
    flags.push(format!("--listen-client-http-urls={http_url}"));
    flags.push(format!("--listen-metrics-urls={metrics_url}"));
    let ctl = alice.ctl_flags(&ca.cert);
    let (k, _kvd) = start_tls("kvd", dir.path(), &flags, &ctl);
    let tls = || Some(tls_client(&ca.cert, Some(&alice), BOTH, None));
    // gRPC on the client URL, HTTP on the HTTP URL, each not on the other.
    assert_eq!(run(&k.endpoint(), &ctl, &["put", "k", "v"]).0, 0);
    assert_eq!(get_status(&http_url, "/health", tls()), 200);
    assert_eq!(get_status(&http_url, "/metrics", tls()), 200);
    assert_eq!(get_status(&k.client, "/health", tls()), 404);
    let (code, _, err) = run(&http_url, &ctl, &["get", "k", "--command-timeout=3s"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("Unimplemented") || err.contains("unknown service"),
        "{err}"
    );
    // Metrics and health on the metrics URL, in the clear.
    assert_eq!(get_status(&metrics_url, "/metrics", None), 200);
    assert_eq!(get_status(&metrics_url, "/health", None), 200);
    assert_eq!(get_status(&metrics_url, "/v3/kv/range", None), 404);
}

/// Three kvd members over peer TLS (and client TLS) signed by `ca`, each with its own
/// certificate, `extra` flags on every member.
fn tls_cluster(dir: &Path, ca: &mut Ca, extra: &[&str]) -> (Vec<Addrs>, Vec<Proc>, Vec<String>) {
    let alice = ca.issue("alice", "alice");
    let ctl = alice.ctl_flags(&ca.cert);
    let ms: Vec<Addrs> = ["m1", "m2", "m3"]
        .iter()
        .map(|n| Addrs::new_tls(n))
        .collect();
    let mut procs: Vec<Proc> = ms
        .iter()
        .map(|m| {
            let pair = ca.issue(&m.name, "member");
            let mut flags = client_tls(&pair, &ca.cert);
            flags.extend(peer_tls(&pair, &ca.cert));
            flags.extend(extra.iter().map(|s| s.to_string()));
            let mut p = Proc::kvd(m, &dir.join(&m.name), &ms, "new", &strs(&flags));
            p.ctl_flags = ctl.clone();
            p
        })
        .collect();
    for p in &mut procs {
        p.wait_ready();
    }
    (ms, procs, ctl)
}

#[test]
fn a_cluster_over_peer_tls_refuses_a_member_with_a_certificate_of_another_ca() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    let mut ca = Ca::new(&pki, "cluster");
    let (ms, procs, ctl) = tls_cluster(dir.path(), &mut ca, &["--peer-cert-allowed-cn=member"]);
    let eps: Vec<String> = ms.iter().map(Addrs::endpoint).collect();
    // Raft's messages go over TLS in framed streams, not through gRPC.
    common::wait_for("every member's framed streams to its peers", 20, || {
        procs.iter().all(|p| {
            let log = std::fs::read_to_string(&p.log).unwrap_or_default();
            log.matches("peer became active").count() >= 2
                && log.contains(r#""stream":"framed""#)
                && !log.contains(r#""stream":"grpc""#)
        })
    });
    // Writes replicate; a follower forwards lease keep-alives to the leader over peer TLS.
    assert_eq!(run(&eps[0], &ctl, &["put", "k", "v"]).0, 0);
    for ep in &eps {
        let (code, out, err) = run(
            ep,
            &ctl,
            &["get", "k", "--consistency=s", "--print-value-only"],
        );
        assert_eq!((code, out.trim()), (0, "v"), "{err}");
        let (_, grant, _) = run(ep, &ctl, &["lease", "grant", "30"]);
        let id = grant.split_whitespace().nth(1).unwrap().to_string();
        let (code, out, err) = run(ep, &ctl, &["lease", "keep-alive", "--once", &id]);
        assert_eq!(code, 0, "{out}{err}");
    }

    // A would-be member with a certificate of another CA: the peer port refuses it.
    let mut other = Ca::new(&pki, "other");
    let intruder = other.issue("intruder", "member");
    let peer = ms[0].peer_hostport();
    let ca_file = ca.cert.clone();
    let from = |p: &Pair| handshake(&peer, tls_client(&ca_file, Some(p), BOTH, None));
    let err = from(&intruder).unwrap_err();
    assert!(err.contains("UnknownCA"), "{err}");
    // …and so does one of the right CA whose CN is not the allowed one.
    let wrong_cn = ca.issue("wrong-cn", "not-a-member");
    let err = from(&wrong_cn).unwrap_err();
    assert!(err.contains("alert"), "{err}");
    let right = ca.issue("right", "member");
    assert!(from(&right).is_ok(), "an allowed peer was refused");
    // A peer whose certificate names another address than the one it connects from.
    let elsewhere = ca.issue_with("elsewhere", "member", &["10.9.9.9"]);
    assert!(
        from(&elsewhere).is_err(),
        "a certificate for another host was served"
    );

    // A real member with the foreign certificate, added as a learner, never catches up.
    let m4 = Addrs::new_tls("m4");
    let add = [
        "member",
        "add",
        "m4",
        "--learner",
        &format!("--peer-urls={}", m4.peer),
    ];
    // Refused as an "unhealthy cluster" until the leader has heard from every voter for 5 s.
    procs[0].wait_for("the learner's addition", 20, || {
        run(&eps[0], &ctl, &add).0 == 0
    });
    let mut all = ms.clone();
    all.push(m4.clone());
    let mut flags = client_tls(&intruder, &other.cert);
    flags.extend(peer_tls(&intruder, &other.cert));
    let p4 = Proc::kvd(&m4, &dir.path().join("m4"), &all, "existing", &strs(&flags));
    common::wait_for("a member to log the refused peer", 30, || {
        procs.iter().any(|p| {
            let log = std::fs::read_to_string(&p.log).unwrap_or_default();
            log.contains("peer TLS handshake failed") || log.contains("certificate")
        })
    });
    let m4_status = run(
        &m4.endpoint(),
        &intruder.ctl_flags(&other.cert),
        &["get", "k", "--consistency=s", "--command-timeout=3s"],
    );
    assert!(
        !m4_status.1.contains('v'),
        "the foreign member got the data: {m4_status:?}\n{}",
        p4.log_tail()
    );
    drop(p4);
    let (_, list, _) = run(&eps[0], &ctl, &["member", "list"]);
    let m4_id = list
        .lines()
        .find(|l| l.contains(&m4.peer))
        .and_then(|l| l.split(',').next())
        .unwrap()
        .to_string();
    assert_eq!(run(&eps[0], &ctl, &["member", "remove", &m4_id]).0, 0);

    // One with a certificate of the cluster's CA joins over peer TLS and catches up.
    let m5 = Addrs::new_tls("m5");
    let add = [
        "member",
        "add",
        "m5",
        "--learner",
        &format!("--peer-urls={}", m5.peer),
    ];
    procs[0].wait_for("the learner's addition", 20, || {
        run(&eps[0], &ctl, &add).0 == 0
    });
    let mut all = ms.clone();
    all.push(m5.clone());
    let pair = ca.issue("m5", "member");
    let mut flags = client_tls(&pair, &ca.cert);
    flags.extend(peer_tls(&pair, &ca.cert));
    flags.push("--peer-cert-allowed-cn=member".into());
    let p5 = Proc::kvd(&m5, &dir.path().join("m5"), &all, "existing", &strs(&flags));
    p5.wait_for("m5 to catch up over peer TLS", 30, || {
        let get = ["get", "k", "--consistency=s", "--print-value-only"];
        run(&m5.endpoint(), &ctl, &get).1.trim() == "v"
    });
    drop(procs);
}

#[test]
fn a_peer_certificate_renewed_on_disk_is_served_to_new_peer_connections() {
    let dir = tempfile::tempdir().unwrap();
    let mut ca = Ca::new(&dir.path().join("pki"), "cluster");
    let (ms, procs, ctl) = tls_cluster(dir.path(), &mut ca, &[]);
    let peer = ms[0].peer_hostport();
    let me = ca.issue("prober", "member");
    let ca_file = ca.cert.clone();
    let served = || handshake(&peer, tls_client(&ca_file, Some(&me), BOTH, None));
    let before = served().unwrap();
    // m1's pair is rewritten in place (its files are dir/pki/m1.pem and m1-key.pem).
    let renewed = ca.issue("m1-renewed", "member");
    let pki = dir.path().join("pki");
    std::fs::copy(&renewed.key, pki.join("m1-key.pem")).unwrap();
    std::fs::copy(&renewed.cert, pki.join("m1.pem")).unwrap();
    procs[0].wait_for("m1's renewed peer certificate", 10, || {
        served().is_ok_and(|s| s == renewed.serial)
    });
    assert_ne!(before, renewed.serial);
    // The cluster keeps replicating through m1.
    let eps: Vec<String> = ms.iter().map(Addrs::endpoint).collect();
    assert_eq!(run(&eps[0], &ctl, &["put", "after", "renewal"]).0, 0);
    for ep in &eps {
        let (_, out, _) = run(ep, &ctl, &["get", "after", "--print-value-only"]);
        assert_eq!(out.trim(), "renewal");
    }
}

#[test]
fn a_snapshot_saved_over_tls_restores_with_etcdctls_tls_flags_given() {
    let dir = tempfile::tempdir().unwrap();
    let mut ca = Ca::new(&dir.path().join("pki"), "cluster");
    let server = ca.issue("server", "server");
    let alice = ca.issue("alice", "alice");
    let (k, _kvd) = Proc::single_kvd_tls(dir.path(), &server, &ca.cert, &alice);
    let ctl = alice.ctl_flags(&ca.cert);
    assert_eq!(run(&k.endpoint(), &ctl, &["put", "saved", "over-tls"]).0, 0);
    let file = dir.path().join("snap.db");
    let (code, out, err) = run(
        &k.endpoint(),
        &ctl,
        &["snapshot", "save", file.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{out}{err}");
    // etcdctl's global flags are taken (a restore contacts no server).
    let r = Addrs::new("restored");
    let data = dir.path().join("restored");
    let out = std::process::Command::new(common::kvd_bin())
        .args(["snapshot", "restore"])
        .arg(&file)
        .args(strs(&ctl))
        .arg("--data-dir")
        .arg(&data)
        .args(["--name", &r.name])
        .args(["--initial-cluster", &format!("{}={}", r.name, r.peer)])
        .args(["--initial-advertise-peer-urls", &r.peer])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut p = Proc::kvd(&r, &data, std::slice::from_ref(&r), "new", &[]);
    p.wait_ready();
    let got = common::ctl_ok(&r.endpoint(), &["get", "saved", "--print-value-only"]);
    assert_eq!(got.trim(), "over-tls");
}
