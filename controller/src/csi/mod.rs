//! The controller's CSI socket: Identity, and the Controller service.
//!
//! Served: CreateVolume and DeleteVolume, ControllerPublishVolume and
//! ControllerUnpublishVolume (which start and stop the volume's engine on
//! the node), ListVolumes with the nodes each volume is published at,
//! GetCapacity, ValidateVolumeCapabilities and ControllerGetCapabilities
//! ControllerExpandVolume (offline: the volume unpublished), and
//! ControllerGetVolume with the volume's condition (`volumes`; StorageClass
//! parameters in `params`), ControllerModifyVolume, the health RPCs, and
//! snapshots: CreateSnapshot, DeleteSnapshot, ListSnapshots, GetSnapshot
//! and CreateVolume from a snapshot or a volume (`snapshots`). Group snapshots
//! are not advertised, so UNIMPLEMENTED as the spec allows.

pub mod ids;
pub mod params;
pub mod snapshots;
pub mod volumes;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use ballast::csi_identity::{IdentityService, Role};
use ballast::error::ServeError;
use ballast::model::Volume;
use ballast::proto::csi::v1::controller_server::{Controller, ControllerServer};
use ballast::proto::csi::v1::controller_service_capability::{self, rpc::Type as RpcType};
use ballast::proto::csi::v1::identity_server::IdentityServer;
use ballast::proto::csi::v1::{
    ControllerExpandVolumeRequest, ControllerExpandVolumeResponse,
    ControllerGetCapabilitiesRequest, ControllerGetCapabilitiesResponse,
    ControllerGetVolumeHealthRequest, ControllerGetVolumeHealthResponse,
    ControllerGetVolumeRequest, ControllerGetVolumeResponse, ControllerListVolumeHealthRequest,
    ControllerListVolumeHealthResponse, ControllerModifyVolumeRequest,
    ControllerModifyVolumeResponse, ControllerPublishVolumeRequest,
    ControllerPublishVolumeResponse, ControllerServiceCapability, ControllerUnpublishVolumeRequest,
    ControllerUnpublishVolumeResponse, CreateSnapshotRequest, CreateSnapshotResponse,
    CreateVolumeRequest, CreateVolumeResponse, DeleteSnapshotRequest, DeleteSnapshotResponse,
    DeleteVolumeRequest, DeleteVolumeResponse, GetCapacityRequest, GetCapacityResponse,
    GetSnapshotRequest, GetSnapshotResponse, ListSnapshotsRequest, ListSnapshotsResponse,
    ListVolumesRequest, ListVolumesResponse, ValidateVolumeCapabilitiesRequest,
    ValidateVolumeCapabilitiesResponse, validate_volume_capabilities_response::Confirmed,
};
use tonic::transport::Server;
use tonic::{Request, Response, Status};

use crate::context::Context;
use crate::error::Error;
use crate::forward::{RoutedController, Router};

/// The CSI Controller service.
pub struct ControllerService {
    ctx: Arc<Context>,
}

impl ControllerService {
    pub fn new(ctx: Arc<Context>) -> Self {
        ControllerService { ctx }
    }
}

pub use ballast::csi_caps::check_capability;

