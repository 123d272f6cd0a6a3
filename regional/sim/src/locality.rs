//! The locality slowdown model: a gang spread wider than it has to be runs
//! slower.
//!
//! Each topology level has a relative throughput `t(level)`, with
//! `t(nvlink) = 1 ≥ t(leaf) ≥ t(spine) ≥ t(region) > 0`. A unit placed at
//! level `L` whose tightest possible level (in the empty fleet) is `B` runs at
//! `factor = t(L) / t(B)` of its full speed, so it needs `duration / factor`
//! seconds. A single-node job and a gang placed as tightly as the fleet
//! allows run at full speed.
//!
//! Calibration ([`LocalityModel::from_spread_ratio`]): Gavel's measurements
//! (`gavel_consolidation.csv`) give the throughput of a job spread one GPU
//! per server relative to the same job inside one server; the median over
//! V100 jobs is 0.4246. That is the worst case, every byte of gradient
//! traffic crossing the network, so it becomes `t(region)`; the levels in
//! between get equal steps on a log scale (`t(leaf) = r^(1/3)`,
//! `t(spine) = r^(2/3)`): each level up the tree costs the same fraction of
//! throughput. V100 gives `leaf 0.752, spine 0.565, region 0.425`.

use std::fmt;

use gangway_sched::Level;
use serde::Serialize;

use crate::csv::{column, records};

/// Gavel's V100 median of `tput_unconsolidated / tput_consolidated`.
pub const V100_SPREAD_RATIO: f64 = 0.4246;

/// Relative throughput per topology level (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LocalityModel {
    pub nvlink: f64,
    pub leaf: f64,
    pub spine: f64,
    pub region: f64,
}

