//! `kvd grpc-proxy start`: the `leasing-proxy` crate on a listener of its own, with etcd's
//! grpc-proxy flags: TLS to the cluster (`--cacert`, `--cert`, `--key`) and to clients
//! (`--cert-file`, `--key-file`, `--trusted-ca-file`, `--auto-tls`), served by the same
//! connection code as a member's client port (grpc-wire for HTTP/2, hyper for HTTP/1.1).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::client_port::{self, Port, Traffic};
use crate::config::{self, ProxyFlags};
use crate::{init_logging, listen, tls};

type Result<T, E = String> = std::result::Result<T, E>;

fn duration(flag: &str, v: &str) -> Result<Duration> {
    rpc::parse_duration(v).map_err(|e| format!("--{flag}: {e}"))
}

fn path(flag: &str) -> Option<PathBuf> {
    (!flag.is_empty()).then(|| PathBuf::from(flag))
}

/// The cluster's endpoints as URLs: etcd's proxy takes `host:port`, with TLS when any of the
/// client TLS flags is given.
fn endpoint_urls(f: &ProxyFlags) -> Result<Vec<String>> {
    let tls = !f.cacert.is_empty()
        || !f.cert.is_empty()
        || !f.key.is_empty()
        || f.insecure_skip_tls_verify;
    let urls: Vec<String> = config::urls(&f.endpoints)
        .into_iter()
        .map(|e| match e.split_once("://") {
            Some(_) => e,
            None if tls => format!("https://{e}"),
            None => format!("http://{e}"),
        })
        .collect();
    if urls.is_empty() {
        return Err("--endpoints: no endpoint given".into());
    }
    Ok(urls)
}

/// How the proxy dials the cluster.
fn connect(f: &ProxyFlags, policy: &tls::Policy) -> Result<leasing_proxy::Connect> {
    let side = tls::Side {
        cert_file: path(&f.cert),
        key_file: path(&f.key),
        trusted_ca_file: path(&f.cacert),
        // etcd's --insecure-skip-tls-verify: nothing of the cluster's certificate is checked.
        self_signed: f.insecure_skip_tls_verify,
        ..tls::Side::default()
    };
    side.check("the proxy's TLS to the cluster (--cert, --key)")?;
    // A cluster member that fails is redialed after grpc-go's back-off, as etcd's proxy does.
    let dialer = consensus::Dialer::with_tls(tls::client_config(&side, policy, tls::ALPN_H2)?)
        .with_backoff();
    let dial_timeout = duration("dial-timeout", &f.dial_timeout)?;
    let keepalive = duration("dial-keepalive-time", &f.dial_keepalive_time)?;
    let keepalive_timeout = duration("dial-keepalive-timeout", &f.dial_keepalive_timeout)?;
    let while_idle = f.permit_without_stream;
    let streams = dialer.clone();
    Ok(leasing_proxy::Connect {
        channel: Arc::new(move |url: &str| {
            dialer
                .channel(url, |ep| {
                    let ep = ep.connect_timeout(dial_timeout).tcp_nodelay(true);
                    if keepalive.is_zero() {
                        ep
                    } else {
                        ep.http2_keep_alive_interval(keepalive)
                            .keep_alive_timeout(keepalive_timeout)
                            .keep_alive_while_idle(while_idle)
                    }
                })
                .map_err(|e| e.to_string())
        }),
        dial: Arc::new(move |url: String| {
            let d = streams.clone();
            Box::pin(async move {
                let s = d.stream(&url).await?;
                Ok(Box::new(s) as Box<dyn leasing_proxy::Io>)
            })
        }),
    })
}

