//! `--config FILE` for the server roles (issue 21): the file is read, a
//! flag or its environment variable overrides one of its keys, and a key
//! that is no setting, or a value of the wrong kind, stops the start with
//! the file and the key named.

mod support;

use std::process::Command;

use support::BIN;

/// Runs `gangway ARGS` with `env`, and returns (exit success, stderr).
fn gangway(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env("GANGWAY_LOG", "warn");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_role_reads_its_file_and_a_flag_or_a_variable_overrides_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agent.toml");
    std::fs::write(
        &file,
        "region = \"r\"\nregion-url = \"http://127.0.0.1:9\"\n",
    )
    .unwrap();
    let config = file.to_str().unwrap();

    // The file's plain http:// URL, without insecure-http: refused.
    let (ok, err) = gangway(&["agent", "--config", config], &[]);
    assert!(!ok);
    assert!(err.contains("plain http://"), "{err}");
    // The same with insecure-http in the file gets past that check (to
    // the machine's own GPUs, which a test machine lacks).
    let insecure = dir.path().join("insecure.toml");
    std::fs::write(
        &insecure,
        "region = \"r\"\nregion-url = \"http://127.0.0.1:9\"\ninsecure-http = true\n",
    )
    .unwrap();
    let (_, err) = gangway(&["agent", "--config", insecure.to_str().unwrap()], &[]);
    assert!(!err.contains("plain http://"), "{err}");

    // A flag overrides the file's key; so does its environment variable.
    let (ok, err) = gangway(
        &[
            "agent",
            "--config",
            config,
            "--region-url",
            "https://127.0.0.1:9",
        ],
        &[],
    );
    assert!(!ok);
    assert!(err.contains("no CA"), "the flag did not win: {err}");
    let (ok, err) = gangway(
        &["agent", "--config", config],
        &[("GANGWAY_REGION_URL", "https://127.0.0.1:9")],
    );
    assert!(!ok);
    assert!(err.contains("no CA"), "the variable did not win: {err}");
    // GANGWAY_CONFIG names the file too.
    let (ok, err) = gangway(&["agent"], &[("GANGWAY_CONFIG", config)]);
    assert!(!ok);
    assert!(err.contains("plain http://"), "{err}");
}

#[test]
fn a_bad_key_or_value_is_refused_with_the_file_and_the_key_named() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("region.toml");
    std::fs::write(&bad, "name = \"r\"\nschedule-intreval-ms = 100\n").unwrap();
    let (ok, err) = gangway(&["region", "--config", bad.to_str().unwrap()], &[]);
    assert!(!ok);
    assert!(
        err.contains("region.toml") && err.contains("key `schedule-intreval-ms`"),
        "{err}"
    );
    std::fs::write(&bad, "name = \"r\"\nschedule-interval-ms = \"fast\"\n").unwrap();
    let (ok, err) = gangway(
        &[
            "region",
            "--config",
            bad.to_str().unwrap(),
            "--database-url",
            "x",
        ],
        &[],
    );
    assert!(!ok);
    assert!(
        err.contains("region.toml") && err.contains("key `schedule-interval-ms`"),
        "{err}"
    );
    let (ok, err) = gangway(&["region", "--config", "/nonexistent.toml"], &[]);
    assert!(!ok);
    assert!(err.contains("/nonexistent.toml"), "{err}");
}
