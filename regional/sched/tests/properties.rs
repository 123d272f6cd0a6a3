//! Property tests of the scheduler core on small random fleets and queues,
//! for each of the three disciplines.
//!
//! Besides the invariants (no GPU twice, gangs whole, one domain, quotas,
//! determinism, a second pass on the result adds nothing), plans without
//! running units to reason about are compared with `reference` (best fit) or
//! `fifo_reference` (first fit), slow and literal transcriptions of the
//! placement rules that share no code with the indexed implementation. On
//! snapshots with running units and estimates, the reservation rules are
//! checked: a reservation is never delayed by backfill, and its GPUs are
//! really free at its start.

use std::collections::{BTreeMap, BTreeSet};

use gangway_sched::{
    apply, plan, plan_partitioned, Level, Node, Placement, Plan, Policy, PolicyKind, Request,
    Running, Snapshot, WaitReason,
};
use proptest::prelude::*;

const KINDS: [PolicyKind; 3] = [
    PolicyKind::Gangway,
    PolicyKind::SlurmBackfill,
    PolicyKind::FifoFirstFit,
];

fn policy(kind: PolicyKind) -> Policy {
    Policy {
        kind,
        ..Default::default()
    }
}

const TYPES: [&str; 3] = ["a", "b", "c"]; // no node ever has type "c"

/// One node's shape before ids: (spine, leaf, nvlink domain, type, gpus).
fn fleet() -> impl Strategy<Value = Vec<Node>> {
    // spines → leaves → NVLink domains → nodes, each 1..=3 (nodes 1..=2).
    let leaf = (
        0usize..2,
        prop::sample::select(vec![1u32, 2, 4, 8]),
        prop::collection::vec(1usize..=2, 1..=3),
    );
    let spine = prop::collection::vec(leaf, 1..=3);
    prop::collection::vec(spine, 1..=2)
        .prop_flat_map(|spines| {
            let mut shapes = Vec::new();
            for (s, leaves) in spines.iter().enumerate() {
                for (l, (ty, gpus, domains)) in leaves.iter().enumerate() {
                    for (v, &n) in domains.iter().enumerate() {
                        for m in 0..n {
                            shapes.push((s, l, v, m, TYPES[*ty], *gpus));
                        }
                    }
                }
            }
            let per_node = (any::<u8>(), prop::bool::weighted(0.9));
            (
                Just(shapes.clone()),
                prop::collection::vec(per_node, shapes.len()),
                any::<bool>(),
            )
        })
        .prop_map(|(shapes, states, local_names)| {
            shapes
                .into_iter()
                .zip(states)
                .map(|((s, l, v, m, ty, gpus), (mask, schedulable))| {
                    let spine = format!("s{s}");
                    // Local names repeat across parents ("l0" in every spine),
                    // so id order and topology order differ.
                    let (leaf, nvlink_domain) = if local_names {
                        (format!("l{l}"), format!("v{v}"))
                    } else {
                        (format!("{spine}-l{l}"), format!("{spine}-l{l}-v{v}"))
                    };
                    Node {
                        id: format!("s{s}-l{l}-v{v}-n{m}"),
                        spine,
                        leaf,
                        nvlink_domain,
                        gpu_type: ty.to_string(),
                        gpus,
                        free: (0..gpus).filter(|g| mask & (1 << g) != 0).collect(),
                        schedulable,
                    }
                })
                .collect()
        })
}

fn level() -> impl Strategy<Value = Level> {
    prop::sample::select(Level::ALL.to_vec())
}

/// `estimates`: draw run-time estimates (else all 0, unknown).
fn queue(estimates: bool) -> impl Strategy<Value = Vec<Request>> {
    let estimate = if estimates {
        prop_oneof![1 => Just(0u64), 3 => 1u64..=40].boxed()
    } else {
        Just(0u64).boxed()
    };
    let one = (
        1u32..=4,
        any::<bool>(),
        0usize..2,
        prop::sample::select(vec!["a", "a", "b", "c"]),
        prop::sample::select(vec![1u32, 1, 2, 3, 4, 8]),
        level(),
        level(),
        -1i32..=1,
        0u64..4,
        estimate,
    );
    prop::collection::vec(one, 0..=12).prop_map(|reqs| {
        reqs.into_iter()
            .enumerate()
            .map(
                |(i, (w, array, tenant, ty, gpw, required, preferred, priority, seq, est))| {
                    Request {
                        job: format!("j{i:02}"),
                        ranks: if array { vec![w] } else { (0..w).collect() },
                        tenant: format!("t{tenant}"),
                        gpu_type: ty.to_string(),
                        gpus_per_worker: gpw,
                        required,
                        preferred,
                        priority,
                        seq,
                        estimated_duration_s: est,
                        min_workers: 0,
                        submitted: 0,
                        reservation: None,
                    }
                },
            )
            .collect()
    })
}

/// A snapshot with nothing running and no estimates: no reservation can be
/// computed, so every discipline is a plain greedy pass.
fn snapshot() -> impl Strategy<Value = Snapshot> {
    base_snapshot(false)
}

fn base_snapshot(estimates: bool) -> impl Strategy<Value = Snapshot> {
    let key = || (0usize..2, prop::sample::select(vec!["a", "b"]));
    (
        fleet(),
        queue(estimates),
        prop::collection::vec((key(), 0u32..=24), 0..=3),
        prop::collection::vec((key(), 0u32..=12), 0..=3),
        any::<i64>(),
    )
        .prop_map(|(nodes, queue, quotas, usage, generation)| {
            let k = |((t, ty), v): ((usize, &str), u32)| ((format!("t{t}"), ty.to_string()), v);
            Snapshot {
                generation,
                nodes,
                queue,
                quotas: quotas.into_iter().map(k).collect(),
                usage: usage.into_iter().map(k).collect(),
                ..Default::default()
            }
        })
}

/// Knuth's MMIX LCG, to spread one drawn seed over the running units.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// A snapshot whose busy GPUs (every GPU not free) belong to running units
/// with expected ends around `now` (some overrun, a few unknown), some of
/// them spanning two nodes, and whose queue carries estimates.
fn busy_snapshot() -> impl Strategy<Value = Snapshot> {
    (base_snapshot(true), any::<u64>(), 0u64..=50).prop_map(|(mut s, seed, now)| {
        let mut rng = Lcg(seed);
        s.now = now;
        let mut running: Vec<Running> = Vec::new();
        for n in &s.nodes {
            let busy: Vec<u32> = (0..n.gpus).filter(|g| !n.free.contains(g)).collect();
            let mut rest = busy.as_slice();
            while !rest.is_empty() {
                let k = 1 + rng.below(rest.len() as u64) as usize;
                let (part, tail) = rest.split_at(k);
                rest = tail;
                // Now and then the unit continues one on the previous node.
                let join = rng.below(4) == 0;
                match running.last_mut() {
                    Some(r)
                        if join
                            && r.gpu_type == n.gpu_type
                            && r.gpus.len() < 3
                            && r.gpus.iter().all(|(id, _)| *id != n.id) =>
                    {
                        r.gpus.push((n.id.clone(), part.to_vec()));
                    }
                    _ => {
                        let expected_end = match rng.below(20) {
                            0 => u64::MAX,
                            _ => (now + rng.below(44)).saturating_sub(3),
                        };
                        running.push(Running {
                            job: format!("r{}", running.len()),
                            tenant: format!("t{}", rng.below(2)),
                            gpu_type: n.gpu_type.clone(),
                            priority: 0,
                            gpus: vec![(n.id.clone(), part.to_vec())],
                            expected_end,
                            ..Default::default()
                        });
                    }
                }
            }
        }
        s.running = running;
        s
    })
}

