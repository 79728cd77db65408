//! `/v1/nodes`: list and read nodes, and change what an operator owns of
//! them (scheduling, eviction, tags, and each disk's settings).

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use ballast::model::{Kind, Node};
use serde::Deserialize;
use serde_json::{Value, json};

use super::body::Body;
use crate::context::Context;
use crate::error::Error;

pub async fn list(State(ctx): State<Arc<Context>>) -> Result<Json<Value>, Error> {
    let items: Vec<Node> = ctx.store.list().await?;
    Ok(Json(json!({ "items": items })))
}

pub async fn get_one(
    State(ctx): State<Arc<Context>>,
    Path(id): Path<String>,
) -> Result<Json<Node>, Error> {
    Ok(Json(ctx.store.fetch(&id).await?))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PatchNode {
    allow_scheduling: Option<bool>,
    eviction_requested: Option<bool>,
    zone: Option<String>,
    tags: Option<Vec<String>>,
    cordoned: Option<bool>,
    resource_version: Option<u64>,
}

fn check_version(kind: &str, id: &str, have: u64, want: Option<u64>) -> Result<(), Error> {
    match want {
        Some(v) if v != have => Err(Error::Conflict(format!(
            "{kind} {id:?} is at resource version {have}, not {v}; read it again"
        ))),
        _ => Ok(()),
    }
}

/// The `tags` of a patch, when given: none empty, none with a comma.
fn check_tags(tags: Option<&[String]>) -> Result<(), Error> {
    match tags
        .unwrap_or_default()
        .iter()
        .find(|t| t.is_empty() || t.contains(','))
    {
        Some(bad) => Err(Error::invalid(
            "tags",
            format!("tag {bad:?} is empty or has a comma"),
        )),
        None => Ok(()),
    }
}

#[tracing::instrument(skip_all, fields(node = %id))]
pub async fn patch(
    State(ctx): State<Arc<Context>>,
    Path(id): Path<String>,
    Body(p): Body<PatchNode>,
) -> Result<Json<Node>, Error> {
    check_tags(p.tags.as_deref())?;
    let node = change_node(&ctx, &id, ("NodeUpdated", ""), |n, notes| {
        check_version("node", &id, n.resource_version, p.resource_version)?;
        if let Some(v) = p.allow_scheduling {
            n.spec.allow_scheduling = v;
            notes.push(format!("allowScheduling={v}"));
        }
        if let Some(v) = p.eviction_requested {
            n.spec.eviction_requested = v;
            notes.push(format!("evictionRequested={v}"));
        }
        if let Some(z) = &p.zone {
            n.spec.zone = z.clone();
            notes.push(format!("zone={z}"));
        }
        if let Some(t) = &p.tags {
            n.spec.tags = t.clone();
            notes.push(format!("tags={}", t.join(",")));
        }
        if let Some(c) = p.cordoned {
            n.status.cordoned = c;
            notes.push(format!("cordoned={c}"));
        }
        Ok(())
    })
    .await?;
    Ok(Json(node))
}

/// Changes node `id` with `change`, which notes each field it sets; when
/// anything changed, one event `reason` says what (after `prefix`).
async fn change_node(
    ctx: &Context,
    id: &str,
    (reason, prefix): (&str, &str),
    mut change: impl FnMut(&mut Node, &mut Vec<String>) -> Result<(), Error> + Send,
) -> Result<Node, Error> {
    let mut notes = Vec::new();
    let node = ctx
        .store
        .modify::<Node, Error>(id, |n| {
            notes.clear();
            change(n, &mut notes)?;
            Ok(!notes.is_empty())
        })
        .await?;
    if !notes.is_empty() {
        let message = format!("{prefix}{}", notes.join(" "));
        ctx.event(Kind::Node, id, reason, message).await;
    }
    Ok(node)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PatchDisk {
    allow_scheduling: Option<bool>,
    eviction_requested: Option<bool>,
    #[serde(
        default,
        deserialize_with = "ballast::quantity::serde_size_opt::deserialize"
    )]
    storage_reserved: Option<u64>,
    tags: Option<Vec<String>>,
}

#[tracing::instrument(skip_all, fields(node = %id, disk = %disk_id))]
pub async fn patch_disk(
    State(ctx): State<Arc<Context>>,
    Path((id, disk_id)): Path<(String, String)>,
    Body(p): Body<PatchDisk>,
) -> Result<Json<Node>, Error> {
    check_tags(p.tags.as_deref())?;
    let prefix = format!("disk {disk_id}: ");
    let node = change_node(&ctx, &id, ("DiskUpdated", &prefix), |n, notes| {
        let maximum = n.status.disks.get(&disk_id).map(|d| d.storage_maximum);
        let disk = n
            .spec
            .disks
            .get_mut(&disk_id)
            .ok_or_else(|| Error::NotFound {
                kind: "disk".into(),
                name: format!("{id}/{disk_id}"),
            })?;
        if let Some(v) = p.allow_scheduling {
            disk.allow_scheduling = v;
            notes.push(format!("allowScheduling={v}"));
        }
        if let Some(v) = p.eviction_requested {
            disk.eviction_requested = v;
            notes.push(format!("evictionRequested={v}"));
        }
        if let Some(r) = p.storage_reserved {
            if let Some(max) = maximum.filter(|m| *m > 0 && r > *m) {
                return Err(Error::invalid(
                    "storageReserved",
                    format!("{r} bytes is more than the disk's {max} bytes"),
                ));
            }
            disk.storage_reserved = r;
            notes.push(format!("storageReserved={r}"));
        }
        if let Some(t) = &p.tags {
            disk.tags = t.clone();
            notes.push(format!("tags={}", t.join(",")));
        }
        Ok(())
    })
    .await?;
    Ok(Json(node))
}
