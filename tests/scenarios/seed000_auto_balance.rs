//! Seed 000: automatic replica rebalance across nodes and zones, with the
//! data written before the moves verified after them.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use crate::harness::*;

const SETTLE: Duration = Duration::from_secs(120);

fn counts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// Replica names and where they are, to show that nothing moved.
fn placement(c: &Cluster, volume: &str) -> Vec<(String, String)> {
    let mut p: Vec<(String, String)> = c
        .replicas(volume)
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_string(),
                r["spec"]["nodeId"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    p.sort();
    p
}

/// Per zone, from per node (node-i is in zone-i unless moved).
fn per_zone(c: &Cluster, volume: &str) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for (node, n) in c.rw_per_node(volume) {
        let zone = c.node(&node)["spec"]["zone"].as_str().unwrap().to_string();
        *m.entry(zone).or_default() += n;
    }
    m
}

/// Nothing moves: no change planned, over the resync ticks (the seed's
/// "sleep 10 seconds, to ensure no additional scheduling", asserted on the
/// plan instead of hoped for).
fn stays_put(c: &Cluster, volume: &str) {
    let before = placement(c, volume);
    c.stays_put(volume);
    assert_eq!(
        placement(c, volume),
        before,
        "replicas moved while balanced"
    );
}

/// Common start: soft anti-affinity, node-2 and node-3 not schedulable, a
/// volume of `replicas` on node-1, attached there, with data.
fn start(balance: &str, replicas: u32, zones: bool) -> (Cluster, String, Data) {
    let c = Cluster::start(3, 1);
    c.set("replica-soft-anti-affinity", json!(true));
    c.set("replica-disk-soft-anti-affinity", json!(true));
    if zones {
        c.set("replica-zone-soft-anti-affinity", json!(true));
    }
    c.set("replica-auto-balance", json!(balance));
    for n in ["node-2", "node-3"] {
        c.patch_node(n, json!({"allowScheduling": false}));
    }
    c.create_volume(json!({"name": "vol", "size": SIZE, "numberOfReplicas": replicas}));
    let endpoint = c.attach("vol", "node-1");
    c.wait_settled("vol", replicas as usize, SETTLE);
    let data = write_data(c.dir.path(), &endpoint, 1);
    assert_eq!(
        c.rw_per_node("vol"),
        counts(&[("node-1", replicas as usize)])
    );
    (c, endpoint, data)
}

fn wait_counts(c: &Cluster, volume: &str, want: &BTreeMap<String, usize>, total: usize) {
    wait_for(SETTLE, &format!("{volume} at {want:?}"), || {
        let reps = c.replicas(volume);
        (reps.len() == total && &c.rw_per_node(volume) == want).then_some(())
    });
}

fn check_data(c: &Cluster, endpoint: &str, data: &Data) {
    verify_data(c.dir.path(), endpoint, data);
    verify_replicas(c, "vol", data);
}

#[test]
fn node_best_effort_evens_out_six_replicas_and_keeps_the_data() {
    let (c, endpoint, data) = start("best-effort", 6, false);
    c.patch_node("node-2", json!({"allowScheduling": true}));
    wait_counts(&c, "vol", &counts(&[("node-1", 3), ("node-2", 3)]), 6);
    stays_put(&c, "vol");
    verify_data(c.dir.path(), &endpoint, &data);
    c.patch_node("node-3", json!({"allowScheduling": true}));
    wait_counts(
        &c,
        "vol",
        &counts(&[("node-1", 2), ("node-2", 2), ("node-3", 2)]),
        6,
    );
    stays_put(&c, "vol");
    check_data(&c, &endpoint, &data);
    // Five moves, each a real rebuild that copied the data: the first to a
    // node over the network, the next ones there from that node's copy.
    let rebuilds = c.rebuilds();
    assert_eq!(rebuilds.len(), 5, "{rebuilds:?}");
    assert!(
        rebuilds.iter().any(|(_, m)| m.contains("by remote")),
        "{rebuilds:?}"
    );
    for (replica, message) in &rebuilds {
        assert!(!message.contains("copied 0 B"), "{replica}: {message}");
    }
}

