//! Who may serve: the record of which replicas hold a volume's latest
//! acknowledged data (`status.currentReplicas`), and its generation
//! (`status.generation`).
//!
//! - A new volume's replicas are all current (generation 1).
//! - A running engine changes the record (`record`, from the agent
//!   protocol's `RecordReplicaSet`) before it acknowledges a write that a
//!   replica it dropped lacks, and after a rebuilt replica caught up; a
//!   compare-and-set on the generation fences a stale engine.
//! - An engine is started only with current replicas (`serving`); when
//!   none is reachable the volume is faulted and the attach is refused,
//!   naming where the latest data is.
//! - A replica finished offline (detached volume) joins the record
//!   (`add_current`); a deleted one leaves it (`remove_current`).
//! - `salvage` makes one replica the whole record: an operator's explicit,
//!   logged acceptance of data loss.
//!
//! It decides nothing about placement and calls no node.

use std::sync::Arc;

use ballast::model::{Kind, Node, Replica, ReplicaMode, Robustness, Volume};

use crate::context::Context;
use crate::error::Error;

/// The replicas that hold the latest data: the record, or, for a volume
/// from before the record existed (generation 0), every replica.
pub fn current<'a>(volume: &Volume, replicas: &'a [Replica]) -> Vec<&'a Replica> {
    replicas
        .iter()
        .filter(|r| {
            r.spec.volume == volume.name
                && (volume.status.generation == 0
                    || volume.status.current_replicas.contains(&r.name))
        })
        .collect()
}

/// Records what an engine reports as its set of replicas holding the
/// latest data. Refused (FAILED_PRECONDITION) when the engine's generation
/// is not the store's or the volume is not attached at its node.
#[tracing::instrument(skip_all, fields(volume = %volume, node = %node, generation))]
pub async fn record(
    ctx: &Context,
    volume: &str,
    node: &str,
    generation: u64,
    replicas: &[String],
    reason: &str,
) -> Result<u64, Error> {
    if replicas.is_empty() {
        return Err(Error::invalid(
            "replicas",
            "a replica set that holds the data is never empty",
        ));
    }
    let known: Vec<Replica> = ctx.store.list().await?;
    if let Some(stranger) = replicas.iter().find(|n| {
        !known
            .iter()
            .any(|r| &r.name == *n && r.spec.volume == volume)
    }) {
        return Err(Error::invalid(
            "replicas",
            format!("{stranger} is not a replica of volume {volume}"),
        ));
    }
    let mut set: Vec<String> = replicas.to_vec();
    set.sort();
    set.dedup();
    let before = ctx
        .store
        .fetch::<Volume>(volume)
        .await?
        .status
        .current_replicas;
    let v = ctx.store.modify::<Volume, Error>(volume, |v| {
        if v.status.attached_node.as_deref() != Some(node) {
            return Err(Error::Unprocessable(format!(
                "volume {volume} is not attached at {node}: this engine is stale"
            )));
        }
        if v.status.generation != generation {
            return Err(Error::Unprocessable(format!(
                "volume {volume}'s replica set is at generation {}, not {generation}: this engine is stale",
                v.status.generation
            )));
        }
        // A replica dropped: the volume degraded now (the replenish wait
        // counts from here), unless it already was.
        let dropped = v.status.current_replicas.iter().any(|r| !set.contains(r));
        if dropped && v.status.robustness == Robustness::Healthy {
            v.status.last_degraded_at = Some(ctx.now());
        }
        v.status.generation += 1;
        v.status.current_replicas = set.clone();
        Ok(true)
    }).await?;
    tracing::info!(generation = v.status.generation, replicas = ?set, reason, "replica set recorded");
    announce(ctx, volume, v.status.generation, &before, &set, reason).await;
    Ok(v.status.generation)
}

/// A new record: the replicas that left it are failed, and an event says
/// who holds the latest data now, who did before, and why.
async fn announce(
    ctx: &Context,
    volume: &str,
    generation: u64,
    before: &[String],
    set: &[String],
    reason: &str,
) {
    mark_left(ctx, before, set).await;
    let was = if before.is_empty() {
        "not recorded".to_string()
    } else {
        before.join(", ")
    };
    let why = if reason.is_empty() {
        String::new()
    } else {
        format!("; {reason}")
    };
    ctx.event(
        Kind::Volume,
        volume,
        "ReplicaSetChanged",
        format!(
            "generation {generation}: {} hold the latest data (was {was}){why}",
            set.join(", ")
        ),
    )
    .await;
}

