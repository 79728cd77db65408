//! Cleanup (BEHAVIOR.md "Replenish and reuse", "Auto-balance"): which
//! replicas to delete.
//!
//! - A failed replica older than the volume's staleReplicaTimeout goes,
//!   never the last copy of data. So does, at once, a failed replica of a
//!   volume with all the rw replicas it wants, none being rebuilt, on a
//!   node that holds one of them while anti-affinity is hard: it can never
//!   be reused there, and would hold its disk space for the whole timeout.
//! - A volume with more rw replicas than it wants, and none being rebuilt,
//!   loses the extras: evicting replicas first, then replicas on pressured
//!   disks, then duplicates from the most loaded disk, node and zone; among
//!   equals the one on the fullest disk. The local replica of a volume with
//!   data locality is never a victim (locality cleanup before balance
//!   cleanup). A deletion that would make the next pass want to add a
//!   replica again is not issued when another choice exists (lesson:
//!   create/delete loops).

use std::collections::BTreeMap;

use chrono::Duration;

use super::action::{ActionKind, Plan, Rule};
use super::balance;
use super::disk_pressure;
use super::pass::Pass;
use super::view::ReplicaView;
use super::volume_state::VolumeState;

/// Deletes failed replicas past the stale timeout.
pub fn stale(pass: &mut Pass, vs: &VolumeState, plan: &mut Plan) {
    if vs.rw.is_empty() {
        return; // a failed replica may be the last copy of the data
    }
    let timeout = Duration::minutes(vs.volume.stale_replica_timeout as i64);
    // Whole, with its rw replicas pinning their nodes: a failed replica on
    // one of them is never reused (hard anti-affinity, `reuse`).
    let whole = vs.rw.len() >= vs.wanted()
        && vs.rebuilding.is_empty()
        && !pass.settings.replica_soft_anti_affinity();
    for r in &vs.failed {
        let Some(failed) = r.failed_at else { continue };
        let why = if failed + timeout <= pass.now() {
            format!(
                "replica {} of {} failed at {failed}, more than its stale timeout of {} minutes ago",
                r.name, vs.volume.name, vs.volume.stale_replica_timeout
            )
        } else if whole && vs.rw.iter().any(|o| o.node == r.node) {
            format!(
                "replica {} of {} failed at {failed} on node {}, which holds an rw replica of the volume: with {} rw it can never be reused there",
                r.name,
                vs.volume.name,
                r.node,
                vs.rw.len()
            )
        } else {
            continue;
        };
        pass.busy.insert(vs.volume.name.clone());
        pass.freed.insert((r.node.clone(), r.disk.clone()));
        plan.act(
            Rule::Cleanup,
            ActionKind::DeleteReplica {
                volume: vs.volume.name.clone(),
                replica: r.name.clone(),
            },
            why,
        );
    }
}

/// The replica data locality keeps: an rw replica on the attached node
/// that is staying (an evicted local replica is not kept). Of several, one
/// off a pressured disk: disk pressure moves a replica to another disk of
/// the same node, and the copy, not the source, is the one to keep (else
/// the move is undone and made again for ever).
fn pinned<'a>(pass: &Pass, vs: &VolumeState<'a>) -> Option<&'a ReplicaView> {
    let node = vs.local_node()?;
    vs.rw
        .iter()
        .copied()
        .filter(|r| r.node == node && !pass.evicting.contains(&r.name))
        .min_by_key(|r| (disk_pressure::pressured_for(pass, vs, r), r.name.as_str()))
}

type Key = (
    bool,
    bool,
    std::cmp::Reverse<(usize, usize, usize, u64)>,
    String,
);

/// The deletion order: smaller keys go first.
fn key(pass: &Pass, vs: &VolumeState, r: &ReplicaView, remaining: &[&ReplicaView]) -> Key {
    let mut disk = 0;
    let mut node = 0;
    let mut zone = 0;
    let z = pass.zone_of(&r.node);
    for o in remaining {
        if o.node == r.node && o.disk == r.disk {
            disk += 1;
        }
        if o.node == r.node {
            node += 1;
        }
        if pass.zone_of(&o.node) == z {
            zone += 1;
        }
    }
    let fullness = pass
        .disk(&r.node, &r.disk)
        .map(|d| d.used_percent())
        .unwrap_or(100);
    (
        !pass.evicting.contains(&r.name),
        !disk_pressure::pressured_for(pass, vs, r),
        std::cmp::Reverse((disk, node, zone, fullness)),
        r.name.clone(),
    )
}

