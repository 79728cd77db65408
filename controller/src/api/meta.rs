//! healthz, metrics, the OpenAPI document, and the answer for unknown paths.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::IntoResponse;
use ballast::model::{Node, Replica, Volume};
use serde_json::{Value, json};

use super::ROUTES;
use crate::context::Context;
use crate::error::Error;

pub async fn healthz(State(ctx): State<Arc<Context>>) -> Result<Json<Value>, Error> {
    // A store that cannot be read is not healthy.
    ctx.store.list_raw(ballast::model::Kind::Setting).await?;
    Ok(Json(json!({ "status": "ok", "version": ballast::VERSION })))
}

pub async fn metrics(State(ctx): State<Arc<Context>>) -> Result<impl IntoResponse, Error> {
    let nodes: Vec<Node> = ctx.store.list().await?;
    let volumes: Vec<Volume> = ctx.store.list().await?;
    let replicas: Vec<Replica> = ctx.store.list().await?;
    let mut out = String::new();
    let ready = nodes.iter().filter(|n| n.status.ready).count();
    let _ = writeln!(
        out,
        "# HELP ballast_nodes Nodes known to the controller, by readiness."
    );
    let _ = writeln!(out, "# TYPE ballast_nodes gauge");
    let _ = writeln!(out, "ballast_nodes{{ready=\"true\"}} {ready}");
    let _ = writeln!(
        out,
        "ballast_nodes{{ready=\"false\"}} {}",
        nodes.len() - ready
    );
    let mut by_robustness: BTreeMap<&str, usize> = BTreeMap::new();
    for v in &volumes {
        *by_robustness
            .entry(v.status.robustness.as_str())
            .or_default() += 1;
    }
    let _ = writeln!(out, "# HELP ballast_volumes Volumes, by robustness.");
    let _ = writeln!(out, "# TYPE ballast_volumes gauge");
    for r in ballast::model::Robustness::ALL {
        let n = by_robustness.get(r.as_str()).copied().unwrap_or(0);
        let _ = writeln!(out, "ballast_volumes{{robustness=\"{r}\"}} {n}");
    }
    let _ = writeln!(out, "# HELP ballast_replicas Replica records.");
    let _ = writeln!(out, "# TYPE ballast_replicas gauge");
    let _ = writeln!(out, "ballast_replicas {}", replicas.len());
    for (metric, help) in [
        (
            "ballast_disk_storage_maximum_bytes",
            "Size of each disk's filesystem.",
        ),
        (
            "ballast_disk_storage_available_bytes",
            "Free bytes of each disk's filesystem.",
        ),
    ] {
        let _ = writeln!(out, "# HELP {metric} {help}");
        let _ = writeln!(out, "# TYPE {metric} gauge");
        for n in &nodes {
            for (id, d) in &n.status.disks {
                let v = if metric.contains("maximum") {
                    d.storage_maximum
                } else {
                    d.storage_available
                };
                let _ = writeln!(out, "{metric}{{node=\"{}\",disk=\"{id}\"}} {v}", n.id);
            }
        }
    }
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out))
}

/// The OpenAPI 3 document, made from [`ROUTES`].
pub fn openapi() -> Value {
    let error = json!({
        "description": "error",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    });
    let mut paths = serde_json::Map::new();
    for (method, path, summary) in ROUTES {
        let params: Vec<Value> = path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(|p| json!({"name": p, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        let entry = paths.entry(path.to_string()).or_insert_with(|| json!({}));
        entry[*method] = json!({
            "summary": summary,
            "parameters": params,
            "responses": {
                "200": {"description": "ok", "content": {"application/json": {}}},
                "400": error, "404": error, "409": error, "422": error
            }
        });
    }
    json!({
        "openapi": "3.0.3",
        "info": {"title": "Ballast API", "version": ballast::VERSION},
        "paths": paths,
        "components": {"schemas": {"Error": {
            "type": "object",
            "required": ["error", "code"],
            "properties": {"error": {"type": "string"}, "code": {"type": "string"}}
        }}}
    })
}

pub async fn openapi_handler() -> Json<Value> {
    Json(openapi())
}

pub async fn no_route(uri: Uri) -> impl IntoResponse {
    (
        StatusCode::NOT_FOUND,
        Json(json!({"error": format!("no such path: {}", uri.path()), "code": "not_found"})),
    )
}
