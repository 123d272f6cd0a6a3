//! The OpenAPI document at `/v1/openapi.json`: that it describes the router
//! as it is (every public route, no internal one, auth where the router
//! asks for it), every schema and every error code, and that anyone may
//! fetch it without a token or a rate limit. No network: the router is
//! called in-process and its regions point nowhere.

use std::collections::BTreeSet;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use gangway_auth::dev::DevMaterial;
use gangway_global::api::openapi;
use gangway_global::config::{GlobalConfig, RateLimit, RegionEndpoint};
use gangway_global::{app, GlobalState};
use gangway_shared::api::{MAX_ARGS, MAX_DURATION_S, MAX_GPUS_PER_WORKER, MAX_JOB_GPUS};
use gangway_shared::client::IDEMPOTENCY_KEY_HEADER;
use gangway_shared::error::codes;
use serde_json::Value;
use tower::ServiceExt;

/// Every public route of `app()`: (method, path as OpenAPI writes it).
const ROUTES: &[(&str, &str)] = &[
    ("post", "/v1/jobs"),
    ("post", "/v1/jobs/dry-run"),
    ("get", "/v1/usage"),
    ("get", "/v1/costs"),
    ("post", "/v1/admin/jobs/{id}/preempt"),
    ("get", "/v1/jobs"),
    ("get", "/v1/jobs/{id}"),
    ("post", "/v1/jobs/{id}/cancel"),
    ("get", "/v1/jobs/{id}/events"),
    ("get", "/v1/jobs/{id}/explain"),
    ("get", "/v1/jobs/{id}/logs"),
    ("get", "/v1/regions"),
    ("post", "/v1/keys"),
    ("get", "/v1/keys"),
    ("delete", "/v1/keys/{id}"),
    ("post", "/v1/admin/keys"),
    ("get", "/v1/admin/keys"),
    ("delete", "/v1/admin/keys/{id}"),
    ("post", "/v1/admin/tenants"),
    ("get", "/v1/admin/tenants"),
    ("post", "/v1/admin/tenants/{tenant}/suspend"),
    ("post", "/v1/admin/tenants/{tenant}/resume"),
    ("post", "/v1/reservations"),
    ("get", "/v1/reservations"),
    ("get", "/v1/reservations/{id}"),
    ("patch", "/v1/reservations/{id}"),
    ("delete", "/v1/reservations/{id}"),
    ("get", "/v1/admin/reservations"),
    ("get", "/v1/admin/reservations/{id}"),
    ("patch", "/v1/admin/reservations/{id}"),
    ("delete", "/v1/admin/reservations/{id}"),
    ("post", "/v1/admin/tenants/{tenant}/reservations"),
    ("post", "/v1/clusters"),
    ("get", "/v1/clusters"),
    ("get", "/v1/clusters/{id}"),
    ("patch", "/v1/clusters/{id}"),
    ("delete", "/v1/clusters/{id}"),
    ("get", "/v1/admin/clusters"),
    ("get", "/v1/admin/clusters/{id}"),
    ("patch", "/v1/admin/clusters/{id}"),
    ("delete", "/v1/admin/clusters/{id}"),
    ("get", "/v1/admin/quotas"),
    ("get", "/v1/admin/queue"),
    ("get", "/v1/admin/regions"),
    ("put", "/v1/admin/quotas/{tenant}/{gpu_type}"),
    ("delete", "/v1/admin/quotas/{tenant}/{gpu_type}"),
    ("get", "/v1/admin/limits"),
    ("put", "/v1/admin/limits/{tenant}"),
    ("delete", "/v1/admin/limits/{tenant}"),
    ("get", "/v1/admin/nodes"),
    ("get", "/v1/admin/nodes/{id}"),
    ("post", "/v1/admin/nodes/{id}/cordon"),
    ("post", "/v1/admin/nodes/{id}/uncordon"),
    ("post", "/v1/admin/nodes/{id}/drain"),
    ("post", "/v1/admin/nodes/{id}/faults"),
    ("post", "/v1/admin/nodes/{id}/admit"),
    ("post", "/v1/admin/nodes/{id}/release"),
    ("put", "/v1/admin/inventory/{id}"),
    ("post", "/v1/admin/agents/{id}/token"),
    ("get", "/v1/admin/audit"),
    ("post", "/v1/admin/maintenance"),
    ("get", "/v1/admin/maintenance"),
    ("get", "/v1/admin/maintenance/{id}"),
    ("post", "/v1/admin/maintenance/{id}/cancel"),
    ("get", "/v1/admin/goodput"),
    ("get", "/v1/admin/usage/records"),
    ("get", "/v1/admin/usage/credits"),
    ("get", "/v1/admin/usage/commitments"),
    ("get", "/v1/admin/usage/allocated"),
    ("get", "/v1/admin/usage/closings"),
    ("post", "/v1/admin/regions/{name}/evacuate"),
    ("post", "/v1/admin/regions/{name}/failback"),
    ("get", "/v1/admin/regions/{name}/evacuation"),
    ("get", "/healthz"),
    ("get", "/v1/openapi.json"),
];

