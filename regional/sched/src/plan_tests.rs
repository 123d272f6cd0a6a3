//! Worked examples of the placement rules.

use std::collections::BTreeMap;

use crate::types::*;
use crate::{apply, plan};

/// `spines × leaves × nodes` nodes of `gpus` GPUs, ids `s0-l0-n0`; every
/// node its own NVLink domain unless `rack_nvlink`.
pub(crate) fn fleet(
    ty: &str,
    spines: u32,
    leaves: u32,
    nodes: u32,
    gpus: u32,
    rack_nvlink: bool,
) -> Vec<Node> {
    let mut out = Vec::new();
    for s in 0..spines {
        for l in 0..leaves {
            for n in 0..nodes {
                let spine = format!("{ty}-s{s}");
                let leaf = format!("{spine}-l{l}");
                let id = format!("{leaf}-n{n:02}");
                out.push(Node {
                    nvlink_domain: if rack_nvlink {
                        leaf.clone()
                    } else {
                        id.clone()
                    },
                    id,
                    spine,
                    leaf,
                    gpu_type: ty.into(),
                    gpus,
                    free: (0..gpus).collect(),
                    schedulable: true,
                });
            }
        }
    }
    out
}

pub(crate) fn req(job: &str, workers: u32, gpw: u32, required: Level) -> Request {
    Request {
        job: job.into(),
        ranks: (0..workers).collect(),
        tenant: "acme".into(),
        gpu_type: "h100".into(),
        gpus_per_worker: gpw,
        required,
        preferred: Level::Nvlink,
        priority: 0,
        seq: 0,
        estimated_duration_s: 0,
        min_workers: 0,
        submitted: 0,
        reservation: None,
    }
}

pub(crate) fn snap(nodes: Vec<Node>, queue: Vec<Request>) -> Snapshot {
    Snapshot {
        generation: 7,
        nodes,
        queue,
        ..Snapshot::default()
    }
}

fn nodes_of(p: &Placement) -> Vec<&str> {
    let mut v: Vec<&str> = p.workers.iter().map(|w| w.node.as_str()).collect();
    v.dedup();
    v
}

#[test]
fn eight_gpus_fill_one_node() {
    let s = snap(
        fleet("h100", 1, 2, 2, 8, false),
        vec![req("j", 1, 8, Level::Region)],
    );
    let p = plan(&s, &Policy::default());
    assert_eq!(p.generation, 7);
    assert!(p.waiting.is_empty());
    let pl = &p.placements[0];
    assert_eq!(pl.level, Level::Nvlink);
    assert_eq!(
        pl.workers,
        vec![WorkerPlacement {
            rank: 0,
            node: "h100-s0-l0-n00".into(),
            gpus: (0..8).collect()
        }]
    );
}

#[test]
fn sixteen_single_gpu_workers_land_on_two_nodes_of_one_leaf() {
    let s = snap(
        fleet("h100", 2, 2, 4, 8, false),
        vec![req("j", 16, 1, Level::Region)],
    );
    let p = plan(&s, &Policy::default());
    let pl = &p.placements[0];
    assert_eq!(pl.level, Level::Leaf);
    assert_eq!(nodes_of(pl), vec!["h100-s0-l0-n00", "h100-s0-l0-n01"]);
    // Ranks follow node order: 0..8 on the first node, 8..16 on the second.
    for (i, w) in pl.workers.iter().enumerate() {
        assert_eq!(w.rank, i as u32);
        assert_eq!(w.gpus, vec![i as u32 % 8]);
    }
}

#[test]
fn best_fit_picks_the_partly_used_node() {
    let mut nodes = fleet("h100", 1, 1, 3, 8, false);
    nodes[1].free = vec![4, 5, 6, 7];
    nodes[2].free = vec![1, 2, 3, 5, 6, 7];
    let s = snap(nodes, vec![req("j", 1, 4, Level::Nvlink)]);
    let p = plan(&s, &Policy::default());
    let w = &p.placements[0].workers[0];
    assert_eq!(
        (w.node.as_str(), w.gpus.clone()),
        ("h100-s0-l0-n01", vec![4, 5, 6, 7])
    );
}

/// Three 8-GPU nodes: n00 has 2 GPUs free, the rest busy until t=100;
/// n01 has 4 free, the rest busy until t=10,000; n02 is idle.
fn two_partly_used_nodes() -> Snapshot {
    let mut s = snap(fleet("h100", 1, 1, 3, 8, false), Vec::new());
    busy(
        &mut s,
        &[
            ("h100-s0-l0-n00", &[0, 1, 2, 3, 4, 5], 100),
            ("h100-s0-l0-n01", &[0, 1, 2, 3], 10_000),
        ],
    );
    s
}

#[test]
fn a_unit_goes_where_it_delays_no_node_coming_free_whole() {
    // A 2-GPU unit of 5,000 s: best fit alone would take n00's last two
    // GPUs and keep n00 busy until 5,000 instead of 100; placed by its end
    // it goes to n01, busy until 10,000 anyway, and n00 comes free whole
    // for whole-node work at 100.
    let mut s = two_partly_used_nodes();
    s.queue = vec![with("j", 1, 2, Level::Nvlink, 0, 5_000)];
    let p = plan(&s, &Policy::default());
    assert_eq!(
        placed_on(&p, "j"),
        vec![("h100-s0-l0-n01".into(), vec![4, 5])]
    );
    let best_fit_alone = Policy {
        pack_by_end: false,
        ..Policy::default()
    };
    let p = plan(&s, &best_fit_alone);
    assert_eq!(
        placed_on(&p, "j"),
        vec![("h100-s0-l0-n00".into(), vec![6, 7])]
    );
}

