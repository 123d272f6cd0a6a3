//! Each signal class and its action; heartbeats, flapping, repair, and the
//! two axes combined.

use super::*;

fn node() -> (HealthPolicy, NodeHealth) {
    let policy = HealthPolicy::default();
    let mut n = NodeHealth::new(8);
    n.observe(&policy, 0, &hb("boot-1"));
    (policy, n)
}

fn hb(boot: &str) -> Signal {
    Signal::Heartbeat {
        boot_id: boot.into(),
    }
}

fn xid(gpu: u32, code: u32) -> Signal {
    Signal::Xid { gpu, code }
}

fn actions(effects: &[Effect]) -> Vec<(Action, Option<u32>)> {
    effects.iter().map(|e| (e.action, e.gpu)).collect()
}

fn decision(n: &NodeHealth, p: &HealthPolicy, now: u64) -> Decision {
    decide(&Admin::Active, &n.observed(p, now), 8)
}

#[test]
fn application_xids_never_penalise() {
    for code in [13, 31, 43, 45, 68] {
        let (p, mut n) = node();
        let e = n.observe(&p, 1, &xid(3, code));
        assert_eq!(actions(&e), vec![(Action::Ignore, Some(3))], "XID {code}");
        assert_eq!(n.observed(&p, 1), Observed::Healthy, "XID {code}");
        assert!(decision(&n, &p, 1).schedulable);
    }
}

#[test]
fn memory_faults_quarantine_the_gpu_until_a_reboot() {
    for code in [48, 63, 92, 94] {
        let (p, mut n) = node();
        let e = n.observe(&p, 1, &xid(2, code));
        assert_eq!(
            actions(&e),
            vec![(Action::QuarantineGpu, Some(2))],
            "XID {code}"
        );
        // Repeats change nothing more.
        assert!(n.observe(&p, 2, &xid(2, code)).is_empty());
        let d = decision(&n, &p, 2);
        assert!(d.schedulable, "the other GPUs still work");
        assert_eq!(d.usable, vec![0, 1, 3, 4, 5, 6, 7]);
        assert_eq!(d.evacuate_gpus, vec![2]);
        assert!(!d.evacuate);
        // Same boot: still out. New boot: back.
        n.observe(&p, 3, &hb("boot-1"));
        assert_eq!(decision(&n, &p, 3).usable.len(), 7);
        let e = n.observe(&p, 4, &hb("boot-2"));
        assert_eq!(e.len(), 1, "the recovery is recorded");
        assert_eq!(n.observed(&p, 4), Observed::Healthy, "XID {code}");
    }
}

#[test]
fn interconnect_and_bus_faults_drain_the_node_until_it_reboots() {
    for code in [74, 79, 95, 119, 120] {
        let (p, mut n) = node();
        let e = n.observe(&p, 10, &xid(0, code));
        assert_eq!(actions(&e), vec![(Action::DrainNode, None)], "XID {code}");
        let d = decision(&n, &p, 10);
        assert!(!d.schedulable && d.evacuate && !d.lost, "XID {code}: {d:?}");
        assert_eq!(n.observed(&p, 10).code(), "failed");
        n.observe(&p, 20, &hb("boot-2"));
        assert_eq!(n.observed(&p, 20), Observed::Healthy);
    }
}

