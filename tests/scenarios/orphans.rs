//! Replica deletion on request, and data left on a node whose replica
//! record went while it was away: deleted when the node is back.

use std::time::Duration;

use serde_json::json;

use crate::harness::*;

const SETTLE: Duration = Duration::from_secs(120);

#[test]
fn a_replica_deleted_while_its_node_is_down_has_its_data_deleted_when_the_node_returns() {
    let mut c = Cluster::start(3, 1);
    c.create_volume(json!({"name": "vol", "size": SIZE, "numberOfReplicas": 2}));
    let holders = c.holders("vol");
    let endpoint = c.attach("vol", &holders[0]);
    c.wait_settled("vol", 2, SETTLE);
    let data = write_data(c.dir.path(), &endpoint, 61);
    let gone = c.replica_on("vol", &holders[1]).unwrap();
    let name = gone["name"].as_str().unwrap().to_string();
    let dir = c.path(&holders[1]).join("disk-1/replicas").join(&name);
    assert!(dir.exists());
    let i = c.node_index(&holders[1]);
    c.kill_node(i);
    c.ok("DELETE", &format!("/v1/replicas/{name}"), None);
    assert!(dir.exists(), "the node is down: its data is still there");
    c.restart_node(i);
    wait_for(
        SETTLE,
        "the left-over replica deleted, with its event",
        || {
            (!dir.exists()
                && c.event_reasons(&format!("replica/{name}"))
                    .contains(&"OrphanDeleted".to_string()))
            .then_some(())
        },
    );
    // The volume is whole again, on a new replica.
    wait_for(SETTLE, "two rw replicas", || {
        let reps = c.replicas("vol");
        (reps.len() == 2 && reps.iter().all(|r| r["status"]["mode"] == "rw")).then_some(())
    });
    verify_data(c.dir.path(), &endpoint, &data);
    verify_replicas(&c, "vol", &data);
}

#[test]
fn deleting_a_replica_takes_it_out_of_the_engine_and_deletes_its_data() {
    let c = Cluster::start(3, 1);
    c.create_volume(json!({"name": "vol", "size": SIZE, "numberOfReplicas": 3}));
    let endpoint = c.attach("vol", "node-1");
    c.wait_settled("vol", 3, SETTLE);
    let r = c.replica_on("vol", "node-2").unwrap();
    let name = r["name"].as_str().unwrap().to_string();
    let dir = c.path("node-2").join("disk-1/replicas").join(&name);
    c.ok("DELETE", &format!("/v1/replicas/{name}"), None);
    assert!(!dir.exists(), "its data is deleted");
    // Writes go on without it; the volume gets its third replica back.
    let data = write_data(c.dir.path(), &endpoint, 62);
    c.wait_settled("vol", 3, SETTLE);
    verify_data(c.dir.path(), &endpoint, &data);
    verify_replicas(&c, "vol", &data);
    // The last copy of an attached volume's data is not deleted.
    c.create_volume(json!({"name": "solo", "size": SIZE, "numberOfReplicas": 1}));
    c.attach("solo", "node-1");
    let reps = c.wait_settled("solo", 1, SETTLE);
    let only = reps[0]["name"].as_str().unwrap();
    let (status, body) = call("DELETE", &c.url(&format!("/v1/replicas/{only}")), None);
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("last rw replica"),
        "{body}"
    );
    assert_eq!(c.replicas("solo").len(), 1);
}
