//! An event: what happened to an object, and why.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Something that happened to an object, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub name: String,
    #[serde(default)]
    pub resource_version: u64,
    /// `KIND/NAME`, e.g. `node/node-1` or `replica/v1-r-3f2a`.
    pub object: String,
    /// A CamelCase word, e.g. `NodeDown`, `EvictionAutomatic`.
    pub reason: String,
    pub message: String,
    pub time: DateTime<Utc>,
}
