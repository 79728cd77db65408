//! Seed 001, disk pressure within a node: every scenario of its test plan,
//! plus the pacing lesson (a stopped volume must not block moves).

mod common;

use ballast_controller::planner::{ActionKind, Rule};
use common::*;

/// node-1 has two 100Gi disks; d2 starts closed so that every replica
/// lands on d1. Each volume's replica holds 10Gi.
fn scenario(volumes: &str, d2_used: &str) -> String {
    format!(
        r#"
settings: {{replica-auto-balance: best-effort, replica-soft-anti-affinity: "true", replica-auto-balance-disk-pressure-percentage: 90}}
rebuildTicks: 3
nodes:
  - {{id: node-1, disks: [{{id: d1, size: 100Gi}}, {{id: d2, size: 100Gi, used: {d2_used}, allowScheduling: false}}]}}
volumes: {volumes}
steps:
  - settle: {{}}
  - disk: {{node: node-1, id: d2, allowScheduling: true}}
  - settle: {{}}
  - disk: {{node: node-1, id: d1, used: 65Gi}}
  - settle: {{}}
"#
    )
}

const THREE_VOLUMES: &str = r#"
  - {name: v1, size: 10Gi, numberOfReplicas: 1, attachedNode: node-1}
  - {name: v2, size: 10Gi, numberOfReplicas: 1, attachedNode: node-1}
  - {name: v3, size: 10Gi, numberOfReplicas: 1, attachedNode: node-1}
"#;

fn pressure_moves(run: &Run) -> Vec<(String, String, String, Option<String>)> {
    run.sim
        .history
        .iter()
        .filter(|(_, a)| a.rule == Rule::DiskPressure)
        .filter_map(|(_, a)| match &a.kind {
            ActionKind::CreateReplica {
                volume,
                node,
                disk,
                copy_from,
                ..
            } => Some((
                volume.clone(),
                node.clone(),
                disk.clone(),
                copy_from.clone(),
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn seed001_pressured_disk_moves_a_replica_to_another_disk_of_the_same_node_by_local_copy() {
    let mut run = start(&scenario(THREE_VOLUMES, "0"));
    let r = run.settle();
    assert_eq!(r.disks["v1"]["node-1/d1"], 1);
    run.settle();
    // d1: 65Gi of other data + 3 x 10Gi = 95%, at or above 90%.
    let r = run.settle();
    let moves = pressure_moves(&run);
    assert_eq!(moves.len(), 1, "one move relieves the pressure: {moves:?}");
    let (volume, node, disk, copy_from) = &moves[0];
    assert_eq!((node.as_str(), disk.as_str()), ("node-1", "d2"));
    let source = copy_from.as_deref().expect("a local copy source");
    assert!(
        source.starts_with(volume.as_str()),
        "copies from the same volume's replica"
    );
    assert_eq!(r.disks[volume.as_str()].get("node-1/d2"), Some(&1));
    assert_eq!(
        r.disks[volume.as_str()].get("node-1/d1"),
        None,
        "the old replica is gone"
    );
    let d1 = run.sim.view().nodes[0].disks[0].used_percent();
    assert!(d1 < 90, "d1 is no longer pressured: {d1}%");
}

#[test]
fn seed001_no_move_to_a_disk_that_would_become_pressured() {
    // d2 holds 85Gi: one more 10Gi replica would make it 95%. The minimum
    // free share is lowered so that only the pressure rule can refuse it.
    let text = scenario(THREE_VOLUMES, "85Gi").replace(
        "replica-auto-balance-disk-pressure-percentage: 90",
        "replica-auto-balance-disk-pressure-percentage: 90, storage-minimal-available-percentage: 5",
    );
    let mut run = start(&text);
    run.settle();
    run.settle();
    let r = run.settle();
    assert!(
        pressure_moves(&run).is_empty(),
        "no move into a disk that would be pressured"
    );
    assert_eq!(r.disks["v1"]["node-1/d1"], 1);
    assert!(
        r.blocked
            .iter()
            .any(|b| b.contains("node-1/d1 is pressured") && b.contains("pressure threshold 90%")),
        "{:?}",
        r.blocked
    );
}

#[test]
fn seed001_never_two_replicas_to_one_disk_at_once() {
    // d1 very full: several replicas must move, one at a time into d2.
    let volumes = r#"
  - {name: v1, size: 10Gi, numberOfReplicas: 1, attachedNode: node-1}
  - {name: v2, size: 10Gi, numberOfReplicas: 1, attachedNode: node-1}
  - {name: v3, size: 10Gi, numberOfReplicas: 1, attachedNode: node-1}
  - {name: v4, size: 10Gi, numberOfReplicas: 1, attachedNode: node-1}
"#;
    let text = scenario(volumes, "0").replace("used: 65Gi", "used: 60Gi");
    let mut run = start(&text);
    run.settle();
    run.settle();
    // d1: 60 + 40 = 100%. Tick by tick, at most one rebuild into d2.
    while run.next_is_settle_pending() {}
    for _ in 0..200 {
        let pending = run.sim.pending();
        let plan = run.sim.tick();
        let into_d2 = run
            .sim
            .replicas()
            .into_values()
            .filter(|r| {
                r.spec.disk_id == "d2" && r.status.mode == Some(ballast::model::ReplicaMode::Wo)
            })
            .count();
        assert!(
            into_d2 <= 1,
            "{into_d2} replicas rebuilding into d2 at once"
        );
        if plan.changes().next().is_none() && !pending {
            break;
        }
    }
    let moves = pressure_moves(&run);
    assert!(moves.len() >= 2, "several moves happened: {moves:?}");
    let d1 = run.sim.view().nodes[0].disks[0].used_percent();
    assert!(d1 < 90, "d1 relieved: {d1}%");
    run.hold(10);
}

#[test]
fn seed001_a_stopped_volume_does_not_block_pressure_moves() {
    // "a-stopped" sorts first on d1 but is detached: it cannot rebuild, and
    // must not stop the others from moving (lesson).
    let volumes = r#"
  - {name: a-stopped, size: 10Gi, numberOfReplicas: 1}
  - {name: v1, size: 10Gi, numberOfReplicas: 1, attachedNode: node-1}
  - {name: v2, size: 10Gi, numberOfReplicas: 1, attachedNode: node-1}
"#;
    let mut run = start(&scenario(volumes, "0"));
    run.settle();
    run.settle();
    run.settle();
    let moves = pressure_moves(&run);
    assert_eq!(moves.len(), 1, "{moves:?}");
    assert_ne!(moves[0].0, "a-stopped");
}
