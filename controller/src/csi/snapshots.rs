//! CSI snapshots: CreateSnapshot, DeleteSnapshot, ListSnapshots and
//! GetSnapshot, and
//! the volume content source of CreateVolume (a restore or a clone). They
//! validate and translate; the executor takes and restores snapshots.

use std::sync::Arc;

use ballast::model::{Snapshot, Volume, VolumeSource};
use ballast::proto::csi::v1 as csi;
use ballast::proto::csi::v1::volume_content_source::Type as SourceType;
use ballast::proto::csi::v1::{
    CreateSnapshotRequest, DeleteSnapshotRequest, GetSnapshotRequest, ListSnapshotsRequest,
    ListSnapshotsResponse, VolumeContentSource, list_snapshots_response::Entry,
};

use super::ids::{check_name, id_for, page};
use crate::context::Context;
use crate::error::Error;
use crate::executor::snapshot::{self as executor, NewSnapshot};

/// What CSI reports of a snapshot.
fn csi_snapshot(s: &Snapshot) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: i64::try_from(s.status.size).unwrap_or(i64::MAX),
        snapshot_id: s.name.clone(),
        source_volume_id: s.spec.volume.clone(),
        creation_time: s.status.created_at.map(|t| prost_types::Timestamp {
            seconds: t.timestamp(),
            nanos: t.timestamp_subsec_nanos() as i32,
        }),
        ready_to_use: s.status.ready_to_use,
        ..Default::default()
    }
}

#[tracing::instrument(skip_all, fields(rpc = "CreateSnapshot", volume = %req.source_volume_id, snapshot = %req.name))]
pub async fn create(
    ctx: &Arc<Context>,
    req: CreateSnapshotRequest,
) -> Result<csi::Snapshot, Error> {
    check_name(&req.name)?;
    if req.source_volume_id.is_empty() {
        return Err(Error::invalid("source_volume_id", "is required"));
    }
    if let Some(key) = req.parameters.keys().next() {
        return Err(Error::invalid(
            "parameters",
            format!("{key:?} is not a snapshot parameter; snapshots take none"),
        ));
    }
    let id = id_for(&req.name);
    if let Some(s) = ctx.store.get::<Snapshot>(&id).await? {
        let owner = s.spec.csi_name.as_deref().unwrap_or(&s.name);
        if owner != req.name || s.spec.volume != req.source_volume_id {
            return Err(Error::AlreadyExists(format!(
                "snapshot id {id:?} belongs to {owner:?}, of volume {:?}",
                s.spec.volume
            )));
        }
    }
    if ctx
        .store
        .get::<Volume>(&req.source_volume_id)
        .await?
        .is_none()
    {
        return Err(Error::NotFound {
            kind: "volume".into(),
            name: req.source_volume_id,
        });
    }
    let new = NewSnapshot {
        name: id,
        volume: req.source_volume_id,
        csi_name: Some(req.name),
        internal: false,
    };
    executor::create(ctx, new).await.map(|s| csi_snapshot(&s))
}

#[tracing::instrument(skip_all, fields(rpc = "DeleteSnapshot", snapshot = %req.snapshot_id))]
pub async fn delete(ctx: &Arc<Context>, req: DeleteSnapshotRequest) -> Result<(), Error> {
    if req.snapshot_id.is_empty() {
        return Err(Error::invalid("snapshot_id", "is required"));
    }
    executor::delete(ctx, &req.snapshot_id).await
}

#[tracing::instrument(skip_all, fields(rpc = "ListSnapshots"))]
pub async fn list(
    ctx: &Context,
    req: ListSnapshotsRequest,
) -> Result<ListSnapshotsResponse, Error> {
    let mut all: Vec<Snapshot> = ctx
        .store
        .list::<Snapshot>()
        .await?
        .into_iter()
        .filter(|s| !s.spec.internal)
        .filter(|s| req.snapshot_id.is_empty() || s.name == req.snapshot_id)
        .filter(|s| req.source_volume_id.is_empty() || s.spec.volume == req.source_volume_id)
        .collect();
    all.sort_by(|a, b| a.name.cmp(&b.name));
    let (entries, next_token) = page(&all, req.max_entries, &req.starting_token)?;
    Ok(ListSnapshotsResponse {
        entries: entries
            .iter()
            .map(|s| Entry {
                snapshot: Some(csi_snapshot(s)),
            })
            .collect(),
        next_token,
    })
}

#[tracing::instrument(skip_all, fields(rpc = "GetSnapshot", snapshot = %req.snapshot_id))]
pub async fn get(ctx: &Context, req: GetSnapshotRequest) -> Result<csi::Snapshot, Error> {
    if req.snapshot_id.is_empty() {
        return Err(Error::invalid("snapshot_id", "is required"));
    }
    match ctx.store.get::<Snapshot>(&req.snapshot_id).await? {
        Some(s) if !s.spec.internal => Ok(csi_snapshot(&s)),
        _ => Err(Error::NotFound {
            kind: "snapshot".into(),
            name: req.snapshot_id,
        }),
    }
}

/// The volume source a CreateVolume's content source asks for. A source
/// that does not exist is NOT_FOUND, as the spec asks.
pub async fn source_of(
    ctx: &Context,
    source: Option<&VolumeContentSource>,
) -> Result<Option<VolumeSource>, Error> {
    let Some(source) = source else {
        return Ok(None);
    };
    match &source.r#type {
        Some(SourceType::Snapshot(s)) => {
            let snapshot = ctx.store.get::<Snapshot>(&s.snapshot_id).await?;
            if snapshot.filter(|s| !s.spec.internal).is_none() {
                return Err(Error::NotFound {
                    kind: "snapshot".into(),
                    name: s.snapshot_id.clone(),
                });
            }
            Ok(Some(VolumeSource {
                snapshot: Some(s.snapshot_id.clone()),
                volume: None,
            }))
        }
        Some(SourceType::Volume(v)) => {
            if ctx.store.get::<Volume>(&v.volume_id).await?.is_none() {
                return Err(Error::NotFound {
                    kind: "volume".into(),
                    name: v.volume_id.clone(),
                });
            }
            Ok(Some(VolumeSource {
                snapshot: None,
                volume: Some(v.volume_id.clone()),
            }))
        }
        None => Err(Error::invalid(
            "volume_content_source",
            "names neither a snapshot nor a volume",
        )),
    }
}

/// The content source CSI reports for a volume made from one.
pub fn content_source(v: &Volume) -> Option<VolumeContentSource> {
    let s = v.spec.source.as_ref()?;
    let r#type = match (&s.snapshot, &s.volume) {
        (Some(id), _) => SourceType::Snapshot(csi::volume_content_source::SnapshotSource {
            snapshot_id: id.clone(),
        }),
        (None, Some(id)) => SourceType::Volume(csi::volume_content_source::VolumeSource {
            volume_id: id.clone(),
        }),
        (None, None) => return None,
    };
    Some(VolumeContentSource {
        r#type: Some(r#type),
    })
}
