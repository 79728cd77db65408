//! What each action does to the records, as pure functions: the executor
//! applies them to the store's records around its calls to the nodes, and
//! the simulator applies them to its model's. One definition of what
//! "reused", "rebuilt" or "failed" means for a replica.

use ballast::model::{DesiredState, NodeStatus, Replica, ReplicaMode, ReplicaSpec, ReplicaStatus};
use chrono::{DateTime, Utc};

/// The record of a new replica, `mode` `wo` when it is to be filled (None:
/// an empty replica of a volume that never held data).
pub fn new_replica(
    name: &str,
    volume: &str,
    node: &str,
    disk: &str,
    mode: Option<ReplicaMode>,
) -> Replica {
    Replica {
        name: name.to_string(),
        resource_version: 0,
        spec: ReplicaSpec {
            volume: volume.to_string(),
            node_id: node.to_string(),
            disk_id: disk.to_string(),
            data_directory: format!("replicas/{name}"),
            desired_state: DesiredState::Running,
            eviction_requested: false,
            rebuild_retry_count: 0,
            failed_at: None,
            healthy_at: None,
        },
        status: ReplicaStatus {
            mode,
            ..Default::default()
        },
    }
}

/// A failed replica taken up again to be filled: one more attempt.
pub fn reuse(r: &mut Replica, mode: Option<ReplicaMode>) {
    r.spec.failed_at = None;
    r.spec.rebuild_retry_count += 1;
    r.status.mode = mode;
    r.status.running = false;
}

/// A replica filled: rw, healthy from `now`, its attempts forgotten.
pub fn rebuilt(r: &mut Replica, now: DateTime<Utc>) {
    r.status.mode = Some(ReplicaMode::Rw);
    r.status.rebuild_progress = None;
    r.spec.healthy_at = Some(now);
    r.spec.failed_at = None;
    r.spec.rebuild_retry_count = 0;
}

/// A current replica an engine was started with, at `now`: from now on it
/// may hold data that no heartbeat has reported yet (a volume written and
/// detached between two heartbeats), so it counts as having held data, and
/// one never reported takes the rw it was started as. Its engine's reports
/// correct the mode from there. Whether anything changed.
pub fn served(r: &mut Replica, now: DateTime<Utc>) -> bool {
    let changed = r.spec.healthy_at.is_none() || r.status.mode.is_none();
    r.spec.healthy_at.get_or_insert(now);
    r.status.mode.get_or_insert(ReplicaMode::Rw);
    changed
}

/// A replica that failed at `now` (an I/O error, its node lost, a failed
/// rebuild). `uncounted`: a reuse that failed only because a node could not
/// be reached, or its engine was busy, does not count as an attempt.
pub fn failed(r: &mut Replica, now: DateTime<Utc>, uncounted: bool) {
    if uncounted {
        r.spec.rebuild_retry_count = r.spec.rebuild_retry_count.saturating_sub(1);
    }
    r.status.mode = Some(ReplicaMode::Err);
    r.status.running = false;
    r.status.rebuild_progress = None;
    r.spec.failed_at = Some(now);
}

/// SetReplicaEviction; whether it changed anything.
pub fn set_eviction(r: &mut Replica, requested: bool) -> bool {
    let changed = r.spec.eviction_requested != requested;
    r.spec.eviction_requested = requested;
    changed
}

/// SetNodeStatus; whether it changed anything.
pub fn set_node_status(
    s: &mut NodeStatus,
    auto_evicting: bool,
    drain_blocked: bool,
    drain_blocked_reason: &Option<String>,
) -> bool {
    let changed = s.auto_evicting != auto_evicting
        || s.drain_blocked != drain_blocked
        || s.drain_blocked_reason != *drain_blocked_reason;
    s.auto_evicting = auto_evicting;
    s.drain_blocked = drain_blocked;
    s.drain_blocked_reason = drain_blocked_reason.clone();
    changed
}
