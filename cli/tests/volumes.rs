//! Volumes for real, through the REST API: placed by the planner, created
//! on the nodes, attached (an engine process serving NBD), used by qemu-io,
//! degraded by a lost node, detached and deleted with their data.

mod common;

use std::time::Duration;

use common::cluster_of_nodes as cluster;
use common::*;
use nix::sys::signal::Signal;
use serde_json::json;

/// Where a replica (as the REST API lists it) keeps its files.
fn replica_dir_in(dir: &std::path::Path, r: &serde_json::Value) -> std::path::PathBuf {
    dir.join(r["nodeId"].as_str().unwrap())
        .join("disk-1/replicas")
        .join(r["name"].as_str().unwrap())
}

/// Waits until `volume`'s robustness is `want`.
fn wait_robustness(api: &str, volume: &str, want: &str) {
    wait_robustness_within(api, volume, want, Duration::from_secs(30));
}

#[test]
fn a_volume_is_placed_attached_used_degraded_detached_and_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let (ctl, mut nodes) = cluster(dir.path(), "3s", 3, &[]);
    let api = &ctl.api;

    // More replicas than nodes (hard node anti-affinity): 422 with reasons.
    let (s, v) = call(
        "POST",
        &format!("{api}/v1/volumes"),
        Some(json!({"name": "big", "size": "1Gi", "numberOfReplicas": 4})),
    );
    assert_eq!(s, 422, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("replica-soft-anti-affinity is false"),
        "{v}"
    );

    let (s, v) = call(
        "POST",
        &format!("{api}/v1/volumes"),
        Some(json!({"name": "v1", "size": "1Gi", "numberOfReplicas": 3})),
    );
    assert_eq!(s, 201, "{v}");
    let (_, v) = call("GET", &format!("{api}/v1/volumes/v1"), None);
    let reps = v["status"]["replicas"].as_array().unwrap().clone();
    let mut on: Vec<String> = reps
        .iter()
        .map(|r| r["nodeId"].as_str().unwrap().to_string())
        .collect();
    on.sort();
    assert_eq!(on, ["node-1", "node-2", "node-3"], "one replica per node");
    for r in &reps {
        let d = replica_dir_in(dir.path(), r);
        assert!(
            d.join("meta.json").exists(),
            "{} exists on its disk",
            d.display()
        );
    }

    let endpoint = attach(api, "v1", "node-1");
    assert!(endpoint.starts_with("nbd+unix:///v1?socket="), "{endpoint}");
    let (s, _) = call(
        "POST",
        &format!("{api}/v1/volumes/v1/attach"),
        Some(json!({"nodeId": "node-2"})),
    );
    assert_eq!(s, 409, "attached elsewhere");
    let (s, v) = call(
        "POST",
        &format!("{api}/v1/volumes/v1/attach"),
        Some(json!({"nodeId": "node-1"})),
    );
    assert_eq!(
        (s, v["status"]["frontendEndpoint"].as_str()),
        (200, Some(endpoint.as_str())),
        "attach is idempotent"
    );
    let (s, _) = call("DELETE", &format!("{api}/v1/volumes/v1"), None);
    assert_eq!(s, 409, "an attached volume is not deleted");

    // Each region written, then read back: pattern, offset, length.
    let regions = [
        ("0xab", "0", "64k"),
        ("0xcd", "512M", "1M"),
        ("0xef", "1073737728", "4k"),
    ];
    for op in ["write", "read"] {
        let cmds: Vec<String> = regions
            .iter()
            .map(|(p, o, l)| format!("{op} -P {p} {o} {l}"))
            .collect();
        let cmds: Vec<&str> = cmds.iter().map(String::as_str).collect();
        let (ok, out) = qemu_io(&endpoint, &cmds);
        assert!(ok, "{op}: {out}");
    }
    wait_robustness(api, "v1", "healthy");

    // Lose node-3 while the volume is in use.
    nodes[2].proc.signal(Signal::SIGKILL);
    nodes[2].proc.wait_exit(Duration::from_secs(5)).unwrap();
    let (ok, out) = qemu_io(&endpoint, &["write -P 0x12 4M 1M", "flush"]);
    assert!(ok, "writes go on: {out}");
    wait_robustness(api, "v1", "degraded");
    let (_, v) = call("GET", &format!("{api}/v1/volumes/v1"), None);
    assert!(v["status"]["lastDegradedAt"].is_string());
    let (ok, out) = qemu_io(
        &endpoint,
        &[
            "read -P 0xab 0 64k",
            "read -P 0x12 4M 1M",
            "read -P 0xcd 512M 1M",
        ],
    );
    assert!(ok, "every acknowledged write reads back: {out}");

    let v = detach(api, "v1");
    assert_eq!(v["status"]["state"], "detached");
    assert!(v["status"]["frontendEndpoint"].is_null());

    // node-3 back, then delete: every replica's data goes.
    let restarted = chrono::Utc::now();
    let again = Proc::spawn(&nodes[2].args, dir.path().join("node-3.again.log"));
    wait_for(Duration::from_secs(30), "node-3 ready again", || {
        node(api, "node-3").filter(|n| node_up_since(n, restarted))
    });
    let (s, v) = call("DELETE", &format!("{api}/v1/volumes/v1"), None);
    assert_eq!(s, 204, "{v}");
    for r in &reps {
        let d = replica_dir_in(dir.path(), r);
        assert!(!d.exists(), "{} removed", d.display());
    }
    let (_, list) = call("GET", &format!("{api}/v1/replicas?volume=v1"), None);
    assert_eq!(list["items"], json!([]));
    drop(again);
}

