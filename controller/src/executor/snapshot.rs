//! Snapshots and restores through the node agents. A snapshot is taken
//! with the volume's guard held: through its engine when the volume is
//! attached (I/O paused, every rw replica frozen at one point), else on
//! each current replica (a detached volume takes no writes, so each
//! freezes the same data). Its record is written first, not ready, and
//! made ready once every replica took it. A restore fills each replica of
//! a new volume from a replica of the source volume holding the snapshot,
//! on the same node first (a local copy).

use std::sync::Arc;

use ballast::model::{Kind, Node, Replica, Snapshot, SnapshotSpec, SnapshotStatus, Volume};
use ballast::proto::agent::v1::{
    RestoreReplicaRequest, SnapshotReplicaRequest, SnapshotVolumeRequest,
};

use crate::agents::freezing;
use crate::context::Context;
use crate::error::Error;

/// How long a snapshot call waits for another call on the volume.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// What to take: a snapshot called `name` of `volume`.
pub struct NewSnapshot {
    pub name: String,
    pub volume: String,
    pub csi_name: Option<String>,
    /// Made for a clone: not counted against `snapshot-max-count`.
    pub internal: bool,
}

/// Takes a snapshot of a volume (idempotent: the same name and volume
/// answer the snapshot already taken).
#[tracing::instrument(skip_all, fields(volume = %new.volume, snapshot = %new.name))]
pub async fn create(ctx: &Arc<Context>, new: NewSnapshot) -> Result<Snapshot, Error> {
    ballast::model::validate_name(&new.name).map_err(|m| Error::invalid("name", m))?;
    let why = format!("a snapshot of volume {} is being taken", new.volume);
    let _guard = ctx
        .lock_volume_calling_off_copies(&new.volume, &why, PATIENCE)
        .await?;
    if let Some(s) = ctx.store.get::<Snapshot>(&new.name).await? {
        if s.spec.volume != new.volume {
            return Err(Error::AlreadyExists(format!(
                "snapshot {:?} exists, of volume {:?}",
                s.name, s.spec.volume
            )));
        }
        if s.status.ready_to_use {
            return Ok(s);
        }
    }
    let volume: Volume = ctx.store.fetch(&new.volume).await?;
    if volume.status.state == ballast::model::VolumeState::Creating {
        return Err(Error::Conflict(format!(
            "volume {:?} is still being created",
            volume.name
        )));
    }
    let all: Vec<Snapshot> = ctx.store.list().await?;
    let max = ctx.settings().await?.snapshot_max_count();
    let user = all
        .iter()
        .filter(|s| s.spec.volume == new.volume && !s.spec.internal && s.name != new.name)
        .count();
    if !new.internal && user >= max {
        return Err(Error::Unprocessable(format!(
            "volume {:?} has {user} snapshots, the most setting {} allows; delete one first",
            new.volume,
            ballast::settings::SNAPSHOT_MAX_COUNT
        )));
    }
    // Intent first: the record exists, not ready, before any replica
    // takes the snapshot.
    let record = match ctx.store.get::<Snapshot>(&new.name).await? {
        Some(s) => s,
        None => {
            ctx.store
                .create(&Snapshot {
                    name: new.name.clone(),
                    resource_version: 0,
                    spec: SnapshotSpec {
                        volume: new.volume.clone(),
                        csi_name: new.csi_name.clone(),
                        internal: new.internal,
                    },
                    status: SnapshotStatus {
                        ready_to_use: false,
                        size: volume.spec.size,
                        created_at: Some(ctx.now()),
                        allocated: None,
                    },
                })
                .await?
        }
    };
    let taken = match &volume.status.attached_node {
        Some(node) => through_engine(ctx, &volume, node, &record.name).await,
        None => on_each_replica(ctx, &volume, &record.name).await,
    };
    let allocated = match taken {
        Ok(a) => a,
        Err(e) => {
            // Replicas that took it keep a labelled layer, which no record
            // names: a restore never finds it, and a merge may fold it.
            let _ = ctx.store.delete::<Snapshot>(&record.name, None).await;
            return Err(e);
        }
    };
    let snapshot = ctx
        .store
        .modify::<Snapshot, Error>(&record.name, |s| {
            s.status.ready_to_use = true;
            s.status.allocated = allocated;
            Ok(true)
        })
        .await?;
    if !new.internal {
        ctx.event(
            Kind::Snapshot,
            &snapshot.name,
            "SnapshotCreated",
            format!(
                "of volume {} ({})",
                snapshot.spec.volume,
                ballast::quantity::format_size(snapshot.status.size)
            ),
        )
        .await;
    }
    Ok(snapshot)
}

