//! Quotas (guarantees, weights, caps) and admission limits per tenant.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Largest GPU count a quota accepts (larger is a typo).
pub const MAX_QUOTA_GPUS: i64 = 10_000_000;
/// Largest fair-share weight a quota accepts.
pub const MAX_QUOTA_WEIGHT: f64 = 1000.0;

/// A tenant's terms for one GPU type in a region: GPUs it is guaranteed, its
/// fair-share weight, and an optional hard cap.
///
/// Capacity a tenant does not use is lent to others; a tenant holding fewer
/// GPUs than its guarantee takes lent GPUs back by preempting tenants that
/// hold more than theirs. Among tenants beyond their guarantees, weighted
/// fair share (with past usage decayed) decides who goes first. A tenant
/// with no quota is guaranteed nothing, has weight 1 and no cap.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Quota {
    pub tenant: String,
    pub gpu_type: String,
    /// GPUs of the type the tenant is guaranteed.
    pub guaranteed_gpus: u32,
    /// The most GPUs of the type the tenant may hold at once, borrowing
    /// included; `null` = no cap.
    pub max_gpus: Option<u32>,
    /// Fair-share weight (1.0 = an equal share); kept to thousandths.
    pub weight: f64,
}

/// Body of `PUT /v1/admin/quotas/{tenant}/{gpu_type}`: replaces the
/// tenant's terms for the GPU type.
///
/// Only a JSON object is accepted (serde would otherwise take `[8]` as
/// `{"guaranteed_gpus": 8}`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "serde_json::Map<String, serde_json::Value>")]
pub struct QuotaUpdate {
    /// GPUs guaranteed (0 – 10,000,000).
    #[schema(minimum = 0, maximum = 10000000)]
    pub guaranteed_gpus: i64,
    /// The cap, at least `guaranteed_gpus`; absent or `null` = no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 10000000)]
    pub max_gpus: Option<i64>,
    /// Fair-share weight, above 0 and at most 1000, kept to thousandths;
    /// absent = 1.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
}

/// The fields of a [`QuotaUpdate`] as they are decoded.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaUpdateFields {
    guaranteed_gpus: i64,
    #[serde(default)]
    max_gpus: Option<i64>,
    #[serde(default)]
    weight: Option<f64>,
}

impl TryFrom<serde_json::Map<String, serde_json::Value>> for QuotaUpdate {
    type Error = serde_json::Error;

    fn try_from(fields: serde_json::Map<String, serde_json::Value>) -> Result<Self, Self::Error> {
        let f: QuotaUpdateFields = serde_json::from_value(serde_json::Value::Object(fields))?;
        Ok(QuotaUpdate {
            guaranteed_gpus: f.guaranteed_gpus,
            max_gpus: f.max_gpus,
            weight: f.weight,
        })
    }
}

/// Why a [`QuotaUpdate`] was refused: a stable code from
/// [`crate::error::codes`] and a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaRefused {
    pub code: &'static str,
    pub message: String,
}

/// A checked [`QuotaUpdate`], in the units the region stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaTerms {
    pub guaranteed_gpus: u32,
    pub max_gpus: Option<u32>,
    /// In thousandths (1000 = 1.0), at least 1.
    pub weight_milli: u32,
}