/// A heartbeat older than the engine it reports on does not start the
/// engine again. A node lists its engines, then sends the list; an attach
/// can start an engine in between, and the controller, hearing of no
/// engine for an attached volume, took it for dead and started it again,
/// taking its socket from the client the attach had just given it. Such a
/// heartbeat is sent here by hand, as node-1, its engine list taken before
/// the attach: the engine keeps its process, no `EngineDown` is recorded,
/// and the data written before reads back.
#[test]
fn a_heartbeat_older_than_its_engine_does_not_start_it_again() {
    use ballast::proto::agent::v1::controlplane_client::ControlplaneClient;
    use ballast::proto::agent::v1::node_agent_client::NodeAgentClient;
    use ballast::proto::agent::v1::{
        GetNodeStatusRequest, HeartbeatRequest, ListEnginesRequest, ListReplicasRequest,
    };
    use ballast::tls::Role;

    let dir = tempfile::tempdir().unwrap();
    let (ctl, nodes) = cluster(dir.path(), "30s", 1, &[]);
    let api = &ctl.api;
    let state = dir.path().join("node-1/state");
    let (s, body) = call(
        "POST",
        &format!("{api}/v1/volumes"),
        Some(json!({"name": "late", "size": "16Mi", "numberOfReplicas": 1})),
    );
    assert_eq!(s, 201, "{body}");

    let rt = runtime();
    let agent = format!("http://{}", flag(&nodes[0].args, "--agent-listen"));
    let as_controller = member_as(dir.path(), Role::Controller);
    let node_agent = || {
        let ch = as_controller
            .channel(&agent, &Role::Node("node-1".into()))
            .unwrap();
        NodeAgentClient::new(ch)
    };
    let before = rt.block_on(async {
        let list = node_agent().list_engines(ListEnginesRequest {}).await;
        list.unwrap().into_inner().engines
    });
    assert!(before.iter().all(|e| e.volume != "late"), "{before:?}");

    let endpoint = attach(api, "late", "node-1");
    let (ok, out) = qemu_io(&endpoint, &["write -P 0x5a 0 4M", "flush"]);
    assert!(ok, "{out}");
    let pid = engine_pid(&state, "late").unwrap();

    // The node's own report but for its engines, which are as they were
    // before the attach.
    let stale = rt.block_on(async {
        let mut c = node_agent();
        let disks = c.get_node_status(GetNodeStatusRequest {}).await.unwrap();
        let replicas = c.list_replicas(ListReplicasRequest {}).await.unwrap();
        HeartbeatRequest {
            node_id: "node-1".into(),
            disks: disks.into_inner().disks,
            replicas: replicas.into_inner().replicas,
            engines: before,
        }
    });
    let known = rt.block_on(async {
        let as_node = member_as(dir.path(), Role::Node("node-1".into()));
        let url = format!("http://{}", ctl.agent);
        let ch = as_node.channel(&url, &Role::Controller).unwrap();
        let beat = ControlplaneClient::new(ch).heartbeat(stale).await;
        beat.unwrap().into_inner().known
    });
    assert!(known);

    // The controller asks the node before it starts anything, and says
    // what it found.
    let events = || event_reasons(api, "volume/late");
    wait_for(Duration::from_secs(60), "the stale report handled", || {
        let handled = ctl.proc.log_text().contains("older than the engine");
        (handled || events().iter().any(|r| r == "EngineDown")).then_some(())
    });
    let seen = events();
    assert!(!seen.iter().any(|r| r == "EngineDown"), "{seen:?}");
    assert_eq!(engine_pid(&state, "late"), Some(pid), "the engine kept");
    let (ok, out) = qemu_io(&endpoint, &["read -P 0x5a 0 4M"]);
    assert!(ok, "{out}");
    detach(api, "late");
}

