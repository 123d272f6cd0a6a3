//! Tenant entitlements: each tenant's guaranteed share of the fleet.
//!
//! Read from a two-column CSV such as `philly_vc_nodes.csv` (`vc,node num`):
//! the first column names the tenant, the second is a weight (nodes); a
//! tenant's entitlement is its weight over the sum of all weights. Tenants
//! the file does not name are entitled to nothing (and, with quota caps, are
//! not capped: see `SimConfig::quota_caps`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::csv::records;

/// Each named tenant's share of the fleet, summing to 1.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Entitlements {
    /// Tenant -> share in `(0, 1]`.
    pub shares: BTreeMap<String, f64>,
}

#[derive(Debug, thiserror::Error)]
pub enum EntitlementsError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("line {line}: {message}")]
    Bad { line: usize, message: String },
    #[error("no tenant has a positive weight")]
    Empty,
}

impl Entitlements {
    pub fn load(path: impl AsRef<Path>) -> Result<Entitlements, EntitlementsError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| EntitlementsError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Entitlements::parse(&text)
    }

    /// Parses `tenant,weight` rows after a header row.
    pub fn parse(text: &str) -> Result<Entitlements, EntitlementsError> {
        let mut weights: BTreeMap<String, f64> = BTreeMap::new();
        for (line, row) in records(text).skip(1) {
            let bad = |message: String| EntitlementsError::Bad { line, message };
            let fields = row.map_err(bad)?;
            let [tenant, weight, ..] = fields.as_slice() else {
                return Err(bad("expected two columns: tenant, weight".into()));
            };
            let weight: f64 = weight
                .trim()
                .parse()
                .ok()
                .filter(|w: &f64| w.is_finite() && *w >= 0.0)
                .ok_or_else(|| bad(format!("weight {weight:?} is not a non-negative number")))?;
            *weights.entry(tenant.trim().to_string()).or_default() += weight;
        }
        let total: f64 = weights.values().sum();
        if total <= 0.0 {
            return Err(EntitlementsError::Empty);
        }
        Ok(Entitlements {
            shares: weights
                .into_iter()
                .filter(|(_, w)| *w > 0.0)
                .map(|(t, w)| (t, w / total))
                .collect(),
        })
    }

    /// The tenant's share, 0 for a tenant not named.
    pub fn share(&self, tenant: &str) -> f64 {
        self.shares.get(tenant).copied().unwrap_or(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_from_node_counts() {
        let e = Entitlements::parse("vc,node num\na,64\nb,32\n\nc,0\n").unwrap();
        assert_eq!(e.share("a"), 64.0 / 96.0);
        assert_eq!(e.share("b"), 32.0 / 96.0);
        assert_eq!(e.share("c"), 0.0);
        assert_eq!(e.share("zzz"), 0.0);
        assert!(Entitlements::parse("vc,node num\na,x\n").is_err());
        assert!(Entitlements::parse("vc,node num\na\n").is_err());
        assert!(matches!(
            Entitlements::parse("vc,node num\n"),
            Err(EntitlementsError::Empty)
        ));
    }
}
