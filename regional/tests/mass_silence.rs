//! Many nodes silent at once (issue 19), against a real, throwaway
//! PostgreSQL: a mass silence (a control-plane restart longer than the
//! heartbeat limit, a switch flap, a slow database) holds the nodes
//! suspect instead of losing them, and they heal — their jobs untouched and
//! finishing — as their agents sync again while the leader keeps ticking;
//! silence short of a mass event loses nodes at a pace; the tick passes
//! over a node its agent holds rather than waiting for it; a sync leaves
//! a report for its next one rather than wait for a job another
//! transaction holds; and submissions give way to syncs that queue.

use std::time::Duration;

use gangway_health::HealthPolicy;
use gangway_regional::scheduling::run_pass;
use gangway_regional::Store;
use gangway_shared::api::JobState;
use uuid::Uuid;

mod common;
use common::{job, node, submit, Fleet};

const AGENT_TIMEOUT: Duration = Duration::from_secs(3600);

/// Suspect after 2 s of silence, lost after `lost_after_s`; mass silence
/// from 16 nodes and a quarter of the region; at most `pace` losses per
/// tick.
fn policy(pace: u32, lost_after_s: u64) -> HealthPolicy {
    HealthPolicy {
        suspect_after_s: 2,
        lost_after_s,
        silent_losses_per_tick: pace,
        ..HealthPolicy::default()
    }
}

async fn region(
    prefix: &str,
    policy: HealthPolicy,
    nodes: usize,
) -> (Store, tokio_postgres::Client, Fleet, String) {
    let (store, client, url) = common::policy_store(prefix, policy).await;
    let fleet = Fleet::register_nodes(
        &store,
        (0..nodes)
            .map(|n| node(&format!("n{n}"), "s0", &format!("s0-l{}", n / 8), "h100"))
            .collect(),
    )
    .await;
    for n in 0..nodes {
        fleet.sync(&store, n, "boot-1", vec![], vec![]).await;
    }
    (store, client, fleet, url)
}

/// `count` whole-node jobs, placed and running; returns (job, node index).
async fn running_jobs(store: &Store, fleet: &Fleet, count: usize) -> Vec<(Uuid, usize)> {
    let mut ids = Vec::new();
    for _ in 0..count {
        ids.push(submit(store, &job("acme", "h100", 8, 8)).await);
    }
    let o = run_pass(store, AGENT_TIMEOUT).await.unwrap();
    assert_eq!(o.placements, count, "{o:?}");
    let mut out = Vec::new();
    for id in ids {
        let j = store.get_job("acme", id).await.unwrap();
        let n: usize = j.workers[0].node.as_deref().unwrap()[1..].parse().unwrap();
        fleet.act(store, n, None).await;
        out.push((id, n));
    }
    for (id, _) in &out {
        assert_eq!(
            store.get_job("acme", *id).await.unwrap().state,
            JobState::Running
        );
    }
    out
}

/// Makes `nodes` silent for `secs` as far as the region knows: their last
/// heartbeat, recorded and in their health, moves back.
async fn silence(client: &tokio_postgres::Client, nodes: &[usize], secs: i64) {
    let ids: Vec<String> = nodes.iter().map(|n| format!("n{n}")).collect();
    let n = client
        .execute(
            "UPDATE nodes SET last_heartbeat_at = now() - make_interval(secs => $2),
                    health = jsonb_set(health, '{last_heartbeat}',
                        to_jsonb(floor(extract(epoch FROM now()))::bigint - $2::bigint))
             WHERE node_id = ANY($1)",
            &[&ids, &(secs as f64)],
        )
        .await
        .unwrap();
    assert_eq!(n as usize, nodes.len());
}

async fn observed(client: &tokio_postgres::Client, n: usize) -> String {
    client
        .query_one(
            "SELECT observed FROM nodes WHERE node_id = $1",
            &[&format!("n{n}")],
        )
        .await
        .unwrap()
        .get(0)
}