#[test]
fn ecc_remap_nvlink_and_thermal_signals() {
    let (p, mut n) = node();
    // Single-bit errors below the limit: fine; at it: quarantine.
    assert!(n
        .observe(
            &p,
            1,
            &Signal::Ecc {
                gpu: 1,
                single_bit: 9_999,
                double_bit: 0
            }
        )
        .is_empty());
    let e = n.observe(
        &p,
        2,
        &Signal::Ecc {
            gpu: 1,
            single_bit: 10_000,
            double_bit: 0,
        },
    );
    assert_eq!(e[0].code, "single_bit_ecc_rate");
    // Any double-bit error: quarantine.
    let e = n.observe(
        &p,
        3,
        &Signal::Ecc {
            gpu: 4,
            single_bit: 0,
            double_bit: 1,
        },
    );
    assert_eq!(actions(&e), vec![(Action::QuarantineGpu, Some(4))]);
    // A pending remap: quarantine until reset.
    let e = n.observe(
        &p,
        4,
        &Signal::Remap {
            gpu: 5,
            pending: true,
            failed: false,
        },
    );
    assert_eq!(e[0].code, "remap_pending");
    assert_eq!(
        n.observed(&p, 4),
        Observed::Degraded {
            quarantined: vec![1, 4, 5],
            throttled: vec![]
        }
    );
    // Hot or throttling: no new work, but the work stays; cooling returns it.
    let e = n.observe(
        &p,
        5,
        &Signal::Thermal {
            gpu: 6,
            celsius: 91,
            throttled: false,
        },
    );
    assert_eq!(actions(&e), vec![(Action::Throttle, Some(6))]);
    let d = decision(&n, &p, 5);
    assert_eq!(d.usable, vec![0, 2, 3, 7]);
    assert_eq!(d.evacuate_gpus, vec![1, 4, 5]);
    n.observe(
        &p,
        6,
        &Signal::Thermal {
            gpu: 6,
            celsius: 70,
            throttled: false,
        },
    );
    n.observe(
        &p,
        6,
        &Signal::Thermal {
            gpu: 7,
            celsius: 70,
            throttled: true,
        },
    );
    assert_eq!(decision(&n, &p, 6).usable, vec![0, 2, 3, 6]);
    // NVLink errors past the limit: drain the node.
    let e = n.observe(
        &p,
        7,
        &Signal::Nvlink {
            gpu: 0,
            errors: 1_000,
        },
    );
    assert_eq!(actions(&e), vec![(Action::DrainNode, None)]);
    // A failed remap: repair, which a reboot does not clear.
    let (p, mut n) = node();
    let e = n.observe(
        &p,
        1,
        &Signal::Remap {
            gpu: 3,
            pending: false,
            failed: true,
        },
    );
    assert_eq!(actions(&e), vec![(Action::Repair, Some(3))]);
    n.observe(&p, 2, &hb("boot-2"));
    assert_eq!(n.observed(&p, 2).code(), "needs_repair");
    let e = n.observe(&p, 3, &xid(0, 64));
    assert!(e.is_empty(), "already out for repair");
    n.repaired();
    assert_eq!(n.observed(&p, 3), Observed::Healthy);
}

#[test]
fn an_unknown_xid_quarantines_by_default_and_the_policy_can_say_otherwise() {
    let (p, mut n) = node();
    let e = n.observe(&p, 1, &xid(0, 999));
    assert_eq!(actions(&e), vec![(Action::QuarantineGpu, Some(0))]);
    let p: HealthPolicy =
        toml::from_str("unknown_xid = \"ignore\"\napplication_xids = [13, 999]").unwrap();
    assert_eq!(p.xid_action(999), Action::Ignore);
    // 31 is in no list now, so it falls to `unknown_xid`; 48 keeps its default.
    assert_eq!(p.xid_action(31), Action::Ignore);
    assert_eq!(p.xid_action(48), Action::QuarantineGpu);
    assert!(toml::from_str::<HealthPolicy>("no_such_knob = 1").is_err());
}

#[test]
fn a_stale_heartbeat_makes_a_node_suspect_then_lost() {
    let (p, mut n) = node();
    assert_eq!(n.observed(&p, 14), Observed::Healthy);
    assert_eq!(n.observed(&p, 15), Observed::Suspect { silent_s: 15 });
    let d = decision(&n, &p, 15);
    assert!(!d.schedulable && !d.lost);
    assert_eq!(n.observed(&p, 120), Observed::Lost);
    assert!(decision(&n, &p, 120).lost);
    // It comes back.
    n.observe(&p, 130, &hb("boot-1"));
    assert_eq!(n.observed(&p, 130), Observed::Healthy);
    // Never heard from: suspect, not healthy.
    let fresh = NodeHealth::new(8);
    assert_eq!(fresh.observed(&p, 0).code(), "suspect");
}

#[test]
fn a_dead_node_is_lost_until_it_comes_back() {
    let (p, mut n) = node();
    n.observe(&p, 5, &Signal::NodeDown);
    let d = decision(&n, &p, 5);
    assert!(d.lost && !d.schedulable);
    n.observe(&p, 50, &hb("boot-2"));
    assert_eq!(n.observed(&p, 50), Observed::Healthy);
}

#[test]
fn flapping_is_damped() {
    // The agent's link flaps: silent past the suspect limit, back, three
    // times within the hour.
    let (p, mut n) = node();
    let mut t = 0;
    for _ in 0..3 {
        t += 30;
        n.tick(&p, t);
        assert_eq!(n.observed(&p, t).code(), "suspect");
        t += 1;
        n.observe(&p, t, &hb("boot-1"));
    }
    assert_eq!(n.observed(&p, t), Observed::Damped { until: t + 1_800 });
    assert!(!decision(&n, &p, t).schedulable);
    n.observe(&p, t + 1_800, &hb("boot-1"));
    assert_eq!(n.observed(&p, t + 1_800), Observed::Healthy);
    // Twice is not flapping; a third turn to bad of any kind (here a node
    // fault, then its reboot) is.
    let (p, mut n) = node();
    for at in [30u64, 100] {
        n.tick(&p, at);
        n.observe(&p, at + 1, &hb("boot-1"));
    }
    assert_eq!(n.observed(&p, 101), Observed::Healthy);
    n.observe(&p, 200, &xid(0, 79));
    n.observe(&p, 250, &hb("boot-2"));
    assert_eq!(n.observed(&p, 250), Observed::Damped { until: 2_050 });
}

