//! Seed 003: data locality. With `best-effort`, a volume attached to a node
//! that holds none of its replicas gets one there, and then loses one
//! elsewhere; with `disabled` nothing moves. Data is checked after moves.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::*;

const SETTLE: Duration = Duration::from_secs(120);

/// Creates a 2-replica volume, attaches it to the node holding none of its
/// replicas, writes data; returns (node, endpoint, data).
fn attach_away(
    c: &Cluster,
    name: &str,
    locality: Option<&str>,
    seed: u64,
) -> (String, String, Data) {
    let mut body = json!({"name": name, "size": SIZE, "numberOfReplicas": 2});
    if let Some(l) = locality {
        body["dataLocality"] = Value::from(l);
    }
    c.create_volume(body);
    let holders = c.holders(name);
    let away = ["node-1", "node-2", "node-3"]
        .into_iter()
        .find(|n| !holders.iter().any(|h| h == n))
        .unwrap()
        .to_string();
    let endpoint = c.attach(name, &away);
    let data = write_data(c.dir.path(), &endpoint, seed);
    (away, endpoint, data)
}

/// Waits for a local replica on `node` and exactly `n` replicas, all rw.
fn wait_local(c: &Cluster, volume: &str, node: &str, n: usize) {
    wait_for(
        SETTLE,
        &format!("a local replica of {volume} on {node}"),
        || {
            let reps = c.replicas(volume);
            (reps.len() == n
                && reps.iter().all(|r| r["status"]["mode"] == "rw")
                && reps.iter().any(|r| r["spec"]["nodeId"] == node))
            .then_some(())
        },
    );
}

fn unchanged(c: &Cluster, volume: &str, before: &[String]) {
    assert_eq!(c.stays_put(volume), before, "{volume}'s replicas moved");
}

#[test]
fn best_effort_moves_a_replica_next_to_the_volume_and_disabled_leaves_them() {
    let c = Cluster::start(3, 1);
    // best-effort: a local replica is built, then one elsewhere goes.
    let (node, endpoint, data) = attach_away(&c, "testvol", Some("best-effort"), 11);
    wait_local(&c, "testvol", &node, 2);
    assert!(!c.rebuilds().is_empty());
    verify_data(c.dir.path(), &endpoint, &data);
    verify_replicas(&c, "testvol", &data);
    // disabled: nothing moves.
    let (_, endpoint2, data2) = attach_away(&c, "testvol2", Some("disabled"), 12);
    let before = c.holders("testvol2");
    unchanged(&c, "testvol2", &before);
    // unspecified, with the default setting `disabled`: nothing moves.
    assert_eq!(
        c.ok("GET", "/v1/settings/default-data-locality", None)["value"],
        "disabled"
    );
    let (_, _, _) = attach_away(&c, "testvol3", None, 13);
    let before3 = c.holders("testvol3");
    unchanged(&c, "testvol3", &before3);
    verify_data(c.dir.path(), &endpoint2, &data2);
}

#[test]
fn the_default_setting_and_runtime_switches_take_effect() {
    let c = Cluster::start(3, 1);
    // The default `best-effort` applies to a volume that names none.
    c.set("default-data-locality", json!("best-effort"));
    let (node4, endpoint4, data4) = attach_away(&c, "testvol4", None, 14);
    wait_local(&c, "testvol4", &node4, 2);
    verify_data(c.dir.path(), &endpoint4, &data4);
    // disabled -> best-effort at runtime.
    let (node2, endpoint2, data2) = attach_away(&c, "testvol2", Some("disabled"), 15);
    let before = c.holders("testvol2");
    unchanged(&c, "testvol2", &before);
    c.ok(
        "PATCH",
        "/v1/volumes/testvol2",
        Some(json!({"dataLocality": "best-effort"})),
    );
    wait_local(&c, "testvol2", &node2, 2);
    verify_data(c.dir.path(), &endpoint2, &data2);
    // best-effort -> disabled, then a third replica: it is added, none goes.
    c.ok(
        "PATCH",
        "/v1/volumes/testvol2",
        Some(json!({"dataLocality": "disabled", "numberOfReplicas": 3})),
    );
    c.wait_settled("testvol2", 3, SETTLE);
    let three = c.holders("testvol2");
    unchanged(&c, "testvol2", &three);
    verify_data(c.dir.path(), &endpoint2, &data2);
    verify_replicas(&c, "testvol2", &data2);
}