/// Replicas that left the record hold older data: failed, from now on,
/// whatever their last report said.
async fn mark_left(ctx: &Context, before: &[String], after: &[String]) {
    let now = ctx.now();
    for name in before.iter().filter(|n| !after.contains(n)) {
        let _ = ctx
            .store
            .modify::<Replica, Error>(name, |r| {
                if r.status.mode != Some(ReplicaMode::Rw) {
                    return Ok(false);
                }
                r.status.mode = Some(ReplicaMode::Err);
                r.status.running = false;
                r.spec.failed_at.get_or_insert(now);
                Ok(true)
            })
            .await;
    }
}

/// Whether `replica` may serve `volume`'s data: it is in the record (or
/// nothing is recorded yet).
pub fn is_current(volume: &Volume, replica: &str) -> bool {
    volume.status.generation == 0 || volume.status.current_replicas.iter().any(|r| r == replica)
}

/// What an engine is started with: the current replicas it can reach
/// (`NAME@ADDR`), and the record as the store has it.
pub struct Serving {
    pub replicas: Vec<String>,
    pub generation: u64,
    pub current: Vec<String>,
    /// "NAME on NODE" of each current replica, for messages.
    pub holders: Vec<String>,
}

/// Marks the volume faulted, records why, and returns the refusal.
pub async fn fault(ctx: &Context, volume: &str, why: String) -> Error {
    let _ = ctx
        .store
        .modify::<Volume, Error>(volume, |v| {
            let changed = v.status.robustness != Robustness::Faulted;
            v.status.robustness = Robustness::Faulted;
            Ok(changed)
        })
        .await;
    ctx.event(Kind::Volume, volume, "VolumeFaulted", why.clone())
        .await;
    Error::Unprocessable(why)
}

/// The replicas an engine of `volume` may serve from: the current ones on
/// ready nodes. When there is none, the volume is marked faulted and the
/// error names where the latest data is.
pub async fn serving(ctx: &Context, volume: &Volume) -> Result<Serving, Error> {
    let replicas: Vec<Replica> = ctx.store.list().await?;
    let nodes: Vec<Node> = ctx.store.list().await?;
    let current = current(volume, &replicas);
    let mut reachable = Vec::new();
    let mut away = Vec::new();
    for r in &current {
        match nodes.iter().find(|n| n.id == r.spec.node_id) {
            Some(n) if n.status.ready && !n.status.replica_endpoint.is_empty() => {
                reachable.push(format!("{}@{}", r.name, n.status.replica_endpoint));
            }
            Some(_) => away.push(format!("{} on {} (not ready)", r.name, r.spec.node_id)),
            None => away.push(format!("{} on {} (unknown node)", r.name, r.spec.node_id)),
        }
    }
    if reachable.is_empty() {
        let name = volume.name.clone();
        let why = if away.is_empty() {
            format!("no replica of {name} holds its latest data")
        } else {
            format!(
                "no replica that holds the latest data of {name} is reachable: {}. \
                 Bring one back, or accept losing what only it holds with \
                 `ballastctl volume salvage {name} --replica NAME`",
                away.join(", ")
            )
        };
        return Err(fault(ctx, &name, why).await);
    }
    Ok(Serving {
        replicas: reachable,
        generation: volume.status.generation,
        current: current.iter().map(|r| r.name.clone()).collect(),
        holders: current
            .iter()
            .map(|r| format!("{} on {}", r.name, r.spec.node_id))
            .collect(),
    })
}

/// The record of a new volume: every replica, generation 1.
pub fn initial(volume: &mut Volume, replicas: &[Replica]) {
    volume.status.generation = 1;
    volume.status.current_replicas = replicas.iter().map(|r| r.name.clone()).collect();
    volume.status.current_replicas.sort();
}

/// Adds a replica that now holds the latest data of a detached volume
/// (an offline rebuild from a current source finished).
pub async fn add_current(
    ctx: &Context,
    volume: &str,
    replica: &str,
    reason: &str,
) -> Result<(), Error> {
    change(ctx, volume, reason, |set| {
        if set.iter().any(|r| r == replica) {
            return false;
        }
        set.push(replica.to_string());
        true
    })
    .await
}

