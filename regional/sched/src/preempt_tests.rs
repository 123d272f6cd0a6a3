//! Worked examples of fair sharing and preemption (Gangway's discipline).

use std::collections::BTreeMap;

use super::tests::*;
use crate::types::*;
use crate::{apply, plan};

const NOW: u64 = 10_000;

/// One leaf-local fleet of `nodes` 8-GPU h100 nodes per leaf, 2 leaves.
fn two_leaves(nodes: u32) -> Vec<Node> {
    fleet("h100", 1, 2, nodes, 8, false)
}

/// A running unit of `tenant` at `priority` holding `gpus` on `node`,
/// started at `started` with a checkpoint at `checkpointed`.
fn holder(
    job: &str,
    tenant: &str,
    priority: i32,
    node: &str,
    gpus: Vec<u32>,
    started: u64,
    checkpointed: Option<u64>,
) -> Running {
    Running {
        job: job.into(),
        tenant: tenant.into(),
        gpu_type: "h100".into(),
        priority,
        gpus: vec![(node.into(), gpus)],
        expected_end: u64::MAX,
        started,
        checkpointed,
        ..Default::default()
    }
}

/// Takes the running units' GPUs off the nodes' free lists and counts
/// them in usage.
fn occupy(s: &mut Snapshot, units: Vec<Running>) {
    for r in &units {
        for (node, gpus) in &r.gpus {
            let n = s.nodes.iter_mut().find(|n| n.id == *node).expect("node");
            n.free.retain(|g| !gpus.contains(g));
        }
        *s.usage
            .entry((r.tenant.clone(), r.gpu_type.clone()))
            .or_insert(0) += r.gpu_count() as u32;
    }
    s.running.extend(units);
}

fn unit(job: &str, tenant: &str, priority: i32, workers: u32, gpw: u32, seq: u64) -> Request {
    Request {
        tenant: tenant.into(),
        priority,
        seq,
        ..req(job, workers, gpw, Level::Region)
    }
}

fn full(node: &str) -> Vec<u32> {
    let _ = node;
    (0..8).collect()
}

fn victims(p: &Plan) -> Vec<(&str, &str, PreemptCause)> {
    p.preemptions
        .iter()
        .map(|v| (v.job.as_str(), v.for_job.as_str(), v.cause))
        .collect()
}

fn at_now(nodes: Vec<Node>, queue: Vec<Request>) -> Snapshot {
    Snapshot {
        now: NOW,
        ..snap(nodes, queue)
    }
}

#[test]
fn a_normal_job_preempts_a_low_priority_one_and_waits_for_it() {
    let mut s = at_now(
        fleet("h100", 1, 1, 1, 8, false),
        vec![unit("n", "acme", 1, 1, 8, 1)],
    );
    let node = s.nodes[0].id.clone();
    occupy(
        &mut s,
        vec![holder(
            "low",
            "globex",
            0,
            &node,
            full(&node),
            0,
            Some(NOW - 60),
        )],
    );
    let p = plan(&s, &Policy::default());
    assert!(p.placements.is_empty());
    assert_eq!(victims(&p), vec![("low", "n", PreemptCause::Priority)]);
    assert_eq!(p.preemptions[0].at_risk_gpu_s, 60 * 8);
    assert_eq!(p.preemptions[0].gpus, 8);
    let reason = reason_of(&p, "n");
    assert_eq!(reason.code(), "waiting_for_preemption");
    assert_eq!(
        *reason,
        WaitReason::Preempting {
            victims: vec!["low".into()],
            until: NOW + 120
        }
    );
    assert!(reason.to_string().contains("checkpoint"), "{reason}");

    // The next pass, with the victim on its way out: no more victims, the
    // same wait, and nothing else takes the GPUs meanwhile.
    s.running[0].preempted_for = Some("n".into());
    let again = plan(&s, &Policy::default());
    assert!(again.preemptions.is_empty());
    assert_eq!(reason_of(&again, "n").code(), "waiting_for_preemption");
    // Asked 100 s ago: expected gone 20 s from now, and that holds still.
    s.running[0].preempted_at = Some(NOW - 100);
    let again = plan(&s, &Policy::default());
    assert_eq!(
        *reason_of(&again, "n"),
        WaitReason::Preempting {
            victims: vec!["low".into()],
            until: NOW + 20
        }
    );
    // Past its deadline and still there: expected any moment.
    s.running[0].preempted_at = Some(NOW - 500);
    let again = plan(&s, &Policy::default());
    assert!(
        matches!(reason_of(&again, "n"), WaitReason::Preempting { until, .. } if *until == NOW)
    );
}

#[test]
fn only_the_low_class_is_preempted_for_priority() {
    let mut s = at_now(
        fleet("h100", 1, 1, 1, 8, false),
        vec![unit("h", "acme", 2, 1, 8, 1)],
    );
    let node = s.nodes[0].id.clone();
    occupy(
        &mut s,
        vec![holder("normal", "globex", 1, &node, full(&node), 0, None)],
    );
    let p = plan(&s, &Policy::default());
    assert!(p.preemptions.is_empty());
    assert_eq!(reason_of(&p, "h").code(), "no_capacity");
    // And low never preempts low.
    let mut s = at_now(
        fleet("h100", 1, 1, 1, 8, false),
        vec![unit("l", "acme", 0, 1, 8, 1)],
    );
    occupy(
        &mut s,
        vec![holder("low", "globex", 0, &node, full(&node), 0, None)],
    );
    assert!(plan(&s, &Policy::default()).preemptions.is_empty());
}

