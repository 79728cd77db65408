//! What operators scrape, on a real `ballast local`: the controller's
//! `/metrics` (the model and the planner) follows a rebuild from below
//! 100% to 100%, and a node's `/metrics` counts the I/O its engine served,
//! byte for byte what qemu-io wrote and read.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

/// The value of the sample `name{labels...}` in OpenMetrics text, where
/// every one of `labels` (`key="value"`) is among the sample's labels.
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (head, value) = l.rsplit_once(' ')?;
            let (metric, rest) = head.split_once('{').unwrap_or((head, ""));
            (metric == name && labels.iter().all(|want| rest.contains(want)))
                .then(|| value.parse().ok())
                .flatten()
        })
        .next()
}

/// The metrics endpoint of `node` (`node-N`) of a `ballast local` whose API
/// is on `port`, as `ballast local` gives it.
fn node_metrics_of(port: u16, node: &str) -> String {
    let i: u16 = node.trim_start_matches("node-").parse().unwrap();
    format!("http://127.0.0.1:{}/metrics", port + 138 + i - 1)
}

/// A `ballast local` in `dir` with volume `v` of `size` and `replicas`
/// replicas: the cluster, its REST API, and node-1's metrics endpoint.
fn local_with_v(dir: &std::path::Path, size: &str, replicas: u32) -> (Local, String, String) {
    let local = start_local(dir);
    let api = local.api.clone();
    free_space_is_not_the_test(&api);
    let node_metrics = node_metrics_of(local.port, "node-1");
    let (s, v) = call(
        "POST",
        &format!("{api}/v1/volumes"),
        Some(json!({"name": "v", "size": size, "numberOfReplicas": replicas})),
    );
    assert_eq!(s, 201, "{v}");
    (local, api, node_metrics)
}

