//! The wave limits hold at every moment of a plan, every plan finishes, and
//! nodes out of service at their turn are skipped (lasting) or waited for
//! a while (passing), never stalling the plan.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;

fn node(id: &str, leaf: &str, jobs: &[(&str, u32)]) -> Node {
    Node {
        id: id.into(),
        leaf: leaf.into(),
        step: Some(Step::Pending),
        outage: None,
        waited_s: None,
        jobs: jobs.iter().map(|(j, g)| (j.to_string(), *g)).collect(),
        moving: Vec::new(),
    }
}

#[test]
fn idle_nodes_go_first_one_per_leaf() {
    let nodes = vec![
        node("a0", "a", &[("g", 8)]),
        node("a1", "a", &[]),
        node("b0", "b", &[("x", 2)]),
        node("b1", "b", &[("y", 8)]),
        node("c0", "c", &[("g", 8)]),
    ];
    let limits = WaveLimits {
        per_leaf: 1,
        region_percent: 100,
        ..WaveLimits::default()
    };
    let wave = next_wave(&nodes, limits);
    // a1 (idle), b0 (2 GPUs), c0 (8 GPUs of gang g); a0 shares leaf a.
    assert_eq!(wave.start, vec!["a1", "b0", "c0"]);
    assert_eq!(wave.held, Some(Held::LeafCap));
}

#[test]
fn a_running_gang_loses_one_node_at_a_time_unless_it_moves() {
    let mut nodes = vec![node("a0", "a", &[("g", 8)]), node("b0", "b", &[("g", 8)])];
    let limits = WaveLimits {
        per_leaf: 2,
        region_percent: 100,
        ..WaveLimits::default()
    };
    let wave = next_wave(&nodes, limits);
    assert_eq!(wave.start, vec!["a0"]);
    assert_eq!(wave.held, Some(Held::GangOnNodeOut { job: "g".into() }));
    // Moved whole anyway: both at once.
    for n in &mut nodes {
        n.moving = vec!["g".into()];
    }
    assert_eq!(next_wave(&nodes, limits).start, vec!["a0", "b0"]);
}

#[test]
fn nodes_out_for_other_reasons_count_against_the_region_cap() {
    let mut nodes: Vec<Node> = (0..20)
        .map(|i| node(&format!("n{i:02}"), &format!("l{i}"), &[]))
        .collect();
    let limits = WaveLimits {
        per_leaf: 1,
        region_percent: 10,
        ..WaveLimits::default()
    };
    assert_eq!(next_wave(&nodes, limits).start.len(), 2);
    nodes[19].outage = Some(Outage::lasting("node lost"));
    nodes[19].step = None;
    let wave = next_wave(&nodes, limits);
    assert_eq!(wave.start.len(), 1);
    nodes[18].outage = Some(Outage::lasting("in repair: fan"));
    let wave = next_wave(&nodes, limits);
    assert!(wave.start.is_empty());
    assert_eq!(wave.held, Some(Held::RegionCap { out: 2, cap: 2 }));
    // n18, of the plan, is out for good at its turn: skipped (it still
    // counts against the cap, so nothing else starts in its place).
    assert_eq!(
        wave.skip,
        vec![Skip {
            node: "n18".into(),
            reason: "in repair: fan".into()
        }]
    );
}

/// Plays `wave` onto `nodes`: started nodes drain, skipped ones are skipped.
fn play(nodes: &mut [Node], wave: &Wave) {
    for n in nodes.iter_mut() {
        if wave.start.contains(&n.id) {
            n.step = Some(Step::Draining);
        }
        if wave.skip.iter().any(|s| s.node == n.id) {
            n.step = Some(Step::Skipped);
        }
    }
}

#[test]
fn a_node_lost_before_its_turn_is_skipped_when_its_turn_comes() {
    // One leaf, one node at a time; a1 is lost, a2 cordoned by an operator.
    let mut nodes = vec![
        node("a0", "a", &[]),
        node("a1", "a", &[]),
        node("a2", "a", &[]),
    ];
    nodes[1].outage = Outage::of(&Admin::Active, None, &Observed::Lost);
    nodes[2].outage = Outage::of(
        &Admin::Cordoned {
            reason: "fan".into(),
        },
        Some("fan"),
        &Observed::Healthy,
    );
    let limits = WaveLimits {
        per_leaf: 1,
        region_percent: 100,
        ..WaveLimits::default()
    };
    // a0 first; the others' turn has not come (the leaf is full): they
    // stay pending (a cordon may be over by then).
    let wave = next_wave(&nodes, limits);
    assert_eq!(wave.start, vec!["a0"]);
    assert!(wave.skip.is_empty(), "{wave:?}");
    play(&mut nodes, &wave);
    assert!(next_wave(&nodes, limits).skip.is_empty());
    // a0 done: both their turns come, and both are out for good.
    nodes[0].step = Some(Step::Done);
    let wave = next_wave(&nodes, limits);
    assert!(wave.start.is_empty());
    assert_eq!(
        wave.skip,
        vec![
            Skip {
                node: "a1".into(),
                reason: "node lost: its agent is gone or the node is down".into()
            },
            Skip {
                node: "a2".into(),
                reason: "cordoned by an operator: fan".into()
            },
        ]
    );
    assert_eq!(wave.held, None);
    play(&mut nodes, &wave);
    assert!(nodes.iter().all(|n| n.step.is_some_and(Step::is_finished)));
    let p = progress(&nodes);
    assert_eq!((p[&Step::Done], p[&Step::Skipped]), (1, 2));
    // Nothing more to do.
    assert_eq!(next_wave(&nodes, limits), Wave::default());
}

