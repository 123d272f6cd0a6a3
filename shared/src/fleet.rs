//! The fleet file: one region's machines described compactly in TOML.
//!
//! A 40,000-GPU region is a handful of lines because every block carries a
//! `count` and is repeated:
//!
//! ```toml
//! region = "us-east"            # optional; callers pass a default
//!
//! [gpu_power_w]                 # optional: watts one allocated GPU of each type draws
//! h100 = 700                    # (its enforced power limit); only types some leaf has
//!
//! [[spine]]
//! count = 4                     # this spine block repeated 4 times (default 1)
//!   [[spine.leaf]]
//!   count = 8                   # leaves of this kind in each spine (default 1)
//!   nodes = 32                  # nodes per leaf
//!   gpu_type = "h100"
//!   gpus_per_node = 8
//!   nvlink = "node"             # "node" | "leaf" (a whole rack is one NVLink domain, GB200 NVL72)
//!   spares = 1                  # the last `spares` nodes of each leaf go to the spare pool
//!   power_budget_w = 160000     # optional: watts this rack's GPUs may draw together
//!
//! [[spine]]                     # real machines, by name
//!   [[spine.leaf]]
//!   names = ["gpu-a1-[001-016]", "gpu-a1-spare"]   # ranges: [first-last], zero-padded as written
//!   gpu_type = "h100"
//!   gpus_per_node = 8
//!   spares = 1
//! ```
//!
//! **Named nodes.** A leaf block may list its machines by name (`names`,
//! each a name or a pattern with one numeric range) instead of counting
//! them (`nodes`): that is how a region's inventory knows real machines,
//! each served by an agent of its own name. Such a block stands for one
//! leaf (`count = 1`, in a spine block of `count = 1`); its nodes keep
//! their names as ids and are [`FleetNode::named`]. A simulated agent
//! serves only the counted nodes.
//!
//! [`FleetFile::expand`] turns it into one [`FleetNode`] per machine with
//! deterministic ids: spine `{region}-s{NN}` (numbered across all spine
//! blocks), leaf `{spine}-l{NN}` (numbered across the leaf blocks of its
//! spine), node `{leaf}-n{NN}`. Numbers start at 0 and are zero-padded to two
//! digits, or wider when a level has more than 100 members, so ids sort in
//! topology order. The NVLink domain of a node is its own id when
//! `nvlink = "node"` and its leaf's id when `nvlink = "leaf"`.
//!
//! **Power.** `power_budget_w` is a rack's (each leaf's of the block)
//! budget for GPU draw only (hosts, switches and cooling are the
//! facility's share of the rack's feed, not counted here); `[gpu_power_w]`
//! says what one allocated GPU of a type draws. The region never places
//! work that takes a rack's allocated GPUs past its budget (see
//! `regional/sched/src/power.rs`). A budget needs a draw for its leaf's
//! type; a draw for a type no leaf has is an error (most likely a typo).
//! Each [`FleetNode`] carries its rack's budget and its type's draw.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The most nodes one fleet file may expand to; a typo such as
/// `count = 40000` must fail loudly instead of allocating millions of nodes.
pub const MAX_NODES: u64 = 1_000_000;

/// The most GPUs one node may have.
pub const MAX_GPUS_PER_NODE: u32 = 64;

/// The most watts one GPU may be said to draw (a GB200 superchip draws
/// 1,200 W; more is a typo, such as kilowatts written as watts × 1000).
pub const MAX_GPU_POWER_W: u32 = 5_000;

/// A parsed fleet file. Build it with [`FleetFile::parse`] or
/// [`FleetFile::load`], which also validate it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetFile {
    /// Region name; when absent the caller's default applies (see
    /// [`FleetFile::region_or`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// GPU type → watts one allocated GPU of that type draws (its enforced
    /// power limit), 1..=[`MAX_GPU_POWER_W`]. A type left out is not
    /// counted against rack budgets.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gpu_power_w: BTreeMap<String, u32>,
    /// Spine blocks, in file order.
    #[serde(default)]
    pub spine: Vec<SpineBlock>,
}

/// One `[[spine]]` block: `count` identical spines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpineBlock {
    /// How many spines this block stands for.
    #[serde(default = "one")]
    pub count: u32,
    /// The leaf blocks under each of these spines, in file order.
    #[serde(default)]
    pub leaf: Vec<LeafBlock>,
}