#[test]
fn units_placed_by_end_fill_the_node_that_ends_first_after_them_and_never_an_idle_one() {
    let mut s = two_partly_used_nodes();
    s.queue = vec![
        // Ends at 50, before both horizons: the fewest free GPUs, n00.
        with("short", 1, 2, Level::Nvlink, 0, 50),
        // Ends at 20,000, after every horizon: the latest, n01, whose
        // finish it delays least (by 10,000; n02's, by 19,950).
        with("long", 1, 1, Level::Nvlink, 1, 20_000),
        // No known end: best fit alone (n01's three left).
        with("unknown", 1, 3, Level::Nvlink, 2, 0),
        // No busy node has room for five: the idle one (placed before
        // "long", being smaller work).
        with("big", 1, 5, Level::Nvlink, 3, 50),
    ];
    let p = plan(&s, &Policy::default());
    assert_eq!(
        placed_on(&p, "short"),
        vec![("h100-s0-l0-n00".into(), vec![6, 7])]
    );
    assert_eq!(
        placed_on(&p, "long"),
        vec![("h100-s0-l0-n01".into(), vec![4])]
    );
    assert_eq!(
        placed_on(&p, "unknown"),
        vec![("h100-s0-l0-n01".into(), vec![5, 6, 7])]
    );
    assert_eq!(
        placed_on(&p, "big"),
        vec![("h100-s0-l0-n02".into(), vec![0, 1, 2, 3, 4])]
    );
}

#[test]
fn best_fit_leaf_keeps_the_emptier_leaf_whole() {
    let mut nodes = fleet("h100", 1, 2, 4, 8, false);
    nodes[4].free.clear(); // leaf 1 has 3 free nodes, leaf 0 has 4
    let s = snap(nodes, vec![req("j", 2, 8, Level::Region)]);
    let pl = &plan(&s, &Policy::default()).placements[0];
    assert_eq!(pl.level, Level::Leaf);
    assert_eq!(nodes_of(pl), vec!["h100-s0-l1-n01", "h100-s0-l1-n02"]);
}

#[test]
fn required_leaf_waits_rather_than_spread() {
    // Two leaves with one free node each: 16 GPUs exist, but not in one leaf.
    let mut nodes = fleet("h100", 1, 2, 2, 8, false);
    nodes[0].free.clear();
    nodes[2].free.clear();
    let s = snap(nodes.clone(), vec![req("j", 2, 8, Level::Leaf)]);
    let p = plan(&s, &Policy::default());
    assert!(p.placements.is_empty());
    assert_eq!(
        p.waiting,
        vec![Waiting {
            job: "j".into(),
            ranks: vec![0, 1],
            reason: WaitReason::NoCapacity {
                required: Level::Leaf,
                free_gpus: 16
            }
        }]
    );
    // Allowed to spread over the spine, it goes.
    let s = snap(nodes, vec![req("j", 2, 8, Level::Spine)]);
    let pl = &plan(&s, &Policy::default()).placements[0];
    assert_eq!(pl.level, Level::Spine);
    assert_eq!(nodes_of(pl), vec!["h100-s0-l0-n01", "h100-s0-l1-n01"]);
}

#[test]
fn spread_fills_the_largest_child_then_best_fits_the_rest() {
    // Leaf 0: 3 free nodes, leaf 1: 2, leaf 2: 1. Four 8-GPU workers fit no leaf.
    let mut nodes = fleet("h100", 1, 3, 3, 8, false);
    nodes[3].free.clear();
    nodes[6].free.clear();
    nodes[7].free.clear();
    let s = snap(nodes, vec![req("j", 4, 8, Level::Spine)]);
    let pl = &plan(&s, &Policy::default()).placements[0];
    assert_eq!(pl.level, Level::Spine);
    // Leaf 0 filled (3), then the last worker on the smallest leaf that fits (leaf 2).
    assert_eq!(
        nodes_of(pl),
        vec![
            "h100-s0-l0-n00",
            "h100-s0-l0-n01",
            "h100-s0-l0-n02",
            "h100-s0-l2-n02"
        ]
    );
    let ranks: Vec<u32> = pl.workers.iter().map(|w| w.rank).collect();
    assert_eq!(ranks, vec![0, 1, 2, 3]);
}

#[test]
fn nvl72_rack_holds_a_32_gpu_gang_at_nvlink_level() {
    let mut nodes = fleet("gb200", 1, 2, 18, 4, true);
    nodes.extend(fleet("h100", 1, 1, 2, 8, false));
    let mut r = req("j", 8, 4, Level::Nvlink);
    r.gpu_type = "gb200".into();
    let p = plan(&snap(nodes, vec![r]), &Policy::default());
    let pl = &p.placements[0];
    assert_eq!(pl.level, Level::Nvlink);
    let expected: Vec<String> = (0..8).map(|n| format!("gb200-s0-l0-n{n:02}")).collect();
    assert_eq!(
        nodes_of(pl),
        expected.iter().map(String::as_str).collect::<Vec<_>>()
    );
    assert!(pl.workers.iter().all(|w| w.gpus == vec![0, 1, 2, 3]));
}

