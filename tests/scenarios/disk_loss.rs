//! A disk directory removed while its node runs: the disk turns not ready,
//! the node keeps running, and the volume degrades and rebuilds elsewhere.

use std::time::Duration;

use serde_json::json;

use crate::harness::*;

const SETTLE: Duration = Duration::from_secs(120);

#[test]
fn removing_a_disk_directory_fails_its_replicas_and_the_volume_rebuilds_elsewhere() {
    let mut c = Cluster::start(3, 1);
    c.set("replica-replenishment-wait-interval", json!(2));
    c.patch_node("node-3", json!({"allowScheduling": false}));
    c.create_volume(json!({"name": "vol", "size": SIZE, "numberOfReplicas": 2}));
    let endpoint = c.attach("vol", "node-1");
    c.wait_settled("vol", 2, SETTLE);
    write_data(c.dir.path(), &endpoint, 51);
    c.patch_node("node-3", json!({"allowScheduling": true}));
    let lost = c.path("node-2").join("disk-1");
    std::fs::remove_dir_all(&lost).unwrap();
    wait_for(SETTLE, "node-2's disk not ready", || {
        let d = &c.node("node-2")["status"]["disks"]["disk-1"];
        (d["ready"] == false).then(|| d["message"].as_str().unwrap_or_default().to_string())
    });
    // Writes go on; the replica on the lost disk fails and a new one is
    // built on node-3.
    let data = write_data(c.dir.path(), &endpoint, 52);
    wait_for(SETTLE, "two rw replicas, one on node-3", || {
        let reps = c.replicas("vol");
        let rw: Vec<_> = reps
            .iter()
            .filter(|r| r["status"]["mode"] == "rw")
            .collect();
        (rw.len() == 2 && rw.iter().any(|r| r["spec"]["nodeId"] == "node-3")).then_some(())
    });
    assert_eq!(
        c.nodes[1].proc.child.try_wait().unwrap(),
        None,
        "node-2 exited after losing its disk"
    );
    assert_eq!(c.node("node-2")["status"]["ready"], true);
    verify_data(c.dir.path(), &endpoint, &data);
    verify_replicas(&c, "vol", &data);
}
