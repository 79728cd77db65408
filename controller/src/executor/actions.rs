//! Carrying out one planner action, through the store and the node agents.
//! Intent is written before the effect: a replica's record exists (in `wo`
//! mode, so the next plan sees a rebuild under way) before its node builds
//! it. A failed build marks the replica failed, so that the planner reuses
//! or replaces it; nothing here decides what to do next.

use std::sync::Arc;

use ballast::model::{Kind, Node, Replica, ReplicaMode, Volume};
use ballast::proto::agent::v1::LoseBadBlocksRequest;

use super::pace::{self, Way};
use super::{effects, replica};
use crate::agents::NewReplica;
use crate::context::Context;
use crate::error::Error;
use crate::planner::{Action, ActionKind};

/// Carries out `action`. Actions on a volume take its guard; a volume busy
/// with another call fails with a conflict (and is retried by the loop).
#[tracing::instrument(skip_all, fields(rule = ?action.rule))]
pub async fn carry_out(ctx: &Arc<Context>, action: &Action) -> Result<(), Error> {
    match &action.kind {
        ActionKind::CreateReplica {
            volume,
            node,
            disk,
            reuse,
            copy_from,
            ..
        } => {
            let _guard = ctx.lock_volume(volume)?;
            build_replica(
                ctx,
                volume,
                node,
                disk,
                reuse.as_deref(),
                copy_from.as_deref(),
            )
            .await
        }
        ActionKind::DeleteReplica { volume, replica } => {
            let _guard = ctx.lock_volume(volume)?;
            remove_replica(ctx, volume, replica, &action.reason).await
        }
        ActionKind::SetReplicaEviction { replica, requested } => {
            ctx.store
                .modify::<Replica, Error>(replica, |r| Ok(effects::set_eviction(r, *requested)))
                .await?;
            Ok(())
        }
        ActionKind::SetNodeStatus {
            node,
            auto_evicting,
            drain_blocked,
            drain_blocked_reason,
        } => {
            ctx.store
                .modify::<Node, Error>(node, |n| {
                    Ok(effects::set_node_status(
                        &mut n.status,
                        *auto_evicting,
                        *drain_blocked,
                        drain_blocked_reason,
                    ))
                })
                .await?;
            Ok(())
        }
        ActionKind::RecordEvent {
            object,
            reason,
            message,
        } => {
            ctx.events
                .record_on(
                    ctx.store.as_ref(),
                    ctx.now(),
                    object,
                    reason,
                    message.clone(),
                )
                .await;
            Ok(())
        }
    }
}

async fn ready_node(ctx: &Context, id: &str) -> Result<Node, Error> {
    let node: Node = ctx.store.fetch(id).await?;
    if !node.status.ready || node.status.replica_endpoint.is_empty() {
        return Err(Error::Unprocessable(format!("node {id} is not ready")));
    }
    Ok(node)
}

async fn mark_failed(ctx: &Context, name: &str, why: &Error, reused: bool) {
    let now = ctx.now();
    // A rebuild that failed because a node could not be reached, or
    // because the engine was busy (one rebuild at a time, another just
    // begun), does not count as a reuse attempt: the next comes without
    // the reuse backoff.
    let uncounted = reused && matches!(why, Error::Unavailable(_) | Error::Conflict(_));
    let marked = ctx
        .store
        .modify::<Replica, Error>(name, |r| {
            effects::failed(r, now, uncounted);
            Ok(true)
        })
        .await;
    if marked.is_ok() {
        ctx.event(
            Kind::Replica,
            name,
            "RebuildFailed",
            format!("rebuild failed: {why}"),
        )
        .await;
    }
}

