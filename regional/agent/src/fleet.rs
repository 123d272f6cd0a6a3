//! Simulated nodes from a fleet file.

use gangway_shared::agent::{AgentGpu, AgentNode};
use gangway_shared::fleet::FleetFile;

/// The simulated nodes of `region` in `fleet`, as an agent serving all of
/// them describes them: every node is reached at `address`, and its GPUs
/// get stable synthetic UUIDs `GPU-sim-{node_id}-{index}`. Each carries
/// the file's power figures: its type's draw and its rack's budget. Nodes
/// listed by name are real machines, served by their own agents: left out.
pub fn nodes_from_fleet(fleet: &FleetFile, region: &str, address: &str) -> Vec<AgentNode> {
    fleet
        .expand(region)
        .into_iter()
        .filter(|node| !node.named)
        .map(|node| {
            let gpus = (0..node.gpus)
                .map(|index| AgentGpu {
                    index,
                    uuid: format!("GPU-sim-{}-{index}", node.node_id),
                    ..AgentGpu::default()
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
                gpu_power_w: node.gpu_power_w,
                rack_power_budget_w: node.rack_power_budget_w,
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
        // No power figures in the file: none registered.
        assert!(nodes
            .iter()
            .all(|n| n.gpu_power_w.is_none() && n.rack_power_budget_w.is_none()));
    }

    #[test]
    fn nodes_carry_the_files_power_figures() {
        let fleet = FleetFile::parse(
            r#"
            [gpu_power_w]
            h100 = 700
            [[spine]]
              [[spine.leaf]]
              nodes = 2
              gpu_type = "h100"
              gpus_per_node = 8
              power_budget_w = 10000
            "#,
        )
        .unwrap();
        let nodes = nodes_from_fleet(&fleet, "dev-1", "10.1.2.3");
        assert_eq!(nodes.len(), 2);
        for n in &nodes {
            assert_eq!(
                (n.gpu_power_w, n.rack_power_budget_w),
                (Some(700), Some(10_000))
            );
        }
        // And they reach the region: they are in the registration's JSON.
        let json = serde_json::to_value(&nodes[0]).unwrap();
        assert_eq!(json["gpu_power_w"], 700);
        assert_eq!(json["rack_power_budget_w"], 10_000);
    }
}