/// A gang-heavy snapshot: one type, uniform 8-GPU nodes in 2–6 leaves, most
/// of them busy (whole or half) with running units ending at different
/// times, and a queue of 8- and 4-GPU-per-worker gangs that often must stay
/// in one leaf. Here reservations compete for leaves, which is where
/// backfill can move them.
fn gang_snapshot() -> impl Strategy<Value = Snapshot> {
    (any::<u64>(), 1u32..=2, 2u32..=3, 2u32..=3, 0u64..=20).prop_map(
        |(seed, spines, leaves, per_leaf, now)| {
            let mut rng = Lcg(seed);
            let mut nodes = Vec::new();
            let mut running = Vec::new();
            for sp in 0..spines {
                for l in 0..leaves {
                    for n in 0..per_leaf {
                        let id = format!("s{sp}-l{l}-n{n}");
                        let busy: Vec<u32> = match rng.below(10) {
                            0..=2 => vec![],
                            3..=7 => (0..8).collect(),
                            _ => (0..4).collect(),
                        };
                        if !busy.is_empty() {
                            let expected_end = match rng.below(12) {
                                0 => u64::MAX,
                                k => now + k * 3,
                            };
                            running.push(Running {
                                job: format!("r{}", running.len()),
                                tenant: "t0".into(),
                                gpu_type: "a".into(),
                                priority: 0,
                                gpus: vec![(id.clone(), busy.clone())],
                                expected_end,
                                ..Default::default()
                            });
                        }
                        nodes.push(Node {
                            nvlink_domain: id.clone(),
                            spine: format!("s{sp}"),
                            leaf: format!("s{sp}-l{l}"),
                            gpu_type: "a".into(),
                            gpus: 8,
                            free: (0..8).filter(|g| !busy.contains(g)).collect(),
                            schedulable: true,
                            id,
                        });
                    }
                }
            }
            let levels = [Level::Leaf, Level::Leaf, Level::Spine, Level::Region];
            let queue = (0..1 + rng.below(8))
                .map(|i| Request {
                    job: format!("j{i:02}"),
                    ranks: (0..1 + rng.below(3) as u32).collect(),
                    tenant: format!("t{}", rng.below(2)),
                    gpu_type: "a".into(),
                    gpus_per_worker: [8, 8, 4][rng.below(3) as usize],
                    required: levels[rng.below(4) as usize],
                    preferred: Level::ALL[rng.below(4) as usize],
                    priority: rng.below(3) as i32 - 1,
                    seq: i,
                    estimated_duration_s: [0, 5, 10, 40, 200][rng.below(5) as usize],
                    min_workers: 0,
                    submitted: 0,
                    reservation: None,
                })
                .collect();
            Snapshot {
                generation: 1,
                nodes,
                queue,
                now,
                running,
                ..Default::default()
            }
        },
    )
}

/// Either generator with running units.
fn any_busy_snapshot() -> impl Strategy<Value = Snapshot> {
    prop_oneof![busy_snapshot(), gang_snapshot()]
}

// ---------------------------------------------------------------------------
// The reference: the rules as written, recomputed from scratch for every unit.

/// The domain of `n` at `level` as a path, and its id.
fn domain(n: &Node, level: Level) -> (Vec<&str>, &str) {
    match level {
        Level::Nvlink => (vec![&n.spine, &n.leaf, &n.nvlink_domain], &n.nvlink_domain),
        Level::Leaf => (vec![&n.spine, &n.leaf], &n.leaf),
        Level::Spine => (vec![&n.spine], &n.spine),
        Level::Region => (vec![], ""),
    }
}

fn below(level: Level) -> Option<Level> {
    match level {
        Level::Nvlink => None,
        Level::Leaf => Some(Level::Nvlink),
        Level::Spine => Some(Level::Leaf),
        Level::Region => Some(Level::Spine),
    }
}

struct Ref<'a> {
    nodes: &'a [Node],
    free: Vec<Vec<u32>>,
}

impl Ref<'_> {
    fn cap(&self, members: &[usize], gpw: u32) -> u32 {
        members
            .iter()
            .map(|&i| self.free[i].len() as u32 / gpw)
            .sum()
    }

    fn spread(
        &self,
        members: &[usize],
        level: Level,
        want: u32,
        gpw: u32,
        out: &mut Vec<(usize, u32)>,
    ) {
        // children: (cap, id, members)
        let mut children: Vec<(u32, String, Vec<usize>)> = match below(level) {
            None => members
                .iter()
                .map(|&i| (self.cap(&[i], gpw), self.nodes[i].id.clone(), vec![i]))
                .collect(),
            Some(l) => {
                let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
                for &i in members {
                    groups
                        .entry(domain(&self.nodes[i], l).1.to_string())
                        .or_default()
                        .push(i);
                }
                groups
                    .into_iter()
                    .map(|(id, m)| (self.cap(&m, gpw), id, m))
                    .collect()
            }
        };
        children.retain(|c| c.0 > 0);
        let mut left = want;
        while left > 0 {
            let fit = children
                .iter()
                .filter(|c| c.0 >= left)
                .min_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
            let (take, id) = match fit {
                Some(c) => (left, c.1.clone()),
                None => {
                    let big = children
                        .iter()
                        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
                        .unwrap();
                    (big.0, big.1.clone())
                }
            };
            let pos = children.iter().position(|c| c.1 == id).unwrap();
            let (_, _, m) = children.remove(pos);
            match below(level) {
                None => out.push((m[0], take)),
                Some(l) => self.spread(&m, l, take, gpw, out),
            }
            left -= take;
        }
    }
}

/// Gangway's fair order, written plainly: the highest priority class left;
/// in it, each tenant's oldest unit; of those, the tenant under its
/// guarantee of the unit's type first, then the lowest dominant share
/// (held + history over capacity, over weight, across every type the tenant
/// holds, has terms for or queues for), then the oldest, then the tenant.
fn fair_pick(
    s: &Snapshot,
    queue: &[&Request],
    left: &[&Request],
    usage: &BTreeMap<(String, String), u32>,
) -> usize {
    let top = left.iter().map(|r| r.priority).max().expect("not empty");
    let mut capacity: BTreeMap<&str, u64> = BTreeMap::new();
    for n in nodes_by_id(s).values() {
        *capacity.entry(n.gpu_type.as_str()).or_default() += u64::from(n.gpus);
    }
    let key = |i: usize| {
        let u = left[i];
        let t = u.tenant.as_str();
        let terms = |g: &str| {
            s.shares
                .get(&(t.to_string(), g.to_string()))
                .copied()
                .unwrap_or_default()
        };
        let held = |g: &str| {
            u64::from(
                usage
                    .get(&(t.to_string(), g.to_string()))
                    .copied()
                    .unwrap_or(0),
            )
        };
        let mut types: BTreeSet<&str> = BTreeSet::new();
        types.extend(s.usage.keys().filter(|k| k.0 == t).map(|k| k.1.as_str()));
        types.extend(s.shares.keys().filter(|k| k.0 == t).map(|k| k.1.as_str()));
        types.extend(
            queue
                .iter()
                .filter(|q| q.tenant == t)
                .map(|q| q.gpu_type.as_str()),
        );
        let dominant = types
            .iter()
            .filter(|g| capacity.get(*g).copied().unwrap_or(0) > 0)
            .map(|g| {
                let amount = u128::from(held(g)) * 1000 + u128::from(terms(g).history);
                amount * 1_000_000_000 / (u128::from(capacity[g]) * u128::from(terms(g).weight()))
            })
            .max()
            .unwrap_or(0);
        let under = held(&u.gpu_type) < u64::from(terms(&u.gpu_type).guaranteed);
        (!under, dominant, u.seq, t.to_string())
    };
    // Each tenant's next unit in the top class: the smallest work first,
    // one rank per power of two of GPU-seconds (unknown last), lifted one
    // rank per hour waited; then queue order (left is in queue order).
    let rank = |u: &Request| -> i64 {
        let size = match u.estimated_duration_s {
            0 => 64,
            d => (u.gpus() * d).max(1).ilog2() as i64,
        };
        size - (s.now.saturating_sub(u.submitted) / 3_600) as i64
    };
    let mut firsts: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, u) in left.iter().enumerate().filter(|(_, u)| u.priority == top) {
        let e = firsts.entry(u.tenant.as_str()).or_insert(i);
        if rank(u) < rank(left[*e]) {
            *e = i;
        }
    }
    firsts
        .values()
        .copied()
        .min_by_key(|&i| key(i))
        .expect("a unit in the top class")
}

