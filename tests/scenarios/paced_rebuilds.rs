//! An attached volume's rebuild paced by `replica-rebuild-rate`, or by
//! the volume's own `replicaRebuildRate`, on real processes: the
//! engine's copy to a replica on another node pulls no more than the rate
//! allows, counted from when it was asked for, the volume takes writes
//! meanwhile, and every byte reads back once the new replica is rw; a
//! detach stops the copy and has it start again at once.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::*;

/// 20 MiB written, rebuilt at 1 MiB/s: about 20 s.
const WRITTEN: u64 = 20 << 20;

/// Volume `v`, attached with one replica holding 20 MiB, is given a
/// second replica with `replica-rebuild-rate` at 1 MiB/s: the rebuild's
/// bytes copied stay within 1 MiB for each second since the replica was
/// asked for, writes during it are taken, and both replicas end holding
/// every byte. Before the setting, an engine's rebuild took what the
/// network and disks gave.
#[test]
fn an_attached_volumes_rebuild_keeps_the_replica_rebuild_rate_and_takes_writes() {
    let one = one_replica_of_two_nodes(("replica-rebuild-rate", "1"), WRITTEN, 0x3c);
    let name = a_paced_rebuild_taking_writes(&one);
    assert_started(&one.c, &name, "at most 1 MiB/s (replica-rebuild-rate)");
}

/// The same volume with the setting at its highest (10240 MiB/s) and its
/// own `replicaRebuildRate` at 1 MiB/s: the volume's rate paces the
/// rebuild, as Longhorn's per-volume rebuild limit does over its global
/// one. Before the field, every volume's rebuilds kept the setting.
#[test]
fn a_volumes_own_rebuild_rate_paces_its_rebuild_in_place_of_the_setting() {
    let one = one_replica_of_two_nodes(("replica-rebuild-rate", "10240"), WRITTEN, 0x4d);
    let v = one.c.ok(
        "PATCH",
        "/v1/volumes/v",
        Some(json!({"replicaRebuildRate": 1})),
    );
    assert_eq!(v["spec"]["replicaRebuildRate"], 1, "{v}");
    let name = a_paced_rebuild_taking_writes(&one);
    assert_started(
        &one.c,
        &name,
        "at most 1 MiB/s (the volume's replicaRebuildRate)",
    );
}