#[test]
fn a_node_back_before_its_turn_is_rebooted_as_usual() {
    let mut nodes = vec![node("a0", "a", &[]), node("a1", "a", &[])];
    nodes[1].outage = Some(Outage::lasting("cordoned by an operator: fan"));
    let limits = WaveLimits {
        per_leaf: 1,
        region_percent: 100,
        ..WaveLimits::default()
    };
    let wave = next_wave(&nodes, limits);
    assert_eq!(wave.start, vec!["a0"]);
    play(&mut nodes, &wave);
    // Uncordoned while a0 reboots: taken when its turn comes.
    nodes[1].outage = None;
    nodes[0].step = Some(Step::Done);
    let wave = next_wave(&nodes, limits);
    assert_eq!(wave.start, vec!["a1"]);
    assert!(wave.skip.is_empty());
}

#[test]
fn a_suspect_node_is_waited_for_then_skipped_but_never_at_once() {
    let mut nodes = vec![node("b0", "b", &[]), node("b1", "b", &[])];
    nodes[0].outage = Outage::of(&Admin::Active, None, &Observed::Suspect { silent_s: 20 });
    assert!(!nodes[0].outage.as_ref().unwrap().lasting);
    let limits = WaveLimits {
        per_leaf: 2,
        region_percent: 100,
        skip_after_s: 600,
    };
    // Its turn comes with b1's: b1 starts, b0 is waited for.
    let wave = next_wave(&nodes, limits);
    assert_eq!(wave.start, vec!["b1"]);
    assert!(wave.skip.is_empty());
    assert_eq!(wave.waiting, vec!["b0"]);
    play(&mut nodes, &wave);
    nodes[1].step = Some(Step::Done);
    // The plan has nothing else left: it waits, and says for what.
    nodes[0].waited_s = Some(30);
    let wave = next_wave(&nodes, limits);
    assert!(wave.start.is_empty() && wave.skip.is_empty());
    assert_eq!(
        wave.held,
        Some(Held::NodeOut {
            node: "b0".into(),
            reason: "suspect: its agent silent for 20 s".into(),
            waited_s: 30,
            skip_after_s: 600,
        })
    );
    // Back in service: taken as usual.
    let mut back = nodes.clone();
    back[0].outage = None;
    back[0].waited_s = None;
    assert_eq!(next_wave(&back, limits).start, vec!["b0"]);
    // Still out after the grace: skipped, and the plan can finish.
    nodes[0].waited_s = Some(600);
    let wave = next_wave(&nodes, limits);
    assert_eq!(wave.skip.len(), 1);
    assert_eq!(wave.skip[0].node, "b0");
    assert!(
        wave.skip[0].reason.starts_with("suspect: its agent silent")
            && wave.skip[0].reason.contains("600 s"),
        "{wave:?}"
    );
    assert_eq!(wave.held, None);
}

