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

/// A node whose disk's filesystem did not mount after a reboot finds an
/// empty directory where the disk was. It does not take it as a new disk
/// (new replicas would land on the root filesystem, and be hidden under
/// the disk once it mounted): the disk is not ready, its message says to
/// mount it, and nothing is written in the directory, though the volume
/// lacks a replica that only this disk could take. Mounted again, the
/// disk is ready, its replica is found and caught up, and every replica
/// holds what was written, before and while the disk was away.
#[test]
fn a_disk_not_mounted_after_a_reboot_is_not_taken_as_new_and_comes_back_when_mounted() {
    let mut c = Cluster::start(2, 1);
    c.set("replica-replenishment-wait-interval", json!(2));
    c.create_volume(json!({"name": "vol", "size": SIZE, "numberOfReplicas": 2}));
    let endpoint = c.attach("vol", "node-1");
    c.wait_settled("vol", 2, SETTLE);
    write_data(c.dir.path(), &endpoint, 61);

    c.kill_node(1);
    let (disk, away) = (c.path("node-2").join("disk-1"), c.path("node-2/away"));
    std::fs::rename(&disk, &away).unwrap();
    std::fs::create_dir(&disk).unwrap();
    let since = chrono::Utc::now();
    c.respawn_node(1);
    // Up again, with its disk not ready.
    let message = wait_for(SETTLE, "node-2 back, its disk not ready", || {
        let n = c.node("node-2");
        let d = &n["status"]["disks"]["disk-1"];
        (heard_since(&n, since) && n["status"]["ready"] == true && d["ready"] == false)
            .then(|| d["message"].as_str().unwrap_or_default().to_string())
    });
    assert!(
        message.contains("is the disk's filesystem mounted"),
        "{message}"
    );
    // Writes go on; the replica on node-2 is failed, and no other place
    // would take one.
    let data = write_data(c.dir.path(), &endpoint, 62);
    wait_for_or(
        SETTLE,
        "node-2's replica failed",
        || {
            c.replica_on("vol", "node-2")
                .filter(|r| r["status"]["mode"] == "err")
        },
        || format!("{:#?}\n{:#?}", c.replicas("vol"), c.events("volume/vol")),
    );
    // The controller would put a replica nowhere (not on the disk that is
    // not ready), and nothing is in the directory.
    let plan = c.planned_changes("vol");
    assert!(plan.is_empty(), "{plan:#?}");
    let written: Vec<_> = std::fs::read_dir(&disk).unwrap().flatten().collect();
    assert!(
        written.is_empty(),
        "written where the disk was: {written:?}"
    );

    // Mounted again.
    std::fs::remove_dir(&disk).unwrap();
    std::fs::rename(&away, &disk).unwrap();
    wait_for(SETTLE, "node-2's disk ready", || {
        (c.node("node-2")["status"]["disks"]["disk-1"]["ready"] == true).then_some(())
    });
    c.wait_settled("vol", 2, SETTLE);
    verify_data(c.dir.path(), &endpoint, &data);
    verify_replicas(&c, "vol", &data);
}
