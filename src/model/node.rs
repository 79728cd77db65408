//! A node: its spec (zone, tags, scheduling, disks, as the operator sets
//! them) and status (readiness, disks' usage, endpoints, as it reports).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A node that hosts replicas on its disks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    pub id: String,
    #[serde(default)]
    pub resource_version: u64,
    pub spec: NodeSpec,
    #[serde(default)]
    pub status: NodeStatus,
}

custom_resource! {
    kind: "Node", root: "NodeResource", status: "NodeStatus", short: "bnode",
    options: [],
    columns: [
        ("Ready", "boolean", ".status.ready"),
        ("Zone", "string", ".spec.zone"),
        ("Schedulable", "boolean", ".spec.allowScheduling"),
        ("Disks", "integer", ".status.diskCount"),
    ],
    /// In Kubernetes, the spec of a `nodes.ballast.csi.dev` object, named as
    /// the Kubernetes Node it describes.
    #[serde(rename_all = "camelCase")]
    pub struct NodeSpec {
        #[serde(default)]
        pub zone: String,
        #[serde(default)]
        pub tags: Vec<String>,
        #[serde(default = "yes")]
        pub allow_scheduling: bool,
        #[serde(default)]
        pub eviction_requested: bool,
        /// Disk id -> what the operator wants of that disk.
        #[serde(default)]
        pub disks: BTreeMap<String, DiskSpec>,
    }
}

fn yes() -> bool {
    true
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskSpec {
    pub path: String,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default = "yes")]
    pub allow_scheduling: bool,
    #[serde(default)]
    pub eviction_requested: bool,
    /// Bytes kept free for other uses; not schedulable.
    #[serde(default, with = "crate::quantity::serde_size")]
    #[schemars(schema_with = "crate::quantity::size_schema")]
    pub storage_reserved: u64,
}

impl DiskSpec {
    pub fn new(path: impl Into<String>, tags: Vec<String>) -> Self {
        DiskSpec {
            path: path.into(),
            tags,
            allow_scheduling: true,
            eviction_requested: false,
            storage_reserved: 0,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    #[serde(default)]
    pub ready: bool,
    /// Outside Kubernetes, set through the API; inside, read from the
    /// Kubernetes node's `spec.unschedulable`.
    #[serde(default)]
    pub cordoned: bool,
    #[serde(default)]
    pub auto_evicting: bool,
    #[serde(default)]
    pub drain_blocked: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_blocked_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat: Option<DateTime<Utc>>,
    /// Why the node is down whatever its heartbeats say: on Kubernetes,
    /// its Node was deleted or has been NotReady for the node-down
    /// timeout. While set, heartbeats do not make the node ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_down: Option<String>,
    #[serde(default)]
    pub disks: BTreeMap<String, DiskStatus>,
    /// How many disks `disks` holds (a column of `kubectl get`).
    #[serde(default)]
    pub disk_count: u32,
    /// Where the controller reaches this node's agent.
    #[serde(default)]
    pub agent_endpoint: String,
    #[serde(default)]
    pub replica_endpoint: String,
    #[serde(default)]
    pub csi_endpoint: String,
    #[serde(default)]
    pub version: String,
    /// The most volumes that may be published at this node at once, as it
    /// registered (`--max-volumes-per-node`; 0: no limit).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_volumes: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskStatus {
    #[serde(default)]
    pub ready: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default)]
    pub storage_maximum: u64,
    #[serde(default)]
    pub storage_available: u64,
    #[serde(default)]
    pub storage_scheduled: u64,
    #[serde(default)]
    pub scheduled_replicas: Vec<String>,
    /// Used share at or above `replica-auto-balance-disk-pressure-percentage`.
    #[serde(default)]
    pub pressure: bool,
}
