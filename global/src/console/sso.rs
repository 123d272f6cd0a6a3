//! Single sign-on in a browser: the OpenID Connect authorization code flow
//! with PKCE, against the tenants' or the operators' issuer the tier is
//! configured with (`crate::oidc`).
//!
//! `GET /sign-in/sso/{tenants|operators}` sends the browser to the
//! issuer's authorization endpoint with a fresh `state`, `nonce` and PKCE
//! challenge, kept for ten minutes in a cookie of their own (`SameSite=Lax`:
//! the issuer's redirect back is a navigation from another site). The
//! issuer sends the browser to `GET /sign-in/sso/callback` with a code;
//! the console checks the state against its cookie, exchanges the code
//! (with the PKCE verifier, and the client secret if configured) for an ID
//! token, verifies it with the issuer's keys as the API does, checks its
//! nonce, and keeps it as the session's credential — from then on it is a
//! token like any other, and the API decides what it may see. A sign-in
//! the browser did not start here (no cookie, another state), a token for
//! another nonce, a forged token: refused, nothing set.

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use base64::Engine;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::api::encode;
use super::{
    classify, cookie, html, request_host, session_cookie_header, sign_in_form, Chrome, Console,
    Role,
};
use crate::oidc::Oidc;

/// The flow's cookie: kind, state, nonce and verifier.
const FLOW_COOKIE: &str = "gangway_sso";
/// Where the issuer sends the browser back.
pub const CALLBACK: &str = "/sign-in/sso/callback";

