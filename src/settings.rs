//! The settings registry: every setting of BEHAVIOR.md with its name,
//! default, description and validation, in one table.
//!
//! The store keeps only values a user set; [`Settings`] resolves every
//! name to its current value and offers typed getters.

use std::collections::BTreeMap;

use crate::model::{AutoBalance, DataLocality, NodeDrainPolicy};

/// How a setting's value is validated.
#[derive(Clone, Copy, Debug)]
pub enum SettingKind {
    Bool,
    /// An integer within `min..=max` (no upper bound when `max` is None).
    Int {
        min: i64,
        max: Option<i64>,
    },
    /// One of a closed list of words.
    Enum(&'static [&'static str]),
}

impl SettingKind {
    /// The accepted values, as a person reads them.
    pub fn accepted(&self) -> String {
        match self {
            SettingKind::Bool => "true, false".to_string(),
            SettingKind::Int {
                min,
                max: Some(max),
            } => {
                format!("an integer from {min} to {max}")
            }
            SettingKind::Int { min, max: None } => format!("an integer >= {min}"),
            SettingKind::Enum(values) => values.join(", "),
        }
    }

    /// Returns the canonical form of `value`, or why it is not accepted.
    fn check(&self, value: &str) -> Result<String, ()> {
        let v = value.trim();
        match self {
            SettingKind::Bool => match v {
                "true" | "false" => Ok(v.to_string()),
                _ => Err(()),
            },
            SettingKind::Int { min, max } => {
                let n: i64 = v.parse().map_err(|_| ())?;
                if n < *min || max.is_some_and(|m| n > m) {
                    return Err(());
                }
                Ok(n.to_string())
            }
            SettingKind::Enum(values) => {
                if values.contains(&v) {
                    Ok(v.to_string())
                } else {
                    Err(())
                }
            }
        }
    }
}

/// One setting's definition.
#[derive(Debug)]
pub struct SettingDef {
    pub name: &'static str,
    pub default: &'static str,
    pub description: &'static str,
    pub kind: SettingKind,
}

pub const DEFAULT_REPLICA_COUNT: &str = "default-replica-count";
pub const DEFAULT_DATA_LOCALITY: &str = "default-data-locality";
pub const REPLICA_SOFT_ANTI_AFFINITY: &str = "replica-soft-anti-affinity";
pub const REPLICA_ZONE_SOFT_ANTI_AFFINITY: &str = "replica-zone-soft-anti-affinity";
pub const REPLICA_DISK_SOFT_ANTI_AFFINITY: &str = "replica-disk-soft-anti-affinity";
pub const REPLICA_AUTO_BALANCE: &str = "replica-auto-balance";
pub const DISK_PRESSURE_PERCENTAGE: &str = "replica-auto-balance-disk-pressure-percentage";
pub const NODE_DRAIN_POLICY: &str = "node-drain-policy";
pub const REPLENISHMENT_WAIT_INTERVAL: &str = "replica-replenishment-wait-interval";
pub const REBUILD_MAX_RETRY: &str = "replica-rebuild-max-retry";
pub const CONCURRENT_REBUILD_PER_NODE_LIMIT: &str = "concurrent-replica-rebuild-per-node-limit";
pub const OVER_PROVISIONING_PERCENTAGE: &str = "storage-over-provisioning-percentage";
pub const MINIMAL_AVAILABLE_PERCENTAGE: &str = "storage-minimal-available-percentage";
pub const DISABLE_SCHEDULING_ON_CORDONED_NODE: &str = "disable-scheduling-on-cordoned-node";
pub const SCRUB_INTERVAL: &str = "replica-scrub-interval";
pub const SCRUB_RATE: &str = "replica-scrub-rate";
pub const SNAPSHOT_MAX_COUNT: &str = "snapshot-max-count";
pub const MERGE_RATE: &str = "layer-merge-rate";
pub const ENGINE_REPLICA_TIMEOUT: &str = "engine-replica-timeout";
pub const OFFLINE_COPY_RATE: &str = "offline-copy-rate";
pub const REPLICA_REBUILD_RATE: &str = "replica-rebuild-rate";
/// The highest copy rate, in MiB/s, a setting or a volume may ask for.
pub const MAX_COPY_RATE: u64 = 10240;