#[test]
fn a_young_run_is_not_preempted_before_its_minimum_run_time() {
    let mut s = at_now(
        fleet("h100", 1, 1, 1, 8, false),
        vec![unit("n", "acme", 1, 1, 8, 1)],
    );
    let node = s.nodes[0].id.clone();
    occupy(
        &mut s,
        vec![holder(
            "low",
            "globex",
            0,
            &node,
            full(&node),
            NOW - 599,
            None,
        )],
    );
    assert!(plan(&s, &Policy::default()).preemptions.is_empty());
    s.running[0].started = NOW - 600;
    assert_eq!(plan(&s, &Policy::default()).preemptions.len(), 1);
}

#[test]
fn a_job_preempted_too_often_is_left_alone() {
    let mut s = at_now(
        fleet("h100", 1, 1, 1, 8, false),
        vec![unit("n", "acme", 1, 1, 8, 1)],
    );
    let node = s.nodes[0].id.clone();
    let mut low = holder("low", "globex", 0, &node, full(&node), 0, None);
    low.preemptions = 3;
    occupy(&mut s, vec![low]);
    assert!(plan(&s, &Policy::default()).preemptions.is_empty());
    s.running[0].preemptions = 2;
    assert_eq!(plan(&s, &Policy::default()).preemptions.len(), 1);
}

#[test]
fn the_victim_that_loses_least_work_is_chosen() {
    let mut s = at_now(
        fleet("h100", 1, 1, 2, 8, false),
        vec![unit("n", "acme", 1, 1, 8, 1)],
    );
    let (a, b) = (s.nodes[0].id.clone(), s.nodes[1].id.clone());
    occupy(
        &mut s,
        vec![
            holder("stale", "globex", 0, &a, full(&a), 0, Some(NOW - 3000)),
            holder("fresh", "globex", 0, &b, full(&b), 0, Some(NOW - 30)),
        ],
    );
    let p = plan(&s, &Policy::default());
    assert_eq!(victims(&p), vec![("fresh", "n", PreemptCause::Priority)]);
}

#[test]
fn victims_whose_gpus_form_a_tight_block_win_over_cheaper_scattered_ones() {
    // A 2-node gang that prefers one leaf. Leaf 0: two nodes held by
    // costly low units; leaf 1: one node held by a cheap low unit and one
    // by a normal unit; so the cheap pair is scattered across leaves.
    let mut s = at_now(two_leaves(2), vec![]);
    let ids: Vec<String> = s.nodes.iter().map(|n| n.id.clone()).collect();
    occupy(
        &mut s,
        vec![
            holder("l0a", "globex", 0, &ids[0], full(""), 0, Some(NOW - 1000)),
            holder("l0b", "globex", 0, &ids[1], full(""), 0, Some(NOW - 1000)),
            holder("l1a", "globex", 0, &ids[2], full(""), 0, Some(NOW - 10)),
            holder("l1b", "globex", 1, &ids[3], full(""), 0, None),
        ],
    );
    let mut gang = unit("g", "acme", 1, 2, 8, 1);
    gang.preferred = Level::Leaf;
    s.queue.push(gang);
    let p = plan(&s, &Policy::default());
    let mut v: Vec<&str> = p.preemptions.iter().map(|v| v.job.as_str()).collect();
    v.sort();
    assert_eq!(v, vec!["l0a", "l0b"], "{:?}", p.preemptions);

    // Preferring any placement, the cheaper scattered pair... is not
    // possible here (l1b is normal): one cheap low unit plus one costly
    // low unit, the least work at risk.
    s.queue[0].preferred = Level::Region;
    let p = plan(&s, &Policy::default());
    let mut v: Vec<&str> = p.preemptions.iter().map(|v| v.job.as_str()).collect();
    v.sort();
    assert_eq!(v, vec!["l0a", "l1a"], "{:?}", p.preemptions);
}

#[test]
fn one_victim_is_preferred_to_several_with_the_same_work_at_risk() {
    let mut s = at_now(
        fleet("h100", 1, 1, 2, 8, false),
        vec![unit("n", "acme", 1, 1, 8, 1)],
    );
    let (a, b) = (s.nodes[0].id.clone(), s.nodes[1].id.clone());
    occupy(
        &mut s,
        vec![
            holder(
                "small0",
                "globex",
                0,
                &a,
                vec![0, 1, 2, 3],
                0,
                Some(NOW - 100),
            ),
            holder(
                "small1",
                "globex",
                0,
                &a,
                vec![4, 5, 6, 7],
                0,
                Some(NOW - 100),
            ),
            holder("big", "globex", 0, &b, full(""), 0, Some(NOW - 100)),
        ],
    );
    let p = plan(&s, &Policy::default());
    assert_eq!(victims(&p), vec![("big", "n", PreemptCause::Priority)]);
}