#[test]
fn quota_counts_placements_made_earlier_in_the_pass() {
    let mut s = snap(
        fleet("h100", 1, 1, 4, 8, false),
        vec![
            req("a", 1, 8, Level::Region),
            req("b", 1, 8, Level::Region),
            req("c", 1, 4, Level::Region),
        ],
    );
    for (i, r) in s.queue.iter_mut().enumerate() {
        r.seq = i as u64;
    }
    s.quotas.insert(("acme".into(), "h100".into()), 16);
    s.usage.insert(("acme".into(), "h100".into()), 4);
    // Another tenant's quota does not apply.
    s.quotas.insert(("globex".into(), "h100".into()), 0);
    let p = plan(&s, &Policy::default());
    let placed: Vec<&str> = p.placements.iter().map(|p| p.job.as_str()).collect();
    assert_eq!(placed, vec!["a", "c"]);
    assert_eq!(
        p.waiting[0].reason,
        WaitReason::OverQuota {
            gpu_type: "h100".into(),
            quota: 16,
            in_use: 12,
            requested: 8
        }
    );
    assert_eq!(p.waiting[0].reason.code(), "over_quota");
}

#[test]
fn higher_priority_then_older_goes_first() {
    let nodes = fleet("h100", 1, 1, 1, 8, false);
    let mut old = req("old", 1, 8, Level::Region);
    old.seq = 1;
    let mut young = req("young", 1, 8, Level::Region);
    young.seq = 2;
    let mut urgent = req("urgent", 1, 8, Level::Region);
    urgent.seq = 3;
    urgent.priority = 5;
    let p = plan(
        &snap(nodes.clone(), vec![young.clone(), old.clone()]),
        &Policy::default(),
    );
    assert_eq!(p.placements[0].job, "old");
    assert_eq!(p.waiting[0].job, "young");
    let p = plan(&snap(nodes, vec![young, old, urgent]), &Policy::default());
    assert_eq!(p.placements[0].job, "urgent");
    let waiting: Vec<&str> = p.waiting.iter().map(|w| w.job.as_str()).collect();
    assert_eq!(waiting, vec!["old", "young"]);
}

#[test]
fn a_blocked_big_gang_does_not_block_smaller_units() {
    let nodes = fleet("h100", 1, 1, 2, 8, false);
    let mut big = req("big", 3, 8, Level::Region);
    big.priority = 1;
    let small = req("small", 1, 8, Level::Region);
    let p = plan(&snap(nodes, vec![big, small]), &Policy::default());
    assert_eq!(p.placements[0].job, "small");
    assert_eq!(p.waiting[0].job, "big");
}

#[test]
fn failed_shapes_are_remembered_without_changing_results() {
    // Leaves of 2 free nodes: 3-node gangs at leaf level fail, 2-node ones fit.
    let nodes = fleet("h100", 1, 3, 2, 8, false);
    let mut queue = Vec::new();
    for (i, w) in [3u32, 2, 4, 2, 3, 1].into_iter().enumerate() {
        let mut r = req(&format!("j{i}"), w, 8, Level::Leaf);
        r.seq = i as u64;
        queue.push(r);
    }
    let p = plan(&snap(nodes, queue), &Policy::default());
    let placed: Vec<&str> = p.placements.iter().map(|p| p.job.as_str()).collect();
    assert_eq!(placed, vec!["j1", "j3", "j5"]);
    let waiting: Vec<&str> = p.waiting.iter().map(|w| w.job.as_str()).collect();
    assert_eq!(waiting, vec!["j0", "j2", "j4"]);
}

#[test]
fn array_workers_are_separate_units() {
    let nodes = fleet("h100", 1, 1, 1, 8, false);
    let queue = (0..3)
        .map(|r| Request {
            ranks: vec![r],
            ..req("arr", 1, 4, Level::Nvlink)
        })
        .collect();
    let p = plan(&snap(nodes, queue), &Policy::default());
    assert_eq!(p.placements.len(), 2);
    assert_eq!(p.placements[1].workers[0].gpus, vec![4, 5, 6, 7]);
    assert_eq!(p.waiting[0].ranks, vec![2]);
}

#[test]
fn unschedulable_and_other_type_nodes_are_not_used() {
    let mut nodes = fleet("h100", 1, 1, 2, 8, false);
    nodes[0].schedulable = false;
    nodes.extend(fleet("a100", 1, 1, 2, 8, false));
    let p = plan(
        &snap(nodes, vec![req("j", 2, 8, Level::Region)]),
        &Policy::default(),
    );
    assert_eq!(
        p.waiting[0].reason,
        WaitReason::NoCapacity {
            required: Level::Region,
            free_gpus: 8
        }
    );
    let mut r = req("k", 1, 1, Level::Region);
    r.gpu_type = "b200".into();
    let p = plan(&snap(vec![], vec![r]), &Policy::default());
    assert_eq!(
        p.waiting[0].reason,
        WaitReason::NoCapacity {
            required: Level::Region,
            free_gpus: 0
        }
    );
}