/// Every setting, in the order BEHAVIOR.md lists them.
pub const DEFINITIONS: &[SettingDef] = &[
    SettingDef {
        name: DEFAULT_REPLICA_COUNT,
        default: "3",
        description: "Replicas of a volume that does not say how many it wants.",
        kind: SettingKind::Int {
            min: 1,
            max: Some(20),
        },
    },
    SettingDef {
        name: DEFAULT_DATA_LOCALITY,
        default: "disabled",
        description: "Data locality of a volume that does not set its own.",
        kind: SettingKind::Enum(DataLocality::NAMES),
    },
    SettingDef {
        name: REPLICA_SOFT_ANTI_AFFINITY,
        default: "false",
        description: "Whether two replicas of one volume may share a node when no other node fits.",
        kind: SettingKind::Bool,
    },
    SettingDef {
        name: REPLICA_ZONE_SOFT_ANTI_AFFINITY,
        default: "true",
        description: "Whether two replicas of one volume may share a zone when no other zone fits.",
        kind: SettingKind::Bool,
    },
    SettingDef {
        name: REPLICA_DISK_SOFT_ANTI_AFFINITY,
        default: "true",
        description: "Whether two replicas of one volume may share a disk when no other disk fits.",
        kind: SettingKind::Bool,
    },
    SettingDef {
        name: REPLICA_AUTO_BALANCE,
        default: "disabled",
        description: "Global replica balance mode across zones and nodes; a volume may override it.",
        kind: SettingKind::Enum(AutoBalance::NAMES),
    },
    SettingDef {
        name: DISK_PRESSURE_PERCENTAGE,
        default: "90",
        description: "Used-space percentage at which a disk is pressured and replicas move to another disk of the node; 0 turns it off.",
        kind: SettingKind::Int {
            min: 0,
            max: Some(100),
        },
    },
    SettingDef {
        name: NODE_DRAIN_POLICY,
        default: "block-if-contains-last-replica",
        description: "What a node drain waits for, and whether cordoning evicts replicas.",
        kind: SettingKind::Enum(NodeDrainPolicy::NAMES),
    },
    SettingDef {
        name: REPLENISHMENT_WAIT_INTERVAL,
        default: "600",
        description: "Seconds a degraded volume waits for a failed replica to come back before building a new one.",
        kind: SettingKind::Int { min: 0, max: None },
    },
    SettingDef {
        name: REBUILD_MAX_RETRY,
        default: "5",
        description: "Reuse attempts of one failed replica before a new replica is made instead.",
        kind: SettingKind::Int {
            min: 0,
            max: Some(100),
        },
    },
    SettingDef {
        name: CONCURRENT_REBUILD_PER_NODE_LIMIT,
        default: "5",
        description: "Rebuilds running at once on one node; 0 stops rebuilds.",
        kind: SettingKind::Int {
            min: 0,
            max: Some(64),
        },
    },
    SettingDef {
        name: OVER_PROVISIONING_PERCENTAGE,
        default: "100",
        description: "Sum of scheduled replica sizes allowed on a disk, as a percentage of its maximum minus reserved.",
        kind: SettingKind::Int { min: 0, max: None },
    },
    SettingDef {
        name: MINIMAL_AVAILABLE_PERCENTAGE,
        default: "25",
        description: "A disk whose free share would fall below this percentage takes no new replica.",
        kind: SettingKind::Int {
            min: 0,
            max: Some(100),
        },
    },
    SettingDef {
        name: DISABLE_SCHEDULING_ON_CORDONED_NODE,
        default: "true",
        description: "Whether cordoned nodes take no new replicas.",
        kind: SettingKind::Bool,
    },
    SettingDef {
        name: SCRUB_INTERVAL,
        default: "168",
        description: "Hours between two scrubs of a replica (every block of its frozen layers checked against its checksums; a corrupt replica is failed and rebuilt); 0 turns the scrub off.",
        kind: SettingKind::Int { min: 0, max: None },
    },
    SettingDef {
        name: SCRUB_RATE,
        default: "64",
        description: "MiB per second a scrub reads on a node (one replica at a time per node).",
        kind: SettingKind::Int {
            min: 1,
            max: Some(10240),
        },
    },
    SettingDef {
        name: SNAPSHOT_MAX_COUNT,
        default: "250",
        description: "User snapshots a volume may have at once; taking one more is refused.",
        kind: SettingKind::Int {
            min: 1,
            max: Some(250),
        },
    },
    SettingDef {
        name: MERGE_RATE,
        default: "128",
        description: "MiB per second a node copies to merge layers no snapshot needs (one replica at a time per node).",
        kind: SettingKind::Int {
            min: 1,
            max: Some(10240),
        },
    },
    SettingDef {
        name: ENGINE_REPLICA_TIMEOUT,
        default: "8",
        description: "Seconds a replica may leave a read or write of an attached volume unanswered (or, on an idle volume, the engine's ping) while another replica answers; then the engine gives it up (it is rebuilt or reused later). Engines started after a change use the new value.",
        kind: SettingKind::Int {
            min: 8,
            max: Some(30),
        },
    },
    SettingDef {
        name: OFFLINE_COPY_RATE,
        default: "0",
        description: "MiB per second a node copies to rebuild a replica of a detached volume or to restore a snapshot into a new volume, per copy, over the network or from a replica on its own disks; 0: no limit. A volume's own replicaRebuildRate, when set, takes its place. Rebuilds through an attached volume's engine take replica-rebuild-rate.",
        kind: SettingKind::Int {
            min: 0,
            max: Some(MAX_COPY_RATE as i64),
        },
    },
    SettingDef {
        name: REPLICA_REBUILD_RATE,
        default: "0",
        description: "MiB per second a node copies to rebuild a replica of an attached volume through its engine, per rebuild, over the network or from a replica on its own disks, taken when the rebuild starts; 0: no limit. A volume's own replicaRebuildRate, when set, takes its place. The volume stays degraded for as long as the copy lasts.",
        kind: SettingKind::Int {
            min: 0,
            max: Some(MAX_COPY_RATE as i64),
        },
    },
];