/// Asks for a second replica of `v` on the other node and watches its
/// rebuild at 1 MiB/s: its bytes copied stay within 1 MiB for each second
/// since it was asked for, a write mid-copy is taken, and once it is rw
/// every byte reads back through the volume and from both replicas. The
/// new replica's name.
fn a_paced_rebuild_taking_writes(one: &OneOfTwo) -> String {
    const RATE: u64 = 1 << 20;
    let OneOfTwo {
        c,
        live,
        endpoint,
        other,
        ..
    } = one;
    let asked = Instant::now();
    c.ok(
        "PATCH",
        "/v1/volumes/v",
        Some(json!({"numberOfReplicas": 2})),
    );
    let mut seen = Vec::new();
    let mut wrote = false;
    let name = loop {
        let at = asked.elapsed();
        let replica = c.replica_on("v", other);
        let mode = replica
            .as_ref()
            .and_then(|r| r["status"]["mode"].as_str().map(str::to_string));
        if mode.as_deref() == Some("rw") {
            break replica.unwrap()["name"].as_str().unwrap().to_string();
        }
        if let Some(done) = replica
            .as_ref()
            .and_then(|r| r["status"]["rebuildProgress"]["done"].as_u64())
        {
            assert!(
                done as f64 <= RATE as f64 * at.as_secs_f64(),
                "{done} bytes copied {at:?} after the replica was asked for, at {RATE} bytes per second"
            );
            seen.push(done);
            if done > 0 && !wrote {
                // A write while the copy goes on reaches both replicas.
                live.write(endpoint, WRITTEN + (4 << 20), 1 << 20, 0xc3);
                wrote = true;
            }
        }
        assert!(
            at < Duration::from_secs(180),
            "no rw replica on {other} in 180 s; progress seen {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        seen.iter().any(|&d| d > 0 && d < WRITTEN),
        "no progress seen mid-copy: {seen:?}"
    );
    assert!(wrote, "no write during the copy");
    c.wait_settled("v", 2, Duration::from_secs(60));
    verify_data(c.dir.path(), endpoint, &live.data());
    c.ok("POST", "/v1/volumes/v/detach", None);
    verify_replicas(c, "v", &live.data());
    name
}

/// Replica `name`'s rebuild was started by the engine with the pace `how`
/// (its `RebuildStarted` event says so).
fn assert_started(c: &Cluster, name: &str, how: &str) {
    let started: Vec<String> = c
        .events(&format!("replica/{name}"))
        .into_iter()
        .filter(|e| e["reason"] == "RebuildStarted")
        .map(|e| e["message"].as_str().unwrap().to_string())
        .collect();
    assert!(
        started
            .iter()
            .any(|m| m.starts_with("by the engine on ") && m.ends_with(how)),
        "no RebuildStarted event saying {how:?}: {started:#?}"
    );
}

/// A detach during an attached volume's paced rebuild stops the copy on
/// the target's node (its engine's connection ended) and fails the
/// replica as interrupted by the detach itself, not after the node-down
/// timeout; the detached volume's replica is then rebuilt offline, and
/// both replicas hold every byte. Before, the node went on copying for
/// an engine that had gone, and the replica waited for the timeout.
#[test]
fn a_detach_during_a_paced_rebuild_stops_the_copy_and_the_rebuild_starts_again_at_once() {
    let OneOfTwo {
        c,
        live,
        holder,
        other,
        ..
    } = one_replica_of_two_nodes(("replica-rebuild-rate", "1"), WRITTEN, 0x5a);
    let name = a_second_replica_copying(&c, &other);

    c.ok("POST", "/v1/volumes/v/detach", None);
    let interrupted: Vec<Value> = c
        .events(&format!("replica/{name}"))
        .into_iter()
        .filter(|e| e["reason"] == "RebuildInterrupted")
        .collect();
    assert!(
        interrupted.iter().any(|e| e["message"]
            .as_str()
            .unwrap()
            .contains("its engine stopped")),
        "the detach interrupts the rebuild: {interrupted:#?}"
    );
    wait_fill_called_off(&c, &other);
    c.wait_settled("v", 2, Duration::from_secs(120));
    verify_replicas(&c, "v", &live.data());
    let endpoint = c.attach("v", &holder);
    verify_data(c.dir.path(), &endpoint, &live.data());
    c.ok("POST", "/v1/volumes/v/detach", None);
}

/// An engine killed during a paced rebuild is started again, and the
/// replica it was filling is failed as interrupted by that restart, not
/// after the node-down timeout; the new engine rebuilds it, and both
/// replicas hold every byte.
#[test]
fn an_engine_started_again_during_a_paced_rebuild_has_the_rebuild_start_again_at_once() {
    let OneOfTwo {
        c,
        live,
        endpoint,
        holder,
        other,
    } = one_replica_of_two_nodes(("replica-rebuild-rate", "1"), WRITTEN, 0x66);
    let name = a_second_replica_copying(&c, &other);

    let state = c.path(&holder).join("state");
    let pid = engine_pid(&state, "v").expect("the engine's pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let interrupted = wait_for(Duration::from_secs(60), "the rebuild interrupted", || {
        c.events(&format!("replica/{name}"))
            .into_iter()
            .find(|e| e["reason"] == "RebuildInterrupted")
    });
    assert!(
        interrupted["message"]
            .as_str()
            .unwrap()
            .contains("was started again"),
        "interrupted by the restart: {interrupted:#?}"
    );
    c.wait_settled("v", 2, Duration::from_secs(120));
    verify_data(c.dir.path(), &endpoint, &live.data());
    c.ok("POST", "/v1/volumes/v/detach", None);
    verify_replicas(&c, "v", &live.data());
}