#[test]
fn bad_input_waits_as_invalid_and_never_panics() {
    let mut nodes = fleet("h100", 1, 1, 2, 8, false);
    // A repeated id counts once; a free list with junk is cleaned.
    nodes.push(nodes[0].clone());
    nodes[1].free = vec![7, 3, 3, 99];
    let mut dup = req("dup", 2, 1, Level::Region);
    dup.ranks = vec![1, 1];
    let queue = vec![
        req("none", 0, 8, Level::Region),
        req("zero", 1, 0, Level::Region),
        dup,
        req("huge", u16::MAX as u32, u32::MAX, Level::Region),
        req("ok", 1, 2, Level::Nvlink),
        req("ok2", 1, 8, Level::Nvlink),
    ];
    let p = plan(&snap(nodes, queue), &Policy::default());
    let codes: Vec<(&str, &str)> = p
        .waiting
        .iter()
        .map(|w| (w.job.as_str(), w.reason.code()))
        .collect();
    assert_eq!(
        codes,
        vec![
            ("dup", "invalid_request"),
            ("huge", "no_capacity"),
            ("none", "invalid_request"),
            ("zero", "invalid_request")
        ]
    );
    assert_eq!(p.placements[0].workers[0].node, "h100-s0-l0-n01");
    assert_eq!(p.placements[0].workers[0].gpus, vec![3, 7]);
    assert_eq!(p.placements[1].workers[0].node, "h100-s0-l0-n00");
}

#[test]
fn max_placements_stops_the_pass() {
    let nodes = fleet("h100", 1, 1, 4, 8, false);
    let queue = (0..4)
        .map(|i| req(&format!("j{i}"), 1, 8, Level::Region))
        .collect();
    let policy = Policy {
        max_placements: Some(2),
        ..Default::default()
    };
    let p = plan(&snap(nodes, queue), &policy);
    assert_eq!(p.placements.len(), 2);
    assert!(p.waiting.is_empty());
}

#[test]
fn apply_carries_out_the_plan_and_replanning_adds_nothing() {
    let mut s = snap(
        fleet("h100", 1, 2, 2, 8, false),
        vec![req("a", 3, 4, Level::Region), req("b", 4, 8, Level::Region)],
    );
    s.queue[1].seq = 1;
    s.usage.insert(("acme".into(), "h100".into()), 1);
    let p = plan(&s, &Policy::default());
    assert_eq!(p.placements.len(), 1);
    let next = apply(&s, &p);
    assert_eq!(next.generation, 8);
    assert_eq!(next.queue.len(), 1);
    assert_eq!(next.queue[0].job, "b");
    assert_eq!(next.usage[&("acme".to_string(), "h100".to_string())], 13);
    let free: u32 = next.nodes.iter().map(|n| n.free.len() as u32).sum();
    assert_eq!(free, 32 - 12);
    let again = plan(&next, &Policy::default());
    assert!(again.placements.is_empty());
    // Applying the same plan twice changes nothing the second time.
    assert_eq!(apply(&next, &p), next);
}

#[test]
fn preferred_is_informational() {
    let mut r = req("j", 2, 8, Level::Region);
    r.preferred = Level::Nvlink;
    let pl = &plan(
        &snap(fleet("h100", 1, 1, 2, 8, false), vec![r.clone()]),
        &Policy::default(),
    )
    .placements[0];
    assert_eq!(pl.level, Level::Leaf);
    assert!(pl.level > r.preferred);
}

#[test]
fn wait_reasons_serialize_with_their_code() {
    #[derive(serde::Serialize)]
    struct Wrap {
        reason: WaitReason,
    }
    let text = toml::to_string(&Wrap {
        reason: WaitReason::NoCapacity {
            required: Level::Spine,
            free_gpus: 3,
        },
    })
    .unwrap();
    assert!(
        text.contains("code = \"no_capacity\"") && text.contains("required = \"spine\""),
        "{text}"
    );
}

#[test]
fn snapshot_quota_keys_are_tenant_then_type() {
    let mut quotas = BTreeMap::new();
    quotas.insert(("acme".to_string(), "h100".to_string()), 0u32);
    let s = Snapshot {
        quotas,
        ..snap(
            fleet("h100", 1, 1, 1, 8, false),
            vec![req("j", 1, 1, Level::Region)],
        )
    };
    assert_eq!(
        plan(&s, &Policy::default()).waiting[0].reason.code(),
        "over_quota"
    );
}

#[test]
fn domains_are_told_apart_by_their_whole_path() {
    // Both spines name their rack "rack-a"; each has one free node. A gang
    // that must stay in one leaf may not combine the two racks.
    let mut nodes = fleet("h100", 2, 1, 2, 8, false);
    for n in &mut nodes {
        n.leaf = "rack-a".into();
    }
    nodes[0].free.clear();
    nodes[2].free.clear();
    let s = snap(nodes, vec![req("j", 2, 8, Level::Leaf)]);
    let p = plan(&s, &Policy::default());
    assert_eq!(p.waiting[0].reason.code(), "no_capacity");
}

// ---------------------------------------------------------------------------
// Reservations and backfill.

fn policy(kind: PolicyKind) -> Policy {
    Policy {
        kind,
        ..Default::default()
    }
}

