//! Node service checks that need no volume: what NodeGetInfo and
//! NodeGetCapabilities report, and the spec's codes for bad or repeated
//! requests (the full stage/publish flow is tested end to end with a
//! volume, in `cli/tests/csi_node.rs`).

use ballast::proto::csi::v1::node_client::NodeClient;
use ballast::proto::csi::v1::node_service_capability::{self, rpc::Type as RpcType};
use ballast::proto::csi::v1::{
    NodeGetCapabilitiesRequest, NodeGetInfoRequest, NodeGetVolumeStatsRequest,
    NodePublishVolumeRequest, NodeStageVolumeRequest, NodeUnpublishVolumeRequest,
    NodeUnstageVolumeRequest,
};
use tonic::Code;
use tonic::transport::Channel;

use crate::{CheckResult, Outcome, ensure, expect_code, single_writer_mount};

async fn info_and_capabilities(ch: &Channel) -> CheckResult {
    let mut c = NodeClient::new(ch.clone());
    let info = c
        .node_get_info(NodeGetInfoRequest {})
        .await
        .map_err(|s| format!("NodeGetInfo: {s}"))?
        .into_inner();
    ensure(!info.node_id.is_empty(), || {
        "NodeGetInfo: empty node_id".into()
    })?;
    let caps = c
        .node_get_capabilities(NodeGetCapabilitiesRequest {})
        .await
        .map_err(|s| format!("NodeGetCapabilities: {s}"))?
        .into_inner()
        .capabilities;
    let stage = caps.iter().any(|cap| {
        matches!(
            &cap.r#type,
            Some(node_service_capability::Type::Rpc(r)) if r.r#type == RpcType::StageUnstageVolume as i32
        )
    });
    ensure(stage, || {
        format!("STAGE_UNSTAGE_VOLUME is not advertised: {caps:?}")
    })
}

async fn bad_requests(ch: &Channel) -> CheckResult {
    let mut c = NodeClient::new(ch.clone());
    let stage = |id: &str, path: &str, cap: bool| NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: path.into(),
        volume_capability: cap.then(single_writer_mount),
        ..Default::default()
    };
    let r = c
        .node_stage_volume(stage("", "/tmp/sanity-stage", true))
        .await;
    expect_code(
        r,
        Code::InvalidArgument,
        "NodeStageVolume without volume_id",
    )?;
    let r = c.node_stage_volume(stage("sanity-v", "", true)).await;
    expect_code(
        r,
        Code::InvalidArgument,
        "NodeStageVolume without a staging path",
    )?;
    let r = c
        .node_stage_volume(stage("sanity-v", "/tmp/sanity-stage", false))
        .await;
    expect_code(
        r,
        Code::InvalidArgument,
        "NodeStageVolume without a capability",
    )?;
    let r = c
        .node_publish_volume(NodePublishVolumeRequest {
            volume_id: "sanity-v".into(),
            staging_target_path: "/tmp/sanity-stage".into(),
            target_path: String::new(),
            volume_capability: Some(single_writer_mount()),
            ..Default::default()
        })
        .await;
    expect_code(
        r,
        Code::InvalidArgument,
        "NodePublishVolume without a target path",
    )?;
    let r = c
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: "sanity-v".into(),
            volume_path: "/sanity/no/such/path".into(),
            ..Default::default()
        })
        .await;
    expect_code(
        r,
        Code::NotFound,
        "NodeGetVolumeStats of a path that does not exist",
    )?;
    // Undoing what was never done succeeds.
    c.node_unpublish_volume(NodeUnpublishVolumeRequest {
        volume_id: "sanity-never-published".into(),
        target_path: "/tmp/sanity-never-published".into(),
    })
    .await
    .map_err(|s| format!("NodeUnpublishVolume of what was never published: {s}"))?;
    c.node_unstage_volume(NodeUnstageVolumeRequest {
        volume_id: "sanity-never-staged".into(),
        staging_target_path: "/tmp/sanity-never-staged".into(),
    })
    .await
    .map_err(|s| format!("NodeUnstageVolume of what was never staged: {s}"))?;
    Ok(())
}

/// Runs every Node check against `ch`.
pub async fn node_checks(ch: &Channel) -> Vec<Outcome> {
    vec![
        Outcome {
            name: "node: NodeGetInfo names the node; STAGE_UNSTAGE_VOLUME is advertised",
            failure: info_and_capabilities(ch).await.err(),
        },
        Outcome {
            name: "node: bad requests are INVALID_ARGUMENT or NOT_FOUND; undoing what was never done is OK",
            failure: bad_requests(ch).await.err(),
        },
    ]
}
