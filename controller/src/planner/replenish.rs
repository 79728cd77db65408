//! Replenish (BEHAVIOR.md "Replenish and reuse", seed 004): a volume with
//! fewer staying replicas than it wants gets them back. For each missing
//! replica: reuse a reusable failed one; else, when a failed one may come
//! back and the wait interval since the volume degraded has not passed,
//! wait; else schedule a new one. New volumes and eviction never wait.

use ballast::model::DataLocality;
use chrono::Duration;

use super::action::{ActionKind, Plan, Rule, Wait};
use super::pass::Pass;
use super::reuse;
use super::schedule::{self, Peer, Request};
use super::view::ReplicaView;
use super::volume_state::VolumeState;

/// A new replica of the volume on the placement's node and disk, copied
/// locally from a healthy replica there when there is one.
pub fn new_replica(vs: &VolumeState, node: &str, disk: &str) -> ActionKind {
    ActionKind::CreateReplica {
        volume: vs.volume.name.clone(),
        node: node.to_string(),
        disk: disk.to_string(),
        reuse: None,
        copy_from: local_source(vs, node),
        size: vs.volume.size,
    }
}

/// A healthy replica on `node` to copy from locally, if there is one.
pub fn local_source(vs: &VolumeState, node: &str) -> Option<String> {
    vs.rw
        .iter()
        .find(|r| r.node == node)
        .map(|r| r.name.clone())
}

/// Replicas missing: because replicas are gone (these may wait for one to
/// come back), and because replicas are leaving by eviction (never wait).
struct Slots {
    degraded: usize,
    evict: usize,
}

impl Slots {
    fn total(&self) -> usize {
        self.degraded + self.evict
    }

    /// One slot filled, a degraded one first.
    fn fill_one(&mut self) {
        if self.degraded > 0 {
            self.degraded -= 1;
        } else {
            self.evict = self.evict.saturating_sub(1);
        }
    }
}

pub fn plan(pass: &mut Pass, vs: &VolumeState, plan: &mut Plan) {
    let wanted = vs.wanted();
    if vs.keep(pass).count() >= wanted {
        return;
    }
    let keep: Vec<&ReplicaView> = vs.keep(pass).collect();
    let degraded = wanted.saturating_sub(vs.usable().count());
    let mut slots = Slots {
        degraded,
        evict: wanted - keep.len() - degraded,
    };
    if blocked(pass, vs, plan) {
        return;
    }
    pass.busy.insert(vs.volume.name.clone());
    let not_reusable = reuse_failed(pass, vs, plan, &mut slots);
    wait_for_a_return(pass, vs, plan, &mut slots, &not_reusable);
    schedule_new(pass, vs, keep, plan, slots);
}

/// Nothing can be rebuilt: no healthy source, or rebuilds stopped.
fn blocked(pass: &Pass, vs: &VolumeState, plan: &mut Plan) -> bool {
    let why = if !vs.is_new && vs.rw.is_empty() {
        format!("{} has no healthy replica to rebuild from", vs.volume.name)
    } else if !vs.is_new && pass.settings.concurrent_rebuild_per_node_limit() == 0 {
        "concurrent-replica-rebuild-per-node-limit is 0: rebuilds are stopped".to_string()
    } else {
        return false;
    };
    plan.block(vs.object(), Rule::Replenish, why);
    true
}

/// Step 1: reuse failed replicas that can be rebuilt in place, fewest
/// attempts first. Returns why the others cannot be.
fn reuse_failed(
    pass: &mut Pass,
    vs: &VolumeState,
    plan: &mut Plan,
    slots: &mut Slots,
) -> Vec<String> {
    let name = &vs.volume.name;
    let mut failed: Vec<&ReplicaView> = vs.failed.clone();
    failed.sort_by(|a, b| (a.rebuild_retry_count, &a.name).cmp(&(b.rebuild_retry_count, &b.name)));
    let mut not_reusable = Vec::new();
    for r in &failed {
        if slots.total() == 0 {
            break;
        }
        match reuse::reusable(pass, vs, r) {
            Ok(()) if pass.rebuild_slot(&r.node) => {
                pass.reserve(&r.node, &r.disk, 0, true);
                plan.act(
                    Rule::Reuse,
                    ActionKind::CreateReplica {
                        volume: name.clone(),
                        node: r.node.clone(),
                        disk: r.disk.clone(),
                        reuse: Some(r.name.clone()),
                        copy_from: local_source(vs, &r.node),
                        size: vs.volume.size,
                    },
                    format!(
                        "{name} is missing a replica: reusing failed replica {} on {}/{} (attempt {} of {}); only the layers it lacks are copied",
                        r.name,
                        r.node,
                        r.disk,
                        r.rebuild_retry_count + 1,
                        pass.settings.rebuild_max_retry()
                    ),
                );
                slots.fill_one();
            }
            Ok(()) => not_reusable.push(format!("{}: rebuild limit reached on {}", r.name, r.node)),
            Err(why) => not_reusable.push(why),
        }
    }
    not_reusable
}

