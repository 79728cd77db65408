//! The Kubernetes shape of the model: the CustomResourceDefinitions of
//! group `ballast.csi.dev`, derived from the model's types, and the rules
//! the API server checks on a Setting's value, derived from the settings
//! registry. `ballast crds` prints them; `deploy/crds/` holds the output.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, ValidationRule,
};
use kube::core::CustomResourceExt;

use crate::model::{
    NodeResource, ReplicaResource, SettingResource, SnapshotResource, VolumeResource,
};
use crate::settings::{DEFINITIONS, SettingKind};

/// The API group of every Ballast resource.
pub const GROUP: &str = "ballast.csi.dev";
/// The version of every Ballast resource.
pub const VERSION: &str = "v1alpha1";

/// Every CRD, in the order `ballast crds` prints them.
pub fn crds() -> Vec<CustomResourceDefinition> {
    let mut setting = SettingResource::crd();
    for version in &mut setting.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            schema.x_kubernetes_validations = Some(setting_rules());
        }
    }
    vec![
        VolumeResource::crd(),
        ReplicaResource::crd(),
        NodeResource::crd(),
        setting,
        SnapshotResource::crd(),
    ]
    .into_iter()
    .map(known_formats_only)
    .collect()
}

/// The CRD without the `format`s the API server does not know (schemars
/// writes `uint32`/`uint64` for unsigned integers; the server warns on
/// every apply). The `minimum: 0` beside them keeps the meaning.
fn known_formats_only(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                if map
                    .get("format")
                    .and_then(|f| f.as_str())
                    .is_some_and(|f| f.starts_with("uint"))
                {
                    map.remove("format");
                }
                map.values_mut().for_each(walk);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    let Ok(mut v) = serde_json::to_value(&crd) else {
        return crd;
    };
    walk(&mut v);
    serde_json::from_value(v).unwrap_or(crd)
}

/// The CRDs as one YAML stream, one document per CRD.
pub fn crds_yaml() -> Result<String, serde_yaml_ng::Error> {
    let mut out = String::new();
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(&crd)?);
    }
    Ok(out)
}

/// One CEL rule per setting, checked by the API server on every write of a
/// Setting object: a known name, and a value the setting accepts.
fn setting_rules() -> Vec<ValidationRule> {
    let names: Vec<String> = DEFINITIONS
        .iter()
        .map(|d| format!("'{}'", d.name))
        .collect();
    let mut rules = vec![ValidationRule {
        rule: format!("self.metadata.name in [{}]", names.join(", ")),
        message: Some(format!(
            "unknown setting; known settings: {}",
            DEFINITIONS
                .iter()
                .map(|d| d.name)
                .collect::<Vec<_>>()
                .join(", ")
        )),
        ..Default::default()
    }];
    for def in DEFINITIONS {
        let check = match def.kind {
            SettingKind::Bool => "self.value in ['true', 'false']".to_string(),
            SettingKind::Enum(values) => {
                let quoted: Vec<String> = values.iter().map(|v| format!("'{v}'")).collect();
                format!("self.value in [{}]", quoted.join(", "))
            }
            SettingKind::Int { min, max } => {
                let upper = max
                    .map(|m| format!(" && int(self.value) <= {m}"))
                    .unwrap_or_default();
                format!(
                    "self.value.matches('^-?[0-9]{{1,18}}$') && int(self.value) >= {min}{upper}"
                )
            }
        };
        rules.push(ValidationRule {
            rule: format!("self.metadata.name != '{}' || ({check})", def.name),
            message: Some(format!(
                "invalid value for setting {}; accepted values: {}",
                def.name,
                def.kind.accepted()
            )),
            ..Default::default()
        });
    }
    rules
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed CRDs are what the types make; regenerate them with
    /// `cargo run -p ballast-cli --bin ballast -- crds > deploy/crds/ballast.csi.dev.yaml`.
    #[test]
    fn the_committed_crds_are_what_the_types_make() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("deploy")
            .join("crds")
            .join("ballast.csi.dev.yaml");
        let committed =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let made = crds_yaml().unwrap();
        assert!(
            committed == made,
            "{} drifted from the types; regenerate it with \
             `cargo run -p ballast-cli --bin ballast -- crds > deploy/crds/ballast.csi.dev.yaml`",
            path.display()
        );
    }

    #[test]
    fn every_kind_has_a_status_subresource_short_names_and_columns() {
        for crd in crds() {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let v = &crd.spec.versions[0];
            assert!(
                v.subresources
                    .as_ref()
                    .and_then(|s| s.status.as_ref())
                    .is_some(),
                "{name}: status subresource"
            );
            assert!(
                crd.spec
                    .names
                    .short_names
                    .as_ref()
                    .is_some_and(|s| !s.is_empty()),
                "{name}: short names"
            );
            let columns: Vec<&str> = v
                .additional_printer_columns
                .iter()
                .flatten()
                .map(|c| c.name.as_str())
                .collect();
            let want: &[&str] = match crd.spec.names.kind.as_str() {
                "Volume" => &["State", "Robustness", "Size", "Replicas", "Node", "Age"],
                "Replica" => &["Volume", "Node", "Disk", "Mode", "Age"],
                "Node" => &["Ready", "Zone", "Schedulable", "Disks", "Age"],
                "Setting" => &["Value"],
                "Snapshot" => &["Volume", "Ready", "Size", "Age"],
                other => panic!("unexpected kind {other}"),
            };
            for w in want {
                assert!(columns.contains(w), "{name}: column {w} in {columns:?}");
            }
        }
    }
}