#[test]
fn outages_say_why_and_whether_they_last() {
    let fault = crate::Fault {
        code: "xid_79".into(),
        since: 0,
    };
    let healthy = Observed::Healthy;
    let degraded = Observed::Degraded {
        quarantined: vec![1],
        throttled: vec![],
    };
    assert_eq!(Outage::of(&Admin::Active, None, &healthy), None);
    assert_eq!(Outage::of(&Admin::Active, None, &degraded), None);
    let cases: Vec<(Admin, Option<&str>, Observed, bool, &str)> = vec![
        (
            Admin::Cordoned {
                reason: "fan".into(),
            },
            Some("fan"),
            healthy.clone(),
            true,
            "cordoned by an operator: fan",
        ),
        (
            Admin::Cordoned {
                reason: String::new(),
            },
            None,
            healthy.clone(),
            true,
            "cordoned by an operator",
        ),
        (
            Admin::Draining {
                wait: false,
                deadline: 9,
            },
            Some("firmware"),
            healthy.clone(),
            true,
            "drained by an operator: firmware",
        ),
        (
            Admin::Repair {
                reason: "replaced by spare n9".into(),
            },
            None,
            healthy.clone(),
            true,
            "in repair: replaced by spare n9",
        ),
        (
            Admin::Active,
            None,
            Observed::Lost,
            true,
            "node lost: its agent is gone or the node is down",
        ),
        (
            Admin::Active,
            None,
            Observed::Failed {
                fault: fault.clone(),
            },
            true,
            "node failed (xid_79): waiting for a reboot and a healthy report",
        ),
        (
            Admin::Active,
            None,
            Observed::NeedsRepair {
                fault: fault.clone(),
            },
            true,
            "needs repair (xid_79)",
        ),
        (
            Admin::Active,
            None,
            Observed::Suspect { silent_s: 5 },
            false,
            "suspect: its agent silent for 5 s",
        ),
        (
            Admin::Active,
            None,
            Observed::Damped { until: 100 },
            false,
            "flapping: held down until t=100s",
        ),
        (
            Admin::Cordoned {
                reason: "fan".into(),
            },
            Some("fan"),
            Observed::Suspect { silent_s: 5 },
            true,
            "cordoned by an operator: fan; suspect: its agent silent for 5 s",
        ),
    ];
    for (admin, reason, observed, lasting, why) in cases {
        let o = Outage::of(&admin, reason, &observed).expect("out of service");
        assert_eq!(
            (o.lasting, o.reason.as_str()),
            (lasting, why),
            "{admin:?} {observed:?}"
        );
    }
}

/// A region: leaves of nodes, gangs across nodes, some nodes unavailable.
fn region() -> impl Strategy<Value = (Vec<Node>, WaveLimits)> {
    (
        1usize..6,
        1usize..6,
        prop::collection::vec((0usize..36, 0usize..36, 1u32..9), 0..12),
        1u32..3,
        1u32..60,
        prop::collection::vec((0usize..36, any::<bool>()), 0..3),
    )
        .prop_map(|(leaves, per_leaf, gangs, k, m, down)| {
            let mut nodes: Vec<Node> = Vec::new();
            for l in 0..leaves {
                for i in 0..per_leaf {
                    nodes.push(node(&format!("l{l}-n{i}"), &format!("l{l}"), &[]));
                }
            }
            let n = nodes.len();
            for (g, (a, b, gpus)) in gangs.into_iter().enumerate() {
                for at in [a % n, b % n] {
                    if !nodes[at].jobs.iter().any(|(j, _)| *j == format!("g{g}")) {
                        nodes[at].jobs.push((format!("g{g}"), gpus));
                    }
                }
            }
            for (d, lasting) in down {
                nodes[d % n].outage = Some(if lasting {
                    Outage::lasting("node lost")
                } else {
                    Outage::passing("suspect")
                });
            }
            (
                nodes,
                WaveLimits {
                    per_leaf: k,
                    region_percent: m,
                    skip_after_s: 300,
                },
            )
        })
}

fn check(nodes: &[Node], limits: WaveLimits) -> Result<(), TestCaseError> {
    let cap = region_cap(nodes.len(), limits.region_percent);
    let out: Vec<&Node> = nodes
        .iter()
        .filter(|n| n.step.is_some_and(Step::is_out))
        .collect();
    let unavailable = nodes.iter().filter(|n| n.unavailable()).count() as u32;
    let total = unavailable + out.iter().filter(|n| !n.unavailable()).count() as u32;
    prop_assert!(
        total <= cap.max(unavailable),
        "{} nodes out, cap {}",
        total,
        cap
    );
    let mut per_leaf: BTreeMap<&str, u32> = BTreeMap::new();
    let mut gangs: BTreeSet<&str> = BTreeSet::new();
    for n in &out {
        if !n.unavailable() {
            *per_leaf.entry(&n.leaf).or_insert(0) += 1;
        }
        if n.unavailable() {
            continue;
        }
        for (j, _) in &n.jobs {
            prop_assert!(gangs.insert(j), "gang {} has two nodes out", j);
        }
    }
    for (leaf, k) in per_leaf {
        prop_assert!(k <= limits.per_leaf, "leaf {} has {} out", leaf, k);
    }
    Ok(())
}

