//! Seed 000, automatic replica rebalance: every scenario of its test plan.
//! The data half (write, move, verify) runs on real processes in the
//! scenario suite; these check placement, the minimum of moves, and that
//! nothing moves once settled.

mod common;

use common::*;

const THREE_NODES_TWO_DISABLED: &str = r#"
  - {id: node-1, disks: [{id: d1, size: 100Gi}]}
  - {id: node-2, allowScheduling: false, disks: [{id: d1, size: 100Gi}]}
  - {id: node-3, allowScheduling: false, disks: [{id: d1, size: 100Gi}]}
"#;

/// The seed's steps: settle, let node-2 take replicas, settle, then
/// node-3, settle.
const SCHEDULING_ON_ONE_BY_ONE: &str = "steps:
  - settle: {}
  - node: {id: node-2, allowScheduling: true}
  - settle: {}
  - node: {id: node-3, allowScheduling: true}
  - settle: {}
";

fn node_scenario(mode: &str) -> String {
    format!(
        r#"
settings: {{replica-soft-anti-affinity: "true", replica-auto-balance: {mode}}}
nodes: {THREE_NODES_TWO_DISABLED}
volumes:
  - {{name: v1, size: 1Gi, numberOfReplicas: 6, attachedNode: node-1}}
{SCHEDULING_ON_ONE_BY_ONE}"#
    )
}

#[test]
fn seed000_node_least_effort_six_replicas() {
    let mut run = start(&node_scenario("least-effort"));
    assert_eq!(per_node(&run.settle(), "v1"), [6, 0, 0]);

    let r = run.settle();
    let c = per_node(&r, "v1");
    assert_ne!(c[0], c[1], "node-1 and node-2 differ");
    assert_ne!(c[1], 0, "node-2 got a replica");
    assert_eq!(c[2], 0);
    assert_eq!(c.iter().sum::<usize>(), 6);
    assert_eq!(
        (r.created, r.deleted),
        (1, 1),
        "least effort moves one replica"
    );

    let r = run.settle();
    let c = per_node(&r, "v1");
    assert_ne!(c[0], c[2]);
    assert_ne!(c[1], 0);
    assert_ne!(c[2], 0);
    assert_eq!(c.iter().sum::<usize>(), 6);
    assert_eq!((r.created, r.deleted), (1, 1));
}

#[test]
fn seed000_node_best_effort_six_replicas() {
    let mut run = start(&node_scenario("best-effort"));
    assert_eq!(per_node(&run.settle(), "v1"), [6, 0, 0]);
    let r = run.settle();
    assert_eq!(per_node(&r, "v1"), [3, 3, 0]);
    assert_eq!((r.created, r.deleted), (3, 3), "the minimum of moves");
    let r = run.settle();
    assert_eq!(per_node(&r, "v1"), [2, 2, 2]);
    assert_eq!((r.created, r.deleted), (2, 2), "the minimum of moves");
}

#[test]
fn seed000_global_disabled_volume_spec_least_effort_balances_only_that_volume() {
    let mut run = start(&format!(
        r#"
settings: {{replica-soft-anti-affinity: "true", replica-auto-balance: disabled}}
nodes: {THREE_NODES_TWO_DISABLED}
volumes:
  - {{name: volume-1, size: 1Gi, numberOfReplicas: 3, attachedNode: node-1}}
  - {{name: volume-2, size: 1Gi, numberOfReplicas: 3, attachedNode: node-1, replicaAutoBalance: least-effort}}
steps:
  - settle: {{}}
  - node: {{id: node-2, allowScheduling: true}}
  - node: {{id: node-3, allowScheduling: true}}
  - settle: {{}}
"#
    ));
    let r = run.settle();
    assert_eq!(per_node(&r, "volume-1"), [3, 0, 0]);
    assert_eq!(per_node(&r, "volume-2"), [3, 0, 0]);
    let r = run.settle();
    assert_eq!(
        per_node(&r, "volume-1"),
        [3, 0, 0],
        "volume-1 follows the disabled setting"
    );
    assert_eq!(
        per_node(&r, "volume-2"),
        [1, 1, 1],
        "volume-2 is balanced by its own spec"
    );
}

fn zone_scenario(mode: &str) -> String {
    format!(
        r#"
settings: {{replica-soft-anti-affinity: "true", replica-zone-soft-anti-affinity: "true"}}
nodes:
  - {{id: node-1, zone: zone-1, disks: [{{id: d1, size: 100Gi}}]}}
  - {{id: node-2, zone: zone-2, allowScheduling: false, disks: [{{id: d1, size: 100Gi}}]}}
  - {{id: node-3, zone: zone-3, allowScheduling: false, disks: [{{id: d1, size: 100Gi}}]}}
volumes:
  - {{name: v1, size: 1Gi, numberOfReplicas: 6, attachedNode: node-1, replicaAutoBalance: {mode}}}
{SCHEDULING_ON_ONE_BY_ONE}"#
    )
}

#[test]
fn seed000_zone_least_effort() {
    let mut run = start(&zone_scenario("least-effort"));
    assert_eq!(per_zone(&run.settle(), "v1"), [6, 0, 0]);
    let z = per_zone(&run.settle(), "v1");
    assert_ne!(z[0], z[1]);
    assert_ne!(z[1], 0);
    assert_eq!(z[2], 0);
    let z = per_zone(&run.settle(), "v1");
    assert_ne!(z[0], z[2]);
    assert_ne!(z[1], 0);
    assert_ne!(z[2], 0);
    assert_eq!(z.iter().sum::<usize>(), 6);
}

#[test]
fn seed000_zone_best_effort() {
    let mut run = start(&zone_scenario("best-effort"));
    assert_eq!(per_zone(&run.settle(), "v1"), [6, 0, 0]);
    let r = run.settle();
    assert_eq!(per_zone(&r, "v1"), [3, 3, 0]);
    assert_eq!((r.created, r.deleted), (3, 3));
    let r = run.settle();
    assert_eq!(per_zone(&r, "v1"), [2, 2, 2]);
    assert_eq!((r.created, r.deleted), (2, 2));
}

#[test]
fn seed000_node_duplicates_in_multiple_zones() {
    let mut run = start(
        r#"
settings: {replica-soft-anti-affinity: "true", replica-zone-soft-anti-affinity: "true"}
nodes:
  - {id: node-1, zone: zone-1, disks: [{id: d1, size: 100Gi}]}
  - {id: node-2, zone: zone-2, disks: [{id: d1, size: 100Gi}]}
  - {id: node-3, zone: zone-3, allowScheduling: false, disks: [{id: d1, size: 100Gi}]}
volumes:
  - {name: v1, size: 1Gi, numberOfReplicas: 3, attachedNode: node-1, replicaAutoBalance: least-effort}
steps:
  - settle: {}
  - settle: {}
"#,
    );
    let r = run.settle();
    let z = &r.zones["v1"];
    assert_eq!(z["zone-1"] + z["zone-2"], 3);
    let dup_zone = if z["zone-1"] == 2 { "zone-1" } else { "zone-2" };
    // node-3 joins the zone holding the duplicates, then becomes schedulable.
    run.step(&format!(
        "node: {{id: node-3, zone: {dup_zone}, allowScheduling: true}}"
    ));
    let r = run.settle();
    assert_eq!(per_node(&r, "v1"), [1, 1, 1]);
    let z = &r.zones["v1"];
    assert_eq!(
        z["zone-1"] + z["zone-2"],
        3,
        "all three replicas in zone-1 and zone-2"
    );
}