/// Why a setting name or value was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SettingError {
    #[error("unknown setting {name:?}; known settings: {known}")]
    Unknown { name: String, known: String },
    #[error("invalid value {value:?} for setting {name:?}; accepted values: {accepted}")]
    Invalid {
        name: String,
        value: String,
        accepted: String,
    },
}

/// Looks a setting up by name.
pub fn definition(name: &str) -> Result<&'static SettingDef, SettingError> {
    DEFINITIONS
        .iter()
        .find(|d| d.name == name)
        .ok_or_else(|| SettingError::Unknown {
            name: name.to_string(),
            known: DEFINITIONS
                .iter()
                .map(|d| d.name)
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// Validates `value` for setting `name` and returns its canonical form.
pub fn validate(name: &str, value: &str) -> Result<String, SettingError> {
    let def = definition(name)?;
    def.kind.check(value).map_err(|()| SettingError::Invalid {
        name: name.to_string(),
        value: value.to_string(),
        accepted: def.kind.accepted(),
    })
}

/// The effective value of every setting: defaults overlaid with what the
/// store holds. Values in the store were validated when they were written;
/// one that no longer validates (an older release's) falls back to the
/// default rather than breaking every reconcile.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    values: BTreeMap<&'static str, String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            values: DEFINITIONS
                .iter()
                .map(|d| (d.name, d.default.to_string()))
                .collect(),
        }
    }
}

