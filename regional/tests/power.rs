//! Rack power budgets and rack thermal throttling against a real,
//! throwaway PostgreSQL: a rack's allocated GPUs never draw more than its
//! budget and it fills up to it (a rack without one fills completely);
//! GPU types sharing a rack split its budget so that their partitions,
//! planned and committed independently, never exceed it together; a rack
//! reporting thermal throttling takes no new work anywhere in it while its
//! running work stays; and the rack gauges on /metrics.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use gangway_health::Signal;
use gangway_regional::config::Planning;
use gangway_regional::scheduling::{run_partition_pass, run_pass};
use gangway_regional::store::{NewJob, RackPower, StopTiming};
use gangway_regional::Store;
use gangway_sched::{plan, Policy};
use gangway_shared::agent::{
    AgentNode, Desired, NodeReport, SyncRequest, WorkerReport, WorkerStatus,
};
use gangway_shared::api::{Fault, JobState};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use uuid::Uuid;

mod common;
use common::{register, store, submit};

const AGENT_TIMEOUT: Duration = Duration::from_secs(3600);
const TIMING: StopTiming = StopTiming {
    grace_period_s: 5,
    checkpoint_deadline_s: 30,
};

/// `nodes` nodes of 8 GPUs of `ty` in rack `leaf` (spine `s0`), each
/// reporting `draw` W per GPU and the rack's `budget`.
fn rack(leaf: &str, ty: &str, nodes: usize, draw: u32, budget: Option<u64>) -> Vec<AgentNode> {
    (0..nodes)
        .map(|n| AgentNode {
            gpu_power_w: Some(draw),
            rack_power_budget_w: budget,
            ..common::node(&format!("{leaf}-{ty}-n{n}"), "s0", leaf, ty)
        })
        .collect()
}

fn job(ty: &str, gpus: i32, per: i32) -> NewJob {
    common::job("acme", ty, gpus, per)
}

fn planning() -> Planning {
    Planning::with_agent_timeout(AGENT_TIMEOUT)
}

