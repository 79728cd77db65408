//! The simulator and the controller share one path: the planner's view is
//! built from records by the same function, and an action changes the
//! records through the same functions. Shown here on the seed example and
//! the cluster of the old non-converging case: at every tick of a settle,
//! the controller's view of a store holding the simulator's records is the
//! simulator's view, it plans the same, and the record-only actions carried
//! out by the executor leave the store as the simulator leaves its model.

use std::sync::Arc;

use ballast::model::{Node, Replica, Volume};
use ballast::store::{MemoryStore, Store};
use ballast_controller::agents::GrpcAgents;
use ballast_controller::context::Context;
use ballast_controller::executor::carry_out;
use ballast_controller::observe::cluster_view;
use ballast_controller::planner::{self, ActionKind};
use ballast_controller::sim::{Scenario, Sim, Step};

async fn store_of(sim: &Sim) -> Arc<dyn Store> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let (nodes, volumes, replicas) = sim.records();
    for n in &nodes {
        store.create(n).await.unwrap();
    }
    for v in &volumes {
        store.create(v).await.unwrap();
    }
    for r in &replicas {
        store.create(r).await.unwrap();
    }
    store
}

/// Records without their store versions, to compare with the model's.
async fn unversioned(store: &dyn Store) -> (Vec<Node>, Vec<Volume>, Vec<Replica>) {
    let mut nodes: Vec<Node> = store.list().await.unwrap();
    let mut volumes: Vec<Volume> = store.list().await.unwrap();
    let mut replicas: Vec<Replica> = store.list().await.unwrap();
    nodes.iter_mut().for_each(|n| n.resource_version = 0);
    volumes.iter_mut().for_each(|v| v.resource_version = 0);
    replicas.iter_mut().for_each(|r| r.resource_version = 0);
    (nodes, volumes, replicas)
}

fn same_path_through(yaml: &str) {
    let scenario = Scenario::parse(yaml).unwrap();
    let mut sim = Sim::new(&scenario).unwrap();
    for step in scenario
        .steps
        .iter()
        .filter(|s| !matches!(s, Step::Settle(_)))
    {
        sim.apply_step(step).unwrap();
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut record_only = 0;
    for tick in 0..60 {
        sim.observe();
        let store = rt.block_on(store_of(&sim));
        let view = rt.block_on(cluster_view(store.as_ref())).unwrap();
        assert_eq!(view, sim.view(), "tick {tick}: the views differ");
        let plan = planner::plan(&view, &sim.settings(), sim.now);
        // The executor carries out the actions that touch records only,
        // on the store; the simulator's tick plans on its own view and
        // applies the whole plan to its model.
        let ctx = Context::model(store.clone(), Arc::new(GrpcAgents), sim.now);
        for a in &plan.actions {
            if matches!(
                a.kind,
                ActionKind::SetReplicaEviction { .. } | ActionKind::SetNodeStatus { .. }
            ) {
                rt.block_on(carry_out(&ctx, a)).unwrap();
                record_only += 1;
            }
        }
        let pending = sim.pending();
        assert_eq!(sim.tick(), plan, "tick {tick}: the plans differ");
        let (nodes, _, replicas) = sim.records();
        let (stored_nodes, _, stored_replicas) = rt.block_on(unversioned(store.as_ref()));
        for n in &stored_nodes {
            let model = nodes.iter().find(|m| m.id == n.id).unwrap();
            // What SetNodeStatus sets (the disks' figures are the model
            // node's next heartbeat).
            let drain = |s: &ballast::model::NodeStatus| {
                (
                    s.auto_evicting,
                    s.drain_blocked,
                    s.drain_blocked_reason.clone(),
                )
            };
            assert_eq!(
                drain(&n.status),
                drain(&model.status),
                "tick {tick}: node {}",
                n.id
            );
        }
        for r in &stored_replicas {
            if let Some(model) = replicas.iter().find(|m| m.name == r.name) {
                assert_eq!(
                    r.spec.eviction_requested, model.spec.eviction_requested,
                    "tick {tick}: replica {}",
                    r.name
                );
            }
        }
        if !pending && plan.changes().next().is_none() {
            break;
        }
    }
    eprintln!("{record_only} record-only actions carried out by the executor");
}

#[test]
fn the_seed_example_runs_on_the_controllers_view_and_actions() {
    same_path_through(include_str!(
        "../../examples/sim/seed000-node-best-effort.yaml"
    ));
}

#[test]
fn a_large_cluster_with_evictions_runs_on_the_controllers_view_and_actions() {
    same_path_through(include_str!("cases/016a2156.yaml"));
}
