//! Seed 004: reuse of failed replicas. A node back within the replenishment
//! wait has its replica rebuilt in place, copying only the layers it lacks;
//! past the wait a new replica is built; a reuse that keeps failing gives
//! up after the retry limit.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::*;

const SETTLE: Duration = Duration::from_secs(120);

fn names(c: &Cluster, volume: &str) -> Vec<String> {
    let mut n: Vec<String> = c
        .replicas(volume)
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect();
    n.sort();
    n
}

fn wait_mode(c: &Cluster, replica: &str, volume: &str, mode: &str) {
    wait_for(SETTLE, &format!("{replica} {mode}"), || {
        c.replicas(volume)
            .iter()
            .any(|r| r["name"] == replica && r["status"]["mode"] == mode)
            .then_some(())
    });
}

/// Bytes kept and copied, from a `ReplicaRebuilt` message.
fn kept_and_copied(message: &str) -> (u64, u64) {
    let num = |after: &str| -> u64 {
        let i = message.find(after).unwrap() + after.len();
        message[i..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    (num("kept "), num("copied "))
}

#[test]
fn a_node_back_within_the_wait_has_its_replica_reused_and_only_missing_layers_copied() {
    let mut c = Cluster::start(3, 1);
    c.set("replica-replenishment-wait-interval", json!(600));
    c.create_volume(json!({"name": "vol", "size": SIZE, "numberOfReplicas": 2}));
    let holders = c.holders("vol");
    let attached = holders[0].clone();
    let endpoint = c.attach("vol", &attached);
    c.wait_settled("vol", 2, SETTLE);
    write_data(c.dir.path(), &endpoint, 31);
    // A third replica: its rebuild freezes a layer on every replica.
    // `ballastctl volume update --wait` returns once it is rw.
    let (ok, _, progress) = ballastctl(
        &c.api,
        &["volume", "update", "vol", "--replicas", "3", "--wait"],
    );
    assert!(ok, "{progress}");
    assert!(
        progress
            .lines()
            .last()
            .unwrap_or_default()
            .ends_with("3/3 rw"),
        "{progress}"
    );
    c.wait_settled("vol", 3, SETTLE);
    write_data(c.dir.path(), &endpoint, 32);
    let victim = ["node-1", "node-2", "node-3"]
        .into_iter()
        .find(|n| *n != attached)
        .unwrap();
    let reused = c.replica_on("vol", victim).unwrap()["name"]
        .as_str()
        .unwrap()
        .to_string();
    let before = names(&c, "vol");
    c.kill_node(c.node_index(victim));
    // Writes while it is down fail the replica; the volume degrades and
    // waits for it.
    let data = write_data(c.dir.path(), &endpoint, 33);
    wait_mode(&c, &reused, "vol", "err");
    // Once the node is seen down, the controller waits for it (the plan
    // says so) and makes nothing new.
    wait_for(SETTLE, "the node seen down", || {
        (c.node(victim)["status"]["ready"] == false).then_some(())
    });
    let plan = c.ok("GET", "/v1/plan?volume=vol", None);
    assert!(
        plan["waits"].as_array().is_some_and(|w| !w.is_empty()),
        "the plan does not wait for the replica: {plan}"
    );
    // The volume's record says so: its `Scheduled` condition false,
    // waiting, until when and for what.
    let waiting = wait_for(SETTLE, "the Scheduled condition false", || {
        c.scheduled("vol").filter(|k| k["status"] == false)
    });
    assert_eq!(waiting["reason"], "ReplenishWaiting", "{waiting}");
    let message = waiting["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("waiting until ")
            && message.contains(&format!("failed replica {reused} may come back for reuse")),
        "{waiting}"
    );
    // `ballastctl volume get` shows it, naming the replica and why.
    let (ok, shown, err) = ballastctl(&c.api, &["volume", "get", "vol"]);
    assert!(ok, "{err}");
    assert!(
        shown.lines().any(|l| l.starts_with("Scheduled")
            && l.contains("False")
            && l.contains("ReplenishWaiting")
            && l.contains(&format!("failed replica {reused} may come back for reuse"))
            && l.contains(&format!("node {victim} is not ready"))),
        "volume get does not show the wait: {shown}"
    );
    // And the metrics count it.
    let metrics = get_text(&format!("{}/metrics", c.api)).unwrap_or_default();
    assert!(
        metrics
            .lines()
            .any(|l| l == "ballast_planner_waits{rule=\"replenish\"} 1"),
        "{metrics}"
    );
    c.stays_put("vol");
    assert_eq!(
        names(&c, "vol"),
        before,
        "a new replica was made during the wait"
    );
    c.restart_node(c.node_index(victim));
    wait_mode(&c, &reused, "vol", "rw");
    c.wait_settled("vol", 3, SETTLE);
    wait_for(SETTLE, "the Scheduled condition true again", || {
        c.scheduled("vol").filter(|k| k["status"] == true)
    });
    assert_eq!(
        names(&c, "vol"),
        before,
        "the failed replica was not reused"
    );
    let rebuilds = c.rebuilds();
    let Some((_, message)) = rebuilds
        .iter()
        .rfind(|(o, _)| o == &format!("replica/{reused}"))
    else {
        let all = c.ok("GET", "/v1/events", None);
        let _ = std::fs::write("/tmp/seed004-events.json", all.to_string());
        let _ = std::fs::copy(c.path("controller.log"), "/tmp/seed004-controller.log");
        panic!("no rebuild event for {reused}: {rebuilds:?}");
    };
    let (kept, copied) = kept_and_copied(message);
    assert!(kept > 0, "nothing was kept: {message}");
    assert!(copied > 0, "{message}");
    verify_data(c.dir.path(), &endpoint, &data);
    verify_replicas(&c, "vol", &data);
}

#[test]
fn past_the_wait_a_new_replica_is_built() {
    let mut c = Cluster::start(4, 1);
    c.set("replica-replenishment-wait-interval", json!(3));
    c.create_volume(json!({"name": "vol", "size": SIZE, "numberOfReplicas": 3}));
    let holders = c.holders("vol");
    let endpoint = c.attach("vol", &holders[0]);
    c.wait_settled("vol", 3, SETTLE);
    let victim = holders[1].clone();
    let failed = c.replica_on("vol", &victim).unwrap()["name"]
        .as_str()
        .unwrap()
        .to_string();
    c.kill_node(c.node_index(&victim));
    let data = write_data(c.dir.path(), &endpoint, 34);
    three_rw_without(&c, &failed);
    verify_data(c.dir.path(), &endpoint, &data);
}

#[test]
fn a_reuse_that_keeps_failing_gives_up_after_the_retry_limit() {
    let mut c = Cluster::start(4, 1);
    c.set("replica-replenishment-wait-interval", json!(600));
    c.set("replica-rebuild-max-retry", json!(1));
    c.create_volume(json!({"name": "vol", "size": SIZE, "numberOfReplicas": 3}));
    let holders = c.holders("vol");
    let endpoint = c.attach("vol", &holders[0]);
    c.wait_settled("vol", 3, SETTLE);
    let victim = holders[1].clone();
    let broken = c.replica_on("vol", &victim).unwrap();
    let name = broken["name"].as_str().unwrap().to_string();
    let i = c.node_index(&victim);
    c.kill_node(i);
    let data = write_data(c.dir.path(), &endpoint, 35);
    wait_mode(&c, &name, "vol", "err");
    // Mess up the replica: its head layer becomes a directory.
    let dir = c
        .path(&victim)
        .join(broken["spec"]["diskId"].as_str().unwrap())
        .join("replicas")
        .join(&name);
    let meta: Value =
        serde_json::from_slice(&std::fs::read(dir.join("meta.json")).unwrap()).unwrap();
    let head = meta["chain"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .as_str()
        .unwrap()
        .to_string();
    std::fs::remove_file(dir.join(&head)).unwrap();
    std::fs::create_dir(dir.join(&head)).unwrap();
    c.restart_node(i);
    // One reuse attempt fails; then a new replica is built elsewhere.
    three_rw_without(&c, &name);
    let reasons = c.event_reasons(&format!("replica/{name}"));
    assert!(
        reasons.contains(&"RebuildFailed".to_string()),
        "{reasons:?}"
    );
    let r = c
        .replicas("vol")
        .into_iter()
        .find(|r| r["name"] == name.as_str());
    if let Some(r) = r {
        assert_eq!(r["spec"]["rebuildRetryCount"], 1, "{r}");
    }
    verify_data(c.dir.path(), &endpoint, &data);
}

/// Waits for "vol" to have three rw replicas, none of them `gone`: a new
/// replica was built in its place.
fn three_rw_without(c: &Cluster, gone: &str) {
    wait_for(SETTLE, "a new replica, rw", || {
        let reps = c.replicas("vol");
        let rw: Vec<&Value> = reps
            .iter()
            .filter(|r| r["status"]["mode"] == "rw")
            .collect();
        (rw.len() == 3 && rw.iter().all(|r| r["name"] != gone)).then_some(())
    });
}