/// Live allocations per (rack, GPU type).
async fn allocated(client: &tokio_postgres::Client) -> BTreeMap<(String, String), i64> {
    client
        .query(
            "SELECT n.leaf, n.gpu_type, count(*) FROM allocations a
             JOIN nodes n ON n.node_id = a.node_id
             WHERE a.released_at IS NULL GROUP BY n.leaf, n.gpu_type",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| ((r.get(0), r.get(1)), r.get(2)))
        .collect()
}

async fn gpus_in(client: &tokio_postgres::Client, leaf: &str) -> i64 {
    let all = allocated(client).await;
    all.iter()
        .filter(|((l, _), _)| l == leaf)
        .map(|(_, &n)| n)
        .sum()
}

/// Whole passes until one places nothing, checking `check` after each.
async fn settle(store: &Store, mut check: impl AsyncFnMut()) {
    for _ in 0..100 {
        let o = run_pass(store, AGENT_TIMEOUT).await.unwrap();
        check().await;
        if o.placements == 0 && !o.stale {
            return;
        }
    }
    panic!("passes kept placing");
}

#[tokio::test]
async fn a_rack_never_draws_more_than_its_budget_and_fills_up_to_it() {
    let (store, client) = store("power_budget").await;
    // Rack l0: 4 nodes × 8 h100 at 700 W, a budget that feeds 20 GPUs;
    // rack l1: the same without a budget.
    let budget = 20 * 700;
    let mut nodes = rack("l0", "h100", 4, 700, Some(budget));
    nodes.extend(rack("l1", "h100", 4, 700, None));
    register(&store, nodes).await;

    let data = store
        .snapshot_with(AGENT_TIMEOUT, planning().history)
        .await
        .unwrap();
    assert_eq!(data.snapshot.gpu_power_w["h100"], 700);
    assert_eq!(
        data.snapshot.power_headroom_w,
        [(("l0".to_string(), "h100".to_string()), budget)].into()
    );
    assert_eq!(
        data.racks["l0"],
        RackPower {
            budget_w: budget,
            allocated_w: 0
        }
    );
    assert!(!data.racks.contains_key("l1"));
    // GET /v1/region counts as free only what the budget can feed: 20 of
    // l0's 32, all of l1's.
    let (caps, _, _) = store.capacity(AGENT_TIMEOUT).await.unwrap();
    assert_eq!((caps[0].schedulable, caps[0].free), (64, 52));
    // Submissions are checked against what each rack could ever feed.
    let (_, shape) = store.fleet_shape().await.unwrap();
    for n in &shape["h100"] {
        let want = (n.leaf == "l0").then_some(20);
        assert_eq!(n.rack_power_gpus, want, "{}", n.leaf);
    }

    // More work than both racks hold: 1-, 4- and 8-GPU gangs.
    for _ in 0..10 {
        submit(&store, &job("h100", 1, 1)).await;
    }
    for _ in 0..8 {
        submit(&store, &job("h100", 4, 4)).await;
    }
    for _ in 0..6 {
        submit(&store, &job("h100", 8, 8)).await;
    }
    settle(&store, async || {
        let l0 = gpus_in(&client, "l0").await;
        assert!(l0 as u64 * 700 <= budget, "rack l0 holds {l0} GPUs");
    })
    .await;
    let l0 = gpus_in(&client, "l0").await;
    assert!(
        l0 >= 20 - 7,
        "rack l0 filled only {l0} of the 20 GPUs its budget feeds"
    );

    // Small work fills the gaps: the budgeted rack exactly to its budget
    // and no further, the other one completely.
    for _ in 0..30 {
        submit(&store, &job("h100", 1, 1)).await;
    }
    settle(&store, async || {
        assert!(gpus_in(&client, "l0").await * 700 <= budget as i64);
    })
    .await;
    assert_eq!(gpus_in(&client, "l0").await, 20);
    assert_eq!(
        gpus_in(&client, "l1").await,
        32,
        "the unbudgeted rack fills"
    );
    let data = store
        .snapshot_with(AGENT_TIMEOUT, planning().history)
        .await
        .unwrap();
    assert_eq!(data.racks["l0"].allocated_w, budget);
    assert_eq!(data.racks["l0"].headroom_w(), 0);
    assert_eq!(
        data.snapshot.power_headroom_w[&("l0".into(), "h100".into())],
        0
    );
}

#[tokio::test]
async fn gpu_types_sharing_a_rack_split_its_budget_across_partitions() {
    let (store, client) = store("power_split").await;
    // One rack: 16 h100 at 700 W and 16 a100 at 400 W under 12 kW, half
    // of it each (h100: 8 GPUs = 5.6 kW; a100: 15 GPUs = 6 kW).
    let budget: u64 = 12_000;
    let mut nodes = rack("l0", "h100", 2, 700, Some(budget));
    nodes.extend(rack("l0", "a100", 2, 400, Some(budget)));
    register(&store, nodes).await;
    for _ in 0..20 {
        submit(&store, &job("h100", 1, 1)).await;
        submit(&store, &job("a100", 1, 1)).await;
    }
    let drawn = async || {
        let a = allocated(&client).await;
        let h = a.get(&("l0".into(), "h100".into())).copied().unwrap_or(0);
        let g = a.get(&("l0".into(), "a100".into())).copied().unwrap_or(0);
        (h, g, (h * 700 + g * 400) as u64)
    };

    // The figures agree whichever snapshot reads them.
    let whole = store
        .snapshot_with(AGENT_TIMEOUT, planning().history)
        .await
        .unwrap();
    for ty in ["h100", "a100"] {
        let part = store
            .snapshot_partition(ty, AGENT_TIMEOUT, planning().history)
            .await
            .unwrap();
        assert_eq!(part.racks, whole.racks);
        assert_eq!(
            part.snapshot.power_headroom_w,
            whole.snapshot.partition(ty).power_headroom_w,
            "{ty}"
        );
    }
    assert_eq!(
        whole.snapshot.power_headroom_w[&("l0".into(), "h100".into())],
        6_000
    );

    // An a100 plan read now stays in flight while the h100 partition
    // commits pass after pass; then it commits (its version did not move).
    let a100_data = store
        .snapshot_partition("a100", AGENT_TIMEOUT, planning().history)
        .await
        .unwrap();
    let in_flight = plan(&a100_data.snapshot, &Policy::default());
    assert!(!in_flight.placements.is_empty());
    for _ in 0..10 {
        let o = run_partition_pass(&store, &planning(), "h100")
            .await
            .unwrap();
        assert!(drawn().await.2 <= budget);
        if o.placements == 0 {
            break;
        }
    }
    store.apply_plan(&in_flight).await.unwrap();
    let (h, g, w) = drawn().await;
    assert!(w <= budget, "{h} h100 + {g} a100 draw {w} W over {budget}");

    // Both partitions' passes at once, until neither places anything.
    let planning = planning();
    for _ in 0..20 {
        let (oh, oa) = tokio::join!(
            run_partition_pass(&store, &planning, "h100"),
            run_partition_pass(&store, &planning, "a100"),
        );
        let (oh, oa) = (oh.unwrap(), oa.unwrap());
        let (h, g, w) = drawn().await;
        assert!(w <= budget, "{h} h100 + {g} a100 draw {w} W over {budget}");
        if oh.placements + oa.placements == 0 && !oh.stale && !oa.stale {
            break;
        }
    }
    // Each type filled its share.
    let (h, g, w) = drawn().await;
    assert_eq!((h, g), (8, 15), "{w} W");
}

/// Syncs the agent as it would run: wanted workers run.
async fn act(store: &Store, boot: Uuid, signals: Vec<(String, Signal)>) -> Vec<Desired> {
    let nodes = signals
        .into_iter()
        .map(|(node_id, s)| NodeReport {
            node_id,
            // The machine's boot as the agent's (no reboot).
            boot_id: boot.to_string(),
            signals: vec![s],
        })
        .collect();
    let sync = |workers, nodes| SyncRequest {
        logs: Vec::new(),
        boot_id: boot,
        workers,
        nodes,
        checkpoints: None,
    };
    let wanted = store
        .sync_agent("agent-0", &sync(vec![], nodes), TIMING)
        .await
        .unwrap()
        .assignments;
    let reports = (wanted.iter())
        .filter(|a| a.desired == Desired::Run)
        .map(|a| WorkerReport {
            job_id: a.job_id,
            rank: a.rank,
            attempt: a.attempt,
            status: WorkerStatus::Running,
            checkpoint: None,
            fenced: false,
            unasked: false,
        })
        .collect();
    store
        .sync_agent("agent-0", &sync(reports, vec![]), TIMING)
        .await
        .unwrap();
    wanted.iter().map(|a| a.desired).collect()
}

async fn schedulable_in(store: &Store, leaf: &str) -> Vec<bool> {
    let data = store
        .snapshot_with(AGENT_TIMEOUT, planning().history)
        .await
        .unwrap();
    (data.snapshot.nodes.iter())
        .filter(|n| n.leaf == leaf)
        .map(|n| n.schedulable)
        .collect()
}

#[tokio::test]
async fn a_thermally_throttling_rack_takes_no_new_work_until_it_recovers() {
    let (store, client) = store("power_thermal").await;
    let mut nodes = rack("hot", "h100", 2, 700, None);
    nodes.extend(rack("cool", "h100", 2, 700, None));
    let boot = register(&store, nodes).await;
    let ctx = store.health_context();

    // A job runs; its rack is the one that will throttle.
    let running = submit(&store, &job("h100", 8, 8)).await;
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    let placed = store.get_job("acme", running).await.unwrap();
    let on = placed.workers[0].node.clone().unwrap();
    act(&store, boot, vec![]).await;
    assert_eq!(
        store.get_job("acme", running).await.unwrap().state,
        JobState::Running
    );
    let hot = if on.starts_with("hot") { "hot" } else { "cool" };
    let cool = if hot == "hot" { "cool" } else { "hot" };

    // The rack's *other*, idle node reports its rack throttling (injected,
    // as `POST /v1/admin/nodes/{id}/faults` takes it).
    let other = format!("{hot}-h100-n{}", if on.ends_with("n0") { 1 } else { 0 });
    let fault: Fault = serde_json::from_value(serde_json::json!({"kind": "rack_thermal"})).unwrap();
    assert_eq!(fault, Fault::RackThermal { throttled: None });
    let out = store
        .inject_fault(&ctx, "ops", &other, &fault)
        .await
        .unwrap()
        .unwrap();
    assert!(out.fleet_changed);
    assert_eq!(schedulable_in(&store, hot).await, [false, false]);
    assert_eq!(schedulable_in(&store, cool).await, [true, true]);
    // GET /v1/region: only the cool rack's 16 GPUs take work, all free.
    let (caps, _, _) = store.capacity(AGENT_TIMEOUT).await.unwrap();
    assert_eq!(
        (caps[0].schedulable, caps[0].free, caps[0].allocated),
        (16, 16, 8)
    );
    let v = store
        .get_node(store.health_policy(), &on)
        .await
        .unwrap()
        .unwrap();
    assert!(!v.schedulable && v.rack_throttled, "{v:?}");
    assert!(
        v.why
            .as_deref()
            .unwrap_or("")
            .contains("thermally throttling"),
        "{:?}",
        v.why
    );
    assert_eq!(v.observed, "healthy"); // the node itself is fine
    assert_eq!(serde_json::to_value(&v).unwrap()["rack_throttled"], true);

    // New work goes only to the other rack; the running job stays.
    let waiting: Vec<Uuid> = {
        let mut ids = Vec::new();
        for _ in 0..4 {
            ids.push(submit(&store, &job("h100", 8, 8)).await);
        }
        ids
    };
    for _ in 0..3 {
        run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    }
    assert_eq!(
        gpus_in(&client, hot).await,
        8,
        "only the running job in {hot}"
    );
    assert_eq!(gpus_in(&client, cool).await, 16);
    assert_eq!(act(&store, boot, vec![]).await, [Desired::Run; 3]);
    assert_eq!(
        store.get_job("acme", running).await.unwrap().state,
        JobState::Running
    );

    // It recovers: the rack takes work again.
    store
        .inject_fault(
            &ctx,
            "ops",
            &other,
            &Fault::RackThermal {
                throttled: Some(false),
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(schedulable_in(&store, hot).await, [true, true]);
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    assert_eq!(gpus_in(&client, hot).await, 16);
    let mut still_queued = 0;
    for id in waiting {
        if store.get_job("acme", id).await.unwrap().state == JobState::Queued {
            still_queued += 1;
        }
    }
    assert_eq!(still_queued, 1);

    // The same through the agent's sync: a report from a node of the
    // rack, the latest report winning.
    act(
        &store,
        boot,
        vec![(other.clone(), Signal::RackThermal { throttled: true })],
    )
    .await;
    assert_eq!(schedulable_in(&store, hot).await, [false, false]);
    act(
        &store,
        boot,
        vec![(other.clone(), Signal::RackThermal { throttled: false })],
    )
    .await;
    assert_eq!(schedulable_in(&store, hot).await, [true, true]);
    // Every change is audited (injected) and on the node's timeline.
    let faults: i64 = client
        .query_one(
            "SELECT count(*) FROM audit_log WHERE action = 'node.fault' AND target = $1",
            &[&other],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(faults, 2);
    let events: i64 = client
        .query_one(
            "SELECT count(*) FROM node_events
             WHERE node_id = $1 AND kind = 'health' AND detail->>'code' = 'rack_thermal'",
            &[&other],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(events, 4);
}

/// The process's Prometheus recorder, as `/metrics` renders it.
fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| PrometheusBuilder::new().install_recorder().unwrap())
}

/// The value of `name{rack="…"}` in the rendered metrics.
fn gauge(text: &str, name: &str, rack: &str) -> Option<f64> {
    let prefix = format!("{name}{{rack=\"{rack}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().parse().unwrap())
}

#[tokio::test]
async fn metrics_show_each_racks_budget_and_headroom() {
    let metrics = recorder();
    let (store, _client) = store("power_metrics").await;
    // "pm-mixed": 8 h100 and 8 a100 under 8 kW (4 kW each); "pm-h100":
    // 8 h100 under 5.6 kW; "pm-a100": a100 without a budget.
    let mut nodes = rack("pm-mixed", "h100", 1, 700, Some(8_000));
    nodes.extend(rack("pm-mixed", "a100", 1, 400, Some(8_000)));
    nodes.extend(rack("pm-h100", "h100", 1, 700, Some(5_600)));
    nodes.extend(rack("pm-a100", "a100", 1, 400, None));
    register(&store, nodes).await;
    // 4 a100 GPUs go to the budgeted mixed rack (best fit puts them on
    // either a100 node; the 8 h100 GPUs fit only the h100 rack's budget).
    submit(&store, &job("a100", 8, 8)).await;
    submit(&store, &job("a100", 4, 4)).await;
    submit(&store, &job("h100", 8, 8)).await;

    // The a100 partition covers only the racks with a100 in them.
    let part = store
        .snapshot_partition("a100", AGENT_TIMEOUT, planning().history)
        .await
        .unwrap();
    assert_eq!(part.racks.keys().collect::<Vec<_>>(), ["pm-mixed"]);
    // Placing passes, then the idle ones the loops run right after: the
    // gauges are set from each pass's snapshot, as it read the racks.
    for _ in 0..2 {
        run_partition_pass(&store, &planning(), "a100")
            .await
            .unwrap();
        run_partition_pass(&store, &planning(), "h100")
            .await
            .unwrap();
    }

    let data = store
        .snapshot_with(AGENT_TIMEOUT, planning().history)
        .await
        .unwrap();
    let mixed = data.racks["pm-mixed"];
    let h100 = data.racks["pm-h100"];
    assert_eq!(
        h100,
        RackPower {
            budget_w: 5_600,
            allocated_w: 5_600
        }
    );
    assert_eq!(mixed.budget_w, 8_000);
    // The mixed rack holds one a100 gang (4 or 8 GPUs) and no h100.
    assert!([1_600, 3_200].contains(&mixed.allocated_w), "{mixed:?}");

    let text = metrics.render();
    let budget = "gangway_rack_power_budget_watts";
    let headroom = "gangway_rack_power_headroom_watts";
    assert_eq!(gauge(&text, budget, "pm-mixed"), Some(8_000.0), "{text}");
    assert_eq!(gauge(&text, budget, "pm-h100"), Some(5_600.0));
    assert_eq!(gauge(&text, headroom, "pm-h100"), Some(0.0));
    // Whole-rack, the same from either partition's pass: the h100 pass
    // ran last and counts the a100 draw too.
    assert_eq!(
        gauge(&text, headroom, "pm-mixed"),
        Some(mixed.headroom_w() as f64)
    );
    assert_eq!(gauge(&text, budget, "pm-a100"), None);
}
