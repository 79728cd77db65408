//! `/v1/settings`: every setting with its value, default and description;
//! a change is validated by the settings registry before it is stored.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use ballast::api::{List, SettingView};
use ballast::model::{Kind, Setting};
use ballast::settings::{self, DEFINITIONS, SettingDef};
use ballast::store::StoreError;
use serde::Deserialize;
use serde_json::Value;

use super::body::Body;
use crate::context::Context;
use crate::error::Error;

fn view(def: &SettingDef, value: &str) -> SettingView {
    SettingView {
        name: def.name.to_string(),
        value: value.to_string(),
        default: def.default.to_string(),
        description: def.description.to_string(),
        accepted: def.kind.accepted(),
    }
}

fn lookup(name: &str) -> Result<&'static SettingDef, Error> {
    settings::definition(name).map_err(|e| match e {
        settings::SettingError::Unknown { .. } => Error::NotFound {
            kind: "setting".into(),
            name: format!("{name} ({e})"),
        },
        other => Error::invalid("name", other.to_string()),
    })
}

pub async fn list(State(ctx): State<Arc<Context>>) -> Result<Json<List<SettingView>>, Error> {
    let s = ctx.settings().await?;
    let items = DEFINITIONS
        .iter()
        .map(|d| view(d, s.get(d.name).unwrap_or(d.default)))
        .collect();
    Ok(Json(List { items }))
}

pub async fn get_one(
    State(ctx): State<Arc<Context>>,
    Path(name): Path<String>,
) -> Result<Json<SettingView>, Error> {
    let def = lookup(&name)?;
    let s = ctx.settings().await?;
    Ok(Json(view(def, s.get(def.name).unwrap_or(def.default))))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutSetting {
    value: Value,
}

#[tracing::instrument(skip_all, fields(setting = %name))]
pub async fn put(
    State(ctx): State<Arc<Context>>,
    Path(name): Path<String>,
    Body(req): Body<PutSetting>,
) -> Result<Json<SettingView>, Error> {
    // An unknown name in a PUT is bad input (400), naming the known ones.
    let def = settings::definition(&name).map_err(|e| Error::invalid("name", e.to_string()))?;
    let raw = match &req.value {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => {
            return Err(Error::invalid(
                "value",
                format!(
                    "must be a string, boolean or number; accepted values: {}",
                    def.kind.accepted()
                ),
            ));
        }
    };
    let value =
        settings::validate(def.name, &raw).map_err(|e| Error::invalid("value", e.to_string()))?;
    let stored = Setting {
        name: def.name.to_string(),
        resource_version: 0,
        value: value.clone(),
        status: Default::default(),
    };
    match ctx.store.create(&stored).await {
        Ok(_) => {}
        Err(StoreError::AlreadyExists { .. }) => {
            ctx.store
                .modify::<Setting, Error>(def.name, |s| {
                    let changed = s.value != value;
                    s.value = value.clone();
                    Ok(changed)
                })
                .await?;
        }
        Err(e) => return Err(e.into()),
    }
    ctx.event(
        Kind::Setting,
        def.name,
        "SettingChanged",
        format!("set to {value:?}"),
    )
    .await;
    Ok(Json(view(def, &value)))
}