/// Routes anyone may call: no token, no rate limit.
const OPEN: &[&str] = &["/healthz", "/v1/openapi.json"];

/// Every code a 401 may carry (the authenticator's).
const AUTH_CODES: &[&str] = &[
    "missing_token",
    "malformed_token",
    "unsupported_algorithm",
    "unknown_key",
    "bad_signature",
    "token_expired",
    "token_not_yet_valid",
    "wrong_audience",
    "wrong_issuer",
    "bad_claims",
    "invalid_key",
];

const METHODS: &[&str] = &["get", "put", "post", "delete", "patch", "head", "options"];

fn doc() -> Value {
    let json = openapi::document()
        .to_json()
        .expect("the document serializes");
    serde_json::from_str(&json).expect("the document is JSON")
}

/// Follows a local `$ref` (`#/components/...`), or returns `v` itself.
fn resolve<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let pointer = r.strip_prefix('#').expect("only local refs");
            doc.pointer(pointer)
                .unwrap_or_else(|| panic!("{r} points at nothing"))
        }
        None => v,
    }
}

fn operations(doc: &Value) -> Vec<(String, String, &Value)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            if METHODS.contains(&method.as_str()) {
                out.push((method.clone(), path.clone(), op));
            }
        }
    }
    out
}

fn operation<'a>(doc: &'a Value, method: &str, path: &str) -> &'a Value {
    doc["paths"][path]
        .get(method)
        .unwrap_or_else(|| panic!("{method} {path} is not in the document"))
}

#[test]
fn is_openapi_3_1() {
    let doc = doc();
    let version = doc["openapi"].as_str().expect("openapi version");
    assert!(version.starts_with("3.1."), "openapi {version}");
    assert_eq!(doc["info"]["title"], "Gangway");
}

#[test]
fn lists_exactly_the_public_routes() {
    let doc = doc();
    let listed: BTreeSet<(String, String)> = operations(&doc)
        .into_iter()
        .map(|(m, p, _)| (m, p))
        .collect();
    let expected: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(listed, expected);
    for path in doc["paths"].as_object().unwrap().keys() {
        assert!(
            !path.contains("internal"),
            "{path} leaked into the document"
        );
    }
}

#[test]
fn every_stable_code_and_every_auth_code_is_in_the_document() {
    let doc = doc();
    let text = doc.to_string();
    let code = &doc["components"]["schemas"]["ErrorBody"]["properties"]["code"];
    let described = code["description"].as_str().expect("code is described");
    let examples: BTreeSet<&str> = code["examples"]
        .as_array()
        .expect("code lists its values")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for c in codes::ALL.iter().chain(AUTH_CODES) {
        assert!(examples.contains(c), "{c} missing from ErrorBody.code");
        assert!(described.contains(&format!("`{c}`")), "{c} not described");
        assert!(text.contains(c));
    }
    assert_eq!(openapi::auth_codes(), AUTH_CODES);
    // The 401 answer names each way a token is refused.
    let unauthenticated = &doc["components"]["responses"]["Unauthenticated"];
    let why = unauthenticated["description"].as_str().unwrap();
    for c in AUTH_CODES {
        assert!(why.contains(&format!("`{c}`")), "401 does not name {c}");
    }
}

