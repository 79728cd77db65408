//! Volume records: building a volume from a create request and applying a
//! patch, with every rule on the values in one place. (Where the replicas
//! go is the planner's; making them is the executor's.)

use ballast::model::{
    AccessMode, DataLocality, Frontend, FsType, MAX_VOLUME_SIZE, Volume, VolumeAutoBalance,
    VolumeSpec, VolumeStatus, validate_name,
};
use ballast::settings::{MAX_COPY_RATE, Settings};
use serde::Deserialize;

use crate::error::Error;

/// Smallest volume, and the granularity of sizes.
pub const SIZE_ALIGN: u64 = 4096;
pub const MAX_REPLICAS: u32 = 20;
/// Longest volume name: its replicas are named `<volume>-r<8 hex>`, and
/// every name is a DNS label of at most 63 characters.
pub const MAX_NAME: usize = 53;

/// `POST /v1/volumes`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateVolume {
    pub name: String,
    #[serde(with = "ballast::quantity::serde_size")]
    pub size: u64,
    pub number_of_replicas: Option<u32>,
    pub data_locality: Option<DataLocality>,
    pub replica_auto_balance: Option<VolumeAutoBalance>,
    pub stale_replica_timeout: Option<u64>,
    /// MiB/s for the copies rebuilding its replicas (0: the settings').
    pub replica_rebuild_rate: Option<u64>,
    pub disk_selector: Option<Vec<String>>,
    pub node_selector: Option<Vec<String>>,
    pub access_mode: Option<AccessMode>,
    pub fs_type: Option<FsType>,
    pub frontend: Option<Frontend>,
    pub mkfs_params: Option<String>,
    /// The node a strict-local volume lives on.
    pub pinned_node: Option<String>,
    /// The snapshot to restore, or the volume to clone.
    pub source: Option<ballast::model::VolumeSource>,
    /// The CO's name, for a volume created through CSI (not a REST field).
    #[serde(skip)]
    pub csi_name: Option<String>,
}

/// `PATCH /v1/volumes/{name}`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PatchVolume {
    pub number_of_replicas: Option<u32>,
    pub data_locality: Option<DataLocality>,
    pub replica_auto_balance: Option<VolumeAutoBalance>,
    /// Taken by the next rebuild; one under way keeps its pace.
    pub replica_rebuild_rate: Option<u64>,
    /// When given, the patch applies only to this version.
    pub resource_version: Option<u64>,
}

/// Checks a spec against every rule; the error names the field.
pub fn validate_spec(spec: &VolumeSpec) -> Result<(), Error> {
    if spec.size == 0 || !spec.size.is_multiple_of(SIZE_ALIGN) {
        return Err(Error::invalid(
            "size",
            format!(
                "{} is not a positive multiple of {SIZE_ALIGN} bytes",
                spec.size
            ),
        ));
    }
    if spec.size > MAX_VOLUME_SIZE {
        return Err(Error::OutOfRange {
            field: "size".into(),
            message: format!(
                "{} is past the largest volume the replica format holds, {} ({MAX_VOLUME_SIZE} bytes)",
                spec.size,
                ballast::quantity::format_size(MAX_VOLUME_SIZE)
            ),
        });
    }
    if !(1..=MAX_REPLICAS).contains(&spec.number_of_replicas) {
        return Err(Error::invalid(
            "numberOfReplicas",
            format!(
                "{} is out of range; accepted values: an integer from 1 to {MAX_REPLICAS}",
                spec.number_of_replicas
            ),
        ));
    }
    if spec.data_locality == Some(DataLocality::StrictLocal) && spec.number_of_replicas != 1 {
        return Err(Error::invalid(
            "dataLocality",
            format!(
                "strict-local needs numberOfReplicas = 1 (got {})",
                spec.number_of_replicas
            ),
        ));
    }
    if let Some(node) = &spec.pinned_node {
        validate_name(node).map_err(|m| Error::invalid("pinnedNode", m))?;
        if spec.data_locality != Some(DataLocality::StrictLocal) {
            return Err(Error::invalid(
                "pinnedNode",
                "only a strict-local volume is pinned to a node (dataLocality: strict-local)",
            ));
        }
    }
    if spec.stale_replica_timeout == 0 {
        return Err(Error::invalid(
            "staleReplicaTimeout",
            "accepted values: minutes, an integer >= 1",
        ));
    }
    if spec.replica_rebuild_rate > MAX_COPY_RATE {
        return Err(Error::invalid(
            "replicaRebuildRate",
            format!(
                "{} is out of range; accepted values: MiB/s, an integer from 0 (follow the settings) to {MAX_COPY_RATE}",
                spec.replica_rebuild_rate
            ),
        ));
    }
    for (field, tags) in [
        ("diskSelector", &spec.disk_selector),
        ("nodeSelector", &spec.node_selector),
    ] {
        if let Some(bad) = tags.iter().find(|t| t.is_empty() || t.contains(',')) {
            return Err(Error::invalid(
                field,
                format!("tag {bad:?} is empty or has a comma"),
            ));
        }
    }
    Ok(())
}

