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
