//! Seed 002, automatic eviction on cordon and the node drain policies:
//! every scenario of its test plan, plus the other policies and the lesson
//! that a replica which never held data never blocks a drain.

mod common;

use ballast::model::{Replica, ReplicaMode};
use ballast_controller::sim::Report;
use common::*;

fn four_nodes(policy: &str, extra_settings: &str, volumes: &str) -> String {
    format!(
        r#"
settings: {{node-drain-policy: {policy}{extra_settings}}}
rebuildTicks: 2
nodes:
  - {{id: node-1, disks: [{{id: d1, size: 100Gi}}]}}
  - {{id: node-2, disks: [{{id: d1, size: 100Gi}}]}}
  - {{id: node-3, disks: [{{id: d1, size: 100Gi}}]}}
  - {{id: node-4, disks: [{{id: d1, size: 100Gi}}]}}
volumes: {volumes}
steps:
  - settle: {{}}
"#
    )
}

fn events(run: &Run, reason: &str) -> Vec<String> {
    run.sim
        .events()
        .into_iter()
        .filter(|e| e.reason == reason)
        .map(|e| e.object)
        .collect()
}

fn replica_on(run: &Run, volume: &str, node: &str) -> Option<Replica> {
    run.sim
        .replicas()
        .into_values()
        .find(|r| r.spec.volume == volume && r.spec.node_id == node)
}

fn rw_count(run: &Run, volume: &str) -> usize {
    run.sim
        .replicas()
        .into_values()
        .filter(|r| r.spec.volume == volume && r.status.mode == Some(ReplicaMode::Rw))
        .count()
}

/// Ticks until quiet, checking `each` after every tick.
/// Uncordons node-1 and settles: its automatic eviction is over and no
/// replica is asked to move any more.
fn uncordon_node_1(run: &mut Run) -> Report {
    run.step("node: {id: node-1, cordoned: false}");
    let r = run.sim.settle(0);
    assert!(!r.nodes["node-1"].auto_evicting);
    assert!(
        run.sim
            .replicas()
            .into_values()
            .all(|r| !r.spec.eviction_requested)
    );
    r
}

fn tick_until_quiet(run: &mut Run, mut each: impl FnMut(&Run)) {
    for _ in 0..500 {
        let pending = run.sim.pending();
        let plan = run.sim.tick();
        each(run);
        if plan.changes().next().is_none() && !pending {
            return;
        }
    }
    panic!("never settled");
}

#[test]
fn seed002_block_for_eviction_moves_every_replica_off_a_cordoned_node_without_degrading() {
    let mut run = start(&four_nodes(
        "block-for-eviction",
        "",
        "[{name: v1, size: 1Gi, numberOfReplicas: 3, attachedNode: node-4}]",
    ));
    let r = run.settle();
    assert_eq!(count_on(&r, "v1", "node-1"), 1);
    let evicted = replica_on(&run, "v1", "node-1").unwrap().name;

    run.step("node: {id: node-1, cordoned: true}");
    let mut saw_evicting = false;
    tick_until_quiet(&mut run, |run| {
        assert!(
            rw_count(run, "v1") >= 3,
            "the volume never becomes degraded"
        );
        let n1 = run.sim.node_record("node-1").unwrap();
        if let Some(r) = run.sim.replicas().get(&evicted) {
            assert!(r.spec.eviction_requested);
            assert!(n1.status.auto_evicting, "autoEvicting while replicas leave");
            assert!(
                n1.status.drain_blocked,
                "drain waits while the node holds a replica"
            );
            saw_evicting = true;
        }
    });
    assert!(saw_evicting);
    let r = run.sim.settle(0);
    assert_eq!(
        count_on(&r, "v1", "node-1"),
        0,
        "the replica moved off node-1"
    );
    assert_eq!(count_on(&r, "v1", "node-4"), 1, "to the spare node");
    assert!(!r.nodes["node-1"].drain_blocked, "the drain completes");
    assert!(!r.nodes["node-1"].auto_evicting);
    assert_eq!(
        events(&run, "EvictionAutomatic"),
        [format!("replica/{evicted}")]
    );

    let r = uncordon_node_1(&mut run);
    assert_eq!(
        per_node(&r, "v1"),
        [0, 1, 1, 1],
        "nothing moves back by itself"
    );
    run.hold(10);
}

