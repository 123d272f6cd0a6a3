//! Small hand-made traces on tiny fleets, with results worked out by hand.
//!
//! Every scenario is built so that any reasonable discipline gives the same
//! answer (no choice between waiting and backfilling changes an outcome),
//! and each runs under all three policies.

mod common;
use common::{assert_only_work_since_checkpoints_lost, trace};
use gangway_sched::{Level, PolicyKind};
use gangway_shared::fleet::{FleetFile, FleetNode};
use gangway_sim::{Entitlements, LocalityModel, SimConfig, SimOutcome, Simulation, POLICIES};

/// One spine; `leaves` leaves of `nodes` 8-GPU nodes.
fn fleet(leaves: u32, nodes: u32) -> Vec<FleetNode> {
    let text = format!(
        "[[spine]]\n[[spine.leaf]]\ncount = {leaves}\nnodes = {nodes}\ngpu_type = \"v100\"\ngpus_per_node = 8\n"
    );
    FleetFile::parse(&text).unwrap().expand("t")
}

fn ends(o: &SimOutcome) -> Vec<(Option<u64>, Option<u64>)> {
    o.jobs.iter().map(|j| (j.first_start_s, j.end_s)).collect()
}

#[test]
fn hand_computed_completion_times_and_makespan() {
    // Two 8-GPU nodes in one leaf.
    // A: t=0, 8 GPUs, 100 s           -> runs 0..100
    // B: t=10, 16 GPUs, 50 s          -> needs both nodes: waits for A, 100..150
    // C: t=20, 4 GPUs, 30 s           -> fits on the free node now, ends before
    //                                    B could start anyway: 20..50
    // D: t=120, 8 GPUs, 10 s          -> B holds everything until 150: 150..160
    let t = trace(&[
        (0, 100.0, 8, "x"),
        (10, 50.0, 16, "y"),
        (20, 30.0, 4, "x"),
        (120, 10.0, 8, "y"),
    ]);
    let sim = Simulation::new(&t, &fleet(1, 2), SimConfig::default()).unwrap();
    for policy in POLICIES {
        let o = sim.run(policy);
        assert_eq!(
            ends(&o),
            vec![
                (Some(0), Some(100)),
                (Some(100), Some(150)),
                (Some(20), Some(50)),
                (Some(150), Some(160)),
            ],
            "{policy:?}"
        );
        let m = &o.metrics;
        // JCTs 100, 140, 30, 40; delays 0, 90, 0, 30.
        assert_eq!(m.jct_s.mean, 310.0 / 4.0, "{policy:?}");
        assert_eq!(m.jct_s.median, 70.0);
        assert_eq!(m.jct_s.p99, 140.0);
        assert_eq!(m.queueing_delay_s.mean, 30.0);
        assert_eq!(m.queueing_delay_s.median, 15.0);
        assert_eq!(m.makespan_s, 160);
        assert_eq!((m.jobs_completed, m.jobs_unfinished), (4, 0));
        // Jobs wait during [10, 100) and [120, 150). Allocated: 8 GPUs over
        // [10, 20), 12 over [20, 50), 8 over [50, 100), 16 over [120, 150).
        let alloc = 8.0 * 10.0 + 12.0 * 30.0 + 8.0 * 50.0 + 16.0 * 30.0;
        let want = 100.0 * alloc / (16.0 * 120.0);
        let got = m.allocation_while_waiting_pct.unwrap();
        assert!((got - want).abs() < 1e-9, "{got} vs {want}");
        // B is the one multi-node gang, inside its leaf.
        assert_eq!(m.gangs.multi_node_starts, 1);
        assert_eq!(m.gangs.in_one_leaf_pct, Some(100.0));
        assert_eq!(m.gangs.leaf_could_hold, 1);
        assert_eq!(m.stranded_while_gang_waits_pct, Some(0.0));
        assert_eq!(m.gpu_hours_lost_to_failures, 0.0);
    }
}

#[test]
fn load_scaling_divides_inter_arrival_times() {
    let t = trace(&[(0, 10.0, 1, "x"), (100, 10.0, 1, "x"), (1000, 10.0, 1, "x")]);
    let config = SimConfig {
        load: 4.0,
        ..SimConfig::default()
    };
    let o = Simulation::new(&t, &fleet(1, 1), config)
        .unwrap()
        .run(PolicyKind::Gangway);
    let submits: Vec<u64> = o.jobs.iter().map(|j| j.submit_s).collect();
    assert_eq!(submits, vec![0, 25, 250]);
    assert_eq!(o.metrics.makespan_s, 260);
}