/// The attached volume's engine takes it.
async fn through_engine(
    ctx: &Context,
    volume: &Volume,
    node_id: &str,
    id: &str,
) -> Result<Option<u64>, Error> {
    let node: Node = ctx.store.fetch(node_id).await?;
    let request = SnapshotVolumeRequest {
        volume: volume.name.clone(),
        snapshot: id.to_string(),
    };
    // The engine freezes every rw replica's head: as long as that takes
    // (see `freezing`), not an agent call's 10 s.
    let size = volume.spec.size;
    match freezing(&node, &ctx.member, size, |mut c| async move {
        c.snapshot_volume(request).await
    })
    .await
    {
        Ok(_) => Ok(None),
        // The volume is there; its engine is not, for now (it stopped, and
        // its node starts it again).
        Err(Error::NotOnNode(_)) => Err(Error::Unavailable(format!(
            "volume {} is attached at node {node_id}, but its engine is not running there now; try again once it is",
            volume.name
        ))),
        Err(e) => Err(e),
    }
}

/// Each current replica of the detached volume takes it; every one must.
async fn on_each_replica(ctx: &Context, volume: &Volume, id: &str) -> Result<Option<u64>, Error> {
    let replicas = crate::freshness::current_records(ctx, volume).await?;
    if replicas.is_empty() {
        return Err(Error::Unprocessable(format!(
            "volume {:?} has no replica holding its data",
            volume.name
        )));
    }
    let mut allocated = 0;
    for r in replicas {
        let node: Node = ctx.store.fetch(&r.spec.node_id).await?;
        let request = SnapshotReplicaRequest {
            name: r.name.clone(),
            snapshot: id.to_string(),
        };
        let taken = freezing(&node, &ctx.member, volume.spec.size, |mut c| async move {
            c.snapshot_replica(request).await
        })
        .await
        .map_err(|e| match e {
            Error::Internal(m) | Error::Unprocessable(m) => {
                Error::Unavailable(format!("replica {}: {m}", r.name))
            }
            e => e,
        })?;
        allocated = taken.allocated.max(allocated);
    }
    Ok(Some(allocated))
}

/// Deletes a snapshot's record (idempotent); then its volume's replicas
/// merge its layer away, in the background.
#[tracing::instrument(skip_all, fields(snapshot = %name))]
pub async fn delete(ctx: &Arc<Context>, name: &str) -> Result<(), Error> {
    let Some(s) = ctx.store.get::<Snapshot>(name).await? else {
        return Ok(());
    };
    let _guard = ctx.lock_volume_waiting(&s.spec.volume, PATIENCE).await?;
    match ctx.store.delete::<Snapshot>(name, None).await {
        Ok(()) | Err(ballast::store::StoreError::NotFound { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    if !s.spec.internal {
        ctx.event(
            Kind::Snapshot,
            name,
            "SnapshotDeleted",
            format!("of volume {}", s.spec.volume),
        )
        .await;
    }
    let (ctx, volume) = (ctx.clone(), s.spec.volume);
    tokio::spawn(async move {
        if let Err(e) = super::merge::merge_volume(&ctx, &volume).await {
            tracing::info!(volume = %volume, error = %e, "merging after a snapshot's deletion did not finish; the merge pass goes on");
        }
    });
    Ok(())
}

/// Fills every replica of the new volume `made` with the data of
/// `snapshot` (of `source`), each from a replica of the source holding it:
/// one on the same node first, for a local copy.
pub async fn restore(
    ctx: &Context,
    source: &Volume,
    snapshot: &str,
    made: &[Replica],
) -> Result<(), Error> {
    let holders = crate::freshness::current_records(ctx, source).await?;
    for target in made {
        let mut order: Vec<&Replica> = holders.iter().collect();
        // Same disk, then same node, then the rest.
        order.sort_by_key(|h| {
            (
                h.spec.node_id != target.spec.node_id,
                h.spec.disk_id != target.spec.disk_id,
            )
        });
        let node: Node = ctx.store.fetch(&target.spec.node_id).await?;
        let rate = ctx.settings().await?.offline_copy_rate_bytes();
        let mut failures = Vec::new();
        let mut filled = false;
        for h in order {
            let Some(hn) = ctx.store.get::<Node>(&h.spec.node_id).await? else {
                continue;
            };
            if !hn.status.ready || hn.status.replica_endpoint.is_empty() {
                failures.push(format!("{}: node {} is not ready", h.name, hn.id));
                continue;
            }
            // A restore copies the data: the call lasts as long as the copy,
            // not an agent call's timeout (which cut it at 10 s).
            let request = RestoreReplicaRequest {
                name: target.name.clone(),
                source: format!("{}@{}", h.name, hn.status.replica_endpoint),
                snapshot: snapshot.to_string(),
                bytes_per_second: rate,
            };
            let answer = crate::agents::long_call(
                &node,
                &ctx.member,
                crate::agents::COPY_TIMEOUT,
                |mut c| async move { c.restore_replica(request).await },
            )
            .await;
            match answer {
                Ok(done) => {
                    tracing::info!(replica = %target.name, source = %h.name, bytes = done.copied_bytes, way = %done.copy_path, "replica restored");
                    filled = true;
                    break;
                }
                Err(e) => failures.push(format!("{}: {e}", h.name)),
            }
        }
        if !filled {
            return Err(Error::Unavailable(format!(
                "replica {} could not be filled from snapshot {snapshot}: {}",
                target.name,
                if failures.is_empty() {
                    "the source volume has no replica".to_string()
                } else {
                    failures.join("; ")
                }
            )));
        }
    }
    Ok(())
}