#[test]
fn seed002_block_for_eviction_if_contains_last_replica_evicts_only_last_replicas() {
    // node-4 opens only after the first placement, so that both volumes
    // have a replica on node-1 and the evicted one has somewhere to go.
    let text = four_nodes(
        "block-for-eviction-if-contains-last-replica",
        "",
        r#"
  - {name: one, size: 1Gi, numberOfReplicas: 1, attachedNode: node-4}
  - {name: three, size: 1Gi, numberOfReplicas: 3, attachedNode: node-4}"#,
    )
    .replace(
        "{id: node-4, disks",
        "{id: node-4, allowScheduling: false, disks",
    );
    let mut run = start(&text);
    let r = run.settle();
    run.step("node: {id: node-4, allowScheduling: true}");
    assert_eq!(count_on(&r, "one", "node-1"), 1);
    assert_eq!(count_on(&r, "three", "node-1"), 1);
    let single = replica_on(&run, "one", "node-1").unwrap().name.clone();
    let of_three = replica_on(&run, "three", "node-1").unwrap().name.clone();

    run.step("node: {id: node-1, cordoned: true}");
    let mut saw = false;
    tick_until_quiet(&mut run, |run| {
        assert!(
            rw_count(run, "one") >= 1,
            "the single-replica volume never degrades"
        );
        if let Some(r) = run.sim.replicas().get(&single) {
            assert!(r.spec.eviction_requested);
            assert!(run.sim.node_record("node-1").unwrap().status.auto_evicting);
            saw = true;
        }
        assert!(
            !run.sim.replicas()[&of_three].spec.eviction_requested,
            "the replica with healthy peers elsewhere stays"
        );
    });
    assert!(saw);
    let r = run.sim.settle(0);
    assert_eq!(count_on(&r, "one", "node-1"), 0, "the last replica moved");
    assert_eq!(count_on(&r, "three", "node-1"), 1, "the other did not");
    assert!(!r.nodes["node-1"].drain_blocked, "the drain completes");

    // The drain stops what runs on node-1: the three-replica volume degrades.
    run.step("failReplica: {volume: three, node: node-1}");
    assert_eq!(rw_count(&run, "three"), 2);

    let r = uncordon_node_1(&mut run);
    assert_eq!(
        r.replicas["three"].values().sum::<usize>(),
        3,
        "healthy again (its replica on node-1 reused)"
    );
    assert_eq!(r.reused, 1);
    assert_eq!(
        events(&run, "EvictionAutomatic"),
        [format!("replica/{single}")]
    );
    run.hold(10);
}

#[test]
fn seed002_block_for_eviction_that_cannot_place_blocks_the_drain_until_uncordon() {
    // Three nodes, three replicas, hard node anti-affinity: nowhere to go.
    let text = four_nodes(
        "block-for-eviction",
        ", replica-soft-anti-affinity: \"false\"",
        "[{name: v1, size: 1Gi, numberOfReplicas: 3, attachedNode: node-2}]",
    )
    .replace("  - {id: node-4, disks: [{id: d1, size: 100Gi}]}\n", "");
    let mut run = start(&text);
    run.settle();
    let replica = replica_on(&run, "v1", "node-1").unwrap().name;
    run.step("node: {id: node-1, cordoned: true}");
    let r = run.sim.settle(0);
    assert!(r.settled);
    assert!(r.nodes["node-1"].auto_evicting);
    assert!(r.nodes["node-1"].drain_blocked, "the drain never completes");
    assert!(run.sim.replicas()[&replica].spec.eviction_requested);
    blocked_without_place(&r);
    assert_eq!(count_on(&r, "v1", "node-1"), 1);
    run.hold(10);

    run.step("node: {id: node-1, cordoned: false}");
    let r = run.sim.settle(0);
    assert_eq!(per_node(&r, "v1"), [1, 1, 1], "healthy");
    assert!(!r.nodes["node-1"].auto_evicting);
    assert!(!run.sim.replicas()[&replica].spec.eviction_requested);
    assert_eq!(
        events(&run, "EvictionAutomatic"),
        [format!("replica/{replica}")]
    );
    assert_eq!(
        events(&run, "EvictionCanceled"),
        [format!("replica/{replica}")]
    );
}

