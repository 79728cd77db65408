use std::sync::Arc;

use ballast::proto::agent::v1::node_agent_server::NodeAgent;
use ballast::proto::agent::v1::{GetNodeStatusRequest, GetNodeStatusResponse};
use tonic::{Request, Response, Status};

use crate::context::NodeContext;

/// The gRPC service the controller calls on this node.
#[derive(Clone)]
pub struct NodeAgentService {
    ctx: Arc<NodeContext>,
}

impl NodeAgentService {
    pub fn new(ctx: Arc<NodeContext>) -> Self {
        NodeAgentService { ctx }
    }
}

#[tonic::async_trait]
impl NodeAgent for NodeAgentService {
    #[tracing::instrument(skip_all, fields(node = %self.ctx.node_id))]
    async fn get_node_status(
        &self,
        _request: Request<GetNodeStatusRequest>,
    ) -> Result<Response<GetNodeStatusResponse>, Status> {
        Ok(Response::new(GetNodeStatusResponse {
            node_id: self.ctx.node_id.clone(),
            disks: self.ctx.disk_status(),
        }))
    }
}
