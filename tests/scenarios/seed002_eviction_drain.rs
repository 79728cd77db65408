//! Seed 002: node drain policies and automatic eviction on cordon. Cordon
//! and uncordon go through `PATCH /v1/nodes/{id}` (`cordoned`), or, on the
//! Kubernetes store, as `kubectl cordon` makes them: a patch of the
//! Kubernetes Node's `spec.unschedulable`.

use std::time::Duration;

use serde_json::json;

use crate::harness::*;

const SETTLE: Duration = Duration::from_secs(120);

fn cordon(c: &Cluster, node: &str, on: bool) {
    c.patch_node(node, json!({"cordoned": on}));
}

fn robustness(c: &Cluster, volume: &str) -> String {
    c.volume(volume)["status"]["robustness"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn block_for_eviction_moves_the_replica_off_a_cordoned_node_before_the_drain_completes() {
    block_for_eviction(&Cluster::start(3, 1), &cordon);
}

/// The same drain on the Kubernetes store: the nodes are Kubernetes Nodes
/// too, and the cordon is a patch of the Node.
#[test]
fn block_for_eviction_follows_a_kubectl_cordon_of_the_kubernetes_node() {
    let k = crate::kube_cluster::KubeCluster::start(3);
    // The Node's zone label is the node's zone.
    wait_for(SETTLE, "zones from the Nodes' labels", || {
        (1..=3)
            .all(|i| k.c.node(&format!("node-{i}"))["spec"]["zone"] == format!("kube-zone-{i}"))
            .then_some(())
    });
    block_for_eviction(&k.c, &|_: &Cluster, node: &str, on: bool| {
        k.cordon(node, on)
    });
}

fn block_for_eviction(c: &Cluster, cordon: &dyn Fn(&Cluster, &str, bool)) {
    c.set("node-drain-policy", json!("block-for-eviction"));
    c.create_volume(json!({"name": "vol", "size": SIZE, "numberOfReplicas": 2}));
    let h = c.holders("vol");
    let (attached, drained) = (h[0].clone(), h[1].clone());
    let endpoint = c.attach("vol", &attached);
    c.wait_settled("vol", 2, SETTLE);
    let data = write_data(c.dir.path(), &endpoint, 21);
    let evicted = c.replica_on("vol", &drained).unwrap()["name"]
        .as_str()
        .unwrap()
        .to_string();
    cordon(c, &drained, true);
    // While the drain goes on: never degraded, autoEvicting, evictionRequested.
    let (mut saw_evicting, mut saw_requested) = (false, false);
    wait_for(SETTLE, "the drain to complete", || {
        assert_ne!(
            robustness(c, "vol"),
            "degraded",
            "the volume degraded during the drain"
        );
        let n = c.node(&drained);
        saw_evicting |= n["status"]["autoEvicting"] == true;
        if let Some(r) = c
            .replicas("vol")
            .iter()
            .find(|r| r["name"] == evicted.as_str())
        {
            saw_requested |= r["spec"]["evictionRequested"] == true;
        }
        (c.replica_on("vol", &drained).is_none() && n["status"]["drainBlocked"] == false)
            .then_some(())
    });
    assert!(saw_evicting, "autoEvicting was never true");
    assert!(saw_requested, "evictionRequested was never true");
    cordon(c, &drained, false);
    wait_for(SETTLE, "autoEvicting off", || {
        (c.node(&drained)["status"]["autoEvicting"] == false).then_some(())
    });
    let reps = c.wait_settled("vol", 2, SETTLE);
    assert!(reps.iter().all(|r| r["spec"]["evictionRequested"] == false));
    assert!(
        !c.holders("vol").contains(&drained),
        "the replica did not move"
    );
    assert!(
        c.event_reasons(&format!("replica/{evicted}"))
            .contains(&"EvictionAutomatic".to_string())
    );
    verify_data(c.dir.path(), &endpoint, &data);
    verify_replicas(c, "vol", &data);
}

#[test]
fn if_contains_last_replica_evicts_only_the_last_copy_and_blocks_the_drain_until_then() {
    let mut c = Cluster::start(4, 1);
    c.set(
        "node-drain-policy",
        json!("block-for-eviction-if-contains-last-replica"),
    );
    c.create_volume(json!({"name": "one", "size": SIZE, "numberOfReplicas": 1}));
    let drained = c.holders("one")[0].clone();
    // The three-replica volume also has a replica on that node: the other
    // nodes are closed to it while it is created.
    let others: Vec<String> = (1..=4)
        .map(|i| format!("node-{i}"))
        .filter(|n| n != &drained)
        .collect();
    c.patch_node(&others[2], json!({"allowScheduling": false}));
    c.create_volume(json!({"name": "three", "size": SIZE, "numberOfReplicas": 3}));
    c.patch_node(&others[2], json!({"allowScheduling": true}));
    assert!(c.holders("three").contains(&drained));
    let e1 = c.attach("one", &others[0]);
    let e3 = c.attach("three", &others[0]);
    c.wait_settled("one", 1, SETTLE);
    c.wait_settled("three", 3, SETTLE);
    let d1 = write_data(c.dir.path(), &e1, 22);
    let d3 = write_data(c.dir.path(), &e3, 23);
    let last = c.replica_on("one", &drained).unwrap()["name"]
        .as_str()
        .unwrap()
        .to_string();
    let kept = c.replica_on("three", &drained).unwrap()["name"]
        .as_str()
        .unwrap()
        .to_string();
    cordon(&c, &drained, true);
    let mut saw_blocked = false;
    wait_for(SETTLE, "the last copy to leave the node", || {
        assert_ne!(robustness(&c, "one"), "degraded");
        let n = c.node(&drained);
        saw_blocked |= n["status"]["drainBlocked"] == true;
        if let Some(r) = c.replica_on("three", &drained) {
            assert_eq!(r["spec"]["evictionRequested"], false, "{r}");
        }
        (c.replica_on("one", &drained).is_none() && n["status"]["drainBlocked"] == false)
            .then_some(())
    });
    assert!(saw_blocked, "the drain was never blocked by the last copy");
    wait_for(SETTLE, "autoEvicting off", || {
        (c.node(&drained)["status"]["autoEvicting"] == false).then_some(())
    });
    // The drain stops the node: the three-replica volume degrades and the
    // single-replica one does not.
    let idx = c.node_index(&drained);
    c.kill_node(idx);
    write_data(c.dir.path(), &e3, 23);
    wait_for(SETTLE, "three degraded", || {
        (robustness(&c, "three") == "degraded").then_some(())
    });
    assert_eq!(robustness(&c, "one"), "healthy");
    // Back, and uncordoned: the replica of `three` is reused in place.
    c.restart_node(idx);
    cordon(&c, &drained, false);
    wait_for(SETTLE, "three healthy again", || {
        let reps = c.replicas("three");
        (reps.len() == 3
            && reps.iter().all(|r| r["status"]["mode"] == "rw")
            && reps.iter().any(|r| r["name"] == kept.as_str()))
        .then_some(())
    });
    assert!(
        !c.holders("one").contains(&drained),
        "the last copy did not move"
    );
    for v in ["one", "three"] {
        assert!(
            c.replicas(v)
                .iter()
                .all(|r| r["spec"]["evictionRequested"] == false)
        );
    }
    assert!(
        c.event_reasons(&format!("replica/{last}"))
            .contains(&"EvictionAutomatic".to_string())
    );
    verify_data(c.dir.path(), &e1, &d1);
    verify_data(c.dir.path(), &e3, &d3);
    verify_replicas(&c, "one", &d1);
    verify_replicas(&c, "three", &d3);
}

#[test]
fn block_for_eviction_with_nowhere_to_go_blocks_the_drain_until_uncordoned() {
    let c = Cluster::start(3, 1);
    c.set("node-drain-policy", json!("block-for-eviction"));
    // Three replicas on three nodes with hard anti-affinity: nowhere to go.
    c.create_volume(json!({"name": "vol", "size": SIZE, "numberOfReplicas": 3}));
    let endpoint = c.attach("vol", "node-1");
    c.wait_settled("vol", 3, SETTLE);
    let data = write_data(c.dir.path(), &endpoint, 24);
    let evicted = c.replica_on("vol", "node-2").unwrap()["name"]
        .as_str()
        .unwrap()
        .to_string();
    cordon(&c, "node-2", true);
    wait_for(SETTLE, "autoEvicting and evictionRequested", || {
        let n = c.node("node-2");
        let r = c.replica_on("vol", "node-2")?;
        (n["status"]["autoEvicting"] == true && r["spec"]["evictionRequested"] == true)
            .then_some(())
    });
    // The drain never completes while the node stays cordoned: the last
    // replica is not planned away.
    c.stays_put("vol");
    assert_eq!(c.node("node-2")["status"]["drainBlocked"], true);
    assert!(c.replica_on("vol", "node-2").is_some());
    // The volume's record says why: its `Scheduled` condition, false,
    // with the planner's reason for each node.
    let blocked = wait_for(SETTLE, "the volume's Scheduled condition false", || {
        c.scheduled("vol").filter(|k| k["status"] == false)
    });
    let message = blocked["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("no place for a replica")
            && message.contains("node-2: cordoned")
            && message.contains("node-1: holds a replica of vol"),
        "{blocked}"
    );
    assert!(
        blocked["reason"]
            .as_str()
            .unwrap_or_default()
            .ends_with("Blocked"),
        "{blocked}"
    );
    cordon(&c, "node-2", false);
    wait_for(SETTLE, "eviction canceled", || {
        let n = c.node("node-2");
        let r = c.replica_on("vol", "node-2")?;
        (n["status"]["autoEvicting"] == false && r["spec"]["evictionRequested"] == false)
            .then_some(())
    });
    c.wait_settled("vol", 3, SETTLE);
    assert_eq!(robustness(&c, "vol"), "healthy");
    let cleared = wait_for(
        SETTLE,
        "the volume's Scheduled condition true again",
        || c.scheduled("vol").filter(|k| k["status"] == true),
    );
    assert_eq!(cleared["message"], "", "{cleared}");
    // Each event is written after the change it tells of.
    wait_for(SETTLE, "the eviction's events", || {
        let reasons = c.event_reasons(&format!("replica/{evicted}"));
        (reasons.contains(&"EvictionAutomatic".to_string())
            && reasons.contains(&"EvictionCanceled".to_string()))
        .then_some(())
    });
    verify_data(c.dir.path(), &endpoint, &data);
    verify_replicas(&c, "vol", &data);
}
