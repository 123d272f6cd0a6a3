//! The names tokens carry: who issues them and whom they are for.
//!
//! Tenants and operators hold tokens for the public API. The global tier
//! and node agents hold tokens for regions; a region accepts nothing else.

/// Issuer of every Gangway token.
pub const ISSUER: &str = "gangway";
/// Audience of tenant and admin tokens (the global tier's public API).
pub const PUBLIC_AUDIENCE: &str = "gangway-api";
/// Audience of service tokens (global tier → region) and agent tokens
/// (agent → its region).
pub const REGION_AUDIENCE: &str = "gangway-region";
