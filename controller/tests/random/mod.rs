//! Random clusters for the planner, and the checks made on every plan:
//! shared by the property test (`planner_properties`) and the bounded
//! search (`cargo run --release -p ballast-controller --example
//! planner-search`). Clusters have 1-30 nodes, 1-5 zones, 1-4 disks per
//! node, 1-50 volumes, random settings, and random cordons, failures, disk
//! fills and eviction requests between settles. Checked on every plan: the
//! last healthy replica is never deleted, no placement breaks the capacity
//! rules, planning twice gives the same plan; and every settle converges
//! within the bound without oscillating.
#![allow(dead_code)]

use std::collections::BTreeMap;

use ballast_controller::planner::{self, ActionKind, ClusterView, Plan};
use ballast_controller::sim::{MAX_SETTLE_TICKS, Scenario, Sim};
use proptest::prelude::*;

#[derive(Clone, Debug)]
pub struct Cluster {
    pub yaml: String,
    pub perturbations: Vec<String>,
}

const GI: u64 = 1 << 30;

/// The property tests' configuration: 64 cases in CI; PROPTEST_CASES=5000
/// explores further.
pub fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(64),
        ..ProptestConfig::default()
    }
}

pub fn cluster() -> impl Strategy<Value = Cluster> {
    (
        1usize..=30,
        1usize..=5,
        prop::collection::vec((1usize..=4, 50u64..=400, 0u64..=60), 30),
        prop::collection::vec((1u64..=20, 1u32..=4, 0usize..40, 0usize..3, 0usize..4, any::<bool>()), 1..=50),
        (any::<bool>(), any::<bool>(), any::<bool>(), 0usize..3, 0usize..5, 50u32..=95, 0u32..=40, 100u32..=300),
        prop::collection::vec((0usize..6, 0usize..40, 0u64..=90), 0..6),
    )
        .prop_map(|(n_nodes, n_zones, disks, vols, settings, perturb)| {
            let (soft_node, soft_zone, soft_disk, balance, policy, pressure, min_avail, overprov) = settings;
            let balance = ["disabled", "least-effort", "best-effort"][balance];
            let policy = [
                "block-if-contains-last-replica",
                "allow-if-replica-is-stopped",
                "always-allow",
                "block-for-eviction",
                "block-for-eviction-if-contains-last-replica",
            ][policy];
            let mut y = format!(
                "settings: {{replica-soft-anti-affinity: \"{soft_node}\", replica-zone-soft-anti-affinity: \"{soft_zone}\", replica-disk-soft-anti-affinity: \"{soft_disk}\", replica-auto-balance: {balance}, node-drain-policy: {policy}, replica-auto-balance-disk-pressure-percentage: {pressure}, storage-minimal-available-percentage: {min_avail}, storage-over-provisioning-percentage: {overprov}, replica-replenishment-wait-interval: 30}}\nrebuildTicks: 2\nnodes:\n"
            );
            for (i, (n_disks, size, used_pct)) in disks.iter().take(n_nodes).enumerate() {
                let ds: Vec<String> = (1..=*n_disks)
                    .map(|d| format!("{{id: d{d}, size: {}, used: {}}}", size * GI, size * GI * used_pct / 100))
                    .collect();
                y += &format!("  - {{id: node-{:02}, zone: zone-{}, disks: [{}]}}\n", i + 1, i % n_zones + 1, ds.join(", "));
            }
            y += "volumes:\n";
            for (i, (size, replicas, attach, locality, auto, _)) in vols.iter().enumerate() {
                let attach = if *attach < n_nodes { format!(", attachedNode: node-{:02}", attach + 1) } else { String::new() };
                let locality = ["disabled", "best-effort", "disabled"][*locality];
                let auto = ["ignored", "disabled", "least-effort", "best-effort"][*auto];
                y += &format!(
                    "  - {{name: vol-{i:02}, size: {}, numberOfReplicas: {replicas}, dataLocality: {locality}, replicaAutoBalance: {auto}{attach}}}\n",
                    size * GI
                );
            }
            let perturbations = perturb
                .iter()
                .map(|(kind, target, amount)| {
                    let node = format!("node-{:02}", target % n_nodes + 1);
                    match kind {
                        0 => format!("node: {{id: {node}, cordoned: true}}"),
                        1 => format!("node: {{id: {node}, ready: false}}"),
                        2 => format!("node: {{id: {node}, ready: true}}"),
                        3 => format!("disk: {{node: {node}, id: d1, used: {}}}", amount * GI / 2),
                        4 => format!("node: {{id: {node}, evictionRequested: true}}"),
                        _ => format!("node: {{id: {node}, cordoned: false}}"),
                    }
                })
                .collect();
            Cluster { yaml: y, perturbations }
        })
}

