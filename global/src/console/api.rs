//! The console's way to the data: the public API itself, called in
//! process with the signed-in person's credential as its bearer token.
//! Every page is built from the answers a CLI would get for the same
//! credential, so what a tenant or an operator may see in the console is
//! exactly what the API lets them see: the console has no query of its
//! own and no privilege of its own.

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use gangway_shared::error::ErrorBody;
use serde::de::DeserializeOwned;
use tower::ServiceExt;

/// Most bytes of one API answer the console reads (a 10,000-GPU region's
/// node list is about 1 MB).
const ANSWER_LIMIT: usize = 64 * 1024 * 1024;

/// The API as one signed-in person sees it.
#[derive(Clone)]
pub struct Api {
    router: Router,
    credential: String,
}

/// Why an API call gave no answer the console can show.
#[derive(Debug)]
pub enum Failure {
    /// The credential was refused (401): sign in again.
    SignIn(String),
    /// Any other refusal or failure, with the API's code and message.
    Refused {
        status: StatusCode,
        code: String,
        message: String,
    },
}

impl Failure {
    pub fn message(&self) -> String {
        match self {
            Failure::SignIn(m) => m.clone(),
            Failure::Refused { code, message, .. } => format!("{message} ({code})"),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Failure::SignIn(_) => StatusCode::UNAUTHORIZED,
            Failure::Refused { status, .. } => *status,
        }
    }
}

impl Api {
    pub fn new(router: Router, credential: String) -> Api {
        Api { router, credential }
    }

    /// `GET path_and_query`, its JSON answer read as `T`.
    pub async fn get<T: DeserializeOwned>(&self, path_and_query: &str) -> Result<T, Failure> {
        let (status, body) = self.call(Method::GET, path_and_query).await?;
        if status.is_success() {
            return serde_json::from_slice(&body).map_err(|e| Failure::Refused {
                status: StatusCode::BAD_GATEWAY,
                code: "unreadable_answer".into(),
                message: format!("the API's answer to {path_and_query} could not be read: {e}"),
            });
        }
        let error: Option<ErrorBody> = serde_json::from_slice(&body).ok();
        let (code, message) = match error {
            Some(e) => (e.code, e.message),
            None => (
                "unknown".into(),
                format!("the API answered {status} to {path_and_query}"),
            ),
        };
        Err(if status == StatusCode::UNAUTHORIZED {
            Failure::SignIn(message)
        } else {
            Failure::Refused {
                status,
                code,
                message,
            }
        })
    }

    /// The status of `GET path_and_query` (to tell what a credential is).
    pub async fn status_of(&self, path_and_query: &str) -> Result<StatusCode, Failure> {
        Ok(self.call(Method::GET, path_and_query).await?.0)
    }

    async fn call(
        &self,
        method: Method,
        path_and_query: &str,
    ) -> Result<(StatusCode, bytes::Bytes), Failure> {
        let request = Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(header::AUTHORIZATION, format!("Bearer {}", self.credential))
            .body(Body::empty())
            .map_err(|e| Failure::Refused {
                status: StatusCode::BAD_REQUEST,
                code: "invalid_query".into(),
                message: format!("cannot ask the API for {path_and_query}: {e}"),
            })?;
        let answer = match self.router.clone().oneshot(request).await {
            Ok(a) => a,
            Err(never) => match never {},
        };
        let status = answer.status();
        let body = axum::body::to_bytes(answer.into_body(), ANSWER_LIMIT)
            .await
            .map_err(|e| Failure::Refused {
                status: StatusCode::BAD_GATEWAY,
                code: "unreadable_answer".into(),
                message: format!("the API's answer to {path_and_query} was cut short: {e}"),
            })?;
        Ok((status, body))
    }
}

/// `s` for a URL's query: letters, digits and `-_.~` as they are, every
/// other byte percent-encoded.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_query_value_is_encoded_so_that_it_cannot_add_parameters() {
        assert_eq!(super::encode("a b&state=x"), "a%20b%26state%3Dx");
        assert_eq!(super::encode("train-7.b_c~"), "train-7.b_c~");
    }
}
