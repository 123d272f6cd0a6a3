//! Pieces every end-to-end test over real processes uses.
#![allow(dead_code)]

use std::path::Path;
use std::process::Child;
use std::time::Duration;

use gangway_auth::jwt::{claims_for, Role, SigningKey};
use gangway_shared::tokens;

/// The `gangway` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_gangway");

/// A child process killed when the test ends, however it ends.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A log file for a child process in the test's directory (appended to, so
/// a restarted process keeps its history).
pub fn log_file(dir: &Path, name: &str) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(name))
        .unwrap()
}

/// A token for a region: the global tier's service role, or an agent's
/// naming its region.
pub fn token(key: &SigningKey, role: Role, region: Option<&str>) -> String {
    key.sign(&claims_for(
        role,
        "e2e",
        None,
        region,
        tokens::ISSUER,
        tokens::REGION_AUDIENCE,
        Duration::from_secs(3600),
    ))
    .unwrap()
}
