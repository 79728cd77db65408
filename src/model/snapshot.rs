//! A user snapshot of a volume: the volume's data at one point, kept as a
//! frozen layer labelled with the snapshot's name in every replica that
//! took it. The record is the intent and the catalogue; the data lives in
//! the source volume's replicas.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A snapshot of a volume; its name is its id (the CSI snapshot id).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    pub name: String,
    #[serde(default)]
    pub resource_version: u64,
    pub spec: SnapshotSpec,
    #[serde(default)]
    pub status: SnapshotStatus,
}

custom_resource! {
    kind: "Snapshot", root: "SnapshotResource", status: "SnapshotStatus", short: "bsnap",
    options: [],
    columns: [
        ("Volume", "string", ".spec.volume"),
        ("Ready", "boolean", ".status.readyToUse"),
        ("Size", "integer", ".status.size"),
    ],
    /// In Kubernetes, the spec of a `snapshots.ballast.csi.dev` object.
    #[serde(rename_all = "camelCase")]
    pub struct SnapshotSpec {
        /// The volume it is a snapshot of.
        pub volume: String,
        /// The name a CO gave in CSI CreateSnapshot, for a snapshot made
        /// through CSI: a repeated CreateSnapshot is matched by it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub csi_name: Option<String>,
        /// Made by Ballast for a clone, not by a user: it does not count
        /// toward `snapshot-max-count`, and goes once the clone is filled.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        pub internal: bool,
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotStatus {
    /// Every replica that was to take it has it: it can be restored.
    #[serde(default)]
    pub ready_to_use: bool,
    /// The volume's size when it was taken, in bytes: the smallest volume
    /// it restores into.
    #[serde(default)]
    pub size: u64,
    /// When it was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
    /// Bytes of data the volume held at the snapshot, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated: Option<u64>,
}
