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
    run(view, settings, now, None)
}

/// The same plan as [`plan`], reusing what the last pass with `memo`
/// learned: a volume whose last plan was nothing, and read nothing but
/// its own volume and replicas, the nodes and the settings, is skipped
/// while all of those are as they were. Everything else is planned as in
/// a full pass, in the same order, so the plan is the same (the property
/// test `planner_incremental` checks it on random clusters and changes).
pub fn plan_incremental(
    view: &ClusterView,
    settings: &Settings,
    now: DateTime<Utc>,
    memo: &mut Memo,
) -> Plan {
    run(view, settings, now, Some(memo))
}

/// What incremental planning remembers between passes: the nodes and
/// settings it planned with, and the volumes that were settled then (each
/// with its volume and replicas as they were).
#[derive(Debug, Default)]
pub struct Memo {
    nodes: Vec<NodeView>,
    settings: Option<Settings>,
    settled: rustc_hash::FxHashMap<String, (VolumeView, Vec<ReplicaView>)>,
}

impl Memo {
    /// How many volumes the next pass may skip.
    pub fn settled(&self) -> usize {
        self.settled.len()
    }

    fn unchanged(&self, volume: &VolumeView, replicas: &[&ReplicaView]) -> bool {
        self.settled.get(&volume.name).is_some_and(|(v, rs)| {
            v == volume
                && rs.len() == replicas.len()
                && rs.iter().zip(replicas).all(|(a, b)| a == *b)
        })
    }
}

fn run(
    view: &ClusterView,
    settings: &Settings,
    now: DateTime<Utc>,
    mut memo: Option<&mut Memo>,
) -> Plan {
    let mut pass = Pass::new(view, settings, now);
    let mut plan = Plan::default();
    let auto_evicting = eviction::mark(&mut pass, &mut plan);
    if let Some(m) = memo.as_deref_mut()
        && (m.settings.as_ref() != Some(settings) || m.nodes != view.nodes)
    {
        m.settled.clear();
        m.nodes = view.nodes.clone();
        m.settings = Some(settings.clone());
    }
    for (i, volume) in view.volumes.iter().enumerate() {
        if memo
            .as_deref()
            .is_some_and(|m| m.unchanged(volume, pass.replicas_at(i)))
        {
            continue;
        }
        let before = plan.len();
        pass.read_shared.set(false);
        plan_volume(&mut pass, i, &mut plan);
        if let Some(m) = memo.as_deref_mut() {
            let settled = plan.len() == before
                && !pass.read_shared.get()
                && !pass.busy.contains(&volume.name);
            if settled {
                let replicas = pass.replicas_at(i).iter().map(|r| (*r).clone()).collect();
                m.settled
                    .insert(volume.name.clone(), (volume.clone(), replicas));
            } else {
                m.settled.remove(&volume.name);
            }
        }
    }
    if let Some(m) = memo {
        m.settled.retain(|name, _| pass.volume(name).is_some());
    }
    disk_pressure::plan(&mut pass, &mut plan);
    drain::plan(&pass, &mut plan, &auto_evicting);
    plan
}

/// The rules of one volume, in their order.
fn plan_volume(pass: &mut Pass, i: usize, plan: &mut Plan) {
    let vs = VolumeState::at(pass, i);
    cleanup::stale(pass, &vs, plan);
    if engine::unreachable(pass, &vs, plan) {
        return;
    }
    if !pass.busy.contains(&vs.volume.name) {
        replenish::plan(pass, &vs, plan);
    }
    locality::plan(pass, &vs, plan);
    cleanup::extras(pass, &vs, plan);
    balance::plan(pass, &vs, plan);
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
