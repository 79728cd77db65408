//! Copies made with no engine on real processes: a detached volume's
//! rebuild and a restore into a new volume, paced by `offline-copy-rate`
//! so that each outlasts an agent call (10 s), a user's call's wait for
//! the volume (30 s) or a CO's call. Each is one copy, which the
//! controller waits for, unless a user's call on the volume calls it off;
//! a restore goes on when the CO's call is cut; every byte reads back.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ballast::proto::csi::v1::controller_client::ControllerClient;
use ballast::proto::csi::v1::volume_capability::{self, AccessType, access_mode::Mode};
use ballast::proto::csi::v1::volume_content_source::{SnapshotSource, Type as SourceType};
use ballast::proto::csi::v1::{
    CapacityRange, CreateVolumeRequest, VolumeCapability, VolumeContentSource,
};
use serde_json::json;

use crate::harness::*;

/// 20 MiB, pulled at 1 MiB/s: about 20 s, twice an agent call's timeout.
const PACED: u64 = 20 << 20;

/// Two nodes, copies over the network paced at 1 MiB/s, and volume `v`
/// (one replica) holding `bytes` written and detached. Returns the
/// cluster, what `v` holds, the node holding it and the other node.
fn a_detached_volume_to_copy(bytes: u64) -> (Cluster, Expected, String, String) {
    let v = one_replica_of_two_nodes(("offline-copy-rate", "1"), bytes, 0x5a);
    v.c.ok("POST", "/v1/volumes/v/detach", None);
    (v.c, v.live, v.holder, v.other)
}

/// `a_detached_volume_to_copy` with 40 MiB (40 s to copy, past the 30 s
/// a call waits for the volume), asked for a second replica, once some
/// of the copy is written.
fn a_detached_volumes_copy_under_way() -> (Cluster, Expected, String, String) {
    let (c, live, holder, other) = a_detached_volume_to_copy(2 * PACED);
    a_second_replica_copying(&c, &other);
    (c, live, holder, other)
}

/// `a_detached_volume_to_copy` with 20 MiB, snapshot `s` of it taken,
/// and its holder taking no new replica: a volume restored from `s` is
/// placed on the other node (returned), and copied over the network.
fn a_snapshot_to_restore_elsewhere() -> (Cluster, Expected, String) {
    let (c, live, holder, other) = a_detached_volume_to_copy(PACED);
    c.ok(
        "POST",
        "/v1/snapshots",
        Some(json!({"name": "s", "volume": "v"})),
    );
    c.patch_node(&holder, json!({"allowScheduling": false}));
    (c, live, other)
}

/// Restored volume `volume` is on `node` alone, one copy there, and serves
/// every byte of `want`.
fn check_restored(c: &Cluster, volume: &str, node: &str, want: &Expected) {
    assert_eq!(c.holders(volume), [node.to_string()]);
    assert_eq!(copies_on(c, node).len(), 1, "{node} holds one copy");
    let endpoint = c.attach(volume, node);
    verify_data(c.dir.path(), &endpoint, &want.data());
    c.ok("POST", &format!("/v1/volumes/{volume}/detach"), None);
}

