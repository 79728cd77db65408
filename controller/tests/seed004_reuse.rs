//! Seed 004, reuse of failed replicas: every scenario of its test plan
//! (placement and timing here; "only missing layers are copied" is the data
//! plane's, in the scenario suite).

mod common;

use ballast_controller::planner::{ActionKind, Rule};
use common::*;

fn nodes(n: usize, node_extra: &str) -> String {
    (1..=n)
        .map(|i| {
            format!(
                "  - {{id: node-{i}{node_extra}, disks: [{{id: d1, size: 100Gi{node_extra}}}]}}\n"
            )
        })
        .collect()
}

fn scenario(settings: &str, n: usize, volume: &str) -> String {
    format!(
        "settings: {{{settings}}}\nnodes:\n{}volumes: [{volume}]\nsteps:\n  - settle: {{}}\n",
        nodes(n, "")
    )
}

/// When the controller recorded volume `v` degraded.
fn degraded_at(run: &Run) -> i64 {
    let v = run.sim.volume_record("v").unwrap();
    v.status.last_degraded_at.unwrap().timestamp()
}

fn reuse_times(run: &Run) -> Vec<i64> {
    run.sim
        .history
        .iter()
        .filter(|(_, a)| a.rule == Rule::Reuse)
        .map(|(t, _)| t.timestamp())
        .collect()
}

fn new_replicas_after_start(run: &Run) -> Vec<(i64, String)> {
    run.sim
        .history
        .iter()
        .filter(|(_, a)| a.rule == Rule::Replenish)
        .filter_map(|(t, a)| match &a.kind {
            ActionKind::CreateReplica {
                node, reuse: None, ..
            } => Some((t.timestamp(), node.clone())),
            _ => None,
        })
        .collect()
}

/// Alternates settle and `advance` until `done` or `rounds` run out.
fn run_until(run: &mut Run, seconds: u64, rounds: usize, done: impl Fn(&Run) -> bool) {
    for _ in 0..rounds {
        let r = run.sim.settle(0);
        assert!(!r.oscillation);
        if done(run) {
            return;
        }
        run.step(&format!("advance: {{seconds: {seconds}}}"));
    }
}

#[test]
fn seed004_a_node_back_within_the_wait_interval_gets_its_replica_reused() {
    let mut run = start(&scenario(
        "replica-replenishment-wait-interval: 600",
        3,
        "{name: v, size: 1Gi, numberOfReplicas: 3, attachedNode: node-1}",
    ));
    run.settle();
    run.step("node: {id: node-3, ready: false}");
    let r = run.sim.settle(0);
    assert_eq!(r.created, 0, "no new replica while the node may come back");
    assert!(
        r.waits.iter().any(|w| w.contains("may come back")),
        "{:?}",
        r.waits
    );
    run.step("advance: {seconds: 120}");
    run.step("node: {id: node-3, ready: true}");
    let r = run.sim.settle(0);
    assert_eq!(
        (r.reused, r.created),
        (1, 0),
        "the failed replica is reused, nothing new is built"
    );
    assert_eq!(per_node(&r, "v"), [1, 1, 1]);
    let v = run
        .sim
        .replicas()
        .into_values()
        .find(|r| r.spec.node_id == "node-3")
        .unwrap();
    assert_eq!(
        v.spec.rebuild_retry_count, 0,
        "a replica reaching rw resets its retry count"
    );
    run.hold(10);
}

#[test]
fn seed004_a_replica_that_cannot_be_reused_is_replaced_after_the_retry_limit() {
    let mut run = start(&scenario(
        "replica-replenishment-wait-interval: 100000, replica-rebuild-max-retry: 3",
        4,
        "{name: v, size: 1Gi, numberOfReplicas: 3, attachedNode: node-1}",
    ));
    let r = run.settle();
    assert_eq!(per_node(&r, "v"), [1, 1, 1, 0]);
    // Its data is corrupt: every rebuild onto node-3 fails.
    run.step("node: {id: node-3, rebuildsFail: true}");
    run.step("failReplica: {volume: v, node: node-3}");
    run_until(&mut run, 30, 100, |run| {
        !new_replicas_after_start(run).is_empty()
    });
    let tries = reuse_times(&run);
    assert_eq!(tries.len(), 3, "three reuse attempts, the limit: {tries:?}");
    assert!(
        tries[1] - tries[0] >= 60 && tries[2] - tries[1] >= 120,
        "backoff grows: {tries:?}"
    );
    let news = new_replicas_after_start(&run);
    assert_eq!(news.len(), 1);
    assert_eq!(news[0].1, "node-4");
    let r = run.sim.settle(0);
    assert_eq!(r.replicas["v"].values().sum::<usize>(), 3, "healthy again");
}