impl Default for LocalityModel {
    /// Calibrated on V100 ([`V100_SPREAD_RATIO`]).
    fn default() -> LocalityModel {
        LocalityModel::from_spread_ratio(V100_SPREAD_RATIO)
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum LocalityError {
    #[error("locality table {0:?}: expected nvlink=X,leaf=X,spine=X,region=X")]
    Syntax(String),
    #[error("locality table: throughputs must be in (0, 1] and not grow with the level (nvlink ≥ leaf ≥ spine ≥ region)")]
    Order,
    #[error("the Gavel CSV has no usable rows for GPU type {0:?}")]
    NoRows(String),
}

impl LocalityModel {
    /// No slowdown at all.
    pub fn none() -> LocalityModel {
        LocalityModel {
            nvlink: 1.0,
            leaf: 1.0,
            spine: 1.0,
            region: 1.0,
        }
    }

    /// `t(region) = r`, with equal log steps in between (`r` clamped to (0, 1]).
    pub fn from_spread_ratio(r: f64) -> LocalityModel {
        let r = r.clamp(1e-3, 1.0);
        LocalityModel {
            nvlink: 1.0,
            leaf: r.powf(1.0 / 3.0),
            spine: r.powf(2.0 / 3.0),
            region: r,
        }
    }

    /// Calibrates from Gavel's consolidation CSV (`gpu_type,…,ratio`): the
    /// median `ratio` of the rows of `gpu_type` (case-insensitive) becomes the
    /// spread ratio.
    pub fn from_gavel_csv(text: &str, gpu_type: &str) -> Result<LocalityModel, LocalityError> {
        let mut rows = records(text);
        let no_rows = || LocalityError::NoRows(gpu_type.to_string());
        let header = rows.next().and_then(|(_, h)| h.ok()).ok_or_else(no_rows)?;
        let (c_type, c_ratio) = (
            column(&header, "gpu_type").ok_or_else(no_rows)?,
            column(&header, "ratio").ok_or_else(no_rows)?,
        );
        let mut ratios: Vec<f64> = rows
            .filter_map(|(_, r)| r.ok())
            .filter(|f| {
                f.get(c_type)
                    .is_some_and(|t| t.trim().eq_ignore_ascii_case(gpu_type))
            })
            .filter_map(|f| f.get(c_ratio)?.trim().parse::<f64>().ok())
            .filter(|r| r.is_finite() && *r > 0.0)
            .collect();
        if ratios.is_empty() {
            return Err(no_rows());
        }
        ratios.sort_by(f64::total_cmp);
        let n = ratios.len();
        let median = if n % 2 == 1 {
            ratios[n / 2]
        } else {
            (ratios[n / 2 - 1] + ratios[n / 2]) / 2.0
        };
        Ok(LocalityModel::from_spread_ratio(median))
    }

    /// Parses `nvlink=1,leaf=0.75,spine=0.56,region=0.42` (any order; levels
    /// left out keep the default's value).
    pub fn parse(spec: &str) -> Result<LocalityModel, LocalityError> {
        let mut m = LocalityModel::default();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let syntax = || LocalityError::Syntax(spec.to_string());
            let (k, v) = part.split_once('=').ok_or_else(syntax)?;
            let v: f64 = v.trim().parse().map_err(|_| syntax())?;
            let level: Level = k.trim().parse().map_err(|_| syntax())?;
            *m.slot(level) = v;
        }
        m.validate()?;
        Ok(m)
    }

    fn slot(&mut self, level: Level) -> &mut f64 {
        match level {
            Level::Nvlink => &mut self.nvlink,
            Level::Leaf => &mut self.leaf,
            Level::Spine => &mut self.spine,
            Level::Region => &mut self.region,
        }
    }

    pub fn validate(&self) -> Result<(), LocalityError> {
        let t = [self.nvlink, self.leaf, self.spine, self.region];
        let in_range = t.iter().all(|&x| x.is_finite() && x > 0.0 && x <= 1.0);
        if in_range && t.windows(2).all(|w| w[0] >= w[1]) {
            Ok(())
        } else {
            Err(LocalityError::Order)
        }
    }

    /// Relative throughput of a unit whose domain is at `level`.
    pub fn throughput(&self, level: Level) -> f64 {
        match level {
            Level::Nvlink => self.nvlink,
            Level::Leaf => self.leaf,
            Level::Spine => self.spine,
            Level::Region => self.region,
        }
    }

    /// The speed of a unit placed at `placed` whose tightest possible level
    /// is `best`, as a fraction of full speed (at most 1).
    pub fn factor(&self, placed: Level, best: Level) -> f64 {
        (self.throughput(placed) / self.throughput(best)).min(1.0)
    }
}

impl fmt::Display for LocalityModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "nvlink={:.3},leaf={:.3},spine={:.3},region={:.3}",
            self.nvlink, self.leaf, self.spine, self.region
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_the_v100_calibration() {
        let m = LocalityModel::default();
        assert_eq!(m.nvlink, 1.0);
        assert!((m.leaf - 0.7516).abs() < 1e-3, "{m}");
        assert!((m.spine - 0.5649).abs() < 1e-3, "{m}");
        assert_eq!(m.region, V100_SPREAD_RATIO);
        // A gang whose best is one leaf, spread over a spine: 0.565 / 0.752.
        assert!((m.factor(Level::Spine, Level::Leaf) - 0.7516).abs() < 1e-3);
        assert_eq!(m.factor(Level::Leaf, Level::Leaf), 1.0);
        assert_eq!(m.factor(Level::Nvlink, Level::Leaf), 1.0);
        assert!((m.factor(Level::Region, Level::Nvlink) - 0.4246).abs() < 1e-9);
    }

    #[test]
    fn parses_tables_and_calibrates_from_gavel() {
        let m = LocalityModel::parse("leaf=0.9, region=0.5,spine=0.7").unwrap();
        assert_eq!((m.nvlink, m.leaf, m.spine, m.region), (1.0, 0.9, 0.7, 0.5));
        assert_eq!(
            LocalityModel::parse("leaf=0.5,spine=0.9"),
            Err(LocalityError::Order)
        );
        assert!(matches!(
            LocalityModel::parse("rack=0.5"),
            Err(LocalityError::Syntax(_))
        ));
        let csv = "gpu_type,job_type,scale_factor,tput_consolidated,tput_unconsolidated,ratio\n\
                   v100,a,2,1,0.3,0.3\nv100,b,2,1,0.5,0.5\nv100,c,4,1,0.9,0.9\nk80,d,2,1,1.1,1.1\n";
        let v = LocalityModel::from_gavel_csv(csv, "V100").unwrap();
        assert_eq!(v.region, 0.5);
        // Ratios above 1 mean no penalty.
        assert_eq!(
            LocalityModel::from_gavel_csv(csv, "k80").unwrap(),
            LocalityModel::none()
        );
        assert!(LocalityModel::from_gavel_csv(csv, "h100").is_err());
    }
}
