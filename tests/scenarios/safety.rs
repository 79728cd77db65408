//! Data safety: the failing sequences of issue 10, each on real processes
//! with data written before and checked by checksum after. A replica that
//! missed acknowledged writes never serves them (salvage is the operator's
//! explicit choice); an expansion that cannot happen changes nothing.

use std::time::Duration;

use ballast::proto::csi::v1::controller_client::ControllerClient;
use ballast::proto::csi::v1::{CapacityRange, ControllerExpandVolumeRequest};
use serde_json::json;

use crate::harness::*;

/// One call to the controller's CSI socket.
fn csi<T, F, Fut>(c: &Cluster, call: F) -> Result<T, tonic::Status>
where
    F: FnOnce(ControllerClient<tonic::transport::Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    runtime().block_on(async {
        let ch = ballast::grpc::unix_channel(&c.ctl.socket).unwrap();
        call(ControllerClient::new(ch))
            .await
            .map(tonic::Response::into_inner)
    })
}

/// The size a replica's files record, read from its directory.
fn replica_size(c: &Cluster, r: &serde_json::Value) -> u64 {
    ballast_node::replica::Replica::open_view(&replica_dir_of(c, r))
        .unwrap()
        .size()
}

fn virtual_size(endpoint: &str) -> u64 {
    let out = qemu("qemu-img", ["info", "--output=json", endpoint]);
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    info["virtual-size"].as_u64().unwrap()
}

#[test]
fn an_expansion_that_cannot_happen_leaves_the_volume_exactly_as_it_was() {
    let mut c = Cluster::start(2, 1);
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 2}));
    let endpoint = c.attach("v", "node-1");
    let data = write_data(c.dir.path(), &endpoint, 5);
    c.ok("POST", "/v1/volumes/v/detach", None);
    let url = c.url("/v1/volumes/v/expand");
    let expand = |size: serde_json::Value| call("POST", &url, Some(json!({ "size": size })));

    // Past what the replica format holds: refused up front, nothing kept.
    for size in ["8Pi", "17Ti"] {
        let (s, v) = expand(json!(size));
        assert_eq!(
            (s, v["code"].as_str()),
            (400, Some("out_of_range")),
            "{size}: {v}"
        );
        assert!(v["error"].as_str().unwrap().starts_with("size"), "{v}");
    }
    // What the disks cannot hold: 422 no_room with each disk's reason.
    let (s, v) = expand(json!("15Ti"));
    assert_eq!((s, v["code"].as_str()), (422, Some("no_room")), "{v}");
    let why = v["error"].as_str().unwrap();
    assert!(
        why.contains("node-1/disk-1") && why.contains("node-2/disk-1"),
        "{why}"
    );
    assert_eq!(c.volume("v")["spec"]["size"], SIZE);

    // A growth that fails half-way, on the replica grown last: the one
    // grown before it goes back, and the size is not recorded.
    let mut reps = c.replicas("v");
    reps.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    let last_node = reps[1]["spec"]["nodeId"].as_str().unwrap().to_string();
    let down = c.node_index(&last_node);
    c.kill_node(down);
    let (s, v) = expand(json!(2 * SIZE));
    assert!(s >= 500 || s == 409 || s == 422, "{s} {v}");
    assert_eq!(c.volume("v")["spec"]["size"], SIZE, "{v}");
    assert_eq!(
        replica_size(&c, &reps[0]),
        SIZE,
        "the grown replica went back"
    );
    c.restart_node(down);
    let endpoint = c.attach("v", "node-1");
    assert_eq!(virtual_size(&endpoint), SIZE);
    verify_data(c.dir.path(), &endpoint, &data);
    wait_for(Duration::from_secs(30), "both replicas rw", || {
        (c.rw_per_node("v").values().sum::<usize>() == 2).then_some(())
    });
    c.ok("POST", "/v1/volumes/v/detach", None);

    // CSI: a size past the format's limit is OUT_OF_RANGE, not INTERNAL.
    let req = ControllerExpandVolumeRequest {
        volume_id: "v".into(),
        capacity_range: Some(CapacityRange {
            required_bytes: i64::MAX,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    let status = csi(&c, |mut ctl| async move {
        ctl.controller_expand_volume(req).await
    })
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");

    // And a growth the disks hold works, with the data kept.
    c.ok(
        "POST",
        "/v1/volumes/v/expand",
        Some(json!({"size": 2 * SIZE})),
    );
    let endpoint = c.attach("v", "node-1");
    assert_eq!(virtual_size(&endpoint), 2 * SIZE);
    let (ok, out) = qemu_io(&endpoint, &["read -P 0 64M 64M"]);
    assert!(ok, "{out}");
    for r in c.replicas("v") {
        assert_eq!(replica_size(&c, &r), 2 * SIZE);
    }
}

/// A two-replica volume on node-2 and node-3, attached at node-1 (which
/// takes no replica), with data `a` written while both were up.
fn two_replicas_on_nodes_2_and_3(c: &Cluster) -> (String, Data) {
    c.patch_node("node-1", json!({"allowScheduling": false}));
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 2}));
    let mut holders = c.holders("v");
    holders.sort();
    assert_eq!(holders, ["node-2", "node-3"]);
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 2, Duration::from_secs(60));
    let a = write_data(c.dir.path(), &endpoint, 11);
    (endpoint, a)
}

/// Node-3 dies; data `b` is written and acknowledged by node-2 alone; the
/// volume is detached; node-2 dies and node-3 comes back.
fn only_the_stale_replica_left(c: &mut Cluster, endpoint: &str) -> Data {
    c.kill_node(2);
    let b = write_data(c.dir.path(), endpoint, 12);
    wait_for(Duration::from_secs(30), "node-3 seen down", || {
        (c.node("node-3")["status"]["ready"] == false).then_some(())
    });
    c.ok("POST", "/v1/volumes/v/detach", None);
    c.kill_node(1);
    c.restart_node(2);
    wait_for(Duration::from_secs(30), "node-2 seen down", || {
        (c.node("node-2")["status"]["ready"] == false).then_some(())
    });
    b
}

fn replica_of(c: &Cluster, node: &str) -> String {
    replica_of_volume_on(c, "v", node)
}

#[test]
fn a_replica_that_missed_acknowledged_writes_never_serves_them() {
    let mut c = Cluster::start(3, 1);
    let (endpoint, _a) = two_replicas_on_nodes_2_and_3(&c);
    let b = only_the_stale_replica_left(&mut c, &endpoint);
    let (fresh, stale) = (replica_of(&c, "node-2"), replica_of(&c, "node-3"));
    let v = c.volume("v");
    assert_eq!(v["status"]["currentReplicas"], json!([fresh]), "{v}");

    // Only the stale replica is reachable: the attach is refused, naming
    // the replica and the node that hold the latest data.
    let (s, v) = call(
        "POST",
        &c.url("/v1/volumes/v/attach"),
        Some(json!({"nodeId": "node-1"})),
    );
    assert_eq!(s, 422, "{v}");
    let why = v["error"].as_str().unwrap();
    assert!(why.contains(&fresh) && why.contains("node-2"), "{why}");
    assert!(!why.contains(&stale), "{why}");
    assert_eq!(c.volume("v")["status"]["robustness"], "faulted");
    assert_eq!(c.volume("v")["status"]["state"], "detached");
    // CSI publish says the same.
    let req = {
        use ballast::proto::csi::v1::ControllerPublishVolumeRequest;
        use ballast::proto::csi::v1::volume_capability::{AccessMode, AccessType, BlockVolume};
        ControllerPublishVolumeRequest {
            volume_id: "v".into(),
            node_id: "node-1".into(),
            volume_capability: Some(ballast::proto::csi::v1::VolumeCapability {
                access_type: Some(AccessType::Block(BlockVolume {})),
                access_mode: Some(AccessMode { mode: 1 }),
            }),
            ..Default::default()
        }
    };
    let status = csi(&c, |mut ctl| async move {
        ctl.controller_publish_volume(req).await
    })
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains(&fresh), "{status:?}");

    // Node-2 is back: the attach serves the acknowledged data, and the
    // stale replica is rebuilt from the fresh one, never the reverse.
    c.restart_node(1);
    let endpoint = c.attach("v", "node-1");
    verify_data(c.dir.path(), &endpoint, &b);
    // The budget covers one failed rebuild and its retry, which waits
    // `reuse::backoff` (60 s) first; the event below says from where.
    c.wait_settled("v", 2, Duration::from_secs(150));
    let rebuilt: Vec<serde_json::Value> = c
        .events(&format!("replica/{stale}"))
        .into_iter()
        .filter(|e| e["reason"] == "ReplicaRebuilt")
        .collect();
    assert!(
        rebuilt
            .last()
            .is_some_and(|e| e["message"].as_str().unwrap().contains(&fresh)),
        "{rebuilt:?}"
    );
    verify_replicas(&c, "v", &b);
    // A detach and attach again changes nothing.
    c.ok("POST", "/v1/volumes/v/detach", None);
    let endpoint = c.attach("v", "node-1");
    verify_data(c.dir.path(), &endpoint, &b);
    verify_replicas(&c, "v", &b);
}

