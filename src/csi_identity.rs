//! The CSI Identity service, served by both daemons on their sockets.
//!
//! Both sockets report the same plugin capabilities, as the spec requires
//! of every instance of a plugin whatever RPCs it serves: a CO that asks
//! the node socket must learn that the plugin has a controller service.
//! Probe answers `ready = false` until the daemon says it finished
//! initialising (for the node plugin: registered with the controller).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tonic::{Request, Response, Status};

use crate::proto::csi::v1::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, PluginCapability, ProbeRequest, ProbeResponse,
    identity_server::Identity, plugin_capability,
};

/// Which daemon serves Identity (GetPluginInfo's manifest says it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Controller,
    Node,
}

/// Identity for one daemon.
#[derive(Clone, Debug)]
pub struct IdentityService {
    role: Role,
    ready: Arc<AtomicBool>,
}

impl IdentityService {
    /// `ready` is shared with the daemon, which sets it once initialised.
    pub fn new(role: Role, ready: Arc<AtomicBool>) -> Self {
        IdentityService { role, ready }
    }

    fn capabilities() -> Vec<PluginCapability> {
        use plugin_capability::service::Type;
        let service = |t: Type| PluginCapability {
            r#type: Some(plugin_capability::Type::Service(
                plugin_capability::Service { r#type: t as i32 },
            )),
        };
        // A volume is reachable from every node (its replicas are reached
        // over the network), so no accessibility constraints; volumes grow
        // while published too.
        let online_expansion = PluginCapability {
            r#type: Some(plugin_capability::Type::VolumeExpansion(
                plugin_capability::VolumeExpansion {
                    r#type: plugin_capability::volume_expansion::Type::Online as i32,
                },
            )),
        };
        vec![
            service(Type::ControllerService),
            service(Type::VolumeAccessibilityConstraints),
            online_expansion,
        ]
    }
}

#[tonic::async_trait]
impl Identity for IdentityService {
    #[tracing::instrument(skip_all, fields(rpc = "GetPluginInfo"))]
    async fn get_plugin_info(
        &self,
        _request: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: crate::DRIVER_NAME.to_string(),
            vendor_version: crate::VERSION.to_string(),
            manifest: [(
                "role".to_string(),
                match self.role {
                    Role::Controller => "controller",
                    Role::Node => "node",
                }
                .to_string(),
            )]
            .into(),
        }))
    }

    #[tracing::instrument(skip_all, fields(rpc = "GetPluginCapabilities"))]
    async fn get_plugin_capabilities(
        &self,
        _request: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities: Self::capabilities(),
        }))
    }

    #[tracing::instrument(skip_all, fields(rpc = "Probe"))]
    async fn probe(
        &self,
        _request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse {
            ready: Some(self.ready.load(Ordering::SeqCst)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_socket_reports_the_same_capabilities_with_the_controller_service() {
        let ask = |role| async move {
            IdentityService::new(role, Arc::new(AtomicBool::new(true)))
                .get_plugin_capabilities(Request::new(GetPluginCapabilitiesRequest {}))
                .await
                .unwrap()
                .into_inner()
                .capabilities
        };
        let (controller, node) = (ask(Role::Controller).await, ask(Role::Node).await);
        assert_eq!(controller, node);
        let controller_service = PluginCapability {
            r#type: Some(plugin_capability::Type::Service(
                plugin_capability::Service {
                    r#type: plugin_capability::service::Type::ControllerService as i32,
                },
            )),
        };
        assert!(node.contains(&controller_service), "{node:?}");
    }
}