#[test]
fn node_least_effort_spreads_without_evening_out_and_keeps_the_data() {
    let (c, endpoint, data) = start("least-effort", 6, false);
    c.patch_node("node-2", json!({"allowScheduling": true}));
    let after2 = wait_for(SETTLE, "a replica on node-2", || {
        let m = c.rw_per_node("vol");
        (c.replicas("vol").len() == 6 && m.get("node-2").is_some_and(|n| *n > 0)).then_some(m)
    });
    assert_ne!(after2.get("node-1"), after2.get("node-2"), "{after2:?}");
    assert_eq!(after2.get("node-3"), None);
    stays_put(&c, "vol");
    c.patch_node("node-3", json!({"allowScheduling": true}));
    let after3 = wait_for(SETTLE, "a replica on node-3", || {
        let m = c.rw_per_node("vol");
        (c.replicas("vol").len() == 6 && m.get("node-3").is_some_and(|n| *n > 0)).then_some(m)
    });
    assert!(after3.get("node-2").is_some_and(|n| *n > 0), "{after3:?}");
    assert_ne!(after3.get("node-1"), after3.get("node-3"), "{after3:?}");
    stays_put(&c, "vol");
    check_data(&c, &endpoint, &data);
}

#[test]
fn a_volume_spec_balances_one_volume_when_the_setting_does_not() {
    let c = Cluster::start(3, 1);
    c.set("replica-soft-anti-affinity", json!(true));
    c.set("replica-disk-soft-anti-affinity", json!(true));
    c.set("replica-auto-balance", json!("disabled"));
    for n in ["node-2", "node-3"] {
        c.patch_node(n, json!({"allowScheduling": false}));
    }
    let mut data = Vec::new();
    for (i, v) in ["vol-1", "vol-2"].iter().enumerate() {
        c.create_volume(json!({"name": v, "size": SIZE, "numberOfReplicas": 3}));
        let endpoint = c.attach(v, "node-1");
        c.wait_settled(v, 3, SETTLE);
        assert_eq!(c.rw_per_node(v), counts(&[("node-1", 3)]));
        data.push((
            v.to_string(),
            endpoint.clone(),
            write_data(c.dir.path(), &endpoint, i as u64 + 7),
        ));
    }
    c.ok(
        "PATCH",
        "/v1/volumes/vol-2",
        Some(json!({"replicaAutoBalance": "least-effort"})),
    );
    for n in ["node-2", "node-3"] {
        c.patch_node(n, json!({"allowScheduling": true}));
    }
    wait_counts(
        &c,
        "vol-2",
        &counts(&[("node-1", 1), ("node-2", 1), ("node-3", 1)]),
        3,
    );
    stays_put(&c, "vol-1");
    assert_eq!(c.rw_per_node("vol-1"), counts(&[("node-1", 3)]));
    for (v, endpoint, d) in &data {
        verify_data(c.dir.path(), endpoint, d);
        verify_replicas(&c, v, d);
    }
}

/// Zone scenarios: node-i in zone-i, the volume's own balance mode.
fn start_zones(balance: &str, replicas: u32) -> (Cluster, String, Data) {
    let c = Cluster::start(3, 1);
    for (n, z) in [
        ("node-1", "zone-1"),
        ("node-2", "zone-2"),
        ("node-3", "zone-3"),
    ] {
        c.patch_node(n, json!({"zone": z}));
    }
    c.set("replica-soft-anti-affinity", json!(true));
    c.set("replica-zone-soft-anti-affinity", json!(true));
    c.set("replica-disk-soft-anti-affinity", json!(true));
    for n in ["node-2", "node-3"] {
        c.patch_node(n, json!({"allowScheduling": false}));
    }
    c.create_volume(json!({"name": "vol", "size": SIZE, "numberOfReplicas": replicas, "replicaAutoBalance": balance}));
    let endpoint = c.attach("vol", "node-1");
    c.wait_settled("vol", replicas as usize, SETTLE);
    let data = write_data(c.dir.path(), &endpoint, 3);
    assert_eq!(
        per_zone(&c, "vol"),
        counts(&[("zone-1", replicas as usize)])
    );
    (c, endpoint, data)
}

