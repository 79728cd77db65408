//! Seed 001: disk pressure inside a node. Each disk is its own small ext4
//! filesystem, so that its used share is under the test's control (the
//! operator's reserved space pushes it up). Replicas leave a pressured disk
//! one at a time, by local copy, never to a disk that would become
//! pressured, and never two to one disk at once.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::*;

const SETTLE: Duration = Duration::from_secs(120);

fn disk(c: &Cluster, id: &str) -> Value {
    c.node("node-1")["status"]["disks"][id].clone()
}

fn reserve(c: &Cluster, id: &str, bytes: u64) {
    c.ok(
        "PATCH",
        &format!("/v1/nodes/node-1/disks/{id}"),
        Some(json!({ "storageReserved": bytes })),
    );
}

fn schedule(c: &Cluster, id: &str, on: bool) {
    c.ok(
        "PATCH",
        &format!("/v1/nodes/node-1/disks/{id}"),
        Some(json!({ "allowScheduling": on })),
    );
}

fn disks_of(c: &Cluster, volume: &str) -> Vec<(String, String)> {
    c.replicas(volume)
        .iter()
        .map(|r| {
            (
                r["spec"]["diskId"].as_str().unwrap().to_string(),
                r["status"]["mode"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[test]
fn a_pressured_disk_sheds_replicas_one_at_a_time_by_local_copy() {
    let c = Cluster::start_with(1, 3, Some(1 << 30));
    c.set("replica-soft-anti-affinity", json!(true));
    c.set("replica-auto-balance", json!("best-effort"));
    // Both volumes start on disk-1.
    schedule(&c, "disk-2", false);
    schedule(&c, "disk-3", false);
    let mut written = Vec::new();
    for (i, v) in ["vol-a", "vol-b"].iter().enumerate() {
        c.create_volume(json!({"name": v, "size": SIZE, "numberOfReplicas": 1}));
        let endpoint = c.attach(v, "node-1");
        c.wait_settled(v, 1, SETTLE);
        written.push((
            v.to_string(),
            endpoint.clone(),
            write_data(c.dir.path(), &endpoint, 40 + i as u64),
        ));
    }
    schedule(&c, "disk-2", true);
    schedule(&c, "disk-3", true);
    // disk-1 at ~70% used; disk-2 just under 50%, so that one more replica
    // would take it over; disk-3 nearly empty.
    let d1 = disk(&c, "disk-1");
    let max = d1["storageMaximum"].as_u64().unwrap();
    reserve(&c, "disk-1", max * 7 / 10);
    let d2 = disk(&c, "disk-2");
    let used2 = max - d2["storageAvailable"].as_u64().unwrap();
    reserve(&c, "disk-2", max / 2 - used2 - SIZE / 2);
    wait_for(SETTLE, "disk-1 reported pressured", || {
        (disk(&c, "disk-1")["storageMaximum"].as_u64() == Some(max)).then_some(())
    });
    c.set("replica-auto-balance-disk-pressure-percentage", json!(50));
    wait_for(SETTLE, "disk-1 pressured", || {
        (disk(&c, "disk-1")["pressure"] == true && disk(&c, "disk-2")["pressure"] == false)
            .then_some(())
    });
    // Both replicas end on disk-3; never two arriving there at once, and
    // none ever on disk-2.
    wait_for(SETTLE, "both replicas on disk-3", || {
        let (a, b) = (disks_of(&c, "vol-a"), disks_of(&c, "vol-b"));
        let all: Vec<&(String, String)> = a.iter().chain(&b).collect();
        assert!(
            all.iter().all(|(d, _)| d != "disk-2"),
            "a replica went to disk-2, which would become pressured: {all:?}"
        );
        let arriving = all
            .iter()
            .filter(|(d, m)| d == "disk-3" && m != "rw")
            .count();
        assert!(
            arriving <= 1,
            "two replicas moving to disk-3 at once: {all:?}"
        );
        let done =
            |x: &Vec<(String, String)>| x.len() == 1 && x[0] == ("disk-3".into(), "rw".into());
        (done(&a) && done(&b)).then_some(())
    });
    // Each move copied locally, by one of the local ways (between two
    // filesystems without reflink: the extents read through an io_uring,
    // else copy_file_range or pread/pwrite per data extent).
    let rebuilds = c.rebuilds();
    assert_eq!(rebuilds.len(), 2, "{rebuilds:?}");
    for (replica, message) in &rebuilds {
        assert!(
            [
                "by reflink",
                "by io-uring",
                "by copy-file-range",
                "by read-write",
            ]
            .iter()
            .any(|p| message.contains(p)),
            "{replica} was not copied locally: {message}"
        );
    }
    assert!(
        c.node("node-1")["status"]["disks"]["disk-3"]["scheduledReplicas"]
            .as_array()
            .is_some_and(|a| a.len() == 2)
    );
    for (v, endpoint, data) in &written {
        verify_data(c.dir.path(), endpoint, data);
        verify_replicas(&c, v, data);
    }
}
