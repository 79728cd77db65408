//! Data safety: the failing sequences of issue 10, each on real processes
//! with data written before and checked by checksum after. An expansion
//! that cannot happen changes nothing.

use std::time::Duration;

use ballast::proto::csi::v1::CapacityRange;
use ballast::proto::csi::v1::ControllerExpandVolumeRequest;
use ballast::proto::csi::v1::controller_client::ControllerClient;
use serde_json::json;

use crate::harness::*;

/// The size a replica's files record, read from its directory.
fn replica_size(c: &Cluster, r: &serde_json::Value) -> u64 {
    let dir = c
        .path(r["spec"]["nodeId"].as_str().unwrap())
        .join(r["spec"]["diskId"].as_str().unwrap())
        .join("replicas")
        .join(r["name"].as_str().unwrap());
    ballast_node::replica::Replica::open(&dir).unwrap().size()
}

fn virtual_size(endpoint: &str) -> u64 {
    let out = std::process::Command::new("qemu-img")
        .args(["info", "--output=json", endpoint])
        .output()
        .unwrap();
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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let status = rt
        .block_on(async {
            let ch = ballast::grpc::unix_channel(&c.ctl.socket).unwrap();
            ControllerClient::new(ch)
                .controller_expand_volume(ControllerExpandVolumeRequest {
                    volume_id: "v".into(),
                    capacity_range: Some(CapacityRange {
                        required_bytes: i64::MAX,
                        limit_bytes: 0,
                    }),
                    ..Default::default()
                })
                .await
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
