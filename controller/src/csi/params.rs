//! StorageClass parameters (CreateVolume's `parameters`), parsed once into
//! the fields of a volume create request. An unknown key, or a known one with a bad value, is an
//! error that names the key and the accepted values. Keys the CO's
//! sidecars add (`csi.storage.k8s.io/...`) are not ours and are ignored.

use std::collections::HashMap;

use ballast::model::DataLocality;
use ballast::settings::MAX_COPY_RATE;

use crate::error::Error;
use crate::volumes::{CreateVolume, MAX_REPLICAS, PatchVolume};

/// Every key Ballast accepts, for error messages.
const KEYS: &[&str] = &[
    "numberOfReplicas",
    "dataLocality",
    "replicaAutoBalance",
    "staleReplicaTimeout",
    "replicaRebuildRate",
    "diskSelector",
    "nodeSelector",
    "fsType",
    "mkfsParams",
];

/// The keys a VolumeAttributesClass may set and ControllerModifyVolume may
/// change (`mutable_parameters`).
pub const MUTABLE_KEYS: &[&str] = &[
    "numberOfReplicas",
    "dataLocality",
    "replicaAutoBalance",
    "replicaRebuildRate",
];

/// What the CO's sidecars may add to the parameters.
const CO_PREFIX: &str = "csi.storage.k8s.io/";

/// The parameters are the part of a create request a StorageClass sets;
/// CreateVolume fills in the rest (name, size, access mode, ...).
pub type StorageClassParams = CreateVolume;

fn enum_value<T: std::str::FromStr<Err = String>>(key: &str, v: &str) -> Result<T, Error> {
    v.parse::<T>().map_err(|m| Error::invalid(key, m))
}

fn tags(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect()
}

impl TryFrom<&HashMap<String, String>> for StorageClassParams {
    type Error = Error;

    fn try_from(params: &HashMap<String, String>) -> Result<Self, Error> {
        let mut out = StorageClassParams::default();
        for (key, v) in params {
            let k = key.as_str();
            match k {
                "numberOfReplicas" => {
                    let n = v
                        .trim()
                        .parse::<u32>()
                        .ok()
                        .filter(|n| (1..=MAX_REPLICAS).contains(n))
                        .ok_or_else(|| {
                            Error::invalid(
                                k,
                                format!(
                                    "{v:?}; accepted values: an integer from 1 to {MAX_REPLICAS}"
                                ),
                            )
                        })?;
                    out.number_of_replicas = Some(n);
                }
                "dataLocality" => out.data_locality = Some(enum_value(k, v)?),
                "replicaAutoBalance" => out.replica_auto_balance = Some(enum_value(k, v)?),
                "staleReplicaTimeout" => {
                    let m = v
                        .trim()
                        .parse::<u64>()
                        .ok()
                        .filter(|m| *m >= 1)
                        .ok_or_else(|| {
                            Error::invalid(
                                k,
                                format!("{v:?}; accepted values: minutes, an integer >= 1"),
                            )
                        })?;
                    out.stale_replica_timeout = Some(m);
                }
                "replicaRebuildRate" => {
                    let r = v
                        .trim()
                        .parse::<u64>()
                        .ok()
                        .filter(|r| *r <= MAX_COPY_RATE)
                        .ok_or_else(|| {
                            Error::invalid(
                                k,
                                format!(
                                    "{v:?}; accepted values: MiB/s, an integer from 0 (follow the settings) to {MAX_COPY_RATE}"
                                ),
                            )
                        })?;
                    out.replica_rebuild_rate = Some(r);
                }
                "diskSelector" => out.disk_selector = Some(tags(v)),
                "nodeSelector" => out.node_selector = Some(tags(v)),
                "fsType" => out.fs_type = Some(enum_value(k, v)?),
                "mkfsParams" => out.mkfs_params = Some(v.clone()),
                _ if k.starts_with(CO_PREFIX) => {}
                _ => {
                    return Err(Error::invalid(
                        k,
                        format!("unknown parameter; accepted: {}", KEYS.join(", ")),
                    ));
                }
            }
        }
        if out.data_locality == Some(DataLocality::StrictLocal)
            && out.number_of_replicas.is_some_and(|n| n != 1)
        {
            return Err(Error::invalid(
                "dataLocality",
                "strict-local needs numberOfReplicas = 1",
            ));
        }
        Ok(out)
    }
}