/// A new volume record from a create request; unset fields take the
/// settings' defaults.
pub fn build(req: CreateVolume, settings: &Settings) -> Result<Volume, Error> {
    validate_name(&req.name).map_err(|m| Error::invalid("name", m))?;
    if req.name.len() > MAX_NAME {
        return Err(Error::invalid(
            "name",
            format!(
                "{:?} is longer than {MAX_NAME} characters (replica names add 10)",
                req.name
            ),
        ));
    }
    let mut spec = VolumeSpec::new(
        req.size,
        req.number_of_replicas
            .unwrap_or_else(|| settings.default_replica_count()),
    );
    spec.data_locality = req.data_locality;
    if let Some(v) = req.replica_auto_balance {
        spec.replica_auto_balance = v;
    }
    if let Some(v) = req.stale_replica_timeout {
        spec.stale_replica_timeout = v;
    }
    if let Some(v) = req.replica_rebuild_rate {
        spec.replica_rebuild_rate = v;
    }
    spec.disk_selector = req.disk_selector.unwrap_or_default();
    spec.node_selector = req.node_selector.unwrap_or_default();
    if let Some(v) = req.access_mode {
        spec.access_mode = v;
    }
    if let Some(v) = req.fs_type {
        spec.fs_type = v;
    }
    if let Some(v) = req.frontend {
        spec.frontend = v;
    }
    if let Some(v) = req.mkfs_params {
        spec.mkfs_params = v;
    }
    spec.csi_name = req.csi_name;
    spec.pinned_node = req.pinned_node;
    if let Some(source) = &req.source {
        match (&source.snapshot, &source.volume) {
            (Some(n), None) | (None, Some(n)) => {
                validate_name(n).map_err(|m| Error::invalid("source", m))?
            }
            _ => {
                return Err(Error::invalid(
                    "source",
                    "name exactly one of snapshot and volume",
                ));
            }
        }
    }
    spec.source = req.source;
    validate_spec(&spec)?;
    Ok(Volume {
        name: req.name,
        resource_version: 0,
        spec,
        status: VolumeStatus::default(),
    })
}

/// Applies a patch to a volume, validating the result as a whole.
pub fn apply_patch(volume: &mut Volume, patch: &PatchVolume) -> Result<(), Error> {
    if let Some(v) = patch.resource_version
        && v != volume.resource_version
    {
        return Err(Error::Conflict(format!(
            "volume {:?} is at resource version {}, not {v}; read it again",
            volume.name, volume.resource_version
        )));
    }
    let mut spec = volume.spec.clone();
    if let Some(n) = patch.number_of_replicas {
        spec.number_of_replicas = n;
    }
    if let Some(d) = patch.data_locality {
        spec.data_locality = Some(d);
    }
    if let Some(b) = patch.replica_auto_balance {
        spec.replica_auto_balance = b;
    }
    if let Some(r) = patch.replica_rebuild_rate {
        spec.replica_rebuild_rate = r;
    }
    validate_spec(&spec)?;
    volume.spec = spec;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(name: &str, size: u64) -> CreateVolume {
        serde_json::from_value(serde_json::json!({"name": name, "size": size})).unwrap()
    }

    #[test]
    fn defaults_come_from_settings() {
        let s = Settings::from_overrides([("default-replica-count", "2")]);
        let v = build(req("v1", 1 << 30), &s).unwrap();
        assert_eq!(v.spec.number_of_replicas, 2);
        assert_eq!(v.spec.replica_auto_balance, VolumeAutoBalance::Ignored);
        assert_eq!(v.spec.data_locality, None);
    }

    #[test]
    fn errors_name_the_field() {
        let s = Settings::default();
        let e = build(req("v1", 1000), &s).unwrap_err();
        assert!(e.to_string().starts_with("size:"), "{e}");
        let e = build(req("V1", 4096), &s).unwrap_err();
        assert!(e.to_string().starts_with("name:"), "{e}");
        let mut r = req("v1", 4096);
        r.number_of_replicas = Some(21);
        assert!(
            build(r, &s)
                .unwrap_err()
                .to_string()
                .starts_with("numberOfReplicas:")
        );
        let mut r = req("v1", 4096);
        r.data_locality = Some(DataLocality::StrictLocal);
        let e = build(r, &s).unwrap_err();
        assert!(
            e.to_string()
                .contains("strict-local needs numberOfReplicas = 1"),
            "{e}"
        );
    }

    #[test]
    fn a_bad_patch_changes_nothing() {
        let mut v = build(req("v1", 4096), &Settings::default()).unwrap();
        let before = v.clone();
        let bad = PatchVolume {
            number_of_replicas: Some(0),
            ..Default::default()
        };
        assert!(apply_patch(&mut v, &bad).is_err());
        assert_eq!(v, before);
    }

    /// A volume's rebuild rate is set at creation and by a patch, from 0
    /// (follow the settings) to the settings' own highest; past it, the
    /// error names the field and the record is left as it was.
    #[test]
    fn the_rebuild_rate_is_set_and_patched_within_its_range() {
        let s = Settings::default();
        let v = build(req("v1", 4096), &s).unwrap();
        assert_eq!(v.spec.replica_rebuild_rate, 0);
        let mut r = req("v1", 4096);
        r.replica_rebuild_rate = Some(50);
        let mut v = build(r, &s).unwrap();
        assert_eq!(v.spec.replica_rebuild_rate, 50);
        let mut r = req("v1", 4096);
        r.replica_rebuild_rate = Some(MAX_COPY_RATE + 1);
        let e = build(r, &s).unwrap_err().to_string();
        assert!(
            e.starts_with("replicaRebuildRate:") && e.contains("0 (follow the settings) to 10240"),
            "{e}"
        );

        let patch = |rate| PatchVolume {
            replica_rebuild_rate: Some(rate),
            ..Default::default()
        };
        apply_patch(&mut v, &patch(MAX_COPY_RATE)).unwrap();
        assert_eq!(v.spec.replica_rebuild_rate, MAX_COPY_RATE);
        let before = v.clone();
        let e = apply_patch(&mut v, &patch(20000)).unwrap_err().to_string();
        assert!(e.starts_with("replicaRebuildRate:"), "{e}");
        assert_eq!(v, before);
        apply_patch(&mut v, &patch(0)).unwrap();
        assert_eq!(v.spec.replica_rebuild_rate, 0);
    }
}
