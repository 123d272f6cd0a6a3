//! Every role refuses to start with a plain-HTTP link unless the operator
//! says so (issue 21): the region without its certificate, the agent and
//! the global tier with an http:// region, a TLS region without the CA its
//! peers are checked against. Each refusal names the flags to pass; the
//! `--insecure-http` escape hatch says what it gives up.

mod support;

use std::process::Command;

use support::BIN;

/// Runs `gangway ARGS` and returns (exit success, stderr).
fn gangway(args: &[&str]) -> (bool, String) {
    let out = Command::new(BIN)
        .args(args)
        .env("GANGWAY_LOG", "warn")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_region_without_its_certificate_or_insecure_http_refuses_to_start() {
    let (ok, err) = gangway(&[
        "region",
        "--name",
        "r",
        "--database-url",
        "postgres://nowhere",
    ]);
    assert!(!ok);
    assert!(
        err.contains("--tls-cert") && err.contains("--insecure-http"),
        "{err}"
    );
    // TLS and peers, but no CA to check the peers against.
    let dir = tempfile::tempdir().unwrap();
    let auth = gangway_auth::dev::DevMaterial::load_or_create(dir.path()).unwrap();
    let (cert, key) = (
        auth.server_cert.to_str().unwrap(),
        auth.server_key.to_str().unwrap(),
    );
    let (ok, err) = gangway(&[
        "region",
        "--name",
        "r",
        "--database-url",
        "postgres://nowhere",
        "--tls-cert",
        cert,
        "--tls-key",
        key,
        "--peer",
        "p=https://127.0.0.1:9",
    ]);
    assert!(!ok);
    assert!(err.contains("--ca"), "{err}");
    // A key that is not a key: named.
    let (ok, err) = gangway(&[
        "region",
        "--name",
        "r",
        "--database-url",
        "postgres://nowhere",
        "--tls-cert",
        cert,
        "--tls-key",
        cert,
    ]);
    assert!(!ok);
    assert!(err.contains("--tls-cert/--tls-key"), "{err}");
}

#[test]
fn an_agent_refuses_a_plain_http_region_unless_told_it_is_insecure() {
    let (ok, err) = gangway(&[
        "agent",
        "--region-url",
        "http://127.0.0.1:9",
        "--region",
        "r",
    ]);
    assert!(!ok);
    assert!(
        err.contains("plain http://") && err.contains("--insecure-http"),
        "{err}"
    );
    let (ok, err) = gangway(&[
        "agent",
        "--region-url",
        "https://127.0.0.1:9",
        "--region",
        "r",
    ]);
    assert!(!ok);
    assert!(err.contains("no CA"), "{err}");
}

#[test]
fn the_global_tier_refuses_a_plain_http_region_unless_told_it_is_insecure() {
    let (ok, err) = gangway(&[
        "global",
        "--tls-cert",
        "/nonexistent",
        "--tls-key",
        "/nonexistent",
        "--region",
        "r=http://127.0.0.1:9",
        "--tenant-key",
        "k=/nonexistent",
        "--service-signing-key",
        "k=/nonexistent",
    ]);
    assert!(!ok);
    assert!(
        err.contains("--region r") && err.contains("plain http://"),
        "{err}"
    );
}
