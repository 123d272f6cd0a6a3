//! The monitoring kit (issue 24, docs/operations.md "Monitoring"): the
//! Prometheus alert rules load and pass their unit tests, the sample scrape
//! configuration is valid, every Grafana dashboard is complete, and the
//! dashboards and rules name only metrics the code emits.
//!
//! The rules are checked by `promtool` (the Debian package `prometheus`,
//! which .ci/run installs).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The workspace's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `promtool ARGS` in the workspace's root and fails the test with
/// its output unless it succeeds.
fn promtool(args: &[&str]) {
    let out = match Command::new("promtool")
        .args(args)
        .current_dir(root())
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "promtool not found: install it with `apt-get install prometheus` \
             (the Debian package; .ci/run installs it in CI)"
        ),
        Err(e) => panic!("cannot run promtool: {e}"),
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool {} failed:\n{text}",
        args.join(" ")
    );
    eprintln!("promtool {}:\n{text}", args.join(" "));
}

#[test]
fn the_alert_rules_load_and_pass_their_tests_and_the_scrape_config_is_valid() {
    promtool(&["check", "rules", "deploy/prometheus/alerts.yml"]);
    promtool(&["test", "rules", "deploy/prometheus/alerts_test.yml"]);
    promtool(&["check", "config", "deploy/prometheus/prometheus.yml"]);
}

/// The dashboards, by file name.
fn dashboards() -> Vec<(String, Value)> {
    let dir = root().join("deploy/grafana");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&path).unwrap();
            let board: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"));
            out.push((name, board));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    for wanted in ["fleet.json", "api.json", "failover.json"] {
        assert!(
            out.iter().any(|(n, _)| n == wanted),
            "deploy/grafana/{wanted} is missing"
        );
    }
    out
}

/// A dashboard's panels, those inside rows included.
fn panels(board: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for p in list.as_array().into_iter().flatten() {
            out.push(p);
            if let Some(inner) = p.get("panels") {
                walk(inner, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&board["panels"], &mut out);
    out
}

fn non_empty(v: &Value) -> bool {
    v.as_str().is_some_and(|s| !s.trim().is_empty())
}

#[test]
fn every_dashboard_has_a_title_a_uid_and_panels_that_query_something() {
    for (name, board) in dashboards() {
        assert!(non_empty(&board["title"]), "{name}: no title");
        assert!(non_empty(&board["uid"]), "{name}: no uid");
        let vars = board["templating"]["list"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            vars.iter()
                .any(|v| v["name"] == "datasource" && v["type"] == "datasource"),
            "{name}: no `datasource` template variable"
        );
        let mut ids = BTreeSet::new();
        let mut queried = 0;
        for p in panels(&board) {
            let title = p["title"].as_str().unwrap_or_default();
            assert!(
                !title.trim().is_empty(),
                "{name}: a panel without a title: {p}"
            );
            assert!(
                ids.insert(
                    p["id"]
                        .as_u64()
                        .unwrap_or_else(|| panic!("{name}: {title}: no id"))
                ),
                "{name}: {title}: its id is another panel's too"
            );
            if p["type"] == "row" {
                continue;
            }
            let targets = p["targets"].as_array().cloned().unwrap_or_default();
            assert!(
                targets.iter().any(|t| non_empty(&t["expr"])),
                "{name}: panel {title:?} has no target with a query"
            );
            for t in &targets {
                assert!(
                    non_empty(&t["expr"]),
                    "{name}: panel {title:?}: a target without a query"
                );
            }
            assert_eq!(
                p["datasource"]["uid"], "${datasource}",
                "{name}: panel {title:?} does not query the dashboard's data source"
            );
            assert!(
                non_empty(&p["fieldConfig"]["defaults"]["unit"]),
                "{name}: panel {title:?} has no unit"
            );
            queried += 1;
        }
        assert!(queried > 0, "{name}: no panels");
    }
}

/// `gangway_…` names in `text`, histograms' series named by their metric
/// (`_bucket`, `_sum`, `_count` dropped).
fn metric_names(text: &str, out: &mut BTreeSet<String>) {
    let bytes = text.as_bytes();
    let mut at = 0;
    while let Some(found) = text[at..].find("gangway_") {
        let start = at + found;
        let mut end = start + "gangway_".len();
        while end < bytes.len() && (bytes[end].is_ascii_lowercase() || bytes[end] == b'_') {
            end += 1;
        }
        let word_start = start == 0 || {
            let c = bytes[start - 1];
            !(c.is_ascii_alphanumeric() || c == b'_')
        };
        let word_end = end == bytes.len() || !bytes[end].is_ascii_digit();
        let name = &text[start..end];
        if word_start && word_end && name.len() > "gangway_".len() {
            let name = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            out.insert(name.to_string());
        }
        at = end;
    }
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn dashboards_and_alert_rules_name_only_metrics_the_code_emits() {
    let mut used = BTreeSet::new();
    for (_, board) in dashboards() {
        for p in panels(&board) {
            for t in p["targets"].as_array().into_iter().flatten() {
                metric_names(t["expr"].as_str().unwrap_or_default(), &mut used);
            }
        }
        for v in board["templating"]["list"].as_array().into_iter().flatten() {
            metric_names(&v["query"].to_string(), &mut used);
        }
    }
    let rules = std::fs::read_to_string(root().join("deploy/prometheus/alerts.yml")).unwrap();
    metric_names(&rules, &mut used);
    assert!(used.len() > 20, "too few metrics found: {used:?}");

    let mut sources = String::new();
    let mut files = Vec::new();
    for dir in [
        "regional/src",
        "global/src",
        "shared/src",
        "regional/agent/src",
        "deploy/src",
    ] {
        rust_files(&root().join(dir), &mut files);
    }
    for f in files {
        sources.push_str(&std::fs::read_to_string(&f).unwrap());
        sources.push('\n');
    }
    let missing: Vec<&String> = used
        .iter()
        .filter(|name| !sources.contains(&format!("\"{name}\"")))
        .collect();
    assert!(
        missing.is_empty(),
        "deploy/grafana/*.json or deploy/prometheus/alerts.yml name metrics no source file \
         emits (no string literal \"NAME\" under regional/src, global/src, shared/src, \
         regional/agent/src, deploy/src): {missing:?}"
    );
}
