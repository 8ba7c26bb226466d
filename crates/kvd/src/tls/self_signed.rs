//! etcd's `--auto-tls` and `--peer-auto-tls`: a self-signed certificate for the hosts a port
//! listens on, made once and kept in the data directory (`fixtures/client`, `fixtures/peer`).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};

/// The certificate and key files in `dir`, made for `hosts` (`host:port`, as listen URLs give
/// them) and valid for `years` if they do not exist yet.
pub fn self_signed(dir: &Path, hosts: &[String], years: u32) -> Result<(PathBuf, PathBuf), String> {
    if years == 0 {
        return Err("--self-signed-cert-validity must be at least 1 (year)".into());
    }
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    if cert.exists() && key.exists() {
        return Ok((cert, key));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, "etcd");
    params.distinguished_name = name;
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now;
    params.not_after = now + time::Duration::days(365 * i64::from(years));
    params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
        KeyUsagePurpose::CrlSign,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    for h in hosts {
        let host = match h.rsplit_once(':') {
            Some((host, _port)) => host.trim_start_matches('[').trim_end_matches(']'),
            None => h.as_str(),
        };
        let san = match host.parse::<std::net::IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(
                host.to_string()
                    .try_into()
                    .map_err(|e| format!("--auto-tls: host {host:?}: {e}"))?,
            ),
        };
        if !params.subject_alt_names.contains(&san) {
            params.subject_alt_names.push(san);
        }
    }
    // ECDSA P-256 (etcd uses P-521, which ring does not sign with).
    let pair = KeyPair::generate().map_err(|e| format!("--auto-tls: key: {e}"))?;
    let signed = params
        .self_signed(&pair)
        .map_err(|e| format!("--auto-tls: certificate: {e}"))?;
    tracing::warn!(dir = %dir.display(), not_after = %params.not_after, "automatically generated a self-signed certificate");
    write(&cert, signed.pem().as_bytes(), 0o644)?;
    write(&key, pair.serialize_pem().as_bytes(), 0o600)?;
    Ok((cert, key))
}

fn write(path: &Path, bytes: &[u8], mode: u32) -> Result<(), String> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("{}: {e}", path.display()))
}
