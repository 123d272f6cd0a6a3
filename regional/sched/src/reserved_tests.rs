//! Worked examples of capacity reservations in a pass.

use crate::plan;
use crate::plan::tests::{fleet, req, snap};
use crate::types::*;

const NOW: u64 = 100_000;

/// One spine, two leaves of two 8-GPU h100 nodes; reservation `r1` of
/// acme holds 16 GPUs in leaf 1 from `start`.
fn region(start: u64, queue: Vec<Request>) -> Snapshot {
    let mut s = snap(fleet("h100", 1, 2, 2, 8, false), queue);
    s.now = NOW;
    s.reserved = vec![ReservedCapacity {
        id: "r1".into(),
        tenant: "acme".into(),
        gpu_type: "h100".into(),
        gpus: 16,
        level: Level::Leaf,
        path: vec!["h100-s0".into(), "h100-s0-l1".into()],
        start,
        end: None,
    }];
    s
}

fn unit(job: &str, tenant: &str, gpus: u32, priority: i32, seq: u64) -> Request {
    Request {
        tenant: tenant.into(),
        priority,
        seq,
        estimated_duration_s: 3600,
        ..req(job, 1, gpus, Level::Region)
    }
}

fn owned(job: &str, gpus: u32, seq: u64) -> Request {
    Request {
        reservation: Some("r1".into()),
        ..unit(job, "acme", gpus, 1, seq)
    }
}

fn leaf_of<'p>(p: &'p Plan, job: &str) -> Option<&'p str> {
    let pl = p.placements.iter().find(|x| x.job == job)?;
    let node = pl.workers[0].node.as_str();
    Some(&node[..node.len() - 4])
}

/// The leaves a waiting unit's reservation (for later) sits on.
fn reserved_on<'p>(p: &'p Plan, job: &str) -> Vec<&'p str> {
    let r = p
        .reservations
        .iter()
        .find(|r| r.job == job)
        .expect("reserved");
    let mut leaves: Vec<&str> = r.gpus.iter().map(|(n, _)| &n[..n.len() - 4]).collect();
    leaves.dedup();
    leaves
}

fn code_of(p: &Plan, job: &str) -> &'static str {
    p.waiting
        .iter()
        .find(|w| w.job == job)
        .expect("waits")
        .reason
        .code()
}

/// A running unit of `gpus` GPUs on node `node` of the region.
fn running(job: &str, tenant: &str, node: &str, gpus: u32, priority: i32) -> Running {
    Running {
        job: job.into(),
        tenant: tenant.into(),
        gpu_type: "h100".into(),
        priority,
        gpus: vec![(node.into(), (0..gpus).collect())],
        expected_end: NOW + 50_000,
        started: NOW - 10_000,
        checkpointed: Some(NOW - 60),
        ..Running::default()
    }
}

fn occupy(s: &mut Snapshot, r: Running) {
    for (node, gpus) in &r.gpus {
        let n = s.nodes.iter_mut().find(|n| n.id == *node).expect("node");
        n.free.retain(|g| !gpus.contains(g));
    }
    *s.usage
        .entry((r.tenant.clone(), r.gpu_type.clone()))
        .or_default() += r.gpu_count() as u32;
    s.running.push(r);
}

#[test]
fn the_owners_units_run_inside_the_reservation_and_nothing_else_takes_it() {
    // Best fit alone would put the first 8-GPU unit on leaf 0.
    let s = region(
        0,
        vec![
            owned("mine", 8, 5),
            unit("a", "globex", 8, 1, 1),
            unit("b", "globex", 8, 1, 2),
            unit("c", "globex", 8, 1, 3),
        ],
    );
    let p = plan(&s, &Policy::default());
    assert_eq!(leaf_of(&p, "mine"), Some("h100-s0-l1"));
    // Leaf 1's other node is the reservation's 8 unused GPUs: a and b take
    // leaf 0, and c waits for leaf 0 to free up, not for the reservation.
    assert_eq!(leaf_of(&p, "a"), Some("h100-s0-l0"));
    assert_eq!(leaf_of(&p, "b"), Some("h100-s0-l0"));
    assert_eq!(leaf_of(&p, "c"), None);
    assert_eq!(code_of(&p, "c"), "reserved");
    assert_eq!(reserved_on(&p, "c"), vec!["h100-s0-l0"]);
    // With no room for a reservation of its own (the discipline holds
    // none beyond its four), a unit is told the GPUs are reserved capacity.
    let mut many = s.clone();
    many.queue
        .extend((4..10).map(|i| unit(&format!("d{i}"), "globex", 8, 1, i)));
    let p = plan(&many, &Policy::default());
    assert!(
        p.waiting
            .iter()
            .any(|w| w.reason.code() == "reserved_capacity"),
        "{:?}",
        p.waiting
    );
    // The same under the Slurm-like discipline, which has no preemption.
    let slurm = Policy {
        kind: PolicyKind::SlurmBackfill,
        ..Policy::default()
    };
    let p = plan(&s, &slurm);
    assert_eq!(leaf_of(&p, "mine"), Some("h100-s0-l1"));
    assert_eq!(leaf_of(&p, "c"), None);
}

