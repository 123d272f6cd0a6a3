//! Capacity reservations: what tenants send and what they get back.
//!
//! A reservation promises a tenant `gpus` GPUs of a type inside one domain
//! of a topology level of a region, for a window `[start, end)` or from
//! `start` on. The region admits it only if it can keep that promise next
//! to every other one; otherwise it refuses it at once (409
//! `reservation_unavailable`, with the earliest window of the same length
//! that would work in `earliest_start` / `earliest_end` of the error body).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::api::{TopologyLevel, MAX_JOB_GPUS};
use crate::error::codes;
use crate::validate::{invalid, Invalid};

/// Body of `POST /v1/reservations`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReservationSpec {
    /// The GPU model, for example `h100`.
    #[schema(pattern = "^[a-z0-9-]{1,64}$")]
    pub gpu_type: String,
    /// GPUs reserved, all inside one domain of `level`.
    #[schema(minimum = 1, maximum = 100000)]
    pub gpus: i64,
    /// Every reserved GPU lies inside one domain of this level (`node` is
    /// another name for `nvlink`). Default `region`: anywhere in the region.
    #[serde(default = "region_level")]
    pub level: TopologyLevel,
    /// When the reservation starts (RFC 3339). Absent, or in the past: now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<DateTime<Utc>>,
    /// When it ends (RFC 3339), after `start`. Absent: open-ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<DateTime<Utc>>,
    /// The region to reserve in (the global tier routes on it; a region
    /// refuses another region's name with `wrong_region`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

fn region_level() -> TopologyLevel {
    TopologyLevel::Region
}

/// Body of `PATCH /v1/reservations/{id}`: a new size, a new end, or both.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReservationResize {
    /// The new number of GPUs (absent: unchanged). Never below what the
    /// reservation's running jobs hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 100000)]
    pub gpus: Option<i64>,
    /// The new end (RFC 3339), after the start and after now; `null`:
    /// open-ended; absent: unchanged.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    #[schema(value_type = Option<DateTime<Utc>>, nullable)]
    pub end: Option<Option<DateTime<Utc>>>,
}

/// A field that is present (`null` included) is `Some`.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// Where a reservation stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReservationState {
    /// Admitted; its start is still ahead.
    Scheduled,
    /// Started and not over: its jobs run in it.
    Active,
    /// Its end has passed.
    Ended,
    /// Deleted by its tenant (or an operator).
    Deleted,
}

impl ReservationState {
    pub fn as_str(self) -> &'static str {
        match self {
            ReservationState::Scheduled => "scheduled",
            ReservationState::Active => "active",
            ReservationState::Ended => "ended",
            ReservationState::Deleted => "deleted",
        }
    }
}

impl std::fmt::Display for ReservationState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An admitted capacity reservation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Reservation {
    pub id: Uuid,
    pub tenant: String,
    pub region: String,
    pub gpu_type: String,
    pub gpus: u32,
    pub level: TopologyLevel,
    /// The domain it is pinned to, from the region down: `[spine]`,
    /// `[spine, leaf]` or `[spine, leaf, nvlink domain]`; empty for the
    /// region.
    pub domain: Vec<String>,
    pub start: DateTime<Utc>,
    /// Absent: open-ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<DateTime<Utc>>,
    pub state: ReservationState,
    /// GPUs its jobs hold now.
    pub in_use_gpus: u32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// The answer of `GET /v1/reservations`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReservationList {
    /// Newest first.
    pub reservations: Vec<Reservation>,
    /// Regions that did not answer (global tier); their reservations are
    /// missing from the list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable_regions: Vec<String>,
}

fn valid_gpu_type(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 64
        && t.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn check_gpus(gpus: i64) -> Result<u32, Invalid> {
    if (1..=MAX_JOB_GPUS).contains(&gpus) {
        Ok(gpus as u32)
    } else {
        Err(invalid(
            codes::INVALID_GPUS,
            format!("gpus must be between 1 and {MAX_JOB_GPUS}, got {gpus}"),
        ))
    }
}

impl ReservationSpec {
    /// The checks that need neither the fleet nor the clock: the GPU
    /// type's spelling, the number of GPUs, an end after the start.
    pub fn check(&self) -> Result<(), Invalid> {
        if !valid_gpu_type(&self.gpu_type) {
            return Err(invalid(
                codes::INVALID_SPEC,
                "gpu_type must be 1–64 characters of a-z, 0-9 and '-'",
            ));
        }
        check_gpus(self.gpus)?;
        if let (Some(start), Some(end)) = (self.start, self.end) {
            if end <= start {
                return Err(invalid(
                    codes::INVALID_RESERVATION,
                    format!("end ({end}) must be after start ({start})"),
                ));
            }
        }
        Ok(())
    }
}

impl ReservationResize {
    /// A resize changes something, and its size is in range.
    pub fn check(&self) -> Result<(), Invalid> {
        if self.gpus.is_none() && self.end.is_none() {
            return Err(invalid(
                codes::INVALID_RESERVATION,
                "a resize names a new gpus, a new end (null: open-ended), or both",
            ));
        }
        if let Some(g) = self.gpus {
            check_gpus(g)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_defaults_to_the_region_level_and_takes_node_for_nvlink() {
        let s: ReservationSpec =
            serde_json::from_str(r#"{"gpu_type": "h100", "gpus": 16}"#).unwrap();
        assert_eq!(s.level, TopologyLevel::Region);
        assert!(s.check().is_ok());
        let s: ReservationSpec =
            serde_json::from_str(r#"{"gpu_type": "h100", "gpus": 8, "level": "node"}"#).unwrap();
        assert_eq!(s.level, TopologyLevel::Nvlink);
        assert!(serde_json::from_str::<ReservationSpec>(
            r#"{"gpu_type": "h100", "gpus": 8, "size": 3}"#
        )
        .is_err());
        let bad = ReservationSpec {
            gpus: 0,
            ..s.clone()
        };
        assert_eq!(bad.check().unwrap_err().code, codes::INVALID_GPUS);
        let t = |s: &str| Some(s.parse::<DateTime<Utc>>().unwrap());
        let backwards = ReservationSpec {
            start: t("2030-01-01T01:00:00Z"),
            end: t("2030-01-01T00:00:00Z"),
            ..s
        };
        assert_eq!(
            backwards.check().unwrap_err().code,
            codes::INVALID_RESERVATION
        );
    }

    #[test]
    fn a_resize_tells_an_absent_end_from_a_null_one() {
        let r: ReservationResize = serde_json::from_str(r#"{"gpus": 4}"#).unwrap();
        assert_eq!((r.gpus, r.end), (Some(4), None));
        let r: ReservationResize = serde_json::from_str(r#"{"end": null}"#).unwrap();
        assert_eq!(r.end, Some(None));
        assert_eq!(serde_json::to_string(&r).unwrap(), r#"{"end":null}"#);
        let r: ReservationResize =
            serde_json::from_str(r#"{"end": "2030-01-01T00:00:00Z"}"#).unwrap();
        assert!(matches!(r.end, Some(Some(_))));
        let empty: ReservationResize = serde_json::from_str("{}").unwrap();
        assert_eq!(empty.check().unwrap_err().code, codes::INVALID_RESERVATION);
    }
}