async fn lost_events(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM node_events WHERE kind = 'state' AND detail->>'to' = 'lost'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Each node's agent reports its workers done (exit 0).
async fn finish(store: &Store, fleet: &Fleet, jobs: &[(Uuid, usize)]) {
    for &(id, n) in jobs {
        let wanted = fleet.sync(store, n, "boot-1", vec![], vec![]).await;
        let a = wanted
            .iter()
            .find(|a| a.job_id == id)
            .expect("still assigned");
        fleet
            .sync(store, n, "boot-1", vec![], vec![common::succeeded(a)])
            .await;
    }
}

#[tokio::test]
async fn a_mass_silence_holds_nodes_suspect_and_they_heal_with_their_jobs_while_ticks_go_on() {
    let (store, client, fleet, _) = region("mass_silence_heal", policy(8, 30), 20).await;
    let jobs = running_jobs(&store, &fleet, 10).await;
    let ctx = store.health_context();

    // Every node silent well past the lost limit at once: the control
    // plane was away, not 20 machines.
    let all: Vec<usize> = (0..20).collect();
    silence(&client, &all, 120).await;
    for _ in 0..3 {
        let out = store.health_tick(&ctx).await.unwrap();
        assert!(out.lost.is_empty(), "held, not lost: {out:?}");
        assert!(out.evacuated.is_empty(), "{out:?}");
    }
    for n in 0..20 {
        assert_eq!(observed(&client, n).await, "suspect", "n{n}");
    }
    for (id, _) in &jobs {
        assert_eq!(
            store.get_job("acme", *id).await.unwrap().state,
            JobState::Running,
            "a held node's job keeps running"
        );
    }
    // No new work on a suspect node meanwhile.
    let late = submit(&store, &job("acme", "h100", 8, 8)).await;
    assert_eq!(run_pass(&store, AGENT_TIMEOUT).await.unwrap().placements, 0);

    // The agents come back, syncing while the leader keeps ticking.
    let ticker = {
        let (store, ctx) = (store.clone(), ctx.clone());
        tokio::spawn(async move {
            let mut lost = Vec::new();
            for _ in 0..40 {
                lost.extend(store.health_tick(&ctx).await.unwrap().lost);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            lost
        })
    };
    for n in 0..20 {
        fleet.act(&store, n, None).await;
    }
    let lost = ticker.await.unwrap();
    assert!(lost.is_empty(), "{lost:?}");
    // (Agents sync every second; on a slow machine the first round may
    // have taken longer than the suspect limit.)
    for n in 0..20 {
        fleet.sync(&store, n, "boot-1", vec![], vec![]).await;
    }
    for n in 0..20 {
        assert_eq!(observed(&client, n).await, "healthy", "n{n}");
    }
    assert_eq!(lost_events(&client).await, 0);

    // The held jobs were never moved, and finish where they ran.
    finish(&store, &fleet, &jobs).await;
    for (id, _) in &jobs {
        let j = store.get_job("acme", *id).await.unwrap();
        assert_eq!(j.state, JobState::Succeeded, "{j:?}");
        let kinds: Vec<String> = store
            .job_events("acme", *id)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.kind)
            .collect();
        assert!(!kinds.iter().any(|k| k == "preempted"), "{kinds:?}");
    }
    // And the healed fleet takes new work again.
    assert_eq!(run_pass(&store, AGENT_TIMEOUT).await.unwrap().placements, 1);
    assert_ne!(
        store.get_job("acme", late).await.unwrap().state,
        JobState::Queued
    );
}

#[tokio::test]
async fn mass_silences_do_not_count_as_flaps_but_one_node_going_quiet_does() {
    let (store, client, fleet, _) = region("mass_silence_flaps", policy(8, 30), 20).await;
    let ctx = store.health_context();
    // Three control-plane outages within the hour (flap_limit is 3): every
    // node silent past the suspect limit at once, then heard again.
    let all: Vec<usize> = (0..20).collect();
    for round in 0..3 {
        silence(&client, &all, 10).await;
        store.health_tick(&ctx).await.unwrap();
        assert_eq!(observed(&client, 0).await, "suspect", "round {round}");
        for n in 0..20 {
            fleet.sync(&store, n, "boot-1", vec![], vec![]).await;
        }
        store.health_tick(&ctx).await.unwrap();
    }
    for n in 0..20 {
        assert_eq!(observed(&client, n).await, "healthy", "n{n} is no flapper");
    }
    let jobs = running_jobs(&store, &fleet, 20).await;
    assert_eq!(jobs.len(), 20, "the whole fleet takes work");
    // One machine going quiet on its own three times is flapping: held
    // down when it comes back.
    for spell in 0..3 {
        silence(&client, &[7], 10).await;
        store.health_tick(&ctx).await.unwrap();
        assert_eq!(observed(&client, 7).await, "suspect", "spell {spell}");
        fleet.sync(&store, 7, "boot-1", vec![], vec![]).await;
    }
    assert_eq!(observed(&client, 7).await, "damped");
    assert_eq!(observed(&client, 6).await, "healthy");
}

#[tokio::test]
async fn silence_short_of_a_mass_event_loses_nodes_at_a_pace_and_a_held_one_once_it_ends() {
    let (store, client, fleet, _) = region("mass_silence_pace", policy(2, 5), 20).await;
    let jobs = running_jobs(&store, &fleet, 20).await;
    let ctx = store.health_context();

    // Five nodes silent past the lost limit: real failures, lost two a
    // tick (the pace), their jobs requeued.
    let five: Vec<usize> = (0..5).collect();
    silence(&client, &five, 60).await;
    let mut per_tick = Vec::new();
    for _ in 0..4 {
        per_tick.push(store.health_tick(&ctx).await.unwrap().lost.len());
    }
    assert_eq!(per_tick, [2, 2, 1, 0]);
    for n in 0..5 {
        assert_eq!(observed(&client, n).await, "lost", "n{n}");
    }
    for &(id, n) in &jobs {
        let state = store.get_job("acme", id).await.unwrap().state;
        if n < 5 {
            assert_eq!(state, JobState::Queued, "n{n}");
        } else {
            assert_eq!(state, JobState::Running, "n{n}");
        }
    }

    // Now all the others fall silent too: a mass event, held.
    let rest: Vec<usize> = (5..20).collect();
    silence(&client, &rest, 60).await;
    assert!(store.health_tick(&ctx).await.unwrap().lost.is_empty());
    assert_eq!(observed(&client, 7).await, "suspect");
    // Most come back; two stay silent. No longer a mass event: those two
    // get their lost countdown back from now (suspect meanwhile), and are
    // lost when it runs out (3 s: the lost limit less the suspect limit).
    for n in 5..18 {
        fleet.act(&store, n, None).await;
    }
    assert!(store.health_tick(&ctx).await.unwrap().lost.is_empty());
    assert_eq!(observed(&client, 18).await, "suspect");
    assert_eq!(
        observed(&client, 3).await,
        "lost",
        "a node already lost stays lost"
    );
    // The others keep syncing meanwhile.
    let until = std::time::Instant::now() + Duration::from_millis(3500);
    while std::time::Instant::now() < until {
        for n in 5..18 {
            fleet.sync(&store, n, "boot-1", vec![], vec![]).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut lost = Vec::new();
    for _ in 0..2 {
        lost.extend(store.health_tick(&ctx).await.unwrap().lost);
    }
    assert_eq!(lost.len(), 2, "{lost:?}");
    assert_eq!(observed(&client, 18).await, "lost");
    assert_eq!(observed(&client, 19).await, "lost");
    assert_eq!(observed(&client, 17).await, "healthy");
}

#[tokio::test]
async fn the_tick_passes_over_a_node_its_agent_holds_instead_of_waiting() {
    let (store, client, _fleet, url) = region("mass_silence_locks", policy(8, 5), 4).await;
    let ctx = store.health_context();
    silence(&client, &[0, 1, 2, 3], 3).await;

    // A sync of n0's agent is in progress: it holds n0's row.
    let (mut agent, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let tx = agent.transaction().await.unwrap();
    tx.execute("SELECT 1 FROM nodes WHERE node_id = 'n0' FOR UPDATE", &[])
        .await
        .unwrap();

    // The tick does not wait for it (a generous guard against a hang, not
    // a timing).
    let out = tokio::time::timeout(Duration::from_secs(60), store.health_tick(&ctx))
        .await
        .expect("the tick waited on a node its agent holds")
        .unwrap();
    assert!(out.lost.is_empty());
    assert_eq!(observed(&client, 0).await, "healthy", "passed over");
    for n in 1..4 {
        assert_eq!(observed(&client, n).await, "suspect", "n{n}");
    }
    tx.rollback().await.unwrap();
    store.health_tick(&ctx).await.unwrap();
    assert_eq!(observed(&client, 0).await, "suspect");
}

#[tokio::test]
async fn a_sync_leaves_a_report_for_later_rather_than_wait_for_its_job() {
    let (store, client, fleet, url) = region("mass_silence_defer", policy(8, 30), 2).await;
    let jobs = running_jobs(&store, &fleet, 1).await;
    let (id, n) = jobs[0];
    let wanted = fleet.sync(&store, n, "boot-1", vec![], vec![]).await;
    let a = wanted.iter().find(|a| a.job_id == id).unwrap().clone();

    // Another transaction holds the job: a plan being committed, another
    // agent's sync for the same gang.
    let (mut other, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let tx = other.transaction().await.unwrap();
    tx.execute("SELECT 1 FROM jobs WHERE job_id = $1 FOR UPDATE", &[&id])
        .await
        .unwrap();

    // The agent reports its worker done: the sync answers without waiting
    // (a generous guard against a hang, not a timing), leaves the report
    // for later, still lists the worker, and asks the agent to report it
    // again soon.
    let again = tokio::time::timeout(
        Duration::from_secs(60),
        fleet.sync_outcome(&store, n, "boot-1", vec![], vec![common::succeeded(&a)]),
    )
    .await
    .expect("the sync waited for a job another transaction holds");
    assert!(again.deferred, "the agent is asked to report again soon");
    assert!((again.assignments.iter()).any(|x| x.job_id == id && x.rank == a.rank));
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Running
    );
    let held = common::live_gpus(&client, id).await;
    assert_eq!(held, 8, "nothing of the report recorded yet");

    // Once the job is free, the same report (sent again) is recorded.
    tx.rollback().await.unwrap();
    let after = fleet
        .sync_outcome(&store, n, "boot-1", vec![], vec![common::succeeded(&a)])
        .await;
    assert!(!after.deferred);
    assert!(!after.assignments.iter().any(|x| x.job_id == id));
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Succeeded
    );
}

/// A region served over HTTP on a fresh database, with `pool_size`
/// connections (and as many for syncs), node `n0` registered.
struct Served {
    url: String,
    state: gangway_regional::AppState,
    fleet: Fleet,
    base: String,
    http: reqwest::Client,
    shutdown: tokio_util::sync::CancellationToken,
    server: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Served {
    async fn start(prefix: &str, pool_size: usize) -> Served {
        let url = gangway_devkit::fresh_database(prefix).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut cfg = gangway_regional::RegionConfig::new("test", addr, &url);
        cfg.pool_size = pool_size;
        let state = gangway_regional::prepare(cfg, Duration::from_secs(10))
            .await
            .unwrap();
        let fleet =
            Fleet::register_nodes(&state.store, vec![node("n0", "s0", "s0-l0", "h100")]).await;
        let shutdown = tokio_util::sync::CancellationToken::new();
        let server = tokio::spawn(gangway_regional::serve_on(
            listener,
            state.clone(),
            shutdown.clone(),
        ));
        Served {
            url,
            state,
            fleet,
            base: format!("http://{addr}"),
            http: reqwest::Client::new(),
            shutdown,
            server,
        }
    }

    /// A tenant's submission of one 8-GPU job, over HTTP.
    async fn submit(&self) -> reqwest::Response {
        (self.http.post(format!("{}/v1/jobs", self.base)))
            .header(gangway_shared::client::TENANT_HEADER, "acme")
            .json(
                &serde_json::json!({"name": "t", "gpus": 8, "gpu_type": "h100",
                                      "estimated_duration_s": 60, "command": ["train"]}),
            )
            .send()
            .await
            .unwrap()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.server.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn an_overloaded_region_sheds_submissions_and_listings_but_hears_its_agents() {
    let region = Served::start("mass_silence_shed", 16).await;
    let (state, store, fleet) = (&region.state, &region.state.store, &region.fleet);
    let (http, base) = (&region.http, &region.base);
    let list = || {
        http.get(format!("{base}/v1/jobs"))
            .header(gangway_shared::client::TENANT_HEADER, "acme")
            .send()
    };
    assert_eq!(list().await.unwrap().status(), 200);

    // Every turn for sheddable work is taken (as by a flood of
    // submissions that each hold a connection).
    let turns = state.sheddable.available_permits() as u32;
    let held = state
        .sheddable
        .clone()
        .acquire_many_owned(turns)
        .await
        .unwrap();
    for resp in [list().await.unwrap(), region.submit().await] {
        assert_eq!(resp.status(), 503);
        assert_eq!(
            resp.headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()),
            Some("2")
        );
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["code"], "overloaded", "{body}");
    }
    // Shed means nothing was done.
    let filter = gangway_regional::store::ListFilter {
        state: None,
        name: None,
        after: None,
        limit: 10,
    };
    assert!(store.list_jobs("acme", &filter).await.unwrap().0.is_empty());
    // What cannot wait still gets through: the agent's sync.
    let sync = http
        .post(format!("{base}/internal/v1/agents/agent-n0/sync"))
        .json(&gangway_shared::agent::SyncRequest {
            logs: Vec::new(),
            boot_id: fleet.boots[0],
            workers: vec![],
            nodes: vec![],
            checkpoints: None,
        })
        .send()
        .await
        .unwrap();
    assert_eq!(sync.status(), 200);

    // Once load falls, the same submission is taken.
    drop(held);
    assert_eq!(region.submit().await.status(), 201);
    region.stop().await;
}

#[tokio::test]
async fn submissions_are_shed_while_the_agents_syncs_queue_for_the_database() {
    // Two connections, and so two for syncs.
    let region = Served::start("mass_silence_shed_syncs", 2).await;
    let (store, fleet) = (&region.state.store, &region.fleet);
    let (http, base) = (&region.http, &region.base);
    fleet.sync(store, 0, "boot-1", vec![], vec![]).await;
    let id = submit(store, &job("acme", "h100", 8, 8)).await;
    assert_eq!(run_pass(store, AGENT_TIMEOUT).await.unwrap().placements, 1);
    let wanted = fleet.sync(store, 0, "boot-1", vec![], vec![]).await;
    let a = wanted.iter().find(|a| a.job_id == id).unwrap().clone();

    // The database is slow to hear the agent: its row is held, so syncs
    // that record something (the worker's start) wait with a connection
    // each, and as many again wait for a connection.
    let (mut other, conn) = tokio_postgres::connect(&region.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let tx = other.transaction().await.unwrap();
    tx.execute(
        "SELECT 1 FROM agents WHERE agent_id = 'agent-n0' FOR UPDATE",
        &[],
    )
    .await
    .unwrap();
    let started = gangway_shared::agent::SyncRequest {
        logs: Vec::new(),
        boot_id: fleet.boots[0],
        workers: vec![gangway_shared::agent::WorkerReport {
            status: gangway_shared::agent::WorkerStatus::Running,
            ..common::succeeded(&a)
        }],
        nodes: vec![],
        checkpoints: None,
    };
    let send = || {
        let req = http
            .post(format!("{base}/internal/v1/agents/agent-n0/sync"))
            .json(&started)
            .send();
        tokio::spawn(req)
    };
    let queue_reaches = |n: usize| async move {
        for _ in 0..600 {
            if store.sync_pool_status().waiting >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the syncs never queued {n} deep for a connection");
    };

    // Both connections taken and one sync waiting: a moment's queue, not
    // enough to turn tenants away.
    let mut syncs: Vec<_> = (0..3).map(|_| send()).collect();
    queue_reaches(1).await;
    let resp = region.submit().await;
    let status = resp.status();
    let body = resp.text().await.unwrap();
    // Shed only if the queue had filled meanwhile (on a loaded machine a
    // sync may queue behind the three: then shedding is right).
    let queued = store.sync_pool_status();
    if !(status == 503 && body.contains("syncs") && queued.waiting >= queued.max_size) {
        assert_eq!(status, 201, "{body} ({queued:?})");
    }

    // As many waiting as the pool holds: shed.
    syncs.push(send());
    queue_reaches(2).await;

    // A submission now is shed, and nothing of it is recorded.
    let resp = region.submit().await;
    assert_eq!(resp.status(), 503);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["code"], "overloaded", "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("syncs"),
        "{body}"
    );
    let jobs: i64 = tx
        .query_one("SELECT count(*) FROM jobs", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(jobs, 2, "the job placed before and the one taken");

    // Once the syncs get through, submissions are taken again.
    tx.rollback().await.unwrap();
    for s in syncs {
        assert_eq!(s.await.unwrap().unwrap().status(), 200);
    }
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Running
    );
    assert_eq!(region.submit().await.status(), 201);
    region.stop().await;
}
