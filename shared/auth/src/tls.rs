//! A dev certificate authority and the rustls configurations every Gangway
//! server and client uses (the `ring` provider; TLS 1.2 and 1.3).
//!
//! The dev CA exists so a local cloud can speak real HTTPS without a public
//! CA: it issues the server certificate, and clients trust only it. In
//! production the certificate and key come from the operator, and the same
//! [`server_config`]/[`client_config`] build the rustls configurations.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::client::danger::ServerCertVerifier as _;
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, DnsName, PrivateKeyDer, ServerName, UnixTime};

/// The dev CA's subject (plus a key fingerprint). An issuer is rebuilt from
/// it when a CA is loaded from disk (see [`DevCa::from_pem`]), so it must
/// never change.
const CA_COMMON_NAME: &str = "Gangway dev CA";
const CA_ORGANIZATION: &str = "Gangway";
/// How long dev certificates are valid (about ten years): a dev state
/// directory should not break with age.
const VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Back-dating, so a cert made this second is valid on a clock a bit behind.
const BACKDATE: Duration = Duration::from_secs(3600);

/// Why a certificate, key or TLS configuration could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// PEM text that holds no usable item of the expected kind.
    #[error("{what}: {detail}")]
    Pem { what: &'static str, detail: String },
    /// Generating or loading a certificate or key failed.
    #[error("certificate: {0}")]
    Certificate(String),
    /// rustls refused the configuration (for example a key that does not
    /// match its certificate).
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// A throwaway certificate authority (ECDSA P-256) for local clouds.
pub struct DevCa {
    key: KeyPair,
    /// The parameters the CA certificate was made from; only the subject,
    /// key-identifier method and key usages matter for issuing.
    params: CertificateParams,
    cert_pem: String,
}

impl std::fmt::Debug for DevCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevCa").finish_non_exhaustive()
    }
}

impl DevCa {
    /// A new CA with a fresh key, valid from an hour ago for about ten years.
    ///
    /// # Panics
    /// Only if the system's random source fails.
    pub fn generate() -> Self {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .expect("generating a P-256 key needs a working system random source");
        Self::self_sign(key).expect("a fresh dev CA certificate can be signed")
    }

    /// Loads a CA made by [`DevCa::generate`] (its certificate and PKCS#8 key,
    /// as written by [`DevCa::cert_pem`] and [`DevCa::key_pem`]). Checks that
    /// certificates it issues chain to `cert_pem`, so a mismatched pair or a
    /// foreign CA is refused here rather than at the first handshake.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, TlsError> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| TlsError::Pem {
            what: "CA key",
            detail: format!("not a PKCS#8 PEM private key ({e})"),
        })?;
        let cert = first_cert(cert_pem, "CA certificate")?;
        let ca = DevCa {
            params: ca_params(&key),
            key,
            cert_pem: pem_of(&cert),
        };
        let (leaf, _) = ca.issue_server_cert(&["localhost"], &[])?;
        verify_chain(&ca.cert_pem, &leaf, "localhost").map_err(|e| {
            TlsError::Certificate(format!(
                "the CA certificate does not match its key, or was not made by Gangway's dev CA ({e}); \
                 delete both files to make a new CA"
            ))
        })?;
        Ok(ca)
    }

    /// A new self-signed CA certificate for an existing key. Certificates the
    /// key issued before still chain to it (same subject, same key id).
    pub fn from_key_pem(key_pem: &str) -> Result<Self, TlsError> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| TlsError::Pem {
            what: "CA key",
            detail: format!("not a PKCS#8 PEM private key ({e})"),
        })?;
        Self::self_sign(key)
    }

    fn self_sign(key: KeyPair) -> Result<Self, TlsError> {
        let mut params = ca_params(&key);
        set_validity(&mut params);
        let cert = params
            .self_signed(&key)
            .map_err(|e| TlsError::Certificate(e.to_string()))?;
        Ok(DevCa {
            key,
            params,
            cert_pem: cert.pem(),
        })
    }

    /// The CA certificate (PEM); clients trust this.
    pub fn cert_pem(&self) -> String {
        self.cert_pem.clone()
    }

    /// The CA's private key (PKCS#8 PEM). Keep it secret (mode 0600).
    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    /// A server certificate for the given names and addresses, signed by this
    /// CA, with a fresh key. Returns `(certificate chain PEM, key PEM)`; the
    /// chain is the leaf followed by the CA certificate.
    pub fn issue_server_cert(
        &self,
        dns_names: &[&str],
        ips: &[IpAddr],
    ) -> Result<(String, String), TlsError> {
        if dns_names.is_empty() && ips.is_empty() {
            return Err(TlsError::Certificate(
                "a server certificate needs at least one DNS name or IP address".into(),
            ));
        }
        let mut params = CertificateParams::default();
        for name in dns_names {
            let invalid = |e: &dyn std::fmt::Display| {
                TlsError::Certificate(format!("{name:?} is not a valid DNS name ({e})"))
            };
            DnsName::try_from(*name).map_err(|e| invalid(&e))?;
            let name = (*name).to_owned().try_into().map_err(|e| invalid(&e))?;
            params.subject_alt_names.push(SanType::DnsName(name));
        }
        params
            .subject_alt_names
            .extend(ips.iter().copied().map(SanType::IpAddress));
        let mut dn = DistinguishedName::new();
        let cn = dns_names
            .first()
            .map(|s| (*s).to_owned())
            .or_else(|| ips.first().map(IpAddr::to_string))
            .unwrap_or_default();
        dn.push(DnType::CommonName, cn);
        dn.push(DnType::OrganizationName, CA_ORGANIZATION);
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params);

        let leaf_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(|e| TlsError::Certificate(e.to_string()))?;
        let issuer = Issuer::from_params(&self.params, &self.key);
        let leaf = params
            .signed_by(&leaf_key, &issuer)
            .map_err(|e| TlsError::Certificate(e.to_string()))?;
        Ok((
            format!("{}{}", leaf.pem(), self.cert_pem),
            leaf_key.serialize_pem(),
        ))
    }
}

