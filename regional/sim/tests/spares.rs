//! Spare pools in the simulator: a failed node under running work is
//! replaced by the nearest idle spare and its units restart there at once;
//! with none left they requeue at the front; repaired nodes refill the fleet
//! in service first, then the pool. Results worked out by hand.

mod common;
use common::{assert_only_work_since_checkpoints_lost, trace};
use gangway_sched::Level;
use gangway_shared::fleet::{FleetFile, FleetNode};
use gangway_sim::{
    LocalityModel, PlacementEnd, SimConfig, SimOutcome, Simulation, SpareMode, POLICIES,
};

/// One spine of 8-GPU nodes; each `(nodes, spares)` is one leaf whose last
/// `spares` nodes are spares.
fn fleet(leaves: &[(u32, u32)]) -> Vec<FleetNode> {
    let mut text = String::from("[[spine]]\n");
    for (nodes, spares) in leaves {
        text.push_str(&format!(
            "[[spine.leaf]]\nnodes = {nodes}\nspares = {spares}\ngpu_type = \"h100\"\ngpus_per_node = 8\n"
        ));
    }
    FleetFile::parse(&text).unwrap().expand("t")
}

fn config(spares: SpareMode, failures: Vec<(u64, String)>) -> SimConfig {
    SimConfig {
        checkpoint_interval_s: 1000,
        repair_time_s: 1000,
        locality: LocalityModel::none(),
        spares,
        scheduled_failures: failures,
        ..SimConfig::default()
    }
}

fn id(nodes: &[FleetNode], i: usize) -> String {
    nodes[i].node_id.clone()
}

fn run_all(sim: &Simulation) -> Vec<SimOutcome> {
    POLICIES.iter().map(|&p| sim.run(p)).collect()
}

#[test]
fn a_spare_in_the_same_leaf_takes_the_failed_nodes_place_at_once() {
    // Leaf 0: n0 n1 + spare n2. A 16-GPU gang of 10,000 s on n0 + n1
    // (the only leaf with two nodes); n0 fails at 2,500 s. The last
    // checkpoint was at 2,000 s: 500 s × 16 GPUs lost, 8,000 s left, and
    // with the spare the gang runs again at 2,500 s, on n2 + n1, in one
    // leaf: it ends at 10,500.
    let nodes = fleet(&[(3, 1), (2, 1)]);
    let t = trace(&[(0, 10_000.0, 16, "x")]);
    let failures = vec![(2500, id(&nodes, 0))];
    let sim = Simulation::new(&t, &nodes, config(SpareMode::Swap, failures.clone())).unwrap();
    assert_eq!(sim.summary().spare_nodes, 2);
    for o in run_all(&sim) {
        let (j, m) = (&o.jobs[0], &o.metrics);
        assert_eq!(
            (j.end_s, j.starts, j.level),
            (Some(10_500), 2, Some(Level::Leaf))
        );
        assert_eq!(j.lost_gpu_s, 500.0 * 16.0);
        assert_eq!(
            (m.node_failures, m.failures_under_work, m.spare_swaps),
            (1, 1, 1)
        );
        assert_eq!(m.recovery_after_failure_s.p99, 0.0);
        assert_eq!(m.gpu_hours_waiting_after_failures, 0.0);
        let x = &m.tenants[0];
        assert_eq!((x.tenant.as_str(), x.jct_mean_s), ("x", Some(10_500.0)));
        assert_eq!(x.gpu_hours_lost_to_failures, 500.0 * 16.0 / 3600.0);
        // 10,500 s × 16 GPUs allocated, 500 × 16 of them lost.
        let goodput = m.goodput_pct.unwrap();
        assert!(
            (goodput - 100.0 * 10_000.0 / 10_500.0).abs() < 1e-9,
            "{goodput}"
        );
    }

    // Without spares the gang requeues at the front; the free node of leaf
    // 1 and n1 could hold it across the spine, so it restarts at once there
    // — spread, but no spare was needed.
    let sim = Simulation::new(&t, &nodes, config(SpareMode::Off, failures.clone())).unwrap();
    for o in run_all(&sim) {
        let (j, m) = (&o.jobs[0], &o.metrics);
        assert_eq!(
            (j.end_s, j.starts, j.level),
            (Some(10_500), 2, Some(Level::Spine))
        );
        assert_eq!((m.failures_under_work, m.spare_swaps), (1, 0));
    }

    // With the spares as ordinary nodes there are 40 GPUs in service.
    let sim = Simulation::new(&t, &nodes, config(SpareMode::Capacity, failures)).unwrap();
    assert_eq!(
        (sim.summary().fleet_gpus, sim.summary().spare_nodes),
        (40, 0)
    );
}

