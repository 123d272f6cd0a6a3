//! Capacity reservations: whether a region can promise a tenant `gpus`
//! GPUs of a type inside one domain of a topology level for a window
//! `[start, end)` (or from `start` on), and where.
//!
//! Each admitted reservation is pinned to one domain (a spine, a leaf, an
//! NVLink domain, or the region). Domains form a tree, so a set of
//! reservations can be honoured — each given its GPUs inside its own
//! domain — exactly when, at every moment, every domain `X` has at least
//! as many GPUs as the reservations pinned inside `X` (itself or below)
//! ask for together (Hall's condition on a laminar family). Admission
//! keeps that true: a new reservation pinned to `D` adds to the load of
//! `D` and of every domain above it, checked at every moment of its window
//! where the load changes. Among the domains where it fits, the tightest
//! is chosen (fewest unreserved GPUs at its start), leaving large domains
//! for large asks. When none fits, the answer says why and the earliest
//! window of the same length that would fit, if any: starts are tried at
//! the moments other reservations end.
//!
//! This only decides what may be promised. Keeping the promise (borrowers
//! evicted when the owner needs the GPUs) is the pass's job.

use std::collections::{BTreeMap, BTreeSet};

use crate::types::{Level, Node};

/// A topology domain: its level and its path from the region down
/// (`[spine]`, `[spine, leaf]`, `[spine, leaf, nvlink domain]`; empty for
/// the region).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Domain {
    pub level: Level,
    pub path: Vec<String>,
}

impl Domain {
    /// The domain of `node` at `level`.
    pub fn of(node: &Node, level: Level) -> Domain {
        let parts = [&node.spine, &node.leaf, &node.nvlink_domain];
        let depth = match level {
            Level::Region => 0,
            Level::Spine => 1,
            Level::Leaf => 2,
            Level::Nvlink => 3,
        };
        Domain {
            level,
            path: parts[..depth].iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Whether `self` is `other` or inside it.
    pub fn within(&self, other: &Domain) -> bool {
        self.path.len() >= other.path.len() && self.path[..other.path.len()] == other.path[..]
    }

    /// Itself and every domain above it, up to the region.
    pub fn and_above(&self) -> impl Iterator<Item = Domain> + '_ {
        (0..=self.path.len()).rev().map(|depth| Domain {
            level: match depth {
                0 => Level::Region,
                1 => Level::Spine,
                2 => Level::Leaf,
                _ => Level::Nvlink,
            },
            path: self.path[..depth].to_vec(),
        })
    }

    /// The domain's name as people read it: its innermost path element.
    pub fn name(&self) -> &str {
        self.path.last().map_or("the region", String::as_str)
    }
}

/// A reservation already promised, pinned to its domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Promised {
    pub gpus: u32,
    pub domain: Domain,
    pub start: u64,
    /// `None`: open-ended.
    pub end: Option<u64>,
}

/// A reservation asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ask {
    pub gpus: u32,
    /// Every GPU inside one domain of this level.
    pub level: Level,
    pub start: u64,
    /// `None`: open-ended.
    pub end: Option<u64>,
}

/// What admission decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// It fits: pin it to `domain`.
    Admitted { domain: Domain },
    /// It does not fit; `earliest` is the first window of the same length
    /// (open-ended if it was) that would, if any.
    Refused {
        why: String,
        earliest: Option<(u64, Option<u64>)>,
    },
}

/// Decides `ask` on the GPUs of `nodes` (the type's reservable nodes: not
/// spares) given what is already `promised` on them.
pub fn admit(nodes: &[Node], promised: &[Promised], ask: &Ask) -> Admission {
    admit_in(nodes, promised, ask, None)
}

/// [`admit`] with the domain fixed: whether `ask` fits in `domain` (of
/// `ask.level`), as when a reservation pinned there is resized.
pub fn admit_within(
    nodes: &[Node],
    promised: &[Promised],
    ask: &Ask,
    domain: &Domain,
) -> Admission {
    admit_in(nodes, promised, ask, Some(domain))
}