/// `codes::ALL` is what documents and tests trust to be complete: check it
/// against the constants in the source.
#[test]
fn codes_all_lists_every_code_constant() {
    let source = include_str!("../../shared/src/error.rs");
    let declared: BTreeSet<&str> = source
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub const "))
        .filter_map(|l| l.split_once(": &str = \""))
        .map(|(_, rest)| rest.trim_end_matches("\";"))
        .collect();
    let all: BTreeSet<&str> = codes::ALL.iter().copied().collect();
    assert_eq!(all.len(), codes::ALL.len(), "a code is listed twice");
    assert_eq!(declared, all);
}

#[test]
fn every_schema_is_there_and_every_ref_resolves() {
    let doc = doc();
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for name in [
        "JobSpec",
        "Job",
        "Worker",
        "JobEvent",
        "JobEvents",
        "JobList",
        "JobState",
        "WorkerState",
        "JobMode",
        "Priority",
        "TopologyLevel",
        "TopologySpec",
        "Explanation",
        "RegionInfo",
        "RegionList",
        "RegionStatus",
        "GpuTypeCapacity",
        "Quota",
        "QuotaUpdate",
        "QuotaList",
        "TenantLimits",
        "LimitsUpdate",
        "TenantLimitsList",
        "ReservationSpec",
        "ReservationResize",
        "Reservation",
        "ReservationList",
        "ReservationState",
        "ClusterSpec",
        "ClusterResize",
        "Cluster",
        "ClusterList",
        "ClusterState",
        "ClusterNode",
        "ClusterEvent",
        "ErrorBody",
    ] {
        assert!(schemas.contains_key(name), "schema {name} missing");
    }
    fn walk<'a>(v: &'a Value, refs: &mut Vec<&'a str>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    refs.push(r);
                }
                m.values().for_each(|v| walk(v, refs));
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, refs)),
            _ => {}
        }
    }
    let mut refs = Vec::new();
    walk(&doc, &mut refs);
    assert!(!refs.is_empty());
    for r in refs {
        resolve(&doc, &serde_json::json!({ "$ref": r }));
    }
}

#[test]
fn job_spec_schema_matches_the_contract() {
    let doc = doc();
    let spec = &doc["components"]["schemas"]["JobSpec"];
    let required: BTreeSet<&str> = spec["required"]
        .as_array()
        .expect("JobSpec has required fields")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for field in [
        "name",
        "gpus",
        "gpu_type",
        "estimated_duration_s",
        "command",
    ] {
        assert!(required.contains(field), "{field} is not required");
    }
    for optional in ["priority", "env", "mode", "topology", "region", "min_gpus"] {
        assert!(!required.contains(optional), "{optional} is required");
    }
    assert_eq!(
        spec["additionalProperties"], false,
        "unknown fields refused"
    );
    // The documented bounds are the ones the validation applies.
    let p = &spec["properties"];
    assert_eq!(p["gpus"]["minimum"], 1);
    assert_eq!(p["gpus"]["maximum"], MAX_JOB_GPUS);
    assert_eq!(p["gpus_per_worker"]["maximum"], MAX_GPUS_PER_WORKER);
    assert_eq!(p["estimated_duration_s"]["maximum"], MAX_DURATION_S);
    assert_eq!(p["max_duration_s"]["maximum"], MAX_DURATION_S);
    assert_eq!(p["command"]["maxItems"], MAX_ARGS);
    assert_eq!(p["min_gpus"]["minimum"], 1);
    assert_eq!(p["min_gpus"]["maximum"], MAX_JOB_GPUS);
    // A job says how many workers its current run has.
    let job = &doc["components"]["schemas"]["Job"]["properties"];
    assert!(job.get("run_workers").is_some(), "{job}");
    assert_eq!(
        p["name"]["maxLength"],
        gangway_shared::api::MAX_NAME_LEN as u64
    );
}