/// A node whose engines hang (their processes stopped, as engines on a
/// hung disk are) is not taken for down: its heartbeat checks its engines
/// all at once, not one after another, so it comes within the node-down
/// timeout however many hang (eight here, each check given 2 s, against
/// a timeout of 10 s). The controller hears that they hang and starts them
/// again, and every byte written before reads back.
#[test]
fn a_node_whose_engines_hang_is_not_taken_for_down_and_its_engines_are_started_again() {
    let dir = tempfile::tempdir().unwrap();
    let (ctl, _nodes) = cluster(dir.path(), "10s", 1, &[]);
    let api = &ctl.api;
    let state = dir.path().join("node-1/state");
    let volumes: Vec<String> = (0..8).map(|i| format!("hung-{i}")).collect();
    let mut endpoints = Vec::new();
    for (i, v) in volumes.iter().enumerate() {
        let (s, body) = call(
            "POST",
            &format!("{api}/v1/volumes"),
            Some(json!({"name": v, "size": "16Mi", "numberOfReplicas": 1})),
        );
        assert_eq!(s, 201, "{body}");
        let endpoint = attach(api, v, "node-1");
        let write = format!("write -P {} 0 1M", 0x10 + i);
        let (ok, out) = qemu_io(&endpoint, &[&write, "flush"]);
        assert!(ok, "{v}: {out}");
        endpoints.push(endpoint);
    }
    let engines: Vec<i32> = volumes
        .iter()
        .map(|v| engine_pid(&state, v).unwrap())
        .collect();
    let _thaw = Thaw(engines.clone());
    for pid in &engines {
        stop_process(*pid);
    }

    for (v, old) in volumes.iter().zip(&engines) {
        wait_for(
            Duration::from_secs(90),
            &format!("{v} started again"),
            || engine_pid(&state, v).filter(|p| p != old),
        );
        wait_event(api, &format!("volume/{v}"), "EngineRestarted");
    }
    let reasons = event_reasons(api, "node/node-1");
    assert!(!reasons.iter().any(|r| r == "NodeDown"), "{reasons:?}");
    for (i, (v, endpoint)) in volumes.iter().zip(&endpoints).enumerate() {
        let read = format!("read -P {} 0 1M", 0x10 + i);
        let (ok, out) = qemu_io(endpoint, &[&read]);
        assert!(ok, "{v}: {out}");
        detach(api, v);
    }
}