fn wait_zones(
    c: &Cluster,
    ok: impl Fn(&BTreeMap<String, usize>) -> bool,
) -> BTreeMap<String, usize> {
    wait_for(SETTLE, "the zone layout", || {
        let z = per_zone(c, "vol");
        (c.replicas("vol").len() == 6 && ok(&z)).then_some(z)
    })
}

#[test]
fn zone_least_effort_reaches_every_zone_and_keeps_the_data() {
    let (c, endpoint, data) = start_zones("least-effort", 6);
    c.patch_node("node-2", json!({"allowScheduling": true}));
    let z = wait_zones(&c, |z| z.get("zone-2").is_some_and(|n| *n > 0));
    assert_ne!(z.get("zone-1"), z.get("zone-2"), "{z:?}");
    assert_eq!(z.get("zone-3"), None);
    c.patch_node("node-3", json!({"allowScheduling": true}));
    let z = wait_zones(&c, |z| z.get("zone-3").is_some_and(|n| *n > 0));
    assert!(z.get("zone-2").is_some_and(|n| *n > 0));
    assert_ne!(z.get("zone-1"), z.get("zone-3"), "{z:?}");
    stays_put(&c, "vol");
    check_data(&c, &endpoint, &data);
}

#[test]
fn zone_best_effort_evens_out_zones_and_keeps_the_data() {
    let (c, endpoint, data) = start_zones("best-effort", 6);
    c.patch_node("node-2", json!({"allowScheduling": true}));
    wait_zones(&c, |z| z == &counts(&[("zone-1", 3), ("zone-2", 3)]));
    c.patch_node("node-3", json!({"allowScheduling": true}));
    wait_zones(&c, |z| {
        z == &counts(&[("zone-1", 2), ("zone-2", 2), ("zone-3", 2)])
    });
    stays_put(&c, "vol");
    check_data(&c, &endpoint, &data);
}

#[test]
fn a_node_added_to_the_zone_with_duplicates_gets_one() {
    let c = Cluster::start(3, 1);
    c.set("replica-soft-anti-affinity", json!(true));
    c.set("replica-zone-soft-anti-affinity", json!(true));
    c.set("replica-disk-soft-anti-affinity", json!(true));
    c.patch_node("node-1", json!({"zone": "zone-1"}));
    c.patch_node("node-2", json!({"zone": "zone-2"}));
    c.patch_node("node-3", json!({"allowScheduling": false}));
    c.create_volume(json!({"name": "vol", "size": SIZE, "numberOfReplicas": 3, "replicaAutoBalance": "least-effort"}));
    let endpoint = c.attach("vol", "node-1");
    c.wait_settled("vol", 3, SETTLE);
    let data = write_data(c.dir.path(), &endpoint, 4);
    let z = per_zone(&c, "vol");
    assert_eq!(z.values().sum::<usize>(), 3);
    // node-3 joins the zone that holds two replicas.
    let dup = z
        .iter()
        .find(|(_, n)| **n == 2)
        .map(|(z, _)| z.clone())
        .unwrap();
    c.patch_node("node-3", json!({"zone": dup, "allowScheduling": true}));
    wait_counts(
        &c,
        "vol",
        &counts(&[("node-1", 1), ("node-2", 1), ("node-3", 1)]),
        3,
    );
    let z = per_zone(&c, "vol");
    assert_eq!(
        z.get("zone-1").copied().unwrap_or(0) + z.get("zone-2").copied().unwrap_or(0),
        3,
        "{z:?}"
    );
    check_data(&c, &endpoint, &data);
}
