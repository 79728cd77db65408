//! Seed 003, data locality: every scenario of its (manual) test plan, on
//! a nine-node model cluster as the seed asks.

mod common;

use common::*;

fn nine_nodes(default_locality: &str, volumes: &str) -> String {
    let nodes: String = (1..=9)
        .map(|i| format!("  - {{id: node-{i}, disks: [{{id: d1, size: 100Gi}}]}}\n"))
        .collect();
    format!(
        r#"
settings: {{default-data-locality: {default_locality}}}
nodes:
{nodes}volumes: {volumes}
steps:
  - settle: {{}}
"#
    )
}

/// Places the volume detached, then attaches it to `node`.
fn attach_and_settle(run: &mut Run, volume: &str, node: &str) -> ballast_controller::sim::Report {
    run.step(&format!("volume: {{name: {volume}, attachedNode: {node}}}"));
    run.sim.settle(0)
}

fn holders(r: &ballast_controller::sim::Report, volume: &str) -> Vec<String> {
    r.replicas[volume]
        .iter()
        .filter(|(_, c)| **c > 0)
        .map(|(n, _)| n.clone())
        .collect()
}

#[test]
fn seed003_best_effort_builds_a_local_replica_then_removes_a_remote_one() {
    let mut run = start(&nine_nodes(
        "disabled",
        "[{name: testvol, size: 1Gi, numberOfReplicas: 2, dataLocality: best-effort}]",
    ));
    let r = run.settle();
    let before = holders(&r, "testvol");
    assert_eq!(before, ["node-1", "node-2"]);
    let r = attach_and_settle(&mut run, "testvol", "node-9");
    assert_eq!(r.replicas["testvol"]["node-9"], 1, "a local replica");
    assert_eq!(
        r.replicas["testvol"].values().sum::<usize>(),
        2,
        "back to 2 replicas"
    );
    assert_eq!((r.created, r.deleted), (1, 1));
    assert!(
        run.sim
            .events()
            .iter()
            .any(|e| e.reason == "LocalReplicaCreated")
    );
    run.hold(10);
}

#[test]
fn seed003_disabled_does_not_move_replicas() {
    let mut run = start(&nine_nodes(
        "disabled",
        "[{name: testvol2, size: 1Gi, numberOfReplicas: 2, dataLocality: disabled}]",
    ));
    run.settle();
    let r = attach_and_settle(&mut run, "testvol2", "node-9");
    assert_eq!(r.replicas["testvol2"]["node-9"], 0);
    assert_eq!((r.created, r.deleted), (0, 0));
}

#[test]
fn seed003_unspecified_follows_the_default_setting_disabled() {
    let mut run = start(&nine_nodes(
        "disabled",
        "[{name: testvol3, size: 1Gi, numberOfReplicas: 2}]",
    ));
    run.settle();
    let r = attach_and_settle(&mut run, "testvol3", "node-9");
    assert_eq!(r.replicas["testvol3"]["node-9"], 0);
    assert_eq!((r.created, r.deleted), (0, 0));
}

#[test]
fn seed003_unspecified_follows_the_default_setting_best_effort() {
    let mut run = start(&nine_nodes(
        "best-effort",
        "[{name: testvol4, size: 1Gi, numberOfReplicas: 2}]",
    ));
    run.settle();
    let r = attach_and_settle(&mut run, "testvol4", "node-9");
    assert_eq!(r.replicas["testvol4"]["node-9"], 1);
    assert_eq!(r.replicas["testvol4"].values().sum::<usize>(), 2);
}

#[test]
fn seed003_changing_the_default_setting_at_runtime_takes_effect() {
    let mut run = start(&nine_nodes(
        "disabled",
        "[{name: v, size: 1Gi, numberOfReplicas: 2}]",
    ));
    run.settle();
    let r = attach_and_settle(&mut run, "v", "node-9");
    assert_eq!(r.replicas["v"]["node-9"], 0);
    run.step("setting: {name: default-data-locality, value: best-effort}");
    let r = run.sim.settle(0);
    assert_eq!(r.replicas["v"]["node-9"], 1, "no restart needed");
}

#[test]
fn seed003_update_from_disabled_to_best_effort() {
    let mut run = start(&nine_nodes(
        "disabled",
        "[{name: testvol2, size: 1Gi, numberOfReplicas: 2, dataLocality: disabled}]",
    ));
    run.settle();
    attach_and_settle(&mut run, "testvol2", "node-9");
    run.step("volume: {name: testvol2, dataLocality: best-effort}");
    let r = run.sim.settle(0);
    assert_eq!(r.replicas["testvol2"]["node-9"], 1);
    assert_eq!(r.replicas["testvol2"].values().sum::<usize>(), 2);
    run.hold(10);
}

