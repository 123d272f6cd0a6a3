//! Backups and point-in-time restore of a region's database (issue 22,
//! docs/operations.md "Backups and point-in-time restore"): a region
//! serving on a cluster that archives its WAL with pgBackRest takes jobs;
//! after a full backup and more jobs, its database is restored into fresh
//! clusters — to a time T and to the end of the archive — and a region
//! started on each serves exactly the jobs, in the states, that were
//! committed by then.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use axum::http::Method;
use gangway_devkit::{BackupKind, Backups, PgCluster, PgOptions, RestoreTarget};
use gangway_regional::{RegionConfig, Store};
use gangway_shared::api::{JobSpec, JobState};
use gangway_shared::client::{Client, ListQuery};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const TENANT: &str = "acme";

/// A region serving its API (and loops) on the database at `url`.
struct Region {
    client: Client,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Region {
    async fn start(url: &str) -> Region {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Migrates (nothing to do on a restored database) and reads it.
        let state = gangway_regional::prepare(
            RegionConfig::new("us-east", addr, url),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(gangway_regional::serve_on(
            listener,
            state,
            shutdown.clone(),
        ));
        Region {
            client: Client::new(format!("http://{addr}"), TENANT),
            shutdown,
            server,
        }
    }

    async fn submit(&self, name: &str) -> Uuid {
        let spec: JobSpec = serde_json::from_value(serde_json::json!({"name": name,
            "gpus": 8, "gpu_type": "h100", "estimated_duration_s": 3600,
            "command": ["train"], "gpus_per_worker": 8}))
        .unwrap();
        let job = self.client.submit(&spec, Some(name)).await.unwrap();
        assert_eq!(job.state, JobState::Queued, "{job:?}");
        job.id
    }

    async fn cancel(&self, id: Uuid) {
        let job = self.client.cancel(id).await.unwrap();
        assert_eq!(job.state, JobState::Cancelled, "{job:?}");
    }

    /// The state of each job, `None` for a job the region does not have.
    async fn states(&self, ids: &[Uuid]) -> Vec<Option<JobState>> {
        let mut out = Vec::new();
        for &id in ids {
            out.push(match self.client.get(id).await {
                Ok(job) => Some(job.state),
                Err(e) if e.status().map(|s| s.as_u16()) == Some(404) => None,
                Err(e) => panic!("GET job {id}: {e}"),
            });
        }
        out
    }

    async fn listed(&self) -> usize {
        (self.client.list(&ListQuery::default()).await.unwrap())
            .jobs
            .len()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.server.await.unwrap().unwrap();
    }
}

/// Runs blocking devkit work (pgBackRest, pg_ctl) off the async workers.
fn blocking<T>(f: impl FnOnce() -> anyhow::Result<T>) -> T {
    tokio::task::block_in_place(f).unwrap_or_else(|e| panic!("{e:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_restored_to_a_point_in_time_serves_the_jobs_committed_by_then() {
    let began = Instant::now();
    let dir = tempfile::Builder::new()
        .prefix("gangway-backup-test-")
        .tempdir_in(gangway_devkit::TEST_ROOT)
        .unwrap();
    // Traversable by the `postgres` user when the test runs as root.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let data = dir.path().join("pg");
    let backups = blocking(|| Backups::new(&dir.path().join("backups"), "us-east", &data));
    let mut pg = blocking(|| {
        PgCluster::init_or_open(&data, backups.archive_options(PgOptions::for_tests()))
    });
    blocking(|| pg.start());
    pg.create_database("gangway").await.unwrap();
    let url = pg.connection_string("gangway");
    // One 8-GPU node, cordoned before any job comes, so that every job
    // stays as the API leaves it (queued or cancelled), whatever the
    // scheduler loop does meanwhile.
    let store = Store::connect(&url, "us-east", 2).unwrap();
    store.migrate().await.unwrap();
    common::register(&store, vec![common::node("n0", "s0", "s0-l0", "h100")]).await;
    let region = Region::start(&url).await;
    region
        .client
        .call_json(
            Method::POST,
            "/v1/admin/nodes/n0/cordon",
            Some(&serde_json::json!({"reason": "keeps jobs queued"})),
        )
        .await
        .unwrap();
    blocking(|| backups.stanza_create(&pg));
    blocking(|| backups.check(&pg));

    // Before the base backup: a1 (cancelled later, before T), a2 cancelled.
    let a1 = region.submit("a1").await;
    let a2 = region.submit("a2").await;
    region.cancel(a2).await;
    blocking(|| backups.backup(&pg, BackupKind::Full));
    let info = blocking(|| backups.info());
    assert!(info.contains("full backup"), "{info}");

    // After it, before T: b1 (cancelled after T), b2; a1 cancelled.
    let b1 = region.submit("b1").await;
    let b2 = region.submit("b2").await;
    region.cancel(a1).await;
    let raw = pg.connect("gangway").await.unwrap();
    // pgBackRest picks the backup for a time target by the backup's stop
    // time in whole seconds: T is well past the backup's end.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let t: String = raw
        .query_one("SELECT now()::text", &[])
        .await
        .unwrap()
        .get(0);
    tokio::time::sleep(Duration::from_millis(50)).await;

    // After T: c1 created, b1 cancelled. Then the WAL is switched and
    // archived (`check` waits for it), so the archive holds commits after T.
    let c1 = region.submit("c1").await;
    region.cancel(b1).await;
    raw.query_one("SELECT pg_switch_wal()", &[]).await.unwrap();
    blocking(|| backups.check(&pg));
    let ids = [a1, a2, b1, b2, c1];
    use JobState::{Cancelled, Queued};
    let now = [
        Some(Cancelled),
        Some(Cancelled),
        Some(Cancelled),
        Some(Queued),
        Some(Queued),
    ];
    assert_eq!(region.states(&ids).await, now);
    region.stop().await;

    // To T, in a fresh cluster: a region starts on it with the jobs
    // committed by T, in their states then; c1 and b1's cancel are not there.
    let pitr = blocking(|| {
        backups.restore(
            &RestoreTarget::Time(t.clone()),
            &dir.path().join("pg-pitr"),
            PgOptions::for_tests(),
        )
    });
    let at_t = Region::start(&pitr.connection_string("gangway")).await;
    assert_eq!(
        at_t.states(&ids).await,
        [
            Some(Cancelled),
            Some(Cancelled),
            Some(Queued),
            Some(Queued),
            None
        ],
        "restored to {t}"
    );
    assert_eq!(at_t.listed().await, 4);
    // The restored region takes new jobs.
    let d1 = at_t.submit("d1").await;
    assert_eq!(at_t.states(&[d1]).await, [Some(Queued)]);
    at_t.stop().await;

    // To the end of the archive: everything.
    let latest = blocking(|| {
        backups.restore(
            &RestoreTarget::Latest,
            &dir.path().join("pg-latest"),
            PgOptions::for_tests(),
        )
    });
    let at_end = Region::start(&latest.connection_string("gangway")).await;
    assert_eq!(at_end.states(&ids).await, now);
    assert_eq!(at_end.listed().await, 5);
    at_end.stop().await;

    // A restore never overwrites a cluster.
    let e = tokio::task::block_in_place(|| {
        backups.restore(&RestoreTarget::Latest, &data, PgOptions::for_tests())
    })
    .unwrap_err();
    assert!(format!("{e:#}").contains("restore into a new one"), "{e:#}");
    eprintln!("backup and restores took {:?}", began.elapsed());
    drop((pitr, latest, pg));
}