/// A unit holding `gpus` of `node` until `expected_end`.
fn running(job: &str, node: &str, gpus: Vec<u32>, expected_end: u64) -> Running {
    Running {
        job: job.into(),
        tenant: "other".into(),
        gpu_type: "h100".into(),
        priority: 0,
        gpus: vec![(node.into(), gpus)],
        expected_end,
        ..Default::default()
    }
}

/// Makes the listed nodes busy: each held whole (or the given GPUs) by one
/// running unit with the given expected end.
fn busy(s: &mut Snapshot, units: &[(&str, &[u32], u64)]) {
    for (i, &(node, gpus, end)) in units.iter().enumerate() {
        let n = s.nodes.iter_mut().find(|n| n.id == node).unwrap();
        n.free.retain(|g| !gpus.contains(g));
        s.running
            .push(running(&format!("run{i}"), node, gpus.to_vec(), end));
    }
}

fn with(job: &str, workers: u32, gpw: u32, required: Level, seq: u64, est: u64) -> Request {
    Request {
        seq,
        estimated_duration_s: est,
        ..req(job, workers, gpw, required)
    }
}

pub(super) fn reason_of<'p>(p: &'p Plan, job: &str) -> &'p WaitReason {
    &p.waiting.iter().find(|w| w.job == job).unwrap().reason
}

fn placed_on(p: &Plan, job: &str) -> Vec<(String, Vec<u32>)> {
    p.placements
        .iter()
        .find(|pl| pl.job == job)
        .unwrap()
        .workers
        .iter()
        .map(|w| (w.node.clone(), w.gpus.clone()))
        .collect()
}

const ALL8: &[u32] = &[0, 1, 2, 3, 4, 5, 6, 7];

/// One leaf of five 8-GPU nodes at t=0: n00 busy until 100, n01 until 200,
/// half of n02 until 5,000, n03 and n04 free. The head needs four whole
/// nodes: at t=100 there are three, at t=200 four (n00, n01, n03, n04).
fn easy_example() -> Snapshot {
    let mut head = with("head", 4, 8, Level::Region, 0, 1_000);
    head.priority = 1;
    let mut s = snap(
        fleet("h100", 1, 1, 5, 8, false),
        vec![
            head,
            with("long", 1, 8, Level::Region, 1, 1_000),
            with("short", 1, 8, Level::Region, 2, 150),
            with("small-long", 1, 4, Level::Region, 3, 1_000),
        ],
    );
    busy(
        &mut s,
        &[
            ("h100-s0-l0-n00", ALL8, 100),
            ("h100-s0-l0-n01", ALL8, 200),
            ("h100-s0-l0-n02", &[0, 1, 2, 3], 5_000),
        ],
    );
    s
}

#[test]
fn easy_backfill_reserves_for_the_head_and_backfills_around_it() {
    let s = easy_example();
    let p = plan(&s, &policy(PolicyKind::SlurmBackfill));
    let head = Reservation {
        job: "head".into(),
        ranks: vec![0, 1, 2, 3],
        start: 200,
        level: Level::Leaf,
        gpus: [
            "h100-s0-l0-n00",
            "h100-s0-l0-n01",
            "h100-s0-l0-n03",
            "h100-s0-l0-n04",
        ]
        .iter()
        .map(|n| (n.to_string(), ALL8.to_vec()))
        .collect(),
    };
    assert_eq!(p.reservations, vec![head.clone()]);
    assert_eq!(
        *reason_of(&p, "head"),
        WaitReason::Reserved {
            start: 200,
            level: Level::Leaf
        }
    );
    // Would fit on n04, which the head needs at t=200, and runs past it.
    assert_eq!(
        *reason_of(&p, "long"),
        WaitReason::BlockedByReservation {
            job: "head".into(),
            start: 200
        }
    );
    assert_eq!(reason_of(&p, "long").code(), "reserved_for_other");
    // Ends at t=150, before the head starts: it may use n03 meanwhile.
    assert_eq!(
        placed_on(&p, "short"),
        vec![("h100-s0-l0-n03".to_string(), ALL8.to_vec())]
    );
    // Long, but on GPUs the head does not need.
    assert_eq!(
        placed_on(&p, "small-long"),
        vec![("h100-s0-l0-n02".to_string(), vec![4, 5, 6, 7])]
    );

    // Gangway decides the same, except that the long job gets a reservation
    // of its own (its second of four): n00 once the head is expected to end.
    let g = plan(&s, &policy(PolicyKind::Gangway));
    assert_eq!(g.placements, p.placements);
    assert_eq!(g.reservations[0], head);
    assert_eq!(
        *reason_of(&g, "long"),
        WaitReason::Reserved {
            start: 1_200,
            level: Level::Nvlink
        }
    );

    // FIFO has no reservations: the long job takes n03 and the head waits on.
    let p = plan(&s, &policy(PolicyKind::FifoFirstFit));
    assert!(p.reservations.is_empty());
    assert_eq!(
        placed_on(&p, "long"),
        vec![("h100-s0-l0-n03".to_string(), ALL8.to_vec())]
    );
    assert_eq!(reason_of(&p, "head").code(), "no_capacity");
}

#[test]
fn an_unknown_estimate_never_backfills_into_reserved_gpus() {
    let mut s = easy_example();
    s.queue[2].estimated_duration_s = 0; // "short" no longer says how long
    let p = plan(&s, &policy(PolicyKind::SlurmBackfill));
    assert_eq!(reason_of(&p, "short").code(), "reserved_for_other");
}

