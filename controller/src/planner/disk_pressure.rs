//! Disk pressure (BEHAVIOR.md "Disk pressure", seed 001): under
//! best-effort balance, with the percentage above 0 and node soft
//! anti-affinity on, a disk used at or above the percentage is pressured;
//! one replica at a time moves off it to another disk of the same node
//! that stays below the percentage after the move, by a local copy.
//!
//! Pace: one move per pressured disk in flight, and never two moves into
//! one disk at once. The replica moved is the first (by name) of a running,
//! healthy volume (lesson: pacing by "first by name" alone let a stopped
//! volume block every move).

use ballast::model::AutoBalance;

use super::action::{ActionKind, Plan, Rule};
use super::pass::Pass;
use super::schedule::{self, Peer, Request};
use super::view::{DiskView, ReplicaView};
use super::volume_state::VolumeState;

/// The threshold, when disk pressure applies to this volume.
pub fn threshold(pass: &Pass, vs: &VolumeState) -> Option<u64> {
    let pct = pass.settings.disk_pressure_percentage();
    (pct > 0 && vs.balance == AutoBalance::BestEffort && pass.settings.replica_soft_anti_affinity())
        .then_some(u64::from(pct))
}

/// Whether `disk` is at or past `pct` percent used (the web view marks it).
pub fn is_pressured(disk: &DiskView, pct: u64) -> bool {
    disk.used_percent() >= pct
}

/// Whether `r` sits on a disk pressured for its volume's rules.
pub fn pressured_for(pass: &Pass, vs: &VolumeState, r: &ReplicaView) -> bool {
    match (threshold(pass, vs), pass.disk(&r.node, &r.disk)) {
        (Some(pct), Some(d)) => is_pressured(d, pct),
        _ => false,
    }
}

pub fn plan(pass: &mut Pass, plan: &mut Plan) {
    let view = pass.view;
    let in_flight_from = moves_in_flight(pass);
    // Every volume's threshold is this one or none (see `threshold`): a
    // disk below it has no replica to move, and is not looked into.
    let pct = u64::from(pass.settings.disk_pressure_percentage());
    if pct == 0 || !pass.settings.replica_soft_anti_affinity() {
        return;
    }
    for node in &view.nodes {
        for disk in node.disks.iter().filter(|d| is_pressured(d, pct)) {
            let key = (node.id.clone(), disk.id.clone());
            if in_flight_from.contains(&key) || pass.freed.contains(&key) {
                continue;
            }
            relieve(pass, plan, &node.id, disk);
        }
    }
}

/// Disks a move is leaving now (a volume's replica being rebuilt on the
/// same node as one of its rw replicas on another disk); the disks
/// receiving those moves are noted in the pass.
fn moves_in_flight(pass: &mut Pass) -> std::collections::BTreeSet<(String, String)> {
    let mut in_flight_from = std::collections::BTreeSet::new();
    let mut receiving = Vec::new();
    for &k in pass.rebuilding() {
        let r = &pass.view.replicas[k as usize];
        for o in pass.replicas_with(k as usize) {
            if o.node == r.node && o.disk != r.disk && o.is_rw() {
                in_flight_from.insert((o.node.clone(), o.disk.clone()));
                receiving.push((r.node.clone(), r.disk.clone()));
            }
        }
    }
    pass.receiving.extend(receiving);
    in_flight_from
}

/// One move off `node`/`disk` if it is pressured: the first replica of a
/// running, healthy volume goes to another disk of the node; when no disk
/// can take it, the node says why.
fn relieve(pass: &mut Pass, plan: &mut Plan, node: &str, disk: &DiskView) {
    let mut tried = Vec::new();
    for r in pass.replicas_on(node, &disk.id) {
        let Some(volume) = pass.volume(&r.volume) else {
            continue;
        };
        let vs = VolumeState::new(pass, volume);
        let Some(pct) = threshold(pass, &vs) else {
            continue;
        };
        if !is_pressured(disk, pct) {
            break;
        }
        if !r.is_rw()
            || !volume.running()
            || pass.busy.contains(&volume.name)
            || vs.rw.len() != vs.wanted()
            || !vs.rebuilding.is_empty()
            || pass.evicting.contains(&r.name)
        {
            continue;
        }
        let peers = Peer::of(vs.rw.iter().copied().filter(|o| o.name != r.name));
        let mut req = Request::new(volume, peers);
        req.only_node = Some(node);
        req.not_disk = Some((node, disk.id.as_str()));
        req.below_used_percent = Some(pct);
        match candidate(pass, &req) {
            Ok(p) if pass.rebuild_slot(&p.node) => {
                let used_after = schedule::used_after(
                    pass,
                    &p.node,
                    pass.disk(&p.node, &p.disk).unwrap_or(disk),
                    volume.size,
                );
                pass.reserve(&p.node, &p.disk, volume.size, true);
                pass.receiving.insert((p.node.clone(), p.disk.clone()));
                pass.busy.insert(volume.name.clone());
                plan.act(
                    Rule::DiskPressure,
                    ActionKind::CreateReplica {
                        volume: volume.name.clone(),
                        node: p.node.clone(),
                        disk: p.disk.clone(),
                        reuse: None,
                        copy_from: Some(r.name.clone()),
                        size: volume.size,
                    },
                    format!(
                        "{node}/{} is {}% used (threshold {pct}%): moving replica {} of {} to {}/{} ({used_after}% used after), by local copy",
                        disk.id,
                        disk.used_percent(),
                        r.name,
                        volume.name,
                        p.node,
                        p.disk
                    ),
                );
                return;
            }
            Ok(p) => tried.push(format!("rebuild limit reached on {}", p.node)),
            Err(reasons) => tried.extend(reasons),
        }
        // One candidate replica is enough to know no disk fits.
        break;
    }
    if !tried.is_empty() {
        tried.dedup();
        plan.block(
            format!("node/{node}"),
            Rule::DiskPressure,
            format!(
                "{node}/{} is pressured ({}% used) but no other disk of the node can take a replica: {}",
                disk.id,
                disk.used_percent(),
                tried.join("; ")
            ),
        );
    }
}

/// A target disk on the same node that is not receiving another move.
fn candidate(pass: &Pass, req: &Request) -> Result<schedule::Placement, Vec<String>> {
    let mut reasons = Vec::new();
    let node = req.only_node.unwrap_or_default();
    let Some(n) = pass.node(node) else {
        return Err(vec![format!("{node}: gone")]);
    };
    // Try disks one at a time, skipping those already receiving a move.
    for d in &n.disks {
        if req.not_disk == Some((node, d.id.as_str())) {
            continue;
        }
        if pass.receiving.contains(&(node.to_string(), d.id.clone())) {
            reasons.push(format!("{node}/{}: already receiving a move", d.id));
            continue;
        }
    }
    let mut sub = Request::new(req.volume, req.peers.clone());
    sub.only_node = req.only_node;
    sub.below_used_percent = req.below_used_percent;
    sub.not_disk = req.not_disk;
    sub.skip_disks = pass
        .receiving
        .iter()
        .filter(|(n, _)| n == node)
        .map(|(_, d)| d.clone())
        .collect();
    schedule::choose(pass, &sub).map_err(|mut r| {
        reasons.append(&mut r);
        reasons
    })
}