#[test]
fn salvage_accepts_the_stale_replica_only_when_asked_and_says_what_is_lost() {
    let mut c = Cluster::start(3, 1);
    let (endpoint, a) = two_replicas_on_nodes_2_and_3(&c);
    // While the replica with the latest data is reachable, no salvage.
    c.ok("POST", "/v1/volumes/v/detach", None);
    let stale = replica_of(&c, "node-3");
    let (s, v) = call(
        "POST",
        &c.url("/v1/volumes/v/salvage"),
        Some(json!({"replica": stale})),
    );
    assert_eq!(s, 422, "{v}");
    let endpoint = {
        let _ = endpoint;
        c.attach("v", "node-1")
    };
    let b = only_the_stale_replica_left(&mut c, &endpoint);
    let fresh = replica_of(&c, "node-2");
    assert_ne!(a.sum, b.sum);
    let (ok, out, err) = ballastctl(&c.api, &["volume", "salvage", "v", "--replica", &stale]);
    assert!(ok, "{out}{err}");
    assert!(err.contains("lost"), "{err}");
    let salvaged = c.events("volume/v");
    let event = salvaged
        .iter()
        .find(|e| e["reason"] == "VolumeSalvaged")
        .expect("a VolumeSalvaged event");
    assert!(
        event["message"].as_str().unwrap().contains(&fresh),
        "it names what is given up: {event}"
    );
    assert_eq!(c.volume("v")["status"]["currentReplicas"], json!([stale]));
    // The operator accepted it: the volume serves the older data.
    let endpoint = c.attach("v", "node-1");
    verify_data(c.dir.path(), &endpoint, &a);
}

fn kill_pid(pid: i32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

#[test]
fn a_killed_engine_is_started_again_and_io_resumes_at_the_same_endpoint() {
    let c = Cluster::start(3, 1);
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 3}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 3, Duration::from_secs(60));
    let a = write_data(c.dir.path(), &endpoint, 21);
    let state = c.path("node-1").join("state");
    let old = engine_pid(&state, "v").unwrap();
    kill_pid(old);
    // Noticed and started again within seconds, with the gap recorded.
    wait_for(Duration::from_secs(30), "the engine started again", || {
        let reasons = c.event_reasons("volume/v");
        (reasons.contains(&"EngineDown".to_string())
            && reasons.contains(&"EngineRestarted".to_string()))
        .then_some(())
    });
    let new = engine_pid(&state, "v").unwrap();
    assert_ne!(new, old);
    let v = c.volume("v");
    assert_eq!(v["status"]["frontendEndpoint"], endpoint.as_str(), "{v}");
    assert_eq!(v["status"]["state"], "attached");
    verify_data(c.dir.path(), &endpoint, &a);
    let b = write_data(c.dir.path(), &endpoint, 22);
    wait_for(Duration::from_secs(30), "healthy again", || {
        (c.volume("v")["status"]["robustness"] == "healthy").then_some(())
    });
    verify_data(c.dir.path(), &endpoint, &b);
    verify_replicas(&c, "v", &b);

    // Attach on the node of a dead engine starts it again rather than
    // answering with a dead endpoint: what it answers serves at once.
    kill_pid(new);
    let endpoint = c.attach("v", "node-1");
    let (ok, out) = qemu_io(&endpoint, &["read -v 0 4096"]);
    assert!(ok, "{out}");
    verify_data(c.dir.path(), &endpoint, &b);
}

/// An attach repeated at the node the volume is attached at (the CSI
/// attacher publishes again at each of its resyncs) is the same
/// attachment: its engine, running and healthy, stays (its process and
/// the volume's count of attachments, `engineEpoch`), and the I/O through
/// it goes on. (It was counted as a new one, and the node replaced the
/// engine, while a NodeStage might be writing through it.)
#[test]
fn an_attach_repeated_at_the_same_node_keeps_its_engine_and_its_attachment() {
    let c = Cluster::start(2, 1);
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 2}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 2, Duration::from_secs(60));
    let a = write_data(c.dir.path(), &endpoint, 27);
    let state = c.path("node-1").join("state");
    let (pid, epoch) = (
        engine_pid(&state, "v").unwrap(),
        c.volume("v")["status"]["engineEpoch"].clone(),
    );
    for _ in 0..2 {
        assert_eq!(c.attach("v", "node-1"), endpoint);
    }
    assert_eq!(engine_pid(&state, "v"), Some(pid));
    assert_eq!(c.volume("v")["status"]["engineEpoch"], epoch);
    verify_data(c.dir.path(), &endpoint, &a);
    let b = write_data(c.dir.path(), &endpoint, 28);
    verify_data(c.dir.path(), &endpoint, &b);
    c.ok("POST", "/v1/volumes/v/detach", None);
    verify_replicas(&c, "v", &b);
}

/// The arguments process `pid` was started with, after its program.
fn arguments_of(pid: i32) -> Vec<String> {
    let line = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    line.split(|b| *b == 0)
        .skip(1)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// The process listening on the unix socket at `path`, if any.
fn serving_pid(path: &std::path::Path) -> Option<i32> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(ballast_node::engine_host::serving_pid(path))
}

/// A stray engine of the volume (one whose start was abandoned while it
/// waited for its replicas, coming up late), here started by hand as the
/// node started the engine, binds the volume's sockets while the engine
/// serves: it would take the clients' I/O and the node's control. The
/// node's health check finds another process serving the engine's
/// sockets; the controller starts the engine again, the start stops the
/// stray, and the volume goes on, every byte written before still there.
/// (The check was a ping of the control socket, which the stray
/// answered: the stray stayed.)
#[test]
fn a_stray_engine_that_takes_the_volumes_sockets_is_stopped_and_the_volume_goes_on() {
    let c = Cluster::start(2, 1);
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 2}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 2, Duration::from_secs(60));
    let a = write_data(c.dir.path(), &endpoint, 41);
    let state = c.path("node-1").join("state");
    let engine = engine_pid(&state, "v").unwrap();
    let args = arguments_of(engine);
    assert_eq!(args.first().map(String::as_str), Some("engine"), "{args:?}");
    let mut stray = Proc::spawn(&args, c.dir.path().join("stray-engine.log"));
    let sockets = ["v.sock", "v.ctl"].map(|f| state.join("frontends").join(f));
    wait_for_or(
        Duration::from_secs(30),
        "the stray serving the volume",
        || {
            sockets
                .iter()
                .all(|s| serving_pid(s) == Some(stray.pid()))
                .then_some(())
        },
        || {
            let served: Vec<_> = sockets.iter().map(|s| serving_pid(s)).collect();
            format!("{served:?}, the stray's log:\n{}", stray.log_text())
        },
    );

    // Found, and replaced: the stray is stopped, a new engine serves both
    // sockets.
    wait_for(Duration::from_secs(60), "the stray stopped", || {
        stray.wait_exit(Duration::from_millis(100))
    });
    let now = wait_for(Duration::from_secs(60), "the engine started again", || {
        engine_pid(&state, "v").filter(|p| ![engine, stray.pid()].contains(p))
    });
    wait_for(Duration::from_secs(30), "the new engine serving", || {
        sockets
            .iter()
            .all(|s| serving_pid(s) == Some(now))
            .then_some(())
    });
    // Recorded once the start call returned, which may be after the new
    // engine serves.
    wait_for_or(
        Duration::from_secs(30),
        "the restart recorded",
        || {
            c.event_reasons("volume/v")
                .contains(&"EngineRestarted".to_string())
                .then_some(())
        },
        || format!("{:?}", c.event_reasons("volume/v")),
    );
    verify_data(c.dir.path(), &endpoint, &a);
    let b = write_data(c.dir.path(), &endpoint, 42);
    verify_data(c.dir.path(), &endpoint, &b);
    c.ok("POST", "/v1/volumes/v/detach", None);
    verify_replicas(&c, "v", &b);
}

/// The pid of the `ballast controller` child of `ballast local` (`parent`).
fn controller_child(parent: u32) -> Option<i32> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        // pid (comm) state ppid ...
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if ppid == Some(parent) && cmd.split(|b| *b == 0).nth(1) == Some(b"controller") {
            return Some(pid);
        }
    }
    None
}

