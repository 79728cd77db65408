//! Merging: each replica's frozen layers that no snapshot needs are folded
//! into their neighbours on its node, so that a chain holds its volume's
//! snapshots and at most two more layers however often it was rebuilt.
//! One replica per node at a time (`Context::merging`), at
//! `layer-merge-rate`, round robin over the node's replicas; a deleted
//! snapshot's replicas go first, each as soon as its node is free. A
//! replica lent to its engine (on the attached volume's own node) is
//! merged by that engine, between its I/O.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ballast::model::{Node, Replica, ReplicaMode, Snapshot, Volume};
use ballast::proto::agent::v1::{MergeReplicaRequest, MergeReplicaResponse};

use crate::agents::{MERGE_TIMEOUT, long_call};
use crate::context::Context;
use crate::error::Error;
use crate::mirror::Mirror;

/// The last replica the merge pass merged on each node.
#[derive(Default)]
pub struct Merges {
    last: Mutex<HashMap<String, String>>,
}

/// Runs the merges until the task is dropped, looking every `tick`.
pub async fn run_merge(ctx: Arc<Context>, tick: Duration) {
    let merges = Merges::default();
    loop {
        tokio::time::sleep(tick).await;
        if let Err(e) = start_next(&ctx, &merges).await {
            tracing::warn!(error = %e, "merge pass failed");
        }
    }
}

/// Volumes whose replicas are copied from now: one of them is rebuilt, or
/// a new volume is filled from them. A merge would change the chain a copy
/// reads (the copy would fail its checksum and start again), so they wait.
fn copied_from<'a>(
    replicas: impl Iterator<Item = &'a Replica>,
    volumes: impl Iterator<Item = &'a Volume>,
    snapshots: &[Snapshot],
) -> HashSet<String> {
    let rebuilding = replicas
        .filter(|r| r.status.mode == Some(ReplicaMode::Wo) || r.status.rebuild_progress.is_some())
        .map(|r| r.spec.volume.clone());
    let sources = volumes
        .filter(|v| v.status.state == ballast::model::VolumeState::Creating)
        .filter_map(|v| v.spec.source.as_ref())
        .filter_map(|s| {
            let of_snapshot = s.snapshot.as_ref().and_then(|id| {
                snapshots
                    .iter()
                    .find(|x| &x.name == id)
                    .map(|x| x.spec.volume.clone())
            });
            s.volume.clone().or(of_snapshot)
        });
    rebuilding.chain(sources).collect()
}

/// Chooses with `f` from the controller's copy of the records (brought
/// up to date first, so a pass does not decode the whole store) and the
/// volumes copied from now. `f` runs with the copy held: it chooses, and
/// whatever calls a node comes after.
async fn choose<T>(
    ctx: &Context,
    f: impl FnOnce(&Mirror, &HashSet<String>) -> T,
) -> Result<T, Error> {
    let snapshots: Vec<Snapshot> = ctx.store.list().await?;
    let mirror = ctx.records().await?;
    let busy = copied_from(mirror.replicas(), mirror.volumes(), &snapshots);
    Ok(f(&mirror, &busy))
}

/// Whether `r` can be merged now: not failed or being rebuilt, and its
/// volume not copied from.
fn mergeable(r: &Replica, mirror: &Mirror, busy: &HashSet<String>) -> bool {
    mirror.volume(&r.spec.volume).is_some()
        && !matches!(r.status.mode, Some(ReplicaMode::Err | ReplicaMode::Wo))
        && !busy.contains(&r.spec.volume)
}

