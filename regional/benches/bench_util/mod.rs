//! What the regional benches share: their settings from the environment,
//! Philly-like job sizes, and a throwaway PostgreSQL cluster.
#![allow(dead_code)] // each bench uses some of it

use gangway_devkit::{PgCluster, PgOptions};

/// The environment variable `name`, parsed, or `default`.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Sizes like the Philly trace: mostly 1 GPU, some 2/4/8, a few 16/32.
pub fn philly_gpus(i: usize) -> i64 {
    match i % 100 {
        0..=79 => 1,
        80..=84 => 2,
        85..=89 => 4,
        90..=96 => 8,
        97..=98 => 16,
        _ => 32,
    }
}

/// A PostgreSQL cluster of its own, started, in a directory under /tmp
/// that goes with the returned guard (drop the cluster first).
pub fn throwaway_pg(prefix: &str) -> anyhow::Result<(tempfile::TempDir, PgCluster)> {
    let dir = tempfile::Builder::new().prefix(prefix).tempdir_in("/tmp")?;
    // PostgreSQL runs as its own user when we are root: it must reach in.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    let mut pg = PgCluster::init_or_open(&dir.path().join("pg"), PgOptions::default())?;
    pg.start()?;
    Ok((dir, pg))
}
