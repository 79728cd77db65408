//! The simulator and the controller share one path: the simulator keeps
//! its model as the controller's records in a store, plans on the view the
//! controller builds of them, and has every action carried out by the
//! executor, whose calls to nodes its model agents answer. Shown here on
//! the seed example and on the cluster of the old non-converging case: at
//! every tick the controller's view of the simulator's store is the view
//! the simulator plans on, and what the simulator counts as made, reused
//! and deleted is what the executor recorded as events.

use ballast::model::Event;
use ballast_controller::observe::cluster_view;
use ballast_controller::sim::{Scenario, Sim, Step};

fn count(events: &[Event], reason: &str) -> u32 {
    events.iter().filter(|e| e.reason == reason).count() as u32
}

fn same_path_through(yaml: &str) {
    let scenario = Scenario::parse(yaml).unwrap();
    let mut sim = Sim::new(&scenario).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let (mut created, mut deleted) = (0, 0);
    // A scenario with no settle of its own settles at its end.
    let mut steps = scenario.steps.clone();
    if !steps.iter().any(|s| matches!(s, Step::Settle(_))) {
        steps.push(Step::Settle(Default::default()));
    }
    for (i, step) in steps.iter().enumerate() {
        if !matches!(step, Step::Settle(_)) {
            sim.apply_step(step).unwrap();
            continue;
        }
        for tick in 0..200 {
            let store = sim.context().store.clone();
            let view = rt.block_on(cluster_view(store.as_ref())).unwrap();
            assert_eq!(view, sim.view(), "step {i}, tick {tick}: the views differ");
            let pending = sim.pending();
            if !sim.tick().changes().any(|_| true) && !pending {
                break;
            }
        }
        // The settle reports what the ticks above carried out too.
        let report = sim.settle(i + 1);
        assert!(report.settled, "step {i}: {report:?}");
        let c = *sim.counters.lock().unwrap();
        assert_eq!(c, Default::default(), "the settle took the counts");
        created += report.created;
        deleted += report.deleted;
    }
    // The model counts what the executor's actions carried out; the
    // executor itself recorded each (its own events, written nowhere else).
    let events = sim.events();
    assert!(created > 0, "the scenario makes replicas");
    assert_eq!(count(&events, "ReplicaCreated"), created);
    assert_eq!(count(&events, "ReplicaDeleted"), deleted);
}

#[test]
fn the_seed_example_runs_on_the_controllers_view_and_executor() {
    same_path_through(include_str!(
        "../../examples/sim/seed000-node-best-effort.yaml"
    ));
}

#[test]
fn a_large_cluster_with_evictions_runs_on_the_controllers_view_and_executor() {
    let yaml = format!(
        "{}steps:\n  - settle: {{}}\n  - node: {{id: node-07, evictionRequested: true}}\n  - node: {{id: node-09, evictionRequested: true}}\n  - settle: {{}}\n",
        include_str!("cases/016a2156.yaml")
    );
    same_path_through(&yaml);
}