#[test]
fn ballast_local_keeps_engines_through_a_controller_crash_and_starts_them_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster");
    let local = start_local(&cluster);
    let (port, api) = (local.port, local.api.clone());
    free_space_is_not_the_test(&api);
    let (s, v) = call(
        "POST",
        &format!("{api}/v1/volumes"),
        Some(json!({"name": "v", "size": SIZE, "numberOfReplicas": 2})),
    );
    assert_eq!(s, 201, "{v}");
    let endpoint = attach(&api, "v", "node-1");
    let a = write_data(dir.path(), &endpoint, 31);
    let engine = engine_pid(&cluster.join("node-1/state"), "v").unwrap();

    // The controller dies: the engine goes on serving, and the controller
    // is started again.
    let ctl = controller_child(local.child.id()).expect("the controller process");
    kill_pid(ctl);
    verify_data(dir.path(), &endpoint, &a);
    wait_for(Duration::from_secs(30), "a new controller", || {
        controller_child(local.child.id())
            .filter(|p| *p != ctl)
            .and_then(|_| get_json(&format!("{api}/healthz")))
    });
    assert_eq!(engine_pid(&cluster.join("node-1/state"), "v"), Some(engine));
    let b = write_data(dir.path(), &endpoint, 32);
    let v = get_json(&format!("{api}/v1/volumes/v")).unwrap();
    assert_eq!(v["status"]["state"], "attached", "{v}");

    // A clean stop takes the engines down with the cluster; started again,
    // the volume's engine is started again, with its data.
    stop_with_ctrl_c(local);
    let _local = start_local_at(&cluster, port, &[]).unwrap_or_else(|e| panic!("{e}"));
    wait_for(Duration::from_secs(60), "the engine started again", || {
        let reasons = event_reasons(&api, "volume/v");
        reasons
            .contains(&"EngineRestarted".to_string())
            .then_some(())
    });
    verify_data(dir.path(), &endpoint, &b);
}

/// The checksum of each rw replica's whole content, read from its files.
fn replica_sums(c: &Cluster, volume: &str) -> Vec<(String, String)> {
    c.replicas(volume)
        .into_iter()
        .filter(|r| r["status"]["mode"] == "rw")
        .map(|r| {
            let name = r["name"].as_str().unwrap().to_string();
            let dir = c
                .path(r["spec"]["nodeId"].as_str().unwrap())
                .join(r["spec"]["diskId"].as_str().unwrap())
                .join("replicas")
                .join(&name);
            let replica = ballast_node::replica::Replica::open_view(&dir).unwrap();
            let mut buf = vec![0u8; replica.size() as usize];
            replica.read(0, &mut buf).unwrap();
            (name, blake3::hash(&buf).to_hex().to_string())
        })
        .collect()
}

#[test]
fn an_engine_killed_mid_write_comes_back_with_equal_replicas_and_no_full_copy() {
    let c = Cluster::start(3, 1);
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 3}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 3, Duration::from_secs(60));
    write_data(c.dir.path(), &endpoint, 41);
    let rebuilds_before = c.all_events("ReplicaRebuilt").len();
    // Random 4 KiB writes, 16 in flight, for longer than the test lasts.
    let mut load = std::process::Command::new("qemu-img")
        .args([
            "bench",
            "-w",
            "-f",
            "raw",
            "-t",
            "none",
            "-c",
            "100000000",
            "-d",
            "16",
            "-s",
            "4096",
            "-S",
            "12288",
        ])
        .arg(&endpoint)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let state = c.path("node-1").join("state");
    let engine = engine_pid(&state, "v").unwrap();
    // Writes are going on: the replicas' revisions move.
    let revision = || {
        c.replicas("v")
            .first()
            .map(|r| {
                let dir = c
                    .path(r["spec"]["nodeId"].as_str().unwrap())
                    .join(r["spec"]["diskId"].as_str().unwrap())
                    .join("replicas")
                    .join(r["name"].as_str().unwrap());
                let bytes = std::fs::read(dir.join("revision")).unwrap();
                u64::from_le_bytes(bytes[..8].try_into().unwrap())
            })
            .unwrap()
    };
    let start = revision();
    wait_for(Duration::from_secs(30), "writes in flight", || {
        (revision() > start + 1000).then_some(())
    });
    kill_pid(engine);
    let _ = load.kill();
    let _ = load.wait();
    wait_for(Duration::from_secs(30), "the engine started again", || {
        c.event_reasons("volume/v")
            .contains(&"EngineRestarted".to_string())
            .then_some(())
    });
    wait_for(Duration::from_secs(30), "healthy again", || {
        (c.volume("v")["status"]["robustness"] == "healthy").then_some(())
    });
    // No replica was rebuilt: the writes in flight were caught up.
    assert_eq!(
        c.all_events("ReplicaRebuilt").len(),
        rebuilds_before,
        "{:?}",
        c.all_events("ReplicaRebuilt")
    );
    let log = std::fs::read_to_string(state.join("frontends/v.log")).unwrap();
    assert!(!log.contains("cannot catch up"), "{log}");
    // Every replica holds the same data, and so does the volume.
    c.ok("POST", "/v1/volumes/v/detach", None);
    let sums = replica_sums(&c, "v");
    assert_eq!(sums.len(), 3, "{sums:?}");
    assert!(
        sums.iter().all(|(_, s)| *s == sums[0].1),
        "replicas differ: {sums:?}"
    );
}

/// No action is planned for `volume` over three resync ticks, and it keeps
/// `n` replicas.
fn nothing_planned_for(c: &Cluster, volume: &str, n: usize) {
    for _ in 0..3 {
        let plan = c.ok("GET", "/v1/plan", None);
        let text = plan["actions"].to_string();
        assert!(
            !text.contains(&format!("\"{volume}\"")),
            "planned for {volume}: {plan}"
        );
        assert_eq!(c.replicas(volume).len(), n);
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn a_full_disk_refuses_the_write_keeps_the_data_and_the_volume_comes_back_when_freed() {
    let c = Cluster::start_with(1, 1, Some(256 << 20));
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 1}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 1, Duration::from_secs(60));
    let a = write_data(c.dir.path(), &endpoint, 51);
    let filler = fill_disk(&c.path("node-1").join("disk-1"));
    // 61M..63M holds none of `a`'s extents.
    let (ok, out) = qemu_io(&endpoint, &["write -P 0x5a 61M 2M"]);
    assert!(!ok, "{out}");
    assert!(out.contains("No space left on device"), "{out}");
    // What was acknowledged before reads back; nothing failed or moved.
    let (ok, out) = qemu_io(&endpoint, &["read 0 60M"]);
    assert!(ok, "{out}");
    let v = c.volume("v");
    assert_eq!(v["status"]["robustness"], "healthy", "{v}");
    assert_eq!(c.replicas("v")[0]["status"]["mode"], "rw");
    nothing_planned_for(&c, "v", 1);
    // Space is freed: writes go on.
    std::fs::remove_dir_all(&filler).unwrap();
    let (ok, out) = qemu_io(
        &endpoint,
        &[
            "write -P 0x5a 61M 2M",
            "read -P 0x5a 61M 2M",
            "write -z 61M 2M",
            "flush",
        ],
    );
    assert!(ok, "{out}");
    verify_data(c.dir.path(), &endpoint, &a);
    verify_replicas(&c, "v", &a);
}

/// A volume whose replicas' disks are full attaches again: its data is
/// read, and a write into blocks it holds goes on (the engine's open and
/// the replica's fence need no new room on the disk); so again after its
/// nodes' plugins were killed and started.
#[test]
fn a_volume_on_full_disks_attaches_again_and_reads_its_data() {
    let mut c = Cluster::start_with(2, 1, Some(256 << 20));
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 2}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 2, Duration::from_secs(60));
    let a = write_data(c.dir.path(), &endpoint, 53);
    let fillers = [
        fill_disk(&c.path("node-1").join("disk-1")),
        fill_disk(&c.path("node-2").join("disk-1")),
    ];
    c.ok("POST", "/v1/volumes/v/detach", None);
    let endpoint = c.attach("v", "node-2");
    verify_data(c.dir.path(), &endpoint, &a);
    let v = c.volume("v");
    assert_eq!(
        v["status"]["currentReplicas"].as_array().unwrap().len(),
        2,
        "{v}"
    );
    // Blocks the volume holds are written in place: the same data again.
    write_data(c.dir.path(), &endpoint, 53);
    verify_data(c.dir.path(), &endpoint, &a);
    c.ok("POST", "/v1/volumes/v/detach", None);
    for i in 0..2 {
        c.kill_node(i);
        c.restart_node(i);
    }
    let endpoint = c.attach("v", "node-1");
    verify_data(c.dir.path(), &endpoint, &a);
    let v = c.volume("v");
    assert_eq!(
        v["status"]["currentReplicas"].as_array().unwrap().len(),
        2,
        "{v}"
    );
    for f in fillers {
        std::fs::remove_dir_all(&f).unwrap();
    }
}

