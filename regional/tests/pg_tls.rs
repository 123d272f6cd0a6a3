//! The region's connection to PostgreSQL over TLS (issue 21): with
//! `sslmode=verify-full` and `sslrootcert`, the store's pools and the
//! leader's lock connection speak TLS to a server whose certificate the CA
//! signed, and refuse one another CA signed, or a server without TLS —
//! never falling back to plain text.

use std::os::unix::fs::PermissionsExt;

use gangway_auth::dev::DevMaterial;
use gangway_devkit::{PgCluster, PgOptions};
use gangway_regional::loops::leader::Leadership;
use gangway_regional::store::PgTarget;
use gangway_regional::Store;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_region_reaches_its_database_over_tls_checked_against_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    // Traversable by the `postgres` user when the test runs as root.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let ours = DevMaterial::load_or_create(&dir.path().join("ours")).unwrap();
    let theirs = DevMaterial::load_or_create(&dir.path().join("theirs")).unwrap();
    let data = dir.path().join("pg");
    let tls = Some((ours.server_cert.clone(), ours.server_key.clone()));
    let pg = tokio::task::spawn_blocking(move || {
        let mut pg = PgCluster::init_or_open(
            &data,
            PgOptions {
                tls,
                ..PgOptions::for_tests()
            },
        )?;
        pg.start()?;
        anyhow::Ok(pg)
    })
    .await
    .unwrap()
    .unwrap();
    pg.create_database("gangway").await.unwrap();
    let base = pg.connection_string("gangway");
    let with_ca =
        |ca: &std::path::Path| format!("{base} sslmode=verify-full sslrootcert={}", ca.display());

    // Our CA: the store migrates, and the server says the session is
    // encrypted — for the pools and for the leader's lock connection.
    let url = with_ca(&ours.ca_cert);
    let store = Store::connect(&url, "r", 2).unwrap();
    store.migrate().await.unwrap();
    let (client, _ended) = PgTarget::parse(&url)
        .unwrap()
        .connect("test")
        .await
        .unwrap();
    let ssl: bool = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(ssl, "the session is not encrypted");
    let mut leader = Leadership::connect(&url).await.unwrap();
    assert!(leader.try_acquire().await.unwrap());

    // Another CA's certificate: no connection, no fallback.
    let impostor = with_ca(&theirs.ca_cert);
    let e = PgTarget::parse(&impostor)
        .unwrap()
        .connect("test")
        .await
        .unwrap_err();
    assert!(format!("{e:?}").contains("UnknownIssuer"), "{e:?}");
    let store = Store::connect(&impostor, "r", 2).unwrap();
    assert!(
        store.migrate().await.is_err(),
        "a store connected to an impostor"
    );
    assert!(Leadership::connect(&impostor).await.is_err());

    // A server that does not speak TLS: refused, not read in plain text.
    let plain = gangway_devkit::fresh_database("pg_tls_plain").await;
    let plain = format!(
        "{plain} sslmode=verify-full sslrootcert={}",
        ours.ca_cert.display()
    );
    assert!(PgTarget::parse(&plain)
        .unwrap()
        .connect("test")
        .await
        .is_err());
}

/// A replica that vanishes without a word (power cut, cut link) must not
/// keep the leader's lock for the kernel's two hours: every session asks
/// the server to probe it, and the URL's own settings still win.
#[tokio::test]
async fn every_session_asks_the_server_to_notice_a_vanished_replica_within_seconds() {
    let url = gangway_devkit::fresh_database("keepalives").await;
    let show = |url: String| async move {
        let (client, _ended) = PgTarget::parse(&url)
            .unwrap()
            .connect("test")
            .await
            .unwrap();
        let mut got = Vec::new();
        for setting in [
            "tcp_keepalives_idle",
            "tcp_keepalives_count",
            "tcp_user_timeout",
        ] {
            let row = client
                .query_one(&format!("SHOW {setting}"), &[])
                .await
                .unwrap();
            got.push(row.get::<_, String>(0));
        }
        got
    };
    // A session over TCP (the throwaway cluster's URL is): the server
    // probes it after 3 s of silence, 3 probes, and gives up on data
    // unacknowledged for 6 s.
    assert_eq!(show(url.clone()).await, ["3", "3", "6000"]);
    let theirs = format!("{url} options='-c tcp_keepalives_idle=9'");
    assert_eq!(show(theirs).await, ["9", "3", "6000"]);
}

/// A member of a multi-host URL whose host hangs — it takes the TCP
/// connection and never answers, as a machine whose disk froze does, or
/// whose packets vanish — listed ahead of the one that takes writes: the
/// region still reaches its database. The peers' leases, whose pool waits
/// at most 2 s for a connection, are recorded and read, and the leader's
/// lock connection is made; tried one after another, as libpq tries them,
/// every new connection would hang on the first member (tokio-postgres's
/// `connect_timeout` covers the TCP connect alone, not a server that never
/// answers), and a region whose database had failed over would fence
/// itself for want of a lease (found on the lab of machines, `gangway chaos
/// database-failover --lab`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_member_ahead_of_the_primary_keeps_no_connection_from_the_database() {
    let base = gangway_devkit::fresh_database("hung_member").await;
    Store::connect(&base, "r", 2)
        .unwrap()
        .migrate()
        .await
        .unwrap();
    let port = (base.split_whitespace())
        .find_map(|kv| kv.strip_prefix("port="))
        .unwrap()
        .to_string();
    // A member that is never accepted: the kernel completes handshakes
    // into its backlog, and nothing ever answers. Each URL names a hung
    // member of its own, so that neither is a member this process already
    // knows to take writes (which it would try first).
    let hung_first = |hung: &std::net::TcpListener| {
        let hung_port = hung.local_addr().unwrap().port();
        base.replace("host=127.0.0.1", "host=127.0.0.1,127.0.0.1")
            .replace(&format!("port={port}"), &format!("port={hung_port},{port}"))
            + " target_session_attrs=read-write connect_timeout=60"
    };
    let (hung_a, hung_b) = (
        std::net::TcpListener::bind("127.0.0.1:0").unwrap(),
        std::net::TcpListener::bind("127.0.0.1:0").unwrap(),
    );

    // The peers' leases' pool: its first connection.
    let store = Store::connect(&hung_first(&hung_a), "r", 2).unwrap();
    let silent = std::collections::BTreeMap::from([("p".to_string(), 0.0)]);
    store.peer_heard("p", &silent).await.unwrap();
    let leases = store.leases(&["p"], 60.0).await.unwrap();
    assert!(leases.silent_s.contains_key("p"), "{:?}", leases.silent_s);

    // The leader's lock connection.
    let (client, _ended) = PgTarget::parse(&hung_first(&hung_b))
        .unwrap()
        .connect("test")
        .await
        .unwrap();
    let read_only: String = client
        .query_one("SHOW transaction_read_only", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(read_only, "off");
}
