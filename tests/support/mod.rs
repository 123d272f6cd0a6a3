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

/// The directory a test's jobs write what the test reads (`$OUT`), made
/// for it: writable by every tenant's user (1777, as /tmp: jobs run as
/// their tenants' users) and bound into every sandbox by the agents the
/// test starts with `--sandbox-bind` (it is under a private `/tmp`
/// otherwise).
pub fn shared_out(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o1777)).unwrap();
    out
}
