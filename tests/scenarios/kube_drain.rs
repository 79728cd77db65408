//! `kubectl drain` meets the drain policy (seed 002, issue "Install on
//! Kubernetes"): while a node is drain-blocked, the controller runs a guard
//! pod there with a PodDisruptionBudget that allows no disruption, so the
//! eviction a drain makes is refused (429), and the drain waits. Once the
//! policy allows the drain, the guard goes and the eviction goes through.
//! Tried through the real eviction API of the test bench's API server,
//! whose kube-controller-manager runs the disruption controller. No kubelet
//! runs the guard pod: the test reports it Running and Ready, as a kubelet
//! would. Data is written before and checked after.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::harness::*;
use crate::kube_cluster::KubeCluster;

const SETTLE: Duration = Duration::from_secs(120);
const NAMESPACE: &str = "ballast";

fn guard_name(node: &str) -> String {
    ballast_controller::kubernetes::drain_guard::guard_name(node)
}

fn pods(k: &KubeCluster) -> Api<Pod> {
    Api::namespaced(k.rt.block_on(k.cp.client()).unwrap(), NAMESPACE)
}

/// Waits for the guard of `node` and its budget, then reports the guard
/// Running and Ready (the kubelet's part), and waits until the disruption
/// controller has counted it: no disruption allowed.
fn guard_up(k: &KubeCluster, node: &str) {
    let name = guard_name(node);
    let pods = pods(k);
    let budgets: Api<PodDisruptionBudget> =
        Api::namespaced(k.rt.block_on(k.cp.client()).unwrap(), NAMESPACE);
    wait_for(SETTLE, "the guard pod", || {
        k.rt.block_on(pods.get_opt(&name)).ok().flatten()
    });
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let status = json!({"status": {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
    }});
    k.rt.block_on(pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)))
        .unwrap();
    wait_for(SETTLE, "the budget counting the guard", || {
        let b = k.rt.block_on(budgets.get_opt(&name)).ok().flatten()?;
        let st = b.status?;
        (st.observed_generation == b.metadata.generation
            && st.current_healthy == Some(1)
            && st.disruptions_allowed == Some(0))
        .then_some(())
    });
}

/// What the eviction API answers a drain for the guard of `node`, asked
/// once as `kubectl drain` asks it (kube-rs's client would retry a 429
/// itself): Ok, or the refusal's reason.
fn evict(k: &KubeCluster, node: &str) -> Result<(), String> {
    let name = guard_name(node);
    let eviction = json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": NAMESPACE},
    });
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), eviction.to_string()).unwrap();
    let kubectl = ballast_k8s_harness::tool("kubectl").unwrap_or_else(|e| panic!("{e}"));
    let out = std::process::Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(&k.cp.kubeconfig)
        .args(["create", "--raw"])
        .arg(format!(
            "/api/v1/namespaces/{NAMESPACE}/pods/{name}/eviction"
        ))
        .arg("-f")
        .arg(file.path())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    match () {
        _ if out.status.success() => Ok(()),
        // Gone already: nothing stands in the drain's way.
        _ if said.contains("NotFound") => Ok(()),
        _ if said.contains("TooManyRequests") => Err("429 TooManyRequests".into()),
        _ => panic!("the eviction API: {said}"),
    }
}

/// `kubectl drain` of `node` begins: the Node is cordoned, the node turns
/// drain-blocked, its guard is up, and the drain's eviction is refused.
fn drain_waits(k: &KubeCluster, node: &str) {
    k.cordon(node, true);
    wait_for(SETTLE, "the node drain-blocked", || {
        (k.c.node(node)["status"]["drainBlocked"] == true).then_some(())
    });
    guard_up(k, node);
    assert_eq!(
        evict(k, node),
        Err("429 TooManyRequests".into()),
        "the drain must wait"
    );
}

/// Waits until the drain of `node` goes through, and its guard's budget is
/// gone.
fn drain_goes_through(k: &KubeCluster, node: &str) {
    wait_for(SETTLE, "the drain to go through", || evict(k, node).ok());
    let budgets: Api<PodDisruptionBudget> =
        Api::namespaced(k.rt.block_on(k.cp.client()).unwrap(), NAMESPACE);
    wait_for(SETTLE, "the guard's budget gone", || {
        matches!(k.rt.block_on(budgets.get_opt(&guard_name(node))), Ok(None)).then_some(())
    });
}

#[test]
fn kube_a_drain_waits_while_the_node_holds_the_last_replica_and_goes_through_once_allowed() {
    let k = KubeCluster::start(3);
    let c = &k.c;
    c.set("node-drain-policy", json!("block-if-contains-last-replica"));
    c.create_volume(json!({"name": "vol", "size": SIZE, "numberOfReplicas": 1}));
    let node = c.holders("vol")[0].clone();
    let endpoint = c.attach("vol", &node);
    c.wait_settled("vol", 1, SETTLE);
    let data = write_data(c.dir.path(), &endpoint, 31);

    drain_waits(&k, &node);
    // The event is written after the guard it tells of.
    wait_for(SETTLE, "a DrainGuardRaised event", || {
        c.event_reasons(&format!("node/{node}"))
            .contains(&"DrainGuardRaised".to_string())
            .then_some(())
    });

    // The operator allows the drain: the guard goes, the drain goes on.
    c.set("node-drain-policy", json!("always-allow"));
    drain_goes_through(&k, &node);
    verify_data(c.dir.path(), &endpoint, &data);
    verify_replicas(c, "vol", &data);
}

#[test]
fn kube_under_block_for_eviction_a_drain_waits_until_every_replica_left_the_node() {
    let k = KubeCluster::start(3);
    let c = &k.c;
    c.set("node-drain-policy", json!("block-for-eviction"));
    c.create_volume(json!({"name": "vol", "size": SIZE, "numberOfReplicas": 2}));
    let h = c.holders("vol");
    let (attached, drained) = (h[0].clone(), h[1].clone());
    let spare = (1..=3)
        .map(|i| format!("node-{i}"))
        .find(|n| !h.contains(n))
        .unwrap();
    let endpoint = c.attach("vol", &attached);
    c.wait_settled("vol", 2, SETTLE);
    let data = write_data(c.dir.path(), &endpoint, 32);

    // Nowhere to go yet: the replica stays, and so does the guard.
    c.patch_node(&spare, json!({"allowScheduling": false}));
    drain_waits(&k, &drained);
    assert!(c.replica_on("vol", &drained).is_some());

    // Somewhere to go: the replica moves, then the drain goes through.
    c.patch_node(&spare, json!({"allowScheduling": true}));
    drain_goes_through(&k, &drained);
    assert!(
        c.replica_on("vol", &drained).is_none(),
        "the drain went through only once the replica had left"
    );
    c.wait_settled("vol", 2, SETTLE);
    verify_data(c.dir.path(), &endpoint, &data);
    verify_replicas(c, "vol", &data);
}
