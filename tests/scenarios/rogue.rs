//! A peer on the node network that should not be trusted (issue 21): what
//! it sends a replica is refused where it would cost data, and the
//! volume's data is checked by checksum afterwards.

use std::path::Path;
use std::time::Duration;

use ballast_node::replica::LayerSpec;
use ballast_node::wire::JoinSpec;
use ballast_node::wire::client::ReplicaClient;
use ballast_node::wire::tls::WireTls;
use serde_json::json;

use crate::harness::*;

/// The two JOINs a rogue peer would send to empty a replica and have it
/// win the next attach: the one of the security review (no frozen layer,
/// a far revision), and one that names the replica's own frozen layers so
/// that nothing is left to fill. The peer holds an engine's certificate
/// for the volume (`wire`: a node that once ran its engine, say): the
/// replica refuses them all the same.
async fn rogue_joins(wire: &WireTls, addr: &str, name: &str) -> Vec<String> {
    let client = ReplicaClient::dial(wire, addr, name).await.unwrap();
    let layers = client.layers().await.unwrap();
    let own: Vec<LayerSpec> = layers
        .iter()
        .filter_map(|l| {
            let checksum = l.checksum.clone()?;
            Some(LayerSpec {
                name: l.name.clone(),
                checksum,
                snapshot: None,
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
    use ballast_node::wire::protocol::status;
    let c = Cluster::start(3, 1);
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 3}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 3, Duration::from_secs(60));
    let data = write_data(c.dir.path(), &endpoint, 21);
    c.ok("POST", "/v1/volumes/v/detach", None);

    let rt = runtime();
    let node_3 = wire_as(c.dir.path(), "node-3");
    let reader_on_3 = reader_wire_as(c.dir.path(), "v", "node-3");
    // Credentials of an engine of the volume's latest attachment, which
    // its replicas take changes from: one attachment, and its end at the
    // detach, counted.
    let epoch = c.volume("v")["status"]["engineEpoch"].as_u64().unwrap();
    assert_eq!(epoch, 2, "an engine started, then detached");
    let engine_on_3 = engine_wire_as(c.dir.path(), "v", "node-3", epoch);
    for r in c.replicas("v") {
        let name = r["name"].as_str().unwrap();
        let node = c.node(r["spec"]["nodeId"].as_str().unwrap());
        let addr = node["status"]["replicaEndpoint"].as_str().unwrap();
        // A node's certificate is not the volume's engine's: it opens the
        // replica on its own node, a reader's (of the volume, the
        // controller's word) the others; each reads, and every change
        // (WRITE, TRIM, FLUSH, JOIN, FILL, GROW) is refused before it is
        // read.
        let own = r["spec"]["nodeId"] == "node-3";
        rt.block_on(async {
            let wire = if own { &node_3 } else { &reader_on_3 };
            let client = ReplicaClient::dial(wire, addr, name).await.unwrap();
            let join = JoinSpec {
                frozen: Vec::new(),
                head: "layer-000099.img".into(),
                revision: 1_000_000,
            };
            let [write, trim, flush] = data_changes(&client).await;
            let refused = [
                write,
                trim,
                flush,
                client.join(&join).await.map(drop).unwrap_err(),
                client.fill("x@127.0.0.1:1", 0).await.map(drop).unwrap_err(),
                client.grow(2 * SIZE).await.map(drop).unwrap_err(),
            ];
            for e in refused {
                assert_eq!(refusal(&e), status::DENIED, "{name}: {e}");
                assert!(e.to_string().contains("only for the engine"), "{name}: {e}");
            }
            client.read(0, 4096).await.unwrap();
            let info = client.info().await.unwrap();
            assert_eq!(info["size"], SIZE, "{name}: the size stays");
        });
        for why in rt.block_on(rogue_joins(&engine_on_3, addr, name)) {
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

/// A WRITE, a TRIM and a FLUSH through `client`, each of which must be
/// refused: their errors.
async fn data_changes(client: &ReplicaClient) -> [ballast_node::wire::client::ClientError; 3] {
    let block = vec![0xa5u8; 4096];
    [
        client
            .write(0, &block, u64::MAX / 2, false)
            .await
            .unwrap_err(),
        client.trim(0, 4096, u64::MAX / 2).await.unwrap_err(),
        client.flush().await.unwrap_err(),
    ]
}

#[test]
fn an_engine_of_an_earlier_attachment_is_fenced_out_and_the_volume_keeps_its_data() {
    use ballast_node::wire::protocol::status;
    let c = Cluster::start(3, 1);
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 3}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 3, Duration::from_secs(60));
    write_data(c.dir.path(), &endpoint, 24);
    c.ok("POST", "/v1/volumes/v/detach", None);
    // The detach ends the attachment at every replica: credentials of its
    // engine are refused at once.
    let rt = runtime();
    let first = engine_wire_as(c.dir.path(), "v", "node-1", 1);
    for r in c.replicas("v") {
        let name = r["name"].as_str().unwrap();
        let node = c.node(r["spec"]["nodeId"].as_str().unwrap());
        let addr = node["status"]["replicaEndpoint"].as_str().unwrap();
        let e = rt
            .block_on(ReplicaClient::dial(&first, addr, name))
            .err()
            .unwrap();
        assert_eq!(refusal(&e), status::FENCED, "{name}: {e}");
        assert!(e.to_string().contains("attachment 2"), "{e}");
    }
    // The volume moves to node-2: a later attachment, whose engine opens
    // every replica for it.
    let endpoint = c.attach("v", "node-2");
    c.wait_settled("v", 3, Duration::from_secs(60));
    let data = write_data(c.dir.path(), &endpoint, 25);
    assert_eq!(c.volume("v")["status"]["engineEpoch"], 3);

    // An engine of the first attachment, still running on node-1 (a node
    // the cluster gave up on, say): every replica refuses it at OPEN, the
    // one lent to the engine on node-2 included. Its credentials cannot
    // claim the latest attachment either, and when they claim none, they
    // open a replica but change nothing.
    let forged = first.clone().for_attachment(3);
    let unclaimed = first.clone().for_attachment(0);
    for r in c.replicas("v") {
        let name = r["name"].as_str().unwrap();
        let node = c.node(r["spec"]["nodeId"].as_str().unwrap());
        let addr = node["status"]["replicaEndpoint"].as_str().unwrap();
        rt.block_on(async {
            let e = ReplicaClient::dial(&first, addr, name).await.err().unwrap();
            assert_eq!(refusal(&e), status::FENCED, "{name}: {e}");
            assert!(e.to_string().contains("attachment 3"), "{e}");
            let e = ReplicaClient::dial(&forged, addr, name)
                .await
                .err()
                .unwrap();
            assert_eq!(refusal(&e), status::DENIED, "{name}: {e}");
            let client = ReplicaClient::dial(&unclaimed, addr, name).await.unwrap();
            for e in data_changes(&client).await {
                assert_eq!(refusal(&e), status::FENCED, "{name}: {e}");
            }
        });
    }

    // Nor can an engine of an earlier attachment on the node the volume
    // is attached at change the record at the controller: at the
    // record's generation, its smaller set is refused as stale, and a
    // claim of the latest attachment its certificate does not name is
    // denied. The set stays as it was.
    let recorded = c.volume("v")["status"].clone();
    let stale = engine_member_as(c.dir.path(), "v", "node-2", 2);
    let controller = format!("http://{}", c.ctl.agent);
    rt.block_on(async {
        use ballast::proto::agent::v1::RecordReplicaSetRequest;
        use ballast::proto::agent::v1::controlplane_client::ControlplaneClient;
        let channel = stale
            .channel(&controller, &ballast::tls::Role::Controller)
            .unwrap();
        let mut ctl = ControlplaneClient::new(channel);
        let ask = |engine_epoch| RecordReplicaSetRequest {
            volume: "v".into(),
            node_id: "node-2".into(),
            generation: recorded["generation"].as_u64().unwrap(),
            replicas: vec![recorded["currentReplicas"][0].as_str().unwrap().into()],
            reason: "a stale engine drops the others".into(),
            engine_epoch,
        };
        let e = ctl.record_replica_set(ask(2)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
        assert!(e.message().contains("attachment is 3, not 2"), "{e}");
        let e = ctl.record_replica_set(ask(3)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    });
    let now = c.volume("v")["status"].clone();
    assert_eq!(
        (&now["generation"], &now["currentReplicas"]),
        (&recorded["generation"], &recorded["currentReplicas"]),
    );

    // The engine of the second attachment goes on: every replica stays,
    // nothing is rebuilt, and the data reads back through NBD and from
    // every replica's files, whose fence is on disk.
    let after = write_data(c.dir.path(), &endpoint, 26);
    assert_ne!(data.sum, after.sum);
    verify_data(c.dir.path(), &endpoint, &after);
    let reps = c.replicas("v");
    assert!(
        reps.len() == 3 && reps.iter().all(|r| r["status"]["mode"] == "rw"),
        "{reps:?}"
    );
    assert!(c.rebuilds().is_empty(), "{:?}", c.rebuilds());
    c.ok("POST", "/v1/volumes/v/detach", None);
    verify_replicas(&c, "v", &after);
    for r in c.replicas("v") {
        let fence = ballast_node::replica::read_fence(&replica_dir_of(&c, &r)).unwrap();
        // The last detach ended the third attachment too.
        assert_eq!(fence, 4, "{}", r["name"]);
    }
}

/// Sends OPEN `name` and then LEND to a replica server, from the address
/// `from` of this machine and with node `as_node`'s certificate; the
/// status of each reply.
fn lend_from(dir: &Path, as_node: &str, from: &str, addr: &str, name: &str) -> (u32, u32, String) {
    use ballast_node::wire::protocol::{Op, RESPONSE_HEADER, Response};
    use std::io::{Read, Write};
    let rt = runtime();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let stream = rt.block_on(socket.connect(addr.parse().unwrap())).unwrap();
    let tcp = stream.into_std().unwrap();
    tcp.set_nonblocking(false).unwrap();
    let mut s = replica_tls(dir, as_node, tcp);
    let mut ask = |op: Op, id: u64, payload: &[u8]| {
        s.write_all(&replica_header(op, id, payload.len() as u32))
            .unwrap();
        s.write_all(payload).unwrap();
        s.flush().unwrap();
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
    // asked for a loan by a peer on another address (with the replica's
    // own node's certificate), by one on its address with another node's
    // certificate (which opens nothing there), and by one on its address
    // with its own node's.
    for r in c.replicas("v") {
        let name = r["name"].as_str().unwrap();
        let owner = r["spec"]["nodeId"].as_str().unwrap();
        let other = if owner == "node-1" {
            "node-2"
        } else {
            "node-1"
        };
        let node = c.node(owner);
        let addr = node["status"]["replicaEndpoint"].as_str().unwrap();
        let (opened, lent, why) = lend_from(c.dir.path(), owner, "127.0.0.2", addr, name);
        assert_eq!(opened, status::OK, "{name}");
        assert_eq!(lent, status::DENIED, "{name} from 127.0.0.2: {why}");
        assert!(
            why.contains("only for the engine on this replica's node"),
            "{why}"
        );
        // Another node's certificate does not even open it, so nothing
        // is lent on that connection.
        let (opened, lent, why) = lend_from(c.dir.path(), other, "127.0.0.1", addr, name);
        assert_eq!(opened, status::DENIED, "{name} as {other}");
        assert_eq!(lent, status::NOT_FOUND, "{name} as {other}: {why}");
        assert!(why.contains("no replica opened"), "{why}");
        // On the replica's address with its node's certificate, which is
        // not the engine's.
        let (opened, lent, why) = lend_from(c.dir.path(), owner, "127.0.0.1", addr, name);
        assert_eq!(opened, status::OK, "{name}");
        assert_eq!(lent, status::DENIED, "{name} as {owner}: {why}");
        assert!(
            why.contains("only for the engine the controller started"),
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

/// A peer without a certificate of the cluster cannot even start the
/// replica protocol: the handshake fails before any request is read, for a
/// plain connection and for a TLS client that shows no certificate or one
/// of another CA.
#[test]
fn a_replica_peer_without_the_clusters_certificate_is_refused_before_any_request() {
    use ballast::tls::{Ca, Role};
    use ballast_node::wire::protocol::Op;
    use std::io::{Read, Write};
    let c = Cluster::start(1, 1);
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 1}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 1, Duration::from_secs(60));
    let data = write_data(c.dir.path(), &endpoint, 25);
    let r = &c.replicas("v")[0];
    let name = r["name"].as_str().unwrap().to_string();
    let addr = c.node("node-1")["status"]["replicaEndpoint"]
        .as_str()
        .unwrap()
        .to_string();

    // Plain: the server reads a TLS record, not a request, and closes.
    let mut plain = std::net::TcpStream::connect(&addr).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = plain.write_all(&replica_header(Op::Open, 1, name.len() as u32));
    let _ = plain.write_all(name.as_bytes());
    let mut b = [0u8; 64];
    let n = plain.read(&mut b).unwrap_or(0);
    assert!(
        n == 0 || b[0] == 0x15,
        "a plain peer got no answer but an alert: {:?}",
        &b[..n]
    );

    // A node certificate of another CA (the client trusts this cluster's
    // CA, so that the refusal is the server's), through the engine's own
    // client.
    let mut foreign = Ca::generate()
        .unwrap()
        .issue(&Role::Node("node-1".into()))
        .unwrap();
    foreign.ca_pem = std::fs::read_to_string(cluster_ca_dir(c.dir.path()).join("ca.crt")).unwrap();
    let wire = WireTls::new(&foreign, "node-1").unwrap();
    let rt = runtime();
    let refused = rt.block_on(ReplicaClient::dial(&wire, &addr, &name));
    assert!(refused.is_err(), "a foreign certificate was served");

    // The volume serves on, with its data.
    verify_data(c.dir.path(), &endpoint, &data);
    c.ok("POST", "/v1/volumes/v/detach", None);
    verify_replicas(&c, "v", &data);
}

/// The five calls a rogue peer makes: StartEngine and StopEngine on
/// node-1, DeleteReplica of `victim` on node-2, RecordReplicaSet and a
/// forwarded DeleteVolume on the controller; their outcomes.
async fn rogue_agent_calls(
    channel: impl Fn(&str, &ballast::tls::Role) -> ballast::cluster_token::Authed,
    (agent_1, agent_2, controller): (&str, &str, &str),
    victim: &str,
) -> Vec<Result<(), tonic::Status>> {
    use ballast::proto::agent::v1::controlplane_client::ControlplaneClient;
    use ballast::proto::agent::v1::node_agent_client::NodeAgentClient;
    use ballast::proto::agent::v1::{
        DeleteReplicaRequest, RecordReplicaSetRequest, StartEngineRequest, StopEngineRequest,
    };
    use ballast::proto::csi::v1::DeleteVolumeRequest;
    use ballast::proto::csi::v1::controller_client::ControllerClient;
    use ballast::tls::Role;
    let mut n1 = NodeAgentClient::new(channel(agent_1, &Role::Node("node-1".into())));
    let mut n2 = NodeAgentClient::new(channel(agent_2, &Role::Node("node-2".into())));
    let mut ctl = ControlplaneClient::new(channel(controller, &Role::Controller));
    let mut csi = ControllerClient::new(channel(controller, &Role::Controller));
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
            name: victim.to_string(),
        })
        .await
        .map(drop),
        ctl.record_replica_set(RecordReplicaSetRequest {
            volume: "v".into(),
            node_id: "node-1".into(),
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
}

/// What a peer gets from the node agents and the controller's agent
/// endpoint without the cluster token (even with a node's certificate),
/// without a client certificate (even with the token), or with a node's
/// certificate where only the controller, or another node, may call:
/// UNAUTHENTICATED or PERMISSION_DENIED, for destructive calls, before
/// anything runs. A
/// plain connection gets no answer at all.
#[test]
fn agent_calls_without_the_token_or_the_controllers_certificate_are_refused_and_the_volume_keeps_its_data()
 {
    use ballast::cluster_token::ClusterToken;
    use ballast::tls::{Member, Role, Tls};
    use tonic::Code;

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
    let at = (agent_1.as_str(), agent_2.as_str(), controller.as_str());
    let dir = c.dir.path();
    let ca_pem = std::fs::read_to_string(cluster_ca_dir(dir).join("ca.crt")).unwrap();
    let good_token = ClusterToken::read(&cluster_token(dir)).unwrap();
    let as_node_2 = member_as(dir, Role::Node("node-2".into()));

    let rt = runtime();
    // A node's certificate, but no token or another cluster's.
    for token in [
        ClusterToken::default(),
        ClusterToken::from_text("not-this-cluster-token"),
    ] {
        let m = Member {
            token,
            tls: as_node_2.tls.clone(),
        };
        let outcomes = rt.block_on(rogue_agent_calls(
            |u, r| m.channel(u, r).unwrap(),
            at,
            &victim,
        ));
        for (i, r) in outcomes.into_iter().enumerate() {
            let e = r.expect_err("a call without the token went through");
            assert_eq!(e.code(), Code::Unauthenticated, "call {i}: {e}");
        }
    }
    // The token, but no client certificate.
    let no_cert = |u: &str, r: &Role| {
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&ca_pem))
            .domain_name(r.name());
        tonic::service::interceptor::InterceptedService::new(
            ballast::grpc::tcp_channel_with(u, Some(tls)).unwrap(),
            good_token.sender(),
        )
    };
    for (i, r) in rt
        .block_on(rogue_agent_calls(no_cert, at, &victim))
        .into_iter()
        .enumerate()
    {
        let e = r.expect_err("a call without a certificate went through");
        assert_eq!(e.code(), Code::Unauthenticated, "call {i}: {e}");
        assert!(e.message().contains("certificate"), "call {i}: {e}");
    }
    // The token and node-2's certificate: only the controller may call the
    // node agents and forward CSI calls, and only node-1 (its engine) may
    // record node-1's engine's replica set.
    let outcomes = rt.block_on(rogue_agent_calls(
        |u, r| as_node_2.channel(u, r).unwrap(),
        at,
        &victim,
    ));
    for (i, r) in outcomes.into_iter().enumerate() {
        let e = r.expect_err("node-2 made a call that is not its own");
        assert_eq!(e.code(), Code::PermissionDenied, "call {i}: {e}");
    }
    // Plain gRPC with the token: no TLS, no answer.
    let plain = Member {
        token: good_token.clone(),
        tls: Tls::default(),
    };
    for (i, r) in rt
        .block_on(rogue_agent_calls(
            |u, r| plain.channel(u, r).unwrap(),
            at,
            &victim,
        ))
        .into_iter()
        .enumerate()
    {
        r.expect_err(&format!("plain call {i} went through"));
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

/// Replica `r`'s name and its node's replica endpoint.
fn name_and_addr(c: &Cluster, r: &serde_json::Value) -> (String, String) {
    let node = c.node(r["spec"]["nodeId"].as_str().unwrap());
    (
        r["name"].as_str().unwrap().to_string(),
        node["status"]["replicaEndpoint"]
            .as_str()
            .unwrap()
            .to_string(),
    )
}

/// A node reads another node's replica only as a reader of its volume,
/// with a certificate the controller gives it for a fill of a replica of
/// its own. Its own certificate opens the replicas on its node and no
/// other (DENIED). The controller refuses a reader's certificate for a
/// replica that is not on the asking node, for a source of a volume that
/// replica takes nothing from, and to a node asking for another. A reader
/// of one volume opens no replica of another. A rebuild then reads its
/// remote source as a reader, and every replica holds the data.
#[test]
fn a_node_reads_another_nodes_replica_only_as_a_reader_the_controller_named() {
    use ballast::proto::agent::v1::IssueReaderRequest;
    use ballast::proto::agent::v1::controlplane_client::ControlplaneClient;
    use ballast::tls::{Credentials, Enrollment, Role};
    use ballast_node::wire::protocol::status;
    use tonic::Code;

    let c = Cluster::start(3, 1);
    let dir = c.dir.path();
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 3}));
    c.create_volume(json!({"name": "w", "size": SIZE, "numberOfReplicas": 3}));
    c.attach("w", "node-2");
    c.wait_settled("w", 3, Duration::from_secs(60));
    c.ok("POST", "/v1/volumes/w/detach", None);
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 3, Duration::from_secs(60));
    let data = write_data(dir, &endpoint, 26);
    c.ok("POST", "/v1/volumes/v/detach", None);
    let on = |volume: &str, node: &str| name_and_addr(&c, &c.replica_on(volume, node).unwrap());
    let (v1, v2, v3, w1) = (
        on("v", "node-1"),
        on("v", "node-2"),
        on("v", "node-3"),
        on("w", "node-1"),
    );

    let rt = runtime();
    let node_3 = wire_as(dir, "node-3");
    rt.block_on(async {
        // Its own certificate: the replica on its node, and no other.
        for (name, addr) in [&v1, &v2, &w1] {
            let e = ReplicaClient::dial(&node_3, addr, name)
                .await
                .err()
                .unwrap();
            assert_eq!(refusal(&e), status::DENIED, "{name}: {e}");
            assert!(e.to_string().contains("opens only for"), "{name}: {e}");
        }
        let own = ReplicaClient::dial(&node_3, &v3.1, &v3.0).await.unwrap();
        own.read(0, 4096).await.unwrap();
    });

    // What node-3 gets from the controller.
    let controller = format!("http://{}", c.ctl.agent);
    let as_3 = member_as(dir, Role::Node("node-3".into()));
    let ca_pem = std::fs::read_to_string(cluster_ca_dir(dir).join("ca.crt")).unwrap();
    let ask = |node: &str, replica: &str, source: &str| {
        let key = Enrollment::new("node-3").unwrap();
        let answer = rt.block_on(async {
            let channel = as_3.channel(&controller, &Role::Controller).unwrap();
            ControlplaneClient::new(channel)
                .issue_reader(IssueReaderRequest {
                    node_id: node.into(),
                    replica: replica.into(),
                    source: source.into(),
                    csr_pem: key.csr_pem.clone(),
                })
                .await
        });
        answer.map(|a| key.finish(&ca_pem, &a.into_inner().cert_pem))
    };
    let refused = |r: Result<Credentials, tonic::Status>, why: &str| {
        let e = r.expect_err("a reader's certificate was given");
        assert_eq!(e.code(), Code::PermissionDenied, "{e}");
        assert!(e.message().contains(why), "{e}");
    };
    // For a replica that is not on node-3.
    refused(ask("node-3", &v1.0, &v2.0), "not on node node-3");
    // For a source of another volume.
    refused(ask("node-3", &v3.0, &w1.0), "takes no data of volume w");
    // As another node.
    refused(
        ask("node-2", &v2.0, &v1.0),
        "only node node-2's certificate",
    );
    // The two that reached the controller's check are warnings on node-3.
    let events: Vec<String> = c
        .all_events("ReaderRefused")
        .iter()
        .map(|e| format!("{} {}", e["object"], e["message"]))
        .collect();
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(
        events.iter().all(|e| e.contains("node/node-3")),
        "{events:?}"
    );
    // For its own replica of v, from v's replica on node-1: it reads that
    // replica (and v's on node-2), and opens no replica of w.
    let reader = ask("node-3", &v3.0, &v1.0).unwrap();
    let reader = WireTls::new(&reader, "node-3").unwrap();
    rt.block_on(async {
        for (name, addr) in [&v1, &v2] {
            let client = ReplicaClient::dial(&reader, addr, name).await.unwrap();
            client.read(0, 4096).await.unwrap();
        }
        let e = ReplicaClient::dial(&reader, &w1.1, &w1.0)
            .await
            .err()
            .unwrap();
        assert_eq!(refusal(&e), status::DENIED, "{e}");
    });

    // A rebuild onto a node with no other replica of v reads its source
    // as a reader.
    let issued = || {
        c.ctl
            .proc
            .log_text()
            .matches("issued a reader's certificate")
            .count()
    };
    let before = issued();
    assert_eq!(before, 1, "the one node-3 asked for");
    let endpoint = c.attach("v", "node-1");
    c.ok(
        "PATCH",
        "/v1/volumes/v",
        Some(json!({"numberOfReplicas": 2})),
    );
    c.wait_settled("v", 2, Duration::from_secs(60));
    c.ok(
        "PATCH",
        "/v1/volumes/v",
        Some(json!({"numberOfReplicas": 3})),
    );
    c.wait_settled("v", 3, Duration::from_secs(120));
    assert!(issued() > before, "the rebuild read its source as a reader");
    verify_data(dir, &endpoint, &data);
    c.ok("POST", "/v1/volumes/v/detach", None);
    verify_replicas(&c, "v", &data);
}
