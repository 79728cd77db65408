//! The scenario format of `ballast sim` (a contract: external tests use
//! it). Unknown keys are refused; errors name the key and the line.

use std::collections::BTreeMap;

use ballast::model::{DataLocality, VolumeAutoBalance};
use serde::Deserialize;

fn yes() -> bool {
    true
}

fn one() -> u32 {
    1
}

/// A setting value: YAML strings, booleans and numbers are all accepted.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Scalar {
    Bool(bool),
    Int(i64),
    Text(String),
}

impl std::fmt::Display for Scalar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Int(n) => write!(f, "{n}"),
            Scalar::Text(s) => f.write_str(s),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Scenario {
    #[serde(default)]
    pub settings: BTreeMap<String, Scalar>,
    #[serde(default = "one")]
    pub rebuild_ticks: u32,
    pub nodes: Vec<NodeSpec>,
    #[serde(default)]
    pub volumes: Vec<VolumeSpec>,
    #[serde(default)]
    pub steps: Vec<Step>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSpec {
    pub id: String,
    #[serde(default)]
    pub zone: String,
    #[serde(default = "yes")]
    pub allow_scheduling: bool,
    #[serde(default)]
    pub cordoned: bool,
    #[serde(default)]
    pub eviction_requested: bool,
    #[serde(default = "yes")]
    pub ready: bool,
    #[serde(default)]
    pub tags: Vec<String>,
    pub disks: Vec<DiskSpec>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiskSpec {
    pub id: String,
    #[serde(with = "ballast::quantity::serde_size")]
    pub size: u64,
    /// Bytes used by other data.
    #[serde(default, with = "ballast::quantity::serde_size")]
    pub used: u64,
    #[serde(default, with = "ballast::quantity::serde_size")]
    pub reserved: u64,
    #[serde(default = "yes")]
    pub allow_scheduling: bool,
    #[serde(default)]
    pub eviction_requested: bool,
    #[serde(default)]
    pub tags: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeSpec {
    pub name: String,
    #[serde(with = "ballast::quantity::serde_size")]
    pub size: u64,
    /// Bytes each replica holds; defaults to the size.
    #[serde(
        default,
        deserialize_with = "ballast::quantity::serde_size_opt::deserialize"
    )]
    pub actual_size: Option<u64>,
    pub number_of_replicas: u32,
    #[serde(default)]
    pub attached_node: Option<String>,
    #[serde(default = "ignored")]
    pub replica_auto_balance: VolumeAutoBalance,
    #[serde(default)]
    pub data_locality: Option<DataLocality>,
    #[serde(default)]
    pub disk_selector: Vec<String>,
    #[serde(default)]
    pub node_selector: Vec<String>,
    /// Minutes.
    #[serde(default = "stale_default")]
    pub stale_replica_timeout: u64,
}

fn ignored() -> VolumeAutoBalance {
    VolumeAutoBalance::Ignored
}

fn stale_default() -> u64 {
    ballast::model::DEFAULT_STALE_REPLICA_TIMEOUT
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodePatch {
    pub id: String,
    pub zone: Option<String>,
    pub allow_scheduling: Option<bool>,
    pub cordoned: Option<bool>,
    pub eviction_requested: Option<bool>,
    pub ready: Option<bool>,
    pub tags: Option<Vec<String>>,
    /// Rebuilds onto this node fail when they finish (to test reuse limits).
    pub rebuilds_fail: Option<bool>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiskPatch {
    pub node: String,
    pub id: String,
    #[serde(
        default,
        deserialize_with = "ballast::quantity::serde_size_opt::deserialize"
    )]
    pub used: Option<u64>,
    pub allow_scheduling: Option<bool>,
    pub eviction_requested: Option<bool>,
    pub tags: Option<Vec<String>>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumePatch {
    pub name: String,
    pub number_of_replicas: Option<u32>,
    pub replica_auto_balance: Option<VolumeAutoBalance>,
    pub data_locality: Option<DataLocality>,
    /// Attach to a node; an empty string detaches.
    pub attached_node: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReplicaRef {
    pub volume: String,
    pub node: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettingStep {
    pub name: String,
    pub value: Scalar,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Advance {
    pub seconds: u64,
}

/// One step of a scenario.
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "StepMap")]
pub enum Step {
    /// Tick until nothing is pending (at most 1000 ticks); prints a line.
    Settle(Empty),
    Node(NodePatch),
    Disk(DiskPatch),
    AddNode(NodeSpec),
    AddVolume(VolumeSpec),
    /// One rw replica of the volume on the node turns err.
    FailReplica(ReplicaRef),
    /// Deletes one replica of the volume on the node (any state).
    DeleteReplica(ReplicaRef),
    Setting(SettingStep),
    Volume(VolumePatch),
    Advance(Advance),
}

/// A step as written: a map with exactly one key.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepMap {
    settle: Option<Empty>,
    node: Option<NodePatch>,
    disk: Option<DiskPatch>,
    add_node: Option<NodeSpec>,
    add_volume: Option<VolumeSpec>,
    fail_replica: Option<ReplicaRef>,
    delete_replica: Option<ReplicaRef>,
    setting: Option<SettingStep>,
    volume: Option<VolumePatch>,
    advance: Option<Advance>,
}

impl TryFrom<StepMap> for Step {
    type Error = String;

    fn try_from(m: StepMap) -> Result<Step, String> {
        let steps: Vec<Step> = [
            m.settle.map(Step::Settle),
            m.node.map(Step::Node),
            m.disk.map(Step::Disk),
            m.add_node.map(Step::AddNode),
            m.add_volume.map(Step::AddVolume),
            m.fail_replica.map(Step::FailReplica),
            m.delete_replica.map(Step::DeleteReplica),
            m.setting.map(Step::Setting),
            m.volume.map(Step::Volume),
            m.advance.map(Step::Advance),
        ]
        .into_iter()
        .flatten()
        .collect();
        match <[Step; 1]>::try_from(steps) {
            Ok([step]) => Ok(step),
            Err(v) => Err(format!(
                "a step has exactly one key (settle, node, disk, addNode, addVolume, failReplica, deleteReplica, setting, volume, advance); this one has {}",
                v.len()
            )),
        }
    }
}

/// A scenario error, with the line when the YAML parser knows it.
#[derive(Debug, thiserror::Error)]
#[error("{}{message}", line.map(|l| format!("line {l}: ")).unwrap_or_default())]
pub struct ScenarioError {
    pub line: Option<usize>,
    pub message: String,
}

impl Scenario {
    pub fn parse(text: &str) -> Result<Scenario, ScenarioError> {
        serde_yaml_ng::from_str(text).map_err(|e| ScenarioError {
            line: e.location().map(|l| l.line()),
            message: e.to_string(),
        })
    }
}
