//! A volume: its spec (what the user asked for) and status (what the
//! controller records), with their defaults and the largest size.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    AccessMode, DataLocality, Frontend, FsType, Robustness, VolumeAutoBalance, VolumeState,
};

/// The largest volume: 16 TiB, the largest file ext4 makes with 4 KiB
/// blocks (every layer of a replica is a file of the volume's size).
pub const MAX_VOLUME_SIZE: u64 = 16 << 40;

/// A replicated block volume.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    pub name: String,
    #[serde(default)]
    pub resource_version: u64,
    pub spec: VolumeSpec,
    /// Absent only from a record whose create was cut off before its status
    /// was written (on Kubernetes the status is a request of its own): such
    /// a volume is still being created, and never taken for a whole one.
    #[serde(default = "VolumeStatus::unwritten")]
    pub status: VolumeStatus,
}

custom_resource! {
    kind: "Volume", root: "VolumeResource", status: "VolumeStatus", short: "bvol",
    options: [],
    columns: [
        ("State", "string", ".status.state"),
        ("Robustness", "string", ".status.robustness"),
        ("Size", "integer", ".spec.size"),
        ("Replicas", "integer", ".spec.numberOfReplicas"),
        ("Node", "string", ".status.attachedNode"),
    ],
    /// In Kubernetes, the spec of a `volumes.ballast.csi.dev` object.
    #[serde(rename_all = "camelCase")]
    pub struct VolumeSpec {
        /// Bytes.
        #[serde(with = "crate::quantity::serde_size")]
        #[schemars(schema_with = "crate::quantity::size_schema")]
        pub size: u64,
        pub number_of_replicas: u32,
        /// None follows the setting `default-data-locality`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub data_locality: Option<DataLocality>,
        #[serde(default = "default_auto_balance")]
        pub replica_auto_balance: VolumeAutoBalance,
        /// Minutes after which a failed replica is deleted.
        #[serde(default = "default_stale_timeout")]
        pub stale_replica_timeout: u64,
        /// MiB/s that each copy rebuilding one of its replicas may take,
        /// attached (by its engine) or detached, over the network or from
        /// a replica on the same node. 0 follows the settings
        /// `replica-rebuild-rate` and `offline-copy-rate`.
        #[serde(default, skip_serializing_if = "is_zero")]
        pub replica_rebuild_rate: u64,
        #[serde(default)]
        pub disk_selector: Vec<String>,
        #[serde(default)]
        pub node_selector: Vec<String>,
        #[serde(default = "default_access_mode")]
        pub access_mode: AccessMode,
        #[serde(default = "default_fs_type")]
        pub fs_type: FsType,
        #[serde(default = "default_frontend")]
        pub frontend: Frontend,
        /// Extra mkfs arguments for a mount volume's filesystem.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        pub mkfs_params: String,
        /// The name a CO gave in CSI CreateVolume (any string of 1 to 128
        /// bytes), for a volume created through CSI. A repeated CreateVolume
        /// is matched by it; the volume's own name is the id the CO gets back.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub csi_name: Option<String>,
        /// A strict-local volume's node: its one replica lives there, and
        /// nowhere else. Chosen at creation (through CSI, from the CO's
        /// topology requirements: the node its pod is scheduled to).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub pinned_node: Option<String>,
        /// Where the new volume's data came from: a snapshot (a restore)
        /// or another volume (a clone). None: it started empty.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub source: Option<VolumeSource>,
    }
}

/// The data a volume starts with: one of the two is set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeSource {
    /// The snapshot restored into it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// The volume it is a clone of (taken through a snapshot of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}
fn default_auto_balance() -> VolumeAutoBalance {
    VolumeAutoBalance::Ignored
}
/// Two days, in minutes.
pub const DEFAULT_STALE_REPLICA_TIMEOUT: u64 = 2880;
fn default_stale_timeout() -> u64 {
    DEFAULT_STALE_REPLICA_TIMEOUT
}
fn default_access_mode() -> AccessMode {
    AccessMode::ReadWriteOnce
}
fn default_fs_type() -> FsType {
    FsType::Ext4
}
fn default_frontend() -> Frontend {
    Frontend::BlockDev
}

impl VolumeSpec {
    /// A spec with the given size and replica count and every other field
    /// at its default.
    pub fn new(size: u64, number_of_replicas: u32) -> Self {
        VolumeSpec {
            size,
            number_of_replicas,
            data_locality: None,
            replica_auto_balance: default_auto_balance(),
            stale_replica_timeout: default_stale_timeout(),
            replica_rebuild_rate: 0,
            disk_selector: Vec::new(),
            node_selector: Vec::new(),
            access_mode: default_access_mode(),
            fs_type: default_fs_type(),
            frontend: default_frontend(),
            mkfs_params: String::new(),
            csi_name: None,
            pinned_node: None,
            source: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStatus {
    pub state: VolumeState,
    pub robustness: Robustness,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attached_node: Option<String>,
    /// Published read-only (CSI ControllerPublishVolume's `readonly`): the
    /// node mounts it read-only wherever it is published.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub attached_readonly: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_degraded_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frontend_endpoint: Option<String>,
    /// The generation of the replica set: it changes whenever the set of
    /// replicas holding the latest acknowledged data does (0: never
    /// recorded, a volume from before the record existed).
    #[serde(default)]
    pub generation: u64,
    /// The replicas that hold every acknowledged write. An engine is started
    /// with these only; the engine records a change here before it
    /// acknowledges a write that a replica it dropped lacks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub current_replicas: Vec<String>,
    /// The volume's latest attachment: it grows by one at every start of
    /// an engine (the engine carries it to the replicas) and at every
    /// detach (which ends it at the replicas). Replicas refuse the writes
    /// of engines started for an earlier one (0: none since the count
    /// existed).
    #[serde(default)]
    pub engine_epoch: u64,
    /// Bytes the data takes in each replica, when known (else the size
    /// counts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actual_size: Option<u64>,
}

impl VolumeStatus {
    /// The status of a volume whose record has none: being created.
    pub fn unwritten() -> Self {
        VolumeStatus {
            state: VolumeState::Creating,
            ..Default::default()
        }
    }
}

impl Default for VolumeStatus {
    fn default() -> Self {
        VolumeStatus {
            state: VolumeState::Detached,
            robustness: Robustness::Unknown,
            attached_node: None,
            attached_readonly: false,
            last_degraded_at: None,
            conditions: Vec::new(),
            frontend_endpoint: None,
            generation: 0,
            current_replicas: Vec::new(),
            engine_epoch: 0,
            actual_size: None,
        }
    }
}

/// A named condition with a reason a person can read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub kind: String,
    pub status: bool,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<DateTime<Utc>>,
}
