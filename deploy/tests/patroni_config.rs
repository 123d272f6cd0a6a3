//! The reference Patroni configuration (deploy/config/patroni.yml,
//! docs/operations.md) passes Patroni's own validator
//! (`patroni --validate-config`), which also checks that the etcd hosts
//! answer and the addresses resolve: so its hosts are pointed at an etcd
//! started here and at this machine's name. It keeps what the region
//! relies on: synchronous replication and pg_rewind.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gangway_devkit::free_port;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_reference_patroni_config_passes_patronis_validator() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/patroni.yml");
    let text = std::fs::read_to_string(path).unwrap();
    for needed in ["synchronous_mode: true", "use_pg_rewind: true"] {
        assert!(text.contains(needed), "{path} lacks {needed}");
    }

    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = (free_port(), free_port());
    let etcd = Killed(
        Command::new("etcd")
            .arg("--data-dir")
            .arg(dir.path().join("etcd"))
            .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
            ))
            .arg(format!("--initial-cluster=default=http://127.0.0.1:{peer}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd (Debian package etcd-server; .ci/run installs it)"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", client)).is_err() {
        assert!(Instant::now() < deadline, "etcd did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    let host = String::from_utf8(Command::new("hostname").output().unwrap().stdout).unwrap();
    let mut local = text.clone();
    for i in 1..=3 {
        local = local.replace(
            &format!("db{i}.us-east.internal:2379"),
            &format!("127.0.0.1:{client}"),
        );
        local = local.replace(&format!("db{i}.us-east.internal"), host.trim());
    }
    let copy = dir.path().join("patroni.yml");
    std::fs::write(&copy, local).unwrap();
    let out = Command::new("patroni")
        .arg("--validate-config")
        .arg(&copy)
        .output()
        .expect("patroni (Debian package patroni; .ci/run installs it)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "patroni --validate-config: {said}");
    assert_eq!(said.trim(), "", "patroni --validate-config");
    drop(etcd);
}
