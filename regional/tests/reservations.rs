//! Capacity reservations against a real, throwaway PostgreSQL: a
//! reservation that cannot be honoured is refused with why and the
//! earliest window that would work (which is then admitted), running work
//! the scheduler could not evict counts until its expected end, create,
//! resize and delete are idempotent under a key, and a reservation starts
//! on time: before its start its GPUs take only work that ends in time
//! or may be preempted, and at its start the owner's job evicts the
//! borrowers through checkpoints and runs inside its domain.

use std::time::Duration;

use chrono::{DateTime, Utc};
use gangway_regional::config::Planning;
use gangway_regional::scheduling::{explain, run_pass_with};
use gangway_regional::store::{
    NewJob, NewReservation, ReservationOutcome, StopTiming, StoreError, Who,
};
use gangway_regional::Store;
use gangway_shared::agent::{Assignment, Desired, SyncRequest, WorkerReport, WorkerStatus};
use gangway_shared::api::{
    JobState, Priority, Reservation, ReservationResize, ReservationSpec, ReservationState,
    TopologyLevel,
};
use gangway_shared::error::codes;
use gangway_shared::ids::reservation_id_for_key;
use uuid::Uuid;

mod common;
use common::{register, store, submit};

const AGENT_TIMEOUT: Duration = Duration::from_secs(3600);
const TIMING: StopTiming = StopTiming {
    grace_period_s: 2,
    checkpoint_deadline_s: 10,
};

/// The region's defaults, with no minimum run time so that a job placed a
/// moment ago may be preempted.
fn planning() -> Planning {
    let mut p = Planning::with_agent_timeout(AGENT_TIMEOUT);
    p.policy.preemption.min_run_s = 0;
    p
}

/// `spines` spines × `leaves` leaves × `nodes` nodes of 8 h100 GPUs.
async fn fleet(store: &Store, spines: usize, leaves: usize, nodes: usize) -> Uuid {
    let mut list = Vec::new();
    for s in 0..spines {
        for l in 0..leaves {
            for n in 0..nodes {
                list.push(common::node(
                    &format!("s{s}-l{l}-n{n}"),
                    &format!("s{s}"),
                    &format!("s{s}-l{l}"),
                    "h100",
                ));
            }
        }
    }
    register(store, list).await
}

/// Whole seconds from now, as the database clock counts them.
fn in_s(s: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(Utc::now().timestamp() + s, 0).unwrap()
}

fn ask(
    gpus: i64,
    level: TopologyLevel,
    start: Option<DateTime<Utc>>,
    end: Option<DateTime<Utc>>,
) -> ReservationSpec {
    ReservationSpec {
        gpu_type: "h100".into(),
        gpus,
        level,
        start,
        end,
        region: None,
    }
}

async fn create(
    store: &Store,
    tenant: &str,
    key: Option<&str>,
    spec: ReservationSpec,
) -> Result<ReservationOutcome, StoreError> {
    store
        .create_reservation(
            &NewReservation {
                id: key.map_or_else(Uuid::new_v4, |k| reservation_id_for_key(tenant, k)),
                tenant: tenant.into(),
                idempotency_key: key.map(String::from),
                spec,
            },
            Who::Tenant(tenant),
        )
        .await
}

fn done(o: ReservationOutcome) -> Reservation {
    match o {
        ReservationOutcome::Done(r) => r,
        ReservationOutcome::Replayed(r) => panic!("replayed {r:?}"),
    }
}

fn replayed(o: ReservationOutcome) -> Reservation {
    match o {
        ReservationOutcome::Replayed(r) => r,
        ReservationOutcome::Done(r) => panic!("done again {r:?}"),
    }
}

fn job_at(tenant: &str, gpus: i32, per: i32, priority: Priority, estimate_s: i64) -> NewJob {
    let mut j = common::job(tenant, "h100", gpus, per);
    j.spec.priority = priority;
    j.priority = priority.rank() as i16;
    j.spec.estimated_duration_s = estimate_s;
    j
}