#[test]
fn a_mass_silence_is_not_a_flap() {
    // Three control-plane outages within the hour: each time the region
    // excuses the silence (so many nodes went quiet at once). The node is
    // not held down when it is heard again, and an excuse is spent once.
    let (p, mut n) = node();
    let mut t = 0;
    for _ in 0..3 {
        t += 30;
        n.tick(&p, t);
        assert!(n.excuse_silence(&p, t));
        assert!(!n.excuse_silence(&p, t + 1), "one excuse per spell");
        t += 1;
        n.observe(&p, t, &hb("boot-1"));
        assert_eq!(n.observed(&p, t), Observed::Healthy);
    }
    // Its own silence still counts: three unexcused spells damp it.
    for _ in 0..3 {
        t += 30;
        n.tick(&p, t);
        t += 1;
        n.observe(&p, t, &hb("boot-1"));
    }
    assert_eq!(n.observed(&p, t), Observed::Damped { until: t + 1_800 });
    // Neither a healthy node nor one reported down is excused.
    let (p, mut n) = node();
    n.observe(&p, 1, &hb("boot-1"));
    assert!(!n.excuse_silence(&p, 2));
    n.observe(&p, 3, &Signal::NodeDown);
    assert!(!n.excuse_silence(&p, 40));
}

#[test]
fn a_fault_reported_again_is_one_failure() {
    let (p, mut n) = node();
    for t in 1..=5 {
        n.observe(&p, t, &xid(0, 79));
        n.observe(&p, t, &Signal::NodeDown);
    }
    assert_eq!(n.observed(&p, 5).code(), "lost", "down, not out for repair");
    n.observe(&p, 10, &hb("boot-2"));
    assert_eq!(n.observed(&p, 10), Observed::Healthy);
}

#[test]
fn a_node_that_keeps_failing_goes_out_for_repair() {
    let (p, mut n) = node();
    let mut repair = Vec::new();
    for (i, at) in [1_000u64, 20_000, 50_000].into_iter().enumerate() {
        let e = n.observe(&p, at, &xid(1, 79));
        repair.extend(e.into_iter().filter(|e| e.action == Action::Repair));
        n.observe(&p, at + 100, &hb(&format!("b{i}")));
    }
    assert_eq!(repair.len(), 1);
    assert_eq!(repair[0].code, "repeated_failures");
    assert_eq!(n.observed(&p, 60_000).code(), "needs_repair");
    // Failures a day apart do not add up.
    let (p, mut n) = node();
    for (i, at) in [0u64, 90_000, 180_000].into_iter().enumerate() {
        n.observe(&p, at, &xid(1, 79));
        n.observe(&p, at + 100, &hb(&format!("b{i}")));
    }
    n.observe(&p, 190_000, &hb("b2"));
    assert_eq!(n.observed(&p, 190_000), Observed::Healthy);
}

#[test]
fn operators_and_observations_combine_in_one_decision() {
    let healthy = Observed::Healthy;
    let degraded = Observed::Degraded {
        quarantined: vec![0],
        throttled: vec![1],
    };
    let failed = Observed::Failed {
        fault: Fault {
            code: "xid_79".into(),
            since: 0,
        },
    };
    let cases: Vec<(Admin, &Observed, bool, bool)> = vec![
        (Admin::Active, &healthy, true, false),
        (Admin::Active, &degraded, true, false),
        (Admin::Active, &failed, false, true),
        (
            Admin::Cordoned { reason: "x".into() },
            &healthy,
            false,
            false,
        ),
        (
            Admin::Draining {
                wait: false,
                deadline: 9,
            },
            &healthy,
            false,
            true,
        ),
        (
            Admin::Draining {
                wait: true,
                deadline: 9,
            },
            &healthy,
            false,
            false,
        ),
        (
            Admin::Maintenance { plan: "m1".into() },
            &healthy,
            false,
            true,
        ),
        (Admin::Repair { reason: "r".into() }, &degraded, false, true),
        (Admin::Cordoned { reason: "x".into() }, &failed, false, true),
    ];
    for (admin, observed, schedulable, evacuate) in cases {
        let d = decide(&admin, observed, 8);
        assert_eq!(d.schedulable, schedulable, "{admin:?} × {observed:?}");
        assert_eq!(d.evacuate, evacuate, "{admin:?} × {observed:?}");
        if !d.schedulable {
            assert!(d.usable.is_empty() && d.why.is_some());
        }
    }
    let d = decide(&Admin::Active, &degraded, 4);
    assert_eq!(d.usable, vec![2, 3]);
    assert_eq!(d.evacuate_gpus, vec![0]);
}