#[test]
fn preemptible_work_borrows_reserved_gpus_and_gives_them_back() {
    // Leaf 0 full; a low unit borrows the idle reservation, a normal one
    // may not.
    let mut s = region(
        0,
        vec![
            unit("low", "globex", 8, 0, 1),
            unit("norm", "globex", 8, 1, 2),
        ],
    );
    occupy(&mut s, running("x", "globex", "h100-s0-l0-n00", 8, 1));
    occupy(&mut s, running("y", "globex", "h100-s0-l0-n01", 8, 1));
    let p = plan(&s, &Policy::default());
    assert_eq!(leaf_of(&p, "low"), Some("h100-s0-l1"));
    assert_eq!(leaf_of(&p, "norm"), None);
    assert_eq!(reserved_on(&p, "norm"), vec!["h100-s0-l0"]);

    // Borrowers on both of leaf 1's nodes; the owner now wants 16 GPUs:
    // both borrowers are asked to checkpoint and stop, however young,
    // and nothing else is preempted.
    let mut s = region(0, vec![owned("mine", 16, 5)]);
    s.queue[0].ranks = vec![0, 1];
    s.queue[0].gpus_per_worker = 8;
    occupy(&mut s, running("x", "globex", "h100-s0-l0-n00", 8, 0));
    occupy(&mut s, running("b1", "globex", "h100-s0-l1-n00", 8, 0));
    let mut young = running("b2", "globex", "h100-s0-l1-n01", 8, 0);
    young.started = NOW - 5;
    occupy(&mut s, young);
    let p = plan(&s, &Policy::default());
    let mut victims: Vec<(&str, PreemptCause)> = p
        .preemptions
        .iter()
        .map(|v| (v.job.as_str(), v.cause))
        .collect();
    victims.sort();
    assert_eq!(
        victims,
        vec![
            ("b1", PreemptCause::Reservation),
            ("b2", PreemptCause::Reservation)
        ]
    );
    assert!(p.preemptions.iter().all(|v| v.for_job == "mine"));
    assert_eq!(code_of(&p, "mine"), "waiting_for_preemption");
    // A borrower of normal priority (placed when it would end in time) is
    // not a victim.
    let mut s = region(0, vec![owned("mine", 8, 5)]);
    occupy(&mut s, running("n1", "globex", "h100-s0-l1-n00", 8, 1));
    occupy(&mut s, running("n2", "globex", "h100-s0-l1-n01", 8, 1));
    let p = plan(&s, &Policy::default());
    assert!(p.preemptions.is_empty(), "{:?}", p.preemptions);
    assert_eq!(code_of(&p, "mine"), "no_capacity");
}

#[test]
fn without_lending_preemptible_work_waits_outside_the_reservation() {
    let no_lending = Policy {
        lend_reserved: false,
        ..Policy::default()
    };
    // Leaf 0 full, the reservation idle: the low unit that borrows it
    // with lending on (above) now waits for leaf 0.
    let mut s = region(0, vec![unit("low", "globex", 8, 0, 1)]);
    occupy(&mut s, running("x", "globex", "h100-s0-l0-n00", 8, 1));
    occupy(&mut s, running("y", "globex", "h100-s0-l0-n01", 8, 1));
    assert_eq!(
        leaf_of(&plan(&s, &Policy::default()), "low"),
        Some("h100-s0-l1")
    );
    let p = plan(&s, &no_lending);
    assert!(p.placements.is_empty(), "{:?}", p.placements);
    assert_eq!(reserved_on(&p, "low"), vec!["h100-s0-l0"]);
    // Beyond the discipline's own reservations, a low unit is told why.
    s.queue = (1..=6)
        .map(|i| unit(&format!("low{i}"), "globex", 8, 0, i))
        .collect();
    let p = plan(&s, &no_lending);
    assert!(p.placements.is_empty(), "{:?}", p.placements);
    assert_eq!(code_of(&p, "low6"), "reserved_capacity");
    // The Slurm-like discipline keeps it too.
    let slurm = Policy {
        kind: PolicyKind::SlurmBackfill,
        ..no_lending.clone()
    };
    assert!(plan(&s, &slurm).placements.is_empty());
    // The owner's units still run inside it, and take back what a borrower
    // placed while it lent holds there.
    let mut s = region(0, vec![owned("mine", 16, 5)]);
    s.queue[0].ranks = vec![0, 1];
    s.queue[0].gpus_per_worker = 8;
    occupy(&mut s, running("b1", "globex", "h100-s0-l1-n00", 8, 0));
    let p = plan(&s, &no_lending);
    assert_eq!(p.preemptions.len(), 1);
    assert_eq!(p.preemptions[0].job, "b1");
    assert_eq!(p.preemptions[0].cause, PreemptCause::Reservation);
    let s = region(0, vec![owned("mine", 8, 5), unit("low", "globex", 8, 0, 1)]);
    let p = plan(&s, &no_lending);
    assert_eq!(leaf_of(&p, "mine"), Some("h100-s0-l1"));
    assert_eq!(leaf_of(&p, "low"), Some("h100-s0-l0"));
}