/// One `[[spine.leaf]]` block: `count` identical leaves (racks) in each spine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeafBlock {
    /// How many leaves of this kind each spine has.
    #[serde(default = "one")]
    pub count: u32,
    /// Nodes (machines) per leaf, spares included. With `names`: absent,
    /// or the number of names.
    #[serde(default)]
    pub nodes: u32,
    /// The leaf's machines by name (patterns like `gpu-a1-[001-016]`
    /// allowed), spares last; instead of counting them with `nodes`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    /// GPU model, lowercase `[a-z0-9-]`, e.g. `h100`, `gb200`.
    pub gpu_type: String,
    /// GPUs in each node, 1..=64.
    pub gpus_per_node: u32,
    /// How far an NVLink domain reaches.
    #[serde(default)]
    pub nvlink: NvlinkScope,
    /// The last `spares` nodes of each leaf are held in the spare pool.
    #[serde(default)]
    pub spares: u32,
    /// Each leaf's (rack's) power budget for GPU draw, in watts; absent:
    /// no budget. Needs a draw for `gpu_type` in `[gpu_power_w]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_budget_w: Option<u64>,
}

/// How far one NVLink/NVSwitch domain reaches.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum NvlinkScope {
    /// Each node is its own NVLink domain (HGX H100/A100).
    #[default]
    Node,
    /// The whole leaf (rack) is one NVLink domain (GB200 NVL72).
    Leaf,
}

/// One machine of an expanded fleet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetNode {
    pub node_id: String,
    pub spine: String,
    pub leaf: String,
    pub nvlink_domain: String,
    pub gpu_type: String,
    pub gpus: u32,
    /// Held in the leaf's spare pool rather than offered to the scheduler.
    pub spare: bool,
    /// Watts one allocated GPU of this node draws (`[gpu_power_w]` of its
    /// type), if the file says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_power_w: Option<u32>,
    /// The power budget of the node's rack (leaf) for GPU draw, in watts,
    /// if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack_power_budget_w: Option<u64>,
    /// Listed by name (a real machine, served by an agent of its own name),
    /// not counted (a simulated node, `{leaf}-nNN`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub named: bool,
}

/// The most names one pattern may expand to.
pub const MAX_NAMES_PER_PATTERN: u64 = 100_000;

/// A machine's name as a node id: 1–200 ASCII letters, digits, `.`, `_`
/// and `-` (it appears in URL paths and is an agent's id).
pub fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Expands a name pattern: a plain name, or one numeric range in brackets
/// (`gpu-a1-[001-016]` → `gpu-a1-001` … `gpu-a1-016`, padded to the width
/// of the first number as written).
pub fn expand_names(pattern: &str) -> Result<Vec<String>, String> {
    let Some((prefix, rest)) = pattern.split_once('[') else {
        return if valid_node_name(pattern) {
            Ok(vec![pattern.to_string()])
        } else {
            Err(format!(
                "node name {pattern:?} must be 1-200 letters, digits, '.', '_' or '-'"
            ))
        };
    };
    let bad = || format!("name pattern {pattern:?} is not PREFIX[FIRST-LAST]SUFFIX");
    let (range, suffix) = rest.split_once(']').ok_or_else(bad)?;
    let (first, last) = range.split_once('-').ok_or_else(bad)?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(first) || !digits(last) || suffix.contains('[') {
        return Err(bad());
    }
    let (a, b): (u64, u64) = (
        first.parse().map_err(|_| bad())?,
        last.parse().map_err(|_| bad())?,
    );
    if a > b {
        return Err(format!("name pattern {pattern:?}: {first} is after {last}"));
    }
    if b - a >= MAX_NAMES_PER_PATTERN {
        return Err(format!(
            "name pattern {pattern:?} expands to more than {MAX_NAMES_PER_PATTERN} names"
        ));
    }
    let width = first.len();
    let names: Vec<String> = (a..=b)
        .map(|n| format!("{prefix}{n:0width$}{suffix}"))
        .collect();
    match names.iter().find(|n| !valid_node_name(n)) {
        Some(n) => Err(format!(
            "node name {n:?} (from {pattern:?}) must be 1-200 letters, digits, '.', '_' or '-'"
        )),
        None => Ok(names),
    }
}

impl LeafBlock {
    /// The leaf's machines by name, expanded; empty when they are counted.
    pub fn expanded_names(&self) -> Result<Vec<String>, String> {
        let mut out = Vec::new();
        for p in &self.names {
            out.extend(expand_names(p)?);
        }
        Ok(out)
    }

