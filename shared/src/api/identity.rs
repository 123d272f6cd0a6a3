//! Tenants as records and API keys: what operators and tenants see, and
//! the versioned record the regions keep of each (every region holds a
//! copy; the global tier writes to and reads from a majority of them).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Whether a tenant may use the cloud.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TenantState {
    Active,
    /// Every request of the tenant's (token or key) is refused with 403
    /// `tenant_suspended`.
    Suspended,
}

/// A tenant as operators keep it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TenantRecord {
    pub tenant: String,
    pub display_name: String,
    pub state: TenantState,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The operator who made the last change.
    pub updated_by: String,
}

/// Body of `POST /v1/admin/tenants`.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantCreate {
    /// 1-63 characters of a-z, 0-9 and '-'.
    pub tenant: String,
    /// Default: the tenant's id. At most 200 characters.
    #[serde(default)]
    pub display_name: Option<String>,
}

/// Body of `POST /v1/admin/tenants/{tenant}/suspend`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantSuspend {
    /// Also cancel the tenant's unfinished jobs in every region (default:
    /// they run on; only new requests are refused).
    #[serde(default)]
    pub stop_jobs: bool,
}

/// Answer of a suspend or resume.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct TenantChanged {
    pub tenant: TenantRecord,
    /// Jobs asked to stop (a suspend with `stop_jobs`).
    pub stopped_jobs: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct TenantList {
    pub tenants: Vec<TenantRecord>,
}

/// What an API key lets its holder do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum KeyScope {
    /// The tenant's endpoints, reads only (GET).
    Read,
    /// Everything a tenant's token may do.
    Submit,
    /// An operator's key: the admin endpoints.
    Admin,
}

impl KeyScope {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyScope::Read => "read",
            KeyScope::Submit => "submit",
            KeyScope::Admin => "admin",
        }
    }
}

/// An API key, without its secret.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ApiKey {
    /// The key's public part (in the secret after `gwk_`).
    pub key_id: String,
    /// The tenant it acts for; `null` for an operator's (`admin`) key.
    pub tenant: Option<String>,
    pub name: String,
    pub scope: KeyScope,
    /// Who made it (an operator, or the tenant's own credential).
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
    /// When a global replica last let it in (kept to the minute).
    #[serde(default)]
    pub last_used_at: Option<DateTime<Utc>>,
}

/// Body of `POST /v1/keys` (a tenant's own key) or `POST /v1/admin/keys`.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyCreate {
    /// 1-64 characters of letters, digits, '-', '_', '.'.
    pub name: String,
    /// Default `submit`; `admin` only from an operator, for an operator's key.
    #[serde(default)]
    pub scope: Option<KeyScope>,
    /// Seconds until it expires (default: never; at most 10 years).
    #[serde(default)]
    pub expires_in_s: Option<u64>,
    /// The tenant a key made by an operator acts for (not with `admin`).
    #[serde(default)]
    pub tenant: Option<String>,
}

/// The answer of a create: the only time the secret is shown.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct ApiKeyCreated {
    pub key: ApiKey,
    /// `gwk_<key id>_<64 hex digits>`: use it as a bearer token. Stored
    /// nowhere but by you (the regions keep its SHA-256).
    pub secret: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct ApiKeyList {
    pub keys: Vec<ApiKey>,
}

/// One record as a region keeps it (`/internal/v1/identity/…`): the
/// global tier's last write wins by `version` (its writer's clock in
/// microseconds), so a majority read finds the newest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IdentityRecord {
    pub version: i64,
    pub doc: serde_json::Value,
    #[serde(default)]
    pub last_used_at: Option<DateTime<Utc>>,
}

/// Body of `PUT /internal/v1/identity/{kind}/{id}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityWrite {
    pub version: i64,
    pub doc: serde_json::Value,
    /// The audit log's action (`tenant.create`, `key.revoke`, …).
    pub action: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct IdentityRecordList {
    /// By id.
    pub records: std::collections::BTreeMap<String, IdentityRecord>,
}
