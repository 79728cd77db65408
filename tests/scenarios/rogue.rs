//! A peer on the node network that should not be trusted (issue 21): what
//! it sends a replica is refused where it would cost data, and the
//! volume's data is checked by checksum afterwards.

use std::time::Duration;

use ballast_node::replica::LayerSpec;
use ballast_node::wire::JoinSpec;
use ballast_node::wire::client::ReplicaClient;
use serde_json::json;

use crate::harness::*;

/// The two JOINs a rogue peer would send to empty a replica and have it
/// win the next attach: the one of the security review (no frozen layer,
/// a far revision), and one that names the replica's own frozen layers so
/// that nothing is left to fill.
async fn rogue_joins(addr: &str, name: &str) -> Vec<String> {
    let client = ReplicaClient::connect(addr, name).await.unwrap();
    let layers = client.layers().await.unwrap();
    let own: Vec<LayerSpec> = layers
        .iter()
        .filter_map(|l| {
            let checksum = l.checksum.clone()?;
            Some(LayerSpec {
                name: l.name.clone(),
                checksum,
            })
        })
        .collect();
    let next_head = format!("layer-{:06}.img", layers.len() + 1);
    let joins = [
        JoinSpec {
            frozen: Vec::new(),
            head: "layer-000099.img".into(),
            revision: 1_000_000,
        },
        JoinSpec {
            frozen: own,
            head: next_head,
            revision: 1_000_000,
        },
    ];
    let mut refusals = Vec::new();
    for j in &joins {
        match client.join(j).await {
            Ok(report) => panic!("{name}: join {j:?} accepted: {report:?}"),
            Err(e) => refusals.push(e.to_string()),
        }
    }
    refusals
}

#[test]
fn a_rogue_join_is_refused_and_the_volume_keeps_its_data() {
    let c = Cluster::start(3, 1);
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 3}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 3, Duration::from_secs(60));
    let data = write_data(c.dir.path(), &endpoint, 21);
    c.ok("POST", "/v1/volumes/v/detach", None);

    let rt = runtime();
    for r in c.replicas("v") {
        let name = r["name"].as_str().unwrap();
        let node = c.node(r["spec"]["nodeId"].as_str().unwrap());
        let addr = node["status"]["replicaEndpoint"].as_str().unwrap();
        for why in rt.block_on(rogue_joins(addr, name)) {
            assert!(
                why.contains("no frozen layer") || why.contains("claim writes"),
                "{name}: {why}"
            );
        }
    }

    // The next attach serves every replica, and all hold the data.
    let endpoint = c.attach("v", "node-1");
    verify_data(c.dir.path(), &endpoint, &data);
    let reps = c.wait_settled("v", 3, Duration::from_secs(60));
    assert!(reps.iter().all(|r| r["status"]["mode"] == "rw"), "{reps:?}");
    verify_replicas(&c, "v", &data);
    assert!(
        c.rebuilds().is_empty(),
        "nothing was rebuilt: {:?}",
        c.rebuilds()
    );
}

/// Sends OPEN `name` and then LEND from `from` (another address of this
/// machine, standing for another node) to a replica server; the status of
/// each reply.
fn lend_from(from: &str, addr: &str, name: &str) -> (u32, u32, String) {
    use ballast_node::wire::protocol::{Op, RESPONSE_HEADER, Request, Response};
    use std::io::{Read, Write};
    let rt = runtime();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let stream = rt.block_on(socket.connect(addr.parse().unwrap())).unwrap();
    let mut s = stream.into_std().unwrap();
    s.set_nonblocking(false).unwrap();
    let mut ask = |op: Op, id: u64, payload: &[u8]| {
        let req = Request {
            op,
            flags: 0,
            id,
            offset: 0,
            len: payload.len() as u32,
            revision: 0,
        };
        s.write_all(&req.encode()).unwrap();
        s.write_all(payload).unwrap();
        let mut head = [0u8; RESPONSE_HEADER];
        s.read_exact(&mut head).unwrap();
        let resp = Response::decode(&head).unwrap();
        let mut body = vec![0u8; resp.len as usize];
        s.read_exact(&mut body).unwrap();
        (resp.status, String::from_utf8_lossy(&body).into_owned())
    };
    let (opened, _) = ask(Op::Open, 1, name.as_bytes());
    let (lent, why) = ask(Op::Lend, 2, &[]);
    (opened, lent, why)
}