    /// Nodes per leaf: the names, else `nodes` (names that do not expand
    /// count 0; validation says why).
    fn node_total(&self) -> u32 {
        if self.names.is_empty() {
            self.nodes
        } else {
            self.expanded_names()
                .map_or(0, |n| u32::try_from(n.len()).unwrap_or(u32::MAX))
        }
    }
}

/// Why a fleet file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("cannot read fleet file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("fleet file is not valid TOML for a fleet: {0}")]
    Parse(String),
    #[error("invalid fleet file: {at}: {message}")]
    Invalid {
        /// Which block is wrong, e.g. `spine block 2, leaf block 1` (1-based,
        /// in file order), or `fleet` for the whole file.
        at: String,
        message: String,
    },
}

fn one() -> u32 {
    1
}

fn invalid(at: impl Into<String>, message: impl Into<String>) -> FleetError {
    FleetError::Invalid {
        at: at.into(),
        message: message.into(),
    }
}

/// True for a non-empty name of lowercase letters, digits and dashes.
fn is_slug(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Digits used for members numbered `0..n`: two, or more when needed.
fn id_width(n: u64) -> usize {
    let mut width = 1;
    let mut last = n.saturating_sub(1);
    while last >= 10 {
        width += 1;
        last /= 10;
    }
    width.max(2)
}

/// Totals of a fleet, counted without expanding it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetTotals {
    pub spines: u64,
    pub leaves: u64,
    pub nodes: u64,
    pub gpus: u64,
    pub spare_gpus: u64,
    /// GPUs not in a spare pool, per GPU type.
    pub schedulable_by_type: BTreeMap<String, u64>,
    /// The racks' power budgets added up, in watts (racks without one
    /// count 0).
    #[serde(default)]
    pub power_budget_w: u64,
}

impl FleetTotals {
    /// GPUs not in a spare pool.
    pub fn schedulable_gpus(&self) -> u64 {
        self.gpus - self.spare_gpus
    }
}

impl FleetFile {
    /// Parses and validates a fleet file's text.
    pub fn parse(text: &str) -> Result<FleetFile, FleetError> {
        let fleet: FleetFile =
            toml::from_str(text).map_err(|e| FleetError::Parse(e.to_string()))?;
        fleet.validate()?;
        Ok(fleet)
    }

