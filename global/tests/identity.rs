//! Tenants' records and keys as the global tier reads them from the
//! regions (`identity.rs`): however many requests find a record's cache
//! entry run out at once, one read asks the regions.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::routing::get;
use axum::Router;
use gangway_global::config::{GlobalConfig, RegionEndpoint};
use gangway_global::identity::Kind;
use gangway_global::GlobalState;

/// Three "regions" (one HTTPS server that knows no records and answers
/// slowly) and a global state over them; the reads it was asked.
async fn slow_regions() -> (GlobalState, Arc<AtomicUsize>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let pki = gangway_auth::DevMaterial::load_or_create(dir.path()).unwrap();
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = asked.clone();
    let app = Router::new().route(
        "/internal/v1/identity/{kind}/{id}",
        get(move || {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                (
                    axum::http::StatusCode::NOT_FOUND,
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    r#"{"code":"not_found","message":"record not found"}"#,
                )
            }
        }),
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "https://127.0.0.1:{}",
        listener.local_addr().unwrap().port()
    );
    let tls = axum_server::tls_rustls::RustlsConfig::from_config(pki.server_config().unwrap());
    listener.set_nonblocking(true).unwrap();
    let server = axum_server::from_tcp_rustls(listener, tls).unwrap();
    tokio::spawn(server.serve(app.into_make_service()));
    let regions = ["a", "b", "c"]
        .map(|name| RegionEndpoint {
            name: name.into(),
            url: url.clone(),
        })
        .to_vec();
    let mut config = GlobalConfig::new(
        std::fs::read_to_string(&pki.server_cert).unwrap(),
        std::fs::read_to_string(&pki.server_key).unwrap(),
        regions,
        vec![pki.tenant_key.verifier_entry()],
        pki.service_key.clone(),
    );
    config.region_ca_pem = Some(pki.ca_pem().unwrap());
    (GlobalState::new(config).unwrap(), asked, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_find_a_record_uncached_together_cost_one_read() {
    let (state, asked, _dir) = slow_regions().await;
    let reads = (0..32).map(|_| state.identity.read(&state.regions, Kind::Tenant, "acme"));
    for r in futures_util::future::join_all(reads).await {
        assert_eq!(r.unwrap(), None, "no region holds a record");
    }
    // One read: each of the three regions asked once (the third may
    // still be answering when a majority has).
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(asked.load(Ordering::SeqCst), 3);
    // Cached now: asked again by nobody.
    state
        .identity
        .read(&state.regions, Kind::Tenant, "acme")
        .await
        .unwrap();
    assert_eq!(asked.load(Ordering::SeqCst), 3);
    // Another record is a read of its own.
    state
        .identity
        .read(&state.regions, Kind::Key, "0123456789abcdef")
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(asked.load(Ordering::SeqCst), 6);
}