#[test]
fn only_as_many_victims_as_needed() {
    // 4 GPUs needed; the node has 2 free and three 2-GPU low units.
    let mut s = at_now(
        fleet("h100", 1, 1, 1, 8, false),
        vec![unit("n", "acme", 1, 1, 4, 1)],
    );
    let a = s.nodes[0].id.clone();
    occupy(
        &mut s,
        vec![
            holder("x", "globex", 0, &a, vec![0, 1], 0, Some(NOW - 300)),
            holder("y", "globex", 0, &a, vec![2, 3], 0, Some(NOW - 100)),
            holder("z", "globex", 0, &a, vec![4, 5], 0, Some(NOW - 200)),
        ],
    );
    let p = plan(&s, &Policy::default());
    assert_eq!(victims(&p), vec![("y", "n", PreemptCause::Priority)]);
}

fn guarantee(s: &mut Snapshot, tenant: &str, gpus: u32) {
    s.shares.insert(
        (tenant.into(), "h100".into()),
        Share {
            guaranteed: gpus,
            ..Share::default()
        },
    );
}

#[test]
fn a_tenant_under_its_guarantee_reclaims_lent_capacity() {
    // acme is guaranteed 8 and holds nothing; globex (guaranteed 8) borrows
    // the whole 16-GPU fleet with two normal-priority units.
    let mut s = at_now(
        fleet("h100", 1, 1, 2, 8, false),
        vec![unit("a", "acme", 1, 1, 8, 5)],
    );
    let (x, y) = (s.nodes[0].id.clone(), s.nodes[1].id.clone());
    guarantee(&mut s, "acme", 8);
    guarantee(&mut s, "globex", 8);
    occupy(
        &mut s,
        vec![
            holder("g1", "globex", 1, &x, full(""), 0, Some(NOW - 50)),
            holder("g2", "globex", 1, &y, full(""), 0, Some(NOW - 500)),
        ],
    );
    let p = plan(&s, &Policy::default());
    assert_eq!(victims(&p), vec![("g1", "a", PreemptCause::Reclaim)]);

    // Once globex is back at its guarantee, nothing more is taken from it.
    let mut s2 = s.clone();
    s2.running.remove(0);
    s2.nodes[0].free = (0..8).collect();
    s2.usage.insert(("globex".into(), "h100".into()), 8);
    s2.queue = vec![
        unit("a1", "acme", 1, 1, 8, 5),
        unit("a2", "acme", 1, 1, 8, 6),
    ];
    let p = plan(&s2, &Policy::default());
    assert_eq!(p.placements.len(), 1);
    assert!(p.preemptions.is_empty(), "{:?}", p.preemptions);

    // Beyond its own guarantee a tenant does not reclaim: 16 > 8.
    let mut s3 = s.clone();
    s3.queue = vec![unit("big", "acme", 1, 2, 8, 5)];
    assert!(plan(&s3, &Policy::default()).preemptions.is_empty());
}

/// One 8-GPU node, all of it held by `job` of `tenant` at `priority`,
/// started at `started` after `preemptions` earlier preemptions.
fn one_node_held_by(
    job: &str,
    tenant: &str,
    priority: i32,
    started: u64,
    preemptions: u32,
) -> Snapshot {
    let mut s = at_now(fleet("h100", 1, 1, 1, 8, false), vec![]);
    let x = s.nodes[0].id.clone();
    let mut r = holder(job, tenant, priority, &x, full(""), started, None);
    r.preemptions = preemptions;
    occupy(&mut s, vec![r]);
    s
}

#[test]
fn a_lower_class_reclaims_its_guarantee_even_while_a_higher_one_waits() {
    // acme (guaranteed 8) queues a low unit; globex borrows the fleet with a
    // normal unit; initech's normal unit waits too. The low unit reclaims:
    // its claim keeps what it frees from initech (next test).
    let mut s = one_node_held_by("g", "globex", 1, 0, 0);
    guarantee(&mut s, "acme", 8);
    s.queue = vec![
        unit("a-low", "acme", 0, 1, 8, 1),
        unit("i", "initech", 1, 1, 8, 2),
    ];
    let p = plan(&s, &Policy::default());
    assert_eq!(victims(&p), vec![("g", "a-low", PreemptCause::Reclaim)]);
}

#[test]
fn a_guarantee_protects_low_units_from_other_tenants_priority() {
    // acme (guaranteed 8) runs a low unit within its guarantee; a normal
    // unit of globex waits. It may not take acme's low unit...
    let mut s = one_node_held_by("a-low", "acme", 0, 0, 0);
    guarantee(&mut s, "acme", 8);
    s.queue = vec![unit("g", "globex", 1, 1, 8, 1)];
    assert!(plan(&s, &Policy::default()).preemptions.is_empty());
    // ...but acme's own normal unit may,
    s.queue = vec![unit("a", "acme", 1, 1, 8, 1)];
    let p = plan(&s, &Policy::default());
    assert_eq!(victims(&p), vec![("a-low", "a", PreemptCause::Priority)]);
    // and so may globex's once acme borrows beyond its guarantee.
    guarantee(&mut s, "acme", 4);
    s.queue = vec![unit("g", "globex", 1, 1, 8, 1)];
    let p = plan(&s, &Policy::default());
    assert_eq!(victims(&p), vec![("a-low", "g", PreemptCause::Priority)]);
}

