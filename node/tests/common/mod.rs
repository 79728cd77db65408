//! What the engine and rebuild tests share.

use std::sync::Arc;

use ballast_node::engine::{Engine, ReplicaAddr, ReplicaSet};

/// An engine of volume "v" over `replicas` that keeps no record of its
/// replica set (`local`: the replica on its node, lent to it).
pub async fn engine_over(size: u64, replicas: &[ReplicaAddr], local: Option<&str>) -> Arc<Engine> {
    Engine::start(
        "v",
        size,
        replicas,
        local.map(str::to_string),
        ReplicaSet::default(),
        None,
        Default::default(),
    )
    .await
    .unwrap()
}