fn random() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// The PKCE challenge of `verifier` (S256).
fn challenge(verifier: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

/// This tier's callback URL, as the browser reached it (the issuer must
/// have it registered as a redirect URI).
fn callback_url(headers: &HeaderMap, uri: &axum::http::Uri) -> Option<String> {
    let host = request_host(headers, uri)?;
    let plain = host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'));
    plain.then(|| format!("https://{host}{CALLBACK}"))
}

fn issuer(console: &Console, role: Role) -> Option<&Oidc> {
    match role {
        Role::Tenant => console.sso.tenants.as_ref(),
        Role::Operator => console.sso.operators.as_ref(),
    }
}

fn refused(status: StatusCode, why: impl Into<String>) -> Response {
    let mut resp = sign_in_form(status, why);
    resp.headers_mut().append(header::SET_COOKIE, clear_flow());
    resp
}

fn clear_flow() -> HeaderValue {
    HeaderValue::from_static(
        "gangway_sso=; Path=/sign-in/sso; Max-Age=0; HttpOnly; Secure; SameSite=Lax",
    )
}

pub async fn start(
    State(console): State<Console>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    Path(kind): Path<String>,
) -> Response {
    let role = match kind.as_str() {
        "tenants" => Role::Tenant,
        "operators" => Role::Operator,
        _ => return refused(StatusCode::NOT_FOUND, "No such single sign-on."),
    };
    let Some(oidc) = issuer(&console, role) else {
        return refused(
            StatusCode::NOT_FOUND,
            "Single sign-on is not configured here for that role: sign in with a token or API key.",
        );
    };
    let Some(endpoints) = oidc.endpoints() else {
        return refused(
            StatusCode::SERVICE_UNAVAILABLE,
            "The identity provider's discovery document has not been read, or names no \
             authorization and token endpoints: try again in a moment, or sign in with a token.",
        );
    };
    let Some(redirect_uri) = callback_url(&headers, &uri) else {
        return refused(
            StatusCode::BAD_REQUEST,
            "This request names no usable host.",
        );
    };
    let (state, nonce, verifier) = (random(), random(), format!("{}{}", random(), random()));
    let letter = role.letter();
    let sep = if endpoints.authorization.contains('?') {
        '&'
    } else {
        '?'
    };
    let to = format!(
        "{}{sep}response_type=code&client_id={}&redirect_uri={}&scope=openid&state={state}\
         &nonce={nonce}&code_challenge={}&code_challenge_method=S256",
        endpoints.authorization,
        encode(&oidc.config.audience),
        encode(&redirect_uri),
        challenge(&verifier),
    );
    let mut resp = Redirect::to(&to).into_response();
    let cookie = format!(
        "{FLOW_COOKIE}={letter}~{state}~{nonce}~{verifier}; Path=/sign-in/sso; Max-Age=600; \
         HttpOnly; Secure; SameSite=Lax"
    );
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp
}

/// The flow's cookie: (role, state, nonce, verifier).
fn flow(headers: &HeaderMap) -> Option<(Role, String, String, String)> {
    let mut parts = cookie(headers, FLOW_COOKIE)?.split('~');
    let role = Role::from_letter(parts.next()?)?;
    let (state, nonce, verifier) = (parts.next()?, parts.next()?, parts.next()?);
    Some((role, state.into(), nonce.into(), verifier.into()))
}

#[derive(Deserialize)]
pub struct Callback {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

#[derive(askama::Template)]
#[template(path = "continue.html")]
struct Continue {
    chrome: Chrome,
    to: &'static str,
}

pub async fn callback(
    State(console): State<Console>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    Query(q): Query<Callback>,
) -> Response {
    let Some((role, state, nonce, verifier)) = flow(&headers) else {
        return refused(
            StatusCode::BAD_REQUEST,
            "This sign-in was not started from this browser here, or took more than ten \
             minutes: start again.",
        );
    };
    if let Some(e) = q.error {
        return refused(
            StatusCode::UNAUTHORIZED,
            format!(
                "The identity provider did not sign you in: {e}{}",
                q.error_description
                    .map(|d| format!(" ({d})"))
                    .unwrap_or_default()
            ),
        );
    }
    if q.state.as_deref() != Some(state.as_str()) {
        return refused(
            StatusCode::BAD_REQUEST,
            "This sign-in's state does not match the one this browser started: start again.",
        );
    }
    let (Some(code), Some(oidc), Some(redirect_uri)) =
        (q.code, issuer(&console, role), callback_url(&headers, &uri))
    else {
        return refused(
            StatusCode::BAD_REQUEST,
            "The identity provider sent no code.",
        );
    };
    let token = match oidc.exchange(&code, &redirect_uri, &verifier).await {
        Ok(t) => t,
        Err(e) => return refused(StatusCode::UNAUTHORIZED, e),
    };
    let claims = match oidc.verify(&token).await {
        Ok(c) => c,
        Err(e) => {
            return refused(
                StatusCode::UNAUTHORIZED,
                format!("The identity provider's token did not verify: {e}"),
            )
        }
    };
    if claims.strings("nonce") != [nonce.as_str()] {
        return refused(
            StatusCode::UNAUTHORIZED,
            "The identity provider's token is not for this sign-in (its nonce differs).",
        );
    }
    // The API has the last word on what the token is.
    if classify(&console, &token).await != Ok(role) {
        return refused(
            StatusCode::UNAUTHORIZED,
            "The identity provider signed you in, but this cloud does not accept its token for \
             that role (no tenant named, or not in the operators' group).",
        );
    }
    let to = role.home();
    // A page, not a redirect: the session cookie is `SameSite=Strict`, and
    // a redirect chain that began at the issuer is a cross-site navigation
    // that would not carry it; the page's own refresh is same-site.
    let mut resp = html(
        StatusCode::OK,
        &Continue {
            chrome: Chrome::anonymous("Signed in"),
            to,
        },
    );
    if let Some(v) = session_cookie_header(role, &token) {
        resp.headers_mut().append(header::SET_COOKIE, v);
    }
    resp.headers_mut().append(header::SET_COOKIE, clear_flow());
    resp
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_pkce_challenge_is_the_rfc_7636_one() {
        // RFC 7636, appendix B.
        assert_eq!(
            super::challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
    }

    #[test]
    fn a_host_with_odd_characters_gets_no_callback() {
        let uri = axum::http::Uri::from_static("/x");
        let mut h = axum::http::HeaderMap::new();
        h.insert("host", "console.example:8443".parse().unwrap());
        assert_eq!(
            super::callback_url(&h, &uri).as_deref(),
            Some("https://console.example:8443/sign-in/sso/callback")
        );
        h.insert("host", "evil.example/x?".parse().unwrap());
        assert_eq!(super::callback_url(&h, &uri), None);
    }
}