#[test]
fn a_maintenance_plan_says_which_nodes_it_skipped_and_why() {
    let doc = doc();
    let schemas = &doc["components"]["schemas"];
    let plan = &schemas["MaintenancePlan"];
    let skipped = resolve(&doc, &plan["properties"]["skipped"]["items"]);
    assert_eq!(skipped, &schemas["SkippedNode"], "{plan}");
    let required: BTreeSet<&str> = skipped["required"]
        .as_array()
        .expect("SkippedNode has required fields")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(required, BTreeSet::from(["node_id", "reason"]));
    let node = &schemas["MaintenanceNode"]["properties"];
    assert!(node.get("reason").is_some(), "{node}");
    assert!(node.get("waiting_since").is_some(), "{node}");
    let step = node["step"]["description"].as_str().unwrap();
    assert!(step.contains("`skipped`"), "{step}");
    // Served by the plan's endpoints.
    let get = operation(&doc, "get", "/v1/admin/maintenance/{id}");
    assert_eq!(
        get["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/MaintenancePlan"
    );
}

#[test]
fn create_takes_an_idempotency_key_and_a_bearer_token() {
    let doc = doc();
    let create = operation(&doc, "post", "/v1/jobs");
    let key = create["parameters"]
        .as_array()
        .expect("create has parameters")
        .iter()
        .find(|p| p["name"] == "Idempotency-Key")
        .expect("Idempotency-Key is a parameter");
    assert_eq!(key["in"], "header");
    assert!(key["name"]
        .as_str()
        .unwrap()
        .eq_ignore_ascii_case(IDEMPOTENCY_KEY_HEADER));
    assert_eq!(key["schema"]["maxLength"], 255);
    assert_eq!(
        create["security"],
        serde_json::json!([{ openapi::BEARER: [] }])
    );
    let body = &create["requestBody"]["content"]["application/json"]["schema"];
    assert_eq!(body["$ref"], "#/components/schemas/JobSpec");
    let scheme = &doc["components"]["securitySchemes"][openapi::BEARER];
    assert_eq!(scheme["type"], "http");
    assert_eq!(scheme["scheme"], "bearer");
    assert_eq!(scheme["bearerFormat"], "JWT");
    let statuses: BTreeSet<&str> = create["responses"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    for s in [
        "201", "400", "401", "403", "409", "413", "415", "422", "429", "503",
    ] {
        assert!(statuses.contains(s), "create does not document {s}");
    }
}

#[test]
fn list_documents_its_query_parameters() {
    let doc = doc();
    let list = operation(&doc, "get", "/v1/jobs");
    let params: BTreeSet<(&str, &str)> = list["parameters"]
        .as_array()
        .expect("list has parameters")
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p["in"].as_str().unwrap()))
        .collect();
    for name in ["state", "name", "limit", "cursor"] {
        assert!(params.contains(&(name, "query")), "list lacks {name}");
    }
}

