//! The Debian package's systemd units (deploy/debian/) against what the
//! package installs (deploy/Cargo.toml, `[package.metadata.deb]`) and what
//! each role needs: each unit runs its role with the configuration file the
//! package ships, none is started or enabled on install, the servers keep
//! their hardening, and the agent is given the time and the paths it needs
//! to stop its workers and run them. `.ci/package` builds the package and
//! has `systemd-analyze verify` check the units' syntax; this checks their
//! meaning, without root or cargo-deb.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const ROLES: [&str; 3] = ["global", "region", "agent"];

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A unit file as (section, key) → every value it is given, in order.
struct Unit {
    name: String,
    entries: BTreeMap<(String, String), Vec<String>>,
}

impl Unit {
    fn load(role: &str) -> Unit {
        let name = format!("gangway-{role}.service");
        let path = deploy_dir().join("debian").join(&name);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let mut entries: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        let mut section = String::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            assert!(
                !line.ends_with('\\'),
                "{name}:{}: no continuation lines, please",
                n + 1
            );
            if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = s.to_string();
                continue;
            }
            let (key, value) = line
                .split_once('=')
                .unwrap_or_else(|| panic!("{name}:{}: not KEY=VALUE: {line}", n + 1));
            entries
                .entry((section.clone(), key.trim().to_string()))
                .or_default()
                .push(value.trim().to_string());
        }
        Unit { name, entries }
    }

    /// Every value of `key` in `[section]`.
    fn all(&self, section: &str, key: &str) -> &[String] {
        self.entries
            .get(&(section.to_string(), key.to_string()))
            .map_or(&[], Vec::as_slice)
    }

    /// The value of `key` in `[Service]` (the last one wins, as in systemd).
    fn service(&self, key: &str) -> Option<&str> {
        self.all("Service", key).last().map(String::as_str)
    }

    fn assert_service(&self, key: &str, want: &str) {
        assert_eq!(
            self.service(key),
            Some(want),
            "{}: [Service] {key}= should be {want:?}",
            self.name
        );
    }

    /// The space-separated words of every `key=` in `[section]`.
    fn words(&self, section: &str, key: &str) -> Vec<&str> {
        self.all(section, key)
            .iter()
            .flat_map(|v| v.split_whitespace())
            .collect()
    }
}

/// deploy/Cargo.toml's `[package.metadata.deb]`.
fn deb_metadata() -> toml::Value {
    let path = deploy_dir().join("Cargo.toml");
    let manifest: toml::Value = toml::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    manifest["package"]["metadata"]["deb"].clone()
}

/// The package's assets as installed path → source (relative to deploy/).
fn assets() -> BTreeMap<String, String> {
    let deb = deb_metadata();
    let list = deb["assets"].as_array().expect("assets is a list");
    list.iter()
        .map(|a| {
            let a = a.as_array().expect("an asset is [source, dest, mode]");
            let (src, dest) = (a[0].as_str().unwrap(), a[1].as_str().unwrap());
            // "usr/bin/" means the source's file name in that directory.
            let dest = if dest.ends_with('/') {
                let file = Path::new(src).file_name().unwrap().to_str().unwrap();
                format!("/{dest}{file}")
            } else {
                format!("/{dest}")
            };
            (dest, src.to_string())
        })
        .collect()
}

fn seconds(value: &str) -> u64 {
    let digits = value.strip_suffix('s').unwrap_or(value);
    digits.parse().unwrap_or_else(|_| {
        panic!("TimeoutStopSec={value}: write it in seconds (60 or 60s) for this test")
    })
}

#[test]
fn each_unit_runs_its_role_with_a_configuration_the_package_installs() {
    let assets = assets();
    assert_eq!(
        assets.get("/usr/bin/gangway").map(String::as_str),
        Some("target/release/gangway"),
        "the package installs the binary the units run"
    );
    for role in ROLES {
        let unit = Unit::load(role);
        unit.assert_service("ExecStart", &format!("/usr/bin/gangway {role}"));
        let config = format!("/etc/gangway/{role}.toml");
        assert!(
            unit.all("Service", "Environment")
                .contains(&format!("GANGWAY_CONFIG={config}")),
            "{}: Environment=GANGWAY_CONFIG={config}",
            unit.name
        );
        let source = assets.get(&config).unwrap_or_else(|| {
            panic!("{config}, which {} reads, is not in the package", unit.name)
        });
        assert!(
            deploy_dir().join(source).is_file(),
            "{config} comes from deploy/{source}, which does not exist"
        );
        for key in ["After", "Wants"] {
            assert!(
                unit.words("Unit", key).contains(&"network-online.target"),
                "{}: {key}=network-online.target",
                unit.name
            );
        }
        assert_eq!(
            unit.words("Install", "WantedBy"),
            ["multi-user.target"],
            "{}",
            unit.name
        );
    }
}