/// Starts, on each ready node not merging already, the merge of its next
/// replica after the last one merged.
async fn start_next(ctx: &Arc<Context>, merges: &Merges) -> Result<(), Error> {
    let chosen = choose(ctx, |mirror, busy| {
        let by_node = super::by_node(mirror.replicas());
        let mut chosen = Vec::new();
        let free = mirror
            .nodes()
            .filter(|n| n.status.ready && !ctx.merging.is_held(&n.id));
        for node in free {
            // A volume a call holds (being deleted, attached, ...) waits.
            let mut mine: Vec<&Replica> = by_node
                .get(node.id.as_str())
                .into_iter()
                .flatten()
                .copied()
                .filter(|r| mergeable(r, mirror, busy))
                .filter(|r| !ctx.volume_busy(&r.spec.volume))
                .collect();
            mine.sort_by(|a, b| a.name.cmp(&b.name));
            let last = merges
                .last
                .lock()
                .ok()
                .and_then(|l| l.get(&node.id).cloned())
                .unwrap_or_default();
            let Some(r) = mine.iter().find(|r| r.name > last).or_else(|| mine.first()) else {
                continue;
            };
            if let Ok(mut l) = merges.last.lock() {
                l.insert(node.id.clone(), r.name.clone());
            }
            chosen.push((node.clone(), (*r).clone()));
        }
        chosen
    })
    .await?;
    for (node, r) in chosen {
        spawn_merge(ctx, node, r);
    }
    Ok(())
}

/// Merges `r` on `node` in a task of its own, unless the node merges
/// already.
fn spawn_merge(ctx: &Arc<Context>, node: Node, r: Replica) {
    let Some(merging) = ctx.merging.try_take(&node.id) else {
        return;
    };
    let ctx = ctx.clone();
    tokio::spawn(async move {
        match merge(&ctx, &node, &r).await {
            Ok(done) if done.merged > 0 => {
                tracing::info!(replica = %r.name, merged = done.merged, freed = done.allocated_before.saturating_sub(done.allocated_after), "layers merged");
            }
            Ok(_) | Err(Error::Conflict(_)) => {}
            Err(e) => tracing::warn!(replica = %r.name, error = %e, "merge failed"),
        }
        drop(merging);
    });
}

/// Merges one replica now: its volume's snapshots are the labels it keeps.
#[tracing::instrument(skip_all, fields(replica = %r.name, node = %node.id))]
pub async fn merge(ctx: &Context, node: &Node, r: &Replica) -> Result<MergeReplicaResponse, Error> {
    let keep: Vec<String> = ctx
        .store
        .list::<Snapshot>()
        .await?
        .into_iter()
        .filter(|s| s.spec.volume == r.spec.volume)
        .map(|s| s.name)
        .collect();
    let rate = ctx.settings().await?.merge_rate_bytes();
    // A merge copies data at its pace, and its call lasts as long: bounded
    // by MERGE_TIMEOUT, not by the channel's call timeout (which cut it at
    // 10 s while the node went on merging).
    let request = MergeReplicaRequest {
        name: r.name.clone(),
        keep,
        bytes_per_second: rate,
    };
    let merged = long_call(node, &ctx.member, MERGE_TIMEOUT, |mut c| async move {
        c.merge_replica(request).await
    })
    .await;
    match merged {
        // A block failed its checksum as it was merged (marked on the
        // node, the merge ended): the replica is failed, as by a scrub.
        Err(Error::DataLoss(why)) => {
            super::actions::fail_corrupt(ctx, &r.spec.volume, &r.name, &why).await?;
            Err(Error::DataLoss(why))
        }
        merged => merged,
    }
}

/// Merges every replica of `volume` that can be now (after one of its
/// snapshots was deleted), one after another, each once its node is done
/// with the merge it runs (the merge pass's, or another volume's).
pub async fn merge_volume(ctx: &Context, volume: &str) -> Result<(), Error> {
    let replicas: Vec<Replica> = choose(ctx, |mirror, busy| {
        mirror
            .replicas()
            .filter(|r| r.spec.volume == volume && mergeable(r, mirror, busy))
            .cloned()
            .collect()
    })
    .await?;
    for r in &replicas {
        let node: Node = ctx.store.fetch(&r.spec.node_id).await?;
        if !node.status.ready {
            continue;
        }
        let Some(_merging) = ctx.merging.take_within(&node.id, MERGE_TIMEOUT).await else {
            return Err(Error::Unavailable(format!(
                "node {}: merging something else for over {}s",
                node.id,
                MERGE_TIMEOUT.as_secs()
            )));
        };
        merge(ctx, &node, r).await?;
    }
    Ok(())
}
