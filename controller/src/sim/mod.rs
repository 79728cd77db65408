//! The simulator: runs the planner against a model cluster, tick by tick.
//!
//! The model is kept as the controller's own records, in a store: the view
//! is built from them by `observe::cluster_view`, and every action is
//! carried out by the executor (`executor::carry_out`), so that a scenario
//! runs the controller's code paths (test `one_path`). Where the executor
//! calls a node, the model's agents answer (`agents`): a fill takes
//! `rebuildTicks` ticks.
//!
//! A tick plans on the model's view, starts every action as the control
//! loop does, and advances fills (a new or reused replica turns rw after
//! `rebuildTicks` ticks) and the clock (one second). `settle` ticks until nothing is pending and
//! detects oscillation: the same placement reached twice while actions are
//! still issued. Used by `ballast sim`, by the seed tests and by the
//! property tests. A model only: no I/O.

mod agents;
mod cluster;
pub mod scenario;

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

pub use agents::ModelAgents;
pub use cluster::{Counters, Sim};
pub use scenario::{Scenario, ScenarioError, Step};

/// The most ticks one settle takes before it gives up.
pub const MAX_SETTLE_TICKS: u32 = 1000;

/// What one settle printed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    /// 1-based index of the settle step in the scenario.
    pub step: usize,
    pub ticks: u32,
    /// volume -> node -> healthy replicas (every node listed).
    pub replicas: BTreeMap<String, BTreeMap<String, usize>>,
    /// volume -> zone -> healthy replicas (every zone listed).
    pub zones: BTreeMap<String, BTreeMap<String, usize>>,
    /// volume -> "node/disk" -> healthy replicas (disks holding some).
    pub disks: BTreeMap<String, BTreeMap<String, usize>>,
    pub created: u32,
    pub deleted: u32,
    pub reused: u32,
    pub oscillation: bool,
    /// Whether the settle ended with nothing pending (false: gave up).
    pub settled: bool,
    pub blocked: Vec<String>,
    pub waits: Vec<String>,
    pub nodes: BTreeMap<String, NodeReport>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    pub auto_evicting: bool,
    pub drain_blocked: bool,
}

impl Sim {
    /// Ticks until nothing is pending, at most [`MAX_SETTLE_TICKS`].
    pub fn settle(&mut self, step: usize) -> Report {
        let mut seen: BTreeSet<String> = BTreeSet::new();
        let mut ticks = 0;
        let mut oscillation = false;
        let mut settled = false;
        let mut last = None;
        while ticks < MAX_SETTLE_TICKS {
            // Settled: a plan made with no rebuild in flight changes nothing.
            let pending = self.pending();
            let plan = self.tick();
            ticks += 1;
            let changed = plan.changes().next().is_some();
            last = Some(plan);
            if !changed && !pending {
                settled = true;
                break;
            }
            if changed && !seen.insert(self.fingerprint()) {
                oscillation = true;
                break;
            }
        }
        let plan = last.unwrap_or_default();
        let counters =
            std::mem::take(&mut *self.counters.lock().unwrap_or_else(|p| p.into_inner()));
        Report {
            step,
            ticks,
            replicas: self.healthy_per_node(),
            zones: self.healthy_per_zone(),
            disks: self.healthy_per_disk(),
            created: counters.created,
            deleted: counters.deleted,
            reused: counters.reused,
            oscillation,
            settled,
            blocked: plan
                .blocked
                .iter()
                .map(|b| format!("{}: {}", b.object, b.reason))
                .collect(),
            waits: plan
                .waits
                .iter()
                .map(|w| format!("volume/{}: {} (until {})", w.volume, w.what, w.until))
                .collect(),
            nodes: self
                .nodes
                .iter()
                .map(|n| {
                    let status = self
                        .node_record(&n.id)
                        .map(|r| r.status)
                        .unwrap_or_default();
                    (
                        n.id.clone(),
                        NodeReport {
                            auto_evicting: status.auto_evicting,
                            drain_blocked: status.drain_blocked,
                        },
                    )
                })
                .collect(),
        }
    }

    /// Runs every step; returns one report per settle.
    pub fn run(&mut self, steps: &[Step]) -> Result<Vec<Report>, String> {
        let mut out = Vec::new();
        for (i, step) in steps.iter().enumerate() {
            match step {
                Step::Settle(_) => out.push(self.settle(i + 1)),
                other => self
                    .apply_step(other)
                    .map_err(|e| format!("step {}: {e}", i + 1))?,
            }
        }
        Ok(out)
    }
}

/// Runs a scenario text; the JSON lines it prints, or an error (exit 2).
pub fn run_text(text: &str) -> Result<Vec<Report>, String> {
    let scenario = Scenario::parse(text).map_err(|e| e.to_string())?;
    let mut sim = Sim::new(&scenario)?;
    sim.run(&scenario.steps)
}
