//! Every controller answers every gRPC call; a follower forwards it.
//!
//! When several controllers run on one cluster, one leads (a Lease, see
//! `kubernetes::lease`). The CSI sidecars elect their own leaders, so the
//! CSI call of a provisioner or an attacher may reach any controller's
//! socket; nodes and engines may reach any controller's agent endpoint.
//! The leader serves a call itself. A follower sends it on, unchanged, to
//! the leader's agent endpoint, which serves the CSI Controller service
//! beside the agent protocol, and returns the leader's answer. A call that
//! was already forwarded is never forwarded again: a controller that is
//! not the leader (any more) answers it UNAVAILABLE, and the caller
//! retries, as for no leader at all.
//!
//! Owns only the routing: what a call does is in `csi/` and `nodes/`.

use std::sync::{Arc, Mutex};

use ballast::cluster_token::Authed;
use ballast::proto::agent::v1::controlplane_client::ControlplaneClient;
use ballast::proto::agent::v1::controlplane_server::Controlplane;
use ballast::proto::agent::v1::{
    HeartbeatRequest, HeartbeatResponse, IssueReaderRequest, IssueReaderResponse, NodeDisksRequest,
    NodeDisksResponse, RecordReplicaSetRequest, RecordReplicaSetResponse, RegisterRequest,
    RegisterResponse,
};
use ballast::proto::csi::v1::controller_client::ControllerClient;
use ballast::proto::csi::v1::controller_server::Controller;
use ballast::proto::csi::v1::{
    ControllerExpandVolumeRequest, ControllerExpandVolumeResponse,
    ControllerGetCapabilitiesRequest, ControllerGetCapabilitiesResponse,
    ControllerGetVolumeHealthRequest, ControllerGetVolumeHealthResponse,
    ControllerGetVolumeRequest, ControllerGetVolumeResponse, ControllerListVolumeHealthRequest,
    ControllerListVolumeHealthResponse, ControllerModifyVolumeRequest,
    ControllerModifyVolumeResponse, ControllerPublishVolumeRequest,
    ControllerPublishVolumeResponse, ControllerUnpublishVolumeRequest,
    ControllerUnpublishVolumeResponse, CreateSnapshotRequest, CreateSnapshotResponse,
    CreateVolumeRequest, CreateVolumeResponse, DeleteSnapshotRequest, DeleteSnapshotResponse,
    DeleteVolumeRequest, DeleteVolumeResponse, GetCapacityRequest, GetCapacityResponse,
    GetSnapshotRequest, GetSnapshotResponse, ListSnapshotsRequest, ListSnapshotsResponse,
    ListVolumesRequest, ListVolumesResponse, ValidateVolumeCapabilitiesRequest,
    ValidateVolumeCapabilitiesResponse,
};
use tonic::{Request, Response, Status};

use crate::context::Context;

/// The metadata key a forwarded call carries.
const FORWARDED: &str = "x-ballast-forwarded";
/// When the certificate of the caller a forwarded call came from expires
/// (seconds since the Unix epoch), as the forwarding controller's
/// handshake read it: the leader sees only the forwarder's.
pub const PEER_NOT_AFTER: &str = "x-ballast-peer-not-after";

/// Where a call goes: served here, or sent on to the leader.
enum Route {
    Here,
    Leader(Authed),
}

/// Decides the route of each call, keeping one channel to the leader.
pub struct Router {
    ctx: Arc<Context>,
    channel: Mutex<Option<(String, Authed)>>,
}

impl Router {
    pub fn new(ctx: Arc<Context>) -> Arc<Router> {
        Arc::new(Router {
            ctx,
            channel: Mutex::new(None),
        })
    }

    fn route<T>(&self, request: &Request<T>) -> Result<Route, Status> {
        let leadership = self.ctx.leadership();
        if leadership.leading {
            return Ok(Route::Here);
        }
        if request.metadata().get(FORWARDED).is_some() {
            return Err(Status::unavailable(
                "this controller is not the leader (any more); retry",
            ));
        }
        let Some((leader, endpoint)) = leadership.holder.filter(|(_, e)| !e.is_empty()) else {
            return Err(Status::unavailable("no controller leads yet; retry"));
        };
        let mut cached = self.channel.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, channel)) = cached.as_ref()
            && *at == endpoint
        {
            return Ok(Route::Leader(channel.clone()));
        }
        let channel = self
            .ctx
            .member
            .channel(&endpoint, &ballast::tls::Role::Controller)
            .map_err(|e| Status::unavailable(format!("the leader {leader} at {endpoint}: {e}")))?;
        *cached = Some((endpoint, channel.clone()));
        Ok(Route::Leader(channel))
    }
}

/// The request as it is sent on: the same message, marked forwarded, with
/// when its caller's certificate expires.
fn onward<T>(request: Request<T>) -> Request<T> {
    let expires = request
        .peer_certs()
        .and_then(|certs| ballast::tls::leaf_not_after(&certs));
    let mut onward = Request::new(request.into_inner());
    let metadata = onward.metadata_mut();
    metadata.insert(FORWARDED, tonic::metadata::MetadataValue::from_static("1"));
    if let Some(at) = expires {
        metadata.insert(PEER_NOT_AFTER, at.into());
    }
    onward
}