#[test]
fn a_reservation_starts_now_when_running_units_overran() {
    let mut s = easy_example();
    s.now = 300; // n00 and n01 were expected to end at 100 and 200
    for r in &mut s.queue {
        r.estimated_duration_s += 300;
    }
    let p = plan(&s, &policy(PolicyKind::Gangway));
    assert_eq!(p.reservations[0].start, 300);
    assert_eq!(
        *reason_of(&p, "head"),
        WaitReason::Reserved {
            start: 300,
            level: Level::Leaf
        }
    );
}

#[test]
fn no_reservation_when_no_known_end_frees_enough() {
    let mut s = easy_example();
    for r in &mut s.running {
        r.expected_end = u64::MAX; // no known end
    }
    let p = plan(&s, &policy(PolicyKind::Gangway));
    assert!(p.reservations.is_empty());
    assert_eq!(reason_of(&p, "head").code(), "no_capacity");
    // Nothing reserved, so the long and short jobs start on n03 and n04,
    // the short one first (smaller work first).
    assert_eq!(placed_on(&p, "short")[0].0, "h100-s0-l0-n03");
    assert_eq!(placed_on(&p, "long")[0].0, "h100-s0-l0-n04");
    // In plain submission order, the other way round.
    let p = plan(
        &s,
        &Policy {
            size_aging_s: 0,
            ..policy(PolicyKind::Gangway)
        },
    );
    assert_eq!(placed_on(&p, "long")[0].0, "h100-s0-l0-n03");
    assert_eq!(placed_on(&p, "short")[0].0, "h100-s0-l0-n04");
}

#[test]
fn fifo_first_fit_spreads_a_gang_that_best_fit_keeps_in_one_leaf() {
    // Leaf 0: n00 with 4 free GPUs, n01 free; leaf 1: two free nodes.
    let mut nodes = fleet("h100", 1, 2, 2, 8, false);
    nodes[0].free = vec![4, 5, 6, 7];
    let s = snap(nodes, vec![req("gang", 2, 8, Level::Leaf)]);
    let p = plan(&s, &policy(PolicyKind::FifoFirstFit));
    let pl = &p.placements[0];
    // First fit in node-id order, `required = leaf` unknown to it.
    assert_eq!(nodes_of(pl), vec!["h100-s0-l0-n01", "h100-s0-l1-n00"]);
    assert_eq!(pl.level, Level::Spine);
    for kind in [PolicyKind::Gangway, PolicyKind::SlurmBackfill] {
        let pl = &plan(&s, &policy(kind)).placements[0];
        assert_eq!(nodes_of(pl), vec!["h100-s0-l1-n00", "h100-s0-l1-n01"]);
        assert_eq!(pl.level, Level::Leaf);
    }
}

#[test]
fn fifo_goes_by_arrival_and_ignores_priority() {
    let nodes = fleet("h100", 1, 1, 1, 8, false);
    let first = with("first", 1, 8, Level::Region, 1, 0);
    let mut urgent = with("urgent", 1, 8, Level::Region, 2, 0);
    urgent.priority = 9;
    let s = snap(nodes, vec![urgent, first]);
    let p = plan(&s, &policy(PolicyKind::FifoFirstFit));
    assert_eq!(p.placements[0].job, "first");
    assert_eq!(
        *reason_of(&p, "urgent"),
        WaitReason::NoCapacity {
            required: Level::Region,
            free_gpus: 0
        }
    );
    assert_eq!(
        plan(&s, &policy(PolicyKind::SlurmBackfill)).placements[0].job,
        "urgent"
    );
}

/// Two leaves of two nodes, one free node in leaf 1 now. l0-n00 frees at
/// t=10, l1-n00 at t=20, l0-n01 at t=30. A 16-GPU gang fits across the
/// leaves at t=10 but inside one leaf (leaf 1) only at t=20.
fn two_leaves_freeing() -> Snapshot {
    let mut s = snap(fleet("h100", 1, 2, 2, 8, false), vec![]);
    busy(
        &mut s,
        &[
            ("h100-s0-l0-n00", ALL8, 10),
            ("h100-s0-l1-n00", ALL8, 20),
            ("h100-s0-l0-n01", ALL8, 30),
        ],
    );
    s
}

fn reserved_nodes(p: &Plan) -> Vec<&str> {
    p.reservations[0]
        .gpus
        .iter()
        .map(|(n, _)| n.as_str())
        .collect()
}

#[test]
fn gangway_reserves_within_one_leaf_for_a_leaf_required_gang() {
    let mut s = two_leaves_freeing();
    s.queue = vec![with("gang", 2, 8, Level::Leaf, 0, 100)];
    let p = plan(&s, &policy(PolicyKind::Gangway));
    assert_eq!(p.reservations[0].start, 20);
    assert_eq!(p.reservations[0].level, Level::Leaf);
    assert_eq!(reserved_nodes(&p), vec!["h100-s0-l1-n00", "h100-s0-l1-n01"]);
}

