//! Checks of the certificates a port's clients present: the CA's signature (webpki), the CRL,
//! and etcd's allowed CNs or hostnames; reading a certificate's CN and SANs; and the
//! "anything goes" server check of etcd's `--auto-tls` peers.

use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::Mutex;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use x509_cert::der::oid::ObjectIdentifier;
use x509_cert::der::{Decode, Tag, Tagged};

/// X.520's commonName.
const CN: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.3");
/// The subjectAltName extension.
const SAN: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.17");

/// A certificate's subject CN (the last one, as Go's `Subject.CommonName`), if it has one.
pub fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let c = x509_cert::Certificate::from_der(cert.as_ref()).ok()?;
    let mut cn = None;
    for rdn in c.tbs_certificate.subject.0.iter() {
        for atv in rdn.0.iter() {
            if atv.oid != CN {
                continue;
            }
            let text = match atv.value.tag() {
                Tag::Utf8String | Tag::PrintableString | Tag::Ia5String | Tag::TeletexString => {
                    String::from_utf8(atv.value.value().to_vec()).ok()
                }
                _ => None,
            };
            if text.is_some() {
                cn = text;
            }
        }
    }
    cn
}

/// A certificate's DNS and IP subject alternative names.
fn alt_names(cert: &CertificateDer<'_>) -> (Vec<String>, Vec<IpAddr>) {
    use x509_cert::ext::pkix::name::GeneralName;
    let (mut dns, mut ips) = (Vec::new(), Vec::new());
    let Ok(c) = x509_cert::Certificate::from_der(cert.as_ref()) else {
        return (dns, ips);
    };
    let exts = c.tbs_certificate.extensions.unwrap_or_default();
    for e in exts.iter().filter(|e| e.extn_id == SAN) {
        let Ok(san) = x509_cert::ext::pkix::SubjectAltName::from_der(e.extn_value.as_bytes())
        else {
            continue;
        };
        for name in san.0 {
            match name {
                GeneralName::DnsName(d) => dns.push(d.to_string()),
                GeneralName::IpAddress(o) => match o.as_bytes().len() {
                    4 => {
                        let b: [u8; 4] = o.as_bytes().try_into().unwrap_or_default();
                        ips.push(IpAddr::from(b));
                    }
                    16 => {
                        let b: [u8; 16] = o.as_bytes().try_into().unwrap_or_default();
                        ips.push(IpAddr::from(b));
                    }
                    _ => {}
                },
                _ => {}
            }
        }
    }
    (dns, ips)
}

/// etcd's check of a peer's client certificate against the address it connects from: a
/// certificate with SANs must name that IP, or a DNS name that resolves to it
/// (`--peer-skip-client-san-verification` turns it off).
pub async fn check_peer_san(cert: &CertificateDer<'_>, remote: IpAddr) -> Result<(), String> {
    let (dns, ips) = alt_names(cert);
    if dns.is_empty() && ips.is_empty() {
        return Ok(());
    }
    if ips.contains(&remote) {
        return Ok(());
    }
    for name in dns.iter().filter(|d| !d.starts_with("*.")) {
        if let Ok(addrs) = tokio::net::lookup_host((name.as_str(), 0)).await {
            if addrs.into_iter().any(|a| a.ip() == remote) {
                return Ok(());
            }
        }
    }
    Err(format!(
        "tls: {remote} does not match any of the certificate's SANs (IPs {ips:?}, DNS names {dns:?})"
    ))
}

type Stamp = Option<(SystemTime, u64, u64)>;

