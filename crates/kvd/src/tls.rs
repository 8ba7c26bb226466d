//! TLS on the client and peer ports, from etcd's flags: rustls configurations whose
//! certificate and key are read again when renewed on disk (etcd reads them at every
//! handshake), client certificates checked against the trusted CA, a CRL and the allowed CNs
//! or hostnames, etcd's `--auto-tls` certificates, and the TLS versions and TLS 1.2 cipher
//! suites allowed.
//!
//! The crypto provider is *ring* (see the workspace's Cargo.toml).

mod files;
mod self_signed;
mod verify;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, ServerConfig, SupportedCipherSuite, SupportedProtocolVersion};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer};

pub use files::CertFiles;
pub use self_signed::self_signed;
pub use verify::{check_peer_san, common_name};

type Result<T, E = String> = std::result::Result<T, E>;

/// The ALPN protocols of a port that serves gRPC and HTTP/1.1 (etcd's client port).
pub const ALPN_H2_HTTP1: &[&[u8]] = &[b"h2", b"http/1.1"];
/// The ALPN protocol of a gRPC-only connection (the peer port, and a member dialing one).
pub const ALPN_H2: &[&[u8]] = &[b"h2"];

/// One side's TLS files and checks: `--cert-file`, `--trusted-ca-file`… for clients, the
/// `--peer-*` flags for peers.
#[derive(Debug, Clone, Default)]
pub struct Side {
    /// This member's certificate (chain) and key, served to whoever connects.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// What this member presents when it connects as a client (default: the pair above).
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
    /// The CA that signs the certificates of whoever connects; given, a connecting client
    /// must present one (etcd requires it as soon as the file is given).
    pub trusted_ca_file: Option<PathBuf>,
    /// `--client-cert-auth` / `--peer-client-cert-auth`.
    pub client_cert_auth: bool,
    pub crl_file: Option<PathBuf>,
    /// A connecting certificate must have one of these CNs…
    pub allowed_cns: Vec<String>,
    /// …or be valid for one of these hostnames (mutually exclusive with the CNs).
    pub allowed_hostnames: Vec<String>,
    /// The pair is `--auto-tls`'s own self-signed one: a member dialing a peer then checks
    /// nothing of the peer's certificate, as etcd does.
    pub self_signed: bool,
}

impl Side {
    /// Whether a certificate and key were given (etcd's `TLSInfo.Empty()`, negated).
    pub fn has_pair(&self) -> bool {
        self.cert_file.is_some() && self.key_file.is_some()
    }

    /// Whether connecting clients must present a certificate.
    pub fn requires_client_cert(&self) -> bool {
        self.trusted_ca_file.is_some() || self.client_cert_auth
    }

    /// Checks what etcd checks before listening: both files or neither, exclusive options.
    pub fn check(&self, what: &str) -> Result<()> {
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err(format!(
                "{what}: the certificate and the key must be given together (cert: {:?}, key: {:?})",
                self.cert_file, self.key_file
            ));
        }
        if self.client_cert_file.is_some() != self.client_key_file.is_some() {
            return Err(format!(
                "{what}: the client certificate and key must be given together (cert: {:?}, key: {:?})",
                self.client_cert_file, self.client_key_file
            ));
        }
        if !self.allowed_cns.is_empty() && !self.allowed_hostnames.is_empty() {
            return Err(format!(
                "{what}: allowed CNs and allowed hostnames are mutually exclusive (cns={:?}, hostnames={:?})",
                self.allowed_cns, self.allowed_hostnames
            ));
        }
        if self.client_cert_auth && self.trusted_ca_file.is_none() {
            return Err(format!(
                "{what}: client certificate authentication needs the CA that signs them (a trusted CA file)"
            ));
        }
        Ok(())
    }
}

/// A TLS version etcd names (`TLS1.2`, `TLS1.3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    Tls12,
    Tls13,
}

impl Version {
    fn parse(flag: &str, v: &str) -> Result<Option<Version>> {
        match v {
            "" => Ok(None),
            "TLS1.2" => Ok(Some(Version::Tls12)),
            "TLS1.3" => Ok(Some(Version::Tls13)),
            "TLS1.0" | "TLS1.1" => Err(format!(
                "--{flag} {v}: TLS 1.0 and 1.1 are not supported (rustls implements TLS 1.2 and 1.3)"
            )),
            other => Err(format!(
                "--{flag} {other:?}: unexpected TLS version (want TLS1.2 or TLS1.3)"
            )),
        }
    }