/// `mutable_parameters` (of CreateVolume or ControllerModifyVolume) as a
/// volume patch. A key that cannot change is refused, naming the ones that
/// can; values are checked as StorageClass parameters are.
pub fn mutable(params: &HashMap<String, String>) -> Result<PatchVolume, Error> {
    if let Some(k) = params.keys().find(|k| !MUTABLE_KEYS.contains(&k.as_str())) {
        return Err(Error::invalid(
            "mutable_parameters",
            format!(
                "{k:?} cannot be changed; mutable: {}",
                MUTABLE_KEYS.join(", ")
            ),
        ));
    }
    let p = StorageClassParams::try_from(params)?;
    Ok(PatchVolume {
        number_of_replicas: p.number_of_replicas,
        data_locality: p.data_locality,
        replica_auto_balance: p.replica_auto_balance,
        replica_rebuild_rate: p.replica_rebuild_rate,
        resource_version: None,
    })
}

#[cfg(test)]
mod tests {
    use ballast::model::{FsType, VolumeAutoBalance};

    use super::*;

    fn parse(kv: &[(&str, &str)]) -> Result<StorageClassParams, Error> {
        let m: HashMap<String, String> = kv
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        StorageClassParams::try_from(&m)
    }

    #[test]
    fn mutable_parameters_are_the_four_keys_and_checked_values() {
        let m = |kv: &[(&str, &str)]| {
            let map: HashMap<String, String> = kv
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            mutable(&map)
        };
        let p = m(&[
            ("numberOfReplicas", "2"),
            ("replicaAutoBalance", "best-effort"),
            ("replicaRebuildRate", "40"),
        ])
        .unwrap();
        assert_eq!(p.number_of_replicas, Some(2));
        assert_eq!(p.replica_auto_balance, Some(VolumeAutoBalance::BestEffort));
        assert_eq!(p.replica_rebuild_rate, Some(40));
        let e = m(&[("fsType", "xfs")]).unwrap_err().to_string();
        assert!(
            e.contains("mutable_parameters")
                && e.contains(
                    "numberOfReplicas, dataLocality, replicaAutoBalance, replicaRebuildRate"
                ),
            "{e}"
        );
        let e = m(&[("numberOfReplicas", "0")]).unwrap_err().to_string();
        assert!(e.contains("numberOfReplicas"), "{e}");
    }

    #[test]
    fn every_parameter_parses_to_its_type() {
        let p = parse(&[
            ("numberOfReplicas", "2"),
            ("dataLocality", "best-effort"),
            ("replicaAutoBalance", "least-effort"),
            ("staleReplicaTimeout", "30"),
            ("replicaRebuildRate", "100"),
            ("diskSelector", "ssd, fast"),
            ("nodeSelector", "storage"),
            ("fsType", "xfs"),
            ("mkfsParams", "-m 0"),
            ("csi.storage.k8s.io/pvc/name", "data"),
        ])
        .unwrap();
        assert_eq!(p.number_of_replicas, Some(2));
        assert_eq!(p.data_locality, Some(DataLocality::BestEffort));
        assert_eq!(p.replica_auto_balance, Some(VolumeAutoBalance::LeastEffort));
        assert_eq!(p.stale_replica_timeout, Some(30));
        assert_eq!(p.replica_rebuild_rate, Some(100));
        assert_eq!(p.disk_selector, Some(vec!["ssd".into(), "fast".into()]));
        assert_eq!(p.node_selector, Some(vec!["storage".into()]));
        assert_eq!(p.fs_type, Some(FsType::Xfs));
        assert_eq!(p.mkfs_params.as_deref(), Some("-m 0"));
        assert_eq!(parse(&[]).unwrap(), StorageClassParams::default());
    }

    #[test]
    fn errors_name_the_key_and_the_accepted_values() {
        for (kv, key, accepted) in [
            (("numberOfReplicas", "0"), "numberOfReplicas", "1 to 20"),
            (("numberOfReplicas", "three"), "numberOfReplicas", "1 to 20"),
            (("dataLocality", "near"), "dataLocality", "strict-local"),
            (
                ("replicaAutoBalance", "yes"),
                "replicaAutoBalance",
                "best-effort",
            ),
            (("staleReplicaTimeout", "0"), "staleReplicaTimeout", ">= 1"),
            (
                ("replicaRebuildRate", "20000"),
                "replicaRebuildRate",
                "0 (follow the settings) to 10240",
            ),
            (("replicaRebuildRate", "-1"), "replicaRebuildRate", "MiB/s"),
            (("fsType", "btrfs"), "fsType", "ext4, xfs"),
            (("replicas", "3"), "replicas", "numberOfReplicas"),
        ] {
            let e = parse(&[kv]).unwrap_err().to_string();
            assert!(e.starts_with(key), "{e}");
            assert!(e.contains(accepted), "{e}");
        }
        let e = parse(&[("numberOfReplicas", "2"), ("dataLocality", "strict-local")])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("dataLocality"), "{e}");
    }
}