#[test]
fn a_full_disk_fails_only_the_replica_on_it() {
    let c = Cluster::start_with(2, 1, Some(256 << 20));
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 2}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 2, Duration::from_secs(60));
    let a = write_data(c.dir.path(), &endpoint, 52);
    let full = c.replica_on("v", "node-2").unwrap()["name"]
        .as_str()
        .unwrap()
        .to_string();
    let filler = fill_disk(&c.path("node-2").join("disk-1"));
    // Into space no data held: the writer sees success, node-1's replica
    // has it.
    let (ok, out) = qemu_io(&endpoint, &["write -P 0x33 61M 2M", "flush"]);
    assert!(ok, "{out}");
    wait_for(
        Duration::from_secs(30),
        "the full disk's replica failed",
        || {
            let reps = c.replicas("v");
            let r = reps.iter().find(|r| r["name"] == full.as_str())?;
            (r["status"]["mode"] == "err" && c.volume("v")["status"]["robustness"] == "degraded")
                .then_some(())
        },
    );
    assert_eq!(
        c.volume("v")["status"]["currentReplicas"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let (ok, out) = qemu_io(&endpoint, &["read -P 0x33 61M 2M"]);
    assert!(ok, "{out}");
    // Space freed: it is reused and the volume is whole again.
    std::fs::remove_dir_all(&filler).unwrap();
    c.wait_settled("v", 2, Duration::from_secs(120));
    let (ok, out) = qemu_io(
        &endpoint,
        &["read -P 0x33 61M 2M", "write -z 61M 2M", "flush"],
    );
    assert!(ok, "{out}");
    verify_data(c.dir.path(), &endpoint, &a);
    verify_replicas(&c, "v", &a);
}

/// A rebuild whose target's disk runs out of room mid-copy (the volume's
/// snapshots hold three times its size; the planner counts its size) fails
/// that target only, with an event that says why: the volume serves on
/// from the replicas it had, and when room is freed the rebuild completes,
/// keeping the layers it had copied whole.
#[test]
fn a_rebuild_that_runs_out_of_room_mid_copy_fails_only_its_target() {
    let c = Cluster::start_with(3, 1, Some(256 << 20));
    c.set("storage-minimal-available-percentage", json!("0"));
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 2}));
    let holders = c.holders("v");
    let endpoint = c.attach("v", &holders[0]);
    c.wait_settled("v", 2, Duration::from_secs(60));
    let e = Expected::new(c.dir.path(), "v", SIZE);
    for (i, pattern) in [0x11u8, 0x22, 0x33].into_iter().enumerate() {
        e.write(&endpoint, 0, 60 << 20, pattern);
        c.ok(
            "POST",
            "/v1/snapshots",
            Some(json!({"name": format!("s{i}"), "volume": "v"})),
        );
    }
    e.write(&endpoint, 4 << 20, 1 << 20, 0x44);
    let a = e.data();
    let spare = ["node-1", "node-2", "node-3"]
        .into_iter()
        .find(|n| !holders.iter().any(|h| h == n))
        .unwrap();
    // Room for the volume's size, not for its 180 MiB of layers.
    let filler = fill_disk(&c.path(spare).join("disk-1"));
    for f in ["0", "1"] {
        std::fs::remove_file(filler.join(f)).unwrap();
    }
    c.ok(
        "PATCH",
        "/v1/volumes/v",
        Some(json!({"numberOfReplicas": 3})),
    );
    let target = wait_for(Duration::from_secs(120), "the copy out of room", || {
        let r = c.replica_on("v", spare)?;
        (r["status"]["mode"] == "err").then(|| r["name"].as_str().unwrap().to_string())
    });
    // Its event says why.
    wait_for(Duration::from_secs(30), "the RebuildFailed event", || {
        c.events(&format!("replica/{target}"))
            .iter()
            .any(|e| {
                e["reason"] == "RebuildFailed"
                    && e["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("No space left on device"))
            })
            .then_some(())
    });
    // The volume serves on from the replicas it had; the failed target
    // waits for room to be reused (its layers copied whole are kept), and
    // nothing is tried on the full disk meanwhile.
    let full = format!("{target}: disk {spare}/disk-1 is full");
    wait_for(Duration::from_secs(30), "the wait for room", || {
        let plan = c.ok("GET", "/v1/plan", None);
        plan["waits"].to_string().contains(&full).then_some(())
    });
    for _ in 0..3 {
        let plan = c.ok("GET", "/v1/plan", None);
        assert_eq!(plan["actions"], json!([]), "{plan}");
        assert!(plan["waits"].to_string().contains(&full), "{plan}");
        let v = c.volume("v");
        assert_eq!(
            v["status"]["currentReplicas"].as_array().unwrap().len(),
            2,
            "{v}"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    for h in &holders {
        assert_eq!(c.replica_on("v", h).unwrap()["status"]["mode"], "rw");
    }
    verify_data(c.dir.path(), &endpoint, &a);
    std::fs::remove_dir_all(&filler).unwrap();
    c.wait_settled("v", 3, Duration::from_secs(120));
    let (_, rebuilt) = c
        .rebuilds()
        .into_iter()
        .find(|(r, _)| *r == format!("replica/{target}"))
        .unwrap();
    assert!(!rebuilt.contains("kept 0 B"), "{rebuilt}");
    verify_data(c.dir.path(), &endpoint, &a);
    verify_replicas(&c, "v", &a);
}

/// The layers of a replica as its files hold them (head last).
fn layers_of(dir: &std::path::Path) -> Vec<ballast_node::replica::LayerInfo> {
    ballast_node::replica::Replica::open_view(dir)
        .unwrap()
        .layers()
}

/// Where write_data(seed) put its first extent.
fn first_extent(seed: u64) -> u64 {
    (seed % 3) << 20
}

#[test]
fn a_corrupt_block_in_a_head_is_served_from_another_replica_and_repaired_in_place() {
    let c = Cluster::start(3, 1);
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 3}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 3, Duration::from_secs(60));
    let a = write_data(c.dir.path(), &endpoint, 61);
    // Node-1's replica (the local one, read first) goes bad under its data.
    let local = c.replica_on("v", "node-1").unwrap();
    let dir = replica_dir_of(&c, &local);
    let head = layers_of(&dir).last().unwrap().name.clone();
    flip_block(&dir.join(&head), first_extent(61)).unwrap();
    let before = ballast_node::replica::Replica::open_view(&dir).unwrap();
    let mut block = vec![0u8; 4096];
    assert!(
        before.read(first_extent(61), &mut block).is_err(),
        "the block fails its checksum"
    );
    // Every read still returns the written data, from another replica.
    verify_data(c.dir.path(), &endpoint, &a);
    // The bad block was written back from the others: the replica was
    // never dropped, and holds the data sound itself.
    let name = local["name"].as_str().unwrap().to_string();
    let changed: Vec<String> = c
        .events("volume/v")
        .iter()
        .filter(|e| e["reason"] == "ReplicaSetChanged")
        .map(|e| e["message"].as_str().unwrap().to_string())
        .collect();
    assert!(
        !changed
            .iter()
            .any(|m| m.contains(&format!("{name} dropped"))),
        "{changed:?}"
    );
    c.wait_settled("v", 3, Duration::from_secs(120));
    assert!(
        c.replicas("v").iter().any(|r| r["name"] == name.as_str()),
        "{name} kept"
    );
    verify_data(c.dir.path(), &endpoint, &a);
    verify_replicas(&c, "v", &a);
}