/// The listener's TLS, if any (`--cert-file`/`--key-file`, or `--auto-tls`).
fn listen_tls(f: &ProxyFlags, policy: &tls::Policy) -> Result<Option<Arc<rustls::ServerConfig>>> {
    let mut side = tls::Side {
        cert_file: path(&f.cert_file),
        key_file: path(&f.key_file),
        trusted_ca_file: path(&f.trusted_ca_file),
        crl_file: path(&f.client_crl_file),
        ..tls::Side::default()
    };
    if f.auto_tls && !side.has_pair() {
        if f.self_signed_cert_validity == 0 {
            return Err("--self-signed-cert-validity: must be more than 0".into());
        }
        let host = f
            .listen_addr
            .rsplit_once(':')
            .map_or(f.listen_addr.clone(), |(h, _)| h.to_string());
        let (c, k) = tls::self_signed(
            &Path::new(&f.data_dir).join("fixtures").join("proxy"),
            &[host],
            f.self_signed_cert_validity,
        )?;
        (side.cert_file, side.key_file) = (Some(c), Some(k));
    }
    side.check("the proxy's TLS to clients (--cert-file, --key-file)")?;
    if !side.has_pair() {
        if side.trusted_ca_file.is_some() {
            return Err("--trusted-ca-file needs --cert-file and --key-file".into());
        }
        return Ok(None);
    }
    Ok(Some(tls::server_config(&side, policy, tls::ALPN_H2_HTTP1)?))
}

/// The proxy's settings from the flags.
fn proxy_config(f: &ProxyFlags) -> Result<leasing_proxy::Config> {
    let leasing = (!f.experimental_leasing_prefix.is_empty()).then(|| {
        Ok::<_, String>(leasing_proxy::LeasingOptions {
            prefix: f.experimental_leasing_prefix.as_bytes().to_vec(),
            shared: f.leasing_shared,
            cache_keys: f.leasing_cache_keys,
            cache_bytes: f.leasing_cache_bytes,
            backoff: duration("leasing-revoke-backoff", &f.leasing_revoke_backoff)?,
        })
    });
    if f.leasing_shared && f.experimental_leasing_prefix.is_empty() {
        return Err("--leasing-shared needs --experimental-leasing-prefix".into());
    }
    if !(0.0..0.5).contains(&f.leasing_clock_drift) {
        return Err(format!(
            "--leasing-clock-drift {}: want a share of the TTL from 0 to 0.5",
            f.leasing_clock_drift
        ));
    }
    let ttl = duration("leasing-ttl", &f.leasing_ttl)?;
    if ttl < Duration::from_secs(1) {
        return Err("--leasing-ttl: at least 1s".into());
    }
    Ok(leasing_proxy::Config {
        endpoints: endpoint_urls(f)?,
        namespace: f.namespace.as_bytes().to_vec(),
        advertise_client_url: f.advertise_client_url.clone(),
        max_send_bytes: f.max_send_bytes,
        max_recv_bytes: f.max_recv_bytes,
        leasing: leasing.transpose()?,
        session_ttl: ttl,
        clock_drift: f.leasing_clock_drift,
        dial_timeout: duration("dial-timeout", &f.dial_timeout)?,
    })
}

/// The proxy's HTTP/2 settings (etcd's gRPC server flags, as a member's).
fn http2_config(f: &ProxyFlags) -> Result<grpc_wire::Config> {
    crate::plan::http2_settings(
        &f.grpc_keepalive_min_time,
        &f.grpc_keepalive_interval,
        &f.grpc_keepalive_timeout,
        f.max_concurrent_streams,
        (f.max_connection_buffer_bytes, f.max_client_buffer_bytes),
    )
}

/// Runs the proxy until SIGTERM or SIGINT.
/// `--listen-addr`: etcd's `host:port`, or a unix socket (`unix://path`; kvd's, etcd's proxy
/// listens on TCP only), over TLS when the proxy has a certificate.
fn listen_addr(flag: &str, tls: bool) -> Result<listen::ListenUrl> {
    let addr = match flag.split_once("://") {
        None => listen::Addr::Tcp(flag.to_string()),
        Some(("unix" | "unixs", path)) if !path.is_empty() => listen::Addr::Unix(path.into()),
        Some(_) => {
            return Err(format!(
                "--listen-addr {flag:?}: want host:port or unix://path"
            ))
        }
    };
    Ok(listen::ListenUrl { addr, tls })
}