/// Step 2: wait, within the interval since the volume degraded, for a
/// failed replica that may come back.
fn wait_for_a_return(
    pass: &Pass,
    vs: &VolumeState,
    plan: &mut Plan,
    slots: &mut Slots,
    not_reusable: &[String],
) {
    if slots.degraded == 0 || vs.is_new {
        return;
    }
    let name = &vs.volume.name;
    let interval = Duration::seconds(pass.settings.replenishment_wait_interval_secs() as i64);
    let waiting_for = vs.failed.iter().find(|r| reuse::potential(pass, r));
    if let (Some(r), Some(since)) = (waiting_for, vs.volume.last_degraded_at) {
        let until = since + interval;
        if pass.now() < until {
            plan.waits.push(Wait {
                volume: name.clone(),
                rule: Rule::Replenish,
                what: format!(
                    "failed replica {} may come back for reuse ({})",
                    r.name,
                    not_reusable.first().cloned().unwrap_or_default()
                ),
                until,
            });
            slots.degraded = 0;
        }
    }
}

/// Step 3: schedule new replicas for the slots left, each seeing the ones
/// placed before it.
fn schedule_new(
    pass: &mut Pass,
    vs: &VolumeState,
    keep: Vec<&ReplicaView>,
    plan: &mut Plan,
    slots: Slots,
) {
    let name = &vs.volume.name;
    let wanted = vs.wanted();
    let mut peers = Peer::of(keep);
    let only_node = match (vs.locality, vs.volume.attached_node.as_deref()) {
        (DataLocality::StrictLocal, Some(n)) => Some(n),
        _ => None,
    };
    for slot in 0..slots.total() {
        let eviction = slot >= slots.degraded;
        let mut req = Request::new(vs.volume, peers.clone());
        req.only_node = only_node;
        match schedule::choose(pass, &req) {
            Ok(p) => {
                if !vs.is_new && !pass.rebuild_slot(&p.node) {
                    plan.block(
                        vs.object(),
                        Rule::Replenish,
                        format!(
                            "{}: {} rebuilds already running, the limit",
                            p.node,
                            pass.rebuilds_on(&p.node)
                        ),
                    );
                    break;
                }
                pass.reserve(&p.node, &p.disk, vs.volume.size, !vs.is_new);
                let (rule, why) = if vs.is_new {
                    (
                        Rule::Schedule,
                        format!(
                            "{name} wants {wanted} replicas: placing one on {}/{}",
                            p.node, p.disk
                        ),
                    )
                } else if eviction {
                    (
                        Rule::Eviction,
                        format!(
                            "{name}: replacing an evicted replica on {}/{}",
                            p.node, p.disk
                        ),
                    )
                } else {
                    (
                        Rule::Replenish,
                        format!(
                            "{name} is degraded: rebuilding a replica on {}/{}",
                            p.node, p.disk
                        ),
                    )
                };
                plan.act(rule, new_replica(vs, &p.node, &p.disk), why);
                // Later slots see this one for anti-affinity.
                peers.push(Peer {
                    node: p.node,
                    disk: p.disk,
                });
            }
            Err(reasons) => {
                plan.block(
                    vs.object(),
                    if vs.is_new {
                        Rule::Schedule
                    } else {
                        Rule::Replenish
                    },
                    format!("{name}: no place for a replica: {}", reasons.join("; ")),
                );
                break;
            }
        }
    }
}
