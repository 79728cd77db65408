//! CSI topology: the segments that say where a volume is accessible, as
//! the node plugin reports them (NodeGetInfo) and the controller reads and
//! answers them (CreateVolume). Owns the keys and the reading of a CO's
//! requirements; decides no placement.
//!
//! A node is `ballast.csi.dev/node: <id>`, and, when its plugin knows it,
//! `topology.kubernetes.io/zone: <zone>`. Only a strict-local volume has a
//! topology of its own (its node); every other volume is accessible from
//! every node, so CreateVolume answers no topology for it.

use std::collections::HashMap;

use crate::proto::csi::v1::{Topology, TopologyRequirement};

/// The key of a node's own segment.
pub const NODE_KEY: &str = "ballast.csi.dev/node";
/// The key of a node's zone, Kubernetes' well-known label.
pub const ZONE_KEY: &str = "topology.kubernetes.io/zone";

/// What NodeGetInfo answers of a node: its id, and its zone when known.
pub fn of_node(node: &str, zone: &str) -> Topology {
    let mut segments = HashMap::from([(NODE_KEY.to_string(), node.to_string())]);
    if !zone.is_empty() {
        segments.insert(ZONE_KEY.to_string(), zone.to_string());
    }
    Topology { segments }
}

/// Where a volume pinned to `node` is accessible.
pub fn pinned_to(node: &str) -> Topology {
    Topology {
        segments: HashMap::from([(NODE_KEY.to_string(), node.to_string())]),
    }
}

/// The nodes a CO's requirements name, in the order to try them: the
/// preferred ones first (the first is where the CO schedules the pod), then
/// the requisite ones, each once.
pub fn nodes_named(req: Option<&TopologyRequirement>) -> Vec<String> {
    let Some(req) = req else {
        return Vec::new();
    };
    let mut out: Vec<String> = Vec::new();
    for t in req.preferred.iter().chain(&req.requisite) {
        if let Some(n) = t.segments.get(NODE_KEY)
            && !out.contains(n)
        {
            out.push(n.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preferred_nodes_come_first_then_requisite_each_once() {
        let t = |n: &str| Topology {
            segments: HashMap::from([(NODE_KEY.into(), n.into()), (ZONE_KEY.into(), "z".into())]),
        };
        let req = TopologyRequirement {
            requisite: vec![t("n1"), t("n2"), t("n3")],
            preferred: vec![t("n2"), t("n1")],
        };
        assert_eq!(nodes_named(Some(&req)), ["n2", "n1", "n3"]);
        assert!(nodes_named(None).is_empty());
        let zone_only = TopologyRequirement {
            requisite: vec![Topology {
                segments: HashMap::from([(ZONE_KEY.into(), "z".into())]),
            }],
            preferred: vec![],
        };
        assert!(nodes_named(Some(&zone_only)).is_empty());
    }

    #[test]
    fn a_node_reports_its_zone_only_when_it_knows_it() {
        assert_eq!(of_node("n1", "").segments.len(), 1);
        assert_eq!(of_node("n1", "z1").segments[ZONE_KEY], "z1");
        assert_eq!(pinned_to("n1").segments[NODE_KEY], "n1");
    }
}