#[test]
fn gangway_waits_for_the_preferred_leaf_where_slurm_reserves_a_scattered_set() {
    let mut s = two_leaves_freeing();
    let mut gang = with("gang", 2, 8, Level::Region, 0, 100);
    gang.preferred = Level::Leaf;
    s.queue = vec![gang];
    let slurm = plan(&s, &policy(PolicyKind::SlurmBackfill));
    assert_eq!(slurm.reservations[0].start, 10);
    assert_eq!(slurm.reservations[0].level, Level::Spine);
    assert_eq!(
        reserved_nodes(&slurm),
        vec!["h100-s0-l0-n00", "h100-s0-l1-n01"]
    );
    let gangway = plan(&s, &policy(PolicyKind::Gangway));
    assert_eq!(gangway.reservations[0].start, 20);
    assert_eq!(gangway.reservations[0].level, Level::Leaf);
    assert_eq!(
        reserved_nodes(&gangway),
        vec!["h100-s0-l1-n00", "h100-s0-l1-n01"]
    );
}

#[test]
fn gangway_waits_for_its_preferred_level_only_within_its_patience() {
    // The leaf frees 10 s after the scattered set. A 100 s gang waits 10 s
    // (within 25 % of its run); a 20 s gang does not (patience 5 s) and
    // reserves the scattered set, as Slurm-like does.
    let mut s = two_leaves_freeing();
    let mut gang = with("gang", 2, 8, Level::Region, 0, 20);
    gang.preferred = Level::Leaf;
    s.queue = vec![gang];
    let p = plan(&s, &policy(PolicyKind::Gangway));
    assert_eq!(p.reservations[0].start, 10);
    assert_eq!(p.reservations[0].level, Level::Spine);
    // More patience: it waits for the leaf again.
    let p = plan(
        &s,
        &Policy {
            locality_patience_pct: 50,
            ..policy(PolicyKind::Gangway)
        },
    );
    assert_eq!(p.reservations[0].start, 20);
    assert_eq!(p.reservations[0].level, Level::Leaf);
}

#[test]
fn gangway_reserves_for_several_gangs_where_easy_reserves_for_one() {
    // Leaf 0 frees whole at t=10; leaf 1 has one free node now and frees the
    // other at t=20. Gang 1 gets leaf 0; gang 2 needs leaf 1 at t=20.
    let mut s = snap(fleet("h100", 1, 2, 2, 8, false), vec![]);
    busy(
        &mut s,
        &[
            ("h100-s0-l0-n00", ALL8, 10),
            ("h100-s0-l0-n01", ALL8, 10),
            ("h100-s0-l1-n01", ALL8, 20),
        ],
    );
    let mut g1 = with("gang1", 2, 8, Level::Leaf, 0, 100);
    g1.priority = 2;
    let mut g2 = with("gang2", 2, 8, Level::Leaf, 1, 100);
    g2.priority = 1;
    s.queue = vec![g1, g2, with("long", 1, 8, Level::Region, 2, 1_000)];

    let easy = plan(&s, &policy(PolicyKind::SlurmBackfill));
    assert_eq!(easy.reservations.len(), 1);
    assert_eq!(reason_of(&easy, "gang2").code(), "no_capacity");
    // The long job takes the free node gang 2 needs, delaying it to t=1,000.
    assert_eq!(placed_on(&easy, "long")[0].0, "h100-s0-l1-n00");

    // Gangway holds leaf 1 for gang 2 too. The long job may not take b0 and
    // gets the third reservation: l0-n00 once gang 1 is expected to end.
    let gangway = plan(&s, &policy(PolicyKind::Gangway));
    let starts: Vec<(&str, u64)> = gangway
        .reservations
        .iter()
        .map(|r| (r.job.as_str(), r.start))
        .collect();
    assert_eq!(starts, vec![("gang1", 10), ("gang2", 20), ("long", 110)]);
    assert!(gangway.placements.is_empty());
    assert_eq!(
        gangway.reservations[1].gpus,
        vec![
            ("h100-s0-l1-n00".to_string(), ALL8.to_vec()),
            ("h100-s0-l1-n01".to_string(), ALL8.to_vec())
        ]
    );
}

#[test]
fn a_long_unit_is_blocked_by_the_reservation_that_holds_what_it_needs() {
    // As above with a fifth, earlier gang that takes Gangway's spare
    // reservations: the long job then waits, naming gang 2.
    let mut s = snap(fleet("h100", 1, 2, 2, 8, false), vec![]);
    busy(
        &mut s,
        &[
            ("h100-s0-l0-n00", ALL8, 10),
            ("h100-s0-l0-n01", ALL8, 10),
            ("h100-s0-l1-n01", ALL8, 20),
        ],
    );
    let mut queue = Vec::new();
    for (i, job) in ["gang1", "gang2", "gang3", "gang4"].into_iter().enumerate() {
        let mut g = with(job, 2, 8, Level::Leaf, i as u64, 100);
        g.priority = 1;
        queue.push(g);
    }
    queue.push(with("long", 1, 8, Level::Region, 9, 1_000));
    s.queue = queue;
    let p = plan(&s, &policy(PolicyKind::Gangway));
    assert_eq!(p.reservations.len(), GANGWAY_MAX);
    assert_eq!(
        *reason_of(&p, "long"),
        WaitReason::BlockedByReservation {
            job: "gang2".into(),
            start: 20
        }
    );
}

const GANGWAY_MAX: usize = 4;