#[tonic::async_trait]
impl Controller for ControllerService {
    #[tracing::instrument(skip_all, fields(rpc = "ControllerGetCapabilities"))]
    async fn controller_get_capabilities(
        &self,
        _request: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let capabilities = [
            RpcType::CreateDeleteVolume,
            RpcType::PublishUnpublishVolume,
            RpcType::ListVolumes,
            RpcType::GetCapacity,
            RpcType::ListVolumesPublishedNodes,
            RpcType::ExpandVolume,
            RpcType::GetVolume,
            RpcType::VolumeCondition,
            RpcType::ModifyVolume,
            RpcType::SingleNodeMultiWriter,
            RpcType::PublishReadonly,
            RpcType::GetVolumeHealth,
            RpcType::ListVolumeHealth,
            RpcType::CreateDeleteSnapshot,
            RpcType::ListSnapshots,
            RpcType::GetSnapshot,
            RpcType::CloneVolume,
        ]
        .into_iter()
        .map(|t| ControllerServiceCapability {
            r#type: Some(controller_service_capability::Type::Rpc(
                controller_service_capability::Rpc { r#type: t as i32 },
            )),
        })
        .collect();
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let volume = volumes::create(&self.ctx, request.into_inner()).await?;
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(volume),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        volumes::delete(&self.ctx, request.into_inner()).await?;
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        Ok(Response::new(
            volumes::publish(&self.ctx, request.into_inner()).await?,
        ))
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        volumes::unpublish(&self.ctx, request.into_inner()).await?;
        Ok(Response::new(ControllerUnpublishVolumeResponse {}))
    }

    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        Ok(Response::new(
            volumes::list(&self.ctx, request.into_inner()).await?,
        ))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        Ok(Response::new(
            volumes::expand(&self.ctx, request.into_inner()).await?,
        ))
    }

    async fn controller_get_volume_health(
        &self,
        request: Request<ControllerGetVolumeHealthRequest>,
    ) -> Result<Response<ControllerGetVolumeHealthResponse>, Status> {
        Ok(Response::new(
            volumes::health(&self.ctx, request.into_inner()).await?,
        ))
    }

    async fn controller_list_volume_health(
        &self,
        request: Request<ControllerListVolumeHealthRequest>,
    ) -> Result<Response<ControllerListVolumeHealthResponse>, Status> {
        Ok(Response::new(
            volumes::list_health(&self.ctx, request.into_inner()).await?,
        ))
    }

    async fn controller_get_volume(
        &self,
        request: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        Ok(Response::new(
            volumes::get(&self.ctx, request.into_inner()).await?,
        ))
    }

    async fn controller_modify_volume(
        &self,
        request: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        Ok(Response::new(
            volumes::modify(&self.ctx, request.into_inner()).await?,
        ))
    }

    async fn create_snapshot(
        &self,
        request: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        let snapshot = snapshots::create(&self.ctx, request.into_inner()).await?;
        Ok(Response::new(CreateSnapshotResponse {
            snapshot: Some(snapshot),
        }))
    }

    async fn delete_snapshot(
        &self,
        request: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        snapshots::delete(&self.ctx, request.into_inner()).await?;
        Ok(Response::new(DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        request: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        Ok(Response::new(
            snapshots::list(&self.ctx, request.into_inner()).await?,
        ))
    }

    async fn get_snapshot(
        &self,
        request: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        let snapshot = snapshots::get(&self.ctx, request.into_inner()).await?;
        Ok(Response::new(GetSnapshotResponse {
            snapshot: Some(snapshot),
        }))
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        Ok(Response::new(
            volumes::capacity(&self.ctx, request.into_inner()).await?,
        ))
    }

    #[tracing::instrument(skip_all, fields(rpc = "ValidateVolumeCapabilities", volume = %request.get_ref().volume_id))]
    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let req = request.into_inner();
        if req.volume_id.is_empty() {
            return Err(Error::invalid("volume_id", "is required").into());
        }
        if req.volume_capabilities.is_empty() {
            return Err(Error::invalid("volume_capabilities", "at least one is required").into());
        }
        self.ctx
            .store
            .fetch::<Volume>(&req.volume_id)
            .await
            .map_err(Error::from)?;
        let refused: Vec<String> = req
            .volume_capabilities
            .iter()
            .filter_map(|c| check_capability(c).err())
            .collect();
        if !refused.is_empty() {
            return Ok(Response::new(ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: refused.join("; "),
            }));
        }
        Ok(Response::new(ValidateVolumeCapabilitiesResponse {
            confirmed: Some(Confirmed {
                volume_context: req.volume_context,
                volume_capabilities: req.volume_capabilities,
                parameters: req.parameters,
                mutable_parameters: req.mutable_parameters,
            }),
            message: String::new(),
        }))
    }
}

/// The Controller service as every controller serves it: here when
/// leading, else forwarded to the leader (`forward`).
pub fn routed(
    ctx: Arc<Context>,
    router: Arc<Router>,
) -> ControllerServer<RoutedController<ControllerService>> {
    ControllerServer::new(RoutedController::new(ControllerService::new(ctx), router))
}

/// Binds the socket now (so a bad path fails start-up) and returns the
/// server future, which ends when `shutdown` resolves.
pub fn serve(
    socket: PathBuf,
    ctx: Arc<Context>,
    router: Arc<Router>,
    ready: Arc<AtomicBool>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<impl std::future::Future<Output = Result<(), ServeError>>, ServeError> {
    let incoming = ballast::grpc::bind_unix(&socket)?;
    let identity = IdentityServer::new(IdentityService::new(Role::Controller, ready));
    let controller = routed(ctx, router);
    Ok(async move {
        Server::builder()
            .add_service(identity)
            .add_service(controller)
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
            .map_err(ServeError::from)
    })
}
