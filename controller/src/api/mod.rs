//! The REST API (axum): JSON over HTTP on `--api-listen`, as INTERFACES.md
//! §3 lists it. Handlers validate, read or write the store, and answer;
//! errors become HTTP in `error.rs` only.

mod body;
mod error;
pub mod gate;
mod meta;
mod nodes;
mod objects;
mod plan;
pub use plan::PlanView;
mod settings;
mod snapshots;
mod volumes;

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::routing::{get, patch};

use crate::context::Context;
use crate::error::Error;

pub use meta::openapi;

/// Every route, with what it does; the OpenAPI document is made from it.
pub const ROUTES: &[(&str, &str, &str)] = &[
    (
        "get",
        "/healthz",
        "Liveness of the controller and its store",
    ),
    ("get", "/metrics", "Prometheus metrics"),
    ("get", "/openapi.json", "This document"),
    ("get", "/v1/volumes", "List volumes"),
    (
        "post",
        "/v1/volumes",
        "Create a volume: place its replicas and create them on their nodes; with source {snapshot} or {volume}, fill them from that snapshot or a clone of that volume",
    ),
    (
        "get",
        "/v1/volumes/{name}",
        "Get a volume, with a summary of its replicas",
    ),
    (
        "patch",
        "/v1/volumes/{name}",
        "Change numberOfReplicas, dataLocality, replicaAutoBalance or replicaRebuildRate",
    ),
    (
        "delete",
        "/v1/volumes/{name}",
        "Delete a volume and its replicas' data",
    ),
    (
        "post",
        "/v1/volumes/{name}/attach",
        "Start the volume's engine on {nodeId}; sets status.frontendEndpoint",
    ),
    (
        "post",
        "/v1/volumes/{name}/detach",
        "Stop the volume's engine",
    ),
    (
        "post",
        "/v1/volumes/{name}/expand",
        "Grow the volume to {size}, attached (online) or not: every replica grows on its node",
    ),
    (
        "post",
        "/v1/volumes/{name}/salvage",
        "Accept data loss: make {replica} the only replica holding the detached volume's data (force: even if a current one looks reachable)",
    ),
    (
        "get",
        "/v1/replicas",
        "List replicas, optionally ?volume=NAME&node=ID",
    ),
    (
        "delete",
        "/v1/replicas/{name}",
        "Delete a replica: out of its engine, its data, its record",
    ),
    (
        "post",
        "/v1/replicas/{name}/scrub",
        "Check every block of the replica's frozen layers against its checksums now; a corrupt replica is failed and rebuilt",
    ),
    (
        "get",
        "/v1/snapshots",
        "List snapshots, optionally ?volume=NAME",
    ),
    (
        "post",
        "/v1/snapshots",
        "Take snapshot {name} of {volume}: every replica frozen at one point",
    ),
    ("get", "/v1/snapshots/{name}", "Get a snapshot"),
    ("delete", "/v1/snapshots/{name}", "Delete a snapshot"),
    ("get", "/v1/nodes", "List nodes"),
    ("get", "/v1/nodes/{id}", "Get a node"),
    (
        "patch",
        "/v1/nodes/{id}",
        "Change allowScheduling, evictionRequested, zone, tags or cordoned",
    ),
    (
        "patch",
        "/v1/nodes/{id}/disks/{diskId}",
        "Change a disk's allowScheduling, evictionRequested, storageReserved or tags",
    ),
    (
        "get",
        "/v1/settings",
        "List settings with values, defaults and descriptions",
    ),
    ("get", "/v1/settings/{name}", "Get a setting"),
    ("put", "/v1/settings/{name}", "Set a setting's value"),
    (
        "get",
        "/v1/events",
        "List events, optionally ?object=KIND/NAME",
    ),
];

/// The router with every route of [`ROUTES`], asking no token.
pub fn router(ctx: Arc<Context>) -> Router {
    router_with(ctx, gate::Gate::default())
}

/// The router with every route of [`ROUTES`], its changes behind `gate`.
pub fn router_with(ctx: Arc<Context>, gate: gate::Gate) -> Router {
    Router::new()
        .route("/healthz", get(meta::healthz))
        .route("/metrics", get(meta::metrics))
        .route("/openapi.json", get(meta::openapi_handler))
        .route("/v1/volumes", get(volumes::list).post(volumes::create))
        .route(
            "/v1/volumes/{name}",
            get(volumes::get_one)
                .patch(volumes::patch)
                .delete(volumes::delete),
        )
        .route(
            "/v1/volumes/{name}/attach",
            axum::routing::post(volumes::attach),
        )
        .route(
            "/v1/volumes/{name}/detach",
            axum::routing::post(volumes::detach),
        )
        .route(
            "/v1/volumes/{name}/salvage",
            axum::routing::post(volumes::salvage),
        )
        .route(
            "/v1/volumes/{name}/expand",
            axum::routing::post(volumes::expand),
        )
        .route("/v1/replicas", get(objects::list_replicas))
        .route(
            "/v1/replicas/{name}/scrub",
            axum::routing::post(objects::scrub_replica),
        )
        .route(
            "/v1/replicas/{name}",
            axum::routing::delete(objects::delete_replica),
        )
        .route(
            "/v1/snapshots",
            get(snapshots::list).post(snapshots::create),
        )
        .route(
            "/v1/snapshots/{name}",
            get(snapshots::get_one).delete(snapshots::delete),
        )
        .route("/v1/nodes", get(nodes::list))
        .route("/v1/nodes/{id}", get(nodes::get_one).patch(nodes::patch))
        .route("/v1/nodes/{id}/disks/{disk_id}", patch(nodes::patch_disk))
        .route("/v1/settings", get(settings::list))
        .route(
            "/v1/settings/{name}",
            get(settings::get_one).put(settings::put),
        )
        .route("/v1/events", get(objects::list_events))
        .route("/v1/plan", get(plan::get))
        .merge(crate::ui::router())
        .fallback(meta::no_route)
        .layer(axum::middleware::from_fn_with_state(
            ctx.clone(),
            leader_writes,
        ))
        .layer(axum::middleware::from_fn_with_state(gate, gate::mutations))
        .with_state(ctx)
}

/// Only the leader changes anything: a follower (another controller on the
/// same cluster) serves reads from its watch cache and answers a write 503,
/// naming the leader to send it to.
async fn leader_writes(
    State(ctx): State<Arc<Context>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let leadership = ctx.leadership();
    if leadership.leading || request.method() == axum::http::Method::GET {
        return next.run(request).await;
    }
    let leader = match leadership.holder {
        Some((id, endpoint)) => format!("the leader is {id} (agent endpoint {endpoint})"),
        None => "no controller leads yet".to_string(),
    };
    Error::Unavailable(format!(
        "this controller is not the leader; {leader}; send changes to the leader's REST API"
    ))
    .into_response()
}

#[cfg(test)]
mod tests;
