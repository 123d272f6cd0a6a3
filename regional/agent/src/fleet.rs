//! Simulated nodes from a fleet file.

use gangway_shared::agent::{AgentGpu, AgentNode};
use gangway_shared::fleet::FleetFile;

/// The nodes of `region` in `fleet`, as an agent serving all of them
/// describes them: every node is reached at `address`, and its GPUs get
/// stable synthetic UUIDs `GPU-sim-{node_id}-{index}`.
pub fn nodes_from_fleet(fleet: &FleetFile, region: &str, address: &str) -> Vec<AgentNode> {
    fleet
        .expand(region)
        .into_iter()
        .map(|node| {
            let gpus = (0..node.gpus)
                .map(|index| AgentGpu {
                    index,
                    uuid: format!("GPU-sim-{}-{index}", node.node_id),
                })
                .collect();
            AgentNode {
                node_id: node.node_id,
                spine: node.spine,
                leaf: node.leaf,
                nvlink_domain: node.nvlink_domain,
                gpu_type: node.gpu_type,
                spare: node.spare,
                address: address.to_string(),
                gpus,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_node_of_the_fleet_with_synthetic_gpu_uuids() {
        let fleet = FleetFile::parse(
            r#"
            [[spine]]
            count = 1
              [[spine.leaf]]
              count = 1
              nodes = 2
              gpu_type = "h100"
              gpus_per_node = 4
              nvlink = "node"
              spares = 1
            "#,
        )
        .unwrap();
        let nodes = nodes_from_fleet(&fleet, "dev-1", "10.1.2.3");
        let expanded = fleet.expand("dev-1");
        assert_eq!(nodes.len(), expanded.len());
        for (node, fleet_node) in nodes.iter().zip(&expanded) {
            assert_eq!(node.node_id, fleet_node.node_id);
            assert_eq!(node.leaf, fleet_node.leaf);
            assert_eq!(node.spare, fleet_node.spare);
            assert_eq!(node.address, "10.1.2.3");
            let uuids: Vec<_> = node.gpus.iter().map(|g| g.uuid.clone()).collect();
            let want: Vec<_> = (0..4)
                .map(|i| format!("GPU-sim-{}-{i}", node.node_id))
                .collect();
            assert_eq!(uuids, want);
            assert_eq!(
                node.gpus.iter().map(|g| g.index).collect::<Vec<_>>(),
                [0, 1, 2, 3]
            );
        }
        assert_eq!(nodes.iter().filter(|n| n.spare).count(), 1);
    }
}