    fn protocol(self) -> &'static SupportedProtocolVersion {
        match self {
            Version::Tls12 => &rustls::version::TLS12,
            Version::Tls13 => &rustls::version::TLS13,
        }
    }
}

/// etcd's names (Go's) for the TLS 1.2 cipher suites rustls implements: AEAD ciphers with
/// ECDHE key exchange. Go's CBC and RSA-key-exchange suites have no rustls counterpart.
const SUITES: &[(&str, SupportedCipherSuite)] = {
    use rustls::crypto::ring::cipher_suite as cs;
    &[
        (
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
            cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        ),
        (
            "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
            cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        ),
        (
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
        (
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
        (
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        ),
        (
            "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
            cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        ),
        (
            "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
            cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
        (
            "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
            cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
    ]
};

/// Go's names of its TLS 1.3 suites: accepted and without effect, as in Go (TLS 1.3's suites
/// are not configurable there).
const TLS13_NAMES: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
];

/// The versions and suites every TLS connection of this member may use (`--tls-min-version`,
/// `--tls-max-version`, `--cipher-suites`), shared by both ports as in etcd.
#[derive(Debug, Clone)]
pub struct Policy {
    provider: Arc<CryptoProvider>,
    versions: Vec<&'static SupportedProtocolVersion>,
}

impl Policy {
    pub fn parse(min: &str, max: &str, suites: &str) -> Result<Policy> {
        let min = Version::parse("tls-min-version", min)?.unwrap_or(Version::Tls12);
        let max = Version::parse("tls-max-version", max)?.unwrap_or(Version::Tls13);
        if min > max {
            return Err(format!(
                "min version ({min:?}) is greater than max version ({max:?})"
            ));
        }
        let names: Vec<&str> = suites
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if min == Version::Tls13 && !names.is_empty() {
            return Err("cipher suites cannot be configured when only TLS1.3 is enabled".into());
        }
        let mut provider = rustls::crypto::ring::default_provider();
        if !names.is_empty() {
            let mut chosen = Vec::new();
            for n in &names {
                if TLS13_NAMES.contains(n) {
                    continue;
                }
                let Some((_, s)) = SUITES.iter().find(|(name, _)| name == n) else {
                    return Err(format!(
                        "--cipher-suites: {n:?} is not supported (kvd's TLS offers the TLS 1.2 suites {})",
                        SUITES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                    ));
                };
                if !chosen.contains(s) {
                    chosen.push(*s);
                }
            }
            // TLS 1.3's suites stay as they are; the list restricts TLS 1.2, as in Go.
            provider
                .cipher_suites
                .retain(|s| s.version() == &rustls::version::TLS13 || chosen.contains(s));
        }
        let versions = [Version::Tls12, Version::Tls13]
            .into_iter()
            .filter(|v| (min..=max).contains(v))
            .map(Version::protocol)
            .collect();
        Ok(Policy {
            provider: Arc::new(provider),
            versions,
        })
    }
}

impl Default for Policy {
    fn default() -> Policy {
        Policy::parse("", "", "").expect("the defaults are valid")
    }
}

/// Reads every certificate in a PEM file.
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in the file", path.display()));
    }
    Ok(certs)
}

/// Reads every CRL in a PEM (or DER) file.
fn read_crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let pem: std::result::Result<Vec<_>, _> =
        CertificateRevocationListDer::pem_slice_iter(&bytes).collect();
    match pem {
        Ok(crls) if !crls.is_empty() => Ok(crls),
        // etcd (Go's x509.ParseRevocationList) takes DER.
        _ if bytes.first() == Some(&0x30) => Ok(vec![CertificateRevocationListDer::from(bytes)]),
        _ => Err(format!(
            "{}: no certificate revocation list in the file",
            path.display()
        )),
    }
}

/// A root store of the CAs in `path`.
fn roots(path: &Path) -> Result<rustls::RootCertStore> {
    let mut store = rustls::RootCertStore::empty();
    for c in read_certs(path)? {
        store
            .add(c)
            .map_err(|e| format!("{}: not a CA certificate: {e}", path.display()))?;
    }
    Ok(store)
}

