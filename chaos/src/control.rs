//! `gangway dev up`'s control API: how the drills of another process
//! (`gangway chaos <drill> --dev`) break and mend the parts of a running
//! dev cloud. It listens on loopback only; a bearer token guards it, kept
//! with its URL in the state dir's [`ENDPOINT_FILE`] (mode 0600, removed
//! when the cloud stops).
//!
//! - `GET /v1/cloud`: the cloud ([`CloudInfo`]): its regions, what of
//!   each is broken, the global tier's replicas.
//! - `POST /v1/cloud/break`, `POST /v1/cloud/mend` with a [`Target`]
//!   (`{"part": "region", "region": "us-east"}`): 204.
//! - `POST /v1/cloud/mend-all`: mends everything broken; 204.
//!
//! Errors are JSON `{code, message}`: `unauthorized` (401),
//! `unknown_part` (404: no such region or replica), `bad_request` (400),
//! `failed` (500: a process would not start; the message says which).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use crate::supervisor::{GlobalInfo, RegionInfo, Supervisor, Target};

/// Where, in a dev cloud's state dir, its control API's URL and token are.
pub const ENDPOINT_FILE: &str = "control.json";

/// The control API's address and token.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Endpoint {
    pub url: String,
    pub token: String,
}

/// A dev cloud, as its control API describes it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CloudInfo {
    /// Its state dir (the dev CA and signing keys are under it).
    pub state_dir: PathBuf,
    /// How its agents run workers: `real` or `sim`.
    pub executor: String,
    /// Whether it runs the drills' short timers (`gangway dev up
    /// --short-timers`) rather than the defaults.
    pub short_timers: bool,
    pub regions: Vec<RegionInfo>,
    pub globals: Vec<GlobalInfo>,
}

/// What does not change of the cloud while it runs.
#[derive(Clone, Debug)]
pub struct Fixed {
    pub state_dir: PathBuf,
    pub executor: String,
    pub short_timers: bool,
    /// The global tier's replicas' URLs, in order.
    pub globals: Vec<String>,
}

#[derive(Clone)]
struct Ctx {
    sup: Arc<Supervisor>,
    fixed: Arc<Fixed>,
    token: Arc<String>,
}

#[derive(Serialize, Deserialize)]
struct ErrorBody {
    code: String,
    message: String,
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = ErrorBody {
        code: code.into(),
        message: message.into(),
    };
    (status, Json(body)).into_response()
}

/// Writes the endpoint file (mode 0600) into `state_dir`.
pub fn write_endpoint(state_dir: &Path, endpoint: &Endpoint) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = state_dir.join(ENDPOINT_FILE);
    let tmp = state_dir.join(format!("{ENDPOINT_FILE}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec_pretty(endpoint)?)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Serves the control API of `sup` on `listener` until `shutdown`.
pub async fn serve(
    sup: Arc<Supervisor>,
    fixed: Fixed,
    token: String,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let ctx = Ctx {
        sup,
        fixed: Arc::new(fixed),
        token: Arc::new(token),
    };
    let app = Router::new()
        .route("/v1/cloud", get(describe))
        .route("/v1/cloud/break", post(break_part))
        .route("/v1/cloud/mend", post(mend_part))
        .route("/v1/cloud/mend-all", post(mend_all))
        .layer(axum::middleware::from_fn_with_state(ctx.clone(), authorize))
        .with_state(ctx);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

async fn authorize(State(ctx): State<Ctx>, req: Request, next: Next) -> Response {
    let given = (req.headers().get(axum::http::header::AUTHORIZATION))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let ok = given.is_some_and(|g| {
        // Constant time in the token's length.
        g.len() == ctx.token.len()
            && (g.bytes().zip(ctx.token.bytes())).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    });
    if !ok {
        return error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            format!("give the token in {ENDPOINT_FILE} of the cloud's state dir as a bearer token"),
        );
    }
    next.run(req).await
}

fn info(ctx: &Ctx) -> CloudInfo {
    let broken = ctx.sup.globals_broken();
    CloudInfo {
        state_dir: ctx.fixed.state_dir.clone(),
        executor: ctx.fixed.executor.clone(),
        short_timers: ctx.fixed.short_timers,
        regions: ctx.sup.regions(),
        globals: (ctx.fixed.globals.iter().zip(broken))
            .map(|(url, broken)| GlobalInfo {
                url: url.clone(),
                broken,
            })
            .collect(),
    }
}

async fn describe(State(ctx): State<Ctx>) -> Json<CloudInfo> {
    Json(info(&ctx))
}

async fn apply(
    ctx: Ctx,
    body: Result<Json<Target>, axum::extract::rejection::JsonRejection>,
    broken: bool,
) -> Response {
    let target = match body {
        Ok(Json(t)) => t,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("{e}: give a part, e.g. {{\"part\": \"region\", \"region\": \"us-east\"}}"),
            )
        }
    };
    let known = match &target {
        Target::Global { index } => *index < ctx.fixed.globals.len(),
        Target::Region { region }
        | Target::Control { region }
        | Target::Database { region }
        | Target::Agent { region }
        | Target::Links { region } => ctx.sup.names().contains(region),
    };
    if !known {
        return error(
            StatusCode::NOT_FOUND,
            "unknown_part",
            format!("no {target} in this cloud"),
        );
    }
    let verb = if broken { "break" } else { "mend" };
    tracing::info!(%target, "control API: {verb}");
    match ctx.sup.apply(&target, broken).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "failed",
            format!("cannot {verb} {target}: {e:#}"),
        ),
    }
}