/// Creates (or reuses) a replica of `volume` on `node`/`disk` and fills it:
/// through the engine when the volume is attached, offline otherwise.
#[tracing::instrument(skip_all, fields(volume = %volume, node = %node, replica = ?reuse))]
async fn build_replica(
    ctx: &Arc<Context>,
    volume: &str,
    node: &str,
    disk: &str,
    reuse: Option<&str>,
    copy_from: Option<&str>,
) -> Result<(), Error> {
    let vol: Volume = ctx.store.fetch(volume).await?;
    let target = ready_node(ctx, node).await?;
    // The replicas with the latest data, read by name. Whether the volume
    // ever held data is asked of them first, and of every replica of it
    // (a whole read) only when none of them ever did: a new volume's.
    let current = crate::freshness::current_records(ctx, &vol).await?;
    // A volume ever attached, or restored or cloned, may hold data that
    // no heartbeat reported (its replicas' records from before attach and
    // creation said so themselves).
    let has_data = vol.status.engine_epoch > 0
        || vol.spec.source.is_some()
        || current.iter().any(|r| r.spec.healthy_at.is_some())
        || ctx
            .store
            .list::<Replica>()
            .await?
            .iter()
            .any(|r| r.spec.volume == volume && r.spec.healthy_at.is_some());
    // A replica of a volume that never held data is just made empty.
    let mode = has_data.then_some(ReplicaMode::Wo);
    let name = match reuse {
        Some(name) => {
            ctx.store
                .modify::<Replica, Error>(name, |r| {
                    effects::reuse(r, mode);
                    Ok(true)
                })
                .await?;
            name.to_string()
        }
        None => {
            replica::make(ctx, volume, vol.spec.size, &target, disk, mode)
                .await?
                .name
        }
    };
    if !has_data {
        // Empty like every other replica of the volume: as current as they.
        crate::freshness::add_current(
            ctx,
            volume,
            &name,
            "a new replica of a volume with no data yet",
        )
        .await?;
        return Ok(());
    }
    let at = format!("{name}@{}", target.status.replica_endpoint);
    let filled = async {
        if reuse.is_some() {
            // Its node may never have made it (the controller that wrote
            // the record died first): made now, empty, when missing. The
            // call is a no-op for a replica its node holds.
            let new = NewReplica {
                name: &name,
                volume,
                disk,
                size: vol.spec.size,
            };
            ctx.agents.create_replica(&target, new).await?;
        }
        match &vol.status.attached_node {
            Some(attached) => add_to_engine(ctx, &vol, attached, (&name, &at), copy_from).await,
            None => rebuild_offline(ctx, &vol, &current, &name, &target, copy_from).await,
        }
    }
    .await;
    if let Err(e) = &filled {
        mark_failed(ctx, &name, e, reuse.is_some()).await;
    }
    filled
}

/// The engine adds replica `name` (at `at`) in `wo` mode and rebuilds it,
/// at the volume's pace (see `pace`); its heartbeat reports when it turns
/// `rw`.
async fn add_to_engine(
    ctx: &Context,
    vol: &Volume,
    attached: &str,
    (name, at): (&str, &str),
    copy_from: Option<&str>,
) -> Result<(), Error> {
    let engine_node = ready_node(ctx, attached).await?;
    let pace = pace::pace(&vol.spec, &ctx.settings().await?, Way::Engine);
    let source = (copy_from.unwrap_or_default(), pace.bytes_per_second);
    ctx.agents
        .add_engine_replica(&engine_node, vol, at, source)
        .await?;
    // A source named is on the target's node: a copy within it, at the
    // same pace.
    let how = match copy_from {
        Some(src) => format!("by the engine on {attached}, from {src} on the same node, {pace}"),
        None => format!("by the engine on {attached}, {pace}"),
    };
    ctx.event(Kind::Replica, name, "RebuildStarted", how).await;
    Ok(())
}