#[test]
fn without_a_spare_the_gang_waits_for_the_repair() {
    // One leaf of two nodes, no spare. n0 fails at 2,500: the gang loses
    // 500 s × 16, requeues and waits for n0 (back at 3,500), then runs the
    // 8,000 s left: it ends at 11,500.
    let nodes = fleet(&[(2, 0)]);
    let t = trace(&[(0, 10_000.0, 16, "x")]);
    let sim = Simulation::new(
        &t,
        &nodes,
        config(SpareMode::Swap, vec![(2500, id(&nodes, 0))]),
    )
    .unwrap();
    for o in run_all(&sim) {
        let m = &o.metrics;
        assert_eq!(o.jobs[0].end_s, Some(11_500));
        assert_eq!((m.failures_under_work, m.spare_swaps), (1, 0));
        assert_eq!(m.recovery_after_failure_s.mean, 1000.0);
        assert!((m.gpu_hours_waiting_after_failures - 1000.0 * 16.0 / 3600.0).abs() < 1e-9);
    }
}

#[test]
fn spares_come_from_the_nearest_domain_and_repaired_nodes_refill_the_pool() {
    // Leaf 0: n0 n1 + spare n2 (indices 0-2); leaf 1: n0 + spare n1
    // (indices 3-4). A 16-GPU gang of 20,000 s on leaf 0's n0 + n1;
    // checkpoints every 1,000 s of a run; repairs take 2,000 s; a gang
    // spread over the spine runs at half speed.
    //   2,500  n0 fails: saved 2,000, lost 500 s; leaf 0's spare n2 in.
    //   3,600  n1 fails: the checkpoint at 3,500 saved 1,000 s more (3,000),
    //          100 s lost; leaf 0 has no spare left, leaf 1's comes in: the
    //          gang spans both leaves (level spine, half speed).
    //   4,500  n0 repaired: into leaf 0's pool.
    //   4,800  leaf 1's former spare fails under the gang: its checkpoint at
    //          4,600 saved 1,000 s × ½ of work (3,500 in all), 200 s lost;
    //          the nearest spare is n0 of leaf 0 (same spine), so the gang
    //          is back in one leaf at full speed. 16,500 s left: it ends at
    //          21,300. (Taking leaf 1's spare first would have run it
    //          spread from 2,500 s and ended at 21,800.)
    let nodes = fleet(&[(3, 1), (2, 1)]);
    let t = trace(&[(0, 20_000.0, 16, "x")]);
    let failures = vec![
        (2500, id(&nodes, 0)),
        (3600, id(&nodes, 1)),
        (4800, id(&nodes, 4)),
    ];
    let mut cfg = config(SpareMode::Swap, failures);
    cfg.repair_time_s = 2000;
    cfg.locality = LocalityModel::parse("nvlink=1,leaf=1,spine=0.5,region=0.5").unwrap();
    let sim = Simulation::new(&t, &nodes, cfg).unwrap();
    for o in run_all(&sim) {
        let (j, m) = (&o.jobs[0], &o.metrics);
        assert_eq!(
            (j.end_s, j.starts, j.level),
            (Some(21_300), 4, Some(Level::Leaf))
        );
        assert_eq!(j.lost_gpu_s, (500.0 + 100.0 + 200.0) * 16.0);
        assert_eq!((m.node_failures, m.spare_swaps), (3, 3));
        assert_eq!(m.recovery_after_failure_s.p99, 0.0);
    }
}

