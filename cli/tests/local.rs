//! `ballast local` as a user runs it: three nodes come up ready with their
//! disk sizes, `ballastctl` sees them, Ctrl-C stops every child, and a
//! second run on the same --dir has the same state.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

#[test]
fn local_cluster_has_three_ready_nodes_and_keeps_its_state_across_runs() {
    let dir = tempfile::tempdir().unwrap();
    let local = start_local(dir.path());
    let (port, api) = (local.port, local.api.clone());
    let text = local.seen.join("\n");
    for needle in [
        "REST API",
        "controller CSI",
        "node-1",
        "node-2",
        "node-3",
        "logs",
    ] {
        assert!(
            text.contains(needle),
            "endpoint listing lacks {needle}:\n{text}"
        );
    }
    let (ok, out, err) = ballastctl(&api, &["node", "list"]);
    assert!(ok, "{err}");
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(rows.len(), 3, "{out}");
    for (i, row) in rows.iter().enumerate() {
        assert!(row.starts_with(&format!("node-{}", i + 1)), "{out}");
        assert!(row.contains("Ready") && !row.contains("NotReady"), "{out}");
        assert!(row.contains(&format!("zone-{}", i + 1)), "{out}");
        assert!(row.contains("disk-1:") && row.contains("free of"), "{out}");
    }
    let (ok, json, _) = ballastctl(&api, &["-o", "json", "node", "list"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let items = v["items"].as_array().unwrap();
    assert!(items.iter().all(node_is_up), "{json}");
    let uuid_before =
        std::fs::read_to_string(dir.path().join("node-1/disk-1/ballast-disk.json")).unwrap();

    // The disks are directories on this machine's filesystem: do not let
    // its free space decide the test.
    free_space_is_not_the_test(&api);
    volume_round_trip_and_a_setting(dir.path(), &api);
    let (ok, _, err) = ballastctl(
        &api,
        &["setting", "set", "replica-auto-balance", "sometimes"],
    );
    assert!(!ok);
    assert!(err.contains("disabled, least-effort, best-effort"), "{err}");
    ctl_ok(&api, &["node", "cordon", "node-2"]);

    stop_with_ctrl_c(local);
    // Every child is gone: the API no longer answers.
    assert!(get_json(&format!("{api}/healthz")).is_none());

    let restarted_at = chrono::Utc::now();
    let local = start_local_at(dir.path(), port, &[]).unwrap_or_else(|e| panic!("{e}"));
    for id in ["node-1", "node-2", "node-3"] {
        let n = node(&api, id).unwrap();
        let beat: chrono::DateTime<chrono::Utc> = n["status"]["lastHeartbeat"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            beat > restarted_at,
            "{id} is ready on a heartbeat of this run, not a stale status"
        );
    }
    let (_, out, _) = ballastctl(&api, &["volume", "list"]);
    assert!(
        out.lines()
            .any(|l| l.starts_with("v1 ") && l.contains("1Gi")),
        "{out}"
    );
    let (_, out, _) = ballastctl(&api, &["setting", "get", "replica-auto-balance"]);
    assert!(
        out.lines()
            .nth(1)
            .is_some_and(|l| l.contains("best-effort")),
        "{out}"
    );
    let n2 = node(&api, "node-2").unwrap();
    assert_eq!(n2["status"]["cordoned"], true, "cordon survives a restart");
    let uuid_after =
        std::fs::read_to_string(dir.path().join("node-1/disk-1/ballast-disk.json")).unwrap();
    assert_eq!(uuid_before, uuid_after, "disk identity is kept");
    let (_, out, _) = ballastctl(&api, &["node", "list"]);
    assert_eq!(
        out.lines()
            .skip(1)
            .filter(|l| l.contains("Ready") && !l.contains("NotReady"))
            .count(),
        3,
        "{out}"
    );
    stop_with_ctrl_c(local);
}

/// Attaches v1 to node-1, writes patterns at several offsets with qemu-io,
/// reads them back verified, compares the whole volume with a local copy
/// by qemu-img, and detaches.
fn round_trip(dir: &std::path::Path, api: &str) {
    let (ok, endpoint, err) = ballastctl(api, &["volume", "attach", "v1", "--node", "node-1"]);
    assert!(ok, "{err}");
    let endpoint = endpoint.trim().to_string();
    assert!(endpoint.starts_with("nbd+unix:///v1?socket="), "{endpoint}");
    let writes = [
        "write -P 0x11 0 64k",
        "write -P 0x22 300M 1M",
        "write -P 0x33 1073676288 64k",
        "write -P 0x44 7k 3k",
    ];
    let reads = [
        "read -P 0x11 0 7k",
        "read -P 0x22 300M 1M",
        "read -P 0x33 1073676288 64k",
        "read -P 0x44 7k 3k",
    ];
    let qemu_io = |target: &str, cmds: &[&str]| {
        let (ok, out) = qemu_io(target, cmds);
        assert!(ok, "{out}");
    };
    qemu_io(&endpoint, &writes);
    qemu_io(&endpoint, &reads);
    let local = dir.join("copy.img");
    assert!(
        Command::new("qemu-img")
            .args(["create", "-f", "raw"])
            .arg(&local)
            .arg("1G")
            .status()
            .unwrap()
            .success()
    );
    qemu_io(local.to_str().unwrap(), &writes);
    let cmp = qemu_compare(local.to_str().unwrap(), &endpoint);
    assert!(
        cmp.status.success(),
        "{}",
        String::from_utf8_lossy(&cmp.stdout)
    );
    ctl_ok(api, &["volume", "detach", "v1"]);
}

/// What both local clusters are put through: a volume of three replicas
/// created, attached, written and read back, and a setting changed.
fn volume_round_trip_and_a_setting(dir: &std::path::Path, api: &str) {
    ctl_ok(
        api,
        &["volume", "create", "v1", "--size", "1Gi", "--replicas", "3"],
    );
    round_trip(dir, api);
    ctl_ok(
        api,
        &["setting", "set", "replica-auto-balance", "best-effort"],
    );
}

#[test]
fn ballastctl_reports_an_unreachable_api_clearly() {
    let (ok, _, err) = ballastctl(&format!("http://{}", free_addr()), &["node", "list"]);
    assert!(!ok);
    assert!(err.contains("cannot reach the Ballast API"), "{err}");
}

/// `ballast local --store kubernetes --kubeconfig F` runs the same cluster
/// against an API server: its nodes, volumes, replicas and settings are
/// objects there, and data written through a volume reads back.
#[test]
fn local_cluster_runs_on_an_api_server_with_the_kubernetes_store() {
    use ballast::model::{NodeResource, ReplicaResource, SettingResource, VolumeResource};
    use kube::api::{Api, ListParams};

    let rt = tokio::runtime::Runtime::new().unwrap();
    let cp = rt
        .block_on(ballast_k8s_harness::ControlPlane::start())
        .unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let _teardown = Teardown(dir.path().to_path_buf());
    let kubeconfig = cp.kubeconfig.to_str().unwrap();
    let local = start_local_with(
        dir.path(),
        &["--store", "kubernetes", "--kubeconfig", kubeconfig],
    );
    let api = local.api.clone();
    wait_for(Duration::from_secs(60), "three ready nodes", || {
        let (_, json, _) = ballastctl(&api, &["-o", "json", "node", "list"]);
        let v: serde_json::Value = serde_json::from_str(&json).ok()?;
        let items = v["items"].as_array()?;
        (items.len() == 3 && items.iter().all(node_is_up)).then_some(())
    });
    free_space_is_not_the_test(&api);
    volume_round_trip_and_a_setting(dir.path(), &api);

    // What the API server holds, as `kubectl get -n ballast-system` lists it.
    let client = rt.block_on(cp.client()).unwrap();
    let ns = "ballast-system";
    let names = |list: Vec<String>| {
        let mut list = list;
        list.sort();
        list
    };
    let lp = ListParams::default();
    let nodes = rt
        .block_on(Api::<NodeResource>::namespaced(client.clone(), ns).list(&lp))
        .unwrap();
    assert_eq!(
        names(
            nodes
                .items
                .iter()
                .filter_map(|n| n.metadata.name.clone())
                .collect()
        ),
        ["node-1", "node-2", "node-3"]
    );
    let volumes = rt
        .block_on(Api::<VolumeResource>::namespaced(client.clone(), ns).list(&lp))
        .unwrap();
    assert_eq!(
        names(
            volumes
                .items
                .iter()
                .filter_map(|v| v.metadata.name.clone())
                .collect()
        ),
        ["v1"]
    );
    let replicas = rt
        .block_on(Api::<ReplicaResource>::namespaced(client.clone(), ns).list(&lp))
        .unwrap();
    assert_eq!(replicas.items.len(), 3, "{:?}", replicas.items);
    let setting = rt
        .block_on(
            Api::<SettingResource>::namespaced(client.clone(), ns).get("replica-auto-balance"),
        )
        .unwrap();
    assert_eq!(setting.spec.value, "best-effort");
    stop_with_ctrl_c(local);
}