impl QuotaUpdate {
    /// Checks the numbers: GPU counts in 0 … [`MAX_QUOTA_GPUS`]
    /// (`invalid_gpus`), a cap no lower than the guarantee and a weight in
    /// (0, [`MAX_QUOTA_WEIGHT`]] that is at least 0.001 (`invalid_quota`).
    pub fn check(&self) -> Result<QuotaTerms, QuotaRefused> {
        use crate::error::codes;
        let gpus = |what: &str, n: i64| {
            if (0..=MAX_QUOTA_GPUS).contains(&n) {
                Ok(n as u32)
            } else {
                Err(QuotaRefused {
                    code: codes::INVALID_GPUS,
                    message: format!("{what} must be between 0 and {MAX_QUOTA_GPUS}, not {n}"),
                })
            }
        };
        let guaranteed = gpus("guaranteed_gpus", self.guaranteed_gpus)?;
        let max = self.max_gpus.map(|m| gpus("max_gpus", m)).transpose()?;
        if let Some(m) = max {
            if m < guaranteed {
                return Err(QuotaRefused {
                    code: codes::INVALID_QUOTA,
                    message: format!(
                        "max_gpus ({m}) is below guaranteed_gpus ({guaranteed}): a cap must \
                         leave room for the guarantee"
                    ),
                });
            }
        }
        let weight = self.weight.unwrap_or(1.0);
        let milli = (weight * 1000.0).round();
        if !weight.is_finite() || weight <= 0.0 || weight > MAX_QUOTA_WEIGHT || milli < 1.0 {
            return Err(QuotaRefused {
                code: codes::INVALID_QUOTA,
                message: format!(
                    "weight must be at least 0.001 and at most {MAX_QUOTA_WEIGHT}, not {weight}"
                ),
            });
        }
        Ok(QuotaTerms {
            guaranteed_gpus: guaranteed,
            max_gpus: max,
            weight_milli: milli as u32,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QuotaList {
    pub quotas: Vec<Quota>,
}

/// Largest value an admission limit accepts (larger is a typo).
pub const MAX_TENANT_LIMIT: i64 = 10_000_000;

/// A tenant's admission limits in a region: checked when a job is
/// submitted, so a tenant over one is refused at once (429
/// `queued_jobs_limit` or `requested_gpus_limit`, nothing created) rather
/// than accepted and left to starve. Quotas, by contrast, decide what
/// accepted jobs may hold once they run. A tenant with no limits has none.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TenantLimits {
    pub tenant: String,
    /// The most of the tenant's jobs that may wait in state `queued` in the
    /// region at once; `null` = no limit.
    pub max_queued_jobs: Option<u32>,
    /// The most GPUs the tenant's unfinished jobs in the region (every
    /// state but `succeeded`, `failed` and `cancelled`) may ask for
    /// together, a new job's included; `null` = no limit.
    pub max_gpus: Option<u32>,
    /// When an operator last set them.
    pub updated_at: DateTime<Utc>,
}

/// Body of `PUT /v1/admin/limits/{tenant}`: replaces the tenant's limits.
/// A field left out or `null` is no limit on that dimension; at least one
/// must be set (to remove both, DELETE the limits).
///
/// Only a JSON object is accepted, and no field besides these two.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "serde_json::Map<String, serde_json::Value>")]
pub struct LimitsUpdate {
    /// Queued jobs at most (0 – 10,000,000); absent or `null` = no limit.
    #[schema(minimum = 0, maximum = 10000000)]
    pub max_queued_jobs: Option<i64>,
    /// GPUs of unfinished jobs at most (0 – 10,000,000); absent or `null`
    /// = no limit.
    #[schema(minimum = 0, maximum = 10000000)]
    pub max_gpus: Option<i64>,
}

/// The fields of a [`LimitsUpdate`] as they are decoded.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsUpdateFields {
    #[serde(default)]
    max_queued_jobs: Option<i64>,
    #[serde(default)]
    max_gpus: Option<i64>,
}

impl TryFrom<serde_json::Map<String, serde_json::Value>> for LimitsUpdate {
    type Error = serde_json::Error;

    fn try_from(fields: serde_json::Map<String, serde_json::Value>) -> Result<Self, Self::Error> {
        let f: LimitsUpdateFields = serde_json::from_value(serde_json::Value::Object(fields))?;
        Ok(LimitsUpdate {
            max_queued_jobs: f.max_queued_jobs,
            max_gpus: f.max_gpus,
        })
    }
}

/// A checked [`LimitsUpdate`], in the units the region stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitTerms {
    pub max_queued_jobs: Option<u32>,
    pub max_gpus: Option<u32>,
}

/// Why a [`LimitsUpdate`] was refused (always `invalid_limits`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitsRefused {
    pub code: &'static str,
    pub message: String,
}

impl LimitsUpdate {
    /// Checks the numbers: each in 0 … [`MAX_TENANT_LIMIT`], and at least
    /// one set (`invalid_limits`).
    pub fn check(&self) -> Result<LimitTerms, LimitsRefused> {
        use crate::error::codes;
        let refused = |message: String| LimitsRefused {
            code: codes::INVALID_LIMITS,
            message,
        };
        let limit = |what: &str, n: Option<i64>| match n {
            None => Ok(None),
            Some(n) if (0..=MAX_TENANT_LIMIT).contains(&n) => Ok(Some(n as u32)),
            Some(n) => Err(refused(format!(
                "{what} must be between 0 and {MAX_TENANT_LIMIT} (or null for no limit), not {n}"
            ))),
        };
        let terms = LimitTerms {
            max_queued_jobs: limit("max_queued_jobs", self.max_queued_jobs)?,
            max_gpus: limit("max_gpus", self.max_gpus)?,
        };
        if terms.max_queued_jobs.is_none() && terms.max_gpus.is_none() {
            return Err(refused(
                "set max_queued_jobs, max_gpus or both; to remove a tenant's limits, \
                 DELETE them (gangway admin limits delete TENANT)"
                    .into(),
            ));
        }
        Ok(terms)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TenantLimitsList {
    /// Ordered by tenant.
    pub limits: Vec<TenantLimits>,
}
