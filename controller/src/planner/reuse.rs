//! Reuse of failed replicas (BEHAVIOR.md "Replenish and reuse", seed 004):
//! whether a failed replica can be rebuilt in place now, or may become so.

use chrono::Duration;

use super::pass::Pass;
use super::view::ReplicaView;
use super::volume_state::VolumeState;

/// Wait between reuse attempts of one replica: none before the first, then
/// 1, 2, and at most 3 minutes.
pub fn backoff(retry_count: u32) -> Duration {
    Duration::seconds(i64::from(retry_count.min(3)) * 60)
}

/// Whether `r` may be rebuilt in place now; otherwise why not.
pub fn reusable(pass: &Pass, vs: &VolumeState, r: &ReplicaView) -> Result<(), String> {
    let s = pass.settings;
    let max = s.rebuild_max_retry();
    if r.rebuild_retry_count >= max {
        return Err(format!(
            "{}: {} reuse attempts, the limit is {max}",
            r.name, r.rebuild_retry_count
        ));
    }
    let node = pass
        .node(&r.node)
        .ok_or_else(|| format!("{}: node {} is gone", r.name, r.node))?;
    if !node.ready {
        return Err(format!("{}: node {} is not ready", r.name, r.node));
    }
    if !node.allow_scheduling
        || node.eviction_requested
        || (node.cordoned && s.disable_scheduling_on_cordoned_node())
    {
        return Err(format!("{}: node {} takes no replicas", r.name, r.node));
    }
    let disk = pass
        .disk(&r.node, &r.disk)
        .ok_or_else(|| format!("{}: disk {}/{} is gone", r.name, r.node, r.disk))?;
    if !disk.ready || !disk.allow_scheduling || disk.eviction_requested {
        return Err(format!(
            "{}: disk {}/{} takes no replicas",
            r.name, r.node, r.disk
        ));
    }
    // A full disk (what failed the replica, often) takes no rebuild until
    // space is freed; the volume waits for it like for a node coming back.
    if disk.available == 0 {
        return Err(format!("{}: disk {}/{} is full", r.name, r.node, r.disk));
    }
    let v = vs.volume;
    if !v.node_selector.iter().all(|t| node.tags.contains(t))
        || !v.disk_selector.iter().all(|t| disk.tags.contains(t))
        || v.pinned_node.as_ref().is_some_and(|p| *p != r.node)
    {
        return Err(format!(
            "{}: its node or disk no longer matches the volume's selectors",
            r.name
        ));
    }
    if let Some(failed) = r.failed_at {
        let until = failed + backoff(r.rebuild_retry_count);
        if pass.now() < until {
            return Err(format!("{}: in reuse backoff until {until}", r.name));
        }
    }
    // Hard anti-affinity still holds for a reused replica.
    let peers: Vec<&ReplicaView> = vs.keep(pass).collect();
    if !s.replica_soft_anti_affinity() && peers.iter().any(|p| p.node == r.node) {
        return Err(format!(
            "{}: node {} already holds a replica of {}",
            r.name, r.node, v.name
        ));
    }
    if !s.replica_zone_soft_anti_affinity()
        && peers.iter().any(|p| pass.zone_of(&p.node) == node.zone)
    {
        return Err(format!(
            "{}: zone {:?} already holds a replica of {}",
            r.name, node.zone, v.name
        ));
    }
    Ok(())
}

/// Whether `r` may still come back for reuse (so that replenishment may
/// wait for it): retries left, and its node and disk still exist.
pub fn potential(pass: &Pass, r: &ReplicaView) -> bool {
    r.rebuild_retry_count < pass.settings.rebuild_max_retry()
        && pass.disk(&r.node, &r.disk).is_some()
}