/// An attachment while the nodes of two of the volume's three replicas
/// hang (their processes stopped: each keeps its sockets and answers
/// nothing, and neither is taken for down yet) is answered, and the
/// volume serves from the third: the engine opens its replicas at once,
/// so the two silent ones cost it one handshake's 10 s, not one each,
/// and the controller waits for the start as long as the node does.
/// Before, the engine opened them one after the other (20 s, the node's
/// limit for a start) and the controller's call was cut at an agent
/// call's 10 s: the attachment failed until the nodes were taken for
/// down. Every byte reads back, and the two are waited for no more.
#[test]
fn an_attachment_while_two_replicas_nodes_hang_is_answered_and_serves_from_the_third() {
    let dir = tempfile::tempdir().unwrap();
    let (ctl, nodes) = cluster(dir.path(), "120s", 3, &[]);
    let api = &ctl.api;
    let (s, body) = call(
        "POST",
        &format!("{api}/v1/volumes"),
        Some(json!({"name": "v", "size": "16Mi", "numberOfReplicas": 3})),
    );
    assert_eq!(s, 201, "{body}");
    let endpoint = attach(api, "v", "node-1");
    let (ok, out) = qemu_io(&endpoint, &["write -P 0x3d 0 12M", "flush"]);
    assert!(ok, "{out}");
    detach(api, "v");

    let hung: Vec<i32> = nodes[1..].iter().map(|n| n.proc.pid()).collect();
    let _thaw = Thaw(hung.clone());
    for pid in &hung {
        stop_process(*pid);
    }
    let (s, body) = call(
        "POST",
        &format!("{api}/v1/volumes/v/attach"),
        Some(json!({"nodeId": "node-1"})),
    );
    assert_eq!(s, 200, "{body}");
    let endpoint = body["status"]["frontendEndpoint"].as_str().unwrap();
    let (ok, out) = qemu_io(endpoint, &["read -P 0x3d 0 12M", "read -P 0 12M 4M"]);
    assert!(ok, "{out}");
}

/// Past the 10 s node-down timeout the tests here give, `node` is still
/// ready, and was never taken for down: heard from within it.
fn still_ready_past_its_timeout(api: &str, node_id: &str) {
    std::thread::sleep(Duration::from_secs(15));
    let n = node(api, node_id).unwrap();
    assert_eq!(n["status"]["ready"], true, "{n}");
    let reasons = event_reasons(api, &format!("node/{node_id}"));
    assert!(!reasons.iter().any(|r| r == "NodeDown"), "{reasons:?}");
}

