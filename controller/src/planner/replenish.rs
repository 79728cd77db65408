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

/// A healthy replica on `node` to copy from locally, if there is one.
pub fn local_source(vs: &VolumeState, node: &str) -> Option<String> {
    vs.rw
        .iter()
        .find(|r| r.node == node)
        .map(|r| r.name.clone())
}

pub fn plan(pass: &mut Pass, vs: &VolumeState, plan: &mut Plan) {
    let keep: Vec<&ReplicaView> = vs.keep(pass).collect();
    let wanted = vs.wanted();
    if keep.len() >= wanted {
        return;
    }
    let name = &vs.volume.name;
    let object = vs.object();
    // Slots missing because replicas are gone (may wait), and slots of
    // replicas leaving by eviction (never wait).
    let degraded = wanted.saturating_sub(vs.usable().count());
    let mut evict_slots = wanted - keep.len() - degraded;
    let mut degraded_slots = degraded;
    if !vs.is_new && vs.rw.is_empty() {
        plan.block(
            object,
            Rule::Replenish,
            format!("{name} has no healthy replica to rebuild from"),
        );
        return;
    }
    if !vs.is_new && pass.settings.concurrent_rebuild_per_node_limit() == 0 {
        plan.block(
            object,
            Rule::Replenish,
            "concurrent-replica-rebuild-per-node-limit is 0: rebuilds are stopped",
        );
        return;
    }
    pass.busy.insert(name.clone());

    // 1. Reuse failed replicas that can be rebuilt in place.
    let mut failed: Vec<&ReplicaView> = vs.failed.clone();
    failed.sort_by(|a, b| (a.rebuild_retry_count, &a.name).cmp(&(b.rebuild_retry_count, &b.name)));
    let mut not_reusable = Vec::new();
    for r in &failed {
        if degraded_slots + evict_slots == 0 {
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
                if degraded_slots > 0 {
                    degraded_slots -= 1;
                } else {
                    evict_slots -= 1;
                }
            }
            Ok(()) => not_reusable.push(format!("{}: rebuild limit reached on {}", r.name, r.node)),
            Err(why) => not_reusable.push(why),
        }
    }

    // 2. Wait for a failed replica that may come back.
    if degraded_slots > 0 && !vs.is_new {
        let interval = Duration::seconds(pass.settings.replenishment_wait_interval_secs() as i64);
        let waiting_for = vs.failed.iter().find(|r| reuse::potential(pass, r));
        if let (Some(r), Some(since)) = (waiting_for, vs.volume.last_degraded_at) {
            let until = since + interval;
            if pass.now < until {
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
                degraded_slots = 0;
            }
        }
    }

    // 3. Schedule new replicas.
    let mut peers = Peer::of(keep);
    let only_node = match (vs.locality, vs.volume.attached_node.as_deref()) {
        (DataLocality::StrictLocal, Some(n)) => Some(n),
        _ => None,
    };
    for slot in 0..degraded_slots + evict_slots {
        let eviction = slot >= degraded_slots;
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
                plan.act(
                    rule,
                    ActionKind::CreateReplica {
                        volume: name.clone(),
                        node: p.node.clone(),
                        disk: p.disk.clone(),
                        reuse: None,
                        copy_from: local_source(vs, &p.node),
                        size: vs.volume.size,
                    },
                    why,
                );
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
