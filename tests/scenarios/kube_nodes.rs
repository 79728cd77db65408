//! Kubernetes Nodes as the truth about whether a node is up: a Ballast
//! node whose Kubernetes Node is deleted, or NotReady for longer than the
//! node-down timeout, is down however well its plugin heartbeats, and is
//! ready again once its Node is back and Ready. A node plugin opens the
//! default disks its Kubernetes Node's annotation names, and at every
//! start the disks its Ballast Node's spec holds.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use crate::harness::*;
use crate::kube_cluster::{KubeCluster, kube_node};

fn ready(c: &Cluster, id: &str) -> (bool, Option<String>) {
    let n: Value = node(&c.api, id).unwrap();
    (
        n["status"]["ready"] == true,
        n["status"]["heldDown"].as_str().map(str::to_string),
    )
}

/// Waits for the node to be down, then checks it stays down through
/// several heartbeats.
fn stays_down(c: &Cluster, id: &str, because: &str) {
    let why = wait_for(
        Duration::from_secs(30),
        "the node held down",
        || match ready(c, id) {
            (false, Some(why)) => Some(why),
            _ => None,
        },
    );
    assert!(why.contains(because), "{why}");
    // The plugin heartbeats every second (a quarter of the 4 s timeout).
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        ready(c, id),
        (false, Some(why)),
        "a heartbeat made it ready"
    );
}

fn back(c: &Cluster, id: &str) {
    wait_for(Duration::from_secs(30), "the node ready again", || {
        (ready(c, id) == (true, None)).then_some(())
    });
}

#[test]
fn kube_a_deleted_or_long_not_ready_kubernetes_node_holds_its_node_down() {
    let k = KubeCluster::start(1);
    let c = &k.c;
    let id = "node-1";
    assert_eq!(ready(c, id), (true, None));
    let nodes: Api<KubeNode> = Api::all(k.rt.block_on(k.cp.client()).unwrap());

    // NotReady, for longer than the node-down timeout (4 s): down.
    let since = (chrono::Utc::now() - chrono::Duration::seconds(60)).to_rfc3339();
    let not_ready = json!({"status": {"conditions": [{
        "type": "Ready", "status": "False", "reason": "KubeletNotReady",
        "lastHeartbeatTime": since, "lastTransitionTime": since,
    }]}});
    k.rt.block_on(nodes.patch_status(id, &PatchParams::default(), &Patch::Merge(&not_ready)))
        .unwrap();
    stays_down(c, id, "NotReady since");
    let now = chrono::Utc::now().to_rfc3339();
    let is_ready = json!({"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "KubeletReady",
        "lastHeartbeatTime": now, "lastTransitionTime": now,
    }]}});
    k.rt.block_on(nodes.patch_status(id, &PatchParams::default(), &Patch::Merge(&is_ready)))
        .unwrap();
    back(c, id);

    // Deleted: down until a Node of its name is there again.
    k.rt.block_on(nodes.delete(id, &Default::default()))
        .unwrap();
    stays_down(c, id, "deleted");
    let node: KubeNode = serde_json::from_value(json!({"metadata": {"name": id}})).unwrap();
    k.rt.block_on(nodes.create(&Default::default(), &node))
        .unwrap();
    back(c, id);

    let events = c.events(&format!("node/{id}"));
    assert!(
        events.iter().any(|e| e["reason"] == "KubernetesNode"
            && e["message"]
                .as_str()
                .unwrap_or_default()
                .contains("down: its Kubernetes Node was deleted")),
        "{events:?}"
    );
}

#[test]
fn kube_a_node_opens_the_default_disks_its_kubernetes_node_names_and_keeps_them_in_its_spec() {
    let mut k = KubeCluster::start(1);
    let dir = k.c.dir.path().to_path_buf();
    let disk = dir.join("node-2").join("annotated");
    std::fs::create_dir_all(&disk).unwrap();
    let nodes: Api<KubeNode> = Api::all(k.rt.block_on(k.cp.client()).unwrap());
    let annotation = json!([{"path": disk.display().to_string(), "tags": ["fast"]}]).to_string();
    let kube_node2: KubeNode = serde_json::from_value(json!({"metadata": {
        "name": "node-2",
        "annotations": {"ballast.csi.dev/default-disks": annotation},
    }}))
    .unwrap();
    k.rt.block_on(nodes.create(&Default::default(), &kube_node2))
        .unwrap();
    let agents = format!("http://{}", k.c.ctl.agent);

    // No --disk: the annotation's disk, with its tags.
    let n2 = kube_node(&dir, "node-2", &agents, false);
    let api = k.c.api.clone();
    let disks_of = |n: &Value| -> Vec<(String, Value)> {
        n["spec"]["disks"]
            .as_object()
            .map(|m| {
                m.values()
                    .map(|d| {
                        (
                            d["path"].as_str().unwrap_or_default().to_string(),
                            d["tags"].clone(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let up = wait_for(Duration::from_secs(60), "node-2 ready", || {
        node(&api, "node-2").filter(node_is_up)
    });
    assert_eq!(
        disks_of(&up),
        [(disk.display().to_string(), json!(["fast"]))],
        "{up}"
    );

    // The annotation goes and the plugin starts again: the disk is in the
    // Ballast Node's spec, so it still opens it.
    let mut n2 = n2;
    n2.proc.signal(nix::sys::signal::Signal::SIGTERM);
    n2.proc.wait_exit(Duration::from_secs(30));
    let patch = json!({"metadata": {"annotations": {"ballast.csi.dev/default-disks": null}}});
    k.rt.block_on(nodes.patch("node-2", &PatchParams::default(), &Patch::Merge(&patch)))
        .unwrap();
    let since = chrono::Utc::now();
    let again = kube_node(&dir, "node-2", &agents, false);
    let up = wait_for(Duration::from_secs(60), "node-2 ready again", || {
        node(&api, "node-2").filter(|n| node_up_since(n, since))
    });
    assert_eq!(
        disks_of(&up),
        [(disk.display().to_string(), json!(["fast"]))]
    );
    assert!(
        std::fs::read_to_string(again.proc.log.clone())
            .unwrap()
            .contains("disks to open"),
        "the plugin says which disks it opens and why"
    );
    k.c.nodes.push(again);
}
