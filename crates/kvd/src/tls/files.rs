//! A certificate and key pair read from files and read again when either file changes, so a
//! renewed certificate is served from the next handshake on without a restart.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::Mutex;
use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::PrivateKeyDer;

/// What identifies a file's version: modification time, size and inode (a renewal that
/// writes a new file and renames it over the old one changes the inode).
type Stamp = (SystemTime, u64, u64);

fn stamp(path: &Path) -> std::io::Result<Stamp> {
    let m = std::fs::metadata(path)?;
    Ok((m.modified()?, m.len(), m.ino()))
}

/// A certificate chain and its key, from two PEM files.
#[derive(Debug)]
pub struct CertFiles {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    loaded: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    /// The files' versions the pair was read from.
    stamps: (Stamp, Stamp),
    pair: Arc<CertifiedKey>,
    /// Versions that failed to load (warned about once; the pair before them is kept).
    failed: Option<(Stamp, Stamp)>,
}

impl CertFiles {
    /// Reads the pair; an error here is a configuration error (the member does not start).
    pub fn load(cert: &Path, key: &Path, provider: Arc<CryptoProvider>) -> Result<Self, String> {
        let stamps = (
            stamp(cert).map_err(|e| format!("{}: {e}", cert.display()))?,
            stamp(key).map_err(|e| format!("{}: {e}", key.display()))?,
        );
        let pair = read_pair(cert, key, &provider)?;
        Ok(CertFiles {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            provider,
            loaded: Mutex::new(Loaded {
                stamps,
                pair: Arc::new(pair),
                failed: None,
            }),
        })
    }

    /// The pair as the files hold it now. A pair that no longer reads (a renewal half
    /// written, a key that does not match its certificate) is logged and the last good one
    /// kept, so a botched renewal does not stop TLS.
    pub fn current(&self) -> Arc<CertifiedKey> {
        let mut l = self.loaded.lock();
        let (Ok(c), Ok(k)) = (stamp(&self.cert), stamp(&self.key)) else {
            return l.pair.clone();
        };
        let now = (c, k);
        if now == l.stamps || l.failed == Some(now) {
            return l.pair.clone();
        }
        match read_pair(&self.cert, &self.key, &self.provider) {
            Ok(pair) => {
                tracing::info!(cert = %self.cert.display(), key = %self.key.display(), "TLS certificate changed on disk: serving the new one");
                l.pair = Arc::new(pair);
                l.stamps = now;
                l.failed = None;
            }
            Err(e) => {
                tracing::warn!("TLS certificate changed on disk but does not load ({e}); still serving the previous one");
                l.failed = Some(now);
            }
        }
        l.pair.clone()
    }
}

fn read_pair(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<CertifiedKey, String> {
    let chain = super::read_certs(cert)?;
    let der = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
    CertifiedKey::from_der(chain, der, provider).map_err(|e| {
        format!(
            "{} and {}: not a usable certificate and key: {e}",
            cert.display(),
            key.display()
        )
    })
}

impl rustls::server::ResolvesServerCert for CertFiles {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

impl rustls::client::ResolvesClientCert for CertFiles {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        let pair = self.current();
        pair.key.choose_scheme(sigschemes).is_some().then_some(pair)
    }

    fn has_certs(&self) -> bool {
        true
    }
}