#[test]
fn what_a_reclaim_frees_goes_to_the_unit_that_reclaimed_it() {
    // acme (guaranteed 8) queues a low unit; globex borrows the one node
    // with a normal unit. The low unit reclaims the node and claims it.
    let mut s = one_node_held_by("g", "globex", 1, 0, 0);
    guarantee(&mut s, "acme", 8);
    s.queue = vec![unit("a-low", "acme", 0, 1, 8, 1)];
    let policy = Policy::default();
    let p = plan(&s, &policy);
    assert_eq!(victims(&p), vec![("g", "a-low", PreemptCause::Reclaim)]);
    assert_eq!(p.claims, BTreeMap::from([("a-low".to_string(), NOW + 240)]));

    // Its victim checkpointed and left, and is queued again: a normal unit,
    // a class above the low one. The node is free.
    let mut gone = s.clone();
    gone.now = NOW + 130;
    gone.running.clear();
    gone.usage.clear();
    gone.nodes[0].free = (0..8).collect();
    let mut back = unit("g", "globex", 1, 1, 8, 0);
    back.submitted = 0;
    gone.queue.push(back);
    // Without the claim the class order hands the node back to the victim,
    // and the low unit would reclaim again once it has run its minimum:
    // the storm of issue 26.
    let p = plan(&gone, &policy);
    assert_eq!(p.placements.len(), 1);
    assert_eq!(p.placements[0].job, "g");
    // With it, the unit that reclaimed starts; the victim waits.
    gone.claims = plan(&s, &policy).claims;
    let p = plan(&gone, &policy);
    assert_eq!(p.placements.len(), 1);
    assert_eq!(p.placements[0].job, "a-low");
    assert!(p.preemptions.is_empty(), "{:?}", p.preemptions);
    // A claim past its time counts for nothing.
    gone.now = NOW + 241;
    let p = plan(&gone, &policy);
    assert_eq!(p.placements[0].job, "g");
}

#[test]
fn each_preemption_doubles_the_run_a_victim_is_owed_before_the_next() {
    // acme (guaranteed 8) reclaims from globex's borrower, which was
    // preempted twice before: it must have run 4 × 600 s since it last
    // started, for any cause.
    let policy = Policy::default();
    assert_eq!(policy.preemption.min_run_for(0), 600);
    assert_eq!(policy.preemption.min_run_for(2), 2_400);
    assert_eq!(
        policy.preemption.min_run_for(60),
        600 << MAX_BACKOFF_DOUBLINGS
    );
    let reclaimed = |started: u64, preemptions: u32| {
        let mut s = one_node_held_by("g", "globex", 1, started, preemptions);
        guarantee(&mut s, "acme", 8);
        s.queue = vec![unit("a", "acme", 1, 1, 8, 1)];
        !plan(&s, &policy).preemptions.is_empty()
    };
    assert!(reclaimed(NOW - 600, 0));
    assert!(!reclaimed(NOW - 2_399, 2));
    assert!(reclaimed(NOW - 2_400, 2));
    // Priority preemption backs off the same way, within its cap.
    let prioritized = |started: u64, preemptions: u32| {
        let mut s = one_node_held_by("low", "globex", 0, started, preemptions);
        s.queue = vec![unit("n", "acme", 1, 1, 8, 1)];
        !plan(&s, &policy).preemptions.is_empty()
    };
    assert!(!prioritized(NOW - 1_199, 1));
    assert!(prioritized(NOW - 1_200, 1));
}

#[test]
fn preemption_stops_at_the_budget_and_can_be_turned_off() {
    let mut s = at_now(fleet("h100", 1, 1, 4, 8, false), vec![]);
    let ids: Vec<String> = s.nodes.iter().map(|n| n.id.clone()).collect();
    let holders = (ids.iter().enumerate())
        .map(|(i, id)| holder(&format!("low{i}"), "globex", 0, id, full(""), 0, None))
        .collect();
    occupy(&mut s, holders);
    s.queue = (0..4)
        .map(|i| unit(&format!("n{i}"), "acme", 1, 1, 8, i))
        .collect();
    let mut policy = Policy::default();
    assert_eq!(plan(&s, &policy).preemptions.len(), 4);
    policy.preemption.max_victims_per_pass = 2;
    assert_eq!(plan(&s, &policy).preemptions.len(), 2);
    policy.preemption.enabled = false;
    assert!(plan(&s, &policy).preemptions.is_empty());
    for kind in [PolicyKind::FifoFirstFit, PolicyKind::SlurmBackfill] {
        let p = plan(
            &s,
            &Policy {
                kind,
                ..Policy::default()
            },
        );
        assert!(p.preemptions.is_empty(), "{kind:?}");
    }
}

#[test]
fn two_waiting_units_never_share_a_victim() {
    let mut s = at_now(fleet("h100", 1, 1, 1, 8, false), vec![]);
    let a = s.nodes[0].id.clone();
    occupy(
        &mut s,
        vec![holder("low", "globex", 0, &a, full(""), 0, None)],
    );
    s.queue = vec![
        unit("n0", "acme", 1, 1, 8, 1),
        unit("n1", "acme", 1, 1, 8, 2),
    ];
    let p = plan(&s, &Policy::default());
    assert_eq!(victims(&p), vec![("low", "n0", PreemptCause::Priority)]);
    assert_eq!(reason_of(&p, "n1").code(), "no_capacity");
}

