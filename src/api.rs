//! The REST API's shapes that are not stored records, shared by the
//! controller that answers with them and the clients that read them
//! (ballastctl): lists, a volume with a summary of its replicas, and a
//! setting with its definition.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::{RebuildProgress, ReplicaMode, Volume};

/// Every answer that lists objects: `{"items": [...]}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct List<T> {
    pub items: Vec<T>,
}

/// One replica of a volume, as `GET /v1/volumes/{name}` summarises it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaSummary {
    pub name: String,
    pub node_id: String,
    pub disk_id: String,
    pub mode: Option<ReplicaMode>,
    pub running: bool,
    pub rebuild_progress: Option<RebuildProgress>,
}

/// A volume as `GET /v1/volumes/{name}` answers: the record, with its
/// replicas' summary in `status.replicas`.
#[derive(Clone, Debug, PartialEq)]
pub struct VolumeDetail {
    pub volume: Volume,
    pub replicas: Vec<ReplicaSummary>,
}

impl VolumeDetail {
    pub fn to_json(&self) -> Result<Value, serde_json::Error> {
        let mut v = serde_json::to_value(&self.volume)?;
        v["status"]["replicas"] = serde_json::to_value(&self.replicas)?;
        Ok(v)
    }

    pub fn from_json(v: &Value) -> Result<Self, serde_json::Error> {
        let replicas = match v["status"].get("replicas") {
            Some(r) => serde_json::from_value(r.clone())?,
            None => Vec::new(),
        };
        Ok(VolumeDetail {
            volume: serde_json::from_value(v.clone())?,
            replicas,
        })
    }
}

/// A setting: its value, default, what it means and what it accepts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SettingView {
    pub name: String,
    pub value: String,
    pub default: String,
    pub description: String,
    pub accepted: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::VolumeSpec;

    #[test]
    fn a_volume_detail_round_trips_with_its_replicas_in_its_status() {
        let d = VolumeDetail {
            volume: Volume {
                name: "v".into(),
                resource_version: 3,
                spec: VolumeSpec::new(1 << 30, 2),
                status: Default::default(),
            },
            replicas: vec![ReplicaSummary {
                name: "v-r1".into(),
                node_id: "n1".into(),
                disk_id: "d1".into(),
                mode: Some(ReplicaMode::Wo),
                running: true,
                rebuild_progress: Some(RebuildProgress { done: 1, total: 4 }),
            }],
        };
        let v = d.to_json().unwrap();
        assert_eq!(v["status"]["replicas"][0]["nodeId"], "n1");
        assert_eq!(VolumeDetail::from_json(&v).unwrap(), d);
    }
}
