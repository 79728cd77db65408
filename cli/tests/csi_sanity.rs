//! csi-sanity (kubernetes-csi/csi-test), the conformance suite every CSI
//! driver is judged by, against `ballast local`'s sockets as root: the
//! controller socket as `--csi.controllerendpoint` and node-1's socket as
//! `--csi.endpoint`, once with filesystem volumes and once with block
//! volumes. Its JUnit report is read; any failed spec fails the test and is
//! named, and every skipped spec must be one that docs/csi-sanity.md lists
//! with its reason.
//!
//! csi-sanity comes from the test bench (`tools/k8s/build`), found through
//! `KUBEBUILDER_ASSETS`; without it the test fails and says how to build it.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// What a JUnit report says, by spec name.
#[derive(Debug, Default)]
struct Report {
    passed: Vec<String>,
    failed: Vec<(String, String)>,
    /// (spec, csi-sanity's reason)
    skipped: Vec<(String, String)>,
}

fn read_report(path: &Path) -> Report {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "csi-sanity wrote no JUnit report at {}: {e}",
            path.display()
        )
    });
    let doc = roxmltree::Document::parse(&text).expect("the JUnit report is XML");
    let mut report = Report::default();
    for case in doc.descendants().filter(|n| n.has_tag_name("testcase")) {
        let name = case.attribute("name").unwrap_or("?").to_string();
        let child = |tag: &str| case.children().find(|c| c.has_tag_name(tag));
        if let Some(f) = child("failure").or_else(|| child("error")) {
            let why = f
                .attribute("message")
                .map(str::to_string)
                .or_else(|| f.text().map(str::to_string))
                .unwrap_or_default();
            report.failed.push((name, why));
        } else if let Some(skip) = child("skipped") {
            let why = skip.attribute("message").unwrap_or_default().to_string();
            report.skipped.push((name, why));
        } else {
            report.passed.push(name);
        }
    }
    report
}

/// The skipped specs docs/csi-sanity.md accounts for: its lines `- <spec>`
/// under "Skipped".
fn documented_skips() -> String {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/csi-sanity.md");
    std::fs::read_to_string(&doc).unwrap_or_else(|e| panic!("{}: {e}", doc.display()))
}

/// Runs csi-sanity with `access_type` volumes and, when given, the YAML of
/// `--csi.testvolumemutableparameters`; returns its report once every
/// check of a run has passed.
fn run_csi_sanity(access_type: &str, mutable: Option<&str>) -> Report {
    let sanity = ballast_k8s_harness::tool("csi-sanity").unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    // Declared before the cluster, so dropped after it: whatever a failed
    // spec left mounted is taken down once the cluster has stopped.
    let _teardown = Teardown(dir.path().to_path_buf());
    let cluster = dir.path().join("cluster");
    // Its mount and staging directories stand for the kubelet's. The nodes
    // take four volumes each, which the attach limit's spec checks.
    let kubelet = dir.path().display().to_string();
    let local = start_local_with(
        &cluster,
        &["--kubelet-dir", &kubelet, "--max-volumes-per-node", "4"],
    );
    let api = local.api.clone();
    // The disks are directories of this machine's filesystem.
    free_space_is_not_the_test(&api);

    let report = dir.path().join("junit.xml");
    let mutable_flag = mutable.map(|yaml| {
        let file = dir.path().join("mutable-parameters.yaml");
        std::fs::write(&file, yaml).unwrap();
        format!("--csi.testvolumemutableparameters={}", file.display())
    });
    let sockets = cluster.join("sockets");
    let out = Command::new(&sanity)
        .arg(format!(
            "--csi.endpoint=unix://{}",
            sockets.join("node-1.sock").display()
        ))
        .arg(format!(
            "--csi.controllerendpoint=unix://{}",
            sockets.join("controller.sock").display()
        ))
        .arg(format!(
            "--csi.mountdir={}",
            dir.path().join("target").display()
        ))
        .arg(format!(
            "--csi.stagingdir={}",
            dir.path().join("staging").display()
        ))
        .arg(format!("--csi.testvolumeaccesstype={access_type}"))
        .arg(format!("--csi.testvolumesize={}", 64 << 20))
        .arg(format!("--csi.testvolumeexpandsize={}", 128 << 20))
        .arg("--csi.testnodevolumeattachlimit")
        .args(mutable_flag)
        .arg(format!("--ginkgo.junit-report={}", report.display()))
        .arg("--ginkgo.no-color")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", sanity.display()));
    let output =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    drop(local);

    let r = read_report(&report);
    println!(
        "csi-sanity ({access_type}): {} passed, {} failed, {} skipped",
        r.passed.len(),
        r.failed.len(),
        r.skipped.len()
    );
    for (name, why) in &r.skipped {
        println!("  skipped: {name}\n    {why}");
    }
    let failed: Vec<String> = r
        .failed
        .iter()
        .map(|(name, why)| format!("  FAILED: {name}\n    {why}"))
        .collect();
    let tail: Vec<&str> = output.lines().collect();
    assert!(
        failed.is_empty(),
        "csi-sanity ({access_type}) failed {} specs:\n{}\n\nthe end of its output:\n{}",
        failed.len(),
        failed.join("\n"),
        tail[tail.len().saturating_sub(60)..].join("\n")
    );
    assert!(!r.passed.is_empty(), "csi-sanity ran no spec:\n{output}");
    assert!(
        out.status.success(),
        "csi-sanity exited {}:\n{output}",
        out.status
    );
    let documented = documented_skips();
    let undocumented: Vec<&String> = r
        .skipped
        .iter()
        .map(|(name, _)| name)
        .filter(|name| !documented.contains(name.as_str()))
        .collect();
    assert!(
        undocumented.is_empty(),
        "skipped specs that docs/csi-sanity.md does not list with a reason:\n{undocumented:#?}"
    );
    r
}

#[test]
fn csi_sanity_passes_with_filesystem_volumes() {
    run_csi_sanity("mount", None);
}

#[test]
fn csi_sanity_passes_with_block_volumes() {
    run_csi_sanity("block", None);
}

/// The third run: volumes made and changed with a VolumeAttributesClass's
/// mutable parameters (ControllerModifyVolume, MODIFY_VOLUME).
#[test]
fn csi_sanity_passes_with_mutable_parameters() {
    let yaml = "numberOfReplicas: \"2\"\nreplicaAutoBalance: least-effort\n";
    let r = run_csi_sanity("mount", Some(yaml));
    for spec in [
        "ModifyVolume [Controller Server] should modify a volume created with a volume attribute class",
        "ModifyVolume [Controller Server] should fail if specified mutable parameters are not supported by the volume",
        "CreateVolume should create volume with a volume attribute class",
    ] {
        assert!(
            r.passed.iter().any(|p| p.contains(spec)),
            "{spec} did not pass: {:#?}",
            r.passed
        );
    }
}