#[test]
fn fair_share_lets_the_tenant_holding_less_go_first() {
    // acme already holds 8 of 16 GPUs; globex holds none. Both queue
    // 1-GPU units, acme's older; only 4 GPUs are free.
    let mut s = at_now(fleet("h100", 1, 1, 2, 8, false), vec![]);
    let a = s.nodes[0].id.clone();
    let b = s.nodes[1].id.clone();
    occupy(
        &mut s,
        vec![
            holder("acme-run", "acme", 1, &a, full(""), NOW, None),
            holder("other", "initech", 1, &b, vec![0, 1, 2, 3], NOW, None),
        ],
    );
    s.queue = (0..4)
        .map(|i| unit(&format!("a{i}"), "acme", 1, 1, 1, i))
        .chain((0..4).map(|i| unit(&format!("g{i}"), "globex", 1, 1, 1, 10 + i)))
        .collect();
    let p = plan(&s, &Policy::default());
    let mut placed: Vec<&str> = p.placements.iter().map(|x| x.job.as_str()).collect();
    placed.sort();
    assert_eq!(placed, vec!["g0", "g1", "g2", "g3"]);
    // Slurm-like goes by age alone.
    let p = plan(
        &s,
        &Policy {
            kind: PolicyKind::SlurmBackfill,
            ..Policy::default()
        },
    );
    let placed: Vec<&str> = p.placements.iter().map(|x| x.job.as_str()).collect();
    assert_eq!(placed, vec!["a0", "a1", "a2", "a3"]);
}

#[test]
fn within_a_tenant_smaller_work_goes_first_and_waiting_lifts_large_work() {
    let mut s = at_now(fleet("h100", 1, 1, 1, 8, false), vec![]);
    s.now = 100_000;
    let now = s.now;
    let mut big = unit("big", "acme", 1, 1, 8, 0);
    big.estimated_duration_s = 36_000;
    big.submitted = now;
    let mut small = unit("small", "acme", 1, 1, 1, 1);
    small.estimated_duration_s = 60;
    small.submitted = now;
    s.queue = vec![big, small];
    let p = plan(&s, &Policy::default());
    assert_eq!(p.placements[0].job, "small");
    assert!(p.placements.iter().all(|x| x.job != "big"));
    // The big job has waited 20 hours: 20 ranks up, ahead of the small one.
    s.queue[0].submitted = now - 20 * 3_600;
    let p = plan(&s, &Policy::default());
    assert_eq!(p.placements[0].job, "big");
    // With size ordering off, submission order.
    s.queue[0].submitted = now;
    let p = plan(
        &s,
        &Policy {
            size_aging_s: 0,
            ..Policy::default()
        },
    );
    assert_eq!(p.placements[0].job, "big");
}

#[test]
fn weights_and_history_shape_the_split() {
    // An empty 6-GPU node; two tenants queue six 1-GPU units each.
    let mut s = at_now(fleet("h100", 1, 1, 1, 6, false), vec![]);
    s.queue = (0..6)
        .map(|i| unit(&format!("a{i}"), "acme", 1, 1, 1, i))
        .chain((0..6).map(|i| unit(&format!("g{i}"), "globex", 1, 1, 1, i)))
        .collect();
    let count = |p: &Plan, prefix: &str| {
        p.placements
            .iter()
            .filter(|x| x.job.starts_with(prefix))
            .count()
    };
    let p = plan(&s, &Policy::default());
    assert_eq!((count(&p, "a"), count(&p, "g")), (3, 3));
    // Weight 2 : 1 → 4 : 2.
    s.shares.insert(
        ("acme".into(), "h100".into()),
        Share {
            weight: 2000,
            ..Share::default()
        },
    );
    let p = plan(&s, &Policy::default());
    assert_eq!((count(&p, "a"), count(&p, "g")), (4, 2));
    // acme used 2 GPUs on average lately: it gets 2 fewer than by weight
    // alone would give... with equal weights, 2 : 4.
    s.shares.insert(
        ("acme".into(), "h100".into()),
        Share {
            history: 2000,
            ..Share::default()
        },
    );
    let p = plan(&s, &Policy::default());
    assert_eq!((count(&p, "a"), count(&p, "g")), (2, 4));
    // A guarantee puts a tenant first up to it, whatever its share.
    s.shares.insert(
        ("acme".into(), "h100".into()),
        Share {
            history: 2000,
            guaranteed: 5,
            ..Share::default()
        },
    );
    let p = plan(&s, &Policy::default());
    assert_eq!((count(&p, "a"), count(&p, "g")), (5, 1));
    // Priority still comes first.
    let mut s2 = s.clone();
    for u in s2.queue.iter_mut().filter(|u| u.tenant == "globex") {
        u.priority = 2;
    }
    let p = plan(&s2, &Policy::default());
    assert_eq!((count(&p, "a"), count(&p, "g")), (0, 6));
}