/// Implements a service by routing each of its calls.
macro_rules! routed {
    ($service:ident, $trait:ident, $client:ident, admit = $admit:path, { $($method:ident($req:ty) -> $resp:ty;)* }) => {
        /// The service every controller serves: by `local` when leading,
        /// else forwarded to the leader.
        pub struct $service<L> {
            local: L,
            router: Arc<Router>,
        }

        impl<L> $service<L> {
            pub fn new(local: L, router: Arc<Router>) -> Self {
                $service { local, router }
            }
        }

        #[tonic::async_trait]
        impl<L: $trait> $trait for $service<L> {
            $(
                async fn $method(&self, request: Request<$req>) -> Result<Response<$resp>, Status> {
                    // Checked where the caller connected, before a
                    // forward hides who it was.
                    $admit(&request)?;
                    match self.router.route(&request)? {
                        Route::Here => self.local.$method(request).await,
                        Route::Leader(channel) => {
                            // The channel carries the token and this
                            // controller's certificate.
                            $client::new(channel)
                                .$method(onward(request))
                                .await
                        }
                    }
                }
            )*
        }
    };
}

/// CSI calls: the endpoint's gates decide who may make them.
fn anyone<T>(_: &Request<T>) -> Result<(), Status> {
    Ok(())
}

routed!(RoutedController, Controller, ControllerClient, admit = anyone, {
    controller_get_capabilities(ControllerGetCapabilitiesRequest) -> ControllerGetCapabilitiesResponse;
    create_volume(CreateVolumeRequest) -> CreateVolumeResponse;
    delete_volume(DeleteVolumeRequest) -> DeleteVolumeResponse;
    controller_publish_volume(ControllerPublishVolumeRequest) -> ControllerPublishVolumeResponse;
    controller_unpublish_volume(ControllerUnpublishVolumeRequest) -> ControllerUnpublishVolumeResponse;
    list_volumes(ListVolumesRequest) -> ListVolumesResponse;
    controller_expand_volume(ControllerExpandVolumeRequest) -> ControllerExpandVolumeResponse;
    controller_get_volume(ControllerGetVolumeRequest) -> ControllerGetVolumeResponse;
    controller_get_volume_health(ControllerGetVolumeHealthRequest) -> ControllerGetVolumeHealthResponse;
    controller_list_volume_health(ControllerListVolumeHealthRequest) -> ControllerListVolumeHealthResponse;
    controller_modify_volume(ControllerModifyVolumeRequest) -> ControllerModifyVolumeResponse;
    get_capacity(GetCapacityRequest) -> GetCapacityResponse;
    create_snapshot(CreateSnapshotRequest) -> CreateSnapshotResponse;
    delete_snapshot(DeleteSnapshotRequest) -> DeleteSnapshotResponse;
    list_snapshots(ListSnapshotsRequest) -> ListSnapshotsResponse;
    get_snapshot(GetSnapshotRequest) -> GetSnapshotResponse;
    validate_volume_capabilities(ValidateVolumeCapabilitiesRequest) -> ValidateVolumeCapabilitiesResponse;
});

/// A controlplane call speaks for one node: with TLS on, only that node's
/// certificate (or a controller's, forwarding) may make it, and an
/// engine's claim of an attachment must be in its certificate.
fn for_its_node<T: ForNode>(request: &Request<T>) -> Result<(), Status> {
    ballast::tls::acts_for_node(request, request.get_ref().node_id())?;
    match request.get_ref().attachment() {
        Some((volume, epoch)) => ballast::tls::claims_attachment(request, volume, epoch),
        None => Ok(()),
    }
}

/// A request made for one node.
trait ForNode {
    fn node_id(&self) -> &str;
    /// The attachment of a volume the caller claims to be the engine of.
    fn attachment(&self) -> Option<(&str, u64)> {
        None
    }
}

macro_rules! for_node {
    ($($t:ty),*) => {
        $(impl ForNode for $t {
            fn node_id(&self) -> &str {
                &self.node_id
            }
        })*
    };
}

for_node!(
    RegisterRequest,
    HeartbeatRequest,
    NodeDisksRequest,
    IssueReaderRequest
);

impl ForNode for RecordReplicaSetRequest {
    fn node_id(&self) -> &str {
        &self.node_id
    }
    fn attachment(&self) -> Option<(&str, u64)> {
        (self.engine_epoch != 0).then_some((&self.volume, self.engine_epoch))
    }
}

routed!(RoutedControlplane, Controlplane, ControlplaneClient, admit = for_its_node, {
    register(RegisterRequest) -> RegisterResponse;
    heartbeat(HeartbeatRequest) -> HeartbeatResponse;
    record_replica_set(RecordReplicaSetRequest) -> RecordReplicaSetResponse;
    node_disks(NodeDisksRequest) -> NodeDisksResponse;
    issue_reader(IssueReaderRequest) -> IssueReaderResponse;
});
