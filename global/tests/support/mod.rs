//! A small cloud in one test process, over real loopback HTTP(S): two
//! regions on a real throwaway PostgreSQL (fleets registered directly, no
//! agents: jobs stay queued or starting) and two global replicas on HTTPS.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use gangway_auth::dev::DevMaterial;
use gangway_auth::jwt::{claims_for, Claims, Role};
use gangway_global::config::{GlobalConfig, RateLimit, RegionEndpoint};
use gangway_global::GlobalState;
use gangway_regional::{AppState, RegionConfig};
use gangway_shared::agent::{AgentGpu, AgentNode, RegisterRequest};
use gangway_shared::client::Client;
use gangway_shared::tokens;
use tokio_util::sync::CancellationToken;

pub struct Cloud {
    pub auth: DevMaterial,
    pub ca: Vec<u8>,
    pub regions: Vec<(String, String, CancellationToken)>,
    /// The regions' own states (to overload one, say), in `regions`' order.
    pub states: Vec<AppState>,
    pub globals: Vec<String>,
    pub config: GlobalConfig,
    _dir: tempfile::TempDir,
    shutdown: CancellationToken,
}

impl Drop for Cloud {
    fn drop(&mut self) {
        self.shutdown.cancel();
        for (_, _, t) in &self.regions {
            t.cancel();
        }
    }
}

/// 2 nodes × 8 h100 in one leaf.
fn fleet() -> Vec<AgentNode> {
    (0..2)
        .map(|n| AgentNode {
            node_id: format!("n{n}"),
            spine: "s0".into(),
            leaf: "l0".into(),
            nvlink_domain: format!("n{n}"),
            gpu_type: "h100".into(),
            spare: false,
            address: "127.0.0.1".into(),
            gpus: (0..8)
                .map(|i| AgentGpu {
                    index: i,
                    uuid: format!("GPU-n{n}-{i}"),
                    ..AgentGpu::default()
                })
                .collect(),
            gpu_power_w: None,
            rack_power_budget_w: None,
        })
        .collect()
}

impl Cloud {
    /// Starts the cloud. `limited` names a tenant whose rate limit is tiny.
    pub async fn start() -> Cloud {
        Cloud::start_with(|_| {}).await
    }

    /// [`Cloud::start`], with the global tier's configuration changed by
    /// `configure` first.
    pub async fn start_with(configure: impl FnOnce(&mut GlobalConfig)) -> Cloud {
        let dir = tempfile::tempdir().unwrap();
        let auth = DevMaterial::load_or_create(dir.path()).unwrap();
        let service_verifier = gangway_auth::jwt::Verifier::new(
            tokens::ISSUER,
            tokens::REGION_AUDIENCE,
            &[auth.service_key.verifier_entry()],
        )
        .unwrap();
        let shutdown = CancellationToken::new();
        let mut regions = Vec::new();
        let mut states = Vec::new();
        for name in ["r1", "r2"] {
            let db = gangway_devkit::fresh_database(&format!("global_{name}")).await;
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr: SocketAddr = listener.local_addr().unwrap();
            let mut cfg = RegionConfig::new(name, addr, &db);
            cfg.auth = Some(service_verifier.clone());
            cfg.agent_timeout = Duration::from_secs(3600);
            // The regions serve TLS with the cloud's certificate, as in
            // production; the tier checks it against the cloud's CA.
            cfg.tls = Some(axum_server::tls_rustls::RustlsConfig::from_config(
                auth.server_config().unwrap(),
            ));
            let state: AppState = gangway_regional::prepare(cfg, Duration::from_secs(10))
                .await
                .unwrap();
            let req = RegisterRequest {
                agent_id: format!("{name}-agent"),
                boot_id: uuid::Uuid::new_v4(),
                executor: "sim".into(),
                nodes: fleet(),
                host_id: None,
            };
            state.store.admit_as_registered(&req).await.unwrap();
            state.store.register_agent(&req).await.unwrap();
            let token = CancellationToken::new();
            states.push(state.clone());
            tokio::spawn(gangway_regional::serve_on(listener, state, token.clone()));
            regions.push((name.to_string(), format!("https://{addr}"), token));
        }
        let mut config = GlobalConfig::new(
            std::fs::read_to_string(&auth.server_cert).unwrap(),
            std::fs::read_to_string(&auth.server_key).unwrap(),
            regions
                .iter()
                .map(|(n, u, _)| RegionEndpoint {
                    name: n.clone(),
                    url: u.clone(),
                })
                .collect(),
            vec![auth.tenant_key.verifier_entry()],
            auth.service_key.clone(),
        );
        config.region_ca_pem = Some(auth.ca_pem().unwrap());
        config.operator_keys = vec![auth.operator_key.verifier_entry()];
        config.health_interval = Duration::from_millis(100);
        config.unhealthy_after = Duration::from_millis(1000);
        config.tenant_rates = BTreeMap::from([(
            "limited".to_string(),
            RateLimit {
                per_second: 1,
                burst: 3,
            },
        )]);
        config.tenant_regions = BTreeMap::from([("boxed".to_string(), vec!["r2".to_string()])]);
        configure(&mut config);
        let mut globals = Vec::new();
        for _ in 0..2 {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = listener.local_addr().unwrap().port();
            tokio::spawn(gangway_global::serve(
                listener,
                config.clone(),
                shutdown.clone(),
            ));
            globals.push(format!("https://127.0.0.1:{port}"));
        }
        let ca = std::fs::read(&auth.ca_cert).unwrap();
        let cloud = Cloud {
            auth,
            ca,
            regions,
            states,
            globals,
            config,
            _dir: dir,
            shutdown,
        };
        // Both replicas up and seeing both regions.
        for g in 0..2 {
            let c = cloud.client(g, "acme");
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            loop {
                if let Ok(list) = c.regions().await {
                    if list.regions.iter().all(|r| r.healthy) {
                        break;
                    }
                }
                assert!(std::time::Instant::now() < deadline, "global {g} not ready");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        cloud
    }

    pub fn claims(&self, role: Role, tenant: Option<&str>) -> Claims {
        claims_for(
            role,
            "test",
            tenant,
            None,
            tokens::ISSUER,
            tokens::PUBLIC_AUDIENCE,
            Duration::from_secs(600),
        )
    }

    pub fn token(&self, tenant: &str) -> String {
        self.auth
            .tenant_key
            .sign(&self.claims(Role::Tenant, Some(tenant)))
            .unwrap()
    }

    pub fn admin_token(&self) -> String {
        self.auth
            .operator_key
            .sign(&self.claims(Role::Admin, None))
            .unwrap()
    }

    /// A client of global replica `g` acting as `tenant`.
    pub fn client(&self, g: usize, tenant: &str) -> Client {
        Client::public(self.globals[g].clone(), self.token(tenant), Some(&self.ca)).unwrap()
    }

    /// A raw HTTPS client trusting the dev CA.
    pub fn http(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&self.ca).unwrap())
            .build()
            .unwrap()
    }

    /// The global state (for driving the router in-process).
    pub fn state(&self) -> GlobalState {
        GlobalState::new(self.config.clone()).unwrap()
    }
}

pub fn spec(gpus: i64) -> serde_json::Value {
    serde_json::json!({
        "name": "t", "gpus": gpus, "gpu_type": "h100",
        "estimated_duration_s": 60, "command": ["true"]
    })
}
