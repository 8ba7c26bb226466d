//! etcd's JWT tokens (`--auth-token jwt,pub-key=…,priv-key=…,sign-method=…,ttl=…`): compact
//! JWS with the claims etcd signs (`username`, `revision`, `exp`), signed and checked with
//! *ring* — RS256/384/512, PS256/384/512, ES256/384, EdDSA (Ed25519) and HS256/384/512 (the
//! private key file's bytes are the secret). A token is checked for its algorithm (only the
//! configured one), its signature and its expiry.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{self, KeyPair};

/// etcd's default token lifetime.
pub const DEFAULT_TTL: Duration = Duration::from_secs(300);

/// A JWT provider: signs (with a private key) and checks (with the public one).
pub struct Jwt {
    alg: &'static str,
    ttl: Duration,
    signer: Option<Signer>,
    verifier: Verifier,
}

impl std::fmt::Debug for Jwt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jwt")
            .field("alg", &self.alg)
            .field("ttl", &self.ttl)
            .field("can_sign", &self.signer.is_some())
            .finish()
    }
}

enum Signer {
    Rsa(signature::RsaKeyPair, &'static dyn signature::RsaEncoding),
    Ecdsa(signature::EcdsaKeyPair),
    Ed25519(signature::Ed25519KeyPair),
    Hmac(ring::hmac::Key),
}

enum Verifier {
    Public(signature::UnparsedPublicKey<Vec<u8>>),
    Hmac(ring::hmac::Key),
}

/// What a valid token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    pub username: String,
    pub revision: u64,
}

fn secs_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What a JWT provider refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    /// The sign method and keys do not make a provider (the reason as etcd words it).
    #[error("{0}")]
    Key(String),
    #[error("auth: token signing attempted with verify-only key")]
    VerifyOnly,
    #[error("auth: signing failed")]
    SigningFailed,
}

impl Jwt {
    /// A provider from etcd's options (`sign-method`, `pub-key`, `priv-key`, `ttl`).
    pub fn new(
        sign_method: &str,
        pub_key: Option<&[u8]>,
        priv_key: Option<&[u8]>,
        ttl: Duration,
    ) -> Result<Jwt, JwtError> {
        let (signer, verifier) =
            Self::keys(sign_method, pub_key, priv_key).map_err(JwtError::Key)?;
        let alg = ALGS
            .iter()
            .find(|a| **a == sign_method)
            .copied()
            .unwrap_or("none");
        Ok(Jwt {
            alg,
            ttl,
            signer,
            verifier,
        })
    }

    /// The signer (none for a verify-only provider) and verifier of `sign_method` with these
    /// keys, or why they do not make one (etcd's words).
    fn keys(
        sign_method: &str,
        pub_key: Option<&[u8]>,
        priv_key: Option<&[u8]>,
    ) -> Result<(Option<Signer>, Verifier), String> {
        Ok(match sign_method {
            "RS256" | "RS384" | "RS512" | "PS256" | "PS384" | "PS512" => {
                rsa(sign_method, pub_key, priv_key)?
            }
            "ES256" | "ES384" => ecdsa(sign_method, pub_key, priv_key)?,
            "ES512" => {
                return Err("sign-method ES512 (P-521) is not supported; use ES256 or ES384".into())
            }
            "EdDSA" => ed25519(pub_key, priv_key)?,
            "HS256" | "HS384" | "HS512" => {
                let alg = match sign_method {
                    "HS256" => ring::hmac::HMAC_SHA256,
                    "HS384" => ring::hmac::HMAC_SHA384,
                    _ => ring::hmac::HMAC_SHA512,
                };
                let secret = priv_key.ok_or("auth: missing key data")?;
                let key = ring::hmac::Key::new(alg, secret);
                (Some(Signer::Hmac(key.clone())), Verifier::Hmac(key))
            }
            other => return Err(format!("auth: invalid auth signature method {other:?}")),
        })
    }

