//! A stored setting: a name and its value (validated by the registry in
//! the settings module).

use serde::{Deserialize, Serialize};

/// A setting value a user set (defaults are not stored).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Setting {
    pub name: String,
    #[serde(default)]
    pub resource_version: u64,
    pub value: String,
}
