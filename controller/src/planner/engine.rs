//! An attached volume's engine rebuilds its replicas (BEHAVIOR.md
//! "Rebuild"). While the node it is attached to is not ready, its engine
//! cannot be reached, so no rule adds or moves a replica of it. Each such
//! replica would be made only to fail at once, and be made again on the next
//! pass. The plan says why it waits: for the node to come back, or for the
//! volume to be detached (and attached elsewhere).

use super::action::{Plan, Rule};
use super::pass::Pass;
use super::volume_state::VolumeState;

/// Whether the volume's engine is out of reach; if so, the volume is
/// marked busy for this pass and the plan says why.
pub fn unreachable(pass: &mut Pass, vs: &VolumeState, plan: &mut Plan) -> bool {
    let Some(node) = vs.volume.attached_node.as_deref() else {
        return false;
    };
    let at = match vs.place {
        Some(i) => pass.attached_at(i),
        None => pass.node(node),
    };
    if at.is_some_and(|n| n.ready) {
        return false;
    }
    pass.busy.insert(vs.volume.name.clone());
    plan.block(
        vs.object(),
        Rule::Replenish,
        format!(
            "{} is attached to {node}, which is not ready: its engine cannot rebuild a replica until the node is back or the volume is detached",
            vs.volume.name
        ),
    );
    true
}
