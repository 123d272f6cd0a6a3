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

/// What the database-failover drill must show, on loopback or on the lab:
/// every invariant held, its job ran on at epoch 1 in its region to its
/// last step, and writes and placements came back after each kill (the
/// report's notes start with `kills`' names).
pub fn held_through_database_failover(report: &gangway_chaos::Report, kills: [&str; 2]) {
    assert!(report.passed(), "{report}");
    let j = &report.jobs[0];
    assert_eq!((j.epoch, &j.region), (1, &report.region), "{report}");
    assert_eq!(j.state, "succeeded", "{report}");
    let total = gangway_chaos::db_failover::FAILOVER_TRAINING.total;
    assert_eq!(j.final_step, Some(total), "{report}");
    for what in kills {
        let note = (report.notes.iter())
            .find(|n| n.starts_with(what))
            .unwrap_or_else(|| panic!("no note on {what}: {report}"));
        assert!(!note.contains("never"), "{note}\n{report}");
    }
}