fn drain_blocked_after_cordon(policy: &str, stop_replica: bool) -> bool {
    // v1 has its only replica on node-1.
    let mut run = start(&four_nodes(
        policy,
        "",
        "[{name: v1, size: 1Gi, numberOfReplicas: 1, attachedNode: node-1}]",
    ));
    run.settle();
    if stop_replica {
        run.step("failReplica: {volume: v1, node: node-1}");
    }
    run.step("node: {id: node-1, cordoned: true}");
    // One plan is enough to read the drain status.
    run.sim.tick();
    run.sim.node_record("node-1").unwrap().status.drain_blocked
}

#[test]
fn seed002_block_if_contains_last_replica_blocks_the_node_with_the_last_replica() {
    assert!(drain_blocked_after_cordon(
        "block-if-contains-last-replica",
        false
    ));
    assert!(
        !drain_blocked_after_cordon("block-if-contains-last-replica", true),
        "a failed replica is not healthy"
    );
}

#[test]
fn seed002_allow_if_replica_is_stopped_counts_only_running_replicas() {
    assert!(drain_blocked_after_cordon(
        "allow-if-replica-is-stopped",
        false
    ));
    assert!(!drain_blocked_after_cordon(
        "allow-if-replica-is-stopped",
        true
    ));
}

#[test]
fn seed002_always_allow_never_blocks_and_never_evicts() {
    assert!(!drain_blocked_after_cordon("always-allow", false));
    let mut run = start(&four_nodes(
        "always-allow",
        "",
        "[{name: v1, size: 1Gi, numberOfReplicas: 1, attachedNode: node-1}]",
    ));
    run.settle();
    run.step("node: {id: node-1, cordoned: true}");
    let r = run.sim.settle(0);
    assert_eq!(count_on(&r, "v1", "node-1"), 1, "nothing is evicted");
    assert!(!r.nodes["node-1"].auto_evicting);
}

#[test]
fn seed002_a_replica_that_never_held_data_never_blocks_a_drain() {
    // The node is cordoned while a first replica is still being built.
    let mut run = start(
        &four_nodes("block-for-eviction", "", "[]").replace("rebuildTicks: 2", "rebuildTicks: 50"),
    );
    run.settle();
    run.step("addVolume: {name: v1, size: 1Gi, numberOfReplicas: 1, attachedNode: node-1}");
    run.sim.tick();
    let r = run.sim.replicas().into_values().next().unwrap();
    assert_eq!(r.status.mode, None, "made, not yet opened by an engine");
    assert!(r.spec.healthy_at.is_none());
    run.step(&format!("node: {{id: {}, cordoned: true}}", r.spec.node_id));
    run.sim.tick();
    let node = run.sim.node_record(&r.spec.node_id).unwrap();
    assert!(
        !node.status.drain_blocked,
        "an empty replica does not block: {:?}",
        node.status.drain_blocked_reason
    );
}

#[test]
fn manual_node_and_disk_eviction_move_replicas_and_can_be_canceled() {
    let mut run = start(&four_nodes(
        "block-if-contains-last-replica",
        "",
        "[{name: v1, size: 1Gi, numberOfReplicas: 2, attachedNode: node-4}]",
    ));
    let r = run.settle();
    assert_eq!(per_node(&r, "v1"), [1, 1, 0, 0]);
    run.step("node: {id: node-1, evictionRequested: true}");
    let r = run.sim.settle(0);
    assert_eq!(count_on(&r, "v1", "node-1"), 0);
    assert_eq!(r.replicas["v1"].values().sum::<usize>(), 2);
    run.step("disk: {node: node-2, id: d1, evictionRequested: true}");
    let r = run.sim.settle(0);
    assert_eq!(count_on(&r, "v1", "node-2"), 0);
    assert_eq!(r.replicas["v1"].values().sum::<usize>(), 2);
    run.hold(10);
}
