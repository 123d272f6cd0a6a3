//! The key material of a local cloud (`gangway dev up`), kept on disk so a
//! restart keeps every token and the CA valid.
//!
//! Layout under the state directory:
//!
//! ```text
//! tls/ca.pem                     dev CA certificate (clients trust it)
//! tls/ca-key.pem          0600   dev CA key
//! tls/server.pem                 server chain for localhost, 127.0.0.1, ::1
//! tls/server-key.pem      0600   server key
//! keys/tenant-signing.pem 0600   ES256 key, kid "dev-tenant-1": tenant tokens
//! keys/tenant-signing.pub.pem
//! keys/operator-signing.pem 0600 ES256 key, kid "dev-operator-1": admin tokens
//! keys/operator-signing.pub.pem
//! keys/service-signing.pem 0600  ES256 key, kid "dev-service-1": service/agent tokens
//! keys/service-signing.pub.pem
//! ```
//!
//! Every file is written atomically (temporary file + rename), private keys
//! before the certificates that go with them, so a crash at any point leaves
//! a directory the next start repairs: a missing CA certificate is re-signed
//! from the kept key, and a server certificate that is missing, expired,
//! mismatched with its key or not from this CA is reissued. Concurrent
//! callers on one directory are serialized by a lock file.

use std::fs::{self, File};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::AuthError;
use crate::fsutil::{read_opt, set_mode, write_atomic, Mode};
use crate::jwt::SigningKey;
use crate::tls::{self, DevCa, TlsError};

/// Key id of the dev tenant-token signing key.
pub const TENANT_KID: &str = "dev-tenant-1";
/// Key id of the dev operator-token signing key: another key than the
/// tenants', so nothing that can mint a tenant token can mint an admin one.
pub const OPERATOR_KID: &str = "dev-operator-1";
/// Key id of the dev service-token signing key.
pub const SERVICE_KID: &str = "dev-service-1";

/// Why the dev material could not be loaded or created.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    /// Reading, writing or locking a file failed.
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    /// A certificate or TLS key on disk is unusable.
    #[error("{}: {source}; delete the file (or the whole state directory) to make a new one", path.display())]
    Tls { path: PathBuf, source: TlsError },
    /// A signing key on disk is unusable.
    #[error("{}: {source}; delete the file (or the whole state directory) to make a new one", path.display())]
    Key { path: PathBuf, source: AuthError },
}

/// Paths to the TLS files and the loaded signing keys of a local cloud.
#[derive(Clone, Debug)]
pub struct DevMaterial {
    /// The state directory everything lives under.
    pub dir: PathBuf,
    /// `tls/ca.pem`: the CA certificate clients trust (`GANGWAY_CA_CERT`).
    pub ca_cert: PathBuf,
    /// `tls/server.pem`: the server certificate chain.
    pub server_cert: PathBuf,
    /// `tls/server-key.pem`: the server key.
    pub server_key: PathBuf,
    /// Signs tenant tokens (kid [`TENANT_KID`]).
    pub tenant_key: SigningKey,
    /// Signs admin (operator) tokens (kid [`OPERATOR_KID`]).
    pub operator_key: SigningKey,
    /// Signs service and agent tokens (kid [`SERVICE_KID`]).
    pub service_key: SigningKey,
}

impl DevMaterial {
    /// Loads the material under `dir`, creating whatever is missing.
    pub fn load_or_create(dir: &Path) -> Result<DevMaterial, DevError> {
        let tls_dir = dir.join("tls");
        let keys_dir = dir.join("keys");
        for d in [dir, &tls_dir, &keys_dir] {
            fs::create_dir_all(d).map_err(io_at(d))?;
        }
        let lock_path = dir.join(".auth.lock");
        let lock = File::create(&lock_path).map_err(io_at(&lock_path))?;
        lock.lock().map_err(io_at(&lock_path))?;

        let ca_cert = tls_dir.join("ca.pem");
        let ca_key = tls_dir.join("ca-key.pem");
        let ca = load_or_create_ca(&ca_cert, &ca_key)?;

        let server_cert = tls_dir.join("server.pem");
        let server_key = tls_dir.join("server-key.pem");
        ensure_server_cert(&ca, &server_cert, &server_key)?;

        let tenant_key = load_or_create_key(&keys_dir, "tenant-signing", TENANT_KID)?;
        let operator_key = load_or_create_key(&keys_dir, "operator-signing", OPERATOR_KID)?;
        let service_key = load_or_create_key(&keys_dir, "service-signing", SERVICE_KID)?;

        drop(lock);
        Ok(DevMaterial {
            dir: dir.to_owned(),
            ca_cert,
            server_cert,
            server_key,
            tenant_key,
            operator_key,
            service_key,
        })
    }