#[test]
fn authenticated_operations_document_their_errors_with_error_body() {
    let doc = doc();
    for (method, path, op) in operations(&doc) {
        let responses = op["responses"].as_object().unwrap();
        if OPEN.contains(&path.as_str()) {
            assert!(op.get("security").is_none(), "{method} {path} asks a token");
        } else {
            assert_eq!(
                op["security"],
                serde_json::json!([{ openapi::BEARER: [] }]),
                "{method} {path}"
            );
            for s in ["401", "403", "429"] {
                assert!(responses.contains_key(s), "{method} {path} lacks {s}");
            }
        }
        assert!(
            responses.keys().any(|s| s.starts_with('2')),
            "{method} {path} has no success answer"
        );
        for (status, response) in responses {
            let response = resolve(&doc, response);
            assert!(response["headers"].get("x-request-id").is_some());
            if status.as_str() >= "400" {
                let schema = &response["content"]["application/json"]["schema"];
                assert_eq!(
                    schema["$ref"], "#/components/schemas/ErrorBody",
                    "{method} {path} {status}"
                );
                assert!(
                    response["description"]
                        .as_str()
                        .unwrap()
                        .contains("Codes: `"),
                    "{method} {path} {status} does not name its codes"
                );
            }
        }
    }
    let limited = &doc["components"]["responses"]["RateLimited"];
    assert!(limited["headers"].get("Retry-After").is_some());
}

/// A router whose one region listens nowhere, with a limit of one request.
fn router(dir: &std::path::Path) -> Router {
    let auth = DevMaterial::load_or_create(dir).expect("dev material");
    let mut config = GlobalConfig::new(
        std::fs::read_to_string(&auth.server_cert).unwrap(),
        std::fs::read_to_string(&auth.server_key).unwrap(),
        vec![RegionEndpoint {
            name: "nowhere".into(),
            url: "https://127.0.0.1:9".into(),
        }],
        vec![auth.tenant_key.verifier_entry()],
        auth.service_key.clone(),
    );
    config.default_rate = RateLimit {
        per_second: 1,
        burst: 1,
    };
    app(GlobalState::new(config).expect("global state"))
}