pub fn run(f: &ProxyFlags) -> Result<()> {
    let level = if f.debug {
        "debug"
    } else {
        f.log_level.as_str()
    };
    init_logging(level, &f.log_format)?;
    let policy = tls::Policy::parse(
        &f.tls_min_version,
        &f.tls_max_version,
        &f.listen_cipher_suites,
    )?;
    let cfg = proxy_config(f)?;
    let connect = connect(f, &policy)?;
    let server_tls = listen_tls(f, &policy)?;
    let http2 = http2_config(f)?;
    let metrics_listen = if f.metrics_addr.is_empty() {
        Vec::new()
    } else {
        listen::parse(std::slice::from_ref(&f.metrics_addr), "--metrics-addr")?
    };
    if metrics_listen.iter().any(|u| u.tls) && server_tls.is_none() {
        return Err("--metrics-addr https://: needs --cert-file and --key-file".into());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(crate::runtime_workers())
        .enable_all()
        .thread_name("kvd-proxy")
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    rt.block_on(async {
        let tls_on = server_tls.is_some();
        let listen = listen::bind(&[listen_addr(&f.listen_addr, tls_on)?], "--listen-addr").await?;
        let metrics = listen::bind(&metrics_listen, "--metrics-addr").await?;
        let proxy = leasing_proxy::Proxy::start(cfg.clone(), connect)
            .await
            .map_err(|e| e.to_string())?;
        let http2 = Arc::new(grpc_wire::Config {
            guard: proxy.metrics().client_guard.clone(),
            calls: Some(proxy.metrics().grpc_calls.clone()),
            ..http2
        });
        let port = Port {
            router: proxy.router(),
            grpc_router: proxy.router(),
            http_router: proxy.metrics_router(),
            metrics: proxy.metrics_router(),
            unary: proxy.unary(),
            config: http2,
        };
        let acceptor = server_tls.map(listen::acceptor);
        let (stop_tx, stop_rx) = watch::channel(false);
        let servers = client_port::serve_all(
            &tokio::runtime::Handle::current(),
            vec![(listen, Traffic::Both), (metrics, Traffic::Metrics)],
            &port,
            acceptor,
            &stop_rx,
        );
        tracing::info!(
            endpoints = ?cfg.endpoints,
            leasing = %f.experimental_leasing_prefix,
            shared = f.leasing_shared,
            "started gRPC proxy"
        );
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
        let why = tokio::select! {
            _ = tokio::signal::ctrl_c() => "SIGINT",
            _ = term.recv() => "SIGTERM",
        };
        tracing::info!("received {why}: shutting down");
        let _ = stop_tx.send(true);
        proxy.shutdown().await;
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            for s in servers {
                let _ = s.await;
            }
        })
        .await;
        tracing::info!("stopped");
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn flags(args: &[&str]) -> ProxyFlags {
        let mut all = vec!["kvd", "grpc-proxy", "start"];
        all.extend_from_slice(args);
        match crate::config::Cli::parse_from(all).cmd {
            Some(crate::config::Cmd::GrpcProxy {
                cmd: crate::config::ProxyCmd::Start(f),
            }) => *f,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn etcds_flags_make_the_proxys_settings() {
        let f = flags(&[
            "--endpoints=127.0.0.1:2379,https://b:2379",
            "--experimental-leasing-prefix=_l/",
            "--namespace=ns/",
            "--leasing-ttl=10s",
        ]);
        let c = proxy_config(&f).unwrap();
        assert_eq!(c.endpoints, ["http://127.0.0.1:2379", "https://b:2379"]);
        assert_eq!(c.namespace, b"ns/");
        assert_eq!(c.session_ttl, Duration::from_secs(10));
        let l = c.leasing.unwrap();
        assert_eq!(l.prefix, b"_l/");
        assert!(!l.shared);
        assert_eq!(c.max_send_bytes, 1_572_864);
        // A TLS flag makes bare endpoints https.
        let f = flags(&["--cacert=ca.pem"]);
        assert_eq!(endpoint_urls(&f).unwrap(), ["https://127.0.0.1:2379"]);
        assert!(proxy_config(&flags(&["--leasing-shared"])).is_err());
        assert!(proxy_config(&flags(&[
            "--leasing-clock-drift=0.7",
            "--experimental-leasing-prefix=p"
        ]))
        .is_err());
        assert!(proxy_config(&flags(&[
            "--leasing-ttl=0s",
            "--experimental-leasing-prefix=p"
        ]))
        .is_err());
    }
}