#[test]
fn gangs_round_up_to_whole_nodes() {
    // 12 GPUs -> two workers of 8; the fleet has 3 nodes, so 40 GPUs cannot fit.
    let t = trace(&[(0, 10.0, 12, "x"), (0, 10.0, 40, "x")]);
    let sim = Simulation::new(&t, &fleet(1, 3), SimConfig::default()).unwrap();
    assert_eq!(sim.summary().jobs_rounded_up, 1);
    assert_eq!(sim.summary().jobs_rejected, 1);
    let o = sim.run(PolicyKind::FifoFirstFit);
    assert_eq!(o.jobs[0].gpus, 16);
    assert_eq!(o.jobs[0].end_s, Some(10));
    assert!(o.jobs[1].rejected && o.jobs[1].end_s.is_none());
    assert_eq!(o.metrics.jobs_rejected, 1);
}

#[test]
fn a_failure_loses_exactly_the_work_since_the_last_checkpoint() {
    // One node. A 10,000 s job of 8 GPUs checkpoints every 1,000 s; its node
    // fails at t=2,500 and is back at t=2,600. The last checkpoint was at
    // 2,000 s of work, so 500 s × 8 GPUs are lost and 8,000 s remain.
    let t = trace(&[(0, 10_000.0, 8, "x")]);
    let node = fleet(1, 1)[0].node_id.clone();
    let config = SimConfig {
        checkpoint_interval_s: 1000,
        repair_time_s: 100,
        scheduled_failures: vec![(2500, node)],
        ..SimConfig::default()
    };
    let sim = Simulation::new(&t, &fleet(1, 1), config.clone()).unwrap();
    for policy in POLICIES {
        let o = sim.run(policy);
        let j = &o.jobs[0];
        assert_eq!(j.lost_gpu_s, 500.0 * 8.0, "{policy:?}");
        assert_eq!(
            (j.first_start_s, j.end_s, j.starts),
            (Some(0), Some(10_600), 2)
        );
        let m = &o.metrics;
        assert_eq!((m.node_failures, m.restarts), (1, 1));
        assert!((m.gpu_hours_lost_to_failures - 4000.0 / 3600.0).abs() < 1e-12);
        assert!((m.gpu_hours - (10_000.0 + 500.0) * 8.0 / 3600.0).abs() < 1e-9);
    }
    // Without checkpoints the whole 2,500 s is lost and the job starts over.
    let sim = Simulation::new(
        &t,
        &fleet(1, 1),
        SimConfig {
            checkpoint_interval_s: 0,
            ..config
        },
    )
    .unwrap();
    let o = sim.run(PolicyKind::Gangway);
    assert_eq!(o.jobs[0].lost_gpu_s, 2500.0 * 8.0);
    assert_eq!(o.jobs[0].end_s, Some(12_600));
}

#[test]
fn seeded_random_failures_lose_only_work_since_checkpoints() {
    // Many failures on a small fleet: every GPU-second allocated is either
    // the trace's work (no locality slowdown here) or lost, and no restart
    // loses more than one checkpoint interval.
    let rows: Vec<(u64, f64, u32, &str)> = (0..60)
        .map(|i| {
            (
                i * 500,
                3000.0 + 100.0 * (i % 7) as f64,
                [1, 2, 8, 16][i as usize % 4],
                "x",
            )
        })
        .collect();
    let t = trace(&rows);
    let config = SimConfig {
        checkpoint_interval_s: 600,
        node_failure_rate: 20.0,
        repair_time_s: 300,
        seed: 7,
        locality: LocalityModel::none(),
        ..SimConfig::default()
    };
    let sim = Simulation::new(&t, &fleet(2, 2), config).unwrap();
    let o = sim.run(PolicyKind::Gangway);
    let m = &o.metrics;
    assert!(m.node_failures > 10 && m.restarts > 5, "{m:?}");
    assert_eq!(m.jobs_completed, 60);
    assert_only_work_since_checkpoints_lost(&o, &rows, 600);
}