    /// The key that signs tokens of `role` on the public API: admin tokens
    /// the operator key, every other role the tenant key (the global tier
    /// refuses those for anything but tenants).
    pub fn public_key_for(&self, role: crate::jwt::Role) -> &SigningKey {
        match role {
            crate::jwt::Role::Admin => &self.operator_key,
            _ => &self.tenant_key,
        }
    }

    /// The CA certificate PEM.
    pub fn ca_pem(&self) -> Result<String, DevError> {
        fs::read_to_string(&self.ca_cert).map_err(io_at(&self.ca_cert))
    }

    /// The rustls server configuration for the dev server certificate.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, DevError> {
        let chain = fs::read_to_string(&self.server_cert).map_err(io_at(&self.server_cert))?;
        let key = fs::read_to_string(&self.server_key).map_err(io_at(&self.server_key))?;
        tls::server_config(&chain, &key).map_err(tls_at(&self.server_cert))
    }

    /// A rustls client configuration trusting only the dev CA.
    pub fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, DevError> {
        tls::client_config(&self.ca_pem()?).map_err(tls_at(&self.ca_cert))
    }
}

fn load_or_create_ca(cert_path: &Path, key_path: &Path) -> Result<DevCa, DevError> {
    let Some(key_pem) = read_opt(key_path).map_err(io_at(key_path))? else {
        // No key: a new CA. The key is written first, so a crash before the
        // certificate leaves a key the next start re-signs.
        let ca = DevCa::generate();
        write_atomic(key_path, ca.key_pem().as_bytes(), Mode::Private).map_err(io_at(key_path))?;
        write_atomic(cert_path, ca.cert_pem().as_bytes(), Mode::Public)
            .map_err(io_at(cert_path))?;
        return Ok(ca);
    };
    set_mode(key_path, Mode::Private).map_err(io_at(key_path))?;
    match read_opt(cert_path).map_err(io_at(cert_path))? {
        Some(cert_pem) => DevCa::from_pem(&cert_pem, &key_pem).map_err(tls_at(cert_path)),
        None => {
            let ca = DevCa::from_key_pem(&key_pem).map_err(tls_at(key_path))?;
            write_atomic(cert_path, ca.cert_pem().as_bytes(), Mode::Public)
                .map_err(io_at(cert_path))?;
            Ok(ca)
        }
    }
}

fn ensure_server_cert(ca: &DevCa, cert_path: &Path, key_path: &Path) -> Result<(), DevError> {
    let cert = read_opt(cert_path).map_err(io_at(cert_path))?;
    let key = read_opt(key_path).map_err(io_at(key_path))?;
    if let (Some(cert), Some(key)) = (&cert, &key) {
        let usable = tls::verify_chain(&ca.cert_pem(), cert, "localhost").is_ok()
            && tls::server_config(cert, key).is_ok();
        if usable {
            return set_mode(key_path, Mode::Private).map_err(io_at(key_path));
        }
    }
    let ips = [
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
    ];
    let (chain, key) = ca
        .issue_server_cert(&["localhost"], &ips)
        .map_err(tls_at(cert_path))?;
    write_atomic(key_path, key.as_bytes(), Mode::Private).map_err(io_at(key_path))?;
    write_atomic(cert_path, chain.as_bytes(), Mode::Public).map_err(io_at(cert_path))
}

fn load_or_create_key(dir: &Path, name: &str, kid: &str) -> Result<SigningKey, DevError> {
    let private = dir.join(format!("{name}.pem"));
    let public = dir.join(format!("{name}.pub.pem"));
    let key = match read_opt(&private).map_err(io_at(&private))? {
        Some(pem) => {
            set_mode(&private, Mode::Private).map_err(io_at(&private))?;
            SigningKey::from_pem(kid, &pem).map_err(|source| DevError::Key {
                path: private.clone(),
                source,
            })?
        }
        None => {
            let key = SigningKey::generate(kid);
            write_atomic(&private, key.private_pem().as_bytes(), Mode::Private)
                .map_err(io_at(&private))?;
            key
        }
    };
    // The public half is derived, so rewrite it whenever it is not exactly right.
    if read_opt(&public).map_err(io_at(&public))?.as_deref() != Some(key.public_pem().as_str()) {
        write_atomic(&public, key.public_pem().as_bytes(), Mode::Public).map_err(io_at(&public))?;
    }
    Ok(key)
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> DevError + '_ {
    move |source| DevError::Io {
        path: path.to_owned(),
        source,
    }
}

fn tls_at(path: &Path) -> impl FnOnce(TlsError) -> DevError + '_ {
    move |source| DevError::Tls {
        path: path.to_owned(),
        source,
    }
}
