use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use ballast::model::{Kind, Replica, Volume};
use ballast::store::StoreExt;
use serde_json::{Value, json};

use super::body::Body;
use crate::context::Context;
use crate::error::Error;
use crate::volumes::{self, CreateVolume, PatchVolume};

pub async fn list(State(ctx): State<Arc<Context>>) -> Result<Json<Value>, Error> {
    let items: Vec<Volume> = ctx.store.list()?;
    Ok(Json(json!({ "items": items })))
}

/// The volume with `status.replicas`: a summary of its replica records.
fn with_replicas(ctx: &Context, volume: &Volume) -> Result<Value, Error> {
    let replicas: Vec<Value> = ctx
        .store
        .list::<Replica>()?
        .into_iter()
        .filter(|r| r.spec.volume == volume.name)
        .map(|r| {
            json!({
                "name": r.name, "nodeId": r.spec.node_id, "diskId": r.spec.disk_id,
                "mode": r.status.mode, "running": r.status.running,
            })
        })
        .collect();
    let mut v = serde_json::to_value(volume).map_err(|e| Error::Internal(e.to_string()))?;
    v["status"]["replicas"] = Value::Array(replicas);
    Ok(v)
}

#[tracing::instrument(skip_all, fields(volume = %name))]
pub async fn get_one(
    State(ctx): State<Arc<Context>>,
    Path(name): Path<String>,
) -> Result<Json<Value>, Error> {
    let volume: Volume = ctx.store.fetch(&name)?;
    Ok(Json(with_replicas(&ctx, &volume)?))
}

#[tracing::instrument(skip_all, fields(volume = %req.name))]
pub async fn create(
    State(ctx): State<Arc<Context>>,
    Body(req): Body<CreateVolume>,
) -> Result<(StatusCode, Json<Volume>), Error> {
    let volume = volumes::build(req, &ctx.settings()?)?;
    let created = ctx.store.create(&volume)?;
    ctx.event(
        Kind::Volume,
        &created.name,
        "VolumeCreated",
        format!(
            "volume of {} with {} replica(s)",
            ballast::quantity::format_size(created.spec.size),
            created.spec.number_of_replicas
        ),
    );
    Ok((StatusCode::CREATED, Json(created)))
}

#[tracing::instrument(skip_all, fields(volume = %name))]
pub async fn patch(
    State(ctx): State<Arc<Context>>,
    Path(name): Path<String>,
    Body(patch): Body<PatchVolume>,
) -> Result<Json<Volume>, Error> {
    let updated = ctx.store.modify::<Volume, Error>(&name, |v| {
        volumes::apply_patch(v, &patch)?;
        Ok(true)
    })?;
    Ok(Json(updated))
}

#[tracing::instrument(skip_all, fields(volume = %name))]
pub async fn delete(
    State(ctx): State<Arc<Context>>,
    Path(name): Path<String>,
) -> Result<StatusCode, Error> {
    let volume: Volume = ctx.store.fetch(&name)?;
    if let Some(node) = &volume.status.attached_node {
        return Err(Error::Conflict(format!(
            "volume {name:?} is attached to {node}; detach it first"
        )));
    }
    for r in ctx.store.list::<Replica>()? {
        if r.spec.volume == name {
            ctx.store.delete::<Replica>(&r.name, None)?;
        }
    }
    ctx.store.delete::<Volume>(&name, None)?;
    ctx.event(Kind::Volume, &name, "VolumeDeleted", "volume deleted");
    Ok(StatusCode::NO_CONTENT)
}