    /// A signed token for `username` at auth revision `revision`, expiring after the TTL.
    pub fn sign(&self, username: &str, revision: u64) -> Result<String, JwtError> {
        let Some(signer) = &self.signer else {
            return Err(JwtError::VerifyOnly);
        };
        let header = serde_json::json!({"alg": self.alg, "typ": "JWT"});
        let claims = serde_json::json!({
            "exp": secs_now() + self.ttl.as_secs(),
            "revision": revision,
            "username": username,
        });
        let input = format!(
            "{}.{}",
            B64.encode(header.to_string()),
            B64.encode(claims.to_string())
        );
        let sig = match signer {
            Signer::Rsa(k, enc) => {
                let mut sig = vec![0; k.public().modulus_len()];
                k.sign(*enc, &SystemRandom::new(), input.as_bytes(), &mut sig)
                    .map_err(|_| JwtError::SigningFailed)?;
                sig
            }
            Signer::Ecdsa(k) => k
                .sign(&SystemRandom::new(), input.as_bytes())
                .map_err(|_| JwtError::SigningFailed)?
                .as_ref()
                .to_vec(),
            Signer::Ed25519(k) => k.sign(input.as_bytes()).as_ref().to_vec(),
            Signer::Hmac(k) => ring::hmac::sign(k, input.as_bytes()).as_ref().to_vec(),
        };
        Ok(format!("{input}.{}", B64.encode(sig)))
    }

    /// The claims of `token` if it is one of ours: the configured algorithm, a good
    /// signature, not expired.
    pub fn check(&self, token: &str) -> Option<Claims> {
        let mut parts = token.split('.');
        let (h, c, s) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let header: serde_json::Value = serde_json::from_slice(&B64.decode(h).ok()?).ok()?;
        if header.get("alg")?.as_str()? != self.alg {
            return None;
        }
        let sig = B64.decode(s).ok()?;
        let signed = &token[..h.len() + 1 + c.len()];
        let ok = match &self.verifier {
            Verifier::Public(k) => k.verify(signed.as_bytes(), &sig).is_ok(),
            Verifier::Hmac(k) => ring::hmac::verify(k, signed.as_bytes(), &sig).is_ok(),
        };
        if !ok {
            return None;
        }
        let claims: serde_json::Value = serde_json::from_slice(&B64.decode(c).ok()?).ok()?;
        let now = secs_now() as f64;
        if claims
            .get("exp")
            .is_some_and(|e| e.as_f64().is_none_or(|e| e <= now))
        {
            return None;
        }
        if claims
            .get("nbf")
            .is_some_and(|n| n.as_f64().is_none_or(|n| n > now))
        {
            return None;
        }
        let revision = claims.get("revision")?.as_f64()?;
        Some(Claims {
            username: claims.get("username")?.as_str()?.to_string(),
            revision: revision as u64,
        })
    }
}

const ALGS: &[&str] = &[
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA", "HS256",
    "HS384", "HS512",
];

/// The one PEM section in `pem`: (its kind, DER).
fn pem(what: &str, pem: &[u8]) -> Result<(rustls_pki_types::pem::SectionKind, Vec<u8>), String> {
    let mut rd = std::io::BufReader::new(pem);
    rustls_pki_types::pem::from_buf(&mut rd)
        .map_err(|e| format!("{what}: {e}"))?
        .ok_or_else(|| format!("{what}: no PEM key"))
}

/// A DER element: (tag, contents, what follows), or None if `d` does not hold one.
fn tlv(d: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = d.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |l, b| l << 8 | *b as usize);
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