/// Writes to a disk that hangs (frozen with fsfreeze) hold up nothing else
/// of its node. The engines on node-1 write to their volumes' replicas on
/// node-2 (plain writes and a flush, as a filesystem sends them; qemu-io's
/// default cache mode would make each a FUA write, which the replica
/// server never applies on its async task), more volumes than node-2's
/// plugin has async workers, while node-2's disk is frozen: its heartbeats go on past the node-down
/// timeout (it is not taken for down), and each engine gives up the
/// replica that does not answer and goes on with the other, so every
/// write is acknowledged. Thawed, the replicas there are brought back up
/// to date, and every byte reads back.
#[test]
fn writes_to_a_frozen_disk_hold_up_no_heartbeat_and_its_replicas_come_back_when_it_thaws() {
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = Teardown(dir.path().to_path_buf());
    let disk = ext4_disk(dir.path(), "node-2");
    let (ctl, _nodes) = cluster(dir.path(), "10s", 2, &[]);
    let api = ctl.api.clone();
    let workers = std::thread::available_parallelism().unwrap().get();
    let volumes: Vec<String> = (0..3 * workers).map(|i| format!("held-{i}")).collect();
    let mut endpoints = Vec::new();
    for (i, v) in volumes.iter().enumerate() {
        let (s, body) = call(
            "POST",
            &format!("{api}/v1/volumes"),
            Some(json!({"name": v, "size": "16Mi", "numberOfReplicas": 2})),
        );
        assert_eq!(s, 201, "{body}");
        assert_eq!(replica_nodes(&api, v), ["node-1", "node-2"]);
        let endpoint = attach(&api, v, "node-1");
        let write = format!("write -P {} 0 4M", 0x20 + i);
        let (ok, out) = qemu_io(&endpoint, &[&write, "flush"]);
        assert!(ok, "{v}: {out}");
        endpoints.push(endpoint);
    }

    let frozen = Frozen::freeze(&disk);
    let writers: Vec<_> = endpoints
        .iter()
        .enumerate()
        .map(|(i, endpoint)| {
            let (endpoint, write) = (endpoint.clone(), format!("write -P {} 4M 4M", 0x40 + i));
            // Plain writes, then a flush, as a filesystem sends them.
            let writeback = ["-t", "writeback"];
            std::thread::spawn(move || qemu_io_with(&endpoint, &writeback, &[&write, "flush"]))
        })
        .collect();
    still_ready_past_its_timeout(&api, "node-2");
    for (w, v) in writers.into_iter().zip(&volumes) {
        let (ok, out) = w.join().unwrap();
        assert!(ok, "{v}: {out}");
    }

    drop(frozen);
    for (i, (v, endpoint)) in volumes.iter().zip(&endpoints).enumerate() {
        wait_robustness_within(&api, v, "healthy", Duration::from_secs(120));
        let (first, second) = (
            format!("read -P {} 0 4M", 0x20 + i),
            format!("read -P {} 4M 4M", 0x40 + i),
        );
        let (ok, out) = qemu_io(endpoint, &[&first, &second]);
        assert!(ok, "{v}: {out}");
        detach(&api, v);
    }
}

/// A disk that hangs (its filesystem frozen with fsfreeze: every write to
/// it waits) holds up the calls that write to it, and nothing else of its
/// node: with the replicas of more volumes being deleted there than the
/// node plugin has async workers (each delete waits on the disk), the
/// node's heartbeats go on past the node-down timeout, and it is not
/// taken for down; the controller's deletes give up on the node's answer
/// and say so. Thawed, the deletes asked again end, and the replicas'
/// files are gone.
#[test]
fn deletes_waiting_on_a_frozen_disk_hold_up_no_heartbeat_and_end_when_it_thaws() {
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = Teardown(dir.path().to_path_buf());
    let disk = ext4_disk(dir.path(), "node-1");
    let (ctl, _nodes) = cluster(dir.path(), "10s", 1, &[]);
    let api = ctl.api.clone();
    let workers = std::thread::available_parallelism().unwrap().get();
    let volumes: Vec<String> = (0..=workers).map(|i| format!("gone-{i}")).collect();
    let mut files = Vec::new();
    for v in &volumes {
        let (s, body) = call(
            "POST",
            &format!("{api}/v1/volumes"),
            Some(json!({"name": v, "size": "16Mi", "numberOfReplicas": 1})),
        );
        assert_eq!(s, 201, "{body}");
        let (_, body) = call("GET", &format!("{api}/v1/volumes/{v}"), None);
        let files_of = replica_dir_in(dir.path(), &body["status"]["replicas"][0]);
        wait_for(Duration::from_secs(30), "the replica's files", || {
            files_of.exists().then_some(())
        });
        files.push(files_of);
    }

    let frozen = Frozen::freeze(&disk);
    let deletes: Vec<_> = volumes
        .iter()
        .map(|v| {
            let url = format!("{api}/v1/volumes/{v}");
            std::thread::spawn(move || call("DELETE", &url, None))
        })
        .collect();
    still_ready_past_its_timeout(&api, "node-1");
    for (d, v) in deletes.into_iter().zip(&volumes) {
        let (s, body) = d.join().unwrap();
        assert_eq!(s, 500, "{v}: {body}");
        assert!(
            body.to_string().contains("could not delete every replica"),
            "{v}: {body}"
        );
    }

    drop(frozen);
    for v in &volumes {
        let url = format!("{api}/v1/volumes/{v}");
        wait_for(Duration::from_secs(30), &format!("{v} deleted"), || {
            (call("DELETE", &url, None).0 == 204).then_some(())
        });
    }
    for f in &files {
        assert!(!f.exists(), "{} is left", f.display());
    }
}