#[test]
fn a_reserved_gang_far_from_its_start_preempts_but_one_starting_soon_does_not() {
    let mut s = at_now(
        fleet("h100", 1, 1, 2, 8, false),
        vec![unit("n", "acme", 1, 2, 8, 1)],
    );
    s.queue[0].estimated_duration_s = 100;
    let (a, b) = (s.nodes[0].id.clone(), s.nodes[1].id.clone());
    let mut low = holder("low", "globex", 0, &a, full(""), 0, None);
    let mut normal = holder("normal", "globex", 1, &b, full(""), 0, None);
    low.expected_end = NOW + 5000;
    normal.expected_end = NOW + 60;
    occupy(&mut s, vec![low, normal]);
    // Both nodes free by NOW + 5000: reserved far away, so preempt `low`...
    // but `normal` cannot be preempted, so the gang waits for it anyway,
    // and preempting `low` lets it start at NOW + 120 instead of 5000.
    let p = plan(&s, &Policy::default());
    assert_eq!(victims(&p), vec![("low", "n", PreemptCause::Priority)]);
    // With `low` ending within the checkpoint deadline, no preemption.
    s.running[0].expected_end = NOW + 100;
    let p = plan(&s, &Policy::default());
    assert!(p.preemptions.is_empty(), "{:?}", p.preemptions);
    assert_eq!(reason_of(&p, "n").code(), "reserved");
}

#[test]
fn a_low_unit_that_overran_its_estimate_is_still_preempted() {
    let mut s = at_now(
        fleet("h100", 1, 1, 1, 8, false),
        vec![unit("n", "acme", 1, 1, 8, 1)],
    );
    s.queue[0].estimated_duration_s = 100;
    let a = s.nodes[0].id.clone();
    let mut low = holder("low", "globex", 0, &a, full(""), 0, None);
    low.expected_end = NOW - 500;
    occupy(&mut s, vec![low]);
    let p = plan(&s, &Policy::default());
    assert_eq!(victims(&p), vec![("low", "n", PreemptCause::Priority)]);
}

#[test]
fn preempting_ignores_running_units_of_other_types_and_unknown_nodes() {
    let mut nodes = fleet("h100", 1, 1, 1, 8, false);
    nodes.extend(fleet("a100", 1, 1, 1, 8, false));
    let mut s = at_now(nodes, vec![unit("n", "acme", 1, 1, 8, 1)]);
    let a100 = s.nodes[1].id.clone();
    let h100 = s.nodes[0].id.clone();
    let mut other = holder("a100-low", "globex", 0, &a100, full(""), 0, None);
    other.gpu_type = "a100".into();
    let ghost = holder("ghost", "globex", 0, "no-such-node", full(""), 0, None);
    let normal = holder("normal", "globex", 1, &h100, full(""), 0, None);
    occupy(&mut s, vec![other, normal]);
    s.running.push(ghost);
    let p = plan(&s, &Policy::default());
    assert!(p.preemptions.is_empty(), "{:?}", p.preemptions);
    let _ = BTreeMap::<u8, u8>::new();
}

fn elastic(job: &str, workers: u32, min: u32) -> Request {
    Request {
        min_workers: min,
        ..unit(job, "acme", 1, workers, 8, 1)
    }
}

#[test]
fn an_elastic_gang_starts_with_the_workers_that_fit() {
    let mut s = at_now(fleet("h100", 1, 1, 4, 8, false), vec![elastic("e", 4, 2)]);
    let a = s.nodes[0].id.clone();
    occupy(
        &mut s,
        vec![holder("normal", "globex", 1, &a, full(""), NOW, None)],
    );
    let p = plan(&s, &Policy::default());
    assert_eq!(p.placements.len(), 1);
    assert_eq!(p.placements[0].ranks, vec![0, 1, 2]);
    assert_eq!(p.placements[0].workers.len(), 3);
    // Carried out: it runs with 3 of 4 workers and holds 24 GPUs.
    let next = crate::apply(&s, &p);
    assert!(next.queue.is_empty());
    let run = next.running.iter().find(|r| r.job == "e").expect("running");
    assert_eq!(
        run.elastic,
        Some(Elastic {
            workers: 3,
            max_workers: 4,
            gpus_per_worker: 8,
            required: Level::Region
        })
    );
    assert_eq!(next.usage[&("acme".to_string(), "h100".to_string())], 24);
    // The other disciplines place it whole or not at all.
    for kind in [PolicyKind::SlurmBackfill, PolicyKind::FifoFirstFit] {
        let p = plan(
            &s,
            &Policy {
                kind,
                ..Policy::default()
            },
        );
        assert!(p.placements.is_empty(), "{kind:?}");
    }
}

#[test]
fn an_elastic_gang_below_its_minimum_waits_and_reserves_for_the_minimum() {
    let mut s = at_now(fleet("h100", 1, 1, 3, 8, false), vec![elastic("e", 4, 2)]);
    s.queue[0].estimated_duration_s = 100;
    let ids: Vec<String> = s.nodes.iter().map(|n| n.id.clone()).collect();
    let mut a = holder("a", "globex", 1, &ids[0], full(""), NOW, None);
    let mut b = holder("b", "globex", 1, &ids[1], full(""), NOW, None);
    a.expected_end = NOW + 500;
    b.expected_end = NOW + 900;
    occupy(&mut s, vec![a, b]);
    let p = plan(&s, &Policy::default());
    assert!(p.placements.is_empty());
    // Two workers fit once `a` ends: the reservation is for the minimum.
    assert_eq!(
        *reason_of(&p, "e"),
        WaitReason::Reserved {
            start: NOW + 500,
            level: Level::Leaf
        }
    );
    let held: usize = p.reservations[0].gpus.iter().map(|(_, g)| g.len()).sum();
    assert_eq!(held, 16);
}