proptest! {
    #[test]
    fn waves_keep_the_limits_and_every_plan_finishes((mut nodes, limits) in region(), seed in any::<u64>()) {
        let mut rng = seed;
        let mut next = move || {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            rng >> 33
        };
        let mut rounds = 0;
        let cap = region_cap(nodes.len(), limits.region_percent);
        loop {
            rounds += 1;
            prop_assert!(rounds < 10_000, "the plan never finished");
            let wave = next_wave(&nodes, limits);
            for id in &wave.start {
                let n = nodes.iter_mut().find(|n| n.id == *id).expect("a node of the plan");
                prop_assert_eq!(n.step, Some(Step::Pending));
                prop_assert!(!n.unavailable());
                n.step = Some(Step::Draining);
            }
            // Only nodes out at their turn are skipped: out for good, or
            // out for a passing reason for the whole grace.
            for s in &wave.skip {
                let n = nodes.iter_mut().find(|n| n.id == s.node).expect("a node of the plan");
                prop_assert_eq!(n.step, Some(Step::Pending));
                let outage = n.outage.as_ref().expect("skipped while in service");
                prop_assert!(
                    outage.lasting || n.waited_s.unwrap_or(0) >= limits.skip_after_s,
                    "{} skipped after {:?} s", n.id, n.waited_s
                );
                prop_assert!(s.reason.starts_with(&outage.reason));
                n.step = Some(Step::Skipped);
            }
            for id in &wave.waiting {
                let n = nodes.iter_mut().find(|n| n.id == *id).expect("a node of the plan");
                prop_assert!(n.outage.as_ref().is_some_and(|o| !o.lasting));
                n.waited_s.get_or_insert(0);
            }
            check(&nodes, limits)?;
            // Some nodes out make progress; a drained node's jobs leave it
            // (their gangs go on elsewhere, on a spare). Time passes for
            // nodes waited for; some passing outages end.
            for n in nodes.iter_mut() {
                if let Some(w) = n.waited_s.as_mut() {
                    *w += 60;
                }
                if n.outage.as_ref().is_some_and(|o| !o.lasting) && next() % 7 == 0 {
                    n.outage = None;
                    n.waited_s = None;
                }
                if next() % 3 != 0 {
                    continue;
                }
                n.step = match n.step {
                    Some(Step::Draining) => {
                        n.jobs.clear();
                        Some(Step::Rebooting)
                    }
                    Some(Step::Rebooting) => Some(Step::Checking),
                    Some(Step::Checking) => Some(Step::Done),
                    other => other,
                };
            }
            check(&nodes, limits)?;
            let left = nodes
                .iter()
                .filter(|n| !n.step.is_some_and(Step::is_finished))
                .count();
            if left == 0 {
                break;
            }
            let stuck = nodes.iter().filter(|n| n.unavailable()).count() as u32 >= cap;
            let idle = wave.start.is_empty() && wave.skip.is_empty() && wave.waiting.is_empty();
            if stuck && idle && !nodes.iter().any(|n| n.step.is_some_and(Step::is_out)) {
                // Other outages use up the cap: the plan waits, and says so.
                let capped = matches!(wave.held, Some(Held::RegionCap { .. }));
                prop_assert!(capped, "held: {:?}", wave.held);
                break;
            }
        }
    }
}

#[test]
fn progress_counts_nodes_per_step() {
    let mut nodes = vec![
        node("a", "l", &[]),
        node("b", "l", &[]),
        node("c", "l", &[]),
    ];
    nodes[0].step = Some(Step::Done);
    nodes[1].step = Some(Step::Rebooting);
    let p = progress(&nodes);
    assert_eq!(p[&Step::Done], 1);
    assert_eq!(p[&Step::Rebooting], 1);
    assert_eq!(p[&Step::Pending], 1);
}

#[test]
fn waves_stay_wide_to_the_end() {
    // Leaf z has 6 nodes, b, c and d two each; one node per leaf, two in
    // all, at once. Taking the leaves with the most left first finishes in
    // 6 waves (12 nodes, 2 per wave); by id alone b, c and d would go
    // first and leave z's last four nodes to go one at a time (8 waves).
    let mut nodes: Vec<Node> = Vec::new();
    for leaf in ["b", "c", "d"] {
        for i in 0..2 {
            nodes.push(node(&format!("{leaf}{i}"), leaf, &[]));
        }
    }
    nodes.extend((0..6).map(|i| node(&format!("z{i}"), "z", &[])));
    let limits = WaveLimits {
        per_leaf: 1,
        region_percent: 17,
        ..WaveLimits::default()
    };
    assert_eq!(region_cap(nodes.len(), 17), 2);
    let mut waves = 0;
    while nodes.iter().any(|n| n.step == Some(Step::Pending)) {
        let wave = next_wave(&nodes, limits);
        assert_eq!(wave.start.len().min(2), wave.start.len());
        assert!(!wave.start.is_empty());
        waves += 1;
        for n in nodes.iter_mut() {
            if wave.start.contains(&n.id) {
                n.step = Some(Step::Done);
            }
        }
    }
    assert_eq!(waves, 6);
}