#[test]
fn a_corrupt_frozen_layer_is_never_a_rebuild_source_and_the_volume_heals() {
    let c = Cluster::start(3, 1);
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 2}));
    let mut holders = c.holders("v");
    holders.sort();
    let endpoint = c.attach("v", &holders[0]);
    c.wait_settled("v", 2, Duration::from_secs(60));
    let a = write_data(c.dir.path(), &endpoint, 62);
    // A third replica: its rebuild freezes the data into a layer everywhere.
    c.ok(
        "PATCH",
        "/v1/volumes/v",
        Some(json!({"numberOfReplicas": 3})),
    );
    c.wait_settled("v", 3, Duration::from_secs(120));
    // Each replica's first scrub is over: none will find the bad block
    // below before the rebuild does.
    wait_for(Duration::from_secs(120), "every replica scrubbed", || {
        c.replicas("v")
            .iter()
            .all(|r| r["status"]["scrubbedAt"].is_string())
            .then_some(())
    });
    // The replica first by name goes bad in its frozen layer, and the
    // last is deleted: the rebuild that replaces it has no replica on its
    // target's node to prefer, so it takes the first by name of those
    // that agree on their layers' checksums, the bad one. The volume is
    // served from the other, which no read of the bad block touches.
    let mut by_name = c.replicas("v");
    by_name.sort_by(|x, y| x["name"].as_str().cmp(&y["name"].as_str()));
    let (bad, sound, other) = (&by_name[0], &by_name[1], &by_name[2]);
    let sound_node = sound["spec"]["nodeId"].as_str().unwrap();
    let endpoint = if sound_node == holders[0] {
        endpoint
    } else {
        c.ok("POST", "/v1/volumes/v/detach", None);
        c.attach("v", sound_node)
    };
    c.wait_settled("v", 3, Duration::from_secs(120));
    let dir = replica_dir_of(&c, bad);
    let frozen = layers_of(&dir)
        .into_iter()
        .rfind(|l| l.checksum.is_some() && l.allocated > 0)
        .unwrap();
    flip_block(&dir.join(&frozen.name), first_extent(62)).unwrap();
    c.ok(
        "DELETE",
        &format!("/v1/replicas/{}", other["name"].as_str().unwrap()),
        None,
    );
    verify_data(c.dir.path(), &endpoint, &a);
    c.wait_settled("v", 3, Duration::from_secs(180));
    verify_data(c.dir.path(), &endpoint, &a);
    verify_replicas(&c, "v", &a);
    // The bad source was found as it was copied, once (its engine's event
    // says so). No rebuild failed over and over: the controller's calls
    // failed at most twice besides.
    let failed = c.all_events("RebuildFailed");
    let (found, calls): (Vec<&serde_json::Value>, Vec<&serde_json::Value>) =
        failed.iter().partition(|e| {
            e["message"].as_str().is_some_and(|m| {
                m.starts_with("by its engine: ") && m.contains("the source is corrupt")
            })
        });
    assert_eq!(found.len(), 1, "{failed:?}");
    assert!(calls.len() <= 2, "{} failed calls: {failed:?}", calls.len());
}

#[test]
fn a_scrub_finds_a_corrupt_frozen_layer_nobody_read_and_the_replica_is_rebuilt() {
    let c = Cluster::start(3, 1);
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 2}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 2, Duration::from_secs(60));
    let a = write_data(c.dir.path(), &endpoint, 63);
    c.ok(
        "PATCH",
        "/v1/volumes/v",
        Some(json!({"numberOfReplicas": 3})),
    );
    c.wait_settled("v", 3, Duration::from_secs(120));
    c.ok("POST", "/v1/volumes/v/detach", None);
    // Each replica was scrubbed once when it was new; all sound so far.
    let victim = c.replicas("v")[0].clone();
    let name = victim["name"].as_str().unwrap().to_string();
    let (ok, out, err) = ballastctl(&c.api, &["replica", "scrub", &name]);
    assert!(ok && out.contains("sound"), "{out}{err}");
    let dir = replica_dir_of(&c, &victim);
    let frozen = layers_of(&dir)
        .into_iter()
        .rfind(|l| l.checksum.is_some() && l.allocated > 0)
        .unwrap();
    flip_block(&dir.join(&frozen.name), first_extent(63)).unwrap();
    let (ok, out, err) = ballastctl(&c.api, &["replica", "scrub", &name]);
    assert!(ok && out.contains("corrupt"), "{out}{err}");
    assert!(
        c.event_reasons(&format!("replica/{name}"))
            .contains(&"ReplicaCorrupt".to_string())
    );
    let v = c.volume("v");
    assert!(
        !v["status"]["currentReplicas"]
            .as_array()
            .unwrap()
            .contains(&json!(name)),
        "{v}"
    );
    // Rebuilt (offline) from a good replica: every replica holds the data.
    c.wait_settled("v", 3, Duration::from_secs(180));
    verify_replicas(&c, "v", &a);
    let endpoint = c.attach("v", "node-1");
    verify_data(c.dir.path(), &endpoint, &a);
}

/// Volume `v` of one replica, attached on its node and written by qemu-io
/// command `write`, then given a second replica, whose rebuild freezes
/// the data into a layer in both: the first replica's node and the NBD
/// endpoint there.
fn written_then_frozen(c: &Cluster, write: &str) -> (String, String) {
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 1}));
    let holder = c.holders("v")[0].clone();
    let endpoint = c.attach("v", &holder);
    c.wait_settled("v", 1, Duration::from_secs(60));
    let (ok, out) = qemu_io(&endpoint, &[write, "flush"]);
    assert!(ok, "{out}");
    c.ok(
        "PATCH",
        "/v1/volumes/v",
        Some(json!({"numberOfReplicas": 2})),
    );
    c.wait_settled("v", 2, Duration::from_secs(120));
    (holder, endpoint)
}

/// A scrub lasts as long as reading the replica's frozen layers at
/// `replica-scrub-rate` takes, and is waited for: 16 MiB at 1 MiB/s here.
/// Before, the controller called the node over a channel that cuts every
/// call at 10 s, so a scrub of more than 640 MiB at the default 64 MiB/s
/// never ended (nor was recorded) and the periodic scrub began it again.
#[test]
fn a_scrub_longer_than_an_agent_call_is_waited_for_and_finds_a_bad_block() {
    let c = Cluster::start(2, 1);
    c.set("replica-scrub-rate", json!(1));
    let (holder, _) = written_then_frozen(&c, "write -P 0x5c 0 16M");
    c.ok("POST", "/v1/volumes/v/detach", None);
    let victim = c.replica_on("v", &holder).unwrap();
    let name = victim["name"].as_str().unwrap().to_string();
    let asked = std::time::Instant::now();
    let (ok, out, err) = ballastctl(&c.api, &["replica", "scrub", &name]);
    assert!(ok && out.contains("sound"), "{out}{err}");
    assert!(
        asked.elapsed() >= Duration::from_secs(15),
        "16 MiB read at 1 MiB/s in {:?}",
        asked.elapsed()
    );
    let dir = replica_dir_of(&c, &victim);
    let frozen = layers_of(&dir)
        .into_iter()
        .rfind(|l| l.checksum.is_some() && l.allocated > 0)
        .unwrap();
    flip_block(&dir.join(&frozen.name), 15 << 20).unwrap();
    let (ok, out, err) = ballastctl(&c.api, &["replica", "scrub", &name]);
    assert!(ok && out.contains("corrupt"), "{out}{err}");
    assert!(
        c.event_reasons(&format!("replica/{name}"))
            .contains(&"ReplicaCorrupt".to_string())
    );
}

/// A volume whose node died is detached all the same and attached on
/// another node. The engine left running on the dead node's machine is
/// fenced out at the replicas: a write through it is never acknowledged.
/// Once the node is back its engine is stopped and its replica rebuilt,
/// and the data reads back throughout.
#[test]
fn a_volume_whose_node_died_moves_and_the_engine_left_behind_is_fenced_then_stopped() {
    let mut c = Cluster::start(3, 1);
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 3}));
    let old = c.attach("v", "node-1");
    c.wait_settled("v", 3, Duration::from_secs(60));
    let a = write_data(c.dir.path(), &old, 71);
    // The node plugin dies; its engine, a process of its own, goes on.
    let i = c.node_index("node-1");
    c.kill_node(i);
    wait_for(Duration::from_secs(30), "node-1 down", || {
        (node(&c.api, "node-1").unwrap()["status"]["ready"] == false).then_some(())
    });
    c.ok("POST", "/v1/volumes/v/detach", None);
    let detached = c.events("volume/v");
    assert!(
        detached.iter().any(|e| e["reason"] == "VolumeDetached"
            && e["message"]
                .as_str()
                .unwrap_or_default()
                .contains("which is down")),
        "{detached:?}"
    );
    let new = c.attach("v", "node-2");
    verify_data(c.dir.path(), &new, &a);

    // The engine left behind reaches the replicas on node-2 and node-3,
    // which the new engine opened for a later attachment.
    let (ok, out) = qemu_io(&old, &["write -P 0x5a 0 64k", "flush"]);
    assert!(
        !ok,
        "a write through the engine left behind was acknowledged: {out}"
    );
    // None of it reached a replica the new engine serves.
    verify_data(c.dir.path(), &new, &a);
    verify_replicas(&c, "v", &a);
    let b = write_data(c.dir.path(), &new, 72);

    // node-1 is back: the engine left there is stopped, and its replica,
    // out of the record since, is rebuilt.
    c.restart_node(i);
    wait_for(
        Duration::from_secs(60),
        "the engine left behind stopped",
        || {
            c.event_reasons("volume/v")
                .contains(&"StrayEngineStopped".to_string())
                .then_some(())
        },
    );
    c.wait_settled("v", 3, Duration::from_secs(120));
    verify_data(c.dir.path(), &new, &b);
    c.ok("POST", "/v1/volumes/v/detach", None);
    verify_replicas(&c, "v", &b);
}