/// A detached volume has no engine: the target's node copies from a
/// replica that holds the latest data (one on its own node first, for a
/// local copy), and the target joins the record of those that do.
async fn rebuild_offline(
    ctx: &Context,
    vol: &Volume,
    current: &[Replica],
    name: &str,
    target: &Node,
    copy_from: Option<&str>,
) -> Result<(), Error> {
    let mut sources: Vec<&Replica> = current.iter().filter(|r| r.name != name).collect();
    sources.sort_by_key(|r| {
        (
            Some(r.name.as_str()) != copy_from,
            r.spec.node_id != target.id,
        )
    });
    let mut source = None;
    for r in &sources {
        if let Ok(n) = ready_node(ctx, &r.spec.node_id).await {
            let at = format!("{}@{}", r.name, n.status.replica_endpoint);
            source = Some((at, r.spec.node_id == target.id));
            break;
        }
    }
    let (source, source_local) = source.ok_or_else(|| {
        Error::Unprocessable(format!(
            "no replica that holds the latest data is reachable to copy {name} from"
        ))
    })?;
    // A user's call on the volume (an attach, a deletion, an expansion, a
    // snapshot) calls the copy off, and the replica is rebuilt later,
    // keeping what was copied: none waits for a whole copy.
    let pace = pace::pace(&vol.spec, &ctx.settings().await?, Way::Offline);
    let on = if source_local {
        " on the same node"
    } else {
        ""
    };
    let how = format!("offline, from {source}{on}, {pace}");
    ctx.event(Kind::Replica, name, "RebuildStarted", how).await;
    let source_name = source.split('@').next().unwrap_or_default();
    let mut losses = 0;
    let done = loop {
        let copy = ctx
            .agents
            .rebuild_replica(target, name, &source, pace.bytes_per_second);
        match ctx.offline_copy(&vol.name, copy).await {
            Ok(d) => break d,
            // The source's data failed its checksums. The last replica
            // holding the data gives up what failed, and the copy goes on
            // with the rest (each attempt finds one more bad layer at
            // most, but every bad block of it).
            Err(Error::DataLoss(why))
                if losses < MAX_LOSSES
                    && lose_in_last(ctx, &vol.name, source_name, &why).await? =>
            {
                losses += 1;
            }
            Err(Error::DataLoss(why)) => {
                // Any other is the replica at fault; it leaves the record
                // and is rebuilt in turn.
                fail_corrupt(ctx, &vol.name, source_name, &why).await?;
                return Err(Error::DataLoss(why));
            }
            Err(e) => return Err(e),
        }
    };
    // The event first: whoever sees the replica rw finds it.
    ctx.event(
        Kind::Replica,
        name,
        "ReplicaRebuilt",
        format!(
            "from {source}: kept {} B, copied {} B by {}",
            done.kept_bytes, done.copied_bytes, done.copy_path
        ),
    )
    .await;
    let now = ctx.now();
    ctx.store
        .modify::<Replica, Error>(name, |r| {
            effects::rebuilt(r, now);
            Ok(true)
        })
        .await?;
    crate::freshness::add_current(
        ctx,
        &vol.name,
        name,
        &format!("{name} rebuilt from {source}"),
    )
    .await
}

/// Attempts of one offline copy that each give up blocks of the last
/// replica as lost: each gives up every bad block of a layer, so a copy
/// meets as many at most as the source has layers gone bad.
const MAX_LOSSES: usize = 16;

/// An offline copy from `source` failed on its data (`why`), and `source`
/// is the only replica recorded as holding the detached volume's latest
/// data: no replica holds what failed sound. Its node gives up the blocks
/// the copy found bad as lost (`LoseBadBlocks`, with every other block of
/// their layers that fails), so that the copy can go on with the rest of
/// the volume, as the engine does for an attached one; before, every
/// attempt failed on the same block, and the volume never got another
/// replica (a drain waited for ever). Whether any block was given up; the
/// blocks are named in a `BlocksLost` event on the replica and the volume.
async fn lose_in_last(ctx: &Context, volume: &str, source: &str, why: &str) -> Result<bool, Error> {
    let vol: Volume = ctx.store.fetch(volume).await?;
    if vol.status.attached_node.is_some() || vol.status.current_replicas != [source] {
        return Ok(false);
    }
    let rep: Replica = ctx.store.fetch(source).await?;
    let node = ready_node(ctx, &rep.spec.node_id).await?;
    // One pass over each layer given up in.
    let request = LoseBadBlocksRequest {
        name: source.to_string(),
    };
    let limit = crate::agents::reading(vol.spec.size);
    let lost = crate::agents::long_call(&node, &ctx.member, limit, |mut c| async move {
        c.lose_bad_blocks(request).await
    })
    .await?
    .lost;
    if lost.is_empty() {
        return Ok(false);
    }
    let blocks: Vec<String> = lost
        .iter()
        .map(|l| {
            let at: Vec<String> = l.offsets.iter().map(u64::to_string).collect();
            format!("layer {} at {}", l.layer, at.join(", "))
        })
        .collect();
    let count: usize = lost.iter().map(|l| l.offsets.len()).sum();
    let message = format!(
        "{count} block(s) of 4 KiB no replica holds sound given up as lost in {source}, \
         the last replica holding the volume's data ({}): each fails its reads until \
         written again, and the rest of the volume is copied; found by a copy from it: {why}",
        blocks.join("; ")
    );
    tracing::error!(volume, replica = source, %message, "blocks lost");
    ctx.event(Kind::Replica, source, "BlocksLost", message.clone())
        .await;
    ctx.event(Kind::Volume, volume, "BlocksLost", message).await;
    Ok(true)
}

