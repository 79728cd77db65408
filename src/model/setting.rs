//! A stored setting: a name and its value (validated by the registry in
//! the settings module). In Kubernetes a Setting object holds its value at
//! the top level, as `kubectl edit setting NAME` shows it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A setting value a user set (defaults are not stored).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Setting {
    pub name: String,
    #[serde(default)]
    pub resource_version: u64,
    pub value: String,
    /// What the controller says of the value.
    #[serde(default)]
    pub status: SettingStatus,
}

custom_resource! {
    kind: "Setting", root: "SettingResource", status: "SettingStatus", short: "bset",
    options: [no_spec,],
    columns: [
        ("Value", "string", ".value"),
        ("Refused", "string", ".status.refused"),
    ],
    /// In Kubernetes, the body of a `settings.ballast.csi.dev` object: its
    /// value, beside the metadata. The API server checks the value against the
    /// setting's accepted values (rules made by the top-level `crd` module).
    pub struct SettingBody {
        #[schemars(length(max = 256))]
        pub value: String,
    }
}

/// What the controller says of a Setting object's value.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SettingStatus {
    /// Why the value is not in effect (the default is used instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}