/// The CA's parameters. Its common name carries a fingerprint of its key, so
/// two dev CAs never share a subject (a client trusting one names the other
/// an unknown issuer), and the subject can be rebuilt from the key alone.
fn ca_params(key: &KeyPair) -> CertificateParams {
    let mut params = CertificateParams::default();
    let fingerprint: String = params
        .key_identifier(key)
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        format!("{CA_COMMON_NAME} {fingerprint}"),
    );
    dn.push(DnType::OrganizationName, CA_ORGANIZATION);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

fn set_validity(params: &mut CertificateParams) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let at = |d: Duration| {
        time::OffsetDateTime::from_unix_timestamp(d.as_secs() as i64)
            .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
    };
    params.not_before = at(now.saturating_sub(BACKDATE));
    params.not_after = at(now + VALIDITY);
}

/// The process's TLS provider: `ring`, whatever else is compiled in.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A rustls server configuration presenting `cert_chain_pem` (leaf first)
/// with `key_pem` (PKCS#8, PKCS#1 or SEC1), offering HTTP/2 and HTTP/1.1 by
/// ALPN. No client certificates are asked for.
pub fn server_config(cert_chain_pem: &str, key_pem: &str) -> Result<Arc<ServerConfig>, TlsError> {
    let certs = certs(cert_chain_pem, "server certificate chain")?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| TlsError::Pem {
        what: "server key",
        detail: format!("no private key found ({e})"),
    })?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A rustls client configuration that trusts only the CA certificate(s) in
/// `ca_pem` (no system or web roots). It sends no ALPN, so the connection
/// speaks HTTP/1.1; set `alpn_protocols` on a copy to offer HTTP/2.
pub fn client_config(ca_pem: &str) -> Result<Arc<ClientConfig>, TlsError> {
    let roots = root_store(ca_pem)?;
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Checks that the leaf of `chain_pem` is valid now for `server_name` under
/// the CA in `ca_pem`, the way a client would.
pub fn verify_chain(ca_pem: &str, chain_pem: &str, server_name: &str) -> Result<(), TlsError> {
    let roots = Arc::new(root_store(ca_pem)?);
    let verifier = WebPkiServerVerifier::builder_with_provider(roots, provider())
        .build()
        .map_err(|e| TlsError::Certificate(e.to_string()))?;
    let chain = certs(chain_pem, "certificate chain")?;
    let name = ServerName::try_from(server_name.to_owned())
        .map_err(|e| TlsError::Certificate(format!("{server_name:?}: {e}")))?;
    verifier.verify_server_cert(&chain[0], &chain[1..], &name, &[], UnixTime::now())?;
    Ok(())
}

fn root_store(ca_pem: &str) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certs(ca_pem, "CA certificate")? {
        roots.add(cert)?;
    }
    Ok(roots)
}

fn certs(pem: &str, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what,
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            what,
            detail: "no `-----BEGIN CERTIFICATE-----` block found".into(),
        });
    }
    Ok(certs)
}

fn first_cert(pem: &str, what: &'static str) -> Result<CertificateDer<'static>, TlsError> {
    Ok(certs(pem, what)?.swap_remove(0))
}

fn pem_of(cert: &CertificateDer<'_>) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}