#[test]
fn same_seed_same_metrics() {
    let rows: Vec<(u64, f64, u32, &str)> = (0..200)
        .map(|i| {
            (
                i * 97 % 5000,
                100.0 + (i * 37 % 900) as f64,
                [1, 1, 4, 8, 16, 32][i as usize % 6],
                ["a", "b", "c"][i as usize % 3],
            )
        })
        .collect();
    let t = trace(&rows);
    let config = SimConfig {
        node_failure_rate: 2.0,
        estimate_noise: 0.5,
        seed: 42,
        entitlements: Some(Entitlements::parse("vc,node num\na,2\nb,1\nc,1\n").unwrap()),
        ..SimConfig::default()
    };
    let sim = Simulation::new(&t, &fleet(2, 4), config.clone()).unwrap();
    for policy in POLICIES {
        let a = sim.run(policy);
        let b = Simulation::new(&t, &fleet(2, 4), config.clone())
            .unwrap()
            .run(policy);
        assert_eq!(a, b, "{policy:?}");
        assert_eq!(
            serde_json::to_string(&a.metrics).unwrap(),
            serde_json::to_string(&b.metrics).unwrap()
        );
    }
    let other = Simulation::new(&t, &fleet(2, 4), SimConfig { seed: 43, ..config })
        .unwrap()
        .run(PolicyKind::Gangway);
    assert_ne!(other, sim.run(PolicyKind::Gangway));
}

#[test]
fn a_gang_spread_beyond_its_best_level_runs_slower() {
    // Two leaves of two nodes. One node of each leaf is down for the whole
    // run, so a 16-GPU gang (best: one leaf) must span the spine and runs at
    // t(spine) / t(leaf) = 0.5 / 0.8 = 0.625 of full speed: 1,000 s of work
    // take 1,600 s.
    let nodes = fleet(2, 2);
    let t = trace(&[(0, 1000.0, 16, "x")]);
    let config = SimConfig {
        locality: LocalityModel::parse("nvlink=1,leaf=0.8,spine=0.5,region=0.4").unwrap(),
        repair_time_s: 1_000_000,
        scheduled_failures: vec![(0, nodes[1].node_id.clone()), (0, nodes[3].node_id.clone())],
        ..SimConfig::default()
    };
    let sim = Simulation::new(&t, &nodes, config).unwrap();
    for policy in POLICIES {
        let o = sim.run(policy);
        assert_eq!(o.jobs[0].level, Some(Level::Spine), "{policy:?}");
        assert_eq!(o.jobs[0].end_s, Some(1600), "{policy:?}");
        let g = &o.metrics.gangs;
        assert_eq!(
            (g.multi_node_starts, g.spread_starts, g.leaf_could_hold),
            (1, 1, 0)
        );
        assert_eq!(g.in_one_leaf_pct, Some(0.0));
        assert_eq!(g.in_one_spine_pct, Some(100.0));
    }
}

#[test]
fn quota_caps_hold_a_tenant_to_its_share() {
    // Tenant a is entitled to half of two nodes (8 GPUs). With caps its
    // second 8-GPU job waits for the first even though a node is free; b
    // meanwhile gets the other node.
    let t = trace(&[(0, 100.0, 8, "a"), (0, 100.0, 8, "a"), (50, 10.0, 8, "b")]);
    let ent = Entitlements::parse("vc,node num\na,1\nb,1\n").unwrap();
    let config = SimConfig {
        entitlements: Some(ent),
        quota_caps: true,
        ..SimConfig::default()
    };
    let sim = Simulation::new(&t, &fleet(1, 2), config.clone()).unwrap();
    for policy in POLICIES {
        let o = sim.run(policy);
        assert_eq!(
            ends(&o),
            vec![
                (Some(0), Some(100)),
                (Some(100), Some(200)),
                (Some(50), Some(60))
            ],
            "{policy:?}"
        );
        let m = &o.metrics;
        // a had work waiting over [0, 100) holding its full entitlement.
        let a = m.tenants.iter().find(|t| t.tenant == "a").unwrap();
        assert_eq!(a.entitlement_pct, 50.0);
        assert_eq!(a.entitlement_fulfilment_pct, Some(100.0));
        assert_eq!(a.share_vs_entitlement, Some(1.0));
        // Waiting only for its quota: half the fleet sits free, nothing is
        // stranded by fragmentation.
        assert_eq!(m.stranded_while_gang_waits_pct, Some(0.0));
    }
    // Without caps both of a's jobs start at once.
    let o = Simulation::new(
        &t,
        &fleet(1, 2),
        SimConfig {
            quota_caps: false,
            ..config
        },
    )
    .unwrap()
    .run(PolicyKind::Gangway);
    assert_eq!(o.jobs[1].first_start_s, Some(0));
    assert_eq!(o.jobs[2].first_start_s, Some(100));
}

