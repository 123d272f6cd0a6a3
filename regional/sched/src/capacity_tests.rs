//! Worked examples of reservation admission, and a property: whatever is
//! admitted, in whatever order, every domain keeps enough GPUs for the
//! reservations pinned inside it at every moment, and a refusal's earliest
//! window is admitted when asked for.

use proptest::prelude::*;

use super::*;
use crate::plan::tests::fleet;

const H: u64 = 3600;

/// 2 spines × 2 leaves × 4 nodes × 8 GPUs: 32 GPUs a leaf, 64 a spine.
fn region() -> Vec<Node> {
    fleet("h100", 2, 2, 4, 8, false)
}

fn ask(gpus: u32, level: Level, start: u64, end: Option<u64>) -> Ask {
    Ask {
        gpus,
        level,
        start,
        end,
    }
}

fn admitted(nodes: &[Node], promised: &mut Vec<Promised>, a: Ask) -> Domain {
    match admit(nodes, promised, &a) {
        Admission::Admitted { domain } => {
            promised.push(Promised {
                gpus: a.gpus,
                domain: domain.clone(),
                start: a.start,
                end: a.end,
            });
            domain
        }
        other => panic!("{a:?} refused: {other:?}"),
    }
}

#[test]
fn a_reservation_is_pinned_to_the_tightest_domain_that_holds_it() {
    let nodes = region();
    let mut promised = Vec::new();
    // 24 of leaf s0-l0 for hours 1-5.
    let first = admitted(&nodes, &mut promised, ask(24, Level::Leaf, H, Some(5 * H)));
    assert_eq!(first.path, vec!["h100-s0", "h100-s0-l0"]);
    // 8 more fit best in what is left of that leaf (8 unreserved).
    let second = admitted(
        &nodes,
        &mut promised,
        ask(8, Level::Leaf, 2 * H, Some(3 * H)),
    );
    assert_eq!(second, first);
    // 16 in one leaf then go to the next leaf.
    let third = admitted(&nodes, &mut promised, ask(16, Level::Leaf, 2 * H, None));
    assert_eq!(third.path, vec!["h100-s0", "h100-s0-l1"]);
}

#[test]
fn a_reservation_that_cannot_be_honoured_is_refused_with_the_earliest_window() {
    let nodes = region();
    let mut promised = Vec::new();
    // Each spine held 48 of 64 GPUs, one until hour 10, one until hour 20.
    admitted(
        &nodes,
        &mut promised,
        ask(48, Level::Spine, 0, Some(10 * H)),
    );
    admitted(
        &nodes,
        &mut promised,
        ask(48, Level::Spine, 0, Some(20 * H)),
    );
    // 32 in one spine for hours 2-4: neither spine has more than 16.
    match admit(
        &nodes,
        &promised,
        &ask(32, Level::Spine, 2 * H, Some(4 * H)),
    ) {
        Admission::Refused { why, earliest } => {
            assert!(why.contains("16 at 7200"), "{why}");
            // From hour 10 (the first to end), for the same 2 hours.
            assert_eq!(earliest, Some((10 * H, Some(12 * H))));
        }
        other => panic!("admitted: {other:?}"),
    }
    // 32 within one leaf is refused as well: a spine's 48 may sit anywhere
    // in it, so the spine would have to hold 48 + 32 > 64.
    assert!(matches!(
        admit(&nodes, &promised, &ask(32, Level::Leaf, 2 * H, Some(4 * H))),
        Admission::Refused { .. }
    ));
    // 16 in one leaf fits (the spine keeps 48 + 16 = 64).
    admitted(
        &nodes,
        &mut promised,
        ask(16, Level::Leaf, 2 * H, Some(4 * H)),
    );
    // Larger than any domain of the level: refused for good.
    match admit(&nodes, &promised, &ask(40, Level::Leaf, 0, None)) {
        Admission::Refused { why, earliest } => {
            assert!(why.contains("the largest has 32"), "{why}");
            assert_eq!(earliest, None);
        }
        other => panic!("admitted: {other:?}"),
    }
}

