//! TLS on the region's links (issue 21): the regional API served over
//! rustls with the cloud's certificate. An agent and a peer region that
//! trust the cloud's CA talk to it; ones that trust another CA, or speak
//! plain HTTP to it, get nothing through — and nothing is recorded.

mod common;

use std::time::Duration;

use common::*;
use gangway_agent::{AgentConfig, ExecutorKind};
use gangway_auth::dev::DevMaterial;
use gangway_regional::config::{Peer, PeerConfig};
use gangway_regional::replication::peers::{Heartbeat, PeerError, Peers};
use tokio_util::sync::CancellationToken;

/// A region (`rt`, no authentication, a peer `rp`, `node-a` of agent
/// `agent-1` in its inventory) served over TLS with a dev CA's certificate
/// for 127.0.0.1.
struct TlsRegion {
    url: String,
    port: u16,
    auth: DevMaterial,
    db: tokio_postgres::Client,
    stop: CancellationToken,
    _dir: tempfile::TempDir,
}

impl TlsRegion {
    async fn start(prefix: &str) -> TlsRegion {
        let dir = tempfile::tempdir().unwrap();
        let auth = DevMaterial::load_or_create(dir.path()).unwrap();
        let (store, db) = region_store(prefix, "rt").await;
        store
            .admit_as_registered(&gangway_shared::agent::RegisterRequest {
                agent_id: "agent-1".into(),
                boot_id: uuid::Uuid::new_v4(),
                executor: "sim".into(),
                nodes: vec![node("node-a", "s0", "s0-l0", "h100")],
                host_id: None,
            })
            .await
            .unwrap();
        let mut config = region_config("rt", &[("rp", "https://127.0.0.1:9".into())]);
        config.tls = Some(axum_server::tls_rustls::RustlsConfig::from_config(
            auth.server_config().unwrap(),
        ));
        let state = gangway_regional::AppState::new(store, config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = CancellationToken::new();
        tokio::spawn(gangway_regional::serve_on(listener, state, stop.clone()));
        TlsRegion {
            url: format!("https://127.0.0.1:{port}"),
            port,
            auth,
            db,
            stop,
            _dir: dir,
        }
    }

    async fn nodes(&self) -> i64 {
        (self.db.query_one("SELECT count(*) FROM nodes", &[]))
            .await
            .unwrap()
            .get(0)
    }
}

/// The CA of another cloud: a certificate it signed is not ours.
fn other_ca() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let pem = DevMaterial::load_or_create(dir.path())
        .unwrap()
        .ca_pem()
        .unwrap();
    (dir, pem)
}

fn agent_config(url: &str, ca: Option<String>, work: &std::path::Path) -> AgentConfig {
    AgentConfig {
        region_url: url.to_string(),
        region_ca_pem: ca,
        agent_id: "agent-1".into(),
        nodes: vec![node("node-a", "s0", "s0-l0", "h100")],
        executor: ExecutorKind::Sim,
        time_factor: 1.0,
        work_dir: work.to_path_buf(),
        default_sync_interval: Duration::from_millis(100),
        fence_after: None,
        token: None,
        machine_boot_id: Some("machine-boot-1".into()),
        health_poll_interval: Duration::from_secs(10),
        checkpoint_store: None,
        isolation: Default::default(),
    }
}

/// Runs an agent for `for_how_long`, then stops it.
async fn run_agent(config: AgentConfig, for_how_long: Duration) {
    let stop = CancellationToken::new();
    let agent = tokio::spawn(gangway_agent::run(config, stop.clone()));
    tokio::time::sleep(for_how_long).await;
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), agent).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_is_heard_only_over_tls_checked_against_the_clouds_ca() {
    let region = TlsRegion::start("tls_agent").await;
    let work = tempfile::tempdir().unwrap();
    let (_other, other_pem) = other_ca();

    // A certificate from another CA: the agent refuses the region (as it
    // would an impostor), so it registers nothing.
    run_agent(
        agent_config(&region.url, Some(other_pem), work.path()),
        Duration::from_secs(2),
    )
    .await;
    assert_eq!(region.nodes().await, 0, "nothing got through");
    // Plain HTTP to the TLS port: no answer either.
    let plain = format!("http://127.0.0.1:{}", region.port);
    run_agent(
        agent_config(&plain, None, work.path()),
        Duration::from_secs(2),
    )
    .await;
    assert_eq!(region.nodes().await, 0, "nothing got through");

    // Trusting the cloud's CA, it registers at once.
    let ca = region.auth.ca_pem().unwrap();
    let stop = CancellationToken::new();
    let agent = tokio::spawn(gangway_agent::run(
        agent_config(&region.url, Some(ca), work.path()),
        stop.clone(),
    ));
    let mut registered = 0;
    for _ in 0..100 {
        registered = region.nodes().await;
        if registered > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(registered, 1, "the agent's node registered over TLS");
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), agent).await;
    region.stop.cancel();
}

#[test]
fn an_agent_with_the_regions_ca_refuses_a_plain_http_url() {
    let work = tempfile::tempdir().unwrap();
    let plain = agent_config("http://127.0.0.1:7001", Some("x".into()), work.path());
    let e = plain.validate().unwrap_err().to_string();
    assert!(e.contains("plain http://"), "{e}");
}

