//! The web console: server-rendered pages at `/`, same origin as the API.
//!
//! People sign in with what the CLI uses — a tenant's or an operator's
//! token (their own issuer's or their OpenID Connect provider's) or an API
//! key — which the console keeps in a cookie only the server reads
//! (`HttpOnly`, `Secure`, `SameSite=Strict`) and sends as the bearer token
//! of the API calls that build each page ([`api`]): the console sees what
//! the API shows that credential and nothing else. Pages are HTML from
//! compiled templates (askama; `global/templates`), with the values
//! escaped; pictures (the fleet map, the usage chart) are SVG drawn on the
//! server. One small script of our own (`assets/console.js`) refreshes the
//! live parts of a page; every asset is compiled into the binary, and every
//! answer carries a Content-Security-Policy that allows nothing but this
//! origin's own script and style sheet.
//!
//! # Layout
//! - `mod.rs`: the routes, the session cookie, the headers, sign-in.
//! - `sso.rs`: single sign-on (OpenID Connect, authorization code + PKCE).
//! - [`api`]: the in-process API client.
//! - `tenant.rs`: jobs, a job's life, usage and costs.
//! - `operator.rs`: regions, the fleet map, the queue, maintenance, audit.
//! - [`fleet`]: the fleet map's model (node states, leaves aggregated).
//! - [`chart`]: bar charts as SVG geometry.

pub mod api;
pub mod chart;
pub mod fleet;
mod operator;
mod sso;
mod tenant;

use askama::Template;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use base64::Engine;
use serde::Deserialize;

pub use api::{Api, Failure};

/// The session cookie's name.
pub const COOKIE: &str = "gangway_console";
/// How long a session lasts in the browser (the credential may end
/// sooner: a token's own expiry still applies to every API call).
const SESSION_S: u64 = 12 * 3600;

/// The policy every console answer carries: this origin's own script,
/// style sheet and images only; no inline script or style, no framing, no
/// plugins, forms posted only here.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; \
     frame-ancestors 'none'; base-uri 'none'";

const CSS: &str = include_str!("../../assets/console.css");
const JS: &str = include_str!("../../assets/console.js");

/// What the console's handlers share: the API router they call, and the
/// issuers people may sign in with.
#[derive(Clone)]
pub struct Console {
    api: Router,
    sso: Sso,
}

/// The OpenID Connect issuers configured for the tier.
#[derive(Clone)]
struct Sso {
    tenants: Option<crate::oidc::Oidc>,
    operators: Option<crate::oidc::Oidc>,
}

/// The console's routes, given the API's router (without the outer
/// layers: the console's own request already went through them) and the
/// tier's state (its OpenID Connect issuers).
pub fn router(api: Router, state: &crate::state::GlobalState) -> Router {
    let sso = Sso {
        tenants: state.oidc_tenants.clone(),
        operators: state.oidc_operators.clone(),
    };
    Router::new()
        .route("/", get(home))
        .route("/sign-in", get(sign_in_page).post(sign_in))
        .route("/sign-in/sso/callback", get(sso::callback))
        .route("/sign-in/sso/{kind}", get(sso::start))
        .route("/sign-out", post(sign_out))
        .route("/jobs", get(tenant::jobs))
        .route("/jobs/{id}", get(tenant::job))
        .route("/usage", get(tenant::usage))
        .route("/fleet", get(operator::regions))
        .route("/fleet/{region}", get(operator::fleet))
        .route("/queue", get(operator::queue))
        .route("/maintenance", get(operator::maintenance))
        .route("/audit", get(operator::audit))
        .route("/console/assets/console.css", get(css))
        .route("/console/assets/console.js", get(js))
        .layer(axum::middleware::map_response(secure_headers))
        .with_state(Console { api, sso })
}

/// Who signed in, by the kind of credential they gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Tenant,
    Operator,
}

