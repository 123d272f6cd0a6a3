//! TLS between the global tier and the regions (issue 21): the test cloud's
//! regions serve the cloud's certificate and the tier trusts the cloud's
//! CA alone, so every test through `support::Cloud` crosses that link over
//! TLS. Here, the attacker's side: a region whose certificate another CA
//! signed is unreachable, and a plain http:// region is refused at start.

mod support;

use axum::http::Method;
use gangway_auth::dev::DevMaterial;
use gangway_global::config::RegionEndpoint;
use gangway_global::regions::{Call, Regions};
use support::Cloud;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tier_reaches_regions_only_through_certificates_of_the_clouds_ca() {
    let cloud = Cloud::start().await;

    // The cloud's own CA: the region answers.
    let ours = Regions::new(&cloud.config).unwrap();
    let r1 = ours.get("r1").unwrap();
    let answer = ours
        .call(r1, Method::GET, "/v1/region", Call::default())
        .await
        .unwrap();
    assert!(answer.status.is_success(), "{:?}", answer.status);

    // Another cloud's CA: the same region is an impostor to this tier.
    let other = tempfile::tempdir().unwrap();
    let mut config = cloud.config.clone();
    config.region_ca_pem = Some(
        DevMaterial::load_or_create(other.path())
            .unwrap()
            .ca_pem()
            .unwrap(),
    );
    let theirs = Regions::new(&config).unwrap();
    let r1 = theirs.get("r1").unwrap();
    let refused = theirs
        .call(r1, Method::GET, "/v1/region", Call::default())
        .await;
    assert!(refused.is_err(), "a certificate of another CA was trusted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_http_region_is_refused_at_start_when_the_tier_has_a_ca() {
    let cloud = Cloud::start().await;
    let mut config = cloud.config.clone();
    let url = cloud.regions[0].1.replacen("https://", "http://", 1);
    config.regions = vec![RegionEndpoint {
        name: "r1".into(),
        url,
    }];
    let e = Regions::new(&config).err().expect("refused").to_string();
    assert!(
        e.contains("--region r1") && e.contains("plain http://"),
        "{e}"
    );
}