fn peers(url: &str, ca: Option<String>) -> Peers {
    Peers::new(
        PeerConfig {
            peers: vec![Peer {
                name: "rt".into(),
                url: url.to_string(),
            }],
            ca_pem: ca,
            ..PeerConfig::default()
        },
        Duration::from_secs(30),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_is_heard_only_over_tls_checked_against_the_clouds_ca() {
    let region = TlsRegion::start("tls_peer").await;
    let hb = Heartbeat {
        from: "rp".into(),
        silent_s: Default::default(),
    };
    let path = "/internal/v1/peers/heartbeat";

    // Trusting another CA: refused before a byte of the heartbeat is sent.
    let (_other, other_pem) = other_ca();
    let answer: Result<Heartbeat, _> = peers(&region.url, Some(other_pem))
        .post("rt", path, &hb)
        .await;
    match answer {
        Err(PeerError::Transport { .. }) => {}
        other => panic!("a region with another CA's certificate was trusted: {other:?}"),
    }
    // With a CA, a plain http:// peer is not called at all.
    let plain = format!("http://127.0.0.1:{}", region.port);
    let ca = region.auth.ca_pem().unwrap();
    let answer: Result<Heartbeat, _> = peers(&plain, Some(ca.clone())).post("rt", path, &hb).await;
    assert!(answer.is_err(), "plain HTTP was used: {answer:?}");
    let heard: i64 = (region.db)
        .query_one("SELECT count(*) FROM peer_leases WHERE peer = 'rp'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(heard, 0, "no refused heartbeat was recorded");

    // Trusting the cloud's CA: the heartbeat is answered, as `rt`.
    let answer: Heartbeat = peers(&region.url, Some(ca))
        .post("rt", path, &hb)
        .await
        .unwrap();
    assert_eq!(answer.from, "rt");
    region.stop.cancel();
}

#[test]
fn a_region_refuses_plain_peers_when_it_has_a_ca_and_a_ca_that_is_not_pem() {
    let mut config = region_config("rt", &[("rp", "http://127.0.0.1:7002".into())]);
    config.peers.ca_pem = Some(String::new());
    let e = config.validate().unwrap_err();
    assert!(
        e.contains("--peer rp") && e.contains("plain http://"),
        "{e}"
    );
    let mut config = region_config("rt", &[("rp", "https://127.0.0.1:7002".into())]);
    config.peers.ca_pem = Some("not a certificate".into());
    let e = config.validate().unwrap_err();
    assert!(e.contains("CA"), "{e}");
}

/// The region's side of a CA rotated by SIGHUP (`gangway region` wires
/// these calls to the signal; tests/e2e_tls.rs sends it to real
/// processes): a peer whose certificate a new CA issued is refused until
/// the region's credentials are reloaded with that CA, then heard; a CA
/// file of garbage is refused by the reload and leaves the link as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_ca_reloaded_in_place_is_trusted_by_the_next_call() {
    use gangway_regional::credentials::Credentials;
    let region = TlsRegion::start("tls_peer_reload").await;
    let hb = Heartbeat {
        from: "rp".into(),
        silent_s: Default::default(),
    };
    let path = "/internal/v1/peers/heartbeat";
    let (_other, old_ca) = other_ca();
    let config = PeerConfig {
        peers: vec![Peer {
            name: "rt".into(),
            url: region.url.clone(),
        }],
        ca_pem: Some(old_ca),
        ..PeerConfig::default()
    };
    let credentials = Credentials::new(None, &config).unwrap();
    let peers = Peers::with_credentials(config, Duration::from_secs(30), credentials.clone());
    let refused: Result<Heartbeat, _> = peers.post("rt", path, &hb).await;
    assert!(
        matches!(refused, Err(PeerError::Transport { .. })),
        "{refused:?}"
    );

    // Garbage in the CA file: not even built; nothing changes.
    assert!(credentials.prepare(None, None, Some("garbage")).is_err());
    // No CA at all would be plain HTTP or the system's roots: refused.
    assert!(credentials.prepare(None, None, None).is_err());
    let refused: Result<Heartbeat, _> = peers.post("rt", path, &hb).await;
    assert!(refused.is_err(), "{refused:?}");

    // The new CA: the next call trusts it.
    let ca = region.auth.ca_pem().unwrap();
    credentials.install(credentials.prepare(None, None, Some(&ca)).unwrap());
    let answer: Heartbeat = peers.post("rt", path, &hb).await.unwrap();
    assert_eq!(answer.from, "rt");
    region.stop.cancel();
}

/// The agent's side of a CA rotated by SIGHUP (`gangway agent` re-reads
/// `--region-ca` and its token file into its [`gangway_agent::RegionLink`]):
/// an agent that does not trust the region's CA registers nothing; once
/// its link is reloaded with that CA, its next attempt registers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_link_reloaded_with_the_regions_ca_registers() {
    let region = TlsRegion::start("tls_agent_reload").await;
    let work = tempfile::tempdir().unwrap();
    let (_other, other_pem) = other_ca();
    let link = gangway_agent::RegionLink::new(None, Some(&other_pem)).unwrap();
    let stop = CancellationToken::new();
    let agent = tokio::spawn(gangway_agent::run_with_link(
        agent_config(&region.url, Some(other_pem), work.path()),
        link.clone(),
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(region.nodes().await, 0, "another CA's client got through");

    // A CA of garbage is refused, and the link stays as it was.
    assert!(link.prepare(None, Some("garbage")).is_err());
    // The region's CA: the next attempt (within the 5 s backoff) registers.
    let ca = region.auth.ca_pem().unwrap();
    link.install(link.prepare(None, Some(&ca)).unwrap());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while region.nodes().await == 0 {
        assert!(std::time::Instant::now() < deadline, "never registered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), agent).await;
    region.stop.cancel();
}
