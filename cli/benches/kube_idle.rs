//! What an idle Ballast asks of the API server. `ballast local --store
//! kubernetes` (a leader-elected controller and three heartbeating node
//! plugins) runs on the test bench's real API server with ten volumes of
//! three replicas, settled; for a minute nothing happens. The API server's
//! own counter `apiserver_request_total` is read before and after, and so
//! for a minute of the control plane alone (kube-controller-manager asks
//! too), which is taken off. Prints Ballast's requests by verb and
//! resource, and its writes and reads per minute.
//!
//! Run: `KUBEBUILDER_ASSETS=$PWD/target/k8s-tools cargo bench -p
//! ballast-cli --bench kube_idle`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use ballast_k8s_harness::{ControlPlane, RequestCounts};
use common::*;
use serde_json::json;

const WINDOW: Duration = Duration::from_secs(60);

fn counts(rt: &tokio::runtime::Runtime, cp: &ControlPlane) -> RequestCounts {
    rt.block_on(cp.request_counts())
        .unwrap_or_else(|e| panic!("{e}"))
}

/// What `after` counted beyond `before`.
fn delta(before: &RequestCounts, after: &RequestCounts) -> RequestCounts {
    after
        .iter()
        .map(|(k, n)| (k.clone(), n - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "POST" | "PUT" | "PATCH" | "DELETE" | "DELETECOLLECTION"
    )
}

fn main() {
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let cp = rt
        .block_on(ControlPlane::start())
        .unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().expect("a temporary directory");

    // The control plane alone, settled.
    std::thread::sleep(Duration::from_secs(10));
    let c0 = counts(&rt, &cp);
    std::thread::sleep(WINDOW);
    let alone = delta(&c0, &counts(&rt, &cp));

    let port = free_addr().port();
    let api = format!("http://127.0.0.1:{port}");
    let mut local = Command::new(BALLAST)
        .args(["local", "--store", "kubernetes", "--kubeconfig"])
        .arg(&cp.kubeconfig)
        .args(["--nodes", "3", "--zones", "3", "--dir"])
        .arg(dir.path().join("local"))
        .args(["--api-listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start ballast local");
    wait_for(Duration::from_secs(120), "three nodes ready", || {
        let nodes = get_json(&format!("{api}/v1/nodes"))?;
        let ready = nodes["items"]
            .as_array()?
            .iter()
            .filter(|n| n["status"]["ready"] == true)
            .count();
        (ready == 3).then_some(())
    });
    call(
        "PUT",
        &format!("{api}/v1/settings/storage-minimal-available-percentage"),
        Some(json!({"value": "0"})),
    );
    for i in 0..10 {
        let (code, body) = call(
            "POST",
            &format!("{api}/v1/volumes"),
            Some(json!({"name": format!("idle-{i}"), "size": "64Mi", "numberOfReplicas": 3})),
        );
        assert!(code < 300, "{body}");
    }
    wait_for(Duration::from_secs(120), "thirty replicas", || {
        let reps = get_json(&format!("{api}/v1/replicas"))?;
        (reps["items"].as_array()?.len() == 30).then_some(())
    });
    // Settled: the creations' events and the first records are behind.
    std::thread::sleep(Duration::from_secs(20));

    let c1 = counts(&rt, &cp);
    std::thread::sleep(WINDOW);
    let with = delta(&c1, &counts(&rt, &cp));
    let _ = local.kill();
    let _ = local.wait();

    let ours: RequestCounts = with
        .iter()
        .map(|(k, n)| {
            (
                k.clone(),
                n.saturating_sub(alone.get(k).copied().unwrap_or(0)),
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    println!(
        "idle Ballast (a controller, 3 nodes, 10 volumes x 3 replicas) on the API server, over {} s, control plane alone taken off:",
        WINDOW.as_secs()
    );
    println!(
        "  {:<8} {:<22} {:<18} {:>6}",
        "verb", "group", "resource", "count"
    );
    for ((verb, group, resource), n) in &ours {
        println!("  {verb:<8} {group:<22} {resource:<18} {n:>6}");
    }
    let per_minute = |f: &dyn Fn(&str) -> bool| -> f64 {
        let n: u64 = ours
            .iter()
            .filter(|((v, _, _), _)| f(v))
            .map(|(_, n)| n)
            .sum();
        n as f64 * 60.0 / WINDOW.as_secs_f64()
    };
    println!(
        "writes per minute: {:.0} (Lease renewals among them: {:.0})",
        per_minute(&|v| is_write(v)),
        ours.iter()
            .filter(|((v, _, r), _)| is_write(v) && r == "leases")
            .map(|(_, n)| *n as f64)
            .sum::<f64>()
            * 60.0
            / WINDOW.as_secs_f64()
    );
    println!(
        "reads per minute: {:.0} (GET and LIST; WATCH: {:.0})",
        per_minute(&|v| matches!(v, "GET" | "LIST")),
        per_minute(&|v| v == "WATCH")
    );
}