#[test]
fn a_quota_lets_an_elastic_gang_start_part_way() {
    let mut s = at_now(fleet("h100", 1, 1, 4, 8, false), vec![elastic("e", 4, 1)]);
    s.quotas.insert(("acme".into(), "h100".into()), 16);
    let p = plan(&s, &Policy::default());
    assert_eq!(p.placements[0].ranks, vec![0, 1]);
    s.quotas.insert(("acme".into(), "h100".into()), 7);
    let p = plan(&s, &Policy::default());
    assert_eq!(reason_of(&p, "e").code(), "over_quota");
}

/// A running elastic unit of `workers` of `max` 8-GPU workers on the first
/// nodes, started at `started`.
fn running_elastic(s: &mut Snapshot, workers: u32, max: u32, started: u64) {
    let gpus = (0..workers as usize)
        .map(|i| (s.nodes[i].id.clone(), full("")))
        .collect();
    occupy(
        s,
        vec![Running {
            job: "e".into(),
            tenant: "acme".into(),
            gpu_type: "h100".into(),
            priority: 1,
            gpus,
            expected_end: u64::MAX,
            started,
            elastic: Some(Elastic {
                workers,
                max_workers: max,
                gpus_per_worker: 8,
                required: Level::Region,
            }),
            ..Default::default()
        }],
    );
}

#[test]
fn an_elastic_gang_grows_when_idle_gpus_nobody_waits_for_could_hold_more() {
    let mut s = at_now(fleet("h100", 1, 1, 4, 8, false), vec![]);
    running_elastic(&mut s, 2, 4, 0);
    let p = plan(&s, &Policy::default());
    assert_eq!(victims(&p), vec![("e", "e", PreemptCause::Grow)]);
    // Not while a unit of the type waits for capacity…
    let mut busy = s.clone();
    busy.queue = vec![unit("big", "globex", 1, 4, 8, 1)];
    let p = plan(&busy, &Policy::default());
    assert!(
        p.preemptions.iter().all(|v| v.cause != PreemptCause::Grow),
        "{:?}",
        p.preemptions
    );
    // …not before its minimum run time, not at its maximum…
    let mut young = at_now(fleet("h100", 1, 1, 4, 8, false), vec![]);
    running_elastic(&mut young, 2, 4, NOW - 10);
    assert!(plan(&young, &Policy::default()).preemptions.is_empty());
    let mut full_size = at_now(fleet("h100", 1, 1, 4, 8, false), vec![]);
    running_elastic(&mut full_size, 4, 4, 0);
    assert!(plan(&full_size, &Policy::default()).preemptions.is_empty());
    // …and not when idle GPUs cannot hold half as many workers again: 4
    // running, one node free, 6 wanted.
    let mut almost = at_now(fleet("h100", 1, 1, 5, 8, false), vec![]);
    running_elastic(&mut almost, 4, 8, 0);
    assert!(plan(&almost, &Policy::default()).preemptions.is_empty());
}

#[test]
fn an_elastic_victim_restarts_smaller() {
    // A low elastic gang holds all 4 nodes; a normal 2-node gang preempts
    // it; requeued, it starts again on the 2 nodes left (shrinks).
    let mut s = at_now(fleet("h100", 1, 1, 4, 8, false), vec![]);
    running_elastic(&mut s, 4, 4, 0);
    s.running[0].priority = 0;
    s.queue = vec![unit("n", "globex", 1, 2, 8, 5)];
    let p = plan(&s, &Policy::default());
    assert_eq!(victims(&p), vec![("e", "n", PreemptCause::Priority)]);
    // The victim has stopped and requeued; the normal gang started.
    let mut after = at_now(fleet("h100", 1, 1, 4, 8, false), vec![]);
    let (a, b) = (after.nodes[0].id.clone(), after.nodes[1].id.clone());
    occupy(
        &mut after,
        vec![Running {
            gpus: vec![(a, full("")), (b, full(""))],
            ..holder("n", "globex", 1, "", vec![], NOW, None)
        }],
    );
    after.queue = vec![Request {
        priority: 0,
        ..elastic("e", 4, 1)
    }];
    let p = plan(&after, &Policy::default());
    assert_eq!(p.placements[0].ranks, vec![0, 1]);
}

/// Two leaves of two 8-GPU nodes. Leaf 0 holds low job `a` (2 GPUs) on n0
/// and `b` (2 GPUs) on n1, both checkpointed a minute ago; leaf 1 holds low
/// jobs `c` and `d` of `leaf1_gpus` GPUs each, an hour past their last
/// checkpoint. Everything runs for another 50,000 s. A low-priority gang
/// `g` of two 8-GPU workers waits: no node is whole.
fn fragmented(leaf1_gpus: u32) -> Snapshot {
    let mut g = unit("g", "acme", 0, 2, 8, 1);
    g.estimated_duration_s = 3600;
    let mut s = at_now(two_leaves(2), vec![g]);
    let ids: Vec<String> = s.nodes.iter().map(|n| n.id.clone()).collect();
    let run = |job: &str, node: &str, gpus: u32, checkpointed: u64| {
        let mut r = holder(
            job,
            "globex",
            0,
            node,
            (0..gpus).collect(),
            0,
            Some(checkpointed),
        );
        r.expected_end = NOW + 50_000;
        r
    };
    occupy(
        &mut s,
        vec![
            run("a", &ids[0], 2, NOW - 60),
            run("b", &ids[1], 2, NOW - 60),
            run("c", &ids[2], leaf1_gpus, NOW - 3600),
            run("d", &ids[3], leaf1_gpus, NOW - 3600),
        ],
    );
    s
}

