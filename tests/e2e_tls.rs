//! Every role refuses to start with a plain-HTTP link unless the operator
//! says so (issue 21): the region without its certificate, the agent and
//! the global tier with an http:// region, a TLS region without the CA its
//! peers are checked against. Each refusal names the flags to pass; the
//! `--insecure-http` escape hatch says what it gives up. And a certificate
//! rotated on disk is taken on SIGHUP, with open connections carrying on.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gangway_auth::dev::DevMaterial;
use support::{log_file, Proc, BIN};

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

/// A client of the cloud's services that trusts `ca` alone.
fn trusting(ca: &str) -> reqwest::Client {
    gangway_shared::client::internal_client(
        reqwest::Client::builder().timeout(Duration::from_secs(5)),
        Some(ca),
    )
    .unwrap()
}

/// Copies `from`'s certificate and key over the server's files, the key
/// first, each by an atomic rename (as a certificate manager does).
fn install(from: &DevMaterial, cert: &std::path::Path, key: &std::path::Path) {
    for (src, dst) in [(&from.server_key, key), (&from.server_cert, cert)] {
        let tmp = dst.with_extension("tmp");
        std::fs::copy(src, &tmp).unwrap();
        std::fs::rename(&tmp, dst).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_takes_a_rotated_certificate_on_sighup_and_open_connections_carry_on() {
    let db = gangway_devkit::fresh_database("e2e_tls_rotate").await;
    let dir = tempfile::tempdir().unwrap();
    let old = DevMaterial::load_or_create(&dir.path().join("old")).unwrap();
    let new = DevMaterial::load_or_create(&dir.path().join("new")).unwrap();
    let (cert, key) = (
        dir.path().join("region.pem"),
        dir.path().join("region-key.pem"),
    );
    install(&old, &cert, &key);
    let port = gangway_devkit::free_port();
    let mut region = Proc(
        Command::new(BIN)
            .args(["region", "--name", "r", "--insecure-no-auth"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key)
            .env("GANGWAY_DATABASE_URL", &db)
            .env("GANGWAY_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log_file(dir.path(), "region.log"))
            .spawn()
            .unwrap(),
    );
    let health = format!("https://127.0.0.1:{port}/healthz");
    let log = || std::fs::read_to_string(dir.path().join("region.log")).unwrap_or_default();
    let (old_ca, new_ca) = (old.ca_pem().unwrap(), new.ca_pem().unwrap());

    // Up with the old certificate; a client of the old CA holds a
    // connection open (kept alive in its pool).
    let before = trusting(&old_ca);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !before
        .get(&health)
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(
            Instant::now() < deadline,
            "the region never answered; log: {}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        trusting(&new_ca).get(&health).send().await.is_err(),
        "the new CA's clients cannot trust the old certificate"
    );

    // Rotated on disk, then SIGHUP: new connections get the new one.
    install(&new, &cert, &key);
    let pid = region.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while trusting(&new_ca).get(&health).send().await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the rotated certificate was never served; log: {}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        region.0.try_wait().unwrap().is_none(),
        "SIGHUP stopped the region"
    );
    assert!(log().contains("reloaded on SIGHUP"), "{}", log());
    // The connection opened before the rotation carries on.
    let r = before
        .get(&health)
        .send()
        .await
        .expect("an open connection was dropped");
    assert!(r.status().is_success());
    // A new connection trusting only the old CA is refused now.
    assert!(trusting(&old_ca).get(&health).send().await.is_err());

    // A broken pair on disk: the SIGHUP leaves the one in use.
    std::fs::write(&key, "not a key").unwrap();
    assert!(Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !log().contains("not reloaded on SIGHUP") {
        assert!(Instant::now() < deadline, "{}", log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = trusting(&new_ca).get(&health).send().await.unwrap();
    assert!(r.status().is_success());
}