/// Syncs as the agent would: workers the region wants running run, except
/// those of `finish`, which exit 0; workers asked to checkpoint write one
/// and exit. Returns the assignments it was given.
async fn agent(store: &Store, boot: Uuid, finish: &[Uuid]) -> Vec<Assignment> {
    let sync = |workers| SyncRequest {
        logs: Vec::new(),
        boot_id: boot,
        workers,
        nodes: Vec::new(),
        checkpoints: None,
    };
    let wanted = store
        .sync_agent("agent-0", &sync(Vec::new()), TIMING)
        .await
        .unwrap()
        .assignments;
    let exited = |message: &str| WorkerStatus::Exited {
        exit_code: Some(0),
        signal: None,
        message: Some(message.into()),
    };
    let reports = (wanted.iter())
        .map(|a| WorkerReport {
            job_id: a.job_id,
            rank: a.rank,
            attempt: a.attempt,
            status: match a.desired {
                Desired::Run if finish.contains(&a.job_id) => exited("done"),
                Desired::Run => WorkerStatus::Running,
                _ => exited("checkpointed and stopped"),
            },
            checkpoint: (a.desired == Desired::Checkpoint).then(|| format!("/ckpt/{}", a.job_id)),
            fenced: false,
            unasked: false,
        })
        .collect();
    store
        .sync_agent("agent-0", &sync(reports), TIMING)
        .await
        .unwrap();
    wanted
}

/// The nodes a job's workers were placed on.
async fn nodes_of(store: &Store, tenant: &str, id: Uuid) -> Vec<String> {
    let job = store.get_job(tenant, id).await.unwrap();
    job.workers.iter().filter_map(|w| w.node.clone()).collect()
}

async fn state(store: &Store, tenant: &str, id: Uuid) -> JobState {
    store.get_job(tenant, id).await.unwrap().state
}