#[tokio::test]
async fn openapi_json_is_served_without_a_token_or_a_rate_limit() {
    let dir = tempfile::tempdir().unwrap();
    let router = router(dir.path());
    for _ in 0..5 {
        let resp = router
            .clone()
            .oneshot(
                Request::get("/v1/openapi.json")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
        assert!(resp.headers().contains_key("x-request-id"));
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        let served: Value = serde_json::from_slice(&body).expect("served JSON");
        assert_eq!(served, doc());
    }
}

/// The document against the router itself: each documented operation
/// exists, and asks for a token exactly when the router does.
#[tokio::test]
async fn the_router_answers_every_documented_operation_as_documented() {
    let dir = tempfile::tempdir().unwrap();
    let router = router(dir.path());
    let doc = doc();
    for (method, path, op) in operations(&doc) {
        let uri = path
            .replace("{id}", "00000000-0000-4000-8000-000000000000")
            .replace("{tenant}", "acme")
            .replace("{name}", "r1")
            .replace("{gpu_type}", "h100");
        let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        let resp = router
            .clone()
            .oneshot(
                Request::builder()
                    .method(method.clone())
                    .uri(&uri)
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let expected = if op.get("security").is_some() {
            StatusCode::UNAUTHORIZED
        } else {
            StatusCode::OK
        };
        assert_eq!(resp.status(), expected, "{method} {uri}");
        if expected == StatusCode::UNAUTHORIZED {
            let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await
                .unwrap();
            let body: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(body["code"], "missing_token", "{method} {uri}");
        }
    }
}

#[test]
fn create_and_dry_run_name_the_admission_limits_codes_on_429() {
    let doc = doc();
    for path in ["/v1/jobs", "/v1/jobs/dry-run"] {
        let op = operation(&doc, "post", path);
        let too_many = resolve(&doc, &op["responses"]["429"]);
        let text = too_many["description"].as_str().unwrap();
        for c in [
            codes::RATE_LIMITED,
            codes::QUEUED_JOBS_LIMIT,
            codes::REQUESTED_GPUS_LIMIT,
        ] {
            assert!(text.contains(&format!("`{c}`")), "{path}: 429 lacks {c}");
        }
    }
    let put = operation(&doc, "put", "/v1/admin/limits/{tenant}");
    assert_eq!(
        put["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/LimitsUpdate"
    );
    let unprocessable = put["responses"]["422"]["description"].as_str().unwrap();
    assert!(
        unprocessable.contains("`invalid_limits`"),
        "{unprocessable}"
    );
}

#[test]
fn reservations_document_their_refusal_window_and_idempotency_keys() {
    let doc = doc();
    for (method, path) in [
        ("post", "/v1/reservations"),
        ("patch", "/v1/reservations/{id}"),
        ("delete", "/v1/reservations/{id}"),
    ] {
        let op = operation(&doc, method, path);
        let keyed = op["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "Idempotency-Key" && p["in"] == "header");
        assert!(keyed, "{method} {path} takes no Idempotency-Key");
    }
    for (method, path) in [
        ("post", "/v1/reservations"),
        ("patch", "/v1/reservations/{id}"),
    ] {
        let op = operation(&doc, method, path);
        let refused = resolve(&doc, &op["responses"]["409"]);
        let text = refused["description"].as_str().unwrap();
        for word in [
            "`reservation_unavailable`",
            "earliest_start",
            "earliest_end",
        ] {
            assert!(text.contains(word), "{method} {path}: 409 lacks {word}");
        }
    }
    let body = &doc["components"]["schemas"]["ErrorBody"]["properties"];
    assert!(body.get("earliest_start").is_some() && body.get("earliest_end").is_some());
    let spec = &doc["components"]["schemas"]["JobSpec"]["properties"];
    assert!(spec.get("reservation").is_some(), "{spec}");
    let create = operation(&doc, "post", "/v1/reservations");
    assert_eq!(
        create["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/ReservationSpec"
    );
}

#[test]
fn clusters_document_their_refusals_deletes_and_idempotency_keys() {
    let doc = doc();
    let keyed = |method: &str, path: &str| {
        let op = operation(&doc, method, path);
        op["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "Idempotency-Key" && p["in"] == "header")
    };
    for base in ["/v1/clusters", "/v1/admin/clusters"] {
        let one = format!("{base}/{{id}}");
        for method in ["patch", "delete"] {
            assert!(
                keyed(method, &one),
                "{method} {one} takes no Idempotency-Key"
            );
        }
        // A delete answers 202 while its jobs stop, 200 once gone.
        let delete = &operation(&doc, "delete", &one)["responses"];
        for s in ["200", "202"] {
            assert_eq!(
                delete[s]["content"]["application/json"]["schema"]["$ref"],
                "#/components/schemas/Cluster",
                "delete {one} {s}"
            );
        }
        let refused = resolve(&doc, &operation(&doc, "patch", &one)["responses"]["409"]);
        let text = refused["description"].as_str().unwrap();
        assert!(text.contains("`cluster_unavailable`"), "{text}");
        assert!(text.contains("`cluster_conflict`"), "{text}");
        let list = operation(&doc, "get", base);
        assert_eq!(
            list["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/ClusterList"
        );
    }
    assert!(keyed("post", "/v1/clusters"));
    let create = operation(&doc, "post", "/v1/clusters");
    assert_eq!(
        create["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/ClusterSpec"
    );
    let unprocessable = create["responses"]["422"]["description"].as_str().unwrap();
    assert!(
        unprocessable.contains("`invalid_cluster`"),
        "{unprocessable}"
    );
    // Jobs name a cluster, and an unknown one is refused on submit.
    let spec = &doc["components"]["schemas"]["JobSpec"]["properties"];
    assert!(spec.get("cluster").is_some(), "{spec}");
    let submit = operation(&doc, "post", "/v1/jobs");
    let text = submit["responses"]["422"]["description"].as_str().unwrap();
    assert!(text.contains("`invalid_cluster`"), "{text}");
    // The spec's bounds are the ones the validation applies.
    let nodes = &doc["components"]["schemas"]["ClusterSpec"]["properties"]["nodes"];
    assert_eq!(nodes["maximum"], gangway_shared::cluster::MAX_CLUSTER_NODES);
}
