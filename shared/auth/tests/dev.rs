//! Dev material survives restarts: keys and the CA are loaded, not remade.

use std::fs;
use std::time::Duration;

use gangway_auth::{claims_for, tls, DevMaterial, Role, Verifier};

#[test]
fn load_or_create_is_stable_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let first = DevMaterial::load_or_create(dir.path()).unwrap();
    assert_eq!(first.tenant_key.kid(), "dev-tenant-1");
    assert_eq!(first.service_key.kid(), "dev-service-1");
    let claims = claims_for(
        Role::Tenant,
        "dev",
        Some("acme"),
        None,
        "gangway-dev",
        "gangway",
        Duration::from_secs(3600),
    );
    let token = first.tenant_key.sign(&claims).unwrap();
    let ca_before = fs::read_to_string(&first.ca_cert).unwrap();
    let server_before = fs::read_to_string(&first.server_cert).unwrap();

    let second = DevMaterial::load_or_create(dir.path()).unwrap();
    let public = fs::read_to_string(dir.path().join("keys/tenant-signing.pub.pem")).unwrap();
    let verifier =
        Verifier::new("gangway-dev", "gangway", &[("dev-tenant-1".into(), public)]).unwrap();
    assert_eq!(verifier.verify(&token).unwrap(), claims);
    assert_eq!(
        second.tenant_key.public_pem(),
        first.tenant_key.public_pem()
    );
    assert_eq!(
        second.service_key.public_pem(),
        first.service_key.public_pem()
    );
    assert_eq!(fs::read_to_string(&second.ca_cert).unwrap(), ca_before);
    assert_eq!(
        fs::read_to_string(&second.server_cert).unwrap(),
        server_before
    );

    // The server certificate chains to the CA and serves.
    let chain = fs::read_to_string(&second.server_cert).unwrap();
    tls::verify_chain(&ca_before, &chain, "localhost").unwrap();
    tls::verify_chain(&ca_before, &chain, "127.0.0.1").unwrap();
    tls::verify_chain(&ca_before, &chain, "::1").unwrap();
    second.server_config().unwrap();
    second.client_config().unwrap();
}

#[cfg(unix)]
#[test]
fn private_files_are_0600() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    DevMaterial::load_or_create(dir.path()).unwrap();
    for (path, want) in [
        ("tls/ca.pem", 0o644),
        ("tls/ca-key.pem", 0o600),
        ("tls/server.pem", 0o644),
        ("tls/server-key.pem", 0o600),
        ("keys/tenant-signing.pem", 0o600),
        ("keys/tenant-signing.pub.pem", 0o644),
        ("keys/service-signing.pem", 0o600),
        ("keys/service-signing.pub.pem", 0o644),
    ] {
        let mode = fs::metadata(dir.path().join(path))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, want, "{path}");
    }
}

#[test]
fn a_damaged_directory_is_repaired_without_losing_the_ca() {
    let dir = tempfile::tempdir().unwrap();
    let first = DevMaterial::load_or_create(dir.path()).unwrap();
    let ca_key = fs::read_to_string(dir.path().join("tls/ca-key.pem")).unwrap();

    // Lost: the CA certificate, the server certificate, a public key.
    fs::remove_file(&first.ca_cert).unwrap();
    fs::remove_file(&first.server_cert).unwrap();
    fs::remove_file(dir.path().join("keys/service-signing.pub.pem")).unwrap();

    let second = DevMaterial::load_or_create(dir.path()).unwrap();
    assert_eq!(
        fs::read_to_string(dir.path().join("tls/ca-key.pem")).unwrap(),
        ca_key
    );
    let ca = fs::read_to_string(&second.ca_cert).unwrap();
    let chain = fs::read_to_string(&second.server_cert).unwrap();
    tls::verify_chain(&ca, &chain, "localhost").unwrap();
    assert_eq!(
        fs::read_to_string(dir.path().join("keys/service-signing.pub.pem")).unwrap(),
        first.service_key.public_pem()
    );

    // A corrupt signing key is reported with its path, not replaced.
    fs::write(dir.path().join("keys/tenant-signing.pem"), "junk").unwrap();
    let err = DevMaterial::load_or_create(dir.path()).unwrap_err();
    assert!(err.to_string().contains("tenant-signing.pem"), "{err}");
}

#[test]
fn concurrent_first_starts_agree() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let path = path.clone();
            std::thread::spawn(move || DevMaterial::load_or_create(&path).unwrap())
        })
        .collect();
    let keys: Vec<String> = handles
        .into_iter()
        .map(|h| h.join().unwrap().tenant_key.public_pem())
        .collect();
    assert!(keys.windows(2).all(|w| w[0] == w[1]));
}
