//! Eviction (BEHAVIOR.md "Eviction and drain", seed 002): which replicas
//! are asked to leave. A replica is evicted when its node or disk has
//! `evictionRequested`, or its node is cordoned and the drain policy says
//! so. The replacement is built first (replenish), the replica deleted
//! after (cleanup).
//!
//! Under `block-for-eviction-if-contains-last-replica` an automatic
//! eviction, once requested, holds while the node stays cordoned: the
//! replacement becoming healthy must not cancel it.

use std::collections::BTreeSet;

use ballast::model::NodeDrainPolicy;

use super::action::{ActionKind, Plan, Rule};
use super::pass::Pass;
use super::view::ReplicaView;

/// Whether another healthy replica of the volume of `r` (the view's
/// replica `k`) lives on a node that is not cordoned (and is ready).
fn other_healthy_elsewhere(pass: &Pass, k: usize, r: &ReplicaView) -> bool {
    pass.replicas_with(k).iter().any(|o| {
        o.name != r.name && o.is_rw() && pass.node(&o.node).is_some_and(|n| n.ready && !n.cordoned)
    })
}

/// Decides every replica's eviction request; records the decision in
/// `pass.evicting` and returns the nodes that are evicting automatically.
pub fn mark(pass: &mut Pass, plan: &mut Plan) -> BTreeSet<String> {
    let policy = pass.settings.node_drain_policy();
    let mut auto_nodes = BTreeSet::new();
    let view = pass.view;
    for k in 0..pass.facts().len() {
        let f = pass.facts()[k];
        let Some(node) = pass.node_of(&f) else {
            continue;
        };
        let disk_evicting = pass.disk_of(&f).is_some_and(|d| d.eviction_requested);
        // Most replicas: nothing asks them to leave, and no request of
        // theirs is to cancel. Their records are not read.
        if !node.eviction_requested && !disk_evicting && !node.cordoned && !f.eviction_requested() {
            continue;
        }
        let r = &view.replicas[k];
        let manual = node.eviction_requested || disk_evicting;
        let auto = node.cordoned
            && match policy {
                NodeDrainPolicy::BlockForEviction => true,
                NodeDrainPolicy::BlockForEvictionIfContainsLastReplica => {
                    r.eviction_requested || !other_healthy_elsewhere(pass, k, r)
                }
                _ => false,
            };
        // A failed replica is not evicted: it is replaced or cleaned up.
        let wanted = (manual || auto) && !r.is_failed();
        if wanted {
            pass.evicting.insert(r.name.clone());
            if auto && !manual {
                auto_nodes.insert(r.node.clone());
            }
        }
        if wanted == r.eviction_requested {
            continue;
        }
        let why = if !wanted {
            format!(
                "eviction of {} canceled: its node and disk no longer ask for it",
                r.name
            )
        } else if manual {
            format!(
                "{} asks for eviction: replica {} of {} will be rebuilt elsewhere, then deleted",
                if node.eviction_requested {
                    format!("node {}", node.id)
                } else {
                    format!("disk {}/{}", r.node, r.disk)
                },
                r.name,
                r.volume
            )
        } else {
            format!(
                "node {} is cordoned and node-drain-policy is {policy}: replica {} of {} will be rebuilt elsewhere, then deleted",
                node.id, r.name, r.volume
            )
        };
        plan.act(
            Rule::Eviction,
            ActionKind::SetReplicaEviction {
                replica: r.name.clone(),
                requested: wanted,
            },
            why.clone(),
        );
        let object = format!("replica/{}", r.name);
        if wanted && auto && !manual {
            plan.event(Rule::Eviction, object, "EvictionAutomatic", why);
        } else if !wanted {
            plan.event(Rule::Eviction, object, "EvictionCanceled", why);
        }
    }
    auto_nodes
}