#[test]
fn node_health_round_trips_through_json_shapes() {
    let (p, mut n) = node();
    n.observe(&p, 1, &xid(2, 48));
    let s = serde_json_like(&n);
    assert!(s.contains("xid_48"), "{s}");
}

/// A tiny check that the state serializes (TOML, as the crate has no JSON).
fn serde_json_like(n: &NodeHealth) -> String {
    #[derive(Serialize)]
    struct Wrap<'a> {
        node: &'a NodeHealth,
    }
    toml::to_string(&Wrap { node: n }).unwrap_or_else(|e| format!("{e}"))
}

#[test]
fn rack_thermal_leaves_the_node_itself_alone() {
    // The region keeps the rack's nodes from new work; the node's own
    // health, state and usable GPUs do not change.
    let (p, mut n) = node();
    let before = n.clone();
    for throttled in [true, false] {
        let e = n.observe(&p, 1, &Signal::RackThermal { throttled });
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(n, before);
        assert!(decision(&n, &p, 1).schedulable);
    }
}

#[test]
fn widespread_silence_holds_losses_and_ordinary_silence_is_paced() {
    let p = HealthPolicy::default();
    // A rack of a 1,360-node region falls silent: a real failure, its
    // nodes are lost at the region's pace (1 % of it per tick, at least 8).
    assert_eq!(
        p.silence_verdict(17, 1_360),
        SilenceVerdict::Lose { at_most: 14 }
    );
    assert_eq!(
        p.silence_verdict(3, 12),
        SilenceVerdict::Lose { at_most: 8 }
    );
    // A quarter of the region at once: the control plane or the network,
    // not 340 machines. Nothing is declared lost while it lasts.
    assert_eq!(p.silence_verdict(340, 1_360), SilenceVerdict::Hold);
    assert_eq!(p.silence_verdict(1_360, 1_360), SilenceVerdict::Hold);
    // A small region whose only agent died is not a mass event: too few
    // nodes to tell a fault of ours from theirs, so they are lost.
    assert_eq!(p.silence_verdict(6, 6), SilenceVerdict::Lose { at_most: 8 });
    // Just under the threshold, and at it.
    assert_eq!(
        p.silence_verdict(339, 1_360),
        SilenceVerdict::Lose { at_most: 14 }
    );
    let strict = HealthPolicy {
        mass_silence_percent: 100,
        ..HealthPolicy::default()
    };
    assert_eq!(
        strict.silence_verdict(1_359, 1_360),
        SilenceVerdict::Lose { at_most: 14 }
    );
}

#[test]
fn silence_is_counted_from_the_last_heartbeat_and_not_for_a_dead_node() {
    let (p, mut n) = node();
    assert_eq!(n.silent_s(100), Some(100));
    n.observe(&p, 200, &Signal::NodeDown);
    assert_eq!(n.silent_s(300), None);
    let fresh = NodeHealth::new(8);
    assert_eq!(fresh.silent_s(5), None);
    // Held: silence past the lost limit reads as suspect; death does not.
    let (p, n) = node();
    assert_eq!(n.observed(&p, 500), Observed::Lost);
    assert_eq!(
        n.observed_holding_silence(&p, 500),
        Observed::Suspect { silent_s: 500 }
    );
    let (p, mut dead) = node();
    dead.observe(&p, 1, &Signal::NodeDown);
    assert_eq!(dead.observed_holding_silence(&p, 500), Observed::Lost);
}

#[test]
fn a_healthy_nodes_record_is_small_and_every_record_reads_back_the_same() {
    let (p, mut n) = node();
    let healthy = serde_json::to_string(&n).unwrap();
    // What a region rewrites on every heartbeat: no defaults spelled out.
    assert!(healthy.len() < 120, "{} bytes: {healthy}", healthy.len());
    assert_eq!(serde_json::from_str::<NodeHealth>(&healthy).unwrap(), n);
    // With something to remember: a quarantined GPU, a flap, a fault.
    n.observe(&p, 5, &xid(2, 48));
    n.observe(&p, 6, &xid(0, 79));
    let troubled = serde_json::to_string(&n).unwrap();
    assert_eq!(serde_json::from_str::<NodeHealth>(&troubled).unwrap(), n);
    assert_ne!(troubled, healthy);
    // Records written before defaults were left out still read.
    let old = r#"{"down": false, "gpus": [{"hot": false, "broken": null, "quarantined": null}],
        "fault": null, "repair": null, "boot_id": "b", "was_bad": false, "failures": [],
        "turned_bad": [], "damped_until": null, "last_heartbeat": 7}"#;
    let mut expected = NodeHealth::new(1);
    expected.observe(&p, 7, &hb("b"));
    assert_eq!(serde_json::from_str::<NodeHealth>(old).unwrap(), expected);
}
