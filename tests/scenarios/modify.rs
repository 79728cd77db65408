//! ControllerModifyVolume (a VolumeAttributesClass change) on real
//! processes: the planner acts on the new spec, and the data stays.

use std::collections::HashMap;
use std::time::Duration;

use ballast::proto::csi::v1::ControllerModifyVolumeRequest;
use ballast::proto::csi::v1::controller_client::ControllerClient;
use serde_json::json;

use crate::harness::*;

fn modify(c: &Cluster, volume: &str, params: &[(&str, &str)]) -> Result<(), tonic::Status> {
    let req = ControllerModifyVolumeRequest {
        volume_id: volume.into(),
        mutable_parameters: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<HashMap<_, _>>(),
        ..Default::default()
    };
    runtime().block_on(async {
        let ch = ballast::grpc::unix_channel(&c.ctl.socket).unwrap();
        ControllerClient::new(ch)
            .controller_modify_volume(req)
            .await
            .map(drop)
    })
}

#[test]
fn a_modified_replica_count_is_acted_on_and_the_data_stays() {
    let c = Cluster::start(3, 1);
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 2}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 2, Duration::from_secs(60));
    let data = write_data(c.dir.path(), &endpoint, 31);

    // A key that cannot change, and a bad value: refused, nothing changes.
    let e = modify(&c, "v", &[("fsType", "xfs")]).unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(
        e.message()
            .contains("numberOfReplicas, dataLocality, replicaAutoBalance"),
        "{e}"
    );
    let e = modify(&c, "v", &[("numberOfReplicas", "0")]).unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert_eq!(c.volume("v")["spec"]["numberOfReplicas"], 2);

    // Up to three: a third replica is rebuilt; then down to one.
    modify(&c, "v", &[("numberOfReplicas", "3")]).unwrap();
    assert_eq!(c.volume("v")["spec"]["numberOfReplicas"], 3);
    c.wait_settled("v", 3, Duration::from_secs(90));
    verify_data(c.dir.path(), &endpoint, &data);
    modify(&c, "v", &[("numberOfReplicas", "1")]).unwrap();
    c.wait_settled("v", 1, Duration::from_secs(90));
    verify_data(c.dir.path(), &endpoint, &data);
    c.ok("POST", "/v1/volumes/v/detach", None);
    verify_replicas(&c, "v", &data);

    let e = modify(&c, "no-such-volume", &[("numberOfReplicas", "2")]).unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
}

/// A volume never attached follows a lowered replica count too: its
/// replicas, which no engine has opened yet, hold all the data there is
/// and count as rw, so the extra one goes before the first attach, and
/// the volume serves as any other does.
#[test]
fn a_volume_never_attached_follows_a_lowered_replica_count() {
    let c = Cluster::start(3, 1);
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 3}));
    modify(&c, "v", &[("numberOfReplicas", "2")]).unwrap();
    let left = wait_for(Duration::from_secs(60), "v: 2 replicas", || {
        let reps = c.replicas("v");
        (reps.len() == 2).then_some(reps)
    });
    let mut names: Vec<String> = left
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    let v = c.volume("v");
    let mut current: Vec<String> = v["status"]["currentReplicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect();
    current.sort();
    assert_eq!(current, names, "{v:#}");

    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 2, Duration::from_secs(60));
    let data = write_data(c.dir.path(), &endpoint, 41);
    verify_data(c.dir.path(), &endpoint, &data);
    c.ok("POST", "/v1/volumes/v/detach", None);
    verify_replicas(&c, "v", &data);
}
