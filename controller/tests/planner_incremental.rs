//! Incremental planning gives the full plan: on random clusters (`random`),
//! through every tick of their settling and every random change after it
//! (cordons, failures, disk fills, eviction requests), a plan made with
//! the memo of the passes before equals a full pass on the same view.

mod random;

use ballast_controller::planner::{self, Memo};
use ballast_controller::sim::{MAX_SETTLE_TICKS, Scenario, Sim};
use proptest::prelude::*;
use random::{Cluster, cluster};

/// Settles `sim`, comparing the incremental and the full plan on every
/// tick. Returns how many volume plans the memo let the passes skip.
fn settle_compared(sim: &mut Sim, memo: &mut Memo) -> Result<usize, TestCaseError> {
    let settings = sim.settings();
    let mut skipped = 0;
    for _ in 0..MAX_SETTLE_TICKS {
        sim.observe();
        let view = sim.view();
        skipped += memo.settled();
        let incremental = planner::plan_incremental(&view, &settings, sim.now(), memo);
        let full = planner::plan(&view, &settings, sim.now());
        prop_assert_eq!(&incremental, &full, "incremental and full plans differ");
        let pending = sim.pending();
        let applied = sim.tick();
        if applied.changes().next().is_none() && !pending {
            return Ok(skipped);
        }
    }
    Ok(skipped)
}

fn check_incremental(c: &Cluster) -> Result<(), TestCaseError> {
    let scenario = Scenario::parse(&c.yaml).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut sim = Sim::new(&scenario).map_err(TestCaseError::fail)?;
    let mut memo = Memo::default();
    settle_compared(&mut sim, &mut memo)?;
    for p in &c.perturbations {
        let s = Scenario::parse(&format!("nodes: []\nsteps:\n  - {p}\n"))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        sim.apply_step(&s.steps[0]).map_err(TestCaseError::fail)?;
        settle_compared(&mut sim, &mut memo)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(random::config())]

    #[test]
    fn incremental_plans_equal_full_plans_on_random_clusters_and_changes(c in cluster()) {
        check_incremental(&c)?;
    }
}

/// The memo does skip: once a healthy cluster is settled, a pass plans no
/// volume again, and one changed volume is planned again on its own.
#[test]
fn a_settled_cluster_skips_every_volume_but_the_changed_one() {
    let yaml = "settings: {replica-auto-balance: best-effort}\nnodes:\n  - {id: n1, zone: a, disks: [{id: d1, size: 1099511627776}]}\n  - {id: n2, zone: b, disks: [{id: d1, size: 1099511627776}]}\n  - {id: n3, zone: c, disks: [{id: d1, size: 1099511627776}]}\nvolumes:\n  - {name: v1, size: 1073741824, numberOfReplicas: 2}\n  - {name: v2, size: 1073741824, numberOfReplicas: 2}\n  - {name: v3, size: 1073741824, numberOfReplicas: 2}\n";
    let scenario = Scenario::parse(yaml).unwrap();
    let mut sim = Sim::new(&scenario).unwrap();
    assert!(sim.settle(0).settled);
    sim.observe();
    let (view, settings) = (sim.view(), sim.settings());
    let mut memo = Memo::default();
    let first = planner::plan_incremental(&view, &settings, sim.now(), &mut memo);
    assert!(first.is_empty(), "{first:?}");
    assert_eq!(memo.settled(), 3, "every settled volume is remembered");

    // One replica of v2 fails: v2 is planned again (and replaced), the
    // others stay skipped, and the plan is the full one.
    let mut changed = view.clone();
    let r = changed
        .replicas
        .iter_mut()
        .find(|r| r.volume == "v2")
        .unwrap();
    r.mode = Some(ballast::model::ReplicaMode::Err);
    r.failed_at = Some(sim.now());
    let incremental = planner::plan_incremental(&changed, &settings, sim.now(), &mut memo);
    assert_eq!(incremental, planner::plan(&changed, &settings, sim.now()));
    assert!(
        !incremental.is_empty(),
        "v2 lost a replica: {incremental:?}"
    );
    assert_eq!(memo.settled(), 2, "v1 and v3 stay settled; v2 is not");
}
