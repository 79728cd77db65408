//! Helpers for the seed tests: run a scenario in the simulator, read the
//! counts, and check that a settled cluster stays put.
#![allow(dead_code)]

use ballast_controller::planner::{ActionKind, Plan};
use ballast_controller::sim::{Report, Scenario, Sim};

pub struct Run {
    pub sim: Sim,
    pub scenario: Scenario,
    next: usize,
}

pub fn start(yaml: &str) -> Run {
    let scenario = Scenario::parse(yaml).unwrap_or_else(|e| panic!("bad scenario: {e}"));
    let sim = Sim::new(&scenario).unwrap();
    Run {
        sim,
        scenario,
        next: 0,
    }
}

impl Run {
    /// Applies the scenario's steps up to and including the next settle;
    /// checks it settled without oscillation and that ten more seconds of
    /// ticks change nothing; returns its report.
    pub fn settle(&mut self) -> Report {
        while self.next < self.scenario.steps.len() {
            let step = self.scenario.steps[self.next].clone();
            self.next += 1;
            if matches!(step, ballast_controller::sim::Step::Settle(_)) {
                let r = self.sim.settle(self.next);
                assert!(!r.oscillation, "oscillation at step {}: {r:?}", self.next);
                assert!(r.settled, "did not settle at step {}: {r:?}", self.next);
                self.hold(10);
                return r;
            }
            self.sim.apply_step(&step).unwrap();
        }
        panic!("no more settle steps");
    }

    /// Applies steps up to (not including) the next settle; false when none is left.
    pub fn next_is_settle_pending(&mut self) -> bool {
        while self.next < self.scenario.steps.len() {
            let step = self.scenario.steps[self.next].clone();
            self.next += 1;
            if matches!(step, ballast_controller::sim::Step::Settle(_)) {
                return false;
            }
            self.sim.apply_step(&step).unwrap();
        }
        false
    }

    /// `ticks` more ticks issue no placement change.
    pub fn hold(&mut self, ticks: u32) {
        for _ in 0..ticks {
            let plan = self.sim.tick();
            let changes: Vec<_> = plan.changes().collect();
            assert!(changes.is_empty(), "a settled cluster changed: {changes:?}");
        }
    }

    /// Applies one extra step (not from the scenario).
    pub fn step(&mut self, yaml_step: &str) {
        let text = format!("nodes: []\nsteps:\n  - {yaml_step}\n");
        let s = Scenario::parse(&text).unwrap();
        self.sim.apply_step(&s.steps[0]).unwrap();
    }
}

/// Healthy replicas of `volume` per node, in node order.
pub fn per_node(r: &Report, volume: &str) -> Vec<usize> {
    r.replicas[volume].values().copied().collect()
}

pub fn per_zone(r: &Report, volume: &str) -> Vec<usize> {
    r.zones[volume].values().copied().collect()
}

pub fn count_on(r: &Report, volume: &str, node: &str) -> usize {
    r.replicas[volume][node]
}

/// The create actions of a plan: (rule, node, disk, copy_from).
pub fn creates(plan: &Plan) -> Vec<(String, String, String, Option<String>)> {
    plan.actions
        .iter()
        .filter_map(|a| match &a.kind {
            ActionKind::CreateReplica {
                node,
                disk,
                copy_from,
                ..
            } => Some((
                format!("{:?}", a.rule),
                node.clone(),
                disk.clone(),
                copy_from.clone(),
            )),
            _ => None,
        })
        .collect()
}

/// The settle's report says a replica is wanted that has no place.
pub fn blocked_without_place(r: &Report) {
    assert!(
        r.blocked
            .iter()
            .any(|b| b.contains("no place for a replica")),
        "{:?}",
        r.blocked
    );
}
