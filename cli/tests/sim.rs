//! `ballast sim SCENARIO.yaml`: the contract external tests rely on.

mod common;

use std::process::Command;

use common::BALLAST;

fn sim(text: &str) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scenario.yaml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(BALLAST)
        .arg("sim")
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_seed000_best_effort_example_prints_six_then_three_three_then_two_two_two() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/sim/seed000-node-best-effort.yaml"
    ))
    .unwrap();
    let (code, out, err) = sim(&text);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 5);
    for l in &lines {
        for key in [
            "step",
            "ticks",
            "replicas",
            "zones",
            "disks",
            "created",
            "deleted",
            "reused",
            "oscillation",
            "blocked",
            "nodes",
        ] {
            assert!(l.get(key).is_some(), "missing {key}: {l}");
        }
        assert_eq!(l["oscillation"], false);
    }
    let counts = |i: usize| -> Vec<u64> {
        lines[i]["replicas"]["v1"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .collect()
    };
    assert_eq!(counts(0), [6, 0, 0]);
    assert_eq!(counts(1), [3, 3, 0]);
    assert_eq!(
        (lines[1]["created"].as_u64(), lines[1]["deleted"].as_u64()),
        (Some(3), Some(3))
    );
    assert_eq!(counts(3), [2, 2, 2]);
    assert_eq!(
        (lines[4]["created"].as_u64(), lines[4]["deleted"].as_u64()),
        (Some(0), Some(0)),
        "nothing moves later"
    );
    assert_eq!(lines[0]["nodes"]["node-1"]["drainBlocked"], true);
}

#[test]
fn a_malformed_scenario_exits_2_naming_the_key_and_line() {
    let (code, _, err) = sim(
        "nodes:\n  - {id: n1, disks: [{id: d1, size: 10Gi}]}\nvolumes:\n  - {name: v1, size: 1Gi, numberOfReplicas: 1, colour: red}\n",
    );
    assert_eq!(code, 2);
    assert!(err.contains("line 4") && err.contains("colour"), "{err}");
    let (code, _, err) = sim("nodes: []\nsteps:\n  - dance: {}\n");
    assert_eq!(code, 2);
    assert!(err.contains("line 3") && err.contains("dance"), "{err}");
    let (code, _, err) = sim("settings: {replica-auto-balance: sometimes}\nnodes: []\n");
    assert_eq!(code, 2);
    assert!(
        err.contains("replica-auto-balance") && err.contains("best-effort"),
        "{err}"
    );
    let (code, _, err) = sim("nodes: []\nsteps:\n  - node: {id: nope, cordoned: true}\n");
    assert_eq!(code, 2);
    assert!(err.contains("step 1") && err.contains("nope"), "{err}");
}
