//! Which nodes a cluster takes or gives back: pure choices over
//! candidates (no database), so that they can be tested alone. A create
//! takes the tightest domain that has enough free whole nodes (the
//! fullest fitting leaf first); a grow takes nodes next to the members; a
//! shrink gives back idle nodes of the thinnest leaf first.

use std::collections::{BTreeMap, BTreeSet};

use gangway_sched::Level;

/// A node that could join a cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub node_id: String,
    pub spine: String,
    pub leaf: String,
    pub nvlink_domain: String,
}

impl Candidate {
    /// The domain of `level` holding it, from the region down.
    pub(super) fn path(&self, level: Level) -> Vec<String> {
        let all = [&self.spine, &self.leaf, &self.nvlink_domain];
        let depth = match level {
            Level::Region => 0,
            Level::Spine => 1,
            Level::Leaf => 2,
            Level::Nvlink => 3,
        };
        all[..depth].iter().map(|s| s.to_string()).collect()
    }
}

/// Picks `n` of `free` inside one domain of `level` or tighter, the
/// tightest first: at each level from NVLink up, the domains with room for
/// all `n`, the fullest fit first (the fewest free nodes, leaving bigger
/// domains whole for bigger asks), then by name. Returns every choice in
/// the order to try (a caller may refuse one, for a reservation's sake),
/// each with its domain at `level`.
pub(crate) fn choices(
    free: &[Candidate],
    n: usize,
    level: Level,
) -> Vec<(Vec<&Candidate>, Vec<String>)> {
    let mut out = Vec::new();
    let mut seen: BTreeSet<Vec<&str>> = BTreeSet::new();
    for l in Level::ALL.into_iter().filter(|l| *l <= level) {
        let mut domains: BTreeMap<Vec<String>, Vec<&Candidate>> = BTreeMap::new();
        for c in free {
            domains.entry(c.path(l)).or_default().push(c);
        }
        let mut fits: Vec<(Vec<String>, Vec<&Candidate>)> =
            domains.into_iter().filter(|(_, v)| v.len() >= n).collect();
        fits.sort_by(|a, b| a.1.len().cmp(&b.1.len()).then_with(|| a.0.cmp(&b.0)));
        for (_, members) in fits {
            let picked = tightest(members, n, &[]);
            let key: Vec<&str> = picked.iter().map(|c| c.node_id.as_str()).collect();
            if seen.insert(key) {
                let domain = picked[0].path(level);
                out.push((picked, domain));
            }
        }
    }
    out
}

/// `n` of `free`, packed: nodes next to `near` first (same NVLink domain,
/// then leaf, then spine), then the fullest leaves and NVLink domains, so
/// the fewest leaves are used; ties by node id.
pub(super) fn tightest<'a>(
    mut free: Vec<&'a Candidate>,
    n: usize,
    near: &[Candidate],
) -> Vec<&'a Candidate> {
    let count = |key: &dyn Fn(&Candidate) -> (String, String, String)| {
        let mut m: BTreeMap<(String, String, String), usize> = BTreeMap::new();
        for c in free.iter() {
            *m.entry(key(c)).or_default() += 1;
        }
        m
    };
    let leaf_key = |c: &Candidate| (c.spine.clone(), c.leaf.clone(), String::new());
    let nvl_key = |c: &Candidate| (c.spine.clone(), c.leaf.clone(), c.nvlink_domain.clone());
    let per_leaf = count(&leaf_key);
    let per_nvl = count(&nvl_key);
    let near_in = |c: &Candidate, key: &dyn Fn(&Candidate) -> (String, String, String)| {
        near.iter().filter(|m| key(m) == key(c)).count()
    };
    let spine_key = |c: &Candidate| (c.spine.clone(), String::new(), String::new());
    free.sort_by_cached_key(|c| {
        (
            std::cmp::Reverse(near_in(c, &nvl_key)),
            std::cmp::Reverse(near_in(c, &leaf_key)),
            std::cmp::Reverse(near_in(c, &spine_key)),
            std::cmp::Reverse(per_leaf[&leaf_key(c)]),
            (c.spine.clone(), c.leaf.clone()),
            std::cmp::Reverse(per_nvl[&nvl_key(c)]),
            c.nvlink_domain.clone(),
            c.node_id.clone(),
        )
    });
    free.truncate(n);
    free
}