#[test]
fn a_volume_grows_attached_and_detached_with_ballastctl_and_keeps_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let (ctl, _n) = controller_with_one_node(dir.path());
    let api = &ctl.api;
    let (s, v) = call(
        "POST",
        &format!("{api}/v1/volumes"),
        Some(json!({"name": "grow", "size": "64Mi", "numberOfReplicas": 1})),
    );
    assert_eq!(s, 201, "{v}");
    let endpoint = attach(api, "grow", "node-1");
    let (ok, out) = qemu_io(&endpoint, &["write -P 0x3c 60M 4M", "flush"]);
    assert!(ok, "{out}");
    // Attached, it grows online: a new NBD connection sees the new size,
    // and the room past the old end takes data.
    let (ok, out, err) = ballastctl(api, &["volume", "expand", "grow", "--size", "128Mi"]);
    assert!(ok, "{out}{err}");
    let (ok, out) = qemu_io(
        &endpoint,
        &[
            "write -P 0x5d 100M 4M",
            "read -P 0x5d 100M 4M",
            "read -P 0x3c 60M 4M",
        ],
    );
    assert!(ok, "{out}");
    detach(api, "grow");
    let (ok, out, err) = ballastctl(api, &["volume", "expand", "grow", "--size", "192Mi"]);
    assert!(ok, "{out}{err}");
    // Smaller, or not a multiple of 4 KiB: refused, naming the size.
    let (s, v) = call(
        "POST",
        &format!("{api}/v1/volumes/grow/expand"),
        Some(json!({"size": "128Mi"})),
    );
    assert_eq!((s, v["code"].as_str()), (400, Some("out_of_range")), "{v}");
    let (s, v) = call(
        "POST",
        &format!("{api}/v1/volumes/grow/expand"),
        Some(json!({"size": 134_217_729u64})),
    );
    assert_eq!(s, 400, "{v}");
    assert!(v["error"].as_str().unwrap().starts_with("size"), "{v}");
    let endpoint = attach(api, "grow", "node-1");
    let info = std::process::Command::new("qemu-img")
        .args(["info", "--output=json", &endpoint])
        .output()
        .unwrap();
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(info["virtual-size"], 192u64 << 20, "{info}");
    // The old data, and zeros in the new part, which takes writes.
    let (ok, out) = qemu_io(
        &endpoint,
        &[
            "read -P 0x3c 60M 4M",
            "read -P 0x5d 100M 4M",
            "read -P 0 128M 64M",
            "write -P 0x7e 184M 8M",
            "read -P 0x7e 184M 8M",
        ],
    );
    assert!(ok, "{out}");
    detach(api, "grow");
}

/// `ballastctl volume create|update --rebuild-rate N` sets the volume's
/// own rebuild pace; a rate past the highest is refused naming the field,
/// and the volume keeps the rate it had.
#[test]
fn ballastctl_sets_a_volumes_rebuild_rate_and_a_bad_one_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (ctl, _n) = controller_with_one_node(dir.path());
    let api = &ctl.api;
    let rate = |out: &str| {
        let v: serde_json::Value = serde_json::from_str(out).unwrap();
        v["spec"]["replicaRebuildRate"].as_u64()
    };
    let out = ctl_ok(
        api,
        &[
            "-o",
            "json",
            "volume",
            "create",
            "r",
            "--size",
            "64Mi",
            "--replicas",
            "1",
            "--rebuild-rate",
            "40",
        ],
    );
    assert_eq!(rate(&out), Some(40), "{out}");
    let (ok, _, err) = ballastctl(api, &["volume", "update", "r", "--rebuild-rate", "20000"]);
    assert!(!ok && err.contains("replicaRebuildRate"), "{err}");
    let out = ctl_ok(api, &["-o", "json", "volume", "get", "r"]);
    assert_eq!(rate(&out), Some(40), "{out}");
    let out = ctl_ok(
        api,
        &["-o", "json", "volume", "update", "r", "--rebuild-rate", "0"],
    );
    assert_eq!(rate(&out), None, "0 follows the settings: {out}");
}

