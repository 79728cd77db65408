//! A replica: where it lives (volume, node, disk), its history (failed
//! and healthy times, rebuild attempts) and what its node reports.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{DesiredState, ReplicaMode};

/// One copy of a volume's data on one disk of one node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Replica {
    pub name: String,
    #[serde(default)]
    pub resource_version: u64,
    pub spec: ReplicaSpec,
    #[serde(default)]
    pub status: ReplicaStatus,
}

custom_resource! {
    kind: "Replica", root: "ReplicaResource", status: "ReplicaStatus", short: "brep",
    options: [],
    columns: [
        ("Volume", "string", ".spec.volume"),
        ("Node", "string", ".spec.nodeId"),
        ("Disk", "string", ".spec.diskId"),
        ("Mode", "string", ".status.mode"),
    ],
    /// In Kubernetes, the spec of a `replicas.ballast.csi.dev` object.
    #[serde(rename_all = "camelCase")]
    pub struct ReplicaSpec {
        pub volume: String,
        pub node_id: String,
        pub disk_id: String,
        /// `<disk>/replicas/<volume>-<replicaId>/`, relative to the disk.
        pub data_directory: String,
        pub desired_state: DesiredState,
        #[serde(default)]
        pub eviction_requested: bool,
        #[serde(default)]
        pub rebuild_retry_count: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub failed_at: Option<DateTime<Utc>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub healthy_at: Option<DateTime<Utc>>,
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaStatus {
    /// None until an engine has opened the replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ReplicaMode>,
    #[serde(default)]
    pub running: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuild_progress: Option<RebuildProgress>,
    /// When the scrub last checked its frozen layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrubbed_at: Option<chrono::DateTime<chrono::Utc>>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RebuildProgress {
    pub done: u64,
    pub total: u64,
}

impl RebuildProgress {
    /// Percent done, 0 to 100; 0 while the total is not known yet.
    pub fn percent(&self) -> u64 {
        if self.total == 0 {
            return 0;
        }
        self.done.min(self.total).saturating_mul(100) / self.total
    }
}
