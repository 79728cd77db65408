//! `/v1/snapshots`: take, list, read and delete snapshots of volumes. A
//! volume is restored from one, or cloned, by `POST /v1/volumes` with a
//! `source`. The work is the executor's.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use ballast::model::Snapshot;
use serde_json::{Value, json};

use super::body::Body;
use crate::context::Context;
use crate::error::Error;
use crate::executor::snapshot::{self as executor, NewSnapshot};

#[derive(Debug, Default, serde::Deserialize)]
pub struct Filter {
    volume: Option<String>,
}

/// User snapshots (not a clone's own), optionally of one volume.
pub async fn list(
    State(ctx): State<Arc<Context>>,
    Query(filter): Query<Filter>,
) -> Result<Json<Value>, Error> {
    let mut items: Vec<Snapshot> = ctx
        .store
        .list::<Snapshot>()
        .await?
        .into_iter()
        .filter(|s| !s.spec.internal)
        .filter(|s| filter.volume.as_ref().is_none_or(|v| &s.spec.volume == v))
        .collect();
    items.sort_by(|a, b| (a.status.created_at, &a.name).cmp(&(b.status.created_at, &b.name)));
    Ok(Json(json!({ "items": items })))
}

#[tracing::instrument(skip_all, fields(snapshot = %name))]
pub async fn get_one(
    State(ctx): State<Arc<Context>>,
    Path(name): Path<String>,
) -> Result<Json<Snapshot>, Error> {
    Ok(Json(ctx.store.fetch(&name).await?))
}

/// `POST /v1/snapshots`.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateSnapshot {
    name: String,
    volume: String,
}

/// Takes the snapshot now: 201 once every replica holds it.
#[tracing::instrument(skip_all, fields(snapshot = %req.name, volume = %req.volume))]
pub async fn create(
    State(ctx): State<Arc<Context>>,
    Body(req): Body<CreateSnapshot>,
) -> Result<(StatusCode, Json<Snapshot>), Error> {
    ballast::model::validate_name(&req.volume).map_err(|m| Error::invalid("volume", m))?;
    let new = NewSnapshot {
        name: req.name,
        volume: req.volume,
        csi_name: None,
        internal: false,
    };
    Ok((
        StatusCode::CREATED,
        Json(executor::create(&ctx, new).await?),
    ))
}

#[tracing::instrument(skip_all, fields(snapshot = %name))]
pub async fn delete(
    State(ctx): State<Arc<Context>>,
    Path(name): Path<String>,
) -> Result<StatusCode, Error> {
    ctx.store.fetch::<Snapshot>(&name).await?;
    executor::delete(&ctx, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}
