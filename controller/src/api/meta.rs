//! healthz, metrics, the OpenAPI document, and the answer for unknown paths.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::IntoResponse;
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
    let text = crate::metrics::render(&ctx).await?;
    Ok(([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text))
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
