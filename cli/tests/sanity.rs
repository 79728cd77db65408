//! Ballast's own CSI checks (`tests/sanity`: what csi-sanity does not
//! check) against the sockets of a real controller and a real node.

mod common;

use std::time::Duration;

use ballast_sanity::{Expectations, Target, controller_checks, identity_checks};
use common::*;

fn check(socket: &std::path::Path, target: Target, ready: bool) {
    let rt = runtime();
    let outcomes = rt.block_on(async {
        let ch = ballast::grpc::unix_channel(socket).unwrap();
        let exp = Expectations {
            target,
            driver_name: ballast::DRIVER_NAME.into(),
            ready: Some(ready),
            node_id: None,
        };
        identity_checks(&ch, &exp).await
    });
    assert!(!outcomes.is_empty());
    let failures: Vec<String> = outcomes
        .iter()
        .filter_map(|o| o.failure.as_ref().map(|f| format!("{}: {f}", o.name)))
        .collect();
    assert!(
        failures.is_empty(),
        "{target:?} failed:\n{}",
        failures.join("\n")
    );
}

#[test]
fn identity_checks_pass_on_the_controller_and_node_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let (ctl, n) = controller_with_one_node(dir.path());
    check(&ctl.socket, Target::Controller, true);
    check(&n.socket, Target::Node, true);
}

#[test]
fn a_node_that_has_not_registered_probes_not_ready_and_the_checks_see_it() {
    let dir = tempfile::tempdir().unwrap();
    // A controller address where nothing listens.
    let nobody = format!("http://{}", free_addr());
    let n = start_node(dir.path(), "node-1", &nobody);
    wait_for(Duration::from_secs(30), "node socket", || {
        n.socket.exists().then_some(())
    });
    check(&n.socket, Target::Node, false);
    // The same checks, expecting ready, must fail: the check can fail.
    let rt = runtime();
    let outcomes = rt.block_on(async {
        let ch = ballast::grpc::unix_channel(&n.socket).unwrap();
        let exp = Expectations {
            target: Target::Node,
            driver_name: ballast::DRIVER_NAME.into(),
            ready: Some(true),
            node_id: None,
        };
        identity_checks(&ch, &exp).await
    });
    assert!(outcomes.iter().any(|o| {
        o.failure
            .as_deref()
            .is_some_and(|f| f.contains("ready=false"))
    }));
}

#[test]
fn the_checks_fail_against_the_wrong_driver_name() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = start_controller(dir.path(), "30s");
    let rt = runtime();
    let outcomes = rt.block_on(async {
        let ch = ballast::grpc::unix_channel(&ctl.socket).unwrap();
        let exp = Expectations {
            target: Target::Node,
            driver_name: "other.csi.dev".into(),
            ready: None,
            node_id: None,
        };
        identity_checks(&ch, &exp).await
    });
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| o.failure.is_some())
        .map(|o| o.name)
        .collect();
    assert!(
        failed.iter().any(|n| n.contains("GetPluginInfo")),
        "{failed:?}"
    );
    assert_eq!(failed.len(), 1, "only the name is wrong: {failed:?}");
}

#[test]
fn controller_checks_pass_against_a_controller_with_a_node_and_fail_against_a_node_socket() {
    let dir = tempfile::tempdir().unwrap();
    let (ctl, n) = controller_with_one_node(dir.path());
    let rt = runtime();
    let run = |socket: &std::path::Path| {
        rt.block_on(async {
            let ch = ballast::grpc::unix_channel(socket).unwrap();
            let exp = Expectations {
                target: Target::Controller,
                driver_name: ballast::DRIVER_NAME.into(),
                ready: Some(true),
                node_id: Some("node-1".into()),
            };
            controller_checks(&ch, &exp).await
        })
    };
    let outcomes = run(&ctl.socket);
    assert_eq!(outcomes.len(), 4, "the publish check ran too");
    let failures: Vec<String> = outcomes
        .iter()
        .filter_map(|o| o.failure.as_ref().map(|f| format!("{}: {f}", o.name)))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Nothing the checks made is left.
    let left = get_json(&format!("{}/v1/volumes", ctl.api)).unwrap();
    assert_eq!(left["items"].as_array().map(Vec::len), Some(0), "{left}");
    // A node socket serves no Controller service: every check fails.
    let outcomes = run(&n.socket);
    assert!(outcomes.iter().all(|o| o.failure.is_some()), "{outcomes:?}");
}

#[test]
fn a_co_name_shows_beside_its_volume_id_in_rest_and_ballastctl() {
    use ballast::proto::csi::v1::controller_client::ControllerClient;
    use ballast::proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume};
    use ballast::proto::csi::v1::{CreateVolumeRequest, VolumeCapability};

    let dir = tempfile::tempdir().unwrap();
    let (ctl, _n) = controller_with_one_node(dir.path());
    let name = "Data.Base_01";
    let rt = runtime();
    let id = rt.block_on(async {
        let mut c = ControllerClient::new(ballast::grpc::unix_channel(&ctl.socket).unwrap());
        c.create_volume(CreateVolumeRequest {
            name: name.into(),
            volume_capabilities: vec![VolumeCapability {
                access_type: Some(AccessType::Mount(MountVolume::default())),
                access_mode: Some(AccessMode { mode: 1 }),
            }],
            parameters: [("numberOfReplicas".to_string(), "1".to_string())].into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id
    });
    assert!(id.starts_with("data-base-01-"), "{id}");
    let v = get_json(&format!("{}/v1/volumes/{id}", ctl.api)).unwrap();
    assert_eq!(v["name"], id.as_str(), "{v}");
    assert_eq!(v["spec"]["csiName"], name, "{v}");
    let (ok, out, err) = ballastctl(&ctl.api, &["volume", "get", &id]);
    assert!(ok, "{err}");
    let header = out.lines().next().unwrap_or_default();
    assert!(header.contains("CSI NAME"), "{out}");
    assert!(out.contains(&id) && out.contains(name), "{out}");
}