impl Role {
    /// Its letter in the console's cookies.
    fn letter(self) -> char {
        match self {
            Role::Tenant => 't',
            Role::Operator => 'o',
        }
    }

    fn from_letter(s: &str) -> Option<Role> {
        match s {
            "t" => Some(Role::Tenant),
            "o" => Some(Role::Operator),
            _ => None,
        }
    }

    /// The page someone of this role lands on.
    fn home(self) -> &'static str {
        match self {
            Role::Tenant => "/jobs",
            Role::Operator => "/fleet",
        }
    }
}

/// A signed-in person: their role and the API as their credential sees it.
pub struct Session {
    pub role: Role,
    pub api: Api,
    /// Who, for the page's corner: the token's subject (and tenant), or
    /// the API key's id.
    pub who: String,
}

/// The value of the cookie `name` the request carries, if any.
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    (headers.get_all(header::COOKIE).iter())
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find_map(|(n, v)| (n == name).then_some(v))
}

/// The session cookie: the role's letter, `~`, the credential.
fn session_cookie(headers: &HeaderMap) -> Option<(Role, String)> {
    let (role, credential) = cookie(headers, COOKIE)?.split_once('~')?;
    let role = Role::from_letter(role)?;
    (!credential.is_empty()).then(|| (role, credential.to_string()))
}

/// The host the request was sent to: HTTP/2 names it in the request's
/// authority, HTTP/1.1 in `Host`.
fn request_host<'r>(headers: &'r HeaderMap, uri: &'r axum::http::Uri) -> Option<&'r str> {
    (uri.authority().map(|a| a.as_str()))
        .or_else(|| headers.get(header::HOST).and_then(|h| h.to_str().ok()))
}

/// Who a credential names, for display only (the API verified it).
fn who(credential: &str, role: Role) -> String {
    if let Some(rest) = credential.strip_prefix(crate::identity::KEY_PREFIX) {
        let id = rest.split('_').next().unwrap_or_default();
        return format!("API key {id}");
    }
    let claims = credential.split('.').nth(1).and_then(|p| {
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(p)
            .ok()?;
        serde_json::from_slice::<serde_json::Value>(&bytes).ok()
    });
    let text = |c: &serde_json::Value, k: &str| c.get(k)?.as_str().map(str::to_string);
    match (role, claims) {
        (Role::Tenant, Some(c)) => match (text(&c, "tenant"), text(&c, "sub")) {
            (Some(t), Some(s)) if t != s => format!("{s} ({t})"),
            (Some(t), _) => t,
            (None, Some(s)) => s,
            (None, None) => "tenant".into(),
        },
        (Role::Operator, Some(c)) => text(&c, "sub").unwrap_or_else(|| "operator".into()),
        (Role::Tenant, None) => "tenant".into(),
        (Role::Operator, None) => "operator".into(),
    }
}

/// A page that needs someone signed in sends everyone else to sign in.
pub struct SignInFirst;

impl IntoResponse for SignInFirst {
    fn into_response(self) -> Response {
        Redirect::to("/sign-in").into_response()
    }
}

impl FromRequestParts<Console> for Session {
    type Rejection = SignInFirst;

    async fn from_request_parts(parts: &mut Parts, console: &Console) -> Result<Self, SignInFirst> {
        let (role, credential) = session_cookie(&parts.headers).ok_or(SignInFirst)?;
        Ok(Session {
            role,
            who: who(&credential, role),
            api: Api::new(console.api.clone(), credential),
        })
    }
}

impl axum::extract::OptionalFromRequestParts<Console> for Session {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        console: &Console,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(
            <Session as FromRequestParts<Console>>::from_request_parts(parts, console)
                .await
                .ok(),
        )
    }
}

/// The frame around every page: the role's navigation, who is signed in,
/// which entry is the current one, whether the page refreshes itself.
pub struct Chrome {
    pub title: String,
    pub role: Option<Role>,
    pub who: String,
    pub active: &'static str,
    /// Seconds between refreshes of the page's live part (0: none).
    pub refresh_s: u32,
}