#[test]
fn seed004_past_the_wait_interval_a_new_replica_is_made() {
    let mut run = start(&scenario(
        "replica-replenishment-wait-interval: 60",
        4,
        "{name: v, size: 1Gi, numberOfReplicas: 3, attachedNode: node-1}",
    ));
    run.settle();
    run.step("node: {id: node-3, ready: false}");
    let r = run.sim.settle(0);
    assert_eq!(r.created, 0);
    run_until(&mut run, 20, 20, |run| {
        !new_replicas_after_start(run).is_empty()
    });
    let news = new_replicas_after_start(&run);
    assert_eq!(news.len(), 1);
    let degraded_at = degraded_at(&run);
    assert!(
        news[0].0 >= degraded_at + 60,
        "not before the interval: {news:?}, degraded at {degraded_at}"
    );
    assert_eq!(news[0].1, "node-4");
    let r = run.sim.settle(0);
    assert_eq!(r.replicas["v"].values().sum::<usize>(), 3);
}

#[test]
fn seed004_an_old_degraded_volume_reuses_its_replica_once_the_node_is_schedulable() {
    let mut run = start(&scenario(
        "replica-replenishment-wait-interval: 100000",
        3,
        "{name: v, size: 1Gi, numberOfReplicas: 3, attachedNode: node-1}",
    ));
    run.settle();
    run.step("node: {id: node-3, allowScheduling: false}");
    run.step("failReplica: {volume: v, node: node-3}");
    let r = run.sim.settle(0);
    assert_eq!((r.created, r.reused), (0, 0), "degraded; nothing to do yet");
    assert_eq!(r.replicas["v"].values().sum::<usize>(), 2);
    run.step("node: {id: node-3, allowScheduling: true}");
    let r = run.sim.settle(0);
    assert_eq!((r.reused, r.created), (1, 0));
    assert_eq!(per_node(&r, "v"), [1, 1, 1]);
}

#[test]
fn seed004_reuse_in_backoff_does_not_stop_a_new_replica_after_the_interval() {
    let mut run = start(&scenario(
        "replica-replenishment-wait-interval: 60",
        4,
        "{name: v, size: 1Gi, numberOfReplicas: 3, attachedNode: node-1}",
    ));
    run.settle();
    run.step("node: {id: node-3, rebuildsFail: true}");
    run.step("failReplica: {volume: v, node: node-3}");
    run_until(&mut run, 10, 30, |run| {
        !new_replicas_after_start(run).is_empty()
    });
    let tries = reuse_times(&run);
    assert!(tries.len() >= 2, "reuse was retried: {tries:?}");
    assert!(
        tries.windows(2).all(|w| w[1] - w[0] >= 60),
        "with a backoff: {tries:?}"
    );
    let news = new_replicas_after_start(&run);
    let degraded_at = degraded_at(&run);
    assert!(
        news[0].0 >= degraded_at + 60 && news[0].0 < degraded_at + 60 + 30,
        "{news:?}"
    );
    let r = run.sim.settle(0);
    assert_eq!(r.replicas["v"].values().sum::<usize>(), 3);
}

