//! The volume lifecycle through the node agents: create (placed by the
//! planner, each replica made by `replica::make`), attach (an engine
//! started with the current replicas), detach, expand (two phases) and
//! delete. Each takes the volume's guard.

use std::sync::Arc;

use ballast::model::{Kind, Node, Replica, Robustness, Volume, VolumeState};
use ballast::proto::agent::v1::{
    GrowReplicaRequest, ListEnginesRequest, StartEngineRequest, StopEngineRequest,
};

use super::replica;
use crate::agents::{client as agent, with_timeout};

/// How long a user's call waits for the control loop to finish a step on
/// the volume before it answers busy.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);
use crate::context::Context;
use crate::error::Error;
use crate::{observe, planner};

/// Places a new volume's replicas with the planner, records them, and
/// creates them on their nodes (and fills them from the volume's source).
/// Nothing is left behind when a step fails. The creation runs as a task
/// of its own: a caller that goes away (a CO's call cut at its timeout
/// while a restore copies) leaves it going, the volume busy, and the call
/// asked again is answered "still being created" until it is done. Before,
/// the next call found the creation cut off and began it again from
/// nothing: a restore longer than the CO's timeout never ended.
#[tracing::instrument(skip_all, fields(volume = %volume.name))]
pub async fn create(ctx: &Arc<Context>, volume: Volume) -> Result<Volume, Error> {
    let creation = create_now(ctx.clone(), volume);
    tokio::spawn(tracing::Instrument::in_current_span(creation))
        .await
        .map_err(|e| Error::Internal(format!("the creation ended: {e}")))?
}