async fn break_part(
    State(ctx): State<Ctx>,
    body: Result<Json<Target>, axum::extract::rejection::JsonRejection>,
) -> Response {
    apply(ctx, body, true).await
}

async fn mend_part(
    State(ctx): State<Ctx>,
    body: Result<Json<Target>, axum::extract::rejection::JsonRejection>,
) -> Response {
    apply(ctx, body, false).await
}

async fn mend_all(State(ctx): State<Ctx>) -> Response {
    match ctx.sup.mend_all().await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "failed",
            format!("{e:#}"),
        ),
    }
}

/// A client of a running dev cloud's control API.
#[derive(Clone)]
pub struct Remote {
    endpoint: Endpoint,
    http: reqwest::Client,
}

impl Remote {
    /// The control API of the dev cloud whose state dir is `state_dir`.
    pub fn of(state_dir: &Path) -> anyhow::Result<Remote> {
        let path = state_dir.join(ENDPOINT_FILE);
        let bytes = std::fs::read(&path).with_context(|| {
            format!(
                "no `gangway dev up` runs with state dir {} (no {}): start one \
                 (`gangway dev up --state-dir {}`), or leave out --dev and the drill \
                 starts a cloud of its own",
                state_dir.display(),
                path.display(),
                state_dir.display()
            )
        })?;
        let endpoint: Endpoint = serde_json::from_slice(&bytes)
            .with_context(|| format!("{} is corrupt", path.display()))?;
        Ok(Remote {
            endpoint,
            http: reqwest::Client::new(),
        })
    }

    async fn call(&self, req: reqwest::RequestBuilder) -> anyhow::Result<reqwest::Response> {
        let resp = req
            .bearer_auth(&self.endpoint.token)
            .send()
            .await
            .with_context(|| {
                format!(
                    "the dev cloud's control API at {} does not answer: is `gangway dev up` still running?",
                    self.endpoint.url
                )
            })?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        match resp.json::<ErrorBody>().await {
            Ok(b) => anyhow::bail!("the dev cloud answered {status} {}: {}", b.code, b.message),
            Err(_) => anyhow::bail!("the dev cloud answered {status}"),
        }
    }

    pub async fn info(&self) -> anyhow::Result<CloudInfo> {
        let url = format!("{}/v1/cloud", self.endpoint.url);
        Ok(self.call(self.http.get(url)).await?.json().await?)
    }

    /// Breaks `target` (`broken`) or mends it.
    pub async fn apply(&self, target: &Target, broken: bool) -> anyhow::Result<()> {
        let verb = if broken { "break" } else { "mend" };
        let url = format!("{}/v1/cloud/{verb}", self.endpoint.url);
        self.call(self.http.post(url).json(target)).await?;
        Ok(())
    }

    pub async fn mend_all(&self) -> anyhow::Result<()> {
        let url = format!("{}/v1/cloud/mend-all", self.endpoint.url);
        self.call(self.http.post(url)).await?;
        Ok(())
    }
}