fn reference(s: &Snapshot, kind: PolicyKind) -> Plan {
    let mut queue: Vec<&Request> = s.queue.iter().collect();
    queue.sort_by(|a, b| {
        (std::cmp::Reverse(a.priority), a.seq, &a.job, a.ranks[0]).cmp(&(
            std::cmp::Reverse(b.priority),
            b.seq,
            &b.job,
            b.ranks[0],
        ))
    });
    let mut r = Ref {
        nodes: &s.nodes,
        free: s.nodes.iter().map(|n| n.free.clone()).collect(),
    };
    let mut usage: BTreeMap<(String, String), u32> = s.usage.clone();
    let mut out = Plan {
        generation: s.generation,
        ..Plan::default()
    };
    let mut left = queue.clone();
    while !left.is_empty() {
        let at = match kind {
            PolicyKind::Gangway => fair_pick(s, &queue, &left, &usage),
            _ => 0,
        };
        let req = left.remove(at);
        let w = req.ranks.len() as u32;
        let gpw = req.gpus_per_worker;
        let key = (req.tenant.clone(), req.gpu_type.clone());
        let in_use = usage.get(&key).copied().unwrap_or(0);
        let waiting = |reason| gangway_sched::Waiting {
            job: req.job.clone(),
            ranks: req.ranks.clone(),
            reason,
        };
        if let Some(&quota) = s.quotas.get(&key) {
            if in_use + w * gpw > quota {
                out.waiting.push(waiting(WaitReason::OverQuota {
                    gpu_type: req.gpu_type.clone(),
                    quota,
                    in_use,
                    requested: w * gpw,
                }));
                continue;
            }
        }
        let eligible: Vec<usize> = (0..s.nodes.len())
            .filter(|&i| s.nodes[i].schedulable && s.nodes[i].gpu_type == req.gpu_type)
            .collect();
        let mut chosen = None;
        for level in Level::ALL.into_iter().filter(|&l| l <= req.required) {
            let mut groups: BTreeMap<Vec<&str>, (&str, Vec<usize>)> = BTreeMap::new();
            for &i in &eligible {
                let (path, id) = domain(&s.nodes[i], level);
                groups.entry(path).or_insert((id, Vec::new())).1.push(i);
            }
            let best = groups
                .values()
                .filter(|(_, m)| r.cap(m, gpw) >= w)
                .min_by_key(|(id, m)| (m.iter().map(|&i| r.free[i].len()).sum::<usize>(), *id));
            if let Some((_, m)) = best {
                chosen = Some((level, m.clone()));
                break;
            }
        }
        let Some((level, members)) = chosen else {
            let free = eligible.iter().map(|&i| r.free[i].len() as u32).sum();
            out.waiting.push(waiting(WaitReason::NoCapacity {
                required: req.required,
                free_gpus: free,
            }));
            continue;
        };
        let mut picks = Vec::new();
        r.spread(&members, level, w, gpw, &mut picks);
        let topo = |i: usize| {
            let n = &s.nodes[i];
            (
                n.spine.clone(),
                n.leaf.clone(),
                n.nvlink_domain.clone(),
                n.id.clone(),
            )
        };
        picks.sort_by_key(|&(i, _)| topo(i));
        let mut ranks = req.ranks.iter();
        let mut workers = Vec::new();
        for (i, k) in picks {
            for _ in 0..k {
                let gpus: Vec<u32> = r.free[i].drain(..gpw as usize).collect();
                workers.push(gangway_sched::WorkerPlacement {
                    rank: *ranks.next().unwrap(),
                    node: s.nodes[i].id.clone(),
                    gpus,
                });
            }
        }
        *usage.entry(key).or_insert(0) += w * gpw;
        out.placements.push(Placement {
            job: req.job.clone(),
            ranks: req.ranks.clone(),
            level,
            workers,
        });
    }
    out
}

/// FIFO's rules as written: arrival order; walk the nodes of the type in
/// id order taking as many workers from each as fit; `required` ignored;
/// the level is the one actually spanned.
fn fifo_reference(s: &Snapshot) -> Plan {
    let mut queue: Vec<&Request> = s.queue.iter().collect();
    queue.sort_by(|a, b| (a.seq, &a.job, a.ranks[0]).cmp(&(b.seq, &b.job, b.ranks[0])));
    let mut ids: Vec<usize> = (0..s.nodes.len()).collect();
    ids.sort_by(|&a, &b| s.nodes[a].id.cmp(&s.nodes[b].id));
    let mut free: Vec<Vec<u32>> = s.nodes.iter().map(|n| n.free.clone()).collect();
    let mut usage: BTreeMap<(String, String), u32> = s.usage.clone();
    let mut out = Plan {
        generation: s.generation,
        ..Plan::default()
    };
    for req in queue {
        let w = req.ranks.len() as u32;
        let gpw = req.gpus_per_worker;
        let key = (req.tenant.clone(), req.gpu_type.clone());
        let in_use = usage.get(&key).copied().unwrap_or(0);
        let waiting = |reason| gangway_sched::Waiting {
            job: req.job.clone(),
            ranks: req.ranks.clone(),
            reason,
        };
        if let Some(&quota) = s.quotas.get(&key) {
            if in_use + w * gpw > quota {
                out.waiting.push(waiting(WaitReason::OverQuota {
                    gpu_type: req.gpu_type.clone(),
                    quota,
                    in_use,
                    requested: w * gpw,
                }));
                continue;
            }
        }
        let eligible: Vec<usize> = ids
            .iter()
            .copied()
            .filter(|&i| s.nodes[i].schedulable && s.nodes[i].gpu_type == req.gpu_type)
            .collect();
        let cap: u32 = eligible.iter().map(|&i| free[i].len() as u32 / gpw).sum();
        if cap < w {
            out.waiting.push(waiting(WaitReason::NoCapacity {
                required: Level::Region,
                free_gpus: eligible.iter().map(|&i| free[i].len() as u32).sum(),
            }));
            continue;
        }
        let mut ranks = req.ranks.iter();
        let mut workers = Vec::new();
        for &i in &eligible {
            while workers.len() < w as usize && free[i].len() as u32 >= gpw {
                let gpus: Vec<u32> = free[i].drain(..gpw as usize).collect();
                workers.push(gangway_sched::WorkerPlacement {
                    rank: *ranks.next().unwrap(),
                    node: s.nodes[i].id.clone(),
                    gpus,
                });
            }
        }
        let on: Vec<&Node> = workers
            .iter()
            .map(|wp| s.nodes.iter().find(|n| n.id == wp.node).unwrap())
            .collect();
        *usage.entry(key).or_insert(0) += w * gpw;
        out.placements.push(Placement {
            job: req.job.clone(),
            ranks: req.ranks.clone(),
            level: spanned(&on),
            workers,
        });
    }
    out
}