#[test]
fn seed004_reuse_when_the_replica_data_is_messed_up() {
    let mut run = start(&scenario(
        "replica-replenishment-wait-interval: 100000, replica-soft-anti-affinity: \"false\"",
        3,
        "{name: v, size: 1Gi, numberOfReplicas: 3, attachedNode: node-1}",
    ));
    run.settle();
    run.step("node: {id: node-2, allowScheduling: false}");
    run.step("failReplica: {volume: v, node: node-2}");
    let r = run.sim.settle(0);
    assert_eq!(r.created, 0, "no new replica while waiting");
    run.step("setting: {name: replica-replenishment-wait-interval, value: 1}");
    run.step("advance: {seconds: 5}");
    let r = run.sim.settle(0);
    assert_eq!(r.created, 0, "a new replica is wanted but cannot be placed");
    blocked_without_place(&r);
    run.step("setting: {name: replica-replenishment-wait-interval, value: 100000}");
    let r = run.sim.settle(0);
    assert_eq!(r.created, 0);
    run.step("node: {id: node-2, allowScheduling: true}");
    let r = run.sim.settle(0);
    assert_eq!(
        (r.reused, r.created),
        (1, 0),
        "the failed replica is reused"
    );
    assert_eq!(per_node(&r, "v"), [1, 1, 1]);
}

#[test]
fn seed004_reuse_checks_scheduling_rules_first() {
    let mut run = start(&format!(
        "settings: {{replica-replenishment-wait-interval: 100000, replica-soft-anti-affinity: \"false\"}}\nnodes:\n{}volumes: [{{name: v, size: 1Gi, numberOfReplicas: 3, attachedNode: node-3, nodeSelector: [fast], diskSelector: [ssd]}}]\nsteps:\n  - settle: {{}}\n",
        (1..=3)
            .map(|i| format!("  - {{id: node-{i}, tags: [fast], disks: [{{id: d1, size: 100Gi, tags: [ssd]}}]}}\n"))
            .collect::<String>()
    ));
    let r = run.settle();
    assert_eq!(per_node(&r, "v"), [1, 1, 1]);
    run.step("node: {id: node-1, allowScheduling: false}");
    run.step("node: {id: node-2, allowScheduling: false}");
    run.step("failReplica: {volume: v, node: node-1}");
    run.step("failReplica: {volume: v, node: node-2}");
    let r = run.sim.settle(0);
    assert_eq!((r.created, r.reused), (0, 0));
    run.step("node: {id: node-1, tags: []}");
    run.step("disk: {node: node-1, id: d1, tags: []}");
    run.step("node: {id: node-1, allowScheduling: true}");
    run.step("node: {id: node-2, allowScheduling: true}");
    let r = run.sim.settle(0);
    assert_eq!(
        (r.reused, r.created),
        (1, 0),
        "only node-2's replica matches the selectors"
    );
    assert_eq!(per_node(&r, "v"), [0, 1, 1]);
    run.step("node: {id: node-1, tags: [fast]}");
    run.step("disk: {node: node-1, id: d1, tags: [ssd]}");
    let r = run.sim.settle(0);
    assert_eq!(
        (r.reused, r.created),
        (1, 0),
        "node-1's replica is reused once it matches again"
    );
    assert_eq!(per_node(&r, "v"), [1, 1, 1]);
}

#[test]
fn a_stale_failed_replica_is_deleted_but_never_the_last_copy() {
    let mut run = start(&scenario(
        "replica-replenishment-wait-interval: 0",
        4,
        "{name: v, size: 1Gi, numberOfReplicas: 2, attachedNode: node-1, staleReplicaTimeout: 1}",
    ));
    run.settle();
    run.step("node: {id: node-2, ready: false}");
    let r = run.sim.settle(0);
    assert_eq!(
        r.replicas["v"].values().sum::<usize>(),
        2,
        "rebuilt elsewhere at once"
    );
    assert_eq!(
        run.sim.replicas().len(),
        3,
        "the failed replica is kept for a while"
    );
    run.step("advance: {seconds: 61}");
    run.sim.settle(0);
    assert_eq!(run.sim.replicas().len(), 2, "stale after a minute: deleted");

    // A single-replica volume whose only replica failed keeps it.
    let mut run = start(&scenario(
        "",
        2,
        "{name: w, size: 1Gi, numberOfReplicas: 1, attachedNode: node-1, staleReplicaTimeout: 1}",
    ));
    run.settle();
    run.step("failReplica: {volume: w, node: node-1}");
    run.step("advance: {seconds: 600}");
    let r = run.sim.settle(0);
    assert_eq!(
        run.sim.replicas().len(),
        1,
        "the last copy of data is never deleted"
    );
    assert!(
        r.blocked.iter().any(|b| b.contains("no healthy replica")),
        "{:?}",
        r.blocked
    );
}
