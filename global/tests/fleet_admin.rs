//! Operators' node endpoints and the audit log through the global tier:
//! passed to the right region with the operator's name, which the region's
//! audit log keeps; tenants get 403 on all of them.

mod support;

use reqwest::StatusCode;
use serde_json::{json, Value};
use support::Cloud;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_act_on_nodes_and_read_the_audit_log_and_tenants_may_not() {
    let cloud = Cloud::start().await;
    let http = cloud.http();
    let g = &cloud.globals[0];
    let admin = cloud.admin_token();
    let tenant = cloud.token("acme");

    // Tenants: 403 on every operator endpoint, the audit log included.
    for (method, path) in [
        ("GET", "/v1/admin/audit"),
        ("GET", "/v1/admin/nodes"),
        ("GET", "/v1/admin/nodes/n0?region=r1"),
        ("POST", "/v1/admin/nodes/n0/cordon?region=r1"),
        ("POST", "/v1/admin/nodes/n0/drain?region=r1"),
        ("POST", "/v1/admin/nodes/n0/faults?region=r1"),
    ] {
        let r = http
            .request(method.parse().unwrap(), format!("{g}{path}"))
            .bearer_auth(&tenant)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{method} {path}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["code"], "forbidden");
    }

    // An operator cordons a node of r1 and injects a fault into r2's n1.
    let r = http
        .post(format!("{g}/v1/admin/nodes/n0/cordon?region=r1"))
        .bearer_auth(&admin)
        .json(&json!({"reason": "fan replacement"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let node: Value = r.json().await.unwrap();
    assert_eq!(node["admin_state"], "cordoned");
    assert_eq!(node["region"], "r1");
    let r = http
        .post(format!("{g}/v1/admin/nodes/n1/faults?region=r2"))
        .bearer_auth(&admin)
        .json(&json!({"kind": "xid", "gpu": 0, "code": 48}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let node: Value = r.json().await.unwrap();
    assert_eq!(node["observed"], "degraded");
    assert_eq!(node["usable_gpus"], json!([1, 2, 3, 4, 5, 6, 7]));
    // The region's refusal comes back with its code.
    let r = http
        .post(format!("{g}/v1/admin/nodes/n0/drain?region=r1"))
        .bearer_auth(&admin)
        .json(&json!({"deadline_s": -1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], "invalid_drain");
    let r = http
        .get(format!("{g}/v1/admin/nodes/nowhere-n9"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);

    // Every region's nodes, and one node with its events.
    let r = http
        .get(format!("{g}/v1/admin/nodes"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    let all: Value = r.json().await.unwrap();
    for region in ["r1", "r2"] {
        assert_eq!(all["regions"][region]["nodes"].as_array().unwrap().len(), 2);
    }
    let r = http
        .get(format!("{g}/v1/admin/nodes/n0?region=r1"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    let n0: Value = r.json().await.unwrap();
    assert!(n0["why"].as_str().unwrap().contains("fan replacement"));
    assert!(n0["events"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["kind"] == "admin"));

    // The audit log names the operator (the admin token's subject).
    let r = http
        .get(format!("{g}/v1/admin/audit"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let log: Value = r.json().await.unwrap();
    let r1 = log["regions"]["r1"]["entries"].as_array().unwrap();
    assert_eq!(r1.len(), 1);
    assert_eq!(
        (
            &r1[0]["actor"],
            &r1[0]["action"],
            &r1[0]["target"],
            &r1[0]["reason"]
        ),
        (
            &json!("test"),
            &json!("node.cordon"),
            &json!("n0"),
            &json!("fan replacement")
        )
    );
    let r2 = log["regions"]["r2"]["entries"].as_array().unwrap();
    assert_eq!(r2[0]["action"], "node.fault");
    assert_eq!(r2[0]["detail"]["fault"]["code"], 48);
    let r = http
        .get(format!("{g}/v1/admin/audit?region=r1&action=node.fault"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    let none: Value = r.json().await.unwrap();
    assert_eq!(none["regions"]["r1"]["entries"], json!([]));
    assert!(none["regions"].get("r2").is_none());
    let r = http
        .get(format!("{g}/v1/admin/audit?limit=0"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
}

/// An operator mints a token for one machine of one region through the
/// global tier; it registers only as that machine, only there, and only
/// once the machine is admitted (found by its name in whichever region
/// listed it as unknown).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_token_is_for_one_machine_of_one_region_which_an_operator_admits() {
    let cloud = Cloud::start().await;
    let http = cloud.http();
    let g = &cloud.globals[0];
    let admin = cloud.admin_token();
    let r = http
        .post(format!("{g}/v1/admin/agents/gpu-x9/token?region=r1"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let minted: Value = r.json().await.unwrap();
    assert_eq!(
        (&minted["agent_id"], &minted["region"]),
        (&json!("gpu-x9"), &json!("r1"))
    );
    let token = minted["token"].as_str().unwrap().to_string();
    // Without a region named, with two regions: refused.
    let r = http
        .post(format!("{g}/v1/admin/agents/gpu-x9/token"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);

    let url = |i: usize| cloud.regions[i].1.clone();
    let register = |agent: &str| {
        json!({"agent_id": agent, "boot_id": uuid::Uuid::new_v4(), "executor": "real",
               "host_id": "h1",
               "nodes": [{"node_id": "gpu-x9", "gpu_type": "h100", "address": "10.0.0.9",
                          "gpus": [{"index": 0, "uuid": "GPU-x9-0"}]}]})
    };
    let call = |base: String, body: Value| {
        let (http, token) = (http.clone(), token.clone());
        async move {
            let r = http
                .post(format!("{base}/internal/v1/agents/register"))
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = r.status();
            let body: Value = r.json().await.unwrap_or(Value::Null);
            (status, body["code"].as_str().unwrap_or("").to_string())
        }
    };
    // Not in r1's inventory: refused, listed as unknown.
    assert_eq!(
        call(url(0), register("gpu-x9")).await,
        (StatusCode::FORBIDDEN, "unknown_node".to_string())
    );
    // As another agent, or in another region: refused.
    assert_eq!(
        call(url(0), register("gpu-x8")).await,
        (StatusCode::FORBIDDEN, "wrong_agent".to_string())
    );
    assert_eq!(
        call(url(1), register("gpu-x9")).await,
        (StatusCode::FORBIDDEN, "forbidden".to_string())
    );
    let nodes: Value = http
        .get(format!("{g}/v1/admin/nodes"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        nodes["regions"]["r1"]["unknown"][0]["node_id"], "gpu-x9",
        "{nodes:#}"
    );
    // Admitted through the global tier (no region named: r1 has it).
    let r = http
        .post(format!("{g}/v1/admin/nodes/gpu-x9/admit"))
        .bearer_auth(&admin)
        .json(&json!({"spine": "s0", "leaf": "s0-l0", "reason": "new rack"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(call(url(0), register("gpu-x9")).await.0, StatusCode::OK);
    let audit: Value = http
        .get(format!("{g}/v1/admin/audit?region=r1&action=node.admit"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let entries = audit["regions"]["r1"]["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{audit:#}");
    assert_eq!(entries[0]["target"], "gpu-x9");
}