/// A replica whose node was down when its volume detached keeps the fence
/// of the attachment that ended: once the node is back, the controller
/// raises it to the volume's count at the node's heartbeat, so the old
/// engine's credentials change nothing there, while no engine has opened
/// the replica since. The data reads back from every replica.
#[test]
fn a_replica_whose_node_was_down_at_the_detach_is_fenced_when_the_node_is_back() {
    use ballast_node::wire::client::ReplicaClient;
    use ballast_node::wire::protocol::status;
    let mut c = Cluster::start(3, 1);
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 3}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 3, Duration::from_secs(60));
    let a = write_data(c.dir.path(), &endpoint, 73);
    let on_3 = c
        .replicas("v")
        .into_iter()
        .find(|r| r["spec"]["nodeId"] == "node-3")
        .unwrap();
    let name = on_3["name"].as_str().unwrap().to_string();
    let dir = replica_dir_of(&c, &on_3);
    let fence = || ballast_node::replica::read_fence(&dir).unwrap();

    let i = c.node_index("node-3");
    c.kill_node(i);
    wait_for(Duration::from_secs(30), "node-3 down", || {
        (node(&c.api, "node-3").unwrap()["status"]["ready"] == false).then_some(())
    });
    c.ok("POST", "/v1/volumes/v/detach", None);
    let count = c.volume("v")["status"]["engineEpoch"].as_u64().unwrap();
    assert_eq!(count, 2, "one attachment, and its end");
    assert_eq!(fence(), 1, "the detach could not reach node-3");

    c.restart_node(i);
    wait_for(
        Duration::from_secs(60),
        "node-3's replica fenced at the volume's count",
        || (fence() == count).then_some(()),
    );
    let addr = c.node("node-3")["status"]["replicaEndpoint"]
        .as_str()
        .unwrap()
        .to_string();
    let first = engine_wire_as(c.dir.path(), "v", "node-1", 1);
    let refused = runtime()
        .block_on(ReplicaClient::dial(&first, &addr, &name))
        .err()
        .unwrap();
    assert_eq!(refusal(&refused), status::FENCED, "{refused}");

    let endpoint = c.attach("v", "node-1");
    verify_data(c.dir.path(), &endpoint, &a);
    c.wait_settled("v", 3, Duration::from_secs(120));
    c.ok("POST", "/v1/volumes/v/detach", None);
    verify_replicas(&c, "v", &a);
}

/// A volume can hold data that no engine ever reported: one restored from
/// a snapshot and never attached, or one written and detached between two
/// heartbeats. A replica added to it is filled from the others, never made
/// empty and counted as holding the latest data: with only the new
/// replica's node up, the volume serves the restored data from it. An
/// attach records its replicas as holding data before it hands out the
/// endpoint.
#[test]
fn a_replica_added_to_a_volume_no_engine_reported_is_filled_not_made_empty() {
    let mut c = Cluster::start(3, 1);
    c.patch_node("node-1", json!({"allowScheduling": false}));
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 2}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 2, Duration::from_secs(60));
    let a = write_data(c.dir.path(), &endpoint, 31);
    c.ok(
        "POST",
        "/v1/snapshots",
        Some(json!({"name": "s", "volume": "v"})),
    );
    c.ok("POST", "/v1/volumes/v/detach", None);

    // Before any write can reach it, a new attachment's replicas say they
    // may hold data (no heartbeat has seen the engine yet).
    c.create_volume(json!({"name": "w", "size": SIZE, "numberOfReplicas": 2}));
    c.attach("w", "node-1");
    for r in c.replicas("w") {
        assert!(r["spec"]["healthyAt"].is_string(), "{r:#}");
        assert_eq!(r["status"]["mode"], "rw", "{r:#}");
    }

    c.create_volume(json!({"name": "r", "size": SIZE, "numberOfReplicas": 2,
                           "source": {"snapshot": "s"}}));
    for r in c.replicas("r") {
        assert!(r["spec"]["healthyAt"].is_string(), "{r:#}");
    }
    // A third replica, on node-1: filled from the restored ones.
    c.patch_node("node-1", json!({"allowScheduling": true}));
    c.ok(
        "PATCH",
        "/v1/volumes/r",
        Some(json!({"numberOfReplicas": 3})),
    );
    c.wait_settled("r", 3, Duration::from_secs(90));
    let added = replica_of_volume_on(&c, "r", "node-1");
    assert!(
        c.events(&format!("replica/{added}"))
            .iter()
            .any(|e| e["reason"] == "ReplicaRebuilt"),
        "{:#?}",
        c.events(&format!("replica/{added}"))
    );
    verify_replicas(&c, "r", &a);

    // Only the added replica's node is up: it serves the restored data.
    c.kill_node(1);
    c.kill_node(2);
    wait_for(
        Duration::from_secs(30),
        "node-2 and node-3 seen down",
        || {
            (c.node("node-2")["status"]["ready"] == false
                && c.node("node-3")["status"]["ready"] == false)
                .then_some(())
        },
    );
    let endpoint = c.attach("r", "node-1");
    verify_data(c.dir.path(), &endpoint, &a);
}