fn admit_in(nodes: &[Node], promised: &[Promised], ask: &Ask, only: Option<&Domain>) -> Admission {
    let caps = capacities(nodes);
    let candidates: Vec<&Domain> = (caps.iter())
        .filter(|(d, &c)| d.level == ask.level && c >= u64::from(ask.gpus))
        .filter(|(d, _)| only.is_none_or(|o| *d == o))
        .map(|(d, _)| d)
        .collect();
    if candidates.is_empty() {
        let most = (caps.iter())
            .filter(|(d, _)| d.level == ask.level)
            .map(|(_, &c)| c)
            .max()
            .unwrap_or(0);
        return Admission::Refused {
            why: format!(
                "no {} domain has {} GPUs of this type (the largest has {most})",
                ask.level, ask.gpus
            ),
            earliest: None,
        };
    }
    if let Some(domain) = best_fit(&caps, &candidates, promised, ask) {
        return Admission::Admitted { domain };
    }
    // Why: the candidate that comes closest, at its tightest moment.
    let (short, name, at) = (candidates.iter())
        .map(|d| {
            let (room, at) = least_room(&caps, d, promised, ask.start, ask.end);
            (room, d.name().to_string(), at)
        })
        .max_by_key(|(room, name, _)| (*room, std::cmp::Reverse(name.clone())))
        .expect("candidates are not empty");
    let why = format!(
        "no {} domain has {} GPUs unreserved for the whole window: the closest, {name}, \
         has {short} at {at}",
        ask.level, ask.gpus
    );
    // The earliest window of the same length: starts when others end.
    let length = ask.end.map(|e| e.saturating_sub(ask.start));
    let starts: BTreeSet<u64> = (promised.iter())
        .filter_map(|p| p.end)
        .filter(|&e| e > ask.start)
        .collect();
    let earliest = starts.into_iter().find_map(|s| {
        let shifted = Ask {
            start: s,
            end: length.map(|l| s.saturating_add(l)),
            ..*ask
        };
        best_fit(&caps, &candidates, promised, &shifted).map(|_| (shifted.start, shifted.end))
    });
    Admission::Refused { why, earliest }
}

/// GPUs of every domain at every level (each node counted once).
fn capacities(nodes: &[Node]) -> BTreeMap<Domain, u64> {
    let mut caps: BTreeMap<Domain, u64> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for n in nodes {
        if !seen.insert(n.id.as_str()) {
            continue;
        }
        for level in Level::ALL {
            *caps.entry(Domain::of(n, level)).or_default() += u64::from(n.gpus);
        }
    }
    caps
}

/// Whether two windows overlap (`None` ends never).
fn overlaps(a: (u64, Option<u64>), b: (u64, Option<u64>)) -> bool {
    a.1.is_none_or(|e| b.0 < e) && b.1.is_none_or(|e| a.0 < e)
}

/// The fewest GPUs of `x` left unreserved at any moment of the window,
/// and that moment (the window's start or another reservation's start).
fn least_room(
    caps: &BTreeMap<Domain, u64>,
    x: &Domain,
    promised: &[Promised],
    start: u64,
    end: Option<u64>,
) -> (u64, u64) {
    let cap = caps.get(x).copied().unwrap_or(0);
    let inside: Vec<&Promised> = (promised.iter())
        .filter(|p| p.domain.within(x) && overlaps((p.start, p.end), (start, end)))
        .collect();
    // The load only rises where a reservation starts.
    let moments = std::iter::once(start).chain(
        (inside.iter())
            .map(|p| p.start)
            .filter(|&s| s > start && end.is_none_or(|e| s < e)),
    );
    moments
        .map(|t| {
            let load: u64 = (inside.iter())
                .filter(|p| p.start <= t && p.end.is_none_or(|e| t < e))
                .map(|p| u64::from(p.gpus))
                .sum();
            (cap.saturating_sub(load), t)
        })
        .min()
        .expect("the window's start is a moment")
}

/// The tightest candidate where `ask` fits: it and every domain above it
/// keep room for `ask.gpus` over the whole window.
fn best_fit(
    caps: &BTreeMap<Domain, u64>,
    candidates: &[&Domain],
    promised: &[Promised],
    ask: &Ask,
) -> Option<Domain> {
    let need = u64::from(ask.gpus);
    (candidates.iter())
        .filter(|d| {
            d.and_above()
                .all(|x| least_room(caps, &x, promised, ask.start, ask.end).0 >= need)
        })
        .min_by_key(|d| {
            (
                least_room(caps, d, promised, ask.start, ask.end).0,
                (**d).clone(),
            )
        })
        .map(|d| (*d).clone())
}

#[cfg(test)]
#[path = "capacity_tests.rs"]
mod tests;