/// Removes `k` replicas from `remaining` in deletion order, without lookahead.
fn greedy<'a>(
    pass: &Pass,
    vs: &VolumeState,
    mut remaining: Vec<&'a ReplicaView>,
    k: usize,
    keep: Option<&str>,
) -> Vec<&'a ReplicaView> {
    for _ in 0..k {
        let victim = remaining
            .iter()
            .enumerate()
            .filter(|(_, r)| Some(r.name.as_str()) != keep)
            .min_by_key(|(_, r)| key(pass, vs, r, &remaining))
            .map(|(i, _)| i);
        match victim {
            Some(i) => {
                remaining.remove(i);
            }
            None => break,
        }
    }
    remaining
}

/// Chooses `k` victims among the volume's rw replicas.
pub fn victims<'a>(pass: &Pass, vs: &VolumeState<'a>, k: usize) -> Vec<&'a ReplicaView> {
    let keep = pinned(pass, vs).map(|r| r.name.clone());
    let mut remaining: Vec<&ReplicaView> = vs.rw.clone();
    // Evicted replicas go first, whatever balance would think of it: their
    // replacements were built for exactly this.
    let mut chosen: Vec<&ReplicaView> = remaining
        .iter()
        .copied()
        .filter(|r| pass.evicting.contains(&r.name))
        .take(k)
        .collect();
    remaining.retain(|r| !chosen.iter().any(|c| c.name == r.name));
    for step in chosen.len()..k {
        let mut order: Vec<&ReplicaView> = remaining
            .iter()
            .copied()
            .filter(|r| Some(&r.name) != keep.as_ref())
            .collect();
        order.sort_by_key(|r| key(pass, vs, r, &remaining));
        let left = k - step - 1;
        let fine = |c: &&ReplicaView| {
            let rest: Vec<&ReplicaView> = remaining
                .iter()
                .copied()
                .filter(|r| r.name != c.name)
                .collect();
            let end = greedy(pass, vs, rest, left, keep.as_deref());
            let layout: Vec<&str> = end.iter().map(|r| r.node.as_str()).collect();
            let freed: Vec<&str> = vs
                .rw
                .iter()
                .filter(|r| !end.iter().any(|e| e.name == r.name))
                .map(|r| r.node.as_str())
                .collect();
            balance::moves(pass, vs, &layout, &freed).is_empty()
        };
        let Some(victim) = order
            .iter()
            .copied()
            .find(fine)
            .or_else(|| order.first().copied())
        else {
            break;
        };
        remaining.retain(|r| r.name != victim.name);
        chosen.push(victim);
    }
    chosen
}

/// Deletes a settled volume's extra rw replicas.
pub fn extras(pass: &mut Pass, vs: &VolumeState, plan: &mut Plan) {
    let wanted = vs.wanted();
    if pass.busy.contains(&vs.volume.name) || !vs.rebuilding.is_empty() || vs.rw.len() <= wanted {
        return;
    }
    let k = vs.rw.len() - wanted;
    let victims = victims(pass, vs, k);
    if victims.is_empty() {
        return;
    }
    pass.busy.insert(vs.volume.name.clone());
    let mut loads: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &vs.rw {
        *loads.entry(r.node.as_str()).or_default() += 1;
    }
    for v in victims {
        pass.freed.insert((v.node.clone(), v.disk.clone()));
        let why = if pass.evicting.contains(&v.name) {
            format!(
                "{}: replica {} on {}/{} is evicted and its replacement is rw",
                vs.volume.name, v.name, v.node, v.disk
            )
        } else if disk_pressure::pressured_for(pass, vs, v) {
            format!(
                "{}: replica {} moved off pressured disk {}/{}",
                vs.volume.name, v.name, v.node, v.disk
            )
        } else {
            format!(
                "{} has {} rw replicas and wants {wanted}: deleting {} on {}/{} ({} of its replicas on that node)",
                vs.volume.name,
                vs.rw.len(),
                v.name,
                v.node,
                v.disk,
                loads.get(v.node.as_str()).copied().unwrap_or(0)
            )
        };
        plan.act(
            Rule::Cleanup,
            ActionKind::DeleteReplica {
                volume: vs.volume.name.clone(),
                replica: v.name.clone(),
            },
            why,
        );
    }
}
