//! Authentication for Gangway: who may call which server, and over what.
//!
//! Tenants and operators call the global tier with Bearer JWTs; the global
//! tier calls regions with short-lived service tokens, and node agents call
//! their region with agent tokens. Every token is ES256 (ECDSA P-256) and
//! names its signing key with a `kid`, so keys can rotate: a verifier trusts
//! a set of keys at once. All transport is TLS (rustls with the `ring`
//! provider); for local clouds a small dev CA issues the server certificate.
//!
//! # Layout
//!
//! - [`error`]: [`AuthError`], the token-verification failures, each with a
//!   stable machine-readable [`AuthError::code`] and a message that says what
//!   to do next.
//! - [`jwt`]: [`Claims`] and [`Role`], [`SigningKey`] (mint tokens),
//!   [`Verifier`] (check them: algorithm, key id, signature, time, issuer,
//!   audience, role-specific claims) and [`claims_for`].
//! - [`oidc`]: tokens of an external OpenID Connect issuer: its JWKS as a
//!   [`oidc::KeySet`] (RS256 and ES256 keys), and [`oidc::OidcVerifier`].
//! - [`tls`]: [`DevCa`] (a throwaway certificate authority that issues server
//!   certificates) and the rustls [`server_config`]/[`client_config`]
//!   builders, plus [`TlsError`].
//! - [`dev`]: [`DevMaterial`], the CA, server certificate and signing keys of
//!   a local cloud, created once under a state directory and loaded on every
//!   later start so tokens and the CA stay valid across restarts.
//! - [`fsutil`]: atomic, permission-aware file writes (keys, and the
//!   CLI's stored credentials).

pub mod dev;
pub mod error;
pub mod fsutil;
pub mod jwt;
pub mod oidc;
pub mod tls;

pub use dev::{DevError, DevMaterial, OPERATOR_KID, SERVICE_KID, TENANT_KID};
pub use error::AuthError;
pub use jwt::{claims_for, valid_tenant, Claims, Role, SigningKey, Verifier};
pub use tls::{client_config, server_config, DevCa, TlsError};