async fn create_now(ctx: Arc<Context>, mut volume: Volume) -> Result<Volume, Error> {
    let ctx = &ctx;
    let _guard = ctx.lock_volume_waiting(&volume.name, PATIENCE).await?;
    if let Some(old) = ctx.store.get::<Volume>(&volume.name).await? {
        if old.status.state != VolumeState::Creating || old.spec != volume.spec {
            return Err(Error::AlreadyExists(format!(
                "volume {:?} already exists",
                volume.name
            )));
        }
        // Left `creating` by a controller that stopped mid-way (this call
        // holds the volume): what it made goes, and the volume is made anew.
        tracing::warn!(volume = %old.name, "a creation was cut off; starting it again");
        for r in ctx.store.list::<Replica>().await? {
            if r.spec.volume == old.name {
                replica::discard(ctx, &r).await;
            }
        }
        ctx.store.delete::<Volume>(&old.name, None).await?;
    }
    let source = match &volume.spec.source {
        Some(s) => Some(source_of(ctx, s, volume.spec.size).await?),
        None => None,
    };
    let view = observe::current_view(ctx).await?;
    let placements = planner::place_new(
        &view,
        &ctx.settings().await?,
        ctx.now(),
        &observe::volume_view(&volume),
    )
    .map_err(|reasons| {
        Error::NoRoom(format!(
            "cannot place {} replicas of {}: {}",
            volume.spec.number_of_replicas,
            volume.name,
            reasons.join("; ")
        ))
    })?;
    volume.status.state = VolumeState::Creating;
    let mut volume = ctx.store.create(&volume).await?;
    let mut made: Vec<Replica> = Vec::new();
    let mut failure = None;
    for p in placements {
        let made_one = match ctx.store.fetch::<Node>(&p.node).await {
            Ok(node) => {
                replica::make(ctx, &volume.name, volume.spec.size, &node, &p.disk, None).await
            }
            Err(e) => Err(e.into()),
        };
        match made_one {
            Ok(r) => made.push(r),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    if failure.is_none()
        && let Some((from, snapshot)) = &source
        && let Err(e) = fill_from(ctx, from, snapshot.as_deref(), &made).await
    {
        failure = Some(e);
    }
    // The rollback rule of `replica::make`, for the volume as a whole.
    if let Some(e) = failure {
        for r in &made {
            replica::discard(ctx, r).await;
        }
        let _ = ctx.store.delete::<Volume>(&volume.name, None).await;
        return Err(e);
    }
    if source.is_some() {
        // Filled: they hold the source's data, though no engine ever
        // reported them (a replica added later is filled from them, never
        // made empty).
        let now = ctx.now();
        for r in &made {
            ctx.store
                .modify::<Replica, Error>(&r.name, |r| {
                    super::effects::rebuilt(r, now);
                    Ok(true)
                })
                .await?;
        }
    }
    volume = ctx
        .store
        .modify::<Volume, Error>(&volume.name, |v| {
            v.status.state = VolumeState::Detached;
            crate::freshness::initial(v, &made);
            Ok(true)
        })
        .await?;
    ctx.event(
        Kind::Volume,
        &volume.name,
        "VolumeCreated",
        format!(
            "{} replicas of {} on {}",
            made.len(),
            ballast::quantity::format_size(volume.spec.size),
            made.iter()
                .map(|r| format!("{}/{}", r.spec.node_id, r.spec.disk_id))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
    .await;
    Ok(volume)
}

/// Fills a new volume's replicas from `from`: as it was at `snapshot`, or
/// (a clone) as it is now, through a snapshot taken for the clone and
/// deleted once it has served.
async fn fill_from(
    ctx: &Arc<Context>,
    from: &Volume,
    snapshot: Option<&str>,
    made: &[Replica],
) -> Result<(), Error> {
    if let Some(id) = snapshot {
        return super::snapshot::restore(ctx, from, id, made).await;
    }
    let id = format!("clone-{}", &uuid::Uuid::new_v4().simple().to_string()[..16]);
    let new = super::snapshot::NewSnapshot {
        name: id.clone(),
        volume: from.name.clone(),
        csi_name: None,
        internal: true,
    };
    let filled = match super::snapshot::create(ctx, new).await {
        Ok(_) => super::snapshot::restore(ctx, from, &id, made).await,
        Err(e) => Err(e),
    };
    let _ = super::snapshot::delete(ctx, &id).await;
    filled
}

/// The volume a new volume's data comes from, and the snapshot of it to
/// restore (None for a clone, which takes its own once its replicas are
/// made).
async fn source_of(
    ctx: &Arc<Context>,
    source: &ballast::model::VolumeSource,
    size: u64,
) -> Result<(Volume, Option<String>), Error> {
    let too_small = |what: String, needed: u64| Error::OutOfRange {
        field: "size".into(),
        message: format!(
            "{size} bytes is smaller than {what}, {needed} bytes; a volume restores only into one as large"
        ),
    };
    if let Some(id) = &source.snapshot {
        let snapshot: ballast::model::Snapshot = ctx.store.fetch(id).await?;
        if !snapshot.status.ready_to_use {
            return Err(Error::Unprocessable(format!(
                "snapshot {id:?} is not ready to use yet"
            )));
        }
        if size < snapshot.status.size {
            return Err(too_small(format!("snapshot {id}"), snapshot.status.size));
        }
        let from: Volume = ctx.store.fetch(&snapshot.spec.volume).await?;
        return Ok((from, Some(snapshot.name)));
    }
    let name = source.volume.as_deref().unwrap_or_default();
    let from: Volume = ctx.store.fetch(name).await?;
    if size < from.spec.size {
        return Err(too_small(format!("volume {name}"), from.spec.size));
    }
    Ok((from, None))
}

/// Deletes a detached volume: its replicas' data on their nodes, then the
/// records. A replica whose node cannot delete it keeps its record, so the
/// call can be repeated.
#[tracing::instrument(skip_all, fields(volume = %name))]
pub async fn delete(ctx: &Arc<Context>, name: &str) -> Result<(), Error> {
    let why = format!("volume {name} is being deleted");
    let _guard = ctx
        .lock_volume_calling_off_copies(name, &why, PATIENCE)
        .await?;
    let volume: Volume = ctx.store.fetch(name).await?;
    if let Some(node) = &volume.status.attached_node {
        return Err(Error::Conflict(format!(
            "volume {name:?} is attached to {node}; detach it first"
        )));
    }
    // A snapshot's data lives in its volume's replicas.
    let snapshots: Vec<String> = ctx
        .store
        .list::<ballast::model::Snapshot>()
        .await?
        .into_iter()
        .filter(|s| s.spec.volume == name)
        .map(|s| s.name)
        .collect();
    if !snapshots.is_empty() {
        return Err(Error::Unprocessable(format!(
            "volume {name:?} has snapshots ({}): their data lives in its replicas; delete them first",
            snapshots.join(", ")
        )));
    }
    let mut failed = Vec::new();
    for r in ctx
        .store
        .list::<Replica>()
        .await?
        .into_iter()
        .filter(|r| r.spec.volume == name)
    {
        let deleted = match ctx.store.fetch::<Node>(&r.spec.node_id).await {
            Ok(node) => ctx.agents.delete_replica(&node, &r.name).await,
            Err(e) => Err(e.into()),
        };
        match deleted {
            Ok(()) => ctx.store.delete::<Replica>(&r.name, None).await?,
            Err(e) => failed.push(format!("{}: {e}", r.name)),
        }
    }
    if !failed.is_empty() {
        return Err(Error::Internal(format!(
            "could not delete every replica of {name}: {}",
            failed.join("; ")
        )));
    }
    ctx.store.delete::<Volume>(name, None).await?;
    ctx.event(
        Kind::Volume,
        name,
        "VolumeDeleted",
        "volume and its replicas' data deleted",
    )
    .await;
    Ok(())
}

/// Starts the volume's engine on `node_id` and records its endpoint.
/// Attached there already (a CSI publish repeated): the same attachment,
/// whose engine the node keeps when it runs and is healthy, and starts
/// again when not (a dead engine is never answered as attached).
#[tracing::instrument(skip_all, fields(volume = %name, node = %node_id))]
pub async fn attach(ctx: &Arc<Context>, name: &str, node_id: &str) -> Result<Volume, Error> {
    let why = format!("volume {name} is being attached to {node_id}");
    let _guard = ctx
        .lock_volume_calling_off_copies(name, &why, PATIENCE)
        .await?;
    let volume: Volume = ctx.store.fetch(name).await?;
    let again = match &volume.status.attached_node {
        Some(n) if n == node_id => true,
        Some(n) => {
            return Err(Error::Conflict(format!(
                "volume {name:?} is attached to {n}; detach it first"
            )));
        }
        None => false,
    };
    let mut node: Node = ctx
        .store
        .get(node_id)
        .await?
        .ok_or_else(|| Error::invalid("nodeId", format!("no node {node_id:?}")))?;
    if !node.status.ready && ctx.await_first_heartbeats(&[node_id]).await? {
        node = ctx.store.fetch(node_id).await?;
    }
    if !node.status.ready {
        return Err(Error::Unprocessable(format!("node {node_id} is not ready")));
    }
    if !again {
        within_limit(ctx, &node, name).await?;
        // Intent first: the engine records its replica set as the engine
        // of this node, which the store must already say.
        ctx.store
            .modify::<Volume, Error>(name, |v| {
                v.status.attached_node = Some(node_id.to_string());
                v.status.state = VolumeState::Attaching;
                Ok(true)
            })
            .await?;
    }
    let attachment = if again {
        Attachment::Same
    } else {
        Attachment::New
    };
    let endpoint = match start_engine(ctx, &volume, &node, attachment).await {
        Ok(e) => e,
        Err(e) => {
            if !again {
                ctx.store
                    .modify::<Volume, Error>(name, |v| {
                        v.status.attached_node = None;
                        v.status.state = VolumeState::Detached;
                        Ok(true)
                    })
                    .await?;
            }
            return Err(e);
        }
    };
    let volume = ctx
        .store
        .modify::<Volume, Error>(name, |v| {
            let changed = v.status.frontend_endpoint.as_deref() != Some(endpoint.as_str())
                || v.status.state != VolumeState::Attached;
            v.status.attached_node = Some(node_id.to_string());
            v.status.frontend_endpoint = Some(endpoint.clone());
            v.status.state = VolumeState::Attached;
            Ok(changed)
        })
        .await?;
    mark_served(ctx, &volume).await?;
    if !again {
        ctx.event(
            Kind::Volume,
            name,
            "VolumeAttached",
            format!("attached to {node_id}: {endpoint}"),
        )
        .await;
    }
    Ok(volume)
}

/// Records that the current replicas of `volume`, whose engine was just
/// started, may hold data from now on (`effects::served`), before the
/// endpoint is handed out: a volume written and detached before any
/// heartbeat saw its engine has held data all the same.
async fn mark_served(ctx: &Arc<Context>, volume: &Volume) -> Result<(), Error> {
    let now = ctx.now();
    for r in crate::freshness::current_records(ctx, volume).await? {
        ctx.store
            .modify::<Replica, Error>(&r.name, |r| Ok(super::effects::served(r, now)))
            .await?;
    }
    Ok(())
}

/// Whether a start of an engine is a new attachment of the volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Attachment {
    /// Counted anew: the replicas its engine opens refuse every engine
    /// started before it, and the node replaces one of an earlier count.
    New,
    /// The one the volume is attached at (a repeated attach): the node
    /// keeps its engine when that runs and is healthy.
    Same,
}

/// Starts the engine of `volume` on `node` with the replicas that hold its
/// latest data (the node agent keeps one already running and healthy
/// for this attachment);
/// returns its endpoint. When it can open none of them, the volume is
/// faulted and the error says where the latest data is.
async fn start_engine(
    ctx: &Arc<Context>,
    volume: &Volume,
    node: &Node,
    attachment: Attachment,
) -> Result<String, Error> {
    let serving = crate::freshness::serving(ctx, volume).await?;
    let local = serving.on(&node.id).unwrap_or_default().to_string();
    let holders = serving.holders.join(", ");
    // A new attachment, counted before any engine can claim it: the
    // replicas that its engine opens refuse the writes of every engine
    // started before it. (The node replaces an engine of an earlier
    // attachment, healthy or not; the count only ever grows.)
    let epoch = match attachment {
        Attachment::Same if volume.status.engine_epoch > 0 => volume.status.engine_epoch,
        _ => {
            ctx.store
                .modify::<Volume, Error>(&volume.name, |v| {
                    v.status.engine_epoch += 1;
                    Ok(true)
                })
                .await?
                .status
                .engine_epoch
        }
    };
    // With TLS on, the engine gets credentials for this volume on this
    // node, naming that attachment: the replicas take JOIN and FILL only
    // from them, and the claim of the attachment only with them.
    let (tls_cert_pem, tls_key_pem) = match &ctx.ca {
        Some(ca) => {
            let c = ca
                .issue_engine(&volume.name, &node.id, epoch)
                .map_err(|e| Error::Internal(format!("the engine's certificate: {e}")))?;
            (c.cert_pem.clone(), c.key_pem().to_string())
        }
        None => Default::default(),
    };
    // The node waits up to 20 s for the engine to serve (a replica whose
    // node hangs costs it a handshake's 10 s): bounded here, not cut at an
    // agent call's 10 s while the engine goes on starting.
    let request = StartEngineRequest {
        volume: volume.name.clone(),
        size: volume.spec.size,
        replicas: serving.replicas,
        local,
        generation: serving.generation,
        current: serving.current,
        stale: serving.stale,
        tls_cert_pem,
        tls_key_pem,
        epoch,
        replica_timeout_seconds: ctx.settings().await?.engine_replica_timeout_secs(),
    };
    let started = crate::agents::long_call(
        node,
        &ctx.member,
        crate::agents::START_TIMEOUT,
        |mut c| async move { c.start_engine(request).await },
    )
    .await;
    match started {
        Ok(s) => Ok(s.engine.map(|e| e.endpoint).unwrap_or_default()),
        // The engine could open none of the replicas with the data.
        Err(Error::Unprocessable(m)) => Err(crate::freshness::fault(
            ctx,
            &volume.name,
            format!("{m}; the latest data is on {holders}"),
        )
        .await),
        Err(e) => Err(e),
    }
}

/// Why an attached volume's engine is started again.
#[derive(Clone, Debug)]
pub enum Restart {
    /// It is dead or hung on its node (the problem its heartbeat gave).
    Down(String),
    /// It runs, under an engine host that a new one replaced (a rollout
    /// of the engine host): the node starts it again under the new one,
    /// its block device kept. Nothing failed, so the volume is not
    /// faulted meanwhile.
    Handover(String),
}

/// The engine of an attached volume is dead or hung on its node, or is
/// handed over to the node's new engine host (a heartbeat said so): it is
/// started again with the current replicas. A dead one leaves the volume
/// faulted until then. A volume busy with another call is left to the
/// next heartbeat.
///
/// The heartbeat may be older than the engine: a node lists its engines,
/// then sends the list, and an attach (or an earlier restart) can start
/// the engine in between. So the node is asked again, under the guard,
/// and an engine it now runs as asked is left alone: starting it again
/// would take its socket from the client just given it.
#[tracing::instrument(skip_all, fields(volume = %name, node = %node_id))]
pub async fn restart_engine(
    ctx: &Arc<Context>,
    name: &str,
    node_id: &str,
    why: Restart,
) -> Result<(), Error> {
    let _guard = ctx.lock_volume(name)?;
    let volume: Volume = ctx.store.fetch(name).await?;
    if volume.status.attached_node.as_deref() != Some(node_id)
        || volume.status.state != VolumeState::Attached
    {
        return Ok(()); // detached or moved meanwhile
    }
    let node: Node = ctx.store.fetch(node_id).await?;
    match runs_as_asked(ctx, &node, name).await {
        Ok(true) => {
            tracing::info!("the node runs the engine now; its report was older than the engine");
            return Ok(());
        }
        Ok(false) => {}
        // The report stands: the start says what is wrong, if it fails.
        Err(e) => tracing::warn!(error = %e, "cannot ask the node which engines it runs"),
    }
    match why {
        Restart::Down(problem) => {
            if volume.status.robustness != Robustness::Faulted {
                ctx.store
                    .modify::<Volume, Error>(name, |v| {
                        v.status.robustness = Robustness::Faulted;
                        Ok(true)
                    })
                    .await?;
            }
            ctx.event(
                Kind::Volume,
                name,
                "EngineDown",
                format!("its engine on {node_id} is not running: {problem}; starting it again"),
            )
            .await;
            let endpoint = start_engine(ctx, &volume, &node, Attachment::New).await?;
            ctx.event(
                Kind::Volume,
                name,
                "EngineRestarted",
                format!("on {node_id}: {endpoint}"),
            )
            .await;
        }
        Restart::Handover(problem) => {
            start_engine(ctx, &volume, &node, Attachment::New).await?;
            ctx.event(
                Kind::Volume,
                name,
                "EngineHandedOver",
                format!("its engine on {node_id} runs under the node's new engine host: {problem}"),
            )
            .await;
        }
    }
    let why = format!("its engine on {node_id} was started again");
    interrupt_rebuilds(ctx, name, &why).await;
    Ok(())
}

/// The replicas the stopped engine of `volume` was filling are filled by
/// no one now (the new engine starts with the current ones): they are
/// failed as interrupted, and rebuilt again at once.
async fn interrupt_rebuilds(ctx: &Arc<Context>, volume: &str, why: &str) {
    if let Err(e) = super::interrupted::fail_engines_rebuilds(ctx, volume, why).await {
        tracing::warn!(volume = %volume, error = %e, "the stopped engine's rebuilds are left to the node-down timeout");
    }
}

/// Whether `node` runs the engine of volume `name` now, answering, under
/// its current engine host.
async fn runs_as_asked(ctx: &Arc<Context>, node: &Node, name: &str) -> Result<bool, Error> {
    let mut c = agent(node, &ctx.member)?;
    let engines = with_timeout(&node.id, c.list_engines(ListEnginesRequest {})).await?;
    Ok(engines
        .into_inner()
        .engines
        .iter()
        .any(|e| e.volume == name && e.running && !e.handover))
}

/// Stops the volume's engine. When its node is down and cannot be asked,
/// the volume is detached all the same: an engine still running there is
/// fenced out at every replica the volume's next engine opens (its
/// attachment is below theirs), and is stopped once the node is back
/// (`nodes::registry`).
#[tracing::instrument(skip_all, fields(volume = %name))]
pub async fn detach(ctx: &Arc<Context>, name: &str) -> Result<Volume, Error> {
    let _guard = ctx.lock_volume_waiting(name, PATIENCE).await?;
    let volume: Volume = ctx.store.fetch(name).await?;
    let Some(node_id) = volume.status.attached_node.clone() else {
        return Ok(volume);
    };
    let mut left_behind = None;
    if let Some(node) = ctx.store.get::<Node>(&node_id).await? {
        let stopped = async {
            let mut c = agent(&node, &ctx.member)?;
            with_timeout(
                &node_id,
                c.stop_engine(StopEngineRequest {
                    volume: name.to_string(),
                }),
            )
            .await
        }
        .await;
        match stopped {
            Ok(_) => {}
            Err(e) if !node.status.ready => left_behind = Some(e.to_string()),
            Err(e) => return Err(e),
        }
    }
    let volume = ctx
        .store
        .modify::<Volume, Error>(name, |v| {
            v.status.attached_node = None;
            v.status.attached_readonly = false;
            v.status.frontend_endpoint = None;
            v.status.state = VolumeState::Detached;
            v.status.robustness = Robustness::Unknown;
            // The attachment is over: its engine's claim falls behind.
            v.status.engine_epoch += 1;
            Ok(true)
        })
        .await?;
    let fenced = fence_replicas(ctx, &volume).await;
    let why = format!("its engine stopped: volume {name} detached from {node_id}");
    interrupt_rebuilds(ctx, name, &why).await;
    let message = match left_behind {
        None => format!("detached from {node_id}"),
        Some(why) => format!(
            "detached from {node_id}, which is down ({why}): an engine still running there is fenced out at {fenced} of {} current replicas, and at every other one the next engine opens, and stopped when the node is back",
            volume.status.current_replicas.len()
        ),
    };
    ctx.event(Kind::Volume, name, "VolumeDetached", message)
        .await;
    Ok(volume)
}

/// Raises the engine fence of each of `volume`'s current replicas on a
/// ready node to its engine epoch, so that the engine of the attachment
/// that ended changes none of them from now on, not only once the next
/// engine opens them. A replica that cannot be reached now keeps its
/// fence until then. Returns how many were fenced.
async fn fence_replicas(ctx: &Arc<Context>, volume: &Volume) -> usize {
    let epoch = volume.status.engine_epoch;
    let mut fenced = 0;
    for name in &volume.status.current_replicas {
        let done = async {
            let replica: Replica = ctx.store.fetch(name).await?;
            let node: Node = ctx.store.fetch(&replica.spec.node_id).await?;
            if !node.status.ready {
                return Err(Error::Unavailable(format!("node {} is down", node.id)));
            }
            crate::agents::fence_replica(&node, &ctx.member, name, epoch).await
        }
        .await;
        match done {
            Ok(_) => fenced += 1,
            Err(e) => {
                tracing::warn!(volume = %volume.name, replica = %name, error = %e, "replica not fenced at detach; the next engine fences it")
            }
        }
    }
    fenced
}

/// Grows a detached volume to `size` bytes, in two phases. First the
/// growth is checked against every replica's disk by the capacity rules of
/// placement (422 `no_room` with the reasons); then every replica grows on
/// its node; only then is the new size recorded. When a replica cannot
/// grow, the ones that did are taken back to the old size, and the volume
/// is left exactly as it was.
#[tracing::instrument(skip_all, fields(volume = %name, size))]
pub async fn expand(ctx: &Arc<Context>, name: &str, size: u64) -> Result<Volume, Error> {
    let why = format!("volume {name} is being expanded");
    let _guard = ctx
        .lock_volume_calling_off_copies(name, &why, PATIENCE)
        .await?;
    let volume: Volume = ctx.store.fetch(name).await?;
    let mut grown = volume.spec.clone();
    grown.size = size;
    crate::volumes::validate_spec(&grown)?;
    let from = volume.spec.size;
    if size < from {
        return Err(Error::OutOfRange {
            field: "size".into(),
            message: format!("{size} is below the volume's {from} bytes; volumes never shrink"),
        });
    }
    if size == from {
        return Ok(volume);
    }
    let view = observe::current_view(ctx).await?;
    planner::growth::check(
        &view,
        &ctx.settings().await?,
        ctx.now(),
        &observe::volume_view(&volume),
        size,
    )
    .map_err(|reasons| {
        Error::NoRoom(format!(
            "cannot grow {name} from {} to {}: {}",
            ballast::quantity::format_size(from),
            ballast::quantity::format_size(size),
            reasons.join("; ")
        ))
    })?;
    let replicas: Vec<Replica> = ctx
        .store
        .list::<Replica>()
        .await?
        .into_iter()
        .filter(|r| r.spec.volume == name)
        .collect();
    match &volume.status.attached_node {
        Some(node) => grow_online(ctx, &volume, node, &replicas, size).await?,
        None => grow_offline(ctx, &replicas, from, size).await?,
    }
    let volume = ctx
        .store
        .modify::<Volume, Error>(name, |v| {
            v.spec.size = size;
            Ok(true)
        })
        .await?;
    ctx.event(
        Kind::Volume,
        name,
        "VolumeExpanded",
        format!(
            "from {} to {}{}",
            ballast::quantity::format_size(from),
            ballast::quantity::format_size(size),
            if volume.status.attached_node.is_some() {
                " while attached"
            } else {
                ""
            }
        ),
    )
    .await;
    Ok(volume)
}

/// Grows an attached volume: its engine grows every rw replica it serves
/// (I/O paused) and then answers the new size; the replicas it does not
/// serve (failed ones) grow on their nodes where they can (else they are
/// replaced, as any failed replica). Refused while a replica is rebuilt.
async fn grow_online(
    ctx: &Context,
    volume: &Volume,
    node_id: &str,
    replicas: &[Replica],
    size: u64,
) -> Result<(), Error> {
    if replicas
        .iter()
        .any(|r| r.status.mode == Some(ballast::model::ReplicaMode::Wo))
    {
        return Err(Error::Conflict(format!(
            "volume {:?} has a replica being rebuilt; it grows once the rebuild ends",
            volume.name
        )));
    }
    let node: Node = ctx.store.fetch(node_id).await?;
    // The engine first gives up a replica that does not answer within the
    // replica timeout (up to 30 s), then pauses I/O: bounded by
    // `PAUSE_TIMEOUT`, not cut at an agent call's 10 s while it goes on.
    let request = ballast::proto::agent::v1::GrowEngineRequest {
        volume: volume.name.clone(),
        size,
    };
    crate::agents::long_call(
        &node,
        &ctx.member,
        crate::agents::PAUSE_TIMEOUT,
        |mut c| async move { c.grow_engine(request).await },
    )
    .await?;
    for r in replicas
        .iter()
        .filter(|r| r.status.mode != Some(ballast::model::ReplicaMode::Rw))
    {
        if let Err(e) = grow_on_node(ctx, r, size).await {
            tracing::info!(replica = %r.name, error = %e, "a replica the engine does not serve did not grow; it will be replaced");
        }
    }
    Ok(())
}

/// Grows a detached volume's replicas on their nodes, all or none: a
/// failure takes the grown ones back.
async fn grow_offline(
    ctx: &Context,
    replicas: &[Replica],
    from: u64,
    size: u64,
) -> Result<(), Error> {
    let mut done: Vec<&Replica> = Vec::new();
    for r in replicas {
        match grow_on_node(ctx, r, size).await {
            Ok(()) => done.push(r),
            // Its data is gone: it is replaced like any lost replica.
            Err(Error::NotFound { .. } | Error::NotOnNode(_)) => {
                tracing::warn!(replica = %r.name, "no data to grow on its node");
            }
            Err(e) => {
                for g in done {
                    if let Err(undo) = grow_on_node(ctx, g, from).await {
                        tracing::error!(replica = %g.name, error = %undo, "cannot take a grown replica back to the volume's size; the engine will refuse it and it will be rebuilt");
                    }
                }
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Sets one replica's size on its node (a smaller size undoes a growth).
async fn grow_on_node(ctx: &Context, r: &Replica, size: u64) -> Result<(), Error> {
    let node: Node = ctx.store.fetch(&r.spec.node_id).await?;
    let mut c = agent(&node, &ctx.member)?;
    with_timeout(
        &node.id,
        c.grow_replica(GrowReplicaRequest {
            name: r.name.clone(),
            size,
        }),
    )
    .await
    .map(drop)
}

/// Refuses to publish one more volume at `node` when it holds its limit
/// (`--max-volumes-per-node`) already.
async fn within_limit(ctx: &Context, node: &Node, volume: &str) -> Result<(), Error> {
    let limit = node.status.max_volumes;
    if limit == 0 {
        return Ok(());
    }
    // A whole read of the volumes, not the controller's copy: the copy of
    // a Kubernetes store can be a watch event behind, and an attach just
    // made at this node must count.
    let published = ctx
        .store
        .list::<Volume>()
        .await?
        .into_iter()
        .filter(|v| v.name != volume && v.status.attached_node.as_deref() == Some(node.id.as_str()))
        .count();
    if published >= limit as usize {
        return Err(Error::NoRoom(format!(
            "node {} has {published} volumes published, its limit (--max-volumes-per-node {limit})",
            node.id
        )));
    }
    Ok(())
}