impl Chrome {
    pub fn new(session: &Session, title: impl Into<String>, active: &'static str) -> Chrome {
        Chrome {
            title: title.into(),
            role: Some(session.role),
            who: session.who.clone(),
            active,
            refresh_s: 0,
        }
    }

    /// The frame of a page for nobody signed in yet (sign-in).
    pub fn anonymous(title: &str) -> Chrome {
        Chrome {
            title: title.into(),
            role: None,
            who: String::new(),
            active: "",
            refresh_s: 0,
        }
    }

    pub fn live(mut self, every_s: u32) -> Chrome {
        self.refresh_s = every_s;
        self
    }

    pub fn is_active(&self, key: &str) -> bool {
        self.active == key
    }

    /// The navigation entries of the role: (path, label, key).
    pub fn nav(&self) -> &'static [(&'static str, &'static str, &'static str)] {
        match self.role {
            Some(Role::Tenant) => &[("/jobs", "Jobs", "jobs"), ("/usage", "Usage", "usage")],
            Some(Role::Operator) => &[
                ("/fleet", "Regions", "regions"),
                ("/queue", "Queue", "queue"),
                ("/maintenance", "Maintenance", "maintenance"),
                ("/audit", "Audit", "audit"),
            ],
            None => &[],
        }
    }
}

/// An HTML answer from a template (a template that cannot render is a
/// bug: the answer says so, it does not panic the server).
pub fn html(status: StatusCode, page: &impl Template) -> Response {
    match page.render() {
        Ok(body) => (
            status,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            body,
        )
            .into_response(),
        Err(e) => {
            tracing::error!(error = %e, "a console page failed to render");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                "the page could not be drawn; the server's log says why",
            )
                .into_response()
        }
    }
}

#[derive(Template)]
#[template(path = "error.html")]
pub struct ErrorPage {
    pub chrome: Chrome,
    pub message: String,
    pub hint: &'static str,
}

/// The answer to an API call that failed: sign in again on 401, else the
/// API's message on a page of the status it had.
pub fn failed(session: &Session, failure: Failure) -> Response {
    if let Failure::SignIn(_) = failure {
        return Redirect::to("/sign-in?expired=1").into_response();
    }
    let status = failure.status();
    let hint = match status {
        StatusCode::NOT_FOUND => "It does not exist, or it is not yours to see.",
        StatusCode::FORBIDDEN => "Your credential does not allow this page.",
        StatusCode::TOO_MANY_REQUESTS => "Too many requests: wait a moment and reload.",
        s if s.is_server_error() => "A region may be unavailable: reload in a moment.",
        _ => "",
    };
    html(
        status,
        &ErrorPage {
            chrome: Chrome::new(session, "Error", ""),
            message: failure.message(),
            hint,
        },
    )
}

/// A tenant's page opened by an operator (or the other way round) says
/// which credential it needs rather than showing an API error.
fn require(session: &Session, needs: Role) -> Option<Response> {
    (session.role != needs).then(|| {
        html(
            StatusCode::FORBIDDEN,
            &ErrorPage {
                chrome: Chrome::new(session, "Not for this sign-in", ""),
                message: match needs {
                    Role::Tenant => "This page shows a tenant's jobs: sign in with a tenant's \
                                     token or API key."
                        .into(),
                    Role::Operator => "This page is for operators: sign in with an operator's \
                                       token or API key."
                        .into(),
                },
                hint: "",
            },
        )
    })
}

async fn home(session: Option<Session>) -> Redirect {
    Redirect::to(session.map_or("/sign-in", |s| s.role.home()))
}

#[derive(Template)]
#[template(path = "sign_in.html")]
struct SignInPage {
    chrome: Chrome,
    message: String,
    sso_tenants: bool,
    sso_operators: bool,
}

