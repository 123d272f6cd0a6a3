//! Property tests of the scheduler core on small random fleets and queues.
//!
//! Besides the invariants (no GPU twice, gangs whole, one domain, quotas,
//! determinism, a second pass on the result adds nothing), every plan is
//! compared with `reference`, a slow and literal transcription of the
//! placement rules that shares no code with the indexed implementation.

use std::collections::{BTreeMap, BTreeSet};

use gangway_sched::{
    apply, plan, Level, Node, Placement, Plan, Policy, Request, Snapshot, WaitReason,
};
use proptest::prelude::*;

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

fn queue() -> impl Strategy<Value = Vec<Request>> {
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
    );
    prop::collection::vec(one, 0..=12).prop_map(|reqs| {
        reqs.into_iter()
            .enumerate()
            .map(
                |(i, (w, array, tenant, ty, gpw, required, preferred, priority, seq))| Request {
                    job: format!("j{i:02}"),
                    ranks: if array { vec![w] } else { (0..w).collect() },
                    tenant: format!("t{tenant}"),
                    gpu_type: ty.to_string(),
                    gpus_per_worker: gpw,
                    required,
                    preferred,
                    priority,
                    seq,
                    estimated_duration_s: 0,
                },
            )
            .collect()
    })
}

fn snapshot() -> impl Strategy<Value = Snapshot> {
    let key = || (0usize..2, prop::sample::select(vec!["a", "b"]));
    (
        fleet(),
        queue(),
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

fn reference(s: &Snapshot) -> Plan {
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

// ---------------------------------------------------------------------------

fn check_invariants(s: &Snapshot, p: &Plan) -> Result<(), TestCaseError> {
    let nodes: BTreeMap<&str, &Node> = s.nodes.iter().map(|n| (n.id.as_str(), n)).collect();
    let queue: BTreeMap<&str, &Request> = s.queue.iter().map(|r| (r.job.as_str(), r)).collect();
    let mut used = BTreeSet::new();
    let mut placed_gpus: BTreeMap<(&str, &str), u32> = BTreeMap::new();
    for pl in &p.placements {
        let req = queue[pl.job.as_str()];
        prop_assert_eq!(&pl.ranks, &req.ranks);
        prop_assert_eq!(pl.workers.len(), req.ranks.len(), "gang placed whole");
        let ranks: Vec<u32> = pl.workers.iter().map(|w| w.rank).collect();
        prop_assert_eq!(&ranks, &req.ranks, "one worker per rank, in order");
        prop_assert!(pl.level <= req.required);
        let first = nodes[pl.workers[0].node.as_str()];
        for w in &pl.workers {
            let n = nodes[w.node.as_str()];
            prop_assert!(n.schedulable && n.gpu_type == req.gpu_type);
            prop_assert_eq!(w.gpus.len() as u32, req.gpus_per_worker);
            prop_assert!(
                domain(n, pl.level).0 == domain(first, pl.level).0,
                "one {} domain",
                pl.level
            );
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
            req.ranks.len() as u32 * req.gpus_per_worker;
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
    Ok(())
}

proptest! {
    // 128 cases by default; PROPTEST_CASES=20000 for a soak.
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(128)
    ))]

    #[test]
    fn plans_are_valid_and_match_the_reference(s in snapshot()) {
        let p = plan(&s, &Policy::default());
        check_invariants(&s, &p)?;
        prop_assert_eq!(&p, &reference(&s));
    }

    #[test]
    fn plans_are_deterministic_and_ignore_input_order(s in snapshot(), seed in any::<u64>()) {
        let p = plan(&s, &Policy::default());
        prop_assert_eq!(&p, &plan(&s.clone(), &Policy::default()));
        // Rotating and reversing the inputs does not change the plan.
        let mut shuffled = s.clone();
        let k = (seed as usize) % shuffled.nodes.len().max(1);
        shuffled.nodes.rotate_left(k);
        shuffled.queue.reverse();
        if seed % 2 == 0 {
            shuffled.nodes.reverse();
        }
        prop_assert_eq!(&p, &plan(&shuffled, &Policy::default()));
    }

    #[test]
    fn a_second_pass_on_the_result_places_nothing(s in snapshot()) {
        let p = plan(&s, &Policy::default());
        let next = apply(&s, &p);
        prop_assert_eq!(next.queue.len(), s.queue.len() - p.placements.len());
        let again = plan(&next, &Policy::default());
        prop_assert!(again.placements.is_empty(), "placed {:?}", again.placements);
        // What waited still waits (a capacity wait may turn into a quota wait,
        // as usage grew).
        let jobs = |p: &Plan| p.waiting.iter().map(|w| w.job.clone()).collect::<Vec<_>>();
        prop_assert_eq!(jobs(&again), jobs(&p));
    }

    #[test]
    fn max_placements_gives_a_prefix_of_the_full_plan(s in snapshot(), max in 0usize..4) {
        let full = plan(&s, &Policy::default());
        let cut = plan(&s, &Policy { max_placements: Some(max), ..Default::default() });
        let n = full.placements.len().min(max);
        prop_assert_eq!(&cut.placements[..], &full.placements[..n]);
        check_invariants(&s, &cut).ok();
    }
}