#[test]
fn seed003_update_from_best_effort_to_disabled_then_losing_the_local_replica_moves_nothing() {
    let mut run = start(&nine_nodes(
        "disabled",
        "[{name: testvol2, size: 1Gi, numberOfReplicas: 2, dataLocality: best-effort}]",
    ));
    run.settle();
    let r = attach_and_settle(&mut run, "testvol2", "node-9");
    assert_eq!(r.replicas["testvol2"]["node-9"], 1);
    run.step("volume: {name: testvol2, dataLocality: disabled, numberOfReplicas: 3}");
    let r = run.sim.settle(0);
    assert_eq!(r.replicas["testvol2"].values().sum::<usize>(), 3);
    run.step("deleteReplica: {volume: testvol2, node: node-9}");
    let r = run.sim.settle(0);
    assert_eq!(
        r.replicas["testvol2"]["node-9"], 0,
        "disabled: no local replica is rebuilt on node-9"
    );
    assert_eq!(
        r.replicas["testvol2"].values().sum::<usize>(),
        3,
        "the replica count is restored elsewhere"
    );
    run.hold(10);
}

#[test]
fn seed003_storage_class_disabled_with_one_replica_does_not_move() {
    let mut run = start(&nine_nodes(
        "disabled",
        "[{name: sc-disabled, size: 1Gi, numberOfReplicas: 1, dataLocality: disabled}]",
    ));
    run.settle();
    let r = attach_and_settle(&mut run, "sc-disabled", "node-5");
    assert_eq!(holders(&r, "sc-disabled"), ["node-1"]);
}

#[test]
fn seed003_storage_class_best_effort_with_one_replica_migrates_to_the_pod() {
    let mut run = start(&nine_nodes(
        "disabled",
        "[{name: sc-best, size: 1Gi, numberOfReplicas: 1, dataLocality: best-effort}]",
    ));
    run.settle();
    let r = attach_and_settle(&mut run, "sc-best", "node-5");
    assert_eq!(
        holders(&r, "sc-best"),
        ["node-5"],
        "the replica moved to the pod's node"
    );
    assert_eq!((r.created, r.deleted), (1, 1));
}

#[test]
fn seed003_storage_class_unspecified_depends_on_the_default() {
    for (default, expect) in [("disabled", "node-1"), ("best-effort", "node-5")] {
        let mut run = start(&nine_nodes(
            default,
            "[{name: sc-unspec, size: 1Gi, numberOfReplicas: 1}]",
        ));
        run.settle();
        let r = attach_and_settle(&mut run, "sc-unspec", "node-5");
        assert_eq!(holders(&r, "sc-unspec"), [expect], "default {default}");
    }
}

#[test]
fn seed003_volumes_from_before_data_locality_are_treated_as_disabled() {
    // No dataLocality field, default setting disabled: as old volumes.
    let mut run = start(&nine_nodes(
        "disabled",
        "[{name: old, size: 1Gi, numberOfReplicas: 2}]",
    ));
    run.settle();
    let r = attach_and_settle(&mut run, "old", "node-9");
    assert_eq!(r.replicas["old"]["node-9"], 0);
}

#[test]
fn locality_that_cannot_place_keeps_the_volume_working_and_says_why() {
    let mut run = start(&nine_nodes(
        "disabled",
        "[{name: v, size: 1Gi, numberOfReplicas: 2, dataLocality: best-effort}]",
    ));
    run.settle();
    run.step("node: {id: node-9, allowScheduling: false}");
    let r = attach_and_settle(&mut run, "v", "node-9");
    assert_eq!(r.replicas["v"].values().sum::<usize>(), 2, "still healthy");
    assert!(
        r.blocked
            .iter()
            .any(|b| b.contains("no local replica on node-9") && b.contains("scheduling disabled")),
        "{:?}",
        r.blocked
    );
}

#[test]
fn strict_local_places_its_one_replica_on_the_attached_node_and_never_moves_it() {
    let mut run = start(&nine_nodes(
        "disabled",
        "[{name: s, size: 1Gi, numberOfReplicas: 1, dataLocality: strict-local, attachedNode: node-7}]",
    ));
    let r = run.settle();
    assert_eq!(holders(&r, "s"), ["node-7"]);
    let r = attach_and_settle(&mut run, "s", "node-3");
    assert_eq!(
        holders(&r, "s"),
        ["node-7"],
        "strict-local data does not move"
    );
    assert!(
        r.blocked.iter().any(|b| b.contains("strict-local")),
        "{:?}",
        r.blocked
    );
}