/// Takes a deleted replica out of the record (never the last one).
pub async fn remove_current(ctx: &Context, volume: &str, replica: &str) -> Result<(), Error> {
    change(ctx, volume, &format!("{replica} deleted"), |set| match set
        .iter()
        .position(|r| r == replica)
    {
        Some(i) if set.len() > 1 => {
            set.remove(i);
            true
        }
        _ => false,
    })
    .await
}

async fn change(
    ctx: &Context,
    volume: &str,
    reason: &str,
    mut f: impl FnMut(&mut Vec<String>) -> bool + Send,
) -> Result<(), Error> {
    let mut changed = None;
    let mut before = Vec::new();
    ctx.store
        .modify::<Volume, Error>(volume, |v| {
            if v.status.generation == 0 {
                return Ok(false); // not recorded yet: every replica counts
            }
            if v.status.attached_node.is_some() {
                return Ok(false); // its engine keeps the record
            }
            before = v.status.current_replicas.clone();
            let mut set = v.status.current_replicas.clone();
            if !f(&mut set) {
                return Ok(false);
            }
            set.sort();
            v.status.generation += 1;
            v.status.current_replicas = set.clone();
            changed = Some((v.status.generation, set));
            Ok(true)
        })
        .await?;
    if let Some((generation, set)) = changed {
        announce(ctx, volume, generation, &before, &set, reason).await;
    }
    Ok(())
}

/// Makes `replica` the only replica that counts as holding the volume's
/// data: what the other current replicas held beyond it is given up. For a
/// detached volume none of whose current replicas is on a ready node;
/// `force` salvages even when one is (its data may be gone).
#[tracing::instrument(skip_all, fields(volume = %volume, replica = %replica))]
pub async fn salvage(
    ctx: &Arc<Context>,
    volume: &str,
    replica: &str,
    force: bool,
) -> Result<Volume, Error> {
    let v: Volume = ctx.store.fetch(volume).await?;
    if let Some(n) = &v.status.attached_node {
        return Err(Error::Conflict(format!(
            "volume {volume} is attached to {n}; detach it first"
        )));
    }
    let replicas: Vec<Replica> = ctx.store.list().await?;
    let chosen = replicas
        .iter()
        .find(|r| r.name == replica && r.spec.volume == volume)
        .ok_or_else(|| {
            Error::invalid("replica", format!("{replica} is not a replica of {volume}"))
        })?;
    let nodes: Vec<Node> = ctx.store.list().await?;
    let ready = |node: &str| nodes.iter().any(|n| n.id == node && n.status.ready);
    if let Some(r) = current(&v, &replicas)
        .into_iter()
        .find(|r| ready(&r.spec.node_id) && r.name != replica)
        .filter(|_| !force)
    {
        return Err(Error::Unprocessable(format!(
            "replica {} holds the latest data of {volume} and its node {} is ready: attach the \
             volume instead (or salvage with force if its data is gone)",
            r.name, r.spec.node_id
        )));
    }
    if !ready(&chosen.spec.node_id) {
        return Err(Error::Unprocessable(format!(
            "replica {replica}'s node {} is not ready",
            chosen.spec.node_id
        )));
    }
    let given_up: Vec<String> = current(&v, &replicas)
        .iter()
        .filter(|r| r.name != replica)
        .map(|r| r.name.clone())
        .collect();
    let before = v.status.current_replicas.clone();
    let v = ctx
        .store
        .modify::<Volume, Error>(volume, |v| {
            v.status.generation += 1;
            v.status.current_replicas = vec![replica.to_string()];
            v.status.robustness = Robustness::Unknown;
            Ok(true)
        })
        .await?;
    mark_left(ctx, &before, &v.status.current_replicas).await;
    // The salvaged replica holds the data from now on.
    ctx.store
        .modify::<Replica, Error>(replica, |r| {
            r.status.mode = Some(ReplicaMode::Rw);
            r.spec.failed_at = None;
            Ok(true)
        })
        .await?;
    let message = format!(
        "salvaged from {replica} by an operator (generation {}): writes that only {} held are lost",
        v.status.generation,
        if given_up.is_empty() {
            "other replicas".to_string()
        } else {
            given_up.join(", ")
        }
    );
    tracing::warn!(%message, "volume salvaged");
    ctx.event(Kind::Volume, volume, "VolumeSalvaged", message)
        .await;
    Ok(v)
}
