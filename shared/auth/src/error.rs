//! Why a token was refused (or a key could not be used), with stable codes.
//!
//! Servers map every variant except [`AuthError::Key`] to 401 with
//! [`AuthError::code`] as the JSON error code; `Key` is a configuration
//! problem (a bad PEM, a duplicate kid) found at start-up.

/// A token that did not verify, or a key that could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization` header (or an empty one).
    #[error("no bearer token: send the header `Authorization: Bearer <token>`")]
    Missing,
    /// Not a compact JWS (`header.payload.signature`), bad base64 or JSON, or
    /// not a `Bearer` credential.
    #[error("malformed token: {0}; send a JWT as `Authorization: Bearer <token>`")]
    Malformed(String),
    /// The header names an algorithm the key it names is not for (`none`,
    /// `HS256`, …: Gangway's own keys sign ES256, an OpenID Connect
    /// issuer's RS256 or ES256, as its key set says).
    #[error("tokens signed with {0:?} are not accepted here (Gangway's own tokens are ES256; an OpenID Connect issuer's RS256 or ES256); get a token from a trusted issuer")]
    UnsupportedAlgorithm(String),
    /// The header's `kid` is absent (empty string here) or names no trusted key.
    #[error("{}; get a new token (its signing key may have been rotated out)", unknown_key_message(.0))]
    UnknownKey(String),
    /// The signature does not match the header and payload under the named key.
    #[error("the token's signature does not verify: it was altered or signed by another key; get a new token")]
    BadSignature,
    /// `exp` (plus leeway) is in the past.
    #[error("the token expired at {}; get a new one", rfc3339(*.expired_at))]
    Expired {
        /// The token's `exp`, in Unix seconds.
        expired_at: i64,
    },
    /// `nbf` (minus leeway) is in the future.
    #[error("the token is not valid before {}; check this machine's clock or wait until then", rfc3339(*.not_before))]
    NotYetValid {
        /// The token's `nbf`, in Unix seconds.
        not_before: i64,
    },
    /// `aud` is not exactly this server's audience.
    #[error("the token is for audience {found:?}, not {expected:?}; get a token for this service")]
    WrongAudience { expected: String, found: String },
    /// `iss` is not exactly the trusted issuer.
    #[error("the token was issued by {found:?}, not {expected:?}; get a token from {expected:?}")]
    WrongIssuer { expected: String, found: String },
    /// A claim is missing, has the wrong type, or breaks a role rule (a tenant
    /// token without a valid tenant, an agent token without a region, …).
    #[error("the token's claims are not acceptable: {0}; get a new token")]
    BadClaims(String),
    /// A signing or verification key could not be loaded or used.
    #[error("invalid key: {0}")]
    Key(String),
}

impl AuthError {
    /// The stable, machine-readable error code for API responses.
    pub fn code(&self) -> &'static str {
        match self {
            AuthError::Missing => "missing_token",
            AuthError::Malformed(_) => "malformed_token",
            AuthError::UnsupportedAlgorithm(_) => "unsupported_algorithm",
            AuthError::UnknownKey(_) => "unknown_key",
            AuthError::BadSignature => "bad_signature",
            AuthError::Expired { .. } => "token_expired",
            AuthError::NotYetValid { .. } => "token_not_yet_valid",
            AuthError::WrongAudience { .. } => "wrong_audience",
            AuthError::WrongIssuer { .. } => "wrong_issuer",
            AuthError::BadClaims(_) => "bad_claims",
            AuthError::Key(_) => "invalid_key",
        }
    }
}

fn unknown_key_message(kid: &str) -> String {
    if kid.is_empty() {
        "the token names no signing key (no `kid` in its header)".to_owned()
    } else {
        format!("the token's signing key {kid:?} is not one this server trusts")
    }
}

/// Unix seconds as RFC 3339 (UTC), falling back to the raw number when out of range.
pub(crate) fn rfc3339(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("{unix} (Unix seconds)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_what_to_do() {
        let e = AuthError::Expired { expired_at: 0 };
        assert_eq!(e.code(), "token_expired");
        assert_eq!(
            e.to_string(),
            "the token expired at 1970-01-01T00:00:00Z; get a new one"
        );
        assert!(AuthError::UnknownKey(String::new())
            .to_string()
            .contains("no `kid`"));
        assert!(AuthError::UnknownKey("k9".into())
            .to_string()
            .contains("\"k9\""));
        assert!(rfc3339(i64::MAX).contains("Unix seconds"));
    }
}