/// The server configuration of a port: its certificate (reloaded when renewed), the client
/// certificate checks of `side`, and the ALPN protocols offered.
pub fn server_config(side: &Side, policy: &Policy, alpn: &[&[u8]]) -> Result<Arc<ServerConfig>> {
    let (Some(cert), Some(key)) = (&side.cert_file, &side.key_file) else {
        return Err("TLS needs a certificate and a key".into());
    };
    let files = Arc::new(CertFiles::load(cert, key, policy.provider.clone())?);
    let builder = ServerConfig::builder_with_provider(policy.provider.clone())
        .with_protocol_versions(&policy.versions)
        .map_err(|e| format!("TLS versions: {e}"))?;
    let builder = match &side.trusted_ca_file {
        Some(ca) if side.requires_client_cert() => {
            builder.with_client_cert_verifier(Arc::new(verify::ClientVerifier::new(
                ca,
                side.crl_file.as_deref(),
                side.allowed_cns.clone(),
                side.allowed_hostnames.clone(),
                policy.provider.clone(),
            )?))
        }
        _ => builder.with_no_client_auth(),
    };
    let mut cfg = builder.with_cert_resolver(files);
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(cfg))
}

/// The client configuration of a member dialing `side`'s servers (its peers, or its own
/// cluster's client URLs): trusts `side`'s CA (or, for `--auto-tls` pairs, checks nothing, as
/// etcd) and presents the client pair, or the server pair, when asked for a certificate.
pub fn client_config(side: &Side, policy: &Policy, alpn: &[&[u8]]) -> Result<Arc<ClientConfig>> {
    let builder = ClientConfig::builder_with_provider(policy.provider.clone())
        .with_protocol_versions(&policy.versions)
        .map_err(|e| format!("TLS versions: {e}"))?;
    let builder = if side.self_signed {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verify::AnyServer::new(
                policy.provider.clone(),
            )))
    } else {
        let roots = match &side.trusted_ca_file {
            Some(ca) => roots(ca)?,
            None => native_roots(),
        };
        builder.with_root_certificates(roots)
    };
    let pair = match (&side.client_cert_file, &side.client_key_file) {
        (Some(c), Some(k)) => Some((c, k)),
        _ => side.cert_file.as_ref().zip(side.key_file.as_ref()),
    };
    let mut cfg = match pair {
        Some((cert, key)) => builder.with_client_cert_resolver(Arc::new(CertFiles::load(
            cert,
            key,
            policy.provider.clone(),
        )?)),
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(cfg))
}

/// The system's CA certificates (etcd's Go uses them when no CA file is given).
fn native_roots() -> rustls::RootCertStore {
    let mut store = rustls::RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        tracing::debug!("reading the system's CA certificates: {e}");
    }
    store.add_parsable_certificates(found.certs);
    store
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_suites() {
        let p = Policy::parse("", "", "").unwrap();
        assert_eq!(p.versions.len(), 2);
        let p = Policy::parse("TLS1.3", "", "").unwrap();
        assert_eq!(p.versions, vec![&rustls::version::TLS13]);
        let p = Policy::parse("", "TLS1.2", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256").unwrap();
        assert_eq!(p.versions, vec![&rustls::version::TLS12]);
        let tls12: Vec<_> = p
            .provider
            .cipher_suites
            .iter()
            .filter(|s| s.version() == &rustls::version::TLS12)
            .collect();
        assert_eq!(tls12.len(), 1);
        assert!(Policy::parse("TLS1.3", "TLS1.2", "").is_err());
        assert!(Policy::parse("TLS1.3", "", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256").is_err());
        let e = Policy::parse("", "", "TLS_RSA_WITH_AES_128_CBC_SHA").unwrap_err();
        assert!(e.contains("not supported"), "{e}");
        assert!(Policy::parse("TLS1.1", "", "").unwrap_err().contains("1.1"));
    }

    #[test]
    fn side_checks() {
        let mut s = Side {
            cert_file: Some("c".into()),
            ..Side::default()
        };
        assert!(s.check("client").is_err());
        s.key_file = Some("k".into());
        assert!(s.check("client").is_ok());
        s.client_cert_auth = true;
        assert!(s.check("client").is_err());
        s.trusted_ca_file = Some("ca".into());
        assert!(s.check("client").is_ok());
        s.allowed_cns = vec!["a".into()];
        s.allowed_hostnames = vec!["h".into()];
        assert!(s.check("peer").is_err());
    }
}