/// Fails a replica whose data was found corrupt (by a rebuild that read
/// it, or by the scrub), so that the planner rebuilds it from a good one —
/// its corrupt layers are marked on its node and never kept. An attached
/// volume's engine drops it (and records that); a detached volume's record
/// loses it. The last replica holding the volume's data is never dropped:
/// the record keeps naming where the data is, corrupt or not.
pub(crate) async fn fail_corrupt(
    ctx: &Context,
    volume: &str,
    replica: &str,
    why: &str,
) -> Result<(), Error> {
    ctx.event(Kind::Replica, replica, "ReplicaCorrupt", why.to_string())
        .await;
    let vol: Volume = ctx.store.fetch(volume).await?;
    if let Some(attached) = &vol.status.attached_node {
        let node = ready_node(ctx, attached).await?;
        ctx.agents
            .remove_engine_replica(&node, volume, replica)
            .await?;
    }
    let now = ctx.now();
    ctx.store
        .modify::<Replica, Error>(replica, |r| {
            r.status.mode = Some(ReplicaMode::Err);
            r.status.running = false;
            r.spec.failed_at = Some(now);
            Ok(true)
        })
        .await?;
    crate::freshness::remove_current(ctx, volume, replica).await
}

/// Deletes a replica at a user's request (`DELETE /v1/replicas/{name}`):
/// out of its engine, its data, then its record.
#[tracing::instrument(skip_all, fields(replica = %name))]
pub async fn delete_replica(ctx: &Arc<Context>, name: &str) -> Result<(), Error> {
    let rep: Replica = ctx.store.fetch(name).await?;
    let _guard = ctx
        .lock_volume_waiting(&rep.spec.volume, std::time::Duration::from_secs(30))
        .await?;
    remove_replica(ctx, &rep.spec.volume, name, "deleted on request").await
}

/// Takes a replica out of its volume's record of who holds the data, then
/// out of its engine, deletes its data, then its record. A replica on a
/// node that is down loses its record only (its node deletes the data
/// when it is back: see `nodes::registry`).
#[tracing::instrument(skip_all, fields(volume = %volume, replica = %replica))]
async fn remove_replica(
    ctx: &Context,
    volume: &str,
    replica: &str,
    why: &str,
) -> Result<(), Error> {
    let Some(rep) = ctx.store.get::<Replica>(replica).await? else {
        return Ok(());
    };
    let vol: Option<Volume> = ctx.store.get(volume).await?;
    // Detached, the record says who holds the data (attached, the engine
    // refuses to lose its last rw replica).
    if let Some(v) = &vol
        && v.status.attached_node.is_none()
        && v.status.generation > 0
        && v.status.current_replicas == [replica.to_string()]
    {
        return Err(Error::Unprocessable(format!(
            "replica {replica} is the last that holds the latest data of {volume}"
        )));
    }
    if let Some(attached) = vol.and_then(|v| v.status.attached_node)
        && let Ok(node) = ready_node(ctx, &attached).await
    {
        ctx.agents
            .remove_engine_replica(&node, volume, replica)
            .await?;
    }
    // A detached volume's record loses it first (an engine keeps its own):
    // the record never names a replica that is gone, and whoever sees the
    // replica gone sees the record without it.
    crate::freshness::remove_current(ctx, volume, replica).await?;
    let deleted = match ready_node(ctx, &rep.spec.node_id).await {
        Ok(node) => ctx.agents.delete_replica(&node, replica).await,
        Err(e) => Err(e),
    };
    match deleted {
        Ok(()) => {}
        // Down or unreachable: the node deletes the data when it is back.
        Err(
            Error::Unprocessable(_)
            | Error::Unavailable(_)
            | Error::NotFound { .. }
            | Error::NotOnNode(_),
        ) => {
            tracing::warn!(
                node = %rep.spec.node_id,
                "the replica's node is down; its data stays on the disk until the node returns"
            )
        }
        Err(e) => return Err(e),
    }
    ctx.store.delete::<Replica>(replica, None).await?;
    ctx.event(Kind::Replica, replica, "ReplicaDeleted", why.to_string())
        .await;
    Ok(())
}