fn replica_of_volume_on(c: &Cluster, volume: &str, node: &str) -> String {
    c.replica_on(volume, node).unwrap()["name"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A block goes bad in the frozen layer of the last replica that holds a
/// volume, and the other replica is replaced by a new one: no replica
/// holds the block sound. The first rebuild fails on it, the engine gives
/// the block up as lost, and a rebuild then completes: the volume has both
/// its replicas again, where before it stayed at one for good. The block
/// fails its reads (EIO), every other byte reads back as written, through
/// NBD and from each replica's files, and written again it is sound.
#[test]
fn a_block_no_replica_holds_sound_is_lost_alone_and_the_volume_gets_its_replicas_back() {
    let c = Cluster::start(3, 1);
    let lost = 1u64 << 20;
    let gone = lost_in_the_last(&c, false, &[lost]);
    lost_alone(&c, &gone.endpoint, &[lost]);
}

/// What `lost_in_the_last` leaves.
struct LostInTheLast {
    /// The node of the last replica, and the volume's NBD endpoint there
    /// (while it is attached).
    holder: String,
    endpoint: String,
    /// The last replica's name and its frozen layer as it was.
    name: String,
    frozen: ballast_node::replica::LayerInfo,
}

/// Volume `v` of one replica, 4 MiB of 0x5a written, then a second
/// replica (its rebuild freezes the data into a layer in both). With
/// `detach`, each replica's first scrub over (none finds the bad blocks
/// before a copy does), the volume is detached. The blocks at `lost` go
/// bad in the first replica's frozen layer, and the other replica is
/// deleted: the volume gets its second replica back, from the first
/// (the last holding the data), with those blocks recorded lost in its
/// layer, whose checksum was taken again.
fn lost_in_the_last(c: &Cluster, detach: bool, lost: &[u64]) -> LostInTheLast {
    let (holder, endpoint) = written_then_frozen(c, "write -P 0x5a 0 4M");
    if detach {
        wait_for(Duration::from_secs(120), "every replica scrubbed", || {
            c.replicas("v")
                .iter()
                .all(|r| r["status"]["scrubbedAt"].is_string())
                .then_some(())
        });
        c.ok("POST", "/v1/volumes/v/detach", None);
    }
    let local = c.replica_on("v", &holder).unwrap();
    let dir = replica_dir_of(c, &local);
    let frozen = layers_of(&dir)
        .into_iter()
        .rfind(|l| l.checksum.is_some() && l.allocated > 0)
        .unwrap();
    for at in lost {
        flip_block(&dir.join(&frozen.name), *at).unwrap();
    }
    let other = c
        .replicas("v")
        .into_iter()
        .find(|r| r["name"] != local["name"])
        .unwrap();
    c.ok(
        "DELETE",
        &format!("/v1/replicas/{}", other["name"].as_str().unwrap()),
        None,
    );
    wait_for(Duration::from_secs(60), "the replica replaced", || {
        let names: Vec<serde_json::Value> =
            c.replicas("v").iter().map(|r| r["name"].clone()).collect();
        (!names.contains(&other["name"])).then_some(())
    });
    c.wait_settled("v", 2, Duration::from_secs(180));
    let layer = layers_of(&dir)
        .into_iter()
        .find(|l| l.name == frozen.name)
        .unwrap();
    let want: Vec<u64> = lost.iter().map(|at| at / 4096).collect();
    assert_eq!(layer.lost, want, "recorded lost in its layer");
    assert_ne!(layer.checksum, frozen.checksum, "its checksum taken again");
    LostInTheLast {
        holder,
        endpoint,
        name: local["name"].as_str().unwrap().to_string(),
        frozen,
    }
}

/// 4 MiB of 0x5a were written to volume `v` (at `endpoint`), and the
/// blocks at `lost` (ascending) were given up as lost: each fails its
/// reads, through NBD and from the files of each of its 2 rw replicas,
/// every other byte reads back as written, and written again each block
/// is sound.
fn lost_alone(c: &Cluster, endpoint: &str, lost: &[u64]) {
    const END: u64 = 4 << 20;
    // The runs of the 4 MiB between the lost blocks.
    let mut rest = Vec::new();
    let mut from = 0;
    for at in lost.iter().copied().chain([END]) {
        if at > from {
            rest.push((from, at - from));
        }
        from = at + 4096;
    }
    for at in lost {
        let (ok, out) = qemu_io(endpoint, &[&format!("read {at} 4k")]);
        assert!(!ok, "the lost block at {at} fails its read: {out}");
    }
    let reads: Vec<String> = rest
        .iter()
        .map(|(at, n)| format!("read -P 0x5a {at} {n}"))
        .collect();
    let reads: Vec<&str> = reads.iter().map(String::as_str).collect();
    let (ok, out) = qemu_io(endpoint, &reads);
    assert!(ok, "every other byte as written: {out}");
    let rw: Vec<_> = c
        .replicas("v")
        .into_iter()
        .filter(|r| r["status"]["mode"] == "rw")
        .collect();
    assert_eq!(rw.len(), 2, "{rw:?}");
    for r in &rw {
        let replica = ballast_node::replica::Replica::open_view(&replica_dir_of(c, r)).unwrap();
        let name = r["name"].as_str().unwrap();
        let mut block = vec![0u8; 4096];
        for at in lost {
            let e = replica.read(*at, &mut block).unwrap_err();
            assert!(e.to_string().contains("lost"), "{name} at {at}: {e}");
        }
        for (at, n) in &rest {
            let mut data = vec![0u8; *n as usize];
            replica.read(*at, &mut data).unwrap();
            assert!(
                data.iter().all(|b| *b == 0x5a),
                "{name}: {n} B at {at} as written"
            );
        }
    }
    for at in lost {
        let again = [
            format!("write -P 0x77 {at} 4k"),
            format!("read -P 0x77 {at} 4k"),
        ];
        let (ok, out) = qemu_io(endpoint, &[&again[0], &again[1]]);
        assert!(ok, "written again, the block at {at} is sound: {out}");
    }
}

/// The test above with the volume detached: no engine runs, and the
/// controller has the new replica's node copy from the last replica
/// holding the data (offline). Its first copy fails on the bad block; the
/// controller has the last replica give the block up as lost (two more
/// gone bad in the same layer go with it), and the copy completes. Before,
/// every copy failed on the block, and the volume never got its second
/// replica back while it stayed detached (a drain of the node would have
/// waited for ever).
#[test]
fn a_detached_volumes_block_no_replica_holds_sound_is_lost_alone_and_the_copy_completes() {
    let c = Cluster::start(3, 1);
    let lost = [1u64 << 20, (1 << 20) + 8 * 4096, 3 << 20];
    let gone = lost_in_the_last(&c, true, &lost);
    // Said where, once; the last replica was never failed for it.
    let said = c.events(&format!("replica/{}", gone.name));
    let lost_events: Vec<_> = said
        .iter()
        .filter(|e| e["reason"] == "BlocksLost")
        .collect();
    assert_eq!(lost_events.len(), 1, "{said:#?}");
    let message = lost_events[0]["message"].as_str().unwrap();
    assert!(
        message.starts_with("3 block(s)") && message.contains(&gone.frozen.name),
        "{message}"
    );
    assert!(
        !said.iter().any(|e| e["reason"] == "ReplicaCorrupt"),
        "{said:#?}"
    );
    let endpoint = c.attach("v", &gone.holder);
    c.wait_settled("v", 2, Duration::from_secs(60));
    lost_alone(&c, &endpoint, &lost);
}

/// A replica whose node freezes (SIGSTOP: its connections stay open and
/// nothing answers, as a hung process or a network that drops packets
/// leaves them) is given up after `engine-replica-timeout`: the writes go
/// on with the other two, the replica is failed in the store with why, and
/// once its node is thawed it is rebuilt or reused. Every write reads
/// back, from the volume and from each replica. Before, the writes waited
/// for the frozen replica for as long as it stayed frozen, with the
/// volume reported healthy.
#[test]
fn a_frozen_replica_node_is_given_up_after_the_replica_timeout_and_the_writes_go_on() {
    let c = Cluster::start(3, 1);
    // Not the default (8): the engine is started with the setting's value.
    c.set("engine-replica-timeout", json!("9"));
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 3}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 3, Duration::from_secs(60));
    let engine = engine_pid(&c.path("node-1").join("state"), "v").unwrap();
    let args = arguments_of(engine);
    assert!(
        args.windows(2).any(|w| w == ["--replica-timeout", "9"]),
        "{args:?}"
    );
    write_data(c.dir.path(), &endpoint, 41);
    let frozen = replica_of(&c, "node-3");

    c.nodes[2].proc.signal(nix::sys::signal::Signal::SIGSTOP);
    let b = write_data(c.dir.path(), &endpoint, 42);
    wait_for(Duration::from_secs(30), "the frozen replica failed", || {
        c.replicas("v")
            .into_iter()
            .find(|r| r["name"] == frozen.as_str() && r["status"]["mode"] == "err")
    });
    let events = c.events("volume/v");
    assert!(
        events.iter().any(|e| e["reason"] == "ReplicaSetChanged"
            && e["message"]
                .as_str()
                .is_some_and(|m| m.contains("no answer for"))),
        "no event says why the replica was given up: {events:?}"
    );
    verify_data(c.dir.path(), &endpoint, &b);

    c.nodes[2].proc.signal(nix::sys::signal::Signal::SIGCONT);
    c.wait_settled("v", 3, Duration::from_secs(180));
    verify_data(c.dir.path(), &endpoint, &b);
    verify_replicas(&c, "v", &b);
}

/// A replica's node freezes under an idle volume: the engine, which
/// pings each replica with nothing asked of it, gives it up after
/// `engine-replica-timeout` (the `ReplicaSetChanged` event says so), and
/// the controller has a replica built on the spare node. Before, an idle
/// engine saw nothing amiss until a write came, and the volume showed
/// healthy with a frozen node; and a rebuild asked meanwhile chose its
/// source by asking the frozen replica for its layers, and waited for as
/// long as its node stayed frozen. Thawed, the frozen node's replica
/// stays failed and the volume goes on with the three others, each
/// holding every byte.
#[test]
fn a_replica_node_frozen_under_an_idle_volume_is_replaced() {
    let c = Cluster::start(4, 1);
    c.set("replica-replenishment-wait-interval", json!(0));
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 3}));
    let mut holders = c.holders("v");
    holders.sort();
    let endpoint = c.attach("v", &holders[0]);
    c.wait_settled("v", 3, Duration::from_secs(60));
    let a = write_data(c.dir.path(), &endpoint, 43);
    let frozen = &holders[1];
    let spare = ["node-1", "node-2", "node-3", "node-4"]
        .into_iter()
        .find(|n| !holders.iter().any(|h| h == n))
        .unwrap();
    let i = c.nodes.iter().position(|n| n.id == *frozen).unwrap();
    let _thaw = Thaw(vec![c.nodes[i].proc.pid()]);

    c.nodes[i].proc.signal(nix::sys::signal::Signal::SIGSTOP);
    wait_for_or(
        Duration::from_secs(180),
        "a replica built on the spare node",
        || {
            c.replica_on("v", spare)
                .filter(|r| r["status"]["mode"] == "rw" && r["status"]["running"] == true)
        },
        || format!("{:#?}\n{:#?}", c.replicas("v"), c.events("volume/v")),
    );
    verify_data(c.dir.path(), &endpoint, &a);

    // Thawed, its replica stays failed (a stale copy, kept for reuse
    // until the volume's stale replica timeout); the three others take
    // the writes.
    c.nodes[i].proc.signal(nix::sys::signal::Signal::SIGCONT);
    let b = write_data(c.dir.path(), &endpoint, 44);
    verify_data(c.dir.path(), &endpoint, &b);
    let rw = c.rw_per_node("v");
    assert!(rw.len() == 3 && !rw.contains_key(frozen), "{rw:?}");
    verify_replicas(&c, "v", &b);
}

