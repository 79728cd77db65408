//! The `ballast-sanity` binary against a real socket (`--identity-only`):
//! the node role's Identity service served in-process on a temporary unix
//! socket passes; an Identity that leaves the controller service out of
//! its capabilities, as Ballast's node socket once did, fails.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use ballast::csi_identity::{IdentityService, Role};
use ballast::proto::csi::v1::identity_server::{Identity, IdentityServer};
use ballast::proto::csi::v1::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, ProbeRequest, ProbeResponse,
};
use tonic::{Request, Response, Status};

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

/// Ballast's Identity, but advertising no capability at all.
struct NoCapabilities(IdentityService);

#[tonic::async_trait]
impl Identity for NoCapabilities {
    async fn get_plugin_info(
        &self,
        r: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        self.0.get_plugin_info(r).await
    }

    async fn get_plugin_capabilities(
        &self,
        _r: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(GetPluginCapabilitiesResponse::default()))
    }

    async fn probe(&self, r: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        self.0.probe(r).await
    }
}

fn serve<S: Identity>(rt: &tokio::runtime::Runtime, socket: &std::path::Path, service: S) {
    let incoming = {
        let _guard = rt.enter();
        ballast::grpc::bind_unix(socket).unwrap()
    };
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(IdentityServer::new(service))
            .serve_with_incoming(incoming),
    );
}

#[test]
fn the_binary_passes_a_conforming_socket_and_fails_one_without_the_controller_service() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let identity = || IdentityService::new(Role::Node, Arc::new(AtomicBool::new(true)));

    let good = dir.path().join("node.sock");
    serve(&rt, &good, identity());
    let (ok, text) = run_sanity(&good, "node");
    assert!(ok, "{text}");
    assert!(text.contains("3 passed, 0 failed"), "{text}");

    let bad = dir.path().join("bad.sock");
    serve(&rt, &bad, NoCapabilities(identity()));
    let (ok, text) = run_sanity(&bad, "node");
    assert!(!ok, "{text}");
    assert!(
        text.contains("FAIL identity: GetPluginCapabilities"),
        "{text}"
    );
    assert!(text.contains("2 passed, 1 failed"), "{text}");
}
