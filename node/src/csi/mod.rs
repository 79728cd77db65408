//! The node plugin's CSI socket. This release serves Identity (Probe is
//! ready once the node registered); the Node service arrives with the data
//! plane.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use ballast::csi_identity::{IdentityService, Role};
use ballast::error::ServeError;
use ballast::proto::csi::v1::identity_server::IdentityServer;
use tonic::transport::Server;

/// Binds the socket now and returns the server future.
pub fn serve(
    socket: PathBuf,
    ready: Arc<AtomicBool>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<impl std::future::Future<Output = Result<(), ServeError>>, ServeError> {
    let incoming = ballast::grpc::bind_unix(&socket)?;
    let identity = IdentityServer::new(IdentityService::new(Role::Node, ready));
    Ok(async move {
        Server::builder()
            .add_service(identity)
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
            .map_err(ServeError::from)
    })
}