/// The sign-in page (with a message, on a refusal). Single sign-on is
/// offered for each role whose issuer is configured; a refusal's page
/// offers nothing but the form.
fn sign_in_form(status: StatusCode, message: impl Into<String>) -> Response {
    sign_in_with(status, message, None)
}

fn sign_in_with(status: StatusCode, message: impl Into<String>, sso: Option<&Sso>) -> Response {
    html(
        status,
        &SignInPage {
            chrome: Chrome::anonymous("Sign in"),
            message: message.into(),
            sso_tenants: sso.is_some_and(|s| s.tenants.is_some()),
            sso_operators: sso.is_some_and(|s| s.operators.is_some()),
        },
    )
}

#[derive(Deserialize)]
struct SignInQuery {
    expired: Option<String>,
}

async fn sign_in_page(
    State(console): State<Console>,
    q: axum::extract::Query<SignInQuery>,
) -> Response {
    let message = if q.expired.is_some() {
        "Your credential was refused (expired or revoked): sign in again."
    } else {
        ""
    };
    sign_in_with(StatusCode::OK, message, Some(&console.sso))
}

/// What `credential` is, as the API answers it: an operator's (the
/// operators' endpoints answer it), a tenant's (the tenants' do), or
/// nothing this cloud accepts — then the tenants' refusal says why
/// (expired, revoked, malformed …).
async fn classify(console: &Console, credential: &str) -> Result<Role, String> {
    let api = Api::new(console.api.clone(), credential.to_string());
    if matches!(api.status_of("/v1/admin/quotas").await, Ok(s) if s.is_success()) {
        return Ok(Role::Operator);
    }
    match api.get::<serde_json::Value>("/v1/jobs?limit=1").await {
        Ok(_) => Ok(Role::Tenant),
        Err(f) => Err(f.message()),
    }
}

/// The session cookie for `credential`.
fn session_cookie_header(role: Role, credential: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(&format!(
        "{COOKIE}={}~{credential}; Path=/; Max-Age={SESSION_S}; HttpOnly; Secure; \
         SameSite=Strict",
        role.letter()
    ))
    .ok()
}

#[derive(Deserialize)]
struct SignIn {
    credential: String,
}

/// Longest credential accepted (a token with many claims is a few KB).
const CREDENTIAL_LIMIT: usize = 8 * 1024;

/// Signs in with a credential: the API tells whether it is an operator's
/// (the operators' endpoints answer it) or a tenant's (the tenants' do);
/// anything else is refused here and no cookie is set.
async fn sign_in(
    State(console): State<Console>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    Form(form): Form<SignIn>,
) -> Response {
    if !same_origin(&headers, &uri) {
        return sign_in_form(
            StatusCode::FORBIDDEN,
            "This form may only be sent from this site's own sign-in page.",
        );
    }
    let credential = form.credential.trim().to_string();
    let printable = credential.bytes().all(|b| b.is_ascii_graphic());
    if credential.is_empty() || credential.len() > CREDENTIAL_LIMIT || !printable {
        return sign_in_form(
            StatusCode::BAD_REQUEST,
            "Paste a token or an API key: one line, no spaces (`gangway login` prints one).",
        );
    }
    let role = match classify(&console, &credential).await {
        Ok(role) => role,
        Err(why) => {
            return sign_in_form(
                StatusCode::UNAUTHORIZED,
                format!("That credential was refused: {why}"),
            )
        }
    };
    let mut resp = Redirect::to(role.home()).into_response();
    if let Some(v) = session_cookie_header(role, &credential) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp
}

async fn sign_out(uri: axum::http::Uri, headers: HeaderMap) -> Response {
    if !same_origin(&headers, &uri) {
        return (StatusCode::FORBIDDEN, "cross-site sign-out refused").into_response();
    }
    let mut resp = Redirect::to("/sign-in").into_response();
    resp.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "gangway_console=; Path=/; Max-Age=0; HttpOnly; Secure; SameSite=Strict",
        ),
    );
    resp
}