/// The capacity rules, checked independently of the planner's code.
fn check_capacity(
    view: &ClusterView,
    plan: &Plan,
    settings: &ballast::settings::Settings,
) -> Result<(), String> {
    let size_of: BTreeMap<&str, u64> = view
        .volumes
        .iter()
        .map(|v| (v.name.as_str(), v.size))
        .collect();
    let mut scheduled: BTreeMap<(String, String), u64> = BTreeMap::new();
    for r in &view.replicas {
        *scheduled
            .entry((r.node.clone(), r.disk.clone()))
            .or_default() += size_of[r.volume.as_str()];
    }
    let mut placed: BTreeMap<(String, String), u64> = BTreeMap::new();
    for a in &plan.actions {
        let ActionKind::CreateReplica {
            volume,
            node,
            disk,
            reuse: None,
            ..
        } = &a.kind
        else {
            continue;
        };
        let size = size_of[volume.as_str()];
        let key = (node.clone(), disk.clone());
        let d = view
            .nodes
            .iter()
            .find(|n| &n.id == node)
            .and_then(|n| n.disks.iter().find(|d| &d.id == disk))
            .ok_or("placed on a disk that does not exist")?;
        let before = placed.get(&key).copied().unwrap_or(0);
        let limit = (d.maximum - d.reserved) as u128
            * settings.over_provisioning_percentage() as u128
            / 100;
        let total = scheduled.get(&key).copied().unwrap_or(0) + before + size;
        if total as u128 > limit {
            return Err(format!(
                "{node}/{disk}: scheduled {total} over the limit {limit}: {a:?}"
            ));
        }
        let free = d.available as i128 - d.reserved as i128 - before as i128 - size as i128;
        if free * 100 < settings.minimal_available_percentage() as i128 * d.maximum as i128 {
            return Err(format!(
                "{node}/{disk}: {free} free after, below the minimum: {a:?}"
            ));
        }
        *placed.entry(key).or_default() += size;
    }
    Ok(())
}

/// No plan deletes the last rw replica of a volume.
fn check_last_replica(view: &ClusterView, plan: &Plan) -> Result<(), String> {
    for v in &view.volumes {
        let rw: Vec<&str> = view
            .replicas
            .iter()
            .filter(|r| r.volume == v.name && r.is_rw())
            .map(|r| r.name.as_str())
            .collect();
        if rw.is_empty() {
            continue;
        }
        let deleted = plan
            .actions
            .iter()
            .filter(|a| matches!(&a.kind, ActionKind::DeleteReplica { replica, .. } if rw.contains(&replica.as_str())))
            .count();
        if deleted >= rw.len() {
            return Err(format!("{}: every healthy replica deleted", v.name));
        }
    }
    Ok(())
}

fn settle_checked(sim: &mut Sim) -> Result<(), TestCaseError> {
    let settings = sim.settings();
    for _ in 0..MAX_SETTLE_TICKS {
        sim.observe();
        let view = sim.view();
        let plan = planner::plan(&view, &settings, sim.now());
        prop_assert_eq!(
            &plan,
            &planner::plan(&view, &settings, sim.now()),
            "planning twice differs"
        );
        check_capacity(&view, &plan, &settings).map_err(TestCaseError::fail)?;
        check_last_replica(&view, &plan).map_err(TestCaseError::fail)?;
        let pending = sim.pending();
        let applied = sim.tick();
        prop_assert_eq!(&applied, &plan);
        if applied.changes().next().is_none() && !pending {
            return Ok(());
        }
    }
    Err(TestCaseError::fail("did not converge"))
}

/// Settles the cluster, then each perturbation in turn, checking every plan.
pub fn check_cluster(c: &Cluster) -> Result<(), TestCaseError> {
    let scenario = Scenario::parse(&c.yaml).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut sim = Sim::new(&scenario).map_err(TestCaseError::fail)?;
    settle_checked(&mut sim)?;
    let r = sim.settle(0);
    prop_assert!(r.settled && !r.oscillation, "{:?}", r);
    for p in &c.perturbations {
        let s = Scenario::parse(&format!("nodes: []\nsteps:\n  - {p}\n"))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        sim.apply_step(&s.steps[0]).map_err(TestCaseError::fail)?;
        settle_checked(&mut sim)?;
        let r = sim.settle(0);
        prop_assert!(r.settled, "did not settle after {}: {:?}", p, r);
        prop_assert!(!r.oscillation, "oscillation after {}: {:?}", p, r);
    }
    Ok(())
}