#[test]
fn metrics_follow_a_rebuild_to_100_and_count_the_io_qemu_io_did() {
    let dir = tempfile::tempdir().unwrap();
    let (_local, api, node_metrics) = local_with_v(dir.path(), "256Mi", 1);
    let endpoint = attach(&api, "v", "node-1");

    // The engine counts what it served: 96 MiB written, 32 MiB read.
    let io = |text: &str, what: &str| {
        sample(
            text,
            &format!("ballast_volume_{what}_total"),
            &["volume=\"v\"", "node=\"node-1\""],
        )
        .unwrap_or(0.0) as u64
    };
    let before = get_text(&node_metrics).expect("node-1 serves /metrics");
    assert_eq!(
        sample(&before, "ballast_engine_up", &["volume=\"v\""]),
        Some(1.0),
        "{before}"
    );
    let (ok, out) = qemu_io(
        &endpoint,
        &[
            "write -P 0x5a 0 64M",
            "write -P 0x5b 128M 32M",
            "read -P 0x5a 0 32M",
        ],
    );
    assert!(ok, "{out}");
    let after = wait_for(Duration::from_secs(10), "the engine's counters", || {
        let t = get_text(&node_metrics)?;
        // The engine publishes its counters now and then: wait for the
        // read's as well as the writes'.
        (io(&t, "write_bytes") >= io(&before, "write_bytes") + (96 << 20)
            && io(&t, "read_bytes") >= io(&before, "read_bytes") + (32 << 20))
            .then_some(t)
    });
    assert_eq!(
        io(&after, "write_bytes") - io(&before, "write_bytes"),
        96 << 20,
        "{after}"
    );
    let read = io(&after, "read_bytes") - io(&before, "read_bytes");
    assert!(
        (32 << 20..(32 << 20) + (1 << 20)).contains(&read),
        "read {read} bytes: {after}"
    );
    assert!(io(&after, "write_ops") > io(&before, "write_ops"));
    assert!(io(&after, "write_latency_nanoseconds") > io(&before, "write_latency_nanoseconds"));

    // A second replica is rebuilt: its progress, as the controller's
    // /metrics shows it, goes from below 100 to 100.
    let original = get_json(&format!("{api}/v1/replicas?volume=v")).unwrap()["items"][0]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let (s, v) = call(
        "PATCH",
        &format!("{api}/v1/volumes/v"),
        Some(json!({"numberOfReplicas": 2})),
    );
    assert_eq!(s, 200, "{v}");
    let mut seen = Vec::new();
    let start = Instant::now();
    loop {
        let text = get_text(&format!("{api}/metrics")).expect("the controller serves /metrics");
        let new: Vec<f64> = text
            .lines()
            .filter(|l| l.starts_with("ballast_replica_rebuild_progress{"))
            .filter(|l| l.contains("volume=\"v\"") && !l.contains(&original))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse().ok())
            .collect();
        if let Some(p) = new.first() {
            if seen.last() != Some(p) {
                seen.push(*p);
            }
            if *p == 100.0 {
                break;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "the rebuild did not reach 100: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        seen.iter().any(|p| *p < 100.0),
        "never seen below 100: {seen:?}"
    );
    // The volume turns healthy once the controller hears the engine say so.
    let text = wait_for(
        Duration::from_secs(30),
        "the volume healthy in /metrics",
        || {
            let text = get_text(&format!("{api}/metrics"))?;
            (sample(&text, "ballast_volume_robustness", &["volume=\"v\""]) == Some(1.0))
                .then_some(text)
        },
    );
    assert_eq!(
        sample(&text, "ballast_volume_capacity_bytes", &["volume=\"v\""]),
        Some((256u64 << 20) as f64)
    );
    assert_eq!(
        sample(
            &text,
            "ballast_node_status",
            &["node=\"node-1\"", "condition=\"ready\""]
        ),
        Some(1.0)
    );
    assert!(sample(&text, "ballast_disk_capacity_bytes", &["node=\"node-1\""]).unwrap() > 0.0);
    assert!(text.contains("ballast_nodes{ready=\"true\"} 3"), "{text}");
    detach(&api, "v");
}

/// A node's `/metrics` counts the changes of its replicas that the replica
/// server refused, by volume and reason: an engine of an attachment that
/// ended (fenced at its OPEN), and a node's certificate's write (denied).
/// The volume's data is intact.
#[test]
fn a_nodes_metrics_count_the_replica_changes_its_server_refused() {
    use ballast_node::wire::client::ReplicaClient;
    use ballast_node::wire::tls::WireTls;
    let dir = tempfile::tempdir().unwrap();
    let (local, api, _) = local_with_v(dir.path(), "64Mi", 1);
    let port = local.port;
    let replica = wait_for(Duration::from_secs(30), "the replica placed", || {
        let r = get_json(&format!("{api}/v1/replicas?volume=v"))?["items"][0].clone();
        r["spec"]["nodeId"].is_string().then_some(r)
    });
    let name = replica["name"].as_str().unwrap().to_string();
    let node = replica["spec"]["nodeId"].as_str().unwrap().to_string();
    let node_metrics = node_metrics_of(port, &node);
    let addr = get_json(&format!("{api}/v1/nodes/{node}")).unwrap()["status"]["replicaEndpoint"]
        .as_str()
        .unwrap()
        .to_string();

    let endpoint = attach(&api, "v", &node);
    let (ok, out) = qemu_io(&endpoint, &["write -P 0x5a 0 4M", "flush"]);
    assert!(ok, "{out}");
    detach(&api, "v");

    // `ballast local` keeps its cluster's CA here.
    let ca = ballast::tls::Ca::in_dir(&dir.path().join("controller").join("tls")).unwrap();
    let first = ca.issue_engine("v", &node, 1).unwrap();
    let first = WireTls::new(&first, &node).unwrap().for_attachment(1);
    let as_node = ca.issue(&ballast::tls::Role::Node(node.clone())).unwrap();
    let as_node = WireTls::new(&as_node, &node).unwrap();
    runtime().block_on(async {
        let e = ReplicaClient::dial(&first, &addr, &name).await.err();
        assert!(e.is_some(), "the ended attachment's engine opened {name}");
        let c = ReplicaClient::dial(&as_node, &addr, &name).await.unwrap();
        c.write(0, &[0xa5; 4096], u64::MAX / 2, false)
            .await
            .unwrap_err();
    });
    let text = get_text(&node_metrics).expect("the node serves /metrics");
    for reason in ["fenced", "denied"] {
        assert_eq!(
            sample(
                &text,
                "ballast_replica_refusals_total",
                &["volume=\"v\"", &format!("reason=\"{reason}\"")]
            ),
            Some(1.0),
            "{reason}: {text}"
        );
    }

    let endpoint = attach(&api, "v", &node);
    let (ok, out) = qemu_io(&endpoint, &["read -P 0x5a 0 4M"]);
    assert!(ok, "the data is intact: {out}");
    detach(&api, "v");
}

/// When the certificates expire is on both `/metrics`, as the CA issued
/// them: on the controller's, its own (a year ahead) and the CA's (ten);
/// on a node's, its own and its running engine's (a year ahead), the
/// engine's gone once the volume is detached. An operator's alert sees a
/// renewal coming.
#[test]
fn the_metrics_say_when_each_certificate_expires() {
    let dir = tempfile::tempdir().unwrap();
    let (_local, api, node_metrics) = local_with_v(dir.path(), "64Mi", 1);
    attach(&api, "v", "node-1");

    const NAME: &str = "ballast_certificate_expiry_timestamp_seconds";
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let day = 86_400.0;
    // Certificates end at a midnight (UTC): up to a day before the date.
    let ahead = |text: &str, labels: &[&str], days: f64| {
        let at = sample(text, NAME, labels).unwrap_or_else(|| panic!("no {labels:?}:\n{text}"));
        assert!(
            (now + (days - 2.0) * day..now + (days + 1.0) * day).contains(&at),
            "{labels:?} expires at {at}, not about {days} days after {now}"
        );
    };
    let node = get_text(&node_metrics).expect("node-1 serves /metrics");
    ahead(&node, &["holder=\"node\"", "node=\"node-1\""], 365.0);
    ahead(
        &node,
        &["holder=\"engine\"", "volume=\"v\"", "node=\"node-1\""],
        365.0,
    );
    let controller = get_text(&format!("{api}/metrics")).expect("the controller serves /metrics");
    ahead(&controller, &["holder=\"controller\""], 365.0);
    ahead(&controller, &["holder=\"ca\""], 3650.0);

    detach(&api, "v");
    let node = get_text(&node_metrics).expect("node-1 serves /metrics");
    assert_eq!(
        sample(&node, NAME, &["holder=\"engine\"", "volume=\"v\""]),
        None,
        "{node}"
    );
    ahead(&node, &["holder=\"node\""], 365.0);
}

/// Flips every byte of the 4 KiB block at `offset` of replica `name`'s head
/// on `node`, in a `ballast local` in `dir`: its disk changed it.
fn flip_head_block(dir: &std::path::Path, node: &str, name: &str, offset: u64) {
    use std::os::unix::fs::FileExt;
    let replica = dir.join(node).join("disk-1/replicas").join(name);
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(replica.join("meta.json")).unwrap()).unwrap();
    let head = meta["chain"].as_array().unwrap().last().unwrap().clone();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(replica.join(head.as_str().unwrap()))
        .unwrap();
    let mut b = vec![0u8; 4096];
    f.read_exact_at(&mut b, offset).unwrap();
    b.iter_mut().for_each(|x| *x = !*x);
    f.write_all_at(&b, offset).unwrap();
}