/// The lowest level one domain of which holds all of `nodes`.
fn spanned(nodes: &[&Node]) -> Level {
    Level::ALL
        .into_iter()
        .find(|&l| {
            nodes
                .iter()
                .all(|n| domain(n, l).0 == domain(nodes[0], l).0)
        })
        .unwrap_or(Level::Region)
}

// ---------------------------------------------------------------------------

fn nodes_by_id(s: &Snapshot) -> BTreeMap<&str, &Node> {
    let mut nodes = BTreeMap::new();
    for n in &s.nodes {
        nodes.entry(n.id.as_str()).or_insert(n);
    }
    nodes
}

/// When a unit started now with this estimate ends (`None`: unknown, never).
fn end_of(s: &Snapshot, req: &Request) -> Option<u64> {
    match req.estimated_duration_s {
        0 => None,
        d => s.now.checked_add(d).filter(|&e| e != u64::MAX),
    }
}

fn check_invariants(s: &Snapshot, p: &Plan, kind: PolicyKind) -> Result<(), TestCaseError> {
    let nodes = nodes_by_id(s);
    let queue: BTreeMap<&str, &Request> = s.queue.iter().map(|r| (r.job.as_str(), r)).collect();
    let mut used = BTreeSet::new();
    let mut placed_gpus: BTreeMap<(&str, &str), u32> = BTreeMap::new();
    for pl in &p.placements {
        let req = queue[pl.job.as_str()];
        if kind == PolicyKind::Gangway && req.is_elastic() {
            // An elastic unit starts with a prefix of its ranks, at least its minimum.
            prop_assert!(req.ranks.starts_with(&pl.ranks));
            prop_assert!(pl.ranks.len() >= req.min_workers as usize);
        } else {
            prop_assert_eq!(&pl.ranks, &req.ranks);
        }
        prop_assert_eq!(pl.workers.len(), pl.ranks.len(), "gang placed whole");
        let ranks: Vec<u32> = pl.workers.iter().map(|w| w.rank).collect();
        prop_assert_eq!(&ranks, &pl.ranks, "one worker per rank, in order");
        if kind != PolicyKind::FifoFirstFit {
            prop_assert!(pl.level <= req.required);
        }
        let on: Vec<&Node> = pl.workers.iter().map(|w| nodes[w.node.as_str()]).collect();
        prop_assert_eq!(pl.level, spanned(&on), "the level is the one spanned");
        for w in &pl.workers {
            let n = nodes[w.node.as_str()];
            prop_assert!(n.schedulable && n.gpu_type == req.gpu_type);
            prop_assert_eq!(w.gpus.len() as u32, req.gpus_per_worker);
            for &g in &w.gpus {
                prop_assert!(n.free.contains(&g), "GPU {}:{} was not free", n.id, g);
                prop_assert!(
                    used.insert((n.id.as_str(), g)),
                    "GPU {}:{} placed twice",
                    n.id,
                    g
                );
            }
        }
        *placed_gpus.entry((&req.tenant, &req.gpu_type)).or_default() +=
            pl.ranks.len() as u32 * req.gpus_per_worker;
    }
    for ((tenant, ty), placed) in placed_gpus {
        if let Some(&q) = s.quotas.get(&(tenant.to_string(), ty.to_string())) {
            let before = s
                .usage
                .get(&(tenant.to_string(), ty.to_string()))
                .copied()
                .unwrap_or(0);
            prop_assert!(before + placed <= q, "quota of {}/{} exceeded", tenant, ty);
        }
    }
    // Every queued unit is either placed or waiting, exactly once.
    let mut seen: Vec<&str> = p
        .placements
        .iter()
        .map(|x| x.job.as_str())
        .chain(p.waiting.iter().map(|x| x.job.as_str()))
        .collect();
    seen.sort();
    let all: Vec<&str> = queue.keys().copied().collect();
    prop_assert_eq!(seen, all);
    check_reservations(s, p, kind)
}

/// Reservations are well formed: as many per type as the discipline keeps,
/// one `Reserved` wait each, a whole unit inside one domain of its level,
/// and `BlockedByReservation` names one of them.
fn check_reservations(s: &Snapshot, p: &Plan, kind: PolicyKind) -> Result<(), TestCaseError> {
    let nodes = nodes_by_id(s);
    let queue: BTreeMap<(&str, &[u32]), &Request> = s
        .queue
        .iter()
        .map(|r| ((r.job.as_str(), r.ranks.as_slice()), r))
        .collect();
    let most = match kind {
        PolicyKind::Gangway => 4,
        PolicyKind::SlurmBackfill => 1,
        PolicyKind::FifoFirstFit => 0,
    };
    let mut per_type: BTreeMap<&str, usize> = BTreeMap::new();
    let mut from_reservations = Vec::new();
    for r in &p.reservations {
        let req = queue[&(r.job.as_str(), r.ranks.as_slice())];
        *per_type.entry(&req.gpu_type).or_default() += 1;
        // A reserved unit that then chose victims waits for them instead.
        let preempting = p.waiting.iter().any(|w| {
            w.job == r.job
                && w.ranks == r.ranks
                && matches!(w.reason, WaitReason::Preempting { .. })
        });
        if !preempting {
            from_reservations.push((r.job.clone(), r.ranks.clone(), r.start, r.level));
        }
        prop_assert!(r.start >= s.now);
        prop_assert!(r.level <= req.required);
        let mut on = Vec::new();
        let mut total = 0;
        let mut seen = BTreeSet::new();
        for (node, gpus) in &r.gpus {
            let n = nodes[node.as_str()];
            prop_assert!(n.schedulable && n.gpu_type == req.gpu_type);
            prop_assert!(
                !gpus.is_empty() && (gpus.len() as u32).is_multiple_of(req.gpus_per_worker)
            );
            for &g in gpus {
                prop_assert!(g < n.gpus && seen.insert((node.as_str(), g)));
            }
            total += gpus.len() as u64;
            on.push(n);
        }
        let whole = match kind {
            PolicyKind::Gangway => req.min_gpus(),
            _ => req.gpus(),
        };
        prop_assert_eq!(
            total,
            whole,
            "a whole unit (or an elastic one's minimum) is reserved"
        );
        prop_assert_eq!(spanned(&on), r.level, "inside one domain of its level");
    }
    // Under Gangway's discipline, units with victims on their way out
    // reserve beyond the cap.
    let owed = |ty: &str| -> usize {
        if kind != PolicyKind::Gangway {
            return 0;
        }
        p.reservations
            .iter()
            .filter(|r| {
                queue[&(r.job.as_str(), r.ranks.as_slice())].gpu_type == ty
                    && s.running
                        .iter()
                        .any(|x| x.preempted_for.as_deref() == Some(r.job.as_str()))
            })
            .count()
    };
    for (ty, n) in per_type {
        prop_assert!(
            n <= most + owed(ty),
            "{} reservations for {} under {:?}",
            n,
            ty,
            kind
        );
    }
    let mut from_waits = Vec::new();
    for w in &p.waiting {
        match &w.reason {
            WaitReason::Reserved { start, level } => {
                from_waits.push((w.job.clone(), w.ranks.clone(), *start, *level))
            }
            WaitReason::BlockedByReservation { job, start } => prop_assert!(
                p.reservations
                    .iter()
                    .any(|r| &r.job == job && r.start == *start),
                "blocked by a reservation the plan does not hold"
            ),
            _ => {}
        }
    }
    prop_assert_eq!(from_waits, from_reservations);
    Ok(())
}

