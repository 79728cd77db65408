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
    // A controller address where nothing listens. The node runs without
    // TLS: with TLS on, a node serves nothing before a controller enrolled
    // it, and there is none here.
    let nobody = format!("http://{}", free_addr());
    let (mut args, socket) = node_args(dir.path(), "node-1", &nobody);
    let at = args.iter().position(|a| a == "--cluster-ca-file").unwrap();
    args.drain(at..at + 2);
    let n = NodeProc {
        proc: Proc::spawn(&args, dir.path().join("node-1.log")),
        id: "node-1".into(),
        socket,
        args,
    };
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

/// CSI topology: a node reports its id (and its zone) in NodeGetInfo; a
/// strict-local volume is made on the node its requirements prefer, says
/// so in its accessible topology, and is refused when they name no Ballast
/// node; any other volume is accessible from every node.
#[test]
fn a_strict_local_volume_lands_on_the_node_its_topology_prefers_and_says_so() {
    use ballast::proto::csi::v1::controller_client::ControllerClient;
    use ballast::proto::csi::v1::node_client::NodeClient;
    use ballast::proto::csi::v1::{
        CreateVolumeRequest, NodeGetInfoRequest, Topology, TopologyRequirement,
    };
    use ballast::topology::{NODE_KEY, ZONE_KEY};

    let dir = tempfile::tempdir().unwrap();
    let (ctl, _n1) = controller_with_one_node(dir.path());
    let n2 = start_node(dir.path(), "node-2", &format!("http://{}", ctl.agent));
    wait_for(Duration::from_secs(90), "node-2 ready", || {
        node(&ctl.api, "node-2").filter(node_is_up)
    });
    let at = |n: &str| Topology {
        segments: [(NODE_KEY.to_string(), n.to_string())].into(),
    };
    let request =
        |name: &str, locality: &str, preferred: &[&str], requisite: &[&str]| CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(ballast::proto::csi::v1::CapacityRange {
                required_bytes: 16 << 20,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![ballast_sanity::single_writer_mount()],
            parameters: [
                ("numberOfReplicas".to_string(), "1".to_string()),
                ("dataLocality".to_string(), locality.to_string()),
            ]
            .into(),
            accessibility_requirements: Some(TopologyRequirement {
                requisite: requisite.iter().map(|n| at(n)).collect(),
                preferred: preferred.iter().map(|n| at(n)).collect(),
            }),
            ..Default::default()
        };
    let rt = runtime();
    let info = rt
        .block_on(async {
            NodeClient::new(ballast::grpc::unix_channel(&n2.socket).unwrap())
                .node_get_info(NodeGetInfoRequest {})
                .await
        })
        .unwrap()
        .into_inner();
    let topo = info.accessible_topology.unwrap().segments;
    assert_eq!(topo[NODE_KEY], "node-2");
    assert_eq!(topo[ZONE_KEY], "zone-node-2", "the zone its plugin knows");

    let create = |req: CreateVolumeRequest| {
        rt.block_on(async {
            ControllerClient::new(ballast::grpc::unix_channel(&ctl.socket).unwrap())
                .create_volume(req)
                .await
                .map(|r| r.into_inner().volume.unwrap())
        })
    };
    let req = request("pinned", "strict-local", &["node-2"], &["node-1", "node-2"]);
    let v = create(req.clone()).unwrap();
    assert_eq!(v.accessible_topology, [at("node-2")], "{v:?}");
    let again = create(req).unwrap();
    assert_eq!(
        again.volume_id, v.volume_id,
        "the same request, the same volume"
    );
    let replicas = get_json(&format!("{}/v1/replicas?volume={}", ctl.api, v.volume_id)).unwrap();
    let on: Vec<&str> = replicas["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["spec"]["nodeId"].as_str())
        .collect();
    assert_eq!(
        on,
        ["node-2"],
        "its one replica is on the preferred node: {replicas}"
    );
    let rec = get_json(&format!("{}/v1/volumes/{}", ctl.api, v.volume_id)).unwrap();
    assert_eq!(rec["spec"]["pinnedNode"], "node-2", "{rec}");

    let nowhere = create(request("nowhere", "strict-local", &["node-9"], &["node-9"])).unwrap_err();
    assert_eq!(
        nowhere.code(),
        tonic::Code::ResourceExhausted,
        "{nowhere:?}"
    );
    assert!(nowhere.message().contains("node-9"), "{nowhere:?}");

    let anywhere = create(request("anywhere", "disabled", &["node-1"], &["node-1"])).unwrap();
    assert!(
        anywhere.accessible_topology.is_empty(),
        "accessible from every node: {anywhere:?}"
    );
}