#[tokio::test]
async fn an_impossible_reservation_is_refused_with_the_earliest_window_that_works() {
    let (store, _client) = store("resv_refuse").await;
    fleet(&store, 2, 1, 2).await; // 2 spines × 16 GPUs
    let t0 = in_s(60);
    let hour = chrono::Duration::seconds(3600);
    let half = chrono::Duration::seconds(1800);

    // acme holds one whole spine for the first hour.
    let first = done(
        create(
            &store,
            "acme",
            None,
            ask(16, TopologyLevel::Spine, Some(t0), Some(t0 + hour)),
        )
        .await
        .unwrap(),
    );
    assert_eq!(first.domain.len(), 1, "{first:?}");
    assert_eq!((first.start, first.end), (t0, Some(t0 + hour)));
    assert_eq!(first.state, ReservationState::Scheduled);

    // 24 GPUs anywhere in the region for half an hour then: only 16 are
    // left. Refused, with the first window of the same length that works:
    // when acme's hour is over.
    let wide = ask(24, TopologyLevel::Region, Some(t0), Some(t0 + half));
    match create(&store, "globex", None, wide.clone()).await {
        Err(StoreError::ReservationRefused { why, earliest }) => {
            assert!(why.contains("24 GPUs unreserved"), "{why}");
            assert_eq!(earliest, Some((t0 + hour, Some(t0 + hour + half))));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(store.list_reservations(Some("globex")).await.unwrap(), []);
    // Asked for that window, it is admitted.
    let later = done(
        create(
            &store,
            "globex",
            None,
            ReservationSpec {
                start: Some(t0 + hour),
                end: Some(t0 + hour + half),
                ..wide
            },
        )
        .await
        .unwrap(),
    );
    assert_eq!(later.domain, Vec::<String>::new());
    assert_eq!(later.start, t0 + hour);

    // More than any spine has: never, so no window is offered.
    match create(
        &store,
        "globex",
        None,
        ask(17, TopologyLevel::Spine, None, None),
    )
    .await
    {
        Err(StoreError::ReservationRefused { why, earliest }) => {
            assert!(why.contains("the largest has 16"), "{why}");
            assert_eq!(earliest, None);
        }
        other => panic!("{other:?}"),
    }
    // Open-ended: from when both are over, and open-ended too.
    let open = ask(16, TopologyLevel::Spine, Some(t0), None);
    match create(&store, "acme", None, open).await {
        Err(StoreError::ReservationRefused { earliest, .. }) => {
            assert_eq!(earliest, Some((t0 + hour + half, None)))
        }
        other => panic!("{other:?}"),
    }
    // Bad requests are told what to fix.
    let past = ask(8, TopologyLevel::Leaf, None, Some(in_s(-10)));
    match create(&store, "acme", None, past).await {
        Err(StoreError::Invalid { code, .. }) => assert_eq!(code, codes::INVALID_RESERVATION),
        other => panic!("{other:?}"),
    }
    let unknown = ReservationSpec {
        gpu_type: "b200".into(),
        ..ask(8, TopologyLevel::Leaf, None, None)
    };
    match create(&store, "acme", None, unknown).await {
        Err(StoreError::Invalid { code, .. }) => assert_eq!(code, codes::UNKNOWN_GPU_TYPE),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn running_work_that_cannot_be_evicted_counts_until_its_expected_end() {
    let (store, _client) = store("resv_running").await;
    let boot = fleet(&store, 1, 1, 2).await; // one leaf of 16 GPUs
    let planning = planning();
    let normal = submit(&store, &job_at("globex", 8, 8, Priority::Normal, 3600)).await;
    let low = submit(&store, &job_at("globex", 8, 8, Priority::Low, 3600)).await;
    assert_eq!(
        run_pass_with(&store, &planning).await.unwrap().placements,
        2
    );
    agent(&store, boot, &[]).await;
    let started = store
        .get_job("globex", normal)
        .await
        .unwrap()
        .started_at
        .unwrap();

    // The whole leaf now: the normal job's GPUs are not free before it is
    // expected to end, and the scheduler may not evict it.
    match create(
        &store,
        "acme",
        None,
        ask(16, TopologyLevel::Leaf, None, None),
    )
    .await
    {
        Err(StoreError::ReservationRefused { earliest, .. }) => {
            let (start, end) = earliest.expect("a window once the job is done");
            assert_eq!(end, None);
            let expected = started + chrono::Duration::seconds(3600);
            assert!(
                (start - expected).num_seconds().abs() <= 2,
                "{start} vs {expected}"
            );
        }
        other => panic!("{other:?}"),
    }
    // The low-priority job's GPUs can be promised: it is evicted when the
    // owner needs them.
    let r = done(
        create(
            &store,
            "acme",
            None,
            ask(8, TopologyLevel::Leaf, None, None),
        )
        .await
        .unwrap(),
    );
    assert_eq!(r.state, ReservationState::Active);
    assert_eq!(state(&store, "globex", low).await, JobState::Running);
}

#[tokio::test]
async fn create_resize_and_delete_are_idempotent_under_a_key() {
    let (store, _client) = store("resv_idem").await;
    fleet(&store, 1, 2, 2).await; // 2 leaves × 16 GPUs
    let spec = ask(8, TopologyLevel::Leaf, Some(in_s(600)), Some(in_s(4200)));

    // Create: the same key and body give the same reservation, once.
    let made = done(
        create(&store, "acme", Some("k1"), spec.clone())
            .await
            .unwrap(),
    );
    assert_eq!(made.id, reservation_id_for_key("acme", "k1"));
    let again = replayed(
        create(&store, "acme", Some("k1"), spec.clone())
            .await
            .unwrap(),
    );
    assert_eq!(again, made);
    assert_eq!(
        store.list_reservations(Some("acme")).await.unwrap().len(),
        1
    );
    let other_body = ReservationSpec {
        gpus: 4,
        ..spec.clone()
    };
    assert!(matches!(
        create(&store, "acme", Some("k1"), other_body).await,
        Err(StoreError::KeyReused)
    ));
    // Keys are the tenant's own.
    let after = ReservationSpec {
        gpus: 16,
        level: TopologyLevel::Spine,
        start: Some(in_s(5000)),
        end: Some(in_s(6000)),
        ..spec.clone()
    };
    let theirs = done(create(&store, "globex", Some("k1"), after).await.unwrap());
    assert_ne!(theirs.id, made.id);
    assert!(matches!(
        store.get_reservation(Some("globex"), made.id).await,
        Err(StoreError::NotFound)
    ));
    assert_eq!(
        store.get_reservation(None, made.id).await.unwrap().tenant,
        "acme"
    );
    assert_eq!(store.list_reservations(None).await.unwrap().len(), 2);

    // Resize: done once; a retry answers without doing it again, even
    // after a later resize.
    let grow = ReservationResize {
        gpus: Some(16),
        end: None,
    };
    let grown = done(
        store
            .resize_reservation(Who::Tenant("acme"), made.id, Some("k2"), &grow)
            .await
            .unwrap(),
    );
    assert_eq!(
        (grown.gpus, grown.domain.clone()),
        (16, made.domain.clone())
    );
    let open = ReservationResize {
        gpus: Some(12),
        end: Some(None),
    };
    let reopened = done(
        store
            .resize_reservation(Who::Tenant("acme"), made.id, Some("k3"), &open)
            .await
            .unwrap(),
    );
    assert_eq!((reopened.gpus, reopened.end), (12, None));
    let retry = replayed(
        store
            .resize_reservation(Who::Tenant("acme"), made.id, Some("k2"), &grow)
            .await
            .unwrap(),
    );
    assert_eq!(retry.gpus, 12, "a retried resize is not applied again");
    for (key, body) in [("k2", &open), ("k1", &grow)] {
        assert!(
            matches!(
                store
                    .resize_reservation(Who::Tenant("acme"), made.id, Some(key), body)
                    .await,
                Err(StoreError::KeyReused)
            ),
            "{key}"
        );
    }
    // Growing past its domain (one leaf of 16) is refused, nothing changed.
    let too_big = ReservationResize {
        gpus: Some(17),
        end: None,
    };
    match store
        .resize_reservation(Who::Tenant("acme"), made.id, None, &too_big)
        .await
    {
        Err(StoreError::ReservationRefused { earliest, .. }) => assert_eq!(earliest, None),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        store
            .get_reservation(Some("acme"), made.id)
            .await
            .unwrap()
            .gpus,
        12
    );
    // Delete: deleted once; a retry, and a delete without a key, answer
    // the same.
    let deleted = done(
        store
            .delete_reservation(Who::Tenant("acme"), made.id, Some("k4"))
            .await
            .unwrap(),
    );
    assert_eq!(deleted.state, ReservationState::Deleted);
    let retry = replayed(
        store
            .delete_reservation(Who::Tenant("acme"), made.id, Some("k4"))
            .await
            .unwrap(),
    );
    assert_eq!(retry, deleted);
    let twice = done(
        store
            .delete_reservation(Who::Tenant("acme"), made.id, None)
            .await
            .unwrap(),
    );
    assert_eq!(twice.state, ReservationState::Deleted);
    assert!(matches!(
        store
            .delete_reservation(Who::Tenant("acme"), made.id, Some("k3"))
            .await,
        Err(StoreError::KeyReused)
    ));
    assert!(matches!(
        store
            .delete_reservation(Who::Tenant("globex"), made.id, None)
            .await,
        Err(StoreError::NotFound)
    ));
    // A deleted reservation cannot be resized, and its GPUs are free to
    // promise again.
    match store
        .resize_reservation(Who::Tenant("acme"), made.id, None, &grow)
        .await
    {
        Err(StoreError::Conflict { code, .. }) => assert_eq!(code, codes::RESERVATION_CONFLICT),
        other => panic!("{other:?}"),
    }
    let data = store.snapshot(AGENT_TIMEOUT).await.unwrap();
    let ids: Vec<&str> = data
        .snapshot
        .reserved
        .iter()
        .map(|r| r.id.as_str())
        .collect();
    assert_eq!(ids, [theirs.id.to_string()]);
}

#[tokio::test]
async fn a_reservation_starts_on_time_with_its_borrowers_evicted_through_checkpoints() {
    let (store, client) = store("resv_start").await;
    let boot = fleet(&store, 1, 2, 2).await; // leaves s0-l0, s0-l1 × 16 GPUs
    let planning = planning();

    // acme reserves one leaf (16 GPUs) from ten minutes from now.
    let res = done(
        create(
            &store,
            "acme",
            None,
            ask(16, TopologyLevel::Leaf, Some(in_s(600)), Some(in_s(7200))),
        )
        .await
        .unwrap(),
    );
    let leaf = res.domain[1].clone();
    let inside = |nodes: &[String]| nodes.iter().all(|n| n.starts_with(&format!("{leaf}-")));
    let data = store.snapshot(AGENT_TIMEOUT).await.unwrap();
    assert_eq!(data.snapshot.reserved.len(), 1);
    assert_eq!(data.snapshot.reserved[0].path, res.domain);

    // Before the start: a long normal job goes to the other leaf, a second
    // one waits rather than take the reserved GPUs, a short one (done
    // before the start) may use them.
    let mut wide = job_at("globex", 16, 8, Priority::Normal, 3600);
    wide.required = TopologyLevel::Leaf;
    let wide = submit(&store, &wide).await;
    run_pass_with(&store, &planning).await.unwrap();
    let elsewhere = nodes_of(&store, "globex", wide).await;
    assert_eq!(elsewhere.len(), 2);
    assert!(
        elsewhere
            .iter()
            .all(|n| !n.starts_with(&format!("{leaf}-"))),
        "{elsewhere:?}"
    );
    let long = submit(&store, &job_at("globex", 8, 8, Priority::Normal, 3600)).await;
    let short = submit(&store, &job_at("globex", 8, 8, Priority::Normal, 60)).await;
    run_pass_with(&store, &planning).await.unwrap();
    assert_eq!(state(&store, "globex", long).await, JobState::Queued);
    // It is planned for when the other leaf's job is expected to end.
    let e = explain(&store, "globex", long, &planning).await.unwrap();
    assert_eq!(e.code, "reserved", "{e:?}");
    assert!(e.estimated_start.unwrap() > res.start, "{e:?}");
    assert!(inside(&nodes_of(&store, "globex", short).await));
    store.cancel_job("globex", long).await.unwrap();
    agent(&store, boot, &[short]).await;
    assert_eq!(state(&store, "globex", short).await, JobState::Succeeded);

    // Low-priority work borrows the reserved GPUs meanwhile.
    let borrowers = [
        submit(&store, &job_at("globex", 8, 8, Priority::Low, 3600)).await,
        submit(&store, &job_at("globex", 8, 8, Priority::Low, 3600)).await,
    ];
    assert_eq!(
        run_pass_with(&store, &planning).await.unwrap().placements,
        2
    );
    agent(&store, boot, &[]).await;
    for b in borrowers {
        assert_eq!(state(&store, "globex", b).await, JobState::Running);
        assert!(inside(&nodes_of(&store, "globex", b).await));
    }

    // The owner's job waits for the start.
    let mut owned = job_at("acme", 16, 8, Priority::Normal, 3600);
    owned.spec.reservation = Some(res.id);
    let owned = submit(&store, &owned).await;
    assert_eq!(run_pass_with(&store, &planning).await.unwrap().preempted, 0);
    let e = explain(&store, "acme", owned, &planning).await.unwrap();
    assert_eq!(e.code, "reservation_not_started", "{e:?}");
    assert_eq!(e.estimated_start, Some(res.start));

    // The start comes (the region's clock is the database's: the start is
    // moved to now rather than the test waiting ten minutes).
    client
        .execute(
            "UPDATE capacity_reservations SET start_at = date_trunc('second', now())
             WHERE reservation_id = $1",
            &[&res.id],
        )
        .await
        .unwrap();
    // The borrowers are asked to checkpoint and stop, for the owner's job,
    // because of the reservation; the other leaf's normal job runs on.
    let pass = run_pass_with(&store, &planning).await.unwrap();
    assert_eq!((pass.placements, pass.preempted), (0, 2), "{pass:?}");
    for b in borrowers {
        assert_eq!(state(&store, "globex", b).await, JobState::Preempting);
        let last = store.job_events("globex", b).await.unwrap().pop().unwrap();
        assert_eq!(last.kind, "preempted");
        assert_eq!(last.detail["cause"], "reservation");
        assert_eq!(last.detail["for_job"], owned.to_string());
    }
    assert_eq!(state(&store, "globex", wide).await, JobState::Running);
    // They checkpoint and stop, and go back to the queue to resume from
    // their checkpoints; the owner's job runs inside the reservation.
    agent(&store, boot, &[]).await;
    for b in borrowers {
        let job = store.get_job("globex", b).await.unwrap();
        assert_eq!(job.state, JobState::Queued);
        assert_eq!(job.restore_from, Some(format!("/ckpt/{b}")));
    }
    let pass = run_pass_with(&store, &planning).await.unwrap();
    assert_eq!(pass.placements, 1, "{pass:?}");
    let placed = nodes_of(&store, "acme", owned).await;
    assert_eq!(placed.len(), 2);
    assert!(inside(&placed), "{placed:?} outside {leaf}");
    agent(&store, boot, &[]).await;
    assert_eq!(state(&store, "acme", owned).await, JobState::Running);
    let now = store.get_reservation(Some("acme"), res.id).await.unwrap();
    assert_eq!((now.state, now.in_use_gpus), (ReservationState::Active, 16));
    // The borrowers wait: nothing is free, and the running reservation's
    // job is never a victim.
    let pass = run_pass_with(&store, &planning).await.unwrap();
    assert_eq!((pass.placements, pass.preempted), (0, 0), "{pass:?}");

    // It cannot shrink below what its job holds.
    let shrink = ReservationResize {
        gpus: Some(8),
        end: None,
    };
    match store
        .resize_reservation(Who::Tenant("acme"), res.id, None, &shrink)
        .await
    {
        Err(StoreError::Conflict { code, message }) => {
            assert_eq!(code, codes::RESERVATION_CONFLICT);
            assert!(message.contains("hold 16"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // Jobs that do not fit it, or name someone else's, are refused.
    let mut too_big = job_at("acme", 24, 8, Priority::Normal, 60);
    too_big.spec.reservation = Some(res.id);
    let mut not_theirs = job_at("globex", 8, 8, Priority::Normal, 60);
    not_theirs.spec.reservation = Some(res.id);
    for j in [too_big, not_theirs] {
        match store.submit(&j).await {
            Err(StoreError::Invalid { code, .. }) => assert_eq!(code, codes::INVALID_RESERVATION),
            other => panic!("{other:?}"),
        }
    }
    // Once deleted, its job runs on as ordinary work, and new jobs may
    // not name it.
    store
        .delete_reservation(Who::Tenant("acme"), res.id, None)
        .await
        .unwrap();
    let data = store.snapshot(AGENT_TIMEOUT).await.unwrap();
    assert!(data.snapshot.reserved.is_empty());
    let run = data
        .snapshot
        .running
        .iter()
        .find(|r| r.job == owned.to_string())
        .unwrap();
    assert_eq!(run.reservation, None);
    assert_eq!(state(&store, "acme", owned).await, JobState::Running);
    let mut late = job_at("acme", 8, 8, Priority::Normal, 60);
    late.spec.reservation = Some(res.id);
    assert!(matches!(
        store.submit(&late).await,
        Err(StoreError::Invalid { .. })
    ));
}

#[tokio::test]
async fn jobs_in_a_reservation_ask_nothing_of_the_tenants_gpu_limit() {
    let (store, _client) = store("resv_limits").await;
    fleet(&store, 1, 2, 2).await;
    let res = done(
        create(
            &store,
            "acme",
            None,
            ask(16, TopologyLevel::Leaf, None, None),
        )
        .await
        .unwrap(),
    );
    let limits = gangway_shared::api::LimitTerms {
        max_queued_jobs: None,
        max_gpus: Some(8),
    };
    store.set_limits_as("sre", "acme", &limits).await.unwrap();
    // 16 GPUs in the reservation: over the 8-GPU limit of the shared pool,
    // but none of them are the pool's.
    let mut inside = job_at("acme", 16, 8, Priority::Normal, 3600);
    inside.spec.reservation = Some(res.id);
    submit(&store, &inside).await;
    // The pool's 8 still count, and fill the limit.
    submit(&store, &job_at("acme", 8, 8, Priority::Normal, 3600)).await;
    match store
        .submit(&job_at("acme", 8, 8, Priority::Normal, 3600))
        .await
    {
        Err(StoreError::RequestedGpusLimit {
            unfinished_gpus, ..
        }) => assert_eq!(unfinished_gpus, 8),
        other => panic!("admitted past the limit: {other:?}"),
    }
    // A second job in the reservation is still admitted.
    let mut more = job_at("acme", 8, 8, Priority::Normal, 3600);
    more.spec.reservation = Some(res.id);
    submit(&store, &more).await;
}

#[tokio::test]
async fn an_operator_reserves_resizes_and_deletes_on_a_tenants_behalf_and_each_is_audited() {
    let (store, _client) = store("resv_operator").await;
    fleet(&store, 1, 2, 2).await;
    let spec = ask(16, TopologyLevel::Leaf, None, None);
    let new = NewReservation {
        id: reservation_id_for_key("acme", "ops-1"),
        tenant: "acme".into(),
        idempotency_key: Some("ops-1".into()),
        spec: spec.clone(),
    };
    let made = done(
        store
            .create_reservation(&new, Who::Operator("ops"))
            .await
            .unwrap(),
    );
    // It is the tenant's: it sees it, and a retry of the tenant's own with
    // the key is the same reservation.
    assert_eq!(made.tenant, "acme");
    assert_eq!(
        store
            .get_reservation(Some("acme"), made.id)
            .await
            .unwrap()
            .id,
        made.id
    );
    let again = create(&store, "acme", Some("ops-1"), spec).await.unwrap();
    assert!(matches!(again, ReservationOutcome::Replayed(ref r) if r.id == made.id));
    let grow = ReservationResize {
        gpus: Some(8),
        end: None,
    };
    store
        .resize_reservation(Who::Operator("ops"), made.id, None, &grow)
        .await
        .unwrap();
    // A tenant's own changes are not operator actions.
    store
        .resize_reservation(Who::Tenant("acme"), made.id, None, &grow)
        .await
        .unwrap();
    store
        .delete_reservation(Who::Operator("ops"), made.id, None)
        .await
        .unwrap();
    let audit = store
        .audit_log(&serde_json::from_value(serde_json::json!({})).unwrap())
        .await
        .unwrap();
    let ours: Vec<&str> = (audit.entries.iter())
        .filter(|e| e.target == made.id.to_string())
        .map(|e| e.action.as_str())
        .collect();
    // Newest first.
    assert_eq!(
        ours,
        [
            "reservation.delete",
            "reservation.resize",
            "reservation.create"
        ]
    );
    assert!(audit
        .entries
        .iter()
        .filter(|e| e.target == made.id.to_string())
        .all(|e| e.actor == "ops"));
}