/// Every GPU of every reservation is free at its start: free now or held by
/// a running unit expected to end by then, not held past it by a unit the
/// plan starts, and not promised to another reservation over the same time.
/// Together with the first condition this is "a reservation is never delayed
/// by backfill": each placement either ends (now + estimate) by the
/// reservation's start or uses none of its GPUs.
fn check_reserved_gpus_are_free_at_start(s: &Snapshot, p: &Plan) -> Result<(), TestCaseError> {
    let nodes = nodes_by_id(s);
    let queue: BTreeMap<(&str, &[u32]), &Request> = s
        .queue
        .iter()
        .map(|r| ((r.job.as_str(), r.ranks.as_slice()), r))
        .collect();
    // (node, gpu) -> when its running holder is expected to let go.
    let mut frees_at: BTreeMap<(&str, u32), u64> = BTreeMap::new();
    for r in &s.running {
        for (node, gpus) in &r.gpus {
            for &g in gpus {
                frees_at.insert((node.as_str(), g), r.expected_end.max(s.now));
            }
        }
    }
    let gpu_set = |list: &[(String, Vec<u32>)]| -> BTreeSet<(String, u32)> {
        list.iter()
            .flat_map(|(n, gs)| gs.iter().map(move |&g| (n.clone(), g)))
            .collect()
    };
    for r in &p.reservations {
        let req = queue[&(r.job.as_str(), r.ranks.as_slice())];
        let mine = gpu_set(&r.gpus);
        for (node, g) in &mine {
            let n = nodes[node.as_str()];
            let free_by_start = n.free.contains(g)
                || frees_at
                    .get(&(node.as_str(), *g))
                    .is_some_and(|&t| t != u64::MAX && t <= r.start);
            prop_assert!(free_by_start, "{}:{} is not free by t={}", node, g, r.start);
        }
        for pl in &p.placements {
            let preq = queue[&(pl.job.as_str(), pl.ranks.as_slice())];
            let uses = pl
                .workers
                .iter()
                .any(|w| w.gpus.iter().any(|&g| mine.contains(&(w.node.clone(), g))));
            let ends_in_time = end_of(s, preq).is_some_and(|e| e <= r.start);
            prop_assert!(
                ends_in_time || !uses,
                "{} started on GPUs reserved for {} from t={} and does not end by then",
                pl.job,
                r.job,
                r.start
            );
        }
        for other in &p.reservations {
            if std::ptr::eq(other, r) || gpu_set(&other.gpus).is_disjoint(&mine) {
                continue;
            }
            let oreq = queue[&(other.job.as_str(), other.ranks.as_slice())];
            let ends = |start: u64, q: &Request| match q.estimated_duration_s {
                0 => u64::MAX,
                d => start.saturating_add(d),
            };
            prop_assert!(
                ends(r.start, req) <= other.start || ends(other.start, oreq) <= r.start,
                "{} and {} are promised the same GPUs at once",
                r.job,
                other.job
            );
        }
    }
    Ok(())
}

proptest! {
    // 128 cases by default; PROPTEST_CASES=20000 for a soak.
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(128)
    ))]

    #[test]
    fn plans_are_valid_and_match_the_reference(s in snapshot()) {
        for kind in KINDS {
            let p = plan(&s, &policy(kind));
            check_invariants(&s, &p, kind)?;
            // Nothing running and no estimates: no start can be computed, so
            // no reservation, and each discipline is its greedy pass.
            prop_assert!(p.reservations.is_empty());
            let expected = match kind {
                PolicyKind::FifoFirstFit => fifo_reference(&s),
                _ => reference(&s, kind),
            };
            prop_assert_eq!(&p, &expected, "{:?}", kind);
        }
    }

    #[test]
    fn plans_with_running_units_are_valid(s in any_busy_snapshot()) {
        for kind in KINDS {
            let p = plan(&s, &policy(kind));
            check_invariants(&s, &p, kind)?;
        }
    }

    #[test]
    fn a_reservation_is_never_delayed_by_backfill(s in any_busy_snapshot()) {
        for kind in KINDS {
            let p = plan(&s, &policy(kind));
            check_reserved_gpus_are_free_at_start(&s, &p)?;
        }
    }

    #[test]
    fn plans_are_deterministic_and_ignore_input_order(s in any_busy_snapshot(), seed in any::<u64>()) {
        for kind in KINDS {
            let p = plan(&s, &policy(kind));
            prop_assert_eq!(&p, &plan(&s.clone(), &policy(kind)));
            // Rotating and reversing the inputs does not change the plan.
            let mut shuffled = s.clone();
            let k = (seed as usize) % shuffled.nodes.len().max(1);
            shuffled.nodes.rotate_left(k);
            shuffled.queue.reverse();
            shuffled.running.reverse();
            if seed % 2 == 0 {
                shuffled.nodes.reverse();
            }
            prop_assert_eq!(&p, &plan(&shuffled, &policy(kind)), "{:?}", kind);
        }
    }

    #[test]
    fn a_second_pass_on_the_result_places_nothing(s in any_busy_snapshot()) {
        for kind in KINDS {
            let p = plan(&s, &policy(kind));
            let next = apply(&s, &p);
            prop_assert_eq!(next.queue.len(), s.queue.len() - p.placements.len());
            prop_assert_eq!(next.running.len(), s.running.len() + p.placements.len());
            let again = plan(&next, &policy(kind));
            if kind == PolicyKind::Gangway {
                // Gangway's order depends on what tenants hold, which the
                // first pass changed: the next pass may give the head's
                // reservations to other units, and a unit the old ones
                // blocked may start. It must still be a valid plan.
                check_invariants(&next, &again, kind)?;
                continue;
            }
            prop_assert!(again.placements.is_empty(), "{:?} placed {:?}", kind, again.placements);
            // What waited still waits (a capacity wait may turn into a quota
            // wait, as usage grew), and the reservations stand.
            let jobs = |p: &Plan| p.waiting.iter().map(|w| w.job.clone()).collect::<Vec<_>>();
            prop_assert_eq!(jobs(&again), jobs(&p));
            prop_assert_eq!(&again.reservations, &p.reservations, "{:?}", kind);
        }
    }

    #[test]
    fn max_placements_gives_a_prefix_of_the_full_plan(s in any_busy_snapshot(), max in 0usize..4) {
        for kind in KINDS {
            let full = plan(&s, &policy(kind));
            let cut = plan(&s, &Policy { max_placements: Some(max), kind, ..Policy::default() });
            let n = full.placements.len().min(max);
            prop_assert_eq!(&cut.placements[..], &full.placements[..n]);
            check_invariants(&s, &cut, kind).ok();
        }
    }
}

// ---------------------------------------------------------------------------
// Preemption (Gangway's discipline).

