//! Property tests of the planner over random clusters (`random`): on every
//! plan the last healthy replica is never deleted, no placement breaks the
//! capacity rules, planning twice gives the same plan; every settle
//! converges within the bound without oscillating.

mod random;

use proptest::prelude::*;
use random::{Cluster, check_cluster, cluster};

proptest! {
    #![proptest_config(random::config())]

    #[test]
    fn planner_invariants_hold_on_random_clusters(c in cluster()) {
        check_cluster(&c)?;
    }
}

/// Cases proptest once found, shrunk, kept as plain tests (their seeds are
/// in planner_properties.proptest-regressions too).
#[test]
fn eviction_of_two_nodes_under_hard_disk_anti_affinity_converges() {
    // cc 016a2156: 9 nodes in 2 zones, hard disk anti-affinity, policy
    // block-for-eviction-if-contains-last-replica.
    let c = Cluster {
        yaml: include_str!("cases/016a2156.yaml").to_string(),
        perturbations: vec![
            "node: {id: node-07, evictionRequested: true}".into(),
            "node: {id: node-09, evictionRequested: true}".into(),
        ],
    };
    check_cluster(&c).unwrap();
}
