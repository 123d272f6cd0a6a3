//! Smoke test on the real Philly trace: the first 2,000 jobs on the
//! Philly-sized fleet. The trace lives in ../shared beside the checkout; the
//! test says so and passes when it is absent.

use std::path::Path;

use gangway_shared::fleet::FleetFile;
use gangway_sim::{Entitlements, SimConfig, Simulation, Trace, POLICIES};

#[test]
fn first_2000_philly_jobs_replay_with_sane_metrics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let traces = root.join("../../../shared/traces/philly");
    let trace_path = traces.join("philly.csv");
    if !trace_path.exists() {
        eprintln!(
            "skipping: the Philly trace is not at {} (it comes with ../shared beside the checkout)",
            trace_path.display()
        );
        return;
    }
    let trace = Trace::load(&trace_path).unwrap();
    assert_eq!(trace.jobs.len(), 82_247);
    assert_eq!(trace.skipped.total(), 0);
    let fleet = FleetFile::load(root.join("../../deploy/fleets/philly.toml")).unwrap();
    let nodes = fleet.expand(fleet.region_or("philly"));
    let config = SimConfig {
        max_jobs: Some(2000),
        load: 8.0,
        node_failure_rate: 0.05,
        entitlements: Some(Entitlements::load(traces.join("philly_vc_nodes.csv")).unwrap()),
        ..SimConfig::default()
    };
    let sim = Simulation::new(&trace, &nodes, config).unwrap();
    assert_eq!(sim.summary().fleet_gpus, 2816);
    // The policies in parallel: the debug-build core is slow.
    let outcomes = std::thread::scope(|s| {
        let runs: Vec<_> = POLICIES
            .iter()
            .map(|&p| {
                let sim = &sim;
                s.spawn(move || (p, sim.run(p)))
            })
            .collect();
        runs.into_iter()
            .map(|r| r.join().unwrap())
            .collect::<Vec<_>>()
    });
    for (policy, o) in outcomes {
        let m = &o.metrics;
        assert_eq!(m.jobs, 2000);
        assert_eq!(m.jobs_completed + m.jobs_rejected, 2000, "{policy:?}");
        assert_eq!(m.jobs_unfinished, 0);
        for v in [
            m.allocation_while_waiting_pct,
            m.utilization_pct,
            m.stranded_while_gang_waits_pct,
            m.gangs.in_one_leaf_pct,
        ]
        .into_iter()
        .flatten()
        {
            assert!((0.0..=100.0).contains(&v), "{policy:?}: {m:#?}");
        }
        assert!(m.jct_s.mean >= m.queueing_delay_s.mean);
        assert!(m.jct_s.median > 0.0 && m.jct_s.p99 >= m.jct_s.median);
        assert!(m.makespan_s as f64 >= m.jct_s.p99);
        assert!(m.node_failures > 0 && m.gpu_hours_lost_to_failures >= 0.0);
        // Everything the trace asked for ran, plus what failures threw away
        // and what locality slowdowns cost.
        let demand = sim.summary().demand_gpu_hours;
        assert!(m.gpu_hours >= demand * 0.999, "{} < {demand}", m.gpu_hours);
        for j in o.jobs.iter().filter(|j| !j.rejected) {
            assert!(j.first_start_s.unwrap() >= j.submit_s);
            assert!(j.end_s.unwrap() >= j.first_start_s.unwrap());
        }
    }
}