/// The replicas' directories on `node`'s disk.
fn copies_on(c: &Cluster, node: &str) -> Vec<String> {
    let dir = c.path(node).join("disk-1").join("replicas");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// What the controller's log says of agent calls cut at their timeout.
fn calls_cut(c: &Cluster) -> Vec<String> {
    let log = std::fs::read_to_string(c.dir.path().join("controller.log")).unwrap();
    log.lines()
        .filter(|l| l.contains("Timeout expired"))
        .map(str::to_string)
        .collect()
}

/// A detached volume's second replica, copied at 1 MiB/s (about 20 s), is
/// one copy, which the controller waits for: the other node ends with one
/// replica, rw, holding every byte. Before 9d9d797 the call was cut at
/// 10 s, marked failed while the node went on copying, and each attempt
/// left one more copy there.
#[test]
fn a_detached_volumes_rebuild_longer_than_a_call_is_one_copy_waited_for() {
    let (c, live, _, other) = a_detached_volume_to_copy(PACED);

    c.ok(
        "PATCH",
        "/v1/volumes/v",
        Some(json!({"numberOfReplicas": 2})),
    );
    c.wait_settled("v", 2, Duration::from_secs(180));
    let made = c
        .replica_on("v", &other)
        .expect("a replica on the other node");
    assert_eq!(
        copies_on(&c, &other),
        [made["name"].as_str().unwrap()],
        "{other} holds one copy"
    );
    assert_eq!(calls_cut(&c), Vec::<String>::new(), "a call was cut");
    verify_replicas(&c, "v", &live.data());
    let endpoint = c.attach("v", &other);
    verify_data(c.dir.path(), &endpoint, &live.data());
    c.ok("POST", "/v1/volumes/v/detach", None);
}

/// A restore into a new volume on the other node, copied at 1 MiB/s
/// (about 20 s), is one copy, which the controller waits for: the new
/// volume serves the snapshot's every byte from there.
#[test]
fn a_restore_longer_than_a_call_is_one_copy_waited_for() {
    let (c, live, other) = a_snapshot_to_restore_elsewhere();
    c.create_volume(json!({"name": "r", "size": SIZE, "numberOfReplicas": 1,
                           "source": {"snapshot": "s"}}));
    check_restored(&c, "r", &other, &live);
    assert_eq!(calls_cut(&c), Vec::<String>::new(), "a call was cut");
}

/// An attach during a detached volume's rebuild calls the copy off and
/// attaches at once: 40 MiB at 1 MiB/s would take 40 s, past the 30 s an
/// attach waits for the volume. The node stops copying; the engine
/// rebuilds the replica, and both replicas hold every byte. Before, the
/// attach waited for the copy, and was refused after 30 s.
#[test]
fn an_attach_calls_off_a_detached_volumes_rebuild_and_the_engine_finishes_it() {
    let (c, live, holder, other) = a_detached_volumes_copy_under_way();

    let endpoint = c.attach("v", &holder);
    wait_fill_called_off(&c, &other);
    c.wait_settled("v", 2, Duration::from_secs(120));
    verify_data(c.dir.path(), &endpoint, &live.data());
    c.ok("POST", "/v1/volumes/v/detach", None);
    verify_replicas(&c, "v", &live.data());
}

/// A deletion during a detached volume's rebuild calls the copy off and
/// deletes at once (40 MiB at 1 MiB/s would take 40 s, past the 30 s a
/// deletion waits for the volume): no replica of it is left on either
/// node. Before, the deletion waited for the copy, and was refused after
/// 30 s.
#[test]
fn a_deletion_calls_off_a_detached_volumes_rebuild() {
    let (c, _, holder, other) = a_detached_volumes_copy_under_way();

    c.ok("DELETE", "/v1/volumes/v", None);
    let (status, _) = call("GET", &c.url("/v1/volumes/v"), None);
    assert_eq!(status, 404);
    for node in [&holder, &other] {
        assert_eq!(copies_on(&c, node), Vec::<String>::new(), "left on {node}");
    }
}

/// A CSI CreateVolume from a snapshot whose copy outlasts the CO's call
/// (each call here gives up after 3 s, as the provisioner does after its
/// `--timeout`, and asks again) goes on: the calls asked meanwhile answer
/// ABORTED ("still being created"), and one after the copy answers the
/// volume, filled once, with every byte. Before, a call cut off dropped
/// the creation mid-way, and the next one started it again from nothing:
/// a restore longer than the CO's timeout never ended.
#[test]
fn a_csi_restore_longer_than_the_cos_timeout_goes_on_and_is_answered_once_done() {
    let (c, live, other) = a_snapshot_to_restore_elsewhere();
    let req = CreateVolumeRequest {
        name: "pvc-restored".into(),
        capacity_range: Some(CapacityRange {
            required_bytes: SIZE as i64,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![VolumeCapability {
            access_type: Some(AccessType::Mount(volume_capability::MountVolume {
                fs_type: "ext4".into(),
                ..Default::default()
            })),
            access_mode: Some(volume_capability::AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
        }],
        parameters: HashMap::from([("numberOfReplicas".into(), "1".into())]),
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(SourceType::Snapshot(SnapshotSource {
                snapshot_id: "s".into(),
            })),
        }),
        ..Default::default()
    };
    let (made, refusals) = runtime().block_on(async {
        let ch = ballast::grpc::unix_channel(&c.ctl.socket).unwrap();
        let mut csi = ControllerClient::new(ch);
        let until = Instant::now() + Duration::from_secs(120);
        let mut refusals = Vec::new();
        loop {
            let mut call = tonic::Request::new(req.clone());
            call.set_timeout(Duration::from_secs(3));
            match csi.create_volume(call).await {
                Ok(r) => break (r.into_inner().volume.unwrap(), refusals),
                Err(s) => refusals.push((s.code(), s.message().to_string())),
            }
            assert!(
                Instant::now() < until,
                "no answer in 120 s; refused {} times, last {:?}",
                refusals.len(),
                refusals.last()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    assert!(
        refusals.first().is_some_and(|(code, _)| matches!(
            code,
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        )),
        "the first call was cut at 3 s: {refusals:?}"
    );
    assert!(
        refusals.iter().skip(1).all(|(code, m)| match code {
            tonic::Code::Aborted => m.contains("still being created"),
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => true,
            _ => false,
        }),
        "{refusals:?}"
    );
    check_restored(&c, &made.volume_id, &other, &live);
}

/// An expansion or a snapshot during a detached volume's rebuild calls
/// the copy off and is done at once (the copy would take 40 s, past the
/// 30 s each waits for the volume); the replica is rebuilt after, and
/// every replica holds every byte. Before, each waited for the copy, and
/// was refused after 30 s.
#[test]
fn an_expansion_and_a_snapshot_call_off_a_detached_volumes_rebuild() {
    let (c, live, _, _) = a_detached_volumes_copy_under_way();
    c.ok(
        "POST",
        "/v1/volumes/v/expand",
        Some(json!({"size": "128Mi"})),
    );
    assert_eq!(c.volume("v")["spec"]["size"], 128u64 << 20);
    // The copy begins again (paced, from what it kept): the snapshot
    // calls it off in turn.
    wait_for(Duration::from_secs(60), "the copy under way again", || {
        let r = c
            .replicas("v")
            .into_iter()
            .find(|r| r["status"]["mode"] == "wo")?;
        (r["status"]["rebuildProgress"]["done"].as_u64()? > 0).then_some(())
    });
    let s = c.ok(
        "POST",
        "/v1/snapshots",
        Some(json!({"name": "s", "volume": "v"})),
    );
    assert_eq!(s["status"]["readyToUse"], true, "{s}");
    c.set("offline-copy-rate", json!("0"));
    c.wait_settled("v", 2, Duration::from_secs(120));
    verify_replicas(&c, "v", &live.data());
}