#[test]
fn stranded_gpus_count_while_a_gang_fits_the_total_but_no_node() {
    // Two nodes. Four 4-GPU jobs arrive one second apart and fill them in
    // order (A, B on the first node, C, D on the second, whatever the fit
    // rule and the queue order, since each pass places one); B and D end at
    // t=11 and 13, leaving 4 free GPUs on each node. G (8 GPUs, arriving at
    // t=20) fits the free count but no node, and waits until A ends at
    // 1,000: 8 of 16 GPUs stranded over the whole time a job waits.
    let t = trace(&[
        (0, 1000.0, 4, "x"),
        (1, 10.0, 4, "x"),
        (2, 1000.0, 4, "x"),
        (3, 10.0, 4, "x"),
        (20, 10.0, 8, "x"),
    ]);
    let sim = Simulation::new(&t, &fleet(1, 2), SimConfig::default()).unwrap();
    for policy in POLICIES {
        let o = sim.run(policy);
        let m = &o.metrics;
        assert_eq!(o.jobs[4].first_start_s, Some(1000), "{policy:?}");
        assert_eq!(m.hours_with_waiting_jobs, 980.0 / 3600.0);
        let s = m.stranded_while_gang_waits_pct.unwrap();
        assert!((s - 50.0).abs() < 1e-9, "{policy:?}: {s}");
        assert_eq!(m.allocation_while_waiting_pct, Some(50.0));
        // Gangway's pass reserves for G on the first node (A's, free at
        // 1,000), holding the 4 GPUs free there now: 4 of 16 held. FIFO
        // never reserves; under Slurm-like no pass runs while nothing
        // could start, so there is no reservation to hold anything.
        let held = m.held_for_reservations_while_waiting_pct.unwrap();
        let want = match policy {
            PolicyKind::Gangway => 25.0,
            _ => 0.0,
        };
        assert!((held - want).abs() < 1e-9, "{policy:?}: {held}");
        // All of the stranded share is G's (8 GPUs): reserved under
        // Gangway, with no reservation where no pass ran.
        let class = match policy {
            PolicyKind::Gangway => "5-8 GPUs, reserved",
            _ => "5-8 GPUs, no capacity",
        };
        let by = &m.stranded_by_waiting_unit_pct;
        assert_eq!(by.keys().collect::<Vec<_>>(), vec![class], "{policy:?}");
        assert!((by[class] - 50.0).abs() < 1e-9, "{policy:?}: {by:?}");
    }
}

#[test]
fn a_small_queue_window_still_serves_every_job_in_order() {
    // One node, twenty 8-GPU jobs arriving together, the core shown only two
    // queued units per pass, a failure in the middle: every job completes,
    // one at a time in arrival order, and the failed one goes first again.
    let rows: Vec<(u64, f64, u32, &str)> = (0..20).map(|_| (0, 100.0, 8, "x")).collect();
    let t = trace(&rows);
    let node = fleet(1, 1)[0].node_id.clone();
    let config = SimConfig {
        queue_window: 2,
        checkpoint_interval_s: 0,
        repair_time_s: 0,
        scheduled_failures: vec![(550, node)],
        ..SimConfig::default()
    };
    let sim = Simulation::new(&t, &fleet(1, 1), config).unwrap();
    for policy in POLICIES {
        let o = sim.run(policy);
        assert_eq!(o.metrics.jobs_completed, 20, "{policy:?}");
        let starts: Vec<u64> = o.jobs.iter().map(|j| j.first_start_s.unwrap()).collect();
        let mut want: Vec<u64> = (0..20).map(|i| i * 100).collect();
        // Job 5 ran [500, 550), restarted from scratch at 550: everyone after
        // it shifts by 50 s.
        for w in want.iter_mut().skip(6) {
            *w += 50;
        }
        assert_eq!(starts, want, "{policy:?}");
        assert_eq!(o.jobs[5].end_s, Some(650));
        assert_eq!(o.metrics.makespan_s, 2050);
    }
}

#[test]
fn a_pass_interval_defers_passes_to_the_end_of_the_period() {
    // Passes at most every 60 s: A passes at t=0; B, arriving at t=10,
    // waits for the pass at t=60; C arrives at t=200, long after, and starts
    // at once.
    let t = trace(&[(0, 100.0, 1, "x"), (10, 100.0, 1, "x"), (200, 10.0, 1, "x")]);
    let config = SimConfig {
        pass_interval_s: 60,
        ..SimConfig::default()
    };
    let sim = Simulation::new(&t, &fleet(1, 1), config).unwrap();
    for policy in POLICIES {
        let o = sim.run(policy);
        let starts: Vec<Option<u64>> = o.jobs.iter().map(|j| j.first_start_s).collect();
        assert_eq!(starts, vec![Some(0), Some(60), Some(200)], "{policy:?}");
    }
}