    /// Reads, parses and validates a fleet file.
    pub fn load(path: impl AsRef<Path>) -> Result<FleetFile, FleetError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| FleetError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        FleetFile::parse(&text)
    }

    /// The file's own region if it names one, else `default`.
    pub fn region_or<'a>(&'a self, default: &'a str) -> &'a str {
        self.region.as_deref().unwrap_or(default)
    }

    /// Checks every rule of the format; [`FleetFile::parse`] calls it.
    pub fn validate(&self) -> Result<(), FleetError> {
        if let Some(region) = &self.region {
            if !is_slug(region) {
                return Err(invalid(
                    "fleet",
                    format!(
                        "region {region:?} must be non-empty lowercase letters, digits and '-'"
                    ),
                ));
            }
        }
        if self.spine.is_empty() {
            return Err(invalid(
                "fleet",
                "no [[spine]] blocks: a fleet needs at least one",
            ));
        }
        let mut seen_names = std::collections::BTreeSet::new();
        for (s, spine) in self.spine.iter().enumerate() {
            let at = format!("spine block {}", s + 1);
            if spine.count == 0 {
                return Err(invalid(at, "count must be at least 1"));
            }
            if spine.leaf.is_empty() {
                return Err(invalid(
                    at,
                    "no [[spine.leaf]] blocks: a spine needs at least one leaf",
                ));
            }
            for (l, leaf) in spine.leaf.iter().enumerate() {
                let at = format!("spine block {}, leaf block {}", s + 1, l + 1);
                if leaf.count == 0 {
                    return Err(invalid(at, "count must be at least 1"));
                }
                if !leaf.names.is_empty() {
                    let names = leaf.expanded_names().map_err(|m| invalid(&at, m))?;
                    if leaf.count != 1 || spine.count != 1 {
                        return Err(invalid(
                            at,
                            "a leaf block with names stands for one leaf: its count and its \
                             spine block's count must be 1",
                        ));
                    }
                    if leaf.nodes != 0 && leaf.nodes as usize != names.len() {
                        return Err(invalid(
                            at,
                            format!(
                                "nodes is {} but names lists {}: leave nodes out",
                                leaf.nodes,
                                names.len()
                            ),
                        ));
                    }
                    for n in names {
                        if !seen_names.insert(n.clone()) {
                            return Err(invalid(at, format!("node {n:?} is listed twice")));
                        }
                    }
                }
                let nodes = leaf.node_total();
                if nodes == 0 {
                    return Err(invalid(
                        at,
                        "nodes must be at least 1 (count the leaf's machines with `nodes = N`, \
                         or list them with `names = [...]`)",
                    ));
                }
                if !(1..=MAX_GPUS_PER_NODE).contains(&leaf.gpus_per_node) {
                    return Err(invalid(
                        at,
                        format!(
                            "gpus_per_node is {}; it must be between 1 and {MAX_GPUS_PER_NODE}",
                            leaf.gpus_per_node
                        ),
                    ));
                }
                if leaf.spares >= nodes {
                    return Err(invalid(
                        at,
                        format!(
                            "spares ({}) must be fewer than nodes ({nodes})",
                            leaf.spares
                        ),
                    ));
                }
                if !is_slug(&leaf.gpu_type) {
                    return Err(invalid(
                        at,
                        format!(
                            "gpu_type {:?} must be non-empty lowercase letters, digits and '-'",
                            leaf.gpu_type
                        ),
                    ));
                }
                if let Some(budget) = leaf.power_budget_w {
                    if budget == 0 {
                        return Err(invalid(at, "power_budget_w must be at least 1"));
                    }
                    if !self.gpu_power_w.contains_key(&leaf.gpu_type) {
                        return Err(invalid(
                            at,
                            format!(
                                "power_budget_w needs the draw of a {} GPU: add it to \
                                 [gpu_power_w] ({} = <watts>)",
                                leaf.gpu_type, leaf.gpu_type
                            ),
                        ));
                    }
                }
            }
        }
        for (ty, &watts) in &self.gpu_power_w {
            let at = format!("[gpu_power_w] {ty}");
            if !(1..=MAX_GPU_POWER_W).contains(&watts) {
                return Err(invalid(
                    at,
                    format!("{watts} W; a GPU's draw must be between 1 and {MAX_GPU_POWER_W} W"),
                ));
            }
            let used = (self.spine.iter())
                .flat_map(|s| &s.leaf)
                .any(|l| &l.gpu_type == ty);
            if !used {
                return Err(invalid(
                    at,
                    format!("no leaf has GPU type {ty:?} (a typo?)"),
                ));
            }
        }
        let nodes = self.node_count();
        if nodes > MAX_NODES {
            return Err(invalid(
                "fleet",
                format!("it expands to {nodes} nodes; the limit is {MAX_NODES}"),
            ));
        }
        Ok(())
    }

    /// Nodes the fleet expands to (saturating, so it is safe before validation).
    fn node_count(&self) -> u64 {
        self.spine.iter().fold(0u64, |acc, spine| {
            let per_spine = spine.leaf.iter().fold(0u64, |acc, leaf| {
                acc.saturating_add(
                    u64::from(leaf.count).saturating_mul(u64::from(leaf.node_total())),
                )
            });
            acc.saturating_add(u64::from(spine.count).saturating_mul(per_spine))
        })
    }

    /// Counts spines, leaves, nodes and GPUs without expanding.
    pub fn totals(&self) -> FleetTotals {
        let mut t = FleetTotals::default();
        for spine in &self.spine {
            let sc = u64::from(spine.count);
            t.spines += sc;
            for leaf in &spine.leaf {
                let leaves = sc * u64::from(leaf.count);
                let gpn = u64::from(leaf.gpus_per_node);
                t.leaves += leaves;
                let nodes = u64::from(leaf.node_total());
                t.nodes += leaves * nodes;
                t.gpus += leaves * nodes * gpn;
                t.spare_gpus += leaves * u64::from(leaf.spares) * gpn;
                t.power_budget_w = t
                    .power_budget_w
                    .saturating_add(leaves.saturating_mul(leaf.power_budget_w.unwrap_or(0)));
                *t.schedulable_by_type
                    .entry(leaf.gpu_type.clone())
                    .or_default() += leaves * nodes.saturating_sub(u64::from(leaf.spares)) * gpn;
            }
        }
        t
    }

    /// All GPUs of the fleet, spares included.
    pub fn total_gpus(&self) -> u64 {
        self.totals().gpus
    }

    /// GPUs outside the spare pools: what the scheduler may hand out.
    pub fn schedulable_gpus(&self) -> u64 {
        self.totals().schedulable_gpus()
    }

    /// One [`FleetNode`] per machine, in id (= topology) order, for `region`.
    /// The `region` argument is used as given; pass
    /// [`FleetFile::region_or`]`(default)` to honour the file's own region.
    pub fn expand(&self, region: &str) -> Vec<FleetNode> {
        let total_spines: u64 = self.spine.iter().map(|s| u64::from(s.count)).sum();
        let spine_width = id_width(total_spines);
        let mut out = Vec::with_capacity(usize::try_from(self.node_count()).unwrap_or(0));
        let mut spine_no = 0u64;
        for block in &self.spine {
            let leaves_per_spine: u64 = block.leaf.iter().map(|l| u64::from(l.count)).sum();
            let leaf_width = id_width(leaves_per_spine);
            for _ in 0..block.count {
                let spine = format!("{region}-s{spine_no:0spine_width$}");
                spine_no += 1;
                let mut leaf_no = 0u64;
                for leaf_block in &block.leaf {
                    let names = leaf_block.expanded_names().unwrap_or_default();
                    let total = leaf_block.node_total();
                    let node_width = id_width(u64::from(total));
                    let first_spare = total - leaf_block.spares.min(total);
                    for _ in 0..leaf_block.count {
                        let leaf = format!("{spine}-l{leaf_no:0leaf_width$}");
                        leaf_no += 1;
                        for n in 0..total {
                            let node_id = match names.get(n as usize) {
                                Some(name) => name.clone(),
                                None => format!("{leaf}-n{n:0node_width$}"),
                            };
                            let nvlink_domain = match leaf_block.nvlink {
                                NvlinkScope::Node => node_id.clone(),
                                NvlinkScope::Leaf => leaf.clone(),
                            };
                            out.push(FleetNode {
                                node_id,
                                spine: spine.clone(),
                                leaf: leaf.clone(),
                                nvlink_domain,
                                gpu_type: leaf_block.gpu_type.clone(),
                                gpus: leaf_block.gpus_per_node,
                                spare: n >= first_spare,
                                gpu_power_w: self.gpu_power_w.get(&leaf_block.gpu_type).copied(),
                                rack_power_budget_w: leaf_block.power_budget_w,
                                named: !names.is_empty(),
                            });
                        }
                    }
                }
            }
        }
        out
    }
}