#[test]
fn a_reserved_low_gang_moves_small_low_jobs_that_fit_elsewhere() {
    let s = fragmented(4);
    // Leaf 0 is cheaper to clear (less work at risk), and a and b fit on
    // leaf 1's free GPUs: both are moved, the gang waits for them.
    let p = plan(&s, &Policy::default());
    assert!(p.placements.is_empty());
    assert_eq!(
        victims(&p),
        vec![
            ("a", "g", PreemptCause::Defrag),
            ("b", "g", PreemptCause::Defrag)
        ]
    );
    assert_eq!(reason_of(&p, "g").code(), "waiting_for_preemption");
    // Once they are gone the gang starts on leaf 0, and the movers land on
    // leaf 1's partly used nodes (fill partly used nodes first).
    let mut next = apply(&s, &p);
    next.running.retain(|r| r.job != "a" && r.job != "b");
    for n in next.nodes.iter_mut().take(2) {
        n.free = (0..8).collect();
    }
    let mut a = unit("a", "globex", 0, 1, 2, 0);
    a.estimated_duration_s = 50_000;
    let mut b = unit("b", "globex", 0, 1, 2, 0);
    b.estimated_duration_s = 50_000;
    next.queue.extend([a, b]);
    let p = plan(&next, &Policy::default());
    let leaf = |job: &str| {
        let pl = p.placements.iter().find(|x| x.job == job).expect("placed");
        let node = &pl.workers[0].node;
        next.nodes
            .iter()
            .find(|n| n.id == *node)
            .unwrap()
            .leaf
            .clone()
    };
    assert_eq!(leaf("g"), next.nodes[0].leaf);
    assert_eq!(leaf("a"), next.nodes[2].leaf);
    assert_eq!(leaf("b"), next.nodes[2].leaf);
}

#[test]
fn no_defragmentation_without_room_elsewhere_or_when_turned_off() {
    // Leaf 1 is full of whole-node jobs: a and b would have nowhere to go,
    // and c and d are not small. The gang keeps its reservation.
    let s = fragmented(8);
    let p = plan(&s, &Policy::default());
    assert!(p.preemptions.is_empty(), "{:?}", p.preemptions);
    assert_eq!(reason_of(&p, "g").code(), "reserved");
    // Room, but defragmentation turned off.
    let s = fragmented(4);
    let mut policy = Policy::default();
    policy.preemption.defrag = false;
    let p = plan(&s, &policy);
    assert!(p.preemptions.is_empty());
    assert_eq!(reason_of(&p, "g").code(), "reserved");
}

#[test]
fn no_defragmentation_of_young_runs_or_while_a_higher_class_waits() {
    // The movers started 10 s ago: below the minimum run time.
    let mut s = fragmented(4);
    for r in &mut s.running {
        r.started = NOW - 10;
    }
    let p = plan(&s, &Policy::default());
    assert!(p.preemptions.is_empty());
    // A normal job waits for a whole node: it preempts by priority, and
    // the low gang does not defragment behind it.
    let mut s = fragmented(4);
    let mut n = unit("n", "initech", 1, 1, 8, 2);
    n.estimated_duration_s = 3600;
    s.queue.push(n);
    let p = plan(&s, &Policy::default());
    assert!(!p.preemptions.is_empty());
    assert!(
        p.preemptions
            .iter()
            .all(|v| v.cause == PreemptCause::Priority && v.for_job == "n"),
        "{:?}",
        p.preemptions
    );
}

#[test]
fn a_reserved_gang_moves_small_borrowed_jobs_of_its_class_but_not_guaranteed_ones() {
    // Everything normal priority. globex holds 12 GPUs with no guarantee
    // (all borrowed): its small jobs on leaf 0 are moved, as low ones are.
    let mut s = fragmented(4);
    for r in &mut s.running {
        r.priority = 1;
    }
    s.queue[0].priority = 1;
    let p = plan(&s, &Policy::default());
    assert_eq!(
        victims(&p),
        vec![
            ("a", "g", PreemptCause::Defrag),
            ("b", "g", PreemptCause::Defrag)
        ]
    );
    // Guaranteed 12, globex borrows nothing: its normal jobs stay put.
    guarantee(&mut s, "globex", 12);
    let p = plan(&s, &Policy::default());
    assert!(p.preemptions.is_empty(), "{:?}", p.preemptions);
    assert_eq!(reason_of(&p, "g").code(), "reserved");
    // A higher class is never moved for a lower one, borrowed or not.
    let mut s = fragmented(4);
    for r in &mut s.running {
        r.priority = 1;
    }
    let p = plan(&s, &Policy::default());
    assert!(p.preemptions.is_empty(), "{:?}", p.preemptions);
}