#[test]
fn a_repaired_node_fills_the_slot_of_a_node_that_failed_with_no_spare() {
    // One leaf: n0 n1 + spare n2. A 16-GPU gang of 10,000 s on n0 + n1.
    //   2,500  n0 fails: spare n2 in, lost 500 s (saved 2,000).
    //   3,000  n1 fails: no spare left; the gang (500 s into its run, no
    //          new checkpoint) requeues at the front, n2 alone in service.
    //   3,500  n0 repaired: rather than into the pool it takes failed n1's
    //          place, and the gang runs on n2 + n0: 8,000 s left, ends 11,500.
    //   4,000  n1 repaired: its place is taken, so it joins the pool.
    let nodes = fleet(&[(3, 1)]);
    let t = trace(&[(0, 10_000.0, 16, "x")]);
    let failures = vec![(2500, id(&nodes, 0)), (3000, id(&nodes, 1))];
    let sim = Simulation::new(&t, &nodes, config(SpareMode::Swap, failures)).unwrap();
    for o in run_all(&sim) {
        let (j, m) = (&o.jobs[0], &o.metrics);
        assert_eq!((j.end_s, j.starts), (Some(11_500), 3));
        assert_eq!((m.failures_under_work, m.spare_swaps), (2, 1));
        // One restart at once on the spare, one after 500 s.
        assert_eq!(m.recovery_after_failure_s.mean, 250.0);
        assert_eq!(m.recovery_after_failure_s.p99, 500.0);
    }
}

#[test]
fn many_random_failures_with_spares_keep_every_gpu_second_accounted_for() {
    // A high failure rate on a small fleet with a spare per leaf: every job
    // completes, the GPU time allocated is the trace's work plus what
    // failures lost (no locality slowdown here), no restart loses more than
    // a checkpoint interval, and the in-service fleet never grows past its
    // size (else a spare would have been double-counted).
    let rows: Vec<(u64, f64, u32, &str)> = (0..80)
        .map(|i| {
            (
                i * 400,
                2500.0 + 150.0 * (i % 5) as f64,
                [1, 8, 16, 24][i as usize % 4],
                "x",
            )
        })
        .collect();
    let t = trace(&rows);
    let nodes = fleet(&[(4, 1), (4, 1), (3, 1)]);
    let mut cfg = config(SpareMode::Swap, Vec::new());
    cfg.checkpoint_interval_s = 600;
    cfg.node_failure_rate = 15.0;
    cfg.repair_time_s = 900;
    cfg.seed = 11;
    let sim = Simulation::new(&t, &nodes, cfg).unwrap();
    for policy in POLICIES {
        let o = sim.run(policy);
        let m = &o.metrics;
        assert!(
            m.spare_swaps > 3 && m.failures_under_work > m.spare_swaps,
            "{policy:?} {m:?}"
        );
        assert_eq!(m.jobs_completed, 80, "{policy:?}");
        assert_only_work_since_checkpoints_lost(&o, &rows, 600);
        assert!(m.utilization_pct.unwrap() <= 100.0);
        // The placements (what the usage ledger would record) hold exactly
        // the GPU time allocated, end the way the runs did, and every
        // job's last one succeeded.
        let held: f64 = (o.placements.iter())
            .map(|p| f64::from(p.gpus) * (p.end_s - p.start_s) as f64)
            .sum();
        assert!(
            (held / 3600.0 - m.gpu_hours).abs() < 1e-6,
            "{policy:?}: {held} vs {m:?}"
        );
        let lost = (o.placements.iter())
            .filter(|p| p.ended_by == PlacementEnd::NodeLost && p.rank == 0)
            .count() as u64;
        assert_eq!(lost, m.restarts, "{policy:?}");
        for j in 0..80 {
            let last = (o.placements.iter())
                .filter(|p| p.job == j)
                .max_by_key(|p| (p.end_s, p.attempt))
                .unwrap();
            assert_eq!(last.ended_by, PlacementEnd::Succeeded, "{policy:?} job {j}");
        }
    }
}
