//! Drain (BEHAVIOR.md "Eviction and drain", seed 002): whether draining a
//! node must wait, and why, under the node drain policy; and the node's
//! `autoEvicting` flag. Only changes are reported.
//!
//! A replica that never held data is never a reason to block (lesson:
//! drains stuck for ever on empty replicas).

use std::collections::{BTreeMap, BTreeSet};

use ballast::model::NodeDrainPolicy;

use super::action::{ActionKind, Plan, Rule};
use super::pass::Pass;

/// For each node, the first volume (by name) whose healthy replicas all
/// live on it; with `running_only`, counting only running replicas.
fn last_holders(pass: &Pass, running_only: bool) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (i, v) in pass.view.volumes.iter().enumerate() {
        // Read from the replicas' `Facts`. A replica on a node out of the
        // view makes no entry: drain reports only the view's nodes.
        let mut nodes = pass
            .facts_at(i)
            .filter(|f| f.rw() && f.held_data() && (!running_only || f.running()))
            .map(|f| pass.node_of(f));
        if let Some(Some(first)) = nodes.next()
            && nodes.all(|n| n.is_some_and(|n| std::ptr::eq(n, first)))
        {
            out.entry(first.id.clone())
                .or_insert_with(|| format!("holds the last healthy replica of volume {}", v.name));
        }
    }
    out
}

/// For each node, its first replica (by name) that holds data.
fn any_holders(pass: &Pass) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (k, f) in pass.facts().iter().enumerate() {
        let Some(node) = pass.node_of(f) else {
            continue;
        };
        if f.held_data() && !f.failed() {
            let r = &pass.view.replicas[k];
            out.entry(node.id.clone()).or_insert_with(|| {
                format!(
                    "holds replica {} of volume {} (block-for-eviction)",
                    r.name, r.volume
                )
            });
        }
    }
    out
}

/// Why a drain of each node is blocked now, for the nodes where it is.
pub fn blocked_reasons(pass: &Pass) -> BTreeMap<String, String> {
    match pass.settings.node_drain_policy() {
        NodeDrainPolicy::AlwaysAllow => BTreeMap::new(),
        NodeDrainPolicy::BlockIfContainsLastReplica
        | NodeDrainPolicy::BlockForEvictionIfContainsLastReplica => last_holders(pass, false),
        NodeDrainPolicy::AllowIfReplicaIsStopped => last_holders(pass, true),
        NodeDrainPolicy::BlockForEviction => any_holders(pass),
    }
}

/// Reports each node's drain and auto-eviction status when it changed.
pub fn plan(pass: &Pass, plan: &mut Plan, auto_evicting: &BTreeSet<String>) {
    let reasons = blocked_reasons(pass);
    for node in &pass.view.nodes {
        let reason = reasons.get(&node.id).cloned();
        let evicting = auto_evicting.contains(&node.id);
        let blocked = reason.is_some();
        if blocked == node.drain_blocked
            && evicting == node.auto_evicting
            && reason == node.drain_blocked_reason
        {
            continue;
        }
        let why = match (&reason, evicting) {
            (Some(r), true) => format!(
                "node {}: drain blocked ({r}); evicting replicas automatically",
                node.id
            ),
            (Some(r), false) => format!("node {}: drain blocked ({r})", node.id),
            (None, true) => format!(
                "node {}: drain allowed; evicting replicas automatically",
                node.id
            ),
            (None, false) => format!("node {}: drain allowed", node.id),
        };
        plan.act(
            Rule::Drain,
            ActionKind::SetNodeStatus {
                node: node.id.clone(),
                auto_evicting: evicting,
                drain_blocked: blocked,
                drain_blocked_reason: reason,
            },
            why,
        );
    }
}