#[test]
fn before_it_starts_only_work_that_ends_in_time_may_use_it() {
    // Starts in 10,000 s; leaf 0 full.
    let mut s = region(NOW + 10_000, vec![]);
    occupy(&mut s, running("x", "globex", "h100-s0-l0-n00", 8, 1));
    occupy(&mut s, running("y", "globex", "h100-s0-l0-n01", 8, 1));
    let mut short = unit("short", "globex", 8, 1, 1);
    short.estimated_duration_s = 3_600;
    let mut long = unit("long", "globex", 8, 1, 2);
    long.estimated_duration_s = 20_000;
    s.queue = vec![short, long];
    let p = plan(&s, &Policy::default());
    assert_eq!(leaf_of(&p, "short"), Some("h100-s0-l1"));
    assert_eq!(leaf_of(&p, "long"), None);
    assert_eq!(reserved_on(&p, "long"), vec!["h100-s0-l0"]);
    // Without lending, too: it is free again when the reservation starts.
    let no_lending = Policy {
        lend_reserved: false,
        ..Policy::default()
    };
    let p = plan(&s, &no_lending);
    assert_eq!(leaf_of(&p, "short"), Some("h100-s0-l1"));
    assert_eq!(leaf_of(&p, "long"), None);
    // The owner's units wait for the start.
    let mut s = region(NOW + 10_000, vec![owned("mine", 8, 5)]);
    s.now = NOW;
    let p = plan(&s, &Policy::default());
    assert_eq!(code_of(&p, "mine"), "reservation_not_started");
}

#[test]
fn a_unit_naming_a_reservation_it_cannot_run_in_waits_with_the_reason() {
    let mut s = region(0, vec![owned("mine", 16, 1), owned("more", 8, 2)]);
    s.queue[0].ranks = vec![0, 1];
    s.queue[0].gpus_per_worker = 8;
    let mut theirs = owned("theirs", 8, 3);
    theirs.tenant = "globex".into();
    let mut nowhere = owned("nowhere", 8, 4);
    nowhere.reservation = Some("r9".into());
    s.queue.extend([theirs, nowhere]);
    let p = plan(&s, &Policy::default());
    assert_eq!(leaf_of(&p, "mine"), Some("h100-s0-l1"));
    assert_eq!(code_of(&p, "more"), "reservation_full");
    assert_eq!(code_of(&p, "theirs"), "reservation_unavailable");
    assert_eq!(code_of(&p, "nowhere"), "reservation_unavailable");
    // Over: its end has passed.
    s.reserved[0].end = Some(NOW);
    let p = plan(&s, &Policy::default());
    assert_eq!(code_of(&p, "mine"), "reservation_unavailable");
}

#[test]
fn a_reservation_is_outside_its_tenants_quota_and_share() {
    // acme may hold 8 GPUs of the shared pool; its reservation adds 16.
    let mut s = region(0, vec![owned("mine", 16, 1), unit("pool", "acme", 8, 1, 2)]);
    s.queue[0].ranks = vec![0, 1];
    s.queue[0].gpus_per_worker = 8;
    s.quotas.insert(("acme".into(), "h100".into()), 8);
    let p = plan(&s, &Policy::default());
    assert_eq!(leaf_of(&p, "mine"), Some("h100-s0-l1"));
    assert_eq!(leaf_of(&p, "pool"), Some("h100-s0-l0"));
    // Running in it, its units do not count against the quota either.
    let mut s = region(0, vec![unit("pool", "acme", 8, 1, 2)]);
    let mut r = running("in", "acme", "h100-s0-l1-n00", 8, 1);
    r.reservation = Some("r1".into());
    occupy(&mut s, r);
    s.quotas.insert(("acme".into(), "h100".into()), 8);
    let p = plan(&s, &Policy::default());
    assert_eq!(leaf_of(&p, "pool"), Some("h100-s0-l0"));
}