fn der(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let n = content.len();
    if n < 0x80 {
        out.push(n as u8);
    } else {
        let bytes = n.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

/// The public key bits of a SubjectPublicKeyInfo ("PUBLIC KEY" PEM).
fn spki_bits(what: &str, pem_bytes: &[u8]) -> Result<Vec<u8>, String> {
    use rustls_pki_types::pem::SectionKind;
    let (kind, d) = pem(what, pem_bytes)?;
    if kind != SectionKind::PublicKey {
        return Err(format!("{what}: want a PUBLIC KEY PEM, got {kind:?}"));
    }
    let bad = || format!("{what}: not a SubjectPublicKeyInfo");
    let (0x30, spki, _) = tlv(&d).ok_or_else(bad)? else {
        return Err(bad());
    };
    let (0x30, _alg, rest) = tlv(spki).ok_or_else(bad)? else {
        return Err(bad());
    };
    let (0x03, bits, _) = tlv(rest).ok_or_else(bad)? else {
        return Err(bad());
    };
    match bits.split_first() {
        Some((0, key)) => Ok(key.to_vec()),
        _ => Err(bad()),
    }
}

/// The public key to check tokens with: `pub-key`'s (which must then be the private key's
/// own, `derived`), or the one derived from the private key.
fn public_key(pub_key: Option<&[u8]>, derived: Option<&[u8]>) -> Result<Vec<u8>, String> {
    match (pub_key, derived) {
        (Some(p), derived) => {
            let bits = spki_bits("pub-key", p)?;
            if derived.is_some_and(|d| d != bits.as_slice()) {
                return Err("auth: public and private keys don't match".into());
            }
            Ok(bits)
        }
        (None, Some(d)) => Ok(d.to_vec()),
        (None, None) => Err("auth: missing key data".into()),
    }
}

fn rsa(
    method: &str,
    pub_key: Option<&[u8]>,
    priv_key: Option<&[u8]>,
) -> Result<(Option<Signer>, Verifier), String> {
    use rustls_pki_types::pem::SectionKind;
    let (enc, ver): (
        &'static dyn signature::RsaEncoding,
        &'static signature::RsaParameters,
    ) = match method {
        "RS256" => (
            &signature::RSA_PKCS1_SHA256,
            &signature::RSA_PKCS1_2048_8192_SHA256,
        ),
        "RS384" => (
            &signature::RSA_PKCS1_SHA384,
            &signature::RSA_PKCS1_2048_8192_SHA384,
        ),
        "RS512" => (
            &signature::RSA_PKCS1_SHA512,
            &signature::RSA_PKCS1_2048_8192_SHA512,
        ),
        "PS256" => (
            &signature::RSA_PSS_SHA256,
            &signature::RSA_PSS_2048_8192_SHA256,
        ),
        "PS384" => (
            &signature::RSA_PSS_SHA384,
            &signature::RSA_PSS_2048_8192_SHA384,
        ),
        _ => (
            &signature::RSA_PSS_SHA512,
            &signature::RSA_PSS_2048_8192_SHA512,
        ),
    };
    let pair = match priv_key {
        None => None,
        Some(p) => {
            let (kind, d) = pem("priv-key", p)?;
            let pair = match kind {
                SectionKind::RsaPrivateKey => signature::RsaKeyPair::from_der(&d),
                SectionKind::PrivateKey => signature::RsaKeyPair::from_pkcs8(&d),
                other => return Err(format!("priv-key: want an RSA key, got {other:?}")),
            }
            .map_err(|e| format!("priv-key: {e}"))?;
            Some(pair)
        }
    };
    let public = public_key(pub_key, pair.as_ref().map(|k| k.public().as_ref()))?;
    Ok((
        pair.map(|k| Signer::Rsa(k, enc)),
        Verifier::Public(signature::UnparsedPublicKey::new(ver, public)),
    ))
}

fn ecdsa(
    method: &str,
    pub_key: Option<&[u8]>,
    priv_key: Option<&[u8]>,
) -> Result<(Option<Signer>, Verifier), String> {
    use rustls_pki_types::pem::SectionKind;
    // id-ecPublicKey, and the curve's OID, as DER.
    const EC_KEY: &[u8] = &[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
    let (sign, verify, curve): (_, _, &[u8]) = match method {
        "ES256" => (
            &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &signature::ECDSA_P256_SHA256_FIXED,
            &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07],
        ),
        _ => (
            &signature::ECDSA_P384_SHA384_FIXED_SIGNING,
            &signature::ECDSA_P384_SHA384_FIXED,
            &[0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22],
        ),
    };
    let pair = match priv_key {
        None => None,
        Some(p) => {
            let (kind, d) = pem("priv-key", p)?;
            let pkcs8 = match kind {
                SectionKind::PrivateKey => d,
                // OpenSSL's "EC PRIVATE KEY" (SEC1), wrapped as PKCS#8 for ring.
                SectionKind::EcPrivateKey => {
                    let alg = der(0x30, &[EC_KEY, curve].concat());
                    der(
                        0x30,
                        &[&[0x02, 0x01, 0x00][..], &alg, &der(0x04, &d)].concat(),
                    )
                }
                other => return Err(format!("priv-key: want an EC key, got {other:?}")),
            };
            let pair = signature::EcdsaKeyPair::from_pkcs8(sign, &pkcs8, &SystemRandom::new())
                .map_err(|e| format!("priv-key: {e}"))?;
            Some(pair)
        }
    };
    let public = public_key(pub_key, pair.as_ref().map(|k| k.public_key().as_ref()))?;
    Ok((
        pair.map(Signer::Ecdsa),
        Verifier::Public(signature::UnparsedPublicKey::new(verify, public)),
    ))
}

fn ed25519(
    pub_key: Option<&[u8]>,
    priv_key: Option<&[u8]>,
) -> Result<(Option<Signer>, Verifier), String> {
    let pair = match priv_key {
        None => None,
        Some(p) => {
            let (_, d) = pem("priv-key", p)?;
            let pair = signature::Ed25519KeyPair::from_pkcs8_maybe_unchecked(&d)
                .map_err(|e| format!("priv-key: {e}"))?;
            Some(pair)
        }
    };
    let public = public_key(pub_key, pair.as_ref().map(|k| k.public_key().as_ref()))?;
    Ok((
        pair.map(Signer::Ed25519),
        Verifier::Public(signature::UnparsedPublicKey::new(
            &signature::ED25519,
            public,
        )),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ec_pair() -> (Vec<u8>, Vec<u8>) {
        let key = rcgen::KeyPair::generate().unwrap();
        (
            key.serialize_pem().into_bytes(),
            key.public_key_pem().into_bytes(),
        )
    }

    #[test]
    fn es256_signs_and_checks_and_refuses_what_is_not_its_own() {
        let (private, public) = ec_pair();
        let jwt = Jwt::new("ES256", Some(&public), Some(&private), DEFAULT_TTL).unwrap();
        let t = jwt.sign("alice", 7).unwrap();
        assert_eq!(
            jwt.check(&t),
            Some(Claims {
                username: "alice".into(),
                revision: 7
            })
        );
        // A flipped byte of the claims, another key, another algorithm, an expired token.
        let mut parts: Vec<String> = t.split('.').map(String::from).collect();
        let mut claims = B64.decode(&parts[1]).unwrap();
        claims[3] ^= 1;
        parts[1] = B64.encode(&claims);
        assert_eq!(jwt.check(&parts.join(".")), None);
        let (other, other_pub) = ec_pair();
        let stranger = Jwt::new("ES256", Some(&other_pub), Some(&other), DEFAULT_TTL).unwrap();
        assert_eq!(jwt.check(&stranger.sign("alice", 7).unwrap()), None);
        let hs = Jwt::new("HS256", None, Some(&public), DEFAULT_TTL).unwrap();
        assert_eq!(
            jwt.check(&hs.sign("alice", 7).unwrap()),
            None,
            "alg confusion"
        );
        let expired = Jwt::new("ES256", None, Some(&private), Duration::ZERO).unwrap();
        assert_eq!(jwt.check(&expired.sign("alice", 7).unwrap()), None);
        assert_eq!(jwt.check("a.b"), None);
        assert_eq!(jwt.check("..."), None);
    }

    #[test]
    fn verify_only_and_mismatched_keys() {
        let (private, public) = ec_pair();
        let (_, other_pub) = ec_pair();
        let verify = Jwt::new("ES256", Some(&public), None, DEFAULT_TTL).unwrap();
        assert_eq!(verify.sign("a", 1), Err(JwtError::VerifyOnly));
        let signer = Jwt::new("ES256", None, Some(&private), DEFAULT_TTL).unwrap();
        assert!(verify.check(&signer.sign("a", 1).unwrap()).is_some());
        let e = Jwt::new("ES256", Some(&other_pub), Some(&private), DEFAULT_TTL).unwrap_err();
        assert!(e.to_string().contains("don't match"), "{e}");
        assert!(Jwt::new("ES256", None, None, DEFAULT_TTL).is_err());
        assert!(Jwt::new("XX", None, Some(&private), DEFAULT_TTL).is_err());
    }

    #[test]
    fn sec1_ec_keys_load_as_openssl_writes_them() {
        // rcgen writes PKCS#8; turn it back into SEC1 ("EC PRIVATE KEY") as openssl ecparam
        // -genkey does: the PKCS#8's inner OCTET STRING.
        let key = rcgen::KeyPair::generate().unwrap();
        let pkcs8 = key.serialize_der();
        let (_, seq, _) = tlv(&pkcs8).unwrap();
        let (_, _, rest) = tlv(seq).unwrap();
        let (_, _, rest) = tlv(rest).unwrap();
        let (_, sec1, _) = tlv(rest).unwrap();
        let pem = format!(
            "-----BEGIN EC PRIVATE KEY-----\n{}\n-----END EC PRIVATE KEY-----\n",
            base64::engine::general_purpose::STANDARD.encode(sec1)
        );
        let jwt = Jwt::new("ES256", None, Some(pem.as_bytes()), DEFAULT_TTL).unwrap();
        assert!(jwt.check(&jwt.sign("bob", 2).unwrap()).is_some());
    }
}
