//! The `ballast-sanity` binary against a real socket: the node role's
//! Identity service served in-process on a temporary unix socket (so only
//! the Identity checks run: `--identity-only`).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use ballast::csi_identity::{IdentityService, Role};
use ballast::proto::csi::v1::identity_server::IdentityServer;

fn run_sanity(socket: &std::path::Path, target: &str) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ballast-sanity"))
        .args([
            "--endpoint",
            &format!("unix://{}", socket.display()),
            "--target",
            target,
            "--identity-only",
        ])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn the_binary_passes_a_conforming_socket_and_fails_a_misdeclared_one() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("node.sock");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ready = Arc::new(AtomicBool::new(true));
    let incoming = {
        let _guard = rt.enter();
        ballast::grpc::bind_unix(&socket).unwrap()
    };
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(IdentityServer::new(IdentityService::new(Role::Node, ready)))
            .serve_with_incoming(incoming),
    );

    let (ok, text) = run_sanity(&socket, "node");
    assert!(ok, "{text}");
    assert!(text.contains("4 passed, 0 failed"), "{text}");

    // Claimed to be a controller, the same socket fails: the checks can fail.
    let (ok, text) = run_sanity(&socket, "controller");
    assert!(!ok, "{text}");
    assert!(
        text.contains("FAIL identity: GetPluginCapabilities"),
        "{text}"
    );
}
