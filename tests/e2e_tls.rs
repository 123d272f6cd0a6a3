//! Every role refuses to start with a plain-HTTP link unless the operator
//! says so (issue 21): the region without its certificate, the agent and
//! the global tier with an http:// region, a TLS region without the CA its
//! peers are checked against. Each refusal names the flags to pass; the
//! `--insecure-http` escape hatch says what it gives up. And a certificate
//! rotated on disk is taken on SIGHUP, with open connections carrying on;
//! so are keys and CAs, with requests in flight finishing, and a bad file
//! leaves everything as it was.

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
    // The verdict is logged once the new certificate is in use, so a
    // client may be served it a moment before the line is written.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !log().contains("reloaded on SIGHUP") {
        assert!(Instant::now() < deadline, "{}", log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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

// Keys and CAs rotated on SIGHUP (issue 21). Every role reloads through
// the same code: `deploy/src/signals.rs`'s `Reload` (build every part from
// its files, install them all or none) over `gangway_shared::reload::
// Reloadable` (each request or call keeps the generation it started
// with), and every client between services is `gangway_shared::client::
// internal_client`. So the global tier's tenant keys and its link to the
// regions, tested here, stand for the region's service keys, its peer
// signing key and its link to its peers (`--service-key`,
// `--peer-signing-key`, `--ca`), and the agent's `--region-ca` and token
// file; regional/tests/tls.rs swaps a region's peer CA and an agent's CA
// in process.

/// Writes `text` over `path` by an atomic rename, as a certificate or key
/// manager does.
fn replace_file(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn hangup(p: &Proc) {
    let pid = p.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
}

/// A public-API token signed by `key`: a tenant's (naming `acme`) or an
/// operator's.
fn api_token(key: &gangway_auth::jwt::SigningKey, role: gangway_auth::jwt::Role) -> String {
    use gangway_auth::jwt::Role;
    let tenant = (role == Role::Tenant).then_some("acme");
    key.sign(&gangway_auth::jwt::claims_for(
        role,
        "e2e",
        tenant,
        None,
        gangway_shared::tokens::ISSUER,
        gangway_shared::tokens::PUBLIC_AUDIENCE,
        Duration::from_secs(3600),
    ))
    .unwrap()
}

/// A region (TLS with `cert`'s material, tokens verified with `auth`'s
/// service key) and a global tier in front of it, the tier trusting
/// `region_ca` (a file the test may rewrite) and verifying tenant tokens
/// with `tenant_key` (`KID=PATH`).
struct RotationCloud {
    dir: tempfile::TempDir,
    region: Proc,
    global: Proc,
    base: String,
    ca: String,
}

impl RotationCloud {
    async fn start(
        db_name: &str,
        dir: tempfile::TempDir,
        auth: &DevMaterial,
        region_cert: &DevMaterial,
        region_ca: &std::path::Path,
        (tenant_key, operator_key): (&str, &str),
    ) -> RotationCloud {
        use support::key_arg;
        let db = gangway_devkit::fresh_database(db_name).await;
        let (rport, gport) = (gangway_devkit::free_port(), gangway_devkit::free_port());
        let region = Proc(
            Command::new(BIN)
                .args(["region", "--name", "r"])
                .args(["--listen", &format!("127.0.0.1:{rport}")])
                .arg("--tls-cert")
                .arg(&region_cert.server_cert)
                .arg("--tls-key")
                .arg(&region_cert.server_key)
                .args(["--service-key", &key_arg(auth, "service-signing.pub.pem")])
                .env("GANGWAY_DATABASE_URL", &db)
                .env("GANGWAY_LOG", "info")
                .stdout(Stdio::null())
                .stderr(log_file(dir.path(), "region.log"))
                .spawn()
                .unwrap(),
        );
        let global = Proc(
            Command::new(BIN)
                .args(["global", "--listen", &format!("127.0.0.1:{gport}")])
                .arg("--tls-cert")
                .arg(&auth.server_cert)
                .arg("--tls-key")
                .arg(&auth.server_key)
                .arg("--region-ca")
                .arg(region_ca)
                .args(["--tenant-key", tenant_key])
                .args(["--operator-key", operator_key])
                .args([
                    "--service-signing-key",
                    &key_arg(auth, "service-signing.pem"),
                ])
                .args(["--region", &format!("r=https://127.0.0.1:{rport}")])
                .env("GANGWAY_LOG", "info")
                .stdout(Stdio::null())
                .stderr(log_file(dir.path(), "global.log"))
                .spawn()
                .unwrap(),
        );
        RotationCloud {
            dir,
            region,
            global,
            base: format!("https://127.0.0.1:{gport}"),
            ca: auth.ca_pem().unwrap(),
        }
    }

    fn logs(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default();
        format!(
            "global:\n{}\nregion:\n{}",
            read("global.log"),
            read("region.log")
        )
    }

    fn global_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("global.log")).unwrap_or_default()
    }

    /// `GET /v1/regions` with `token`: its status, and region r's view.
    async fn regions(&self, token: &str) -> (u16, Option<gangway_shared::api::RegionInfo>) {
        let Ok(resp) = trusting(&self.ca)
            .get(format!("{}/v1/regions", self.base))
            .bearer_auth(token)
            .send()
            .await
        else {
            return (0, None);
        };
        let status = resp.status().as_u16();
        let list: Option<gangway_shared::api::RegionList> = resp.json().await.ok();
        (status, list.and_then(|l| l.regions.into_iter().next()))
    }

    /// Polls until `done` holds of `GET /v1/regions` with `token`.
    async fn until(
        &self,
        token: &str,
        what: &str,
        done: impl Fn(u16, Option<&gangway_shared::api::RegionInfo>) -> bool,
    ) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (status, region) = self.regions(token).await;
            if done(status, region.as_ref()) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: last {status} {region:?}; logs:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sends SIGHUP to the global tier and waits for its verdict in the
    /// log (the `n`th reload): whether it took the files.
    async fn reload_global(&self, n: usize) -> bool {
        hangup(&self.global);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.global_log();
            // Every verdict line says "reloaded on SIGHUP", a refusal
            // "not reloaded on SIGHUP".
            let verdicts: Vec<&str> = (log.lines())
                .filter(|l| l.contains("reloaded on SIGHUP"))
                .collect();
            if verdicts.len() >= n {
                assert_eq!(verdicts.len(), n, "{log}");
                return !verdicts[n - 1].contains("not reloaded");
            }
            assert!(Instant::now() < deadline, "no word of the reload: {log}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A request on its own connection whose body is held back: sent with
/// `Expect: 100-continue`, it is under way once the server asks for the
/// body — past authentication, in the handler — and finishes when
/// [`HeldRequest::finish`] sends the body.
struct HeldRequest {
    tls: rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>,
    body: String,
}

impl HeldRequest {
    /// Starts `method path` with `token`; returns once the server asked
    /// for the body, or panics with what it answered instead.
    fn start(base: &str, ca: &str, method: &str, path: &str, token: &str, body: &str) -> Self {
        use std::io::Write;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let addr = base.trim_start_matches("https://");
        let config = gangway_auth::tls::client_config(ca).unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let conn = rustls::ClientConnection::new(config, name).unwrap();
        let sock = std::net::TcpStream::connect(addr).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut tls = rustls::StreamOwned::new(conn, sock);
        write!(
            tls,
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\
             Expect: 100-continue\r\n\r\n",
            body.len()
        )
        .unwrap();
        tls.flush().unwrap();
        let mut held = HeldRequest {
            tls,
            body: body.to_string(),
        };
        let head = held.read_head();
        assert!(
            head.starts_with("HTTP/1.1 100"),
            "the request was not let in: {head}"
        );
        held
    }

    /// Reads one response head (up to the blank line).
    fn read_head(&mut self) -> String {
        use std::io::Read;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            let n = self
                .tls
                .read(&mut byte)
                .expect("the connection was dropped");
            assert!(
                n == 1,
                "the connection was closed: {}",
                String::from_utf8_lossy(&head)
            );
            head.push(byte[0]);
        }
        String::from_utf8_lossy(&head).into_owned()
    }

    /// Sends the body and returns the final answer's head.
    fn finish(mut self) -> String {
        use std::io::Write;
        self.tls.write_all(self.body.as_bytes()).unwrap();
        self.tls.flush().unwrap();
        self.read_head()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_key_rotated_by_sighup_serves_the_next_request_while_one_in_flight_finishes() {
    use gangway_auth::jwt::{Role, SigningKey};
    let dir = tempfile::tempdir().unwrap();
    let auth = DevMaterial::load_or_create(&dir.path().join("cloud")).unwrap();
    // The tenants' signing key, rotated under its kid by the recipe of
    // docs/deployment.md: the new public key beside the old in the
    // verifier's file, SIGHUP; (the signer switches); the old one dropped,
    // SIGHUP.
    let (a, b, c) = (
        SigningKey::generate("tenant-1"),
        SigningKey::generate("tenant-1"),
        SigningKey::generate("tenant-1"),
    );
    // The operators' key rotates in step (a file of its own).
    let (op_a, op_b) = (
        SigningKey::generate("operator-1"),
        SigningKey::generate("operator-1"),
    );
    let key_file = dir.path().join("tenant.pub.pem");
    replace_file(&key_file, &a.public_pem());
    let operator_file = dir.path().join("operator.pub.pem");
    replace_file(&operator_file, &op_a.public_pem());
    let region_ca = dir.path().join("region-ca.pem");
    replace_file(&region_ca, &auth.ca_pem().unwrap());
    let mut cloud = RotationCloud::start(
        "e2e_tls_key_rotation",
        dir,
        &auth,
        &auth,
        &region_ca,
        (
            &format!("tenant-1={}", key_file.display()),
            &format!("operator-1={}", operator_file.display()),
        ),
    )
    .await;
    let (tenant_a, tenant_b, tenant_c) = (
        api_token(&a, Role::Tenant),
        api_token(&b, Role::Tenant),
        api_token(&c, Role::Tenant),
    );
    cloud
        .until(&tenant_a, "the cloud with key A", |s, r| {
            s == 200 && r.is_some_and(|r| r.healthy)
        })
        .await;
    assert_eq!(
        cloud.regions(&tenant_b).await.0,
        401,
        "B before the rotation"
    );

    // An operator's request under way, authenticated with key A: its body
    // is still to come when the key changes.
    let base = cloud.base.clone();
    let ca = cloud.ca.clone();
    let admin_a = api_token(&op_a, Role::Admin);
    let held = tokio::task::spawn_blocking(move || {
        HeldRequest::start(
            &base,
            &ca,
            "PUT",
            "/v1/admin/limits/acme",
            &admin_a,
            r#"{"max_queued_jobs": 7}"#,
        )
    })
    .await
    .unwrap();

    // B beside A, then SIGHUP: tokens of either verify.
    replace_file(&key_file, &format!("{}{}", a.public_pem(), b.public_pem()));
    replace_file(
        &operator_file,
        &format!("{}{}", op_a.public_pem(), op_b.public_pem()),
    );
    assert!(cloud.reload_global(1).await, "{}", cloud.logs());
    assert_eq!(cloud.regions(&tenant_b).await.0, 200, "B beside A");
    assert_eq!(cloud.regions(&tenant_a).await.0, 200, "A beside B");
    // A dropped, then SIGHUP: the next requests are checked with B alone.
    replace_file(&key_file, &b.public_pem());
    replace_file(&operator_file, &op_b.public_pem());
    assert!(cloud.reload_global(2).await, "{}", cloud.logs());
    assert_eq!(
        cloud.regions(&tenant_b).await.0,
        200,
        "B after the rotation"
    );
    assert_eq!(
        cloud.regions(&tenant_a).await.0,
        401,
        "A after the rotation"
    );

    // The request that was under way finishes, and did its work.
    let head = tokio::task::spawn_blocking(move || held.finish())
        .await
        .unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}\n{}", cloud.logs());
    let limits = trusting(&cloud.ca)
        .get(format!("{}/v1/admin/limits", cloud.base))
        .bearer_auth(api_token(&op_b, Role::Admin))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(limits.contains("\"max_queued_jobs\":7"), "{limits}");

    // Garbage where the key was: the reload is refused, said so, and B
    // still verifies.
    replace_file(
        &key_file,
        "-----BEGIN PUBLIC KEY-----\ngarbage\n-----END PUBLIC KEY-----\n",
    );
    assert!(!cloud.reload_global(3).await, "{}", cloud.logs());
    assert!(
        cloud.global_log().contains("--tenant-key"),
        "{}",
        cloud.logs()
    );
    assert_eq!(
        cloud.regions(&tenant_b).await.0,
        200,
        "B after a bad reload"
    );

    // A good key C but a garbage CA beside it: all or nothing — C is not
    // taken either, and B still verifies.
    replace_file(&key_file, &c.public_pem());
    replace_file(&region_ca, "not a certificate");
    assert!(!cloud.reload_global(4).await, "{}", cloud.logs());
    assert_eq!(cloud.regions(&tenant_c).await.0, 401, "C half-loaded");
    let (status, region) = cloud.regions(&tenant_b).await;
    assert_eq!(status, 200);
    assert!(region.is_some_and(|r| r.healthy), "the old CA stays in use");
    for p in [&mut cloud.global, &mut cloud.region] {
        assert!(p.0.try_wait().unwrap().is_none(), "SIGHUP stopped a server");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_tier_trusts_a_regions_ca_rotated_by_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let old = DevMaterial::load_or_create(&dir.path().join("old")).unwrap();
    // The region's certificate was reissued by a new CA; the tier still
    // trusts only the old one.
    let new = DevMaterial::load_or_create(&dir.path().join("new")).unwrap();
    let region_ca = dir.path().join("region-ca.pem");
    replace_file(&region_ca, &old.ca_pem().unwrap());
    let tenant_key = support::key_arg(&old, "tenant-signing.pub.pem");
    let operator_key = support::key_arg(&old, "operator-signing.pub.pem");
    let cloud = RotationCloud::start(
        "e2e_tls_ca_rotation",
        dir,
        &old,
        &new,
        &region_ca,
        (&tenant_key, &operator_key),
    )
    .await;
    let token = api_token(&old.tenant_key, gangway_auth::jwt::Role::Tenant);
    cloud
        .until(&token, "a certificate error to the region", |s, r| {
            s == 200
                && r.is_some_and(|r| {
                    !r.healthy
                        && r.last_error
                            .as_deref()
                            .is_some_and(|e| e.contains("certificate"))
                })
        })
        .await;

    // Both CAs in the file while the regions move over, then SIGHUP.
    let bundle = format!("{}{}", old.ca_pem().unwrap(), new.ca_pem().unwrap());
    replace_file(&region_ca, &bundle);
    assert!(cloud.reload_global(1).await, "{}", cloud.logs());
    cloud
        .until(&token, "the region reached with the new CA", |s, r| {
            s == 200 && r.is_some_and(|r| r.healthy)
        })
        .await;

    // The region re-reads its certificate and its service key on SIGHUP
    // too, and the tier's calls (service tokens verified with the
    // reloaded key) go on being answered.
    hangup(&cloud.region);
    let region_log =
        || std::fs::read_to_string(cloud.dir.path().join("region.log")).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !region_log().contains("reloaded on SIGHUP") {
        assert!(Instant::now() < deadline, "{}", cloud.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!region_log().contains("not reloaded"), "{}", cloud.logs());
    let answered = trusting(&cloud.ca)
        .put(format!("{}/v1/admin/limits/acme", cloud.base))
        .bearer_auth(api_token(&old.operator_key, gangway_auth::jwt::Role::Admin))
        .json(&serde_json::json!({"max_gpus": 8}))
        .send()
        .await
        .unwrap();
    assert_eq!(answered.status(), 200, "{}", cloud.logs());
}

/// `gangway login` stores a profile's credentials privately, checked
/// first (a token the API refuses is never stored), and commands use them
/// from any directory: a named profile, or the default one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gangway_login_keeps_private_profiles_that_commands_use() {
    use gangway_auth::jwt::Role;
    use std::io::Write as _;
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let auth = DevMaterial::load_or_create(&dir.path().join("cloud")).unwrap();
    let region_ca = dir.path().join("region-ca.pem");
    replace_file(&region_ca, &auth.ca_pem().unwrap());
    let (home, elsewhere) = (dir.path().join("home"), dir.path().join("elsewhere"));
    std::fs::create_dir_all(&elsewhere).unwrap();
    let tenant_key = support::key_arg(&auth, "tenant-signing.pub.pem");
    let operator_key = support::key_arg(&auth, "operator-signing.pub.pem");
    let cloud = RotationCloud::start(
        "e2e_tls_login",
        dir,
        &auth,
        &auth,
        &region_ca,
        (&tenant_key, &operator_key),
    )
    .await;
    let tenant = api_token(&auth.tenant_key, Role::Tenant);
    let admin = api_token(&auth.operator_key, Role::Admin);
    cloud
        .until(&tenant, "the cloud up", |s, r| {
            s == 200 && r.is_some_and(|r| r.healthy)
        })
        .await;
    // The CLI as a person runs it: no GANGWAY_* variables, a directory
    // without a local cloud, the token on standard input.
    let gangway = |args: &[&str], stdin: &str| {
        let mut cmd = Command::new(BIN);
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("GANGWAY_")) {
            cmd.env_remove(k);
        }
        let mut child = cmd
            .args(args)
            .env("HOME", &home)
            .env_remove("XDG_CONFIG_HOME")
            .current_dir(&elsewhere)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let ca = region_ca.to_str().unwrap().to_string();
    let base = cloud.base.clone();
    let login = |profile: &str, extra: &[&str], token: &str| {
        let mut args = vec![
            "login",
            "--profile",
            profile,
            "--url",
            &base,
            "--ca-cert",
            &ca,
        ];
        args.extend_from_slice(extra);
        gangway(&args, token)
    };

    // Nothing stored yet: the command says how to log in.
    let (ok, out) = gangway(&["regions"], "");
    assert!(!ok && out.contains("gangway login"), "{out}");

    let (ok, out) = login("prod", &[], &format!("{tenant}\n"));
    assert!(ok, "{out}");
    let (ok, out) = login("prod", &["--admin"], &admin);
    assert!(ok, "{out}");
    let file = home.join(".config/gangway/credentials.toml");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(file.parent().unwrap()), 0o700);

    // Commands use the profile from anywhere, each with its own token.
    let (ok, out) = gangway(&["regions", "--profile", "prod"], "");
    assert!(ok && out.contains('r'), "{out}");
    let (ok, out) = gangway(&["job", "list", "--profile", "prod"], "");
    assert!(ok, "{out}");
    let (ok, out) = gangway(&["admin", "quota", "list", "--profile", "prod"], "");
    assert!(ok, "{out}");

    // Refused tokens are never stored: garbage, a token signed by a key the
    // tier does not trust, a tenant's token offered as an operator's.
    let stranger = gangway_auth::jwt::SigningKey::generate(auth.tenant_key.kid());
    for (profile, extra, token) in [
        ("bad", &[][..], "not-a-token".to_string()),
        ("bad", &[][..], api_token(&stranger, Role::Tenant)),
        ("bad", &["--admin"][..], tenant.clone()),
    ] {
        let (ok, out) = login(profile, extra, &token);
        assert!(!ok && out.contains("nothing was stored"), "{out}");
    }
    let stored = std::fs::read_to_string(&file).unwrap();
    assert!(!stored.contains("[profiles.bad]"), "{stored}");

    // The default profile needs no flag at all.
    let (ok, out) = login("default", &[], &tenant);
    assert!(ok, "{out}");
    let (ok, out) = gangway(&["job", "list"], "");
    assert!(ok, "{out}");

    // Logged out: gone, the others kept.
    let (ok, out) = gangway(&["logout", "--profile", "prod"], "");
    assert!(ok, "{out}");
    let (ok, out) = gangway(&["regions", "--profile", "prod"], "");
    assert!(!ok && out.contains("no profile"), "{out}");
    let (ok, out) = gangway(&["regions"], "");
    assert!(ok, "{out}");
}