/// A busy snapshot where running units have every priority, age,
/// checkpoint and preemption count, some already being preempted, tenants
/// have guarantees, and the policy's limits vary.
fn preemption_case() -> impl Strategy<Value = (Snapshot, Policy)> {
    (
        any_busy_snapshot(),
        any::<u64>(),
        prop_oneof![Just(0u64), 0u64..=1500],
        0u32..=4,
        1usize..=8,
        0u32..=24,
        0u32..=24,
    )
        .prop_map(|(mut s, seed, min_run_s, cap, budget, g0, g1)| {
            let mut rng = Lcg(seed);
            s.now += 1000;
            for r in &mut s.running {
                r.priority = [0, 0, 0, 1, 2][rng.below(5) as usize];
                r.started = rng.below(s.now + 1);
                r.checkpointed = match rng.below(3) {
                    0 => None,
                    _ => Some(rng.below(s.now + 1)),
                };
                r.preemptions = rng.below(5) as u32;
                r.tenant = format!("t{}", rng.below(3));
                if rng.below(8) == 0 {
                    r.preempted_for = Some(format!("j{:02}", rng.below(8)));
                }
                r.expected_end = match rng.below(4) {
                    0 => u64::MAX,
                    1 => s.now - rng.below(100),
                    _ => s.now + rng.below(5000),
                };
            }
            s.usage.clear();
            for r in &s.running {
                let n: u64 = r.gpus.iter().map(|(_, g)| g.len() as u64).sum();
                *s.usage
                    .entry((r.tenant.clone(), r.gpu_type.clone()))
                    .or_insert(0) += n as u32;
            }
            for q in &mut s.queue {
                q.priority = [0, 1, 1, 2][rng.below(4) as usize];
                if q.ranks.len() > 1 && rng.below(3) == 0 {
                    q.min_workers = 1 + rng.below(q.ranks.len() as u64 - 1) as u32;
                }
            }
            for r in &mut s.running {
                if rng.below(4) == 0 {
                    let workers = r.gpu_count() as u32;
                    r.elastic = Some(gangway_sched::Elastic {
                        workers,
                        max_workers: workers + rng.below(4) as u32,
                        gpus_per_worker: 1,
                        required: Level::Region,
                    });
                }
            }
            let types: BTreeSet<String> = s.nodes.iter().map(|n| n.gpu_type.clone()).collect();
            for ty in types {
                for (t, g) in [("t0", g0), ("t1", g1)] {
                    s.shares.insert(
                        (t.to_string(), ty.clone()),
                        gangway_sched::Share {
                            guaranteed: g,
                            ..Default::default()
                        },
                    );
                }
            }
            let mut policy = policy(PolicyKind::Gangway);
            policy.preemption.min_run_s = min_run_s;
            policy.preemption.max_preemptions = cap;
            policy.preemption.max_victims_per_pass = budget;
            (s, policy)
        })
}

/// Every preemption follows the rules, and freeing the victims (with what
/// ends by the deadline anyway) lets the unit start.
fn check_preemptions(s: &Snapshot, p: &Plan, policy: &Policy) -> Result<(), TestCaseError> {
    let rules = &policy.preemption;
    let until = s.now + rules.checkpoint_deadline_s;
    let running: BTreeMap<&str, &Running> = s.running.iter().map(|r| (r.job.as_str(), r)).collect();
    let units: BTreeMap<&str, &Request> = s.queue.iter().map(|r| (r.job.as_str(), r)).collect();
    prop_assert!(p.preemptions.len() <= rules.max_victims_per_pass);
    // Every unit that chose victims, and only those, claims what they free.
    let claimants: BTreeSet<&str> = (p.preemptions.iter())
        .filter(|v| v.cause != gangway_sched::PreemptCause::Grow)
        .map(|v| v.for_job.as_str())
        .collect();
    prop_assert_eq!(
        p.claims.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        claimants
    );
    prop_assert!(p.claims.values().all(|&t| t == rules.claim_until(s.now)));
    let mut seen = BTreeSet::new();
    for v in &p.preemptions {
        prop_assert!(seen.insert(v.job.as_str()), "{} chosen twice", v.job);
        let r = running[v.job.as_str()];
        if v.cause == gangway_sched::PreemptCause::Grow {
            prop_assert!(r.preempted_for.is_none());
            prop_assert!(
                s.now - r.started >= rules.min_run_for(r.preemptions),
                "{} too young",
                r.job
            );
            prop_assert_eq!(&v.for_job, &v.job);
            let e = r.elastic.expect("only elastic units grow");
            prop_assert!(e.workers < e.max_workers);
            // Nobody waits for capacity of the type.
            for w in &p.waiting {
                let q = s.queue.iter().find(|q| q.job == w.job).expect("queued");
                let capacity_wait = !matches!(
                    w.reason,
                    WaitReason::Invalid { .. } | WaitReason::OverQuota { .. }
                );
                prop_assert!(
                    !(capacity_wait && q.gpu_type == r.gpu_type),
                    "{} waits",
                    q.job
                );
            }
            continue;
        }
        let u = units[v.for_job.as_str()];
        prop_assert!(r.preempted_for.is_none(), "{} was already leaving", r.job);
        prop_assert_eq!(&r.gpu_type, &u.gpu_type);
        prop_assert!(
            s.now - r.started >= rules.min_run_for(r.preemptions),
            "{} too young",
            r.job
        );
        prop_assert_eq!(v.at_risk_gpu_s, r.at_risk_gpu_s(s.now));
        let g = |t: &str| {
            s.shares
                .get(&(t.to_string(), u.gpu_type.clone()))
                .map_or(0, |x| u64::from(x.guaranteed))
        };
        // What the victim's tenant holds once the pass's starts are
        // counted and units already leaving are not.
        let held = |t: &str| {
            let now = u64::from(
                s.usage
                    .get(&(t.to_string(), u.gpu_type.clone()))
                    .copied()
                    .unwrap_or(0),
            );
            let placed: u64 = (p.placements.iter())
                .map(|x| (units[x.job.as_str()], x.workers.len() as u64))
                .filter(|(q, _)| q.tenant == t && q.gpu_type == u.gpu_type)
                .map(|(q, w)| w * u64::from(q.gpus_per_worker))
                .sum();
            let leaving: u64 = (s.running.iter())
                .filter(|x| x.tenant == t && x.gpu_type == u.gpu_type && x.preempted_for.is_some())
                .map(|x| x.gpu_count())
                .sum();
            // Units that chose victims count as holding what they wait for.
            let waiting_for: BTreeSet<&str> = (p.preemptions.iter())
                .filter(|x| x.cause != gangway_sched::PreemptCause::Grow)
                .map(|x| x.for_job.as_str())
                .collect();
            let promised: u64 = (waiting_for.iter())
                .map(|j| units[j])
                .filter(|q| q.tenant == t && q.gpu_type == u.gpu_type)
                .map(|q| q.gpus())
                .sum();
            (now + placed + promised).saturating_sub(leaving)
        };
        match v.cause {
            gangway_sched::PreemptCause::Priority => {
                prop_assert!(r.priority <= gangway_sched::PREEMPTIBLE_PRIORITY);
                prop_assert!(r.priority < u.priority);
                prop_assert!(r.preemptions < rules.max_preemptions);
                prop_assert!(
                    r.tenant == u.tenant || held(&r.tenant) > g(&r.tenant),
                    "{} was within its guarantee",
                    r.tenant
                );
            }
            gangway_sched::PreemptCause::Grow => unreachable!("handled above"),
            gangway_sched::PreemptCause::Reservation => {
                let id = u.reservation.as_deref().expect("only a reservation's unit");
                prop_assert!(r.priority <= gangway_sched::PREEMPTIBLE_PRIORITY);
                prop_assert!(r.reservation.as_deref() != Some(id));
                let res = s
                    .reserved
                    .iter()
                    .find(|x| x.id == id)
                    .expect("a known reservation");
                prop_assert!(
                    r.gpus
                        .iter()
                        .any(|(n, _)| s.nodes.iter().any(|x| x.id == *n && res.holds(x))),
                    "{} is not in {}",
                    r.job,
                    id
                );
            }
            gangway_sched::PreemptCause::Defrag => {
                prop_assert!(rules.defrag);
                prop_assert!(u.ranks.len() >= 2, "only gangs defragment");
                prop_assert!(
                    r.priority <= gangway_sched::PREEMPTIBLE_PRIORITY
                        || held(&r.tenant) > g(&r.tenant),
                    "{} is neither preemptible nor borrowing",
                    r.job
                );
                prop_assert!(r.priority <= u.priority);
                prop_assert!(r.preemptions < rules.max_preemptions);
                prop_assert!(r.gpus.len() == 1 && r.gpu_count() < u64::from(u.gpus_per_worker));
            }
            gangway_sched::PreemptCause::Reclaim => {
                prop_assert!(r.tenant != u.tenant);
                prop_assert!(g(&u.tenant) >= u.gpus(), "reclaim beyond the guarantee");
                prop_assert!(
                    held(&r.tenant) > g(&r.tenant),
                    "{} was not borrowing",
                    r.tenant
                );
            }
        }
        let w = p
            .waiting
            .iter()
            .find(|w| w.job == v.for_job)
            .expect("the unit waits");
        match &w.reason {
            WaitReason::Preempting { victims, until: by } => {
                prop_assert!(victims.contains(&v.job));
                prop_assert_eq!(*by, until);
            }
            other => prop_assert!(false, "{} waits as {:?}", w.job, other),
        }
        // Free the victims of this unit, and what ends by the deadline: it fits.
        let mine: BTreeSet<&str> = p
            .preemptions
            .iter()
            .filter(|x| x.for_job == v.for_job)
            .map(|x| x.job.as_str())
            .collect();
        let mut next = apply(s, p);
        let freeing: Vec<Running> = next
            .running
            .iter()
            .filter(|r| {
                mine.contains(r.job.as_str())
                    || (r.preempted_for.is_none()
                        && r.expected_end > s.now
                        && r.expected_end <= until)
            })
            .cloned()
            .collect();
        for r in &freeing {
            for (node, gpus) in &r.gpus {
                if let Some(n) = next.nodes.iter_mut().find(|n| n.id == *node) {
                    n.free.extend(gpus.iter().copied().filter(|g| *g < n.gpus));
                    n.free.sort_unstable();
                    n.free.dedup();
                }
            }
        }
        next.running
            .retain(|r| !freeing.iter().any(|f| f.job == r.job));
        next.queue = vec![u.clone()];
        next.quotas.clear();
        let mut alone = policy.clone();
        alone.preemption.enabled = false;
        let again = plan(&next, &alone);
        prop_assert_eq!(
            again.placements.len(),
            1,
            "{} does not fit after its victims leave",
            u.job
        );
    }
    for w in &p.waiting {
        if let WaitReason::Preempting { victims, .. } = &w.reason {
            for v in victims {
                let chosen = p
                    .preemptions
                    .iter()
                    .any(|x| x.job == *v && x.for_job == w.job);
                let in_flight = running
                    .get(v.as_str())
                    .is_some_and(|r| r.preempted_for.as_deref() == Some(&w.job));
                prop_assert!(chosen || in_flight, "{} names {} as a victim", w.job, v);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
    ))]

    #[test]
    fn preemptions_follow_the_rules(case in preemption_case()) {
        let (s, policy) = case;
        let p = plan(&s, &policy);
        check_invariants(&s, &p, PolicyKind::Gangway)?;
        check_preemptions(&s, &p, &policy)?;
        for kind in [PolicyKind::SlurmBackfill, PolicyKind::FifoFirstFit] {
            let other = Policy { kind, ..policy.clone() };
            prop_assert!(plan(&s, &other).preemptions.is_empty());
        }
    }
}

