//! Three controllers on one real API server (the Kubernetes store): one
//! leads by the Lease, the others forward. The leader is killed (SIGKILL)
//! while a rebuild is in flight; another takes over within the lease
//! duration, the rebuild finishes, and the data reads back by checksum,
//! through the engine and from every replica's files.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::*;
use crate::kube_cluster::{self, KubeCluster};

#[test]
fn kube_the_leader_killed_during_a_rebuild_is_replaced_and_the_rebuild_finishes_with_the_data() {
    let KubeCluster {
        mut c,
        followers: ctls,
        leader,
        cp,
        rt,
    } = KubeCluster::start_with(3, 3);
    let followers_since = Instant::now();
    // A follower serves reads and refuses writes, naming the leader.
    let (code, body) = call(
        "PUT",
        &format!(
            "{}/v1/settings/replica-replenishment-wait-interval",
            ctls[0].api
        ),
        Some(json!({"value": "0"})),
    );
    assert_eq!(code, 503, "{body}");
    assert!(body["error"].as_str().unwrap().contains(&leader), "{body}");
    c.set("replica-replenishment-wait-interval", json!(0));

    c.create_volume(json!({"name": "vol", "size": SIZE, "numberOfReplicas": 2}));
    let holders = c.holders("vol");
    let endpoint = c.attach("vol", &holders[0]);
    c.wait_settled("vol", 2, Duration::from_secs(60));
    write_data(c.dir.path(), &endpoint, 7);

    // A replica's node dies; the next writes fail its replica, and the
    // leader builds a new one on the third node. As soon as that rebuild
    // is under way, the leader dies too.
    let victim = c.node_index(&holders[1]);
    c.kill_node(victim);
    let data = write_data(c.dir.path(), &endpoint, 8);
    let mut seen = Vec::new();
    let rebuilding = wait_for(Duration::from_secs(60), "a rebuild under way", || {
        let reps = c.replicas("vol");
        let states: Vec<String> = reps
            .iter()
            .map(|r| {
                format!(
                    "{}:{}:{}",
                    r["name"], r["spec"]["nodeId"], r["status"]["mode"]
                )
            })
            .collect();
        if seen.last() != Some(&states) {
            eprintln!("replicas: {states:?}");
            seen.push(states);
        }
        reps.into_iter().find(|r| {
            r["spec"]["nodeId"] != holders[0].as_str()
                && r["spec"]["nodeId"] != holders[1].as_str()
                && r["status"]["mode"] != "rw"
        })
    });
    // The followers have run for longer than the node-down timeout (4 s)
    // before the leader dies.
    let ran = followers_since.elapsed();
    if ran < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_secs(5) - ran);
    }
    let killed_at = Instant::now();
    c.ctl.proc.signal(nix::sys::signal::Signal::SIGKILL);
    c.ctl.proc.wait_exit(Duration::from_secs(10));

    // Another controller takes over within the lease duration (and the
    // period of its tries).
    let next = wait_for(Duration::from_secs(30), "a new leader", || {
        kube_cluster::holder(&rt, &cp).filter(|h| *h != leader)
    });
    let took = killed_at.elapsed();
    assert!(
        took < Duration::from_secs(6 + 3),
        "took over after {took:?}, more than the lease duration and its tries"
    );
    let ni = ctls
        .iter()
        .position(|x| x.proc.log.ends_with(format!("{next}.log")))
        .unwrap();
    c.api = ctls[ni].api.clone();

    // The rebuild finishes under the new leader: a replica on the node the
    // rebuild was filling is rw beside the attached one (the dead node's
    // stays failed), and the data is whole everywhere. (The interrupted
    // replica is taken up again, or replaced when its leader died before
    // its node made it.)
    let target = rebuilding["spec"]["nodeId"].clone();
    wait_for(Duration::from_secs(90), "the rebuild finished", || {
        let rw: Vec<Value> = c
            .replicas("vol")
            .into_iter()
            .filter(|r| r["status"]["mode"] == "rw")
            .collect();
        (rw.len() == 2 && rw.iter().any(|r| r["spec"]["nodeId"] == target)).then_some(())
    });
    verify_data(c.dir.path(), &endpoint, &data);
    verify_replicas(&c, "vol", &data);

    // The new leader ran as a follower for longer than the node-down
    // timeout before it took over; it counts a node's silence from its
    // takeover, so only the dead node went down: no node that kept
    // beating was marked down by the new leader.
    let victim_object = format!("node/{}", holders[1]);
    let down: Vec<String> = c
        .all_events("NodeDown")
        .iter()
        .filter(|e| e["object"] != victim_object.as_str())
        .map(|e| format!("{} at {}: {}", e["object"], e["time"], e["message"]))
        .collect();
    assert!(down.is_empty(), "a live node was marked down: {down:#?}");
}
