//! Pieces every end-to-end test over real processes uses (most live in
//! `gangway-chaos`, which the drills share).
#![allow(dead_code, unused_imports)]

pub use gangway_chaos::procs::{agent_token, key_arg, log_file, token, until_ready, Proc, Proxy};

/// The `gangway` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_gangway");

/// A `gangway global` of the binary under test (see
/// [`gangway_chaos::procs::spawn_global`]).
pub fn spawn_global(
    dir: &std::path::Path,
    auth: &gangway_auth::dev::DevMaterial,
    port: u16,
    regions: &[(&str, String)],
) -> Proc {
    gangway_chaos::procs::spawn_global(std::path::Path::new(BIN), dir, auth, port, regions)
}