// ---------------------------------------------------------------------------
// Partitions: one pass per GPU type.

/// The part of `p` about units of GPU type `ty`.
fn of_type(s: &Snapshot, p: &Plan, ty: &str) -> Plan {
    let types: BTreeMap<&str, &str> = (s
        .queue
        .iter()
        .map(|r| (r.job.as_str(), r.gpu_type.as_str())))
    .chain(
        s.running
            .iter()
            .map(|r| (r.job.as_str(), r.gpu_type.as_str())),
    )
    .collect();
    let is = |job: &str| types.get(job).copied() == Some(ty);
    Plan {
        generation: p.generation,
        partitions: (p.partitions.iter())
            .filter(|(t, _)| *t == ty)
            .map(|(t, &g)| (t.clone(), g))
            .collect(),
        placements: p
            .placements
            .iter()
            .filter(|x| is(&x.job))
            .cloned()
            .collect(),
        waiting: p.waiting.iter().filter(|x| is(&x.job)).cloned().collect(),
        reservations: p
            .reservations
            .iter()
            .filter(|x| is(&x.job))
            .cloned()
            .collect(),
        preemptions: p
            .preemptions
            .iter()
            .filter(|x| is(&x.job))
            .cloned()
            .collect(),
        claims: (p.claims.iter())
            .filter(|(j, _)| is(j))
            .map(|(j, &t)| (j.clone(), t))
            .collect(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
    ))]

    #[test]
    fn partitioned_plans_keep_every_rule_and_decide_each_type_alone(case in preemption_case()) {
        let (mut s, policy) = case;
        let types: Vec<String> = s.gpu_types().into_iter().map(String::from).collect();
        s.partitions = (types.into_iter().zip(10..)).collect();
        let p = plan_partitioned(&s, &policy);
        check_invariants(&s, &p, PolicyKind::Gangway)?;
        // Each partition's version comes through for the commit to check.
        prop_assert_eq!(&p.partitions, &s.partitions);
        // Each partition's pass keeps the preemption rules (its own victim
        // budget included) and decides as a pass over its pool alone.
        for ty in s.gpu_types() {
            let part = s.partition(ty);
            prop_assert!(part.nodes.iter().all(|n| n.gpu_type == ty));
            let mine = of_type(&s, &p, ty);
            check_preemptions(&part, &mine, &policy)?;
            prop_assert_eq!(mine, plan(&part, &policy), "{}", ty);
        }
        // With one type queued, other types only hold GPUs: what they hold
        // weighs in fair sharing (dominant shares) exactly as in one pass.
        let mut one = s.clone();
        if let Some(ty) = one.queue.first().map(|q| q.gpu_type.clone()) {
            one.queue.retain(|q| q.gpu_type == ty);
            // (The generator names victims of any type; a real victim is
            // always of its unit's type.)
            one.running
                .retain(|r| r.gpu_type == ty || (r.elastic.is_none() && r.preempted_for.is_none()));
            prop_assert_eq!(plan_partitioned(&one, &policy), plan(&one, &policy));
        }
        // FIFO's and Slurm-like's orders do not look across types: the
        // partitioned plan starts and reserves what the whole pass does,
        // type by type (why a unit waits may differ: the whole pass runs
        // its rounds until no type backfilled, a partition until its own
        // did not, and a later round sees the quota used by earlier ones).
        for kind in [PolicyKind::SlurmBackfill, PolicyKind::FifoFirstFit] {
            let other = self::policy(kind);
            let whole = plan(&s, &other);
            let parts = plan_partitioned(&s, &other);
            for ty in s.gpu_types() {
                let (a, b) = (of_type(&s, &parts, ty), of_type(&s, &whole, ty));
                prop_assert_eq!(&a.placements, &b.placements, "{:?} {}", kind, ty);
                prop_assert_eq!(&a.reservations, &b.reservations, "{:?} {}", kind, ty);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Rack power budgets.

/// A busy snapshot (or a preemption case) whose racks have tight power
/// budgets: each GPU type draws 300–1,000 W, and each (rack, type) may add
/// room for 0 to a few GPUs more.
fn powered() -> impl Strategy<Value = (Snapshot, Policy)> {
    let cases = prop_oneof![
        any_busy_snapshot().prop_map(|s| (s, Policy::default())),
        preemption_case(),
    ];
    (cases, any::<u64>()).prop_map(|((mut s, policy), seed)| {
        let mut rng = Lcg(seed);
        for ty in TYPES {
            s.gpu_power_w
                .insert(ty.to_string(), 300 + rng.below(701) as u32);
        }
        let racks: BTreeSet<(String, String)> = (s.nodes.iter())
            .map(|n| (n.leaf.clone(), n.gpu_type.clone()))
            .collect();
        for key in racks {
            // Now and then a rack without a budget.
            if rng.below(5) == 0 {
                continue;
            }
            let draw = u64::from(s.gpu_power_w[&key.1]);
            let gpus = rng.below(10);
            s.power_headroom_w
                .insert(key, gpus * draw + rng.below(draw));
        }
        (s, policy)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
    ))]

    #[test]
    fn no_placement_ever_takes_a_rack_over_its_power_budget(case in powered()) {
        let (base, policy) = case;
        for kind in KINDS {
            // (The preemption cases' limits and victims in flight are
            // Gangway's.)
            let mut s = base.clone();
            let policy = match kind {
                PolicyKind::Gangway => policy.clone(),
                _ => {
                    s.running.iter_mut().for_each(|r| r.preempted_for = None);
                    self::policy(kind)
                }
            };
            let nodes = nodes_by_id(&s);
            let p = plan(&s, &policy);
            check_invariants(&s, &p, kind)?;
            let mut added: BTreeMap<(String, String), u64> = BTreeMap::new();
            for pl in &p.placements {
                for w in &pl.workers {
                    let n = nodes[w.node.as_str()];
                    let draw = u64::from(s.gpu_power_w[&n.gpu_type]);
                    *added.entry((n.leaf.clone(), n.gpu_type.clone())).or_default() +=
                        w.gpus.len() as u64 * draw;
                }
            }
            for (rack, watts) in &added {
                if let Some(&room) = s.power_headroom_w.get(rack) {
                    prop_assert!(*watts <= room, "{:?}: {} W added, {} W of room", rack, watts, room);
                }
            }
            // The same through partitions.
            let parts = gangway_sched::plan_partitioned(&s, &policy);
            check_invariants(&s, &parts, kind)?;
        }
    }
}

// ---------------------------------------------------------------------------
// Capacity reservations.

/// A busy snapshot with one capacity reservation of tenant `t0` on a domain
/// of a node of type "a" (active or starting later), some of `t0`'s queued
/// units in it and some of its running units inside the domain in it. No
/// quotas (a reservation's units are outside them anyway).
fn reserved_case() -> impl Strategy<Value = Snapshot> {
    (busy_snapshot(), any::<u64>()).prop_filter_map("no node of type a", |(mut s, seed)| {
        let mut rng = Lcg(seed);
        let nodes: Vec<&Node> = s.nodes.iter().filter(|n| n.gpu_type == "a").collect();
        if nodes.is_empty() {
            return None;
        }
        let n = nodes[rng.below(nodes.len() as u64) as usize].clone();
        let level = Level::ALL[rng.below(4) as usize];
        let depth = match level {
            Level::Region => 0,
            Level::Spine => 1,
            Level::Leaf => 2,
            Level::Nvlink => 3,
        };
        let path: Vec<String> =
            [n.spine.clone(), n.leaf.clone(), n.nvlink_domain.clone()][..depth].to_vec();
        let res = gangway_sched::ReservedCapacity {
            id: "r".into(),
            tenant: "t0".into(),
            gpu_type: "a".into(),
            gpus: 1 + rng.below(24) as u32,
            level,
            path,
            start: if rng.below(3) == 0 {
                s.now + rng.below(40)
            } else {
                s.now.saturating_sub(rng.below(5))
            },
            end: None,
        };
        for q in &mut s.queue {
            if q.tenant == "t0" && q.gpu_type == "a" && rng.below(2) == 0 {
                q.reservation = Some("r".into());
            }
        }
        for r in &mut s.running {
            let inside = r
                .gpus
                .iter()
                .all(|(id, _)| s.nodes.iter().any(|x| x.id == *id && res.holds(x)));
            if r.tenant == "t0" && r.gpu_type == "a" && inside && rng.below(2) == 0 {
                r.reservation = Some("r".into());
            }
        }
        s.quotas.clear();
        s.reserved = vec![res];
        Some(s)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
    ))]

    #[test]
    fn a_reservation_keeps_its_gpus_for_its_owner(s in reserved_case()) {
        let res = &s.reserved[0];
        let by_id = nodes_by_id(&s);
        let queue: BTreeMap<&str, &Request> = s.queue.iter().map(|r| (r.job.as_str(), r)).collect();
        let free_before: u64 = (s.nodes.iter())
            .filter(|n| n.schedulable && n.gpu_type == "a" && res.holds(n))
            .map(|n| n.free.iter().filter(|&&g| g < n.gpus).count() as u64)
            .sum();
        let running_in: u64 = (s.running.iter())
            .filter(|r| r.reservation.as_deref() == Some("r"))
            .map(|r| r.gpu_count())
            .sum();
        let cases = [PolicyKind::Gangway, PolicyKind::SlurmBackfill]
            .into_iter()
            .flat_map(|kind| [true, false].map(|lend| (kind, lend)));
        for (kind, lend) in cases {
            let p = plan(&s, &Policy { lend_reserved: lend, ..policy(kind) });
            check_invariants(&s, &p, kind)?;
            let mut owner = 0u64;
            let mut others = 0u64;
            for pl in &p.placements {
                let q = queue[pl.job.as_str()];
                let gpus: u64 = pl.workers.iter().map(|w| w.gpus.len() as u64).sum();
                let inside = pl.workers.iter().all(|w| res.holds(by_id[w.node.as_str()]));
                if q.reservation.is_some() {
                    prop_assert!(inside, "{} placed outside its reservation", pl.job);
                    prop_assert!(res.start <= s.now, "{} placed before the start", pl.job);
                    owner += gpus;
                    continue;
                }
                // Only preemptible units while it lends, or ones done
                // before the start, may use what the reservation holds.
                let ends_in_time = q.estimated_duration_s > 0
                    && s.now + q.estimated_duration_s <= res.start;
                let preemptible = q.priority <= gangway_sched::PREEMPTIBLE_PRIORITY;
                let borrows = (lend && preemptible) || ends_in_time;
                if !borrows && q.gpu_type == "a" {
                    others += pl
                        .workers
                        .iter()
                        .filter(|w| res.holds(by_id[w.node.as_str()]))
                        .map(|w| w.gpus.len() as u64)
                        .sum::<u64>();
                }
            }
            // (The generator may put more running units in it than it
            // holds; then nothing more starts in it.)
            prop_assert!(
                owner == 0 || running_in + owner <= u64::from(res.gpus),
                "over the reservation"
            );
            let left = free_before - owner;
            let protect = u64::from(res.gpus).saturating_sub(running_in + owner);
            prop_assert!(
                others <= left - protect.min(left),
                "{} GPUs of the reservation's {} protected went to other work",
                others,
                protect.min(left)
            );
            for v in p.preemptions.iter().filter(|v| v.cause == gangway_sched::PreemptCause::Reservation) {
                let r = s.running.iter().find(|r| r.job == v.job).expect("running");
                prop_assert!(r.priority <= gangway_sched::PREEMPTIBLE_PRIORITY);
                prop_assert!(r.reservation.is_none());
                prop_assert!(r.gpus.iter().any(|(n, _)| res.holds(by_id[n.as_str()])));
                prop_assert_eq!(queue[v.for_job.as_str()].reservation.as_deref(), Some("r"));
            }
            // Nothing of the reservation's is ever a victim.
            for v in &p.preemptions {
                let r = s.running.iter().find(|r| r.job == v.job).expect("running");
                prop_assert!(r.reservation.is_none(), "{} preempted", r.job);
            }
        }
    }
}