impl Settings {
    /// Defaults overlaid with `(name, value)` pairs; unknown or invalid
    /// pairs are ignored (and logged).
    pub fn from_overrides<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut s = Settings::default();
        for (name, value) in pairs {
            match (definition(name), validate(name, value)) {
                (Ok(def), Ok(v)) => {
                    s.values.insert(def.name, v);
                }
                (_, Err(e)) => tracing::warn!(error = %e, "ignoring stored setting"),
                (Err(e), _) => tracing::warn!(error = %e, "ignoring stored setting"),
            }
        }
        s
    }

    /// The raw value of a setting (every known name has one).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    fn int(&self, name: &str) -> i64 {
        self.get(name)
            .and_then(|v| v.parse().ok())
            .or_else(|| definition(name).ok().and_then(|d| d.default.parse().ok()))
            .unwrap_or(0)
    }

    fn bool(&self, name: &str) -> bool {
        self.get(name) == Some("true")
    }

    fn word<T: std::str::FromStr>(&self, name: &str, fallback: T) -> T {
        self.get(name)
            .and_then(|v| v.parse().ok())
            .unwrap_or(fallback)
    }

    pub fn default_replica_count(&self) -> u32 {
        self.int(DEFAULT_REPLICA_COUNT).clamp(1, 20) as u32
    }
    pub fn default_data_locality(&self) -> DataLocality {
        self.word(DEFAULT_DATA_LOCALITY, DataLocality::Disabled)
    }
    pub fn replica_soft_anti_affinity(&self) -> bool {
        self.bool(REPLICA_SOFT_ANTI_AFFINITY)
    }
    pub fn replica_zone_soft_anti_affinity(&self) -> bool {
        self.bool(REPLICA_ZONE_SOFT_ANTI_AFFINITY)
    }
    pub fn replica_disk_soft_anti_affinity(&self) -> bool {
        self.bool(REPLICA_DISK_SOFT_ANTI_AFFINITY)
    }
    pub fn replica_auto_balance(&self) -> AutoBalance {
        self.word(REPLICA_AUTO_BALANCE, AutoBalance::Disabled)
    }
    pub fn disk_pressure_percentage(&self) -> u32 {
        self.int(DISK_PRESSURE_PERCENTAGE).clamp(0, 100) as u32
    }
    pub fn node_drain_policy(&self) -> NodeDrainPolicy {
        self.word(
            NODE_DRAIN_POLICY,
            NodeDrainPolicy::BlockIfContainsLastReplica,
        )
    }
    pub fn replenishment_wait_interval_secs(&self) -> u64 {
        self.int(REPLENISHMENT_WAIT_INTERVAL).max(0) as u64
    }
    pub fn rebuild_max_retry(&self) -> u32 {
        self.int(REBUILD_MAX_RETRY).clamp(0, 100) as u32
    }
    pub fn concurrent_rebuild_per_node_limit(&self) -> u32 {
        self.int(CONCURRENT_REBUILD_PER_NODE_LIMIT).clamp(0, 64) as u32
    }
    pub fn over_provisioning_percentage(&self) -> u64 {
        self.int(OVER_PROVISIONING_PERCENTAGE).max(0) as u64
    }
    /// Hours between two scrubs of a replica; 0: no scrub.
    pub fn scrub_interval_hours(&self) -> u64 {
        self.int(SCRUB_INTERVAL).max(0) as u64
    }
    /// Bytes per second a scrub reads.
    pub fn scrub_rate_bytes(&self) -> u64 {
        (self.int(SCRUB_RATE).clamp(1, 10240) as u64) << 20
    }
    pub fn minimal_available_percentage(&self) -> u32 {
        self.int(MINIMAL_AVAILABLE_PERCENTAGE).clamp(0, 100) as u32
    }
    /// `engine-replica-timeout`, in seconds.
    pub fn engine_replica_timeout_secs(&self) -> u32 {
        self.int(ENGINE_REPLICA_TIMEOUT).clamp(8, 30) as u32
    }

    /// Bytes per second a merge copies.
    pub fn merge_rate_bytes(&self) -> u64 {
        (self.int(MERGE_RATE).clamp(1, 10240) as u64) << 20
    }
    /// Bytes per second an offline rebuild or a restore pulls over the
    /// network; 0: no limit.
    pub fn offline_copy_rate_bytes(&self) -> u64 {
        (self.int(OFFLINE_COPY_RATE).clamp(0, MAX_COPY_RATE as i64) as u64) << 20
    }
    /// Bytes per second an attached volume's rebuild pulls over the
    /// network; 0: no limit.
    pub fn replica_rebuild_rate_bytes(&self) -> u64 {
        (self
            .int(REPLICA_REBUILD_RATE)
            .clamp(0, MAX_COPY_RATE as i64) as u64)
            << 20
    }
    /// User snapshots a volume may have at once.
    pub fn snapshot_max_count(&self) -> usize {
        self.int(SNAPSHOT_MAX_COUNT).clamp(1, 250) as usize
    }
    pub fn disable_scheduling_on_cordoned_node(&self) -> bool {
        self.bool(DISABLE_SCHEDULING_ON_CORDONED_NODE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_validates() {
        for d in DEFINITIONS {
            assert_eq!(
                validate(d.name, d.default).as_deref(),
                Ok(d.default),
                "{}",
                d.name
            );
        }
    }

    #[test]
    fn unknown_name_lists_known_names() {
        let e = validate("replica-count", "3").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("unknown setting"), "{text}");
        assert!(text.contains(DEFAULT_REPLICA_COUNT), "{text}");
    }

    #[test]
    fn bad_values_name_the_accepted_values() {
        let e = validate(REPLICA_AUTO_BALANCE, "always")
            .unwrap_err()
            .to_string();
        assert!(e.contains("disabled, least-effort, best-effort"), "{e}");
        let e = validate(DEFAULT_REPLICA_COUNT, "21")
            .unwrap_err()
            .to_string();
        assert!(e.contains("an integer from 1 to 20"), "{e}");
        let e = validate(REPLICA_SOFT_ANTI_AFFINITY, "yes")
            .unwrap_err()
            .to_string();
        assert!(e.contains("true, false"), "{e}");
        let e = validate(REPLENISHMENT_WAIT_INTERVAL, "-1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("an integer >= 0"), "{e}");
    }

    #[test]
    fn overrides_apply_and_typed_getters_read_them() {
        let s = Settings::from_overrides([
            (REPLICA_AUTO_BALANCE, "best-effort"),
            (DEFAULT_REPLICA_COUNT, "2"),
            (NODE_DRAIN_POLICY, "bogus"),
        ]);
        assert_eq!(s.replica_auto_balance(), AutoBalance::BestEffort);
        assert_eq!(s.default_replica_count(), 2);
        assert_eq!(
            s.node_drain_policy(),
            NodeDrainPolicy::BlockIfContainsLastReplica
        );
        assert_eq!(s.disk_pressure_percentage(), 90);
    }
}
