//! `GET /v1/plan`: what the controller would do next on the stored state,
//! and why, without doing it.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};

use super::body::QueryArgs;
use crate::context::Context;
use crate::error::Error;
use crate::planner::{self, Action, ActionKind, Blocked, Wait};

/// What `GET /v1/plan` answers: the plan at `time`, for one volume or all.
#[derive(Debug, Serialize, Deserialize)]
pub struct PlanView {
    pub time: chrono::DateTime<chrono::Utc>,
    pub actions: Vec<Action>,
    pub waits: Vec<Wait>,
    pub blocked: Vec<Blocked>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanFilter {
    volume: Option<String>,
}

pub async fn get(
    State(ctx): State<Arc<Context>>,
    QueryArgs(f): QueryArgs<PlanFilter>,
) -> Result<Json<PlanView>, Error> {
    let view = crate::observe::current_view(&ctx).await?;
    if let Some(v) = &f.volume
        && !view.volumes.iter().any(|x| &x.name == v)
    {
        return Err(Error::NotFound {
            kind: "volume".into(),
            name: v.clone(),
        });
    }
    let now = ctx.now();
    let plan = planner::plan(&view, &ctx.settings().await?, now);
    let volume_of = |kind: &ActionKind| -> Option<String> {
        match kind {
            ActionKind::CreateReplica { volume, .. } | ActionKind::DeleteReplica { volume, .. } => {
                Some(volume.clone())
            }
            ActionKind::SetReplicaEviction { replica, .. } => view
                .replicas
                .iter()
                .find(|r| &r.name == replica)
                .map(|r| r.volume.clone()),
            ActionKind::RecordEvent { object, .. } => {
                object.strip_prefix("volume/").map(str::to_string)
            }
            ActionKind::SetNodeStatus { .. } => None,
        }
    };
    let keep = |v: Option<String>| f.volume.is_none() || v == f.volume;
    Ok(Json(PlanView {
        time: now,
        actions: plan
            .actions
            .into_iter()
            .filter(|a| keep(volume_of(&a.kind)))
            .collect(),
        waits: plan
            .waits
            .into_iter()
            .filter(|w| keep(Some(w.volume.clone())))
            .collect(),
        blocked: plan
            .blocked
            .into_iter()
            .filter(|b| keep(b.volume().map(str::to_string)))
            .collect(),
    }))
}
