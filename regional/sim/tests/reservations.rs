//! Capacity reservations in the simulator (`SimConfig::reserve_pct`): who
//! gets one, which jobs run in it, and what lending its idle GPUs to
//! preemptible work does.

mod common;
use common::trace;
use std::collections::BTreeSet;

use gangway_sched::{Level, PolicyKind};
use gangway_shared::fleet::{FleetFile, FleetNode};
use gangway_sim::{Entitlements, LocalityModel, SimConfig, SimError, Simulation};

/// One spine; `leaves` leaves of `nodes` 8-GPU nodes.
fn fleet(leaves: u32, nodes: u32) -> Vec<FleetNode> {
    let text = format!(
        "[[spine]]\n[[spine.leaf]]\ncount = {leaves}\nnodes = {nodes}\ngpu_type = \"v100\"\ngpus_per_node = 8\n"
    );
    FleetFile::parse(&text).unwrap().expand("t")
}

/// Two leaves of two nodes (32 GPUs); `a` and `b` are each guaranteed
/// half, `lo` nothing and runs at low priority. Half the fleet reserved:
/// `a` (first by name among equal guarantees) reserves its 16 GPUs, one
/// leaf.
fn config(lend: bool) -> SimConfig {
    SimConfig {
        entitlements: Some(Entitlements::parse("vc,node num\na,1\nb,1\n").unwrap()),
        low_priority_tenants: BTreeSet::from(["lo".to_string()]),
        locality: LocalityModel::none(),
        reserve_pct: 50.0,
        lend_reserved: lend,
        ..SimConfig::default()
    }
}

/// `lo` fills the fleet with four long one-node jobs at t=0; `a` asks for
/// 16 GPUs at t=1,000 (its reservation), and for 8 more at t=1,050 (no
/// room left in it: the shared pool).
fn rows() -> Vec<(u64, f64, u32, &'static str)> {
    let mut rows: Vec<_> = (0..4).map(|_| (0, 10_000.0, 8, "lo")).collect();
    rows.push((1_000, 100.0, 16, "a"));
    rows.push((1_050, 100.0, 8, "a"));
    rows
}

#[test]
fn the_largest_tenants_reserve_their_guarantee_in_one_domain() {
    let t = trace(&rows());
    let sim = Simulation::new(&t, &fleet(2, 2), config(true)).unwrap();
    let r = &sim.summary().reservations;
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!((r[0].tenant.as_str(), r[0].gpus), ("a", 16));
    assert_eq!(r[0].level, Level::Leaf);
    // Without guarantees there is nothing to reserve from.
    let none = SimConfig {
        entitlements: None,
        ..config(true)
    };
    assert!(matches!(
        Simulation::new(&t, &fleet(2, 2), none),
        Err(SimError::Config(_))
    ));
}

#[test]
fn lent_gpus_go_back_to_the_owner_and_unlent_ones_wait_for_it() {
    let t = trace(&rows());
    let lent = Simulation::new(&t, &fleet(2, 2), config(true))
        .unwrap()
        .run(PolicyKind::Gangway);
    let kept = Simulation::new(&t, &fleet(2, 2), config(false))
        .unwrap()
        .run(PolicyKind::Gangway);
    let start = |o: &gangway_sim::SimOutcome, i: usize| o.jobs[i].first_start_s;
    // Lent: lo borrows the reserved leaf at t=0, and its two jobs there
    // checkpoint and stop (30 s) when a's gang needs the leaf.
    assert!((0..4).all(|i| start(&lent, i) == Some(0)));
    assert_eq!(start(&lent, 4), Some(1_030));
    let r = lent.metrics.reserved.as_ref().expect("reservation stats");
    assert!(r.lent);
    assert_eq!(r.preemptions, 2);
    // (a's second job, in the pool, takes a low job's node by priority.)
    assert_eq!(lent.metrics.preemptions, 3);
    assert!(r.used_by_borrowers_pct.unwrap() > 0.0);
    // Not lent: two of lo's jobs wait for the pool's leaf, and a's gang
    // starts the moment it arrives.
    assert_eq!(
        (0..4).filter(|&i| start(&kept, i) == Some(0)).count(),
        2,
        "{:?}",
        kept.jobs
    );
    assert_eq!(start(&kept, 4), Some(1_000));
    let r = kept.metrics.reserved.as_ref().expect("reservation stats");
    assert!(!r.lent);
    assert_eq!(r.preemptions, 0);
    assert_eq!(r.used_by_borrowers_pct, Some(0.0));
    // a's second job found its reservation full: the pool.
    for o in [&lent, &kept] {
        let r = o.metrics.reserved.as_ref().unwrap();
        assert_eq!((r.owner_jobs_in_reservations, r.owner_jobs_in_pool), (1, 1));
    }
    // Borrowing kept the fleet busier.
    assert!(lent.metrics.gpu_hours > kept.metrics.gpu_hours);
}

#[test]
fn no_reservations_report_nothing_about_them() {
    let t = trace(&rows());
    let config = SimConfig {
        reserve_pct: 0.0,
        ..config(true)
    };
    let o = Simulation::new(&t, &fleet(2, 2), config)
        .unwrap()
        .run(PolicyKind::Gangway);
    assert!(o.metrics.reserved.is_none());
    let json = serde_json::to_value(&o.metrics).unwrap();
    assert!(json.get("reserved").is_none());
}