impl fmt::Display for NvlinkScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NvlinkScope::Node => "node",
            NvlinkScope::Leaf => "leaf",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = r#"
        region = "us-east"
        [[spine]]
        count = 2
          [[spine.leaf]]
          count = 2
          nodes = 3
          gpu_type = "h100"
          gpus_per_node = 8
          spares = 1
          [[spine.leaf]]
          nodes = 18
          gpu_type = "gb200"
          gpus_per_node = 4
          nvlink = "leaf"
    "#;

    fn err_text(text: &str) -> String {
        FleetFile::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn parses_defaults() {
        let f = FleetFile::parse(
            "[[spine]]\n[[spine.leaf]]\nnodes = 2\ngpu_type = \"a100\"\ngpus_per_node = 8\n",
        )
        .unwrap();
        assert_eq!(f.region, None);
        assert_eq!(f.region_or("eu-central"), "eu-central");
        assert_eq!(f.spine[0].count, 1);
        let leaf = &f.spine[0].leaf[0];
        assert_eq!(
            (leaf.count, leaf.spares, leaf.nvlink),
            (1, 0, NvlinkScope::Node)
        );
    }

    #[test]
    fn expands_with_deterministic_ids() {
        let f = FleetFile::parse(SMALL).unwrap();
        assert_eq!(f.region_or("x"), "us-east");
        let nodes = f.expand("us-east");
        // 2 spines × (2 leaves × 3 nodes + 1 leaf × 18 nodes)
        assert_eq!(nodes.len(), 2 * (2 * 3 + 18));
        assert_eq!(
            nodes[0],
            FleetNode {
                node_id: "us-east-s00-l00-n00".into(),
                spine: "us-east-s00".into(),
                leaf: "us-east-s00-l00".into(),
                nvlink_domain: "us-east-s00-l00-n00".into(),
                gpu_type: "h100".into(),
                gpus: 8,
                spare: false,
                gpu_power_w: None,
                rack_power_budget_w: None,
                named: false,
            }
        );
        // The last node of each h100 leaf is its spare.
        assert!(nodes[2].spare && nodes[2].node_id == "us-east-s00-l00-n02");
        // Leaves are numbered across the leaf blocks of one spine.
        let rack = &nodes[6];
        assert_eq!(rack.node_id, "us-east-s00-l02-n00");
        assert_eq!(rack.nvlink_domain, "us-east-s00-l02");
        assert_eq!(rack.gpu_type, "gb200");
        assert!(!rack.spare);
        // Spines are numbered across blocks; the second spine restarts leaves.
        assert_eq!(nodes[24].node_id, "us-east-s01-l00-n00");
        // Ids are unique and already in sorted order.
        let ids: Vec<&str> = nodes.iter().map(|n| n.node_id.as_str()).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(ids, sorted);
        assert_eq!(f.total_gpus(), 2 * (2 * 3 * 8 + 18 * 4));
        assert_eq!(f.schedulable_gpus(), 2 * (2 * 2 * 8 + 18 * 4));
        let expanded: u64 = nodes.iter().map(|n| u64::from(n.gpus)).sum();
        assert_eq!(expanded, f.total_gpus());
    }

    #[test]
    fn spines_are_numbered_across_blocks_and_widen() {
        let text = "[[spine]]\ncount = 99\n[[spine.leaf]]\nnodes = 1\ngpu_type = \"h100\"\ngpus_per_node = 8\n\
                    [[spine]]\ncount = 2\n[[spine.leaf]]\nnodes = 101\ngpu_type = \"a100\"\ngpus_per_node = 8\n";
        let nodes = FleetFile::parse(text).unwrap().expand("r");
        assert_eq!(nodes[0].node_id, "r-s000-l00-n00");
        assert_eq!(nodes[98].node_id, "r-s098-l00-n00");
        assert_eq!(nodes[99].node_id, "r-s099-l00-n000");
        assert_eq!(nodes.last().unwrap().node_id, "r-s100-l00-n100");
    }

    #[test]
    fn rejects_bad_values_naming_the_block() {
        let base = |extra: &str| {
            format!(
                "[[spine]]\n[[spine.leaf]]\nnodes = 4\ngpu_type = \"h100\"\ngpus_per_node = 8\n\
                 [[spine]]\n[[spine.leaf]]\nnodes = 4\ngpu_type = \"h100\"\ngpus_per_node = 8\n{extra}"
            )
        };
        assert!(FleetFile::parse(&base("")).is_ok());
        let e = err_text(&base(
            "[[spine.leaf]]\nnodes = 0\ngpu_type = \"h100\"\ngpus_per_node = 8\n",
        ));
        assert!(
            e.contains("spine block 2, leaf block 2") && e.contains("nodes"),
            "{e}"
        );
        let e = err_text(&base(
            "[[spine.leaf]]\nnodes = 4\ngpu_type = \"h100\"\ngpus_per_node = 65\n",
        ));
        assert!(
            e.contains("spine block 2, leaf block 2") && e.contains("gpus_per_node"),
            "{e}"
        );
        let e = err_text(&base(
            "[[spine.leaf]]\nnodes = 4\ngpu_type = \"h100\"\ngpus_per_node = 0\n",
        ));
        assert!(e.contains("gpus_per_node"), "{e}");
        let e = err_text(&base(
            "[[spine.leaf]]\nnodes = 4\nspares = 4\ngpu_type = \"h100\"\ngpus_per_node = 8\n",
        ));
        assert!(e.contains("spares (4) must be fewer than nodes (4)"), "{e}");
        let e = err_text(&base(
            "[[spine.leaf]]\nnodes = 4\ngpu_type = \"H100\"\ngpus_per_node = 8\n",
        ));
        assert!(e.contains("gpu_type \"H100\""), "{e}");
        let e = err_text(&base(
            "[[spine.leaf]]\ncount = 0\nnodes = 4\ngpu_type = \"h100\"\ngpus_per_node = 8\n",
        ));
        assert!(e.contains("leaf block 2") && e.contains("count"), "{e}");
        let e = err_text("[[spine]]\ncount = 0\n[[spine.leaf]]\nnodes = 4\ngpu_type = \"h100\"\ngpus_per_node = 8\n");
        assert!(e.contains("spine block 1: count must be at least 1"), "{e}");
        let e = err_text("[[spine]]\ncount = 3\n");
        assert!(e.contains("spine block 1") && e.contains("leaf"), "{e}");
        let e = err_text("region = \"us-east\"\n");
        assert!(e.contains("no [[spine]] blocks"), "{e}");
        let e = err_text("region = \"US East\"\n[[spine]]\n[[spine.leaf]]\nnodes = 1\ngpu_type = \"h100\"\ngpus_per_node = 8\n");
        assert!(e.contains("region"), "{e}");
    }

    #[test]
    fn rejects_unknown_keys_and_bad_types() {
        let e = err_text("[[spine]]\n[[spine.leaf]]\nnodes = 4\ngpu_type = \"h100\"\ngpus_per_node = 8\ngpus = 8\n");
        assert!(e.contains("unknown field `gpus`"), "{e}");
        let e = err_text("[[spine]]\ncuont = 2\n[[spine.leaf]]\nnodes = 4\ngpu_type = \"h100\"\ngpus_per_node = 8\n");
        assert!(e.contains("unknown field `cuont`"), "{e}");
        let e = err_text("zone = 1\n");
        assert!(e.contains("unknown field `zone`"), "{e}");
        let e = err_text("[[spine]]\n[[spine.leaf]]\nnodes = 4\ngpu_type = \"h100\"\ngpus_per_node = 8\nnvlink = \"rack\"\n");
        assert!(e.contains("unknown variant `rack`"), "{e}");
        let e = err_text(
            "[[spine]]\n[[spine.leaf]]\nnodes = -1\ngpu_type = \"h100\"\ngpus_per_node = 8\n",
        );
        assert!(e.starts_with("fleet file is not valid TOML"), "{e}");
        let e = err_text("[[spine]]\n[[spine.leaf]]\ngpu_type = \"h100\"\ngpus_per_node = 8\n");
        assert!(e.contains("nodes must be at least 1"), "{e}");
    }

    const POWERED: &str = r#"
        [gpu_power_w]
        h100 = 700
        gb200 = 1200
        [[spine]]
          [[spine.leaf]]
          count = 2
          nodes = 4
          gpu_type = "h100"
          gpus_per_node = 8
          power_budget_w = 14000
          [[spine.leaf]]
          nodes = 18
          gpu_type = "gb200"
          gpus_per_node = 4
          nvlink = "leaf"
    "#;

    #[test]
    fn power_budgets_and_draws_reach_every_node() {
        let f = FleetFile::parse(POWERED).unwrap();
        let nodes = f.expand("r");
        // The budgeted h100 racks: each node knows its rack's budget.
        for n in nodes.iter().filter(|n| n.gpu_type == "h100") {
            assert_eq!(
                (n.gpu_power_w, n.rack_power_budget_w),
                (Some(700), Some(14_000))
            );
        }
        // A drawn type in a rack without a budget: counted, not limited.
        for n in nodes.iter().filter(|n| n.gpu_type == "gb200") {
            assert_eq!((n.gpu_power_w, n.rack_power_budget_w), (Some(1200), None));
        }
        let text = toml::to_string(&f).unwrap();
        assert_eq!(FleetFile::parse(&text).unwrap(), f);
    }

    #[test]
    fn rejects_bad_power_figures() {
        let e = err_text(&POWERED.replace("14000", "0"));
        assert!(
            e.contains("leaf block 1") && e.contains("power_budget_w must be at least 1"),
            "{e}"
        );
        let e = err_text(&POWERED.replace("h100 = 700", "h100 = 0"));
        assert!(
            e.contains("[gpu_power_w] h100") && e.contains("between 1 and 5000"),
            "{e}"
        );
        let e = err_text(&POWERED.replace("h100 = 700", "h100 = 700000"));
        assert!(e.contains("700000 W"), "{e}");
        // A draw for a type no leaf has: a typo, refused.
        let e = err_text(&POWERED.replace("gb200 = 1200", "gb200 = 1200\nh200 = 700"));
        assert!(e.contains("no leaf has GPU type \"h200\""), "{e}");
        // A budget whose type has no draw could not be enforced.
        let e = err_text(&POWERED.replace("h100 = 700", ""));
        assert!(
            e.contains("leaf block 1") && e.contains("[gpu_power_w] (h100 = <watts>)"),
            "{e}"
        );
        let e = err_text(&POWERED.replace("power_budget_w = 14000", "power_budget_w = -1"));
        assert!(e.starts_with("fleet file is not valid TOML"), "{e}");
    }

    #[test]
    fn rejects_fleets_too_large_to_expand() {
        let e = err_text("[[spine]]\ncount = 4000000000\n[[spine.leaf]]\ncount = 4000000000\nnodes = 4000000000\ngpu_type = \"h100\"\ngpus_per_node = 8\n");
        assert!(e.contains("the limit is 1000000"), "{e}");
    }

    #[test]
    fn round_trips_through_toml() {
        let f = FleetFile::parse(SMALL).unwrap();
        let text = toml::to_string(&f).unwrap();
        assert_eq!(FleetFile::parse(&text).unwrap(), f);
    }

    #[test]
    fn load_reports_the_path() {
        let e = FleetFile::load("/nonexistent/fleet.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/fleet.toml"), "{e}");
    }

    /// Every file in deploy/fleets states its totals on a `# totals:` line of
    /// `key=value` pairs; they must match what the file expands to.
    #[test]
    fn example_fleets_match_their_stated_totals() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/fleets");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        files.sort();
        assert!(
            files.len() >= 4,
            "expected the example fleets in {}",
            dir.display()
        );
        for path in files {
            let name = path.display().to_string();
            let fleet = FleetFile::load(&path).unwrap_or_else(|e| panic!("{e}"));
            let text = std::fs::read_to_string(&path).unwrap();
            let stated: Vec<(String, u64)> = text
                .lines()
                .filter_map(|l| l.trim().strip_prefix("# totals:"))
                .flat_map(|rest| rest.split_whitespace())
                .map(|kv| {
                    let (k, v) = kv
                        .split_once('=')
                        .unwrap_or_else(|| panic!("{name}: bad {kv:?}"));
                    let v: u64 = v.replace([',', '_'], "").parse().unwrap();
                    (k.to_string(), v)
                })
                .collect();
            assert!(!stated.is_empty(), "{name} states no `# totals:`");
            let t = fleet.totals();
            let nodes = fleet.expand(fleet.region_or("test"));
            assert_eq!(nodes.len() as u64, t.nodes, "{name}");
            assert_eq!(
                nodes.iter().map(|n| u64::from(n.gpus)).sum::<u64>(),
                t.gpus,
                "{name}"
            );
            let spare: u64 = nodes
                .iter()
                .filter(|n| n.spare)
                .map(|n| u64::from(n.gpus))
                .sum();
            assert_eq!(spare, t.spare_gpus, "{name}");
            for (key, value) in stated {
                let actual = match key.as_str() {
                    "spines" => t.spines,
                    "leaves" => t.leaves,
                    "nodes" => t.nodes,
                    "gpus" => t.gpus,
                    "spare_gpus" => t.spare_gpus,
                    "schedulable_gpus" => t.schedulable_gpus(),
                    "power_budget_w" => t.power_budget_w,
                    other => match other.strip_prefix("schedulable.") {
                        Some(ty) => t.schedulable_by_type.get(ty).copied().unwrap_or(0),
                        None => panic!("{name}: unknown total {other:?}"),
                    },
                };
                assert_eq!(
                    actual, value,
                    "{name}: stated {key}={value}, actual {actual}"
                );
            }
        }
    }

    #[test]
    fn named_machines_keep_their_names() {
        let f = FleetFile::parse(
            r#"
            [[spine]]
              [[spine.leaf]]
              names = ["gpu-a1-[008-010]", "gpu-a1-spare"]
              gpu_type = "h100"
              gpus_per_node = 8
              spares = 1
              [[spine.leaf]]
              nodes = 2
              gpu_type = "h100"
              gpus_per_node = 8
            "#,
        )
        .unwrap();
        let nodes = f.expand("r1");
        let ids: Vec<&str> = nodes.iter().map(|n| n.node_id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "gpu-a1-008",
                "gpu-a1-009",
                "gpu-a1-010",
                "gpu-a1-spare",
                "r1-s00-l01-n00",
                "r1-s00-l01-n01"
            ]
        );
        assert!(nodes[..4].iter().all(|n| n.named && n.leaf == "r1-s00-l00"));
        assert_eq!(nodes[0].nvlink_domain, "gpu-a1-008");
        assert!(nodes[3].spare && !nodes[2].spare);
        assert!(!nodes[4].named);
        assert_eq!(f.totals().nodes, 6);
    }

    #[test]
    fn bad_names_are_refused() {
        let leaf = |names: &str, extra: &str| {
            err_text(&format!(
                "[[spine]]\n{extra}\n[[spine.leaf]]\nnames = {names}\ngpu_type = \"h100\"\ngpus_per_node = 8\n"
            ))
        };
        assert!(
            leaf(r#"["a-[3-1]"]"#, "").contains("after"),
            "{}",
            leaf(r#"["a-[3-1]"]"#, "")
        );
        assert!(leaf(r#"["a b"]"#, "").contains("must be"));
        assert!(leaf(r#"["a-[1-x]"]"#, "").contains("PREFIX[FIRST-LAST]SUFFIX"));
        assert!(leaf(r#"["a", "a"]"#, "").contains("listed twice"));
        assert!(leaf(r#"["a"]"#, "count = 2").contains("one leaf"));
        assert_eq!(
            expand_names("n[1-3].dc").unwrap(),
            ["n1.dc", "n2.dc", "n3.dc"]
        );
    }
}