/// Which of a cluster's `members` (id, place, GPUs in use) a shrink by
/// `k` gives back: idle ones first, then from the leaves and NVLink
/// domains holding the fewest members (so the rest stay packed), then the
/// highest ids.
pub(crate) fn to_release(members: &[(Candidate, u32)], k: usize) -> Vec<String> {
    let mut per_leaf: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    let mut per_nvl: BTreeMap<(&str, &str, &str), usize> = BTreeMap::new();
    for (c, _) in members {
        *per_leaf.entry((&c.spine, &c.leaf)).or_default() += 1;
        *per_nvl
            .entry((&c.spine, &c.leaf, &c.nvlink_domain))
            .or_default() += 1;
    }
    let mut order: Vec<&(Candidate, u32)> = members.iter().collect();
    order.sort_by_key(|(c, used)| {
        (
            *used > 0,
            per_leaf[&(c.spine.as_str(), c.leaf.as_str())],
            per_nvl[&(c.spine.as_str(), c.leaf.as_str(), c.nvlink_domain.as_str())],
            std::cmp::Reverse(c.node_id.clone()),
        )
    });
    order
        .into_iter()
        .take(k)
        .map(|(c, _)| c.node_id.clone())
        .collect()
}

/// The tightest level holding all of `nodes`.
pub(super) fn placement_of(nodes: &[&Candidate]) -> Level {
    Level::holding(
        nodes
            .iter()
            .map(|c| (c.spine.as_str(), c.leaf.as_str(), c.nvlink_domain.as_str())),
    )
}

/// The largest number of `free` nodes inside one domain of `level`.
pub(super) fn largest_domain(free: &[Candidate], level: Level) -> usize {
    let mut m: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    for c in free {
        *m.entry(c.path(level)).or_default() += 1;
    }
    m.into_values().max().unwrap_or(0)
}

pub(super) fn domain_name(path: &[String]) -> String {
    if path.is_empty() {
        "the region".into()
    } else {
        path.join("/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, spine: &str, leaf: &str) -> Candidate {
        Candidate {
            node_id: id.into(),
            spine: spine.into(),
            leaf: leaf.into(),
            nvlink_domain: id.into(),
        }
    }

    #[test]
    fn a_create_takes_the_fullest_fitting_leaf_before_spreading_over_a_spine() {
        // s0/l0 has 3 free nodes, s0/l1 has 5, s1/l2 has 2.
        let mut free = Vec::new();
        for i in 0..3 {
            free.push(node(&format!("a{i}"), "s0", "l0"));
        }
        for i in 0..5 {
            free.push(node(&format!("b{i}"), "s0", "l1"));
        }
        for i in 0..2 {
            free.push(node(&format!("c{i}"), "s1", "l2"));
        }
        // 3 nodes: l0 fits exactly (best fit), before l1.
        let c = choices(&free, 3, Level::Spine);
        let ids = |v: &[&Candidate]| v.iter().map(|c| c.node_id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&c[0].0), ["a0", "a1", "a2"]);
        assert_eq!(c[0].1, ["s0"]);
        assert_eq!(ids(&c[1].0), ["b0", "b1", "b2"]);
        // 6 nodes: no leaf has them; spine s0 does, all of l1 then one of l0.
        let c = choices(&free, 6, Level::Spine);
        assert_eq!(ids(&c[0].0), ["b0", "b1", "b2", "b3", "b4", "a0"]);
        // At leaf level 6 do not fit anywhere.
        assert!(choices(&free, 6, Level::Leaf).is_empty());
        // 9 only fit the region.
        assert!(choices(&free, 9, Level::Spine).is_empty());
        assert_eq!(choices(&free, 9, Level::Region)[0].1, Vec::<String>::new());
    }

    #[test]
    fn a_grow_takes_nodes_next_to_the_members() {
        let free = [
            node("x0", "s0", "l9"),
            node("x1", "s0", "l9"),
            node("y0", "s0", "l1"),
        ];
        let members = vec![node("m0", "s0", "l1")];
        let picked = tightest(free.iter().collect(), 1, &members);
        assert_eq!(picked[0].node_id, "y0");
    }

    #[test]
    fn a_shrink_gives_back_idle_nodes_of_the_thinnest_leaf_first() {
        let members = vec![
            (node("a0", "s0", "l0"), 0),
            (node("a1", "s0", "l0"), 8),
            (node("a2", "s0", "l0"), 0),
            (node("b0", "s0", "l1"), 0),
            (node("c0", "s0", "l2"), 4),
        ];
        // b0: idle, alone in its leaf; then the idle ones of l0; the busy last.
        assert_eq!(to_release(&members, 1), ["b0"]);
        assert_eq!(to_release(&members, 3), ["b0", "a2", "a0"]);
        assert_eq!(to_release(&members, 4)[3], "c0");
    }
}