#[test]
fn nothing_is_enabled_started_or_restarted_by_the_package() {
    let deb = deb_metadata();
    assert_eq!(deb["maintainer-scripts"].as_str(), Some("debian/"));
    let units = deb["systemd-units"]
        .as_array()
        .expect("systemd-units is a list");
    for role in ROLES {
        let name = format!("gangway-{role}");
        let entry = units
            .iter()
            .find(|u| u["unit-name"].as_str() == Some(name.as_str()))
            .unwrap_or_else(|| panic!("systemd-units has no entry for {name}"));
        // cargo-deb's defaults are all true: each must be said.
        for key in [
            "enable",
            "start",
            "restart-after-upgrade",
            "stop-on-upgrade",
        ] {
            assert_eq!(
                entry.get(key).and_then(toml::Value::as_bool),
                Some(false),
                "systemd-units {name}: {key} = false (the operator enables and restarts)"
            );
        }
    }
    let postinst = std::fs::read_to_string(deploy_dir().join("debian/postinst")).unwrap();
    assert!(
        postinst.contains("#DEBHELPER#"),
        "postinst: cargo-deb's units snippets go at #DEBHELPER#"
    );
    assert!(
        postinst.contains("adduser --system"),
        "postinst creates the gangway user"
    );
}

#[test]
fn the_servers_are_hardened() {
    for role in ["global", "region"] {
        let unit = Unit::load(role);
        for (key, want) in [
            ("User", "gangway"),
            ("Group", "gangway"),
            ("NoNewPrivileges", "yes"),
            ("CapabilityBoundingSet", ""),
            ("ProtectSystem", "strict"),
            ("ProtectHome", "yes"),
            ("PrivateTmp", "yes"),
            ("PrivateDevices", "yes"),
            ("ProtectKernelTunables", "yes"),
            ("ProtectControlGroups", "yes"),
            ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
            ("LockPersonality", "yes"),
            ("MemoryDenyWriteExecute", "yes"),
            ("SystemCallArchitectures", "native"),
            ("Restart", "on-failure"),
            ("ExecReload", "/bin/kill -HUP $MAINPID"),
        ] {
            unit.assert_service(key, want);
        }
        assert!(
            unit.service("RestartSec").is_some(),
            "{}: RestartSec=",
            unit.name
        );
        assert!(
            unit.all("Service", "ReadWritePaths").is_empty(),
            "{}: the servers write nothing outside their private /tmp",
            unit.name
        );
    }
    let region = Unit::load("region");
    for key in ["After", "Wants"] {
        assert!(
            region.words("Unit", key).contains(&"postgresql.service"),
            "{}: {key}=postgresql.service",
            region.name
        );
    }
    assert!(
        region.all("Unit", "Requires").is_empty() && region.all("Unit", "BindsTo").is_empty(),
        "the region's database may be on another host: Wants, never Requires"
    );
}

#[test]
fn the_agent_may_run_its_workers_and_stop_them_in_order() {
    let unit = Unit::load("agent");
    // SIGHUP re-reads its CA and token (deploy/src/servers.rs).
    unit.assert_service("ExecReload", "/bin/kill -HUP $MAINPID");
    // Root: bubblewrap, setpriv and useradd (regional/agent/src/executor/isolation.rs).
    assert!(
        matches!(unit.service("User"), None | Some("root")),
        "{}: runs as root",
        unit.name
    );
    for (key, want) in [
        ("KillMode", "mixed"),
        ("OOMPolicy", "continue"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("PrivateTmp", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectControlGroups", "yes"),
        ("LockPersonality", "yes"),
        ("SystemCallArchitectures", "native"),
        ("Restart", "on-failure"),
    ] {
        unit.assert_service(key, want);
    }
    // The GPUs are devices; jobs JIT-compile.
    assert_ne!(
        unit.service("PrivateDevices"),
        Some("yes"),
        "{}: GPUs need /dev",
        unit.name
    );
    assert_ne!(
        unit.service("MemoryDenyWriteExecute"),
        Some("yes"),
        "{}: workers JIT",
        unit.name
    );

    // It must have longer to stop than it takes: its shutdown deadline,
    // 2 s for SIGKILLed workers to go, and a sync request under way.
    let agent_rs = deploy_dir().join("../regional/agent/src/agent.rs");
    let source = std::fs::read_to_string(&agent_rs).unwrap();
    let marker = "const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(";
    let deadline: u64 = source
        .split_once(marker)
        .and_then(|(_, rest)| rest.split_once(')'))
        .and_then(|(n, _)| n.trim().parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "{} no longer says `{marker}N)`: update this test and the \
                 agent unit's TimeoutStopSec= with the agent's shutdown time",
                agent_rs.display()
            )
        });
    let timeout = seconds(unit.service("TimeoutStopSec").expect("TimeoutStopSec="));
    assert!(
        timeout >= deadline + 2 + 10 + 10,
        "{}: TimeoutStopSec={timeout} leaves too little over the agent's {deadline} s \
         shutdown deadline (+2 s SIGKILL, +10 s a sync under way, +10 s margin)",
        unit.name
    );

    // Its work directory (deploy/config/agent.toml) must be writable.
    let config: toml::Value =
        toml::from_str(&std::fs::read_to_string(deploy_dir().join("config/agent.toml")).unwrap())
            .unwrap();
    let work_dir = config["work-dir"]
        .as_str()
        .expect("agent.toml sets work-dir");
    let writable = unit.words("Service", "ReadWritePaths");
    assert!(
        writable
            .iter()
            .any(|p| Path::new(work_dir).starts_with(p.trim_start_matches('-'))),
        "{}: work-dir {work_dir} is not under ReadWritePaths={writable:?}",
        unit.name
    );
    // useradd writes the tenants' users beside /etc/passwd.
    assert!(
        writable.contains(&"/etc"),
        "{}: ReadWritePaths=/etc (useradd)",
        unit.name
    );
}