fn stamp(path: &Path) -> Stamp {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

/// The handshake signature checks every verifier here makes with the provider's algorithms.
#[derive(Debug, Clone)]
struct Signatures(Arc<CryptoProvider>);

impl Signatures {
    fn tls12(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn tls13(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The client certificate check of a port: webpki's, rebuilt when the CA or CRL file changes
/// on disk (etcd reads its CRL at every handshake), then etcd's allowed CNs or hostnames.
#[derive(Debug)]
pub struct ClientVerifier {
    ca: PathBuf,
    crl: Option<PathBuf>,
    allowed_cns: Vec<String>,
    allowed_hostnames: Vec<String>,
    provider: Arc<CryptoProvider>,
    signatures: Signatures,
    current: Mutex<((Stamp, Stamp), Arc<dyn ClientCertVerifier>)>,
}

impl ClientVerifier {
    pub fn new(
        ca: &Path,
        crl: Option<&Path>,
        allowed_cns: Vec<String>,
        allowed_hostnames: Vec<String>,
        provider: Arc<CryptoProvider>,
    ) -> Result<ClientVerifier, String> {
        let inner = build(ca, crl, &provider)?;
        Ok(ClientVerifier {
            current: Mutex::new(((stamp(ca), crl.and_then(stamp)), inner)),
            ca: ca.to_path_buf(),
            crl: crl.map(Path::to_path_buf),
            allowed_cns,
            allowed_hostnames,
            signatures: Signatures(provider.clone()),
            provider,
        })
    }

    fn inner(&self) -> Arc<dyn ClientCertVerifier> {
        let mut cur = self.current.lock();
        let now = (stamp(&self.ca), self.crl.as_deref().and_then(stamp));
        if now != cur.0 {
            match build(&self.ca, self.crl.as_deref(), &self.provider) {
                Ok(v) => {
                    tracing::info!(ca = %self.ca.display(), crl = ?self.crl, "trusted CA or CRL changed on disk: reloaded");
                    cur.1 = v;
                }
                Err(e) => tracing::warn!(
                    "trusted CA or CRL changed on disk but does not load ({e}); keeping the previous one"
                ),
            }
            cur.0 = now;
        }
        cur.1.clone()
    }

    /// etcd's allowed CNs / hostnames on the verified certificate.
    fn allowed(&self, cert: &CertificateDer<'_>) -> bool {
        if !self.allowed_cns.is_empty() {
            let cn = common_name(cert);
            return self.allowed_cns.iter().any(|a| Some(a) == cn.as_ref());
        }
        if !self.allowed_hostnames.is_empty() {
            let Ok(ee) = webpki::EndEntityCert::try_from(cert) else {
                return false;
            };
            return self.allowed_hostnames.iter().any(|h| {
                ServerName::try_from(h.as_str())
                    .is_ok_and(|n| ee.verify_is_valid_for_subject_name(&n).is_ok())
            });
        }
        true
    }
}

fn build(
    ca: &Path,
    crl: Option<&Path>,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, String> {
    let roots = Arc::new(super::roots(ca)?);
    let mut b = WebPkiClientVerifier::builder_with_provider(roots, provider.clone());
    if let Some(crl) = crl {
        // Certificates whose issuer the CRL file does not cover pass, as in etcd (which
        // checks serial numbers against the one file).
        b = b
            .with_crls(super::read_crls(crl)?)
            .allow_unknown_revocation_status();
    }
    b.build()
        .map_err(|e| format!("client certificate verifier ({}): {e}", ca.display()))
}

impl ClientCertVerifier for ClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // The verifier may be rebuilt at any handshake; clients with one certificate (all of
        // etcd's) send it without hints.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let ok = self
            .inner()
            .verify_client_cert(end_entity, intermediates, now)?;
        if !self.allowed(end_entity) {
            return Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ));
        }
        Ok(ok)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signatures.tls12(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signatures.tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.signatures.schemes()
    }
}

/// The server check of a member dialing a peer whose certificate is `--peer-auto-tls`'s
/// self-signed one: none but the handshake's own signatures, as etcd's `InsecureSkipVerify`.
#[derive(Debug)]
pub struct AnyServer {
    signatures: Signatures,
}

impl AnyServer {
    pub fn new(provider: Arc<CryptoProvider>) -> AnyServer {
        AnyServer {
            signatures: Signatures(provider),
        }
    }
}

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signatures.tls12(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signatures.tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.signatures.schemes()
    }
}