/// A controller started again does not take its store's word that a node
/// is down before that node could have beaten. Node-2 holds the only
/// replica of `v` (attached at node-1) and of `w` (attached at node-2); it
/// freezes and is marked down; the controller is killed and started again
/// (with a node-down timeout of 20 s: heartbeats every 5 s, a grace of
/// 10 s) while node-2 is still frozen; both attaches are asked, and node-2
/// thaws 300 ms later. Each attach waits for node-2's first heartbeat and
/// goes ahead: the data reads back, and neither volume was faulted or told
/// VolumeFaulted. Before, both were refused at once (node-2 not ready), and
/// `v` was marked faulted with a VolumeFaulted event for a node that was
/// back a second later.
#[test]
fn a_controller_started_again_waits_for_a_nodes_first_heartbeat_before_it_faults_a_volume() {
    let mut c = Cluster::start(2, 1);
    c.patch_node("node-1", json!({"allowScheduling": false}));
    let mut data = Vec::new();
    for (volume, at, seed) in [("v", "node-1", 61), ("w", "node-2", 62)] {
        c.create_volume(json!({"name": volume, "size": SIZE, "numberOfReplicas": 1}));
        assert_eq!(c.holders(volume), ["node-2"]);
        let endpoint = c.attach(volume, at);
        data.push(write_data(c.dir.path(), &endpoint, seed));
        c.ok("POST", &format!("/v1/volumes/{volume}/detach"), None);
    }

    c.nodes[1].proc.signal(nix::sys::signal::Signal::SIGSTOP);
    wait_for(Duration::from_secs(30), "node-2 seen down", || {
        (c.node("node-2")["status"]["ready"] == false).then_some(())
    });
    c.ctl.proc.signal(nix::sys::signal::Signal::SIGKILL);
    c.ctl.proc.wait_exit(Duration::from_secs(10));
    let at = c
        .ctl
        .args
        .iter()
        .position(|a| a == "--node-down-timeout")
        .unwrap();
    c.ctl.args[at + 1] = "20s".into();
    c.ctl.restart();
    assert_eq!(c.node("node-2")["status"]["ready"], false, "still frozen");

    let endpoints: Vec<String> = std::thread::scope(|s| {
        let c = &c;
        let attaches: Vec<_> = [("v", "node-1"), ("w", "node-2")]
            .into_iter()
            .map(|(volume, at)| s.spawn(move || c.attach(volume, at)))
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        c.nodes[1].proc.signal(nix::sys::signal::Signal::SIGCONT);
        attaches.into_iter().map(|a| a.join().unwrap()).collect()
    });
    for ((volume, endpoint), data) in ["v", "w"].iter().zip(&endpoints).zip(&data) {
        verify_data(c.dir.path(), endpoint, data);
        assert_ne!(c.volume(volume)["status"]["robustness"], "faulted");
        let reasons = c.event_reasons(&format!("volume/{volume}"));
        assert!(
            !reasons.iter().any(|r| r == "VolumeFaulted"),
            "{volume}: {reasons:?}"
        );
    }
    let log = std::fs::read_to_string(&c.ctl.proc.log).unwrap();
    assert!(
        log.contains("waiting for the first heartbeats"),
        "the attaches did not wait for node-2: was it heard before them?"
    );
}

/// A snapshot that no replica has room for fails, and says so; every
/// replica stays as it was and the volume serves on. Before 2026-12-05
/// the engine failed each replica whose freeze found no room, the last
/// one too: the snapshot was refused with "no replica is usable" and
/// every read of the volume failed (EIO) until it was attached again.
#[test]
fn a_snapshot_with_no_room_on_any_replica_fails_and_the_volume_serves_on() {
    let c = Cluster::start_with(2, 1, Some(256 << 20));
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 2}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 2, Duration::from_secs(60));
    let a = write_data(c.dir.path(), &endpoint, 54);
    let fillers = [
        fill_disk(&c.path("node-1").join("disk-1")),
        fill_disk(&c.path("node-2").join("disk-1")),
    ];
    let (s, v) = call(
        "POST",
        &c.url("/v1/snapshots"),
        Some(json!({"name": "s1", "volume": "v"})),
    );
    assert_eq!(s, 503, "{v}");
    let why = v["error"].as_str().unwrap_or_default();
    assert!(why.contains("No space left on device"), "{v}");
    verify_data(c.dir.path(), &endpoint, &a);
    let v = c.volume("v");
    assert_eq!(v["status"]["robustness"], "healthy", "{v}");
    for r in c.replicas("v") {
        assert_eq!(r["status"]["mode"], "rw", "{r}");
    }
    // Space freed: the snapshot is taken, and the data is as it was.
    for f in fillers {
        std::fs::remove_dir_all(&f).unwrap();
    }
    c.ok(
        "POST",
        "/v1/snapshots",
        Some(json!({"name": "s1", "volume": "v"})),
    );
    verify_data(c.dir.path(), &endpoint, &a);
    verify_replicas(&c, "v", &a);
}

/// A rebuild's start is waited for as long as its freeze takes: the
/// engine freezes the heads (reading each whole) before the new replica
/// joins. Here the disk of the one replica, beside the engine, hangs for
/// 16 s under the freeze (fsfreeze) as a second replica is asked for.
/// Before, the controller's call was cut at an agent call's 10 s and the
/// new replica marked failed (`RebuildFailed`) while the engine went on
/// adding and filling it. Every byte reads back, through the volume and
/// from both replicas.
#[test]
fn a_rebuild_whose_freeze_outlasts_an_agent_call_is_waited_for_and_not_marked_failed() {
    let c = Cluster::start_with(2, 1, Some(256 << 20));
    c.patch_node("node-2", json!({"allowScheduling": false}));
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 1}));
    assert_eq!(c.holders("v"), ["node-1"]);
    c.patch_node("node-2", json!({"allowScheduling": true}));
    let endpoint = c.attach("v", "node-1");
    let live = Expected::new(c.dir.path(), "v", SIZE);
    live.write(&endpoint, 0, 12 << 20, 0x6e);
    live.write(&endpoint, 40 << 20, 2 << 20, 0x6f);

    let thaw = hang_disk_for_a_while(c.path("node-1").join("disk-1"));
    c.ok(
        "PATCH",
        "/v1/volumes/v",
        Some(json!({"numberOfReplicas": 2})),
    );
    thaw.join().unwrap();
    c.wait_settled("v", 2, Duration::from_secs(120));
    let new = c.replica_on("v", "node-2").unwrap();
    let name = new["name"].as_str().unwrap();
    assert!(
        c.event_reasons(&format!("replica/{name}"))
            .contains(&"RebuildStarted".to_string())
    );
    let failed = c.all_events("RebuildFailed");
    assert!(failed.is_empty(), "{failed:#?}");
    verify_data(c.dir.path(), &endpoint, &live.data());
    verify_replicas(&c, "v", &live.data());
}

/// An expansion of an attached volume while one replica's node hangs (its
/// process stopped, not yet taken for down) is answered: the engine gives
/// the silent replica up first, after `engine-replica-timeout` (15 s
/// here), then grows the other, and the controller waits for it as long
/// as that takes. Before, its call was cut at an agent call's 10 s and
/// the expansion failed. The data reads back, and the volume has its new
/// size.
#[test]
fn an_expansion_while_a_replicas_node_hangs_is_answered_once_the_engine_gives_it_up() {
    let c = Cluster::start_with_args(2, 1, None, &["--node-down-timeout", "120s"]);
    c.set("engine-replica-timeout", json!(15));
    c.create_volume(json!({"name": "v", "size": SIZE, "numberOfReplicas": 2}));
    let endpoint = c.attach("v", "node-1");
    c.wait_settled("v", 2, Duration::from_secs(60));
    let live = Expected::new(c.dir.path(), "v", SIZE);
    live.write(&endpoint, 0, 8 << 20, 0x85);
    live.write(&endpoint, SIZE - (1 << 20), 1 << 20, 0x86);

    let hung = c.nodes[1].proc.pid();
    let _thaw = Thaw(vec![hung]);
    stop_process(hung);
    let (status, body) = call(
        "POST",
        &c.url("/v1/volumes/v/expand"),
        Some(json!({ "size": 2 * SIZE })),
    );
    assert!((200..300).contains(&status), "{status} {body}");
    assert_eq!(virtual_size(&endpoint), 2 * SIZE);
    let grown = live.copy(c.dir.path(), "grown", 2 * SIZE);
    verify_data(c.dir.path(), &endpoint, &grown.data());
}