/// `ballastctl -o yaml` prints what `-o json` does, `volume watch` follows
/// a volume until its replicas are rw, and `completion` writes a shell's
/// completion script.
#[test]
fn ballastctl_prints_yaml_watches_a_volume_and_writes_completions() {
    let dir = tempfile::tempdir().unwrap();
    let (ctl, _n) = controller_with_one_node(dir.path());
    let api = &ctl.api;
    ctl_ok(
        api,
        &["volume", "create", "y", "--size", "64Mi", "--replicas", "1"],
    );
    for args in [
        &["volume", "get", "y"][..],
        &["volume", "list"],
        &["node", "list"],
    ] {
        let as_json: serde_json::Value =
            serde_json::from_str(&ctl_ok(api, &[&["-o", "json"][..], args].concat())).unwrap();
        let as_yaml: serde_json::Value =
            serde_yaml_ng::from_str(&ctl_ok(api, &[&["-o", "yaml"][..], args].concat())).unwrap();
        // Only the heartbeat's time may move between the two calls.
        let strip = |mut v: serde_json::Value| {
            if let Some(items) = v["items"].as_array_mut() {
                for i in items {
                    i["status"]["lastHeartbeat"] = serde_json::Value::Null;
                }
            }
            v
        };
        assert_eq!(strip(as_json), strip(as_yaml), "{args:?}");
    }
    // Detached: done once its replica is there; attached: once it is rw.
    let watch = |want: &str| {
        let (ok, _, progress) = ballastctl(api, &["volume", "watch", "y"]);
        assert!(ok, "{progress}");
        let last = progress.lines().last().unwrap_or_default().to_string();
        assert!(last.ends_with(want), "{progress}");
    };
    watch("1/1 ready");
    attach(api, "y", "node-1");
    watch("1/1 rw");
    detach(api, "y");
    let (ok, _, err) = ballastctl(api, &["volume", "watch", "nope"]);
    assert!(!ok && err.contains("nope"), "{err}");
    for shell in ["bash", "zsh", "fish"] {
        let script = ctl_ok(api, &["completion", shell]);
        assert!(
            script.contains("ballastctl") && script.contains("volume"),
            "{shell}: {script}"
        );
    }
}

/// A node's `--engine-workers` reaches the engines it starts: the engine of
/// a volume attached there runs that many async workers (its status file
/// says how many its runtime has), and serves the volume's data.
#[test]
fn a_nodes_engine_workers_flag_sets_its_engines_async_workers() {
    let dir = tempfile::tempdir().unwrap();
    let (ctl, _nodes) = cluster(dir.path(), "30s", 1, &["--engine-workers", "1"]);
    let api = &ctl.api;
    let (s, v) = call(
        "POST",
        &format!("{api}/v1/volumes"),
        Some(json!({"name": "w1", "size": "64Mi", "numberOfReplicas": 1})),
    );
    assert_eq!(s, 201, "{v}");
    let endpoint = attach(api, "w1", "node-1");
    let status = dir.path().join("node-1/state/frontends/w1.status.json");
    wait_for(Duration::from_secs(30), "the engine's status", || {
        let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&status).ok()?).ok()?;
        s["workers"].as_u64()
    });
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&status).unwrap()).unwrap();
    assert_eq!(s["workers"], 1, "{s}");
    let (ok, out) = qemu_io(
        &endpoint,
        &["write -P 0x3c 0 1M", "write -P 0x4d 32M 4k", "flush"],
    );
    assert!(ok, "{out}");
    let (ok, out) = qemu_io(&endpoint, &["read -P 0x3c 0 1M", "read -P 0x4d 32M 4k"]);
    assert!(ok, "{out}");
}
