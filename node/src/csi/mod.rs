//! The node plugin's CSI socket: Identity (Probe is ready once the node
//! registered) and the Node service (`node`: stage, publish, stats).

mod node;
pub use node::has_cap_sys_resource;
mod paths;

use std::path::PathBuf;
use std::sync::Arc;

use ballast::csi_identity::{IdentityService, Role};
use ballast::error::ServeError;
use ballast::proto::csi::v1::identity_server::IdentityServer;
use ballast::proto::csi::v1::node_server::NodeServer;
use tonic::transport::Server;

use crate::context::NodeContext;

pub use node::NodeService;
pub use paths::Confinement;

/// Binds the socket now and returns the server future.
pub fn serve(
    socket: PathBuf,
    ctx: Arc<NodeContext>,
    state_dir: PathBuf,
    kubelet_dir: PathBuf,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<impl std::future::Future<Output = Result<(), ServeError>>, ServeError> {
    let incoming = ballast::grpc::bind_unix(&socket)?;
    let identity = IdentityServer::new(IdentityService::new(Role::Node, ctx.registered.clone()));
    let node = NodeServer::new(NodeService::new(ctx, &state_dir, &kubelet_dir));
    Ok(async move {
        Server::builder()
            .add_service(identity)
            .add_service(node)
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
            .map_err(ServeError::from)
    })
}