#[test]
fn open_ended_reservations_hold_their_domain_for_good() {
    let nodes = region();
    let mut promised = Vec::new();
    admitted(&nodes, &mut promised, ask(128, Level::Region, 0, None));
    // Nothing ends: no window would ever work.
    match admit(
        &nodes,
        &promised,
        &ask(8, Level::Nvlink, 100 * H, Some(101 * H)),
    ) {
        Admission::Refused { earliest, .. } => assert_eq!(earliest, None),
        other => panic!("admitted: {other:?}"),
    }
    // Back-to-back windows do not overlap.
    let mut promised = Vec::new();
    admitted(&nodes, &mut promised, ask(128, Level::Region, 0, Some(H)));
    admitted(&nodes, &mut promised, ask(128, Level::Region, H, None));
}

/// Every domain, at every moment some reservation starts, holds at least
/// what the reservations pinned inside it ask for.
fn honourable(nodes: &[Node], promised: &[Promised]) -> Result<(), TestCaseError> {
    let caps = capacities(nodes);
    for (x, &cap) in &caps {
        for t in promised.iter().map(|p| p.start) {
            let load: u64 = (promised.iter())
                .filter(|p| p.domain.within(x) && p.start <= t && p.end.is_none_or(|e| t < e))
                .map(|p| u64::from(p.gpus))
                .sum();
            prop_assert!(
                load <= cap,
                "{:?} at {}: {} reserved of {}",
                x,
                t,
                load,
                cap
            );
        }
    }
    for p in promised {
        prop_assert!(caps.contains_key(&p.domain));
    }
    Ok(())
}

fn asks() -> impl Strategy<Value = Vec<Ask>> {
    let one = (1u32..=80, 0usize..4, 0u64..20, prop::option::of(1u64..12)).prop_map(
        |(gpus, level, start, length)| Ask {
            gpus,
            level: Level::ALL[level],
            start: start * H,
            end: length.map(|l| (start + l) * H),
        },
    );
    prop::collection::vec(one, 1..24)
}

proptest! {
    #[test]
    fn admitted_reservations_can_always_be_honoured(asks in asks()) {
        let nodes = region();
        let mut promised: Vec<Promised> = Vec::new();
        for a in asks {
            match admit(&nodes, &promised, &a) {
                Admission::Admitted { domain } => {
                    prop_assert_eq!(domain.level, a.level);
                    promised.push(Promised { gpus: a.gpus, domain, start: a.start, end: a.end });
                    honourable(&nodes, &promised)?;
                }
                Admission::Refused { earliest, .. } => {
                    if let Some((start, end)) = earliest {
                        prop_assert!(start > a.start);
                        prop_assert_eq!(end.map(|e| e - start), a.end.map(|e| e - a.start));
                        let later = Ask { start, end, ..a };
                        prop_assert!(
                            matches!(admit(&nodes, &promised, &later), Admission::Admitted { .. }),
                            "the earliest window is refused too"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_resize_is_decided_in_the_domain_the_reservation_is_pinned_to() {
    let nodes = region();
    let mut promised = Vec::new();
    let mine = admitted(&nodes, &mut promised, ask(16, Level::Leaf, 0, None));
    // The next 16 go to the same leaf (the tightest).
    let theirs = admitted(&nodes, &mut promised, ask(16, Level::Leaf, 0, None));
    assert_eq!(theirs, mine);
    let others: Vec<Promised> = promised[1..].to_vec();
    let bigger = ask(32, Level::Leaf, 0, None);
    // Other leaves could hold 32, but a resize stays in its leaf: refused,
    // and never possible there while the other one holds its half.
    assert!(matches!(
        admit(&nodes, &others, &bigger),
        Admission::Admitted { .. }
    ));
    assert!(matches!(
        admit_within(&nodes, &others, &bigger, &mine),
        Admission::Refused { earliest: None, .. }
    ));
    // Alone in its leaf it may grow to the whole leaf, not beyond.
    assert_eq!(
        admit_within(&nodes, &[], &bigger, &mine),
        Admission::Admitted {
            domain: mine.clone()
        }
    );
    assert!(matches!(
        admit_within(&nodes, &[], &ask(40, Level::Leaf, 0, None), &mine),
        Admission::Refused { earliest: None, .. }
    ));
    // Room comes back when the other one ends.
    let full = vec![Promised {
        gpus: 32,
        domain: mine.clone(),
        start: 0,
        end: Some(5 * H),
    }];
    match admit_within(&nodes, &full, &ask(8, Level::Leaf, H, Some(2 * H)), &mine) {
        Admission::Refused { earliest, .. } => assert_eq!(earliest, Some((5 * H, Some(6 * H)))),
        other => panic!("admitted: {other:?}"),
    }
}
