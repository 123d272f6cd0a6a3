//! The wave limits hold at every moment of a plan, and every plan finishes.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;

fn node(id: &str, leaf: &str, jobs: &[(&str, u32)]) -> Node {
    Node {
        id: id.into(),
        leaf: leaf.into(),
        step: Some(Step::Pending),
        unavailable: false,
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
    };
    assert_eq!(next_wave(&nodes, limits).start.len(), 2);
    nodes[19].unavailable = true;
    nodes[19].step = None;
    let wave = next_wave(&nodes, limits);
    assert_eq!(wave.start.len(), 1);
    nodes[18].unavailable = true;
    let wave = next_wave(&nodes, limits);
    assert!(wave.start.is_empty());
    assert_eq!(wave.held, Some(Held::RegionCap { out: 2, cap: 2 }));
}

/// A region: leaves of nodes, gangs across nodes, some nodes unavailable.
fn region() -> impl Strategy<Value = (Vec<Node>, WaveLimits)> {
    (
        1usize..6,
        1usize..6,
        prop::collection::vec((0usize..36, 0usize..36, 1u32..9), 0..12),
        1u32..3,
        1u32..60,
        prop::collection::vec(0usize..36, 0..3),
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
            for d in down {
                nodes[d % n].unavailable = true;
            }
            (
                nodes,
                WaveLimits {
                    per_leaf: k,
                    region_percent: m,
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
    let unavailable = nodes.iter().filter(|n| n.unavailable).count() as u32;
    let total = unavailable + out.iter().filter(|n| !n.unavailable).count() as u32;
    prop_assert!(
        total <= cap.max(unavailable),
        "{} nodes out, cap {}",
        total,
        cap
    );
    let mut per_leaf: BTreeMap<&str, u32> = BTreeMap::new();
    let mut gangs: BTreeSet<&str> = BTreeSet::new();
    for n in &out {
        if !n.unavailable {
            *per_leaf.entry(&n.leaf).or_insert(0) += 1;
        }
        if n.unavailable {
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
        let mut rounds = 0;
        let cap = region_cap(nodes.len(), limits.region_percent);
        let stuck = nodes.iter().filter(|n| n.unavailable).count() as u32 >= cap;
        loop {
            rounds += 1;
            prop_assert!(rounds < 10_000, "the plan never finished");
            let wave = next_wave(&nodes, limits);
            for id in &wave.start {
                let n = nodes.iter_mut().find(|n| n.id == *id).expect("a node of the plan");
                prop_assert_eq!(n.step, Some(Step::Pending));
                n.step = Some(Step::Draining);
            }
            check(&nodes, limits)?;
            // Some nodes out make progress; a drained node's jobs leave it
            // (their gangs go on elsewhere, on a spare).
            for n in nodes.iter_mut() {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                if (rng >> 33) % 3 != 0 {
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
                .filter(|n| !n.unavailable && n.step != Some(Step::Done))
                .count();
            if left == 0 {
                break;
            }
            if stuck && wave.start.is_empty() && !nodes.iter().any(|n| n.step.is_some_and(Step::is_out)) {
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
