//! Data locality (BEHAVIOR.md "Data locality", seed 003).
//!
//! - best-effort: a volume attached to a node that holds none of its
//!   replicas gets one there (node anti-affinity ignored for it); cleanup
//!   deletes one elsewhere once it is rw. If it cannot be placed the volume
//!   keeps working and the reason is shown.
//! - strict-local: one replica, on the node the pod runs on; it is placed
//!   there and never moves, so a mismatch is only reported.

use ballast::model::DataLocality;

use super::action::{Plan, Rule};
use super::pass::Pass;
use super::schedule::{self, Peer, Request};
use super::volume_state::VolumeState;

pub fn plan(pass: &mut Pass, vs: &VolumeState, plan: &mut Plan) {
    let Some(node) = vs.volume.attached_node.as_deref() else {
        return;
    };
    if vs.locality == DataLocality::Disabled
        || pass.busy.contains(&vs.volume.name)
        || vs.rw.len() < vs.wanted()
        || !vs.rebuilding.is_empty()
    {
        return;
    }
    if vs.keep(pass).any(|r| r.node == node) {
        return;
    }
    let name = &vs.volume.name;
    if vs.locality == DataLocality::StrictLocal {
        let elsewhere: Vec<&str> = vs.rw.iter().map(|r| r.node.as_str()).collect();
        plan.block(
            vs.object(),
            Rule::Locality,
            format!("{name} is strict-local and attached to {node}, but its replica is on {}; strict-local data does not move", elsewhere.join(", ")),
        );
        return;
    }
    let mut req = Request::new(vs.volume, Peer::of(vs.keep(pass)));
    req.only_node = Some(node);
    req.ignore_node_anti_affinity = true;
    // Nor a locality move: the pressure rule would move it off again.
    req.below_used_percent = super::disk_pressure::threshold(pass, vs);
    match schedule::choose(pass, &req) {
        Ok(p) if pass.rebuild_slot(&p.node) => {
            pass.busy.insert(name.clone());
            pass.reserve(&p.node, &p.disk, vs.volume.size, true);
            plan.act(
                Rule::Locality,
                // The node holds none: nothing to copy locally from.
                super::replenish::new_replica(vs, &p.node, &p.disk),
                format!(
                    "{name} is attached to {node}, which holds none of its replicas (data-locality best-effort): building one on {}/{}; one elsewhere is deleted once it is rw",
                    p.node, p.disk
                ),
            );
            plan.event(
                Rule::Locality,
                vs.object(),
                "LocalReplicaCreated",
                format!("building a local replica of {name} on {}/{}", p.node, p.disk),
            );
        }
        Ok(p) => plan.block(vs.object(), Rule::Locality, format!("{name}: local replica waits for a rebuild slot on {}", p.node)),
        Err(reasons) => plan.block(
            vs.object(),
            Rule::Locality,
            format!("{name} has no local replica on {node} and none can be placed there (the volume keeps working): {}", reasons.join("; ")),
        ),
    }
}