#[test]
fn a_rogue_lend_from_another_node_is_refused_and_the_volume_keeps_every_replica() {
    use ballast_node::wire::protocol::status;
    let c = Cluster::start(3, 1);
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 3}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 3, Duration::from_secs(60));
    let before = write_data(c.dir.path(), &endpoint, 22);

    // Every replica, the one lent to the engine on node-1 included, is
    // asked for a loan by a peer on another address.
    for r in c.replicas("v") {
        let name = r["name"].as_str().unwrap();
        let node = c.node(r["spec"]["nodeId"].as_str().unwrap());
        let addr = node["status"]["replicaEndpoint"].as_str().unwrap();
        let (opened, lent, why) = lend_from("127.0.0.2", addr, name);
        assert_eq!(opened, status::OK, "{name}");
        assert_eq!(lent, status::DENIED, "{name}: {why}");
        assert!(
            why.contains("only for the engine on this replica's node"),
            "{why}"
        );
    }

    // Writes go on to all three replicas, none was dropped, and the data
    // reads back through NBD and from every replica's files.
    let after = write_data(c.dir.path(), &endpoint, 23);
    assert_ne!(before.sum, after.sum);
    verify_data(c.dir.path(), &endpoint, &after);
    let reps = c.replicas("v");
    assert!(
        reps.len() == 3 && reps.iter().all(|r| r["status"]["mode"] == "rw"),
        "{reps:?}"
    );
    c.ok("POST", "/v1/volumes/v/detach", None);
    verify_replicas(&c, "v", &after);
}

/// What a peer without the cluster token (or with another) gets from the
/// node agents and the controller's agent endpoint: UNAUTHENTICATED, for a
/// destructive call, before anything runs.
#[test]
fn agent_calls_without_the_cluster_token_are_refused_and_the_volume_keeps_its_data() {
    use ballast::cluster_token::ClusterToken;
    use ballast::proto::agent::v1::controlplane_client::ControlplaneClient;
    use ballast::proto::agent::v1::node_agent_client::NodeAgentClient;
    use ballast::proto::agent::v1::{
        DeleteReplicaRequest, RecordReplicaSetRequest, StartEngineRequest, StopEngineRequest,
    };
    use ballast::proto::csi::v1::DeleteVolumeRequest;
    use ballast::proto::csi::v1::controller_client::ControllerClient;

    let c = Cluster::start(2, 1);
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 2}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 2, Duration::from_secs(60));
    let data = write_data(c.dir.path(), &endpoint, 24);
    let victim = c.replica_on("v", "node-2").unwrap()["name"]
        .as_str()
        .unwrap()
        .to_string();
    let agent_of = |node: &str| {
        c.node(node)["status"]["agentEndpoint"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let controller = format!("http://{}", c.ctl.agent);
    let (agent_1, agent_2) = (agent_of("node-1"), agent_of("node-2"));

    let rt = runtime();
    for token in [
        ClusterToken::default(),
        ClusterToken::from_text("not-this-cluster-token"),
    ] {
        let refusals = rt.block_on(async {
            let ch = |at: &str| ballast::grpc::tcp_channel(at).unwrap();
            let mut n1 = NodeAgentClient::with_interceptor(ch(&agent_1), token.sender());
            let mut n2 = NodeAgentClient::with_interceptor(ch(&agent_2), token.sender());
            let mut ctl = ControlplaneClient::with_interceptor(ch(&controller), token.sender());
            let mut csi = ControllerClient::with_interceptor(ch(&controller), token.sender());
            vec![
                n1.start_engine(StartEngineRequest {
                    volume: "v".into(),
                    size: SIZE,
                    ..Default::default()
                })
                .await
                .map(drop),
                n1.stop_engine(StopEngineRequest { volume: "v".into() })
                    .await
                    .map(drop),
                n2.delete_replica(DeleteReplicaRequest {
                    name: victim.clone(),
                })
                .await
                .map(drop),
                ctl.record_replica_set(RecordReplicaSetRequest {
                    volume: "v".into(),
                    ..Default::default()
                })
                .await
                .map(drop),
                csi.delete_volume(DeleteVolumeRequest {
                    volume_id: "v".into(),
                    ..Default::default()
                })
                .await
                .map(drop),
            ]
        });
        for (i, r) in refusals.into_iter().enumerate() {
            let e = r.expect_err("a call without the token went through");
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "call {i}: {e}");
        }
    }

    // Nothing happened: the engine serves, both replicas hold the data.
    verify_data(c.dir.path(), &endpoint, &data);
    let reps = c.wait_settled("v", 2, Duration::from_secs(30));
    assert!(
        reps.iter().any(|r| r["name"] == victim.as_str()),
        "{reps:?}"
    );
    c.ok("POST", "/v1/volumes/v/detach", None);
    verify_replicas(&c, "v", &data);
}