/// A node's `/metrics` counts the blocks its engine found failing their
/// checksum, the ones it repaired, and the reads no replica could serve.
/// A block bad in the local replica (read first) is served from the other
/// and repaired; a block bad in both fails its read. qemu-io checks every
/// byte it reads against the pattern written.
#[test]
fn a_nodes_metrics_count_checksum_failures_repairs_and_unreadable_reads() {
    let dir = tempfile::tempdir().unwrap();
    let (local, api, _) = local_with_v(dir.path(), "64Mi", 2);
    let replicas = wait_for(Duration::from_secs(30), "both replicas placed", || {
        let items = get_json(&format!("{api}/v1/replicas?volume=v"))?["items"].clone();
        let placed: Vec<(String, String)> = items
            .as_array()?
            .iter()
            .filter_map(|r| {
                Some((
                    r["name"].as_str()?.to_string(),
                    r["spec"]["nodeId"].as_str()?.to_string(),
                ))
            })
            .collect();
        (placed.len() == 2).then_some(placed)
    });
    // Attached where the first replica is: it is the local one, read first.
    let (local_replica, node) = replicas[0].clone();
    let (other_replica, other_node) = replicas[1].clone();
    let node_metrics = node_metrics_of(local.port, &node);
    let endpoint = attach(&api, "v", &node);
    let (ok, out) = qemu_io(&endpoint, &["write -P 0x5a 0 1M", "flush"]);
    assert!(ok, "{out}");
    let count = |text: &str, what: &str| {
        sample(
            text,
            &format!("ballast_volume_{what}_total"),
            &["volume=\"v\"", &format!("node=\"{node}\"")],
        )
    };
    let text = get_text(&node_metrics).expect("the node serves /metrics");
    for what in [
        "checksum_failures",
        "repairs",
        "unreadable_reads",
        "lost_blocks",
    ] {
        assert_eq!(count(&text, what), Some(0.0), "{what}: {text}");
    }

    flip_head_block(dir.path(), &node, &local_replica, 0);
    let (ok, out) = qemu_io(&endpoint, &["read -P 0x5a 0 4k"]);
    assert!(ok, "served from the other replica: {out}");
    let text = wait_for(Duration::from_secs(10), "the repair counted", || {
        let t = get_text(&node_metrics)?;
        (count(&t, "repairs") == Some(1.0)).then_some(t)
    });
    assert_eq!(count(&text, "checksum_failures"), Some(1.0), "{text}");
    assert_eq!(count(&text, "unreadable_reads"), Some(0.0), "{text}");

    flip_head_block(dir.path(), &node, &local_replica, 4096);
    flip_head_block(dir.path(), &other_node, &other_replica, 4096);
    let (ok, out) = qemu_io(&endpoint, &["read -P 0x5a 4k 4k"]);
    assert!(!ok, "no replica holds the block sound: {out}");
    let text = wait_for(
        Duration::from_secs(10),
        "the unreadable read counted",
        || {
            let t = get_text(&node_metrics)?;
            (count(&t, "unreadable_reads") == Some(1.0)).then_some(t)
        },
    );
    assert_eq!(count(&text, "checksum_failures"), Some(3.0), "{text}");
    assert_eq!(count(&text, "repairs"), Some(1.0), "{text}");
    // The rest reads back as written.
    let (ok, out) = qemu_io(&endpoint, &["read -P 0x5a 0 4k", "read -P 0x5a 8k 1016k"]);
    assert!(ok, "{out}");
    detach(&api, "v");
}
