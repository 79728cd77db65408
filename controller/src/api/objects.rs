//! Replicas and events: listed with filters.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use ballast::model::{Event, Replica};
use serde::Deserialize;
use serde_json::{Value, json};

use super::body::QueryArgs;
use crate::context::Context;
use crate::error::Error;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaFilter {
    volume: Option<String>,
    node: Option<String>,
}

pub async fn list_replicas(
    State(ctx): State<Arc<Context>>,
    QueryArgs(f): QueryArgs<ReplicaFilter>,
) -> Result<Json<Value>, Error> {
    let items: Vec<Replica> = ctx
        .store
        .list::<Replica>()
        .await?
        .into_iter()
        .filter(|r| f.volume.as_ref().is_none_or(|v| &r.spec.volume == v))
        .filter(|r| f.node.as_ref().is_none_or(|n| &r.spec.node_id == n))
        .collect();
    Ok(Json(json!({ "items": items })))
}

#[tracing::instrument(skip_all, fields(replica = %name))]
pub async fn delete_replica(
    State(ctx): State<Arc<Context>>,
    Path(name): Path<String>,
) -> Result<StatusCode, Error> {
    crate::executor::delete_replica(&ctx, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Scrubs a replica now: `{"sound": bool}` (a corrupt one is failed).
#[tracing::instrument(skip_all, fields(replica = %name))]
pub async fn scrub_replica(
    State(ctx): State<Arc<Context>>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, Error> {
    let sound = crate::executor::scrub_now(&ctx, &name).await?;
    Ok(Json(json!({ "replica": name, "sound": sound })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventFilter {
    object: Option<String>,
}

pub async fn list_events(
    State(ctx): State<Arc<Context>>,
    QueryArgs(f): QueryArgs<EventFilter>,
) -> Result<Json<Value>, Error> {
    let items: Vec<Event> = ctx
        .store
        .list::<Event>()
        .await?
        .into_iter()
        .filter(|e| f.object.as_ref().is_none_or(|o| &e.object == o))
        .collect();
    Ok(Json(json!({ "items": items })))
}