/// A form post from this origin. A browser says where the form was in
/// `Sec-Fetch-Site` (which no page can set), or, an older one, in `Origin`;
/// one from elsewhere is refused (the session cookie's `SameSite=Strict`
/// already keeps it from riding along; this also keeps another site from
/// signing someone in to an account of its choosing). A request with
/// neither is not a browser's: nothing rides on it.
fn same_origin(headers: &HeaderMap, uri: &axum::http::Uri) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        return matches!(site.to_str(), Ok("same-origin" | "none"));
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let host = request_host(headers, uri);
    let origin = origin.to_str().unwrap_or_default();
    let origin_host = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"));
    matches!((origin_host, host), (Some(o), Some(h)) if o.eq_ignore_ascii_case(h))
}

async fn css() -> Response {
    asset("text/css; charset=utf-8", CSS)
}

async fn js() -> Response {
    asset("text/javascript; charset=utf-8", JS)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "public, max-age=300"),
        ],
        body,
    )
        .into_response()
}

/// The headers of every console answer: the policy above, no sniffing,
/// no referrer to other sites, and pages never cached (they hold a signed-in person's
/// data).
async fn secure_headers(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // Not `no-referrer`: a browser then sends `Origin: null` with forms.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::STRICT_TRANSPORT_SECURITY,
        HeaderValue::from_static("max-age=31536000"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    resp
}

/// Seconds, for people: `42 s`, `3 min`, `5.2 h`, `3.1 d`.
pub fn duration(s: f64) -> String {
    if !s.is_finite() || s < 0.0 {
        return "–".into();
    }
    if s < 60.0 {
        format!("{s:.0} s")
    } else if s < 3600.0 {
        format!("{:.0} min", s / 60.0)
    } else if s < 86_400.0 {
        format!("{:.1} h", s / 3600.0)
    } else {
        format!("{:.1} d", s / 86_400.0)
    }
}

/// A time, for people: `2026-12-07 06:41:03 UTC`.
pub fn when(t: &chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn the_session_cookie_is_found_among_others_and_a_malformed_one_is_no_session() {
        let h = headers(&[("cookie", "a=1; gangway_console=t~abc.def.ghi; b=2")]);
        assert_eq!(
            session_cookie(&h),
            Some((Role::Tenant, "abc.def.ghi".to_string()))
        );
        for bad in [
            "gangway_console=x~abc",
            "gangway_console=t~",
            "gangway_console=abc",
            "other=t~abc",
        ] {
            assert_eq!(session_cookie(&headers(&[("cookie", bad)])), None, "{bad}");
        }
    }

    #[test]
    fn a_form_from_another_site_is_not_same_origin() {
        let same_origin =
            |h: &HeaderMap| super::same_origin(h, &axum::http::Uri::from_static("/sign-in"));
        let host = ("host", "console.example:8443");
        assert!(same_origin(&headers(&[
            host,
            ("origin", "https://console.example:8443")
        ])));
        assert!(!same_origin(&headers(&[
            host,
            ("origin", "https://evil.example")
        ])));
        assert!(!same_origin(&headers(&[host, ("origin", "null")])));
        assert!(!same_origin(&headers(&[
            host,
            ("sec-fetch-site", "cross-site")
        ])));
        assert!(same_origin(&headers(&[
            host,
            ("sec-fetch-site", "same-origin")
        ])));
    }

    #[test]
    fn who_reads_the_tokens_subject_and_an_api_keys_id_but_never_shows_a_secret() {
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(br#"{"sub":"alice","tenant":"acme"}"#);
        assert_eq!(who(&format!("h.{payload}.s"), Role::Tenant), "alice (acme)");
        let key = who("gwk_k123_SECRETSECRET", Role::Tenant);
        assert_eq!(key, "API key k123");
        assert!(!key.contains("SECRET"));
    }
}
