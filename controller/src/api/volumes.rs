//! `/v1/volumes`: create, list, read, patch, attach, detach, expand,
//! salvage and delete volumes. Validation is `crate::volumes`'; the work
//! is the executor's.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use ballast::api::{ReplicaSummary, VolumeDetail};
use ballast::model::{Replica, Volume};
use serde_json::{Value, json};

use super::body::Body;
use crate::context::Context;
use crate::error::Error;
use crate::volumes::{self, CreateVolume, PatchVolume};

pub async fn list(State(ctx): State<Arc<Context>>) -> Result<Json<Value>, Error> {
    let items: Vec<Volume> = ctx.store.list().await?;
    Ok(Json(json!({ "items": items })))
}

/// The volume with `status.replicas`: a summary of its replica records.
async fn with_replicas(ctx: &Context, volume: &Volume) -> Result<Value, Error> {
    let replicas = ctx
        .store
        .list::<Replica>()
        .await?
        .into_iter()
        .filter(|r| r.spec.volume == volume.name)
        .map(|r| ReplicaSummary {
            name: r.name,
            node_id: r.spec.node_id,
            disk_id: r.spec.disk_id,
            mode: r.status.mode,
            running: r.status.running,
            rebuild_progress: r.status.rebuild_progress,
        })
        .collect();
    VolumeDetail {
        volume: volume.clone(),
        replicas,
    }
    .to_json()
    .map_err(|e| Error::Internal(e.to_string()))
}

#[tracing::instrument(skip_all, fields(volume = %name))]
pub async fn get_one(
    State(ctx): State<Arc<Context>>,
    Path(name): Path<String>,
) -> Result<Json<Value>, Error> {
    let volume: Volume = ctx.store.fetch(&name).await?;
    Ok(Json(with_replicas(&ctx, &volume).await?))
}

/// Places the replicas with the planner and creates them on their nodes;
/// 422 with the planner's reasons when they do not fit.
#[tracing::instrument(skip_all, fields(volume = %req.name))]
pub async fn create(
    State(ctx): State<Arc<Context>>,
    Body(req): Body<CreateVolume>,
) -> Result<(StatusCode, Json<Volume>), Error> {
    let volume = volumes::build(req, &ctx.settings().await?)?;
    let created = crate::executor::create(&ctx, volume).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AttachVolume {
    node_id: String,
}

#[tracing::instrument(skip_all, fields(volume = %name))]
pub async fn attach(
    State(ctx): State<Arc<Context>>,
    Path(name): Path<String>,
    Body(req): Body<AttachVolume>,
) -> Result<Json<Volume>, Error> {
    Ok(Json(
        crate::executor::attach(&ctx, &name, &req.node_id).await?,
    ))
}

#[tracing::instrument(skip_all, fields(volume = %name))]
pub async fn detach(
    State(ctx): State<Arc<Context>>,
    Path(name): Path<String>,
) -> Result<Json<Volume>, Error> {
    Ok(Json(crate::executor::detach(&ctx, &name).await?))
}

#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExpandVolume {
    #[serde(with = "ballast::quantity::serde_size")]
    size: u64,
}

/// Grows a detached volume; 422 while attached, 400 for a size that is
/// smaller or not a multiple of 4 KiB.
#[tracing::instrument(skip_all, fields(volume = %name))]
pub async fn expand(
    State(ctx): State<Arc<Context>>,
    Path(name): Path<String>,
    Body(req): Body<ExpandVolume>,
) -> Result<Json<Volume>, Error> {
    Ok(Json(crate::executor::expand(&ctx, &name, req.size).await?))
}

#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SalvageVolume {
    replica: String,
    #[serde(default)]
    force: bool,
}

/// Makes one replica the volume's data, knowingly losing what only the
/// others held; 422 while a replica with the latest data is reachable.
#[tracing::instrument(skip_all, fields(volume = %name))]
pub async fn salvage(
    State(ctx): State<Arc<Context>>,
    Path(name): Path<String>,
    Body(req): Body<SalvageVolume>,
) -> Result<Json<Volume>, Error> {
    let _guard = ctx
        .lock_volume_waiting(&name, std::time::Duration::from_secs(30))
        .await?;
    Ok(Json(
        crate::freshness::salvage(&ctx, &name, &req.replica, req.force).await?,
    ))
}

#[tracing::instrument(skip_all, fields(volume = %name))]
pub async fn patch(
    State(ctx): State<Arc<Context>>,
    Path(name): Path<String>,
    Body(patch): Body<PatchVolume>,
) -> Result<Json<Volume>, Error> {
    let updated = ctx
        .store
        .modify::<Volume, Error>(&name, |v| {
            volumes::apply_patch(v, &patch)?;
            Ok(true)
        })
        .await?;
    Ok(Json(updated))
}

#[tracing::instrument(skip_all, fields(volume = %name))]
pub async fn delete(
    State(ctx): State<Arc<Context>>,
    Path(name): Path<String>,
) -> Result<StatusCode, Error> {
    crate::executor::delete(&ctx, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}