#[test]
fn reserved_gpus_count_against_the_tenant_quota() {
    let mut s = easy_example();
    s.quotas.insert(("acme".into(), "h100".into()), 36);
    let p = plan(&s, &policy(PolicyKind::Gangway));
    // The head's 32 reserved GPUs leave 4 of acme's 36: the 4-GPU job
    // starts, and an 8-GPU job would push the head over quota when it
    // starts. (The figure counts what the pass started too.)
    assert_eq!(placed_on(&p, "small-long")[0].0, "h100-s0-l0-n02");
    assert_eq!(
        *reason_of(&p, "short"),
        WaitReason::OverQuota {
            gpu_type: "h100".into(),
            quota: 36,
            in_use: 36,
            requested: 8
        }
    );
}

#[test]
fn backfill_that_moves_a_reservation_is_planned_again() {
    // Leaf 0: a0 free, a1 busy until t=10, a2 half busy for good. Leaf 1:
    // b0 free, b1 and b2 busy until t=10. At t=10 leaf 0 has 20 free GPUs,
    // leaf 1 24, so the gang's best fit is leaf 0 (a0, a1). The long job
    // then starts on b0, which leaves leaf 1 with only 16 GPUs at t=10: the
    // best fit at t=10 is now leaf 1, and a0 is no longer needed. The pass
    // recomputes its reservations after backfill, so it starts the second
    // long job on a0 itself rather than leaving that to the next pass.
    let mut s = snap(fleet("h100", 1, 2, 3, 8, false), vec![]);
    busy(
        &mut s,
        &[
            ("h100-s0-l0-n01", ALL8, 10),
            ("h100-s0-l0-n02", &[0, 1, 2, 3], u64::MAX),
            ("h100-s0-l1-n01", ALL8, 10),
            ("h100-s0-l1-n02", ALL8, 10),
        ],
    );
    let mut gang = with("gang", 2, 8, Level::Leaf, 0, 100);
    gang.priority = 1;
    s.queue = vec![
        gang,
        with("long1", 1, 8, Level::Region, 1, 1_000),
        with("long2", 1, 8, Level::Region, 2, 1_000),
    ];
    for kind in [PolicyKind::SlurmBackfill, PolicyKind::Gangway] {
        let p = plan(&s, &policy(kind));
        assert_eq!(placed_on(&p, "long1")[0].0, "h100-s0-l1-n00");
        assert_eq!(placed_on(&p, "long2")[0].0, "h100-s0-l0-n00");
        assert_eq!(p.reservations[0].start, 10);
        assert_eq!(reserved_nodes(&p), vec!["h100-s0-l1-n01", "h100-s0-l1-n02"]);
        let next = apply(&s, &p);
        let again = plan(&next, &policy(kind));
        assert!(again.placements.is_empty());
        assert_eq!(again.reservations, p.reservations);
    }
}

#[test]
fn apply_records_placed_units_as_running() {
    let mut s = easy_example();
    s.now = 5;
    let p = plan(&s, &policy(PolicyKind::Gangway));
    let next = apply(&s, &p);
    let short = next.running.iter().find(|r| r.job == "short").unwrap();
    assert_eq!(short.expected_end, 155);
    assert_eq!(
        short.gpus,
        vec![("h100-s0-l0-n03".to_string(), ALL8.to_vec())]
    );
    assert_eq!(short.tenant, "acme");
}

#[test]
fn a_rack_takes_only_what_its_power_budget_feeds_and_keeps_whole_nodes_whole() {
    // One rack of two 8-GPU nodes: n00 has 3 GPUs free, n01 all 8. The
    // rack may add 8 × 700 W: the 3 partly used GPUs are hidden, the whole
    // node stays whole, so the 8-GPU job starts and the 1-GPU one waits.
    let mut nodes = fleet("h100", 1, 1, 2, 8, false);
    nodes[0].free = vec![5, 6, 7];
    let leaf = nodes[0].leaf.clone();
    let mut s = snap(
        nodes,
        vec![req("big", 1, 8, Level::Region), {
            let mut r = req("small", 1, 1, Level::Region);
            r.seq = 1;
            r
        }],
    );
    s.gpu_power_w.insert("h100".into(), 700);
    s.power_headroom_w
        .insert((leaf.clone(), "h100".into()), 8 * 700 + 699);
    let p = plan(&s, &Policy::default());
    assert_eq!(p.placements.len(), 1, "{:?}", p.waiting);
    assert_eq!(p.placements[0].job, "big");
    assert_eq!(nodes_of(&p.placements[0]), vec![s.nodes[1].id.as_str()]);
    assert_eq!(p.waiting[0].job, "small");
    // Room for 9: the small one goes on the partly used node.
    s.power_headroom_w
        .insert((leaf.clone(), "h100".into()), 9 * 700);
    let p = plan(&s, &Policy::default());
    assert_eq!(p.placements.len(), 2);
    // No room at all: nothing starts; another type's budget does not apply.
    s.power_headroom_w.insert((leaf.clone(), "h100".into()), 0);
    assert!(plan(&s, &Policy::default()).placements.is_empty());
    s.power_headroom_w.clear();
    s.power_headroom_w.insert((leaf, "a100".into()), 0);
    assert_eq!(plan(&s, &Policy::default()).placements.len(), 2);
}
