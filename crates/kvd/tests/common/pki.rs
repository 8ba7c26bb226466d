//! Certificates made by the tests (rcgen): a CA, server and client certificates signed by it,
//! CRLs, and a second CA whose certificates the first does not trust. Every key is generated
//! fresh in the test's temporary directory.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, RevocationReason,
    RevokedCertParams, SanType, SerialNumber,
};

/// A certificate and key written to files.
#[derive(Debug, Clone)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub serial: u64,
}

impl Pair {
    /// etcdctl's flags presenting this pair.
    pub fn ctl_flags(&self, ca: &Path) -> Vec<String> {
        vec![
            format!("--cacert={}", ca.display()),
            format!("--cert={}", self.cert.display()),
            format!("--key={}", self.key.display()),
        ]
    }
}

/// A CA that signs certificates into `dir`.
pub struct Ca {
    pub dir: PathBuf,
    pub name: String,
    pub cert: PathBuf,
    key: KeyPair,
    params: CertificateParams,
    next_serial: u64,
}

impl Ca {
    /// A new CA named `name`, its certificate in `dir/<name>-ca.pem`.
    pub fn new(dir: &Path, name: &str) -> Ca {
        std::fs::create_dir_all(dir).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} CA"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).unwrap();
        let path = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&path, cert.pem()).unwrap();
        Ca {
            dir: dir.to_path_buf(),
            name: name.into(),
            cert: path,
            key,
            params,
            next_serial: 100,
        }
    }

    fn issuer(&self) -> Issuer<'_, &KeyPair> {
        Issuer::new(self.params.clone(), &self.key)
    }

    /// A certificate for `cn`, valid for 127.0.0.1 and localhost, for servers and clients
    /// alike (etcd's members present their server pair to peers), written as
    /// `dir/<file>.pem` and `dir/<file>-key.pem`.
    pub fn issue(&mut self, file: &str, cn: &str) -> Pair {
        self.issue_with(file, cn, &["127.0.0.1", "localhost"])
    }

    /// The same with the given SANs (IP addresses or DNS names; none: no SAN extension).
    pub fn issue_with(&mut self, file: &str, cn: &str, sans: &[&str]) -> Pair {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        self.next_serial += 1;
        let serial = self.next_serial;
        params.serial_number = Some(SerialNumber::from(serial));
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        params.key_identifier_method = KeyIdMethod::Sha256;
        for s in sans {
            params.subject_alt_names.push(match s.parse() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(s.to_string().try_into().unwrap()),
            });
        }
        let cert = params.signed_by(&key, &self.issuer()).unwrap();
        let pair = Pair {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}-key.pem")),
            serial,
        };
        std::fs::write(&pair.cert, cert.pem()).unwrap();
        std::fs::write(&pair.key, key.serialize_pem()).unwrap();
        pair
    }

    /// A CRL revoking `revoked`, written to `dir/<file>.pem`.
    pub fn crl(&self, file: &str, revoked: &[&Pair]) -> PathBuf {
        let now = time::OffsetDateTime::now_utc();
        let params = CertificateRevocationListParams {
            this_update: now - time::Duration::minutes(1),
            next_update: now + time::Duration::days(1),
            crl_number: SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: revoked
                .iter()
                .map(|p| RevokedCertParams {
                    serial_number: SerialNumber::from(p.serial),
                    revocation_time: now - time::Duration::minutes(1),
                    reason_code: Some(RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        let crl = params.signed_by(&self.issuer()).unwrap();
        let path = self.dir.join(format!("{file}.pem"));
        std::fs::write(&path, crl.pem().unwrap()).unwrap();
        path
    }
}
