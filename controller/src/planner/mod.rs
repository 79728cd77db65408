//! The planner: a pure function from a snapshot of the cluster, the
//! settings and the current time to a [`Plan`] of actions, each with the
//! rule that made it and a reason. No I/O, no clock, no randomness: ties
//! break by name, so planning twice on one view gives the same plan.
//!
//! One file per rule of BEHAVIOR.md: `schedule` (where a new replica goes),
//! `replenish` and `reuse`, `balance` (zones and nodes), `disk_pressure`,
//! `locality`, `eviction`, `drain`, `cleanup`, `engine` (an attached
//! volume whose engine is out of reach waits); `growth` checks an
//! expansion against the same capacity rules as placement. `pass` holds what one pass
//! decided so far (in-pass capacity, rebuild limits), and `volume_state`
//! sorts a volume's replicas.
//!
//! Order of a pass: eviction requests first (everything after sees them);
//! then per volume, by name: stale cleanup, the engine's reach, replenish/reuse, locality,
//! balance, extra cleanup, at most one kind of change per volume per pass;
//! then disk-pressure moves; then node drain status.

pub mod action;
pub mod balance;
pub mod cleanup;
pub mod disk_pressure;
pub mod drain;
pub mod engine;
pub mod eviction;
pub mod growth;
pub mod locality;
pub mod pass;
pub mod replenish;
pub mod reuse;
pub mod schedule;
pub mod view;
pub mod volume_state;

pub use action::{Action, ActionKind, Blocked, Plan, Rule, Wait};
pub use view::{ClusterView, DiskView, NodeView, ReplicaView, VolumeView};

use ballast::settings::Settings;
use chrono::{DateTime, Utc};

use pass::Pass;
use volume_state::VolumeState;

/// Plans the next actions for the whole cluster.
pub fn plan(view: &ClusterView, settings: &Settings, now: DateTime<Utc>) -> Plan {
    let mut pass = Pass::new(view, settings, now);
    let mut plan = Plan::default();
    let auto_evicting = eviction::mark(&mut pass, &mut plan);
    for volume in &view.volumes {
        let vs = VolumeState::new(&pass, volume);
        cleanup::stale(&mut pass, &vs, &mut plan);
        if engine::unreachable(&mut pass, &vs, &mut plan) {
            continue;
        }
        if !pass.busy.contains(&volume.name) {
            replenish::plan(&mut pass, &vs, &mut plan);
        }
        locality::plan(&mut pass, &vs, &mut plan);
        cleanup::extras(&mut pass, &vs, &mut plan);
        balance::plan(&mut pass, &vs, &mut plan);
    }
    disk_pressure::plan(&mut pass, &mut plan);
    drain::plan(&pass, &mut plan, &auto_evicting);
    plan
}

/// Where a new volume's replicas would go, or why they cannot: the
/// placement the API uses to refuse a volume that cannot be placed.
pub fn place_new(
    view: &ClusterView,
    settings: &Settings,
    now: DateTime<Utc>,
    volume: &VolumeView,
) -> Result<Vec<schedule::Placement>, Vec<String>> {
    let mut pass = Pass::new(view, settings, now);
    let mut peers = Vec::new();
    let mut out = Vec::new();
    for _ in 0..volume.number_of_replicas {
        let mut req = schedule::Request::new(volume, peers.clone());
        if volume.data_locality == Some(ballast::model::DataLocality::StrictLocal) {
            req.only_node = volume.attached_node.as_deref();
        }
        let p = schedule::choose(&pass, &req)?;
        pass.reserve(&p.node, &p.disk, volume.size, false);
        peers.push(schedule::Peer {
            node: p.node.clone(),
            disk: p.disk.clone(),
        });
        out.push(p);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
