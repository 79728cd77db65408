//! Controller service checks csi-sanity does not make: StorageClass
//! parameters checked by name, any CO name of up to 128 bytes mapped to a
//! volume id (and the same volume for the same request), free capacity
//! reported, and a published volume neither deleted nor shown unpublished.
//! They create small volumes (16 MiB, one replica) named `sanity-...` or
//! `Sanity-...` and delete them.

use std::collections::HashMap;

use ballast::proto::csi::v1::controller_client::ControllerClient;
use ballast::proto::csi::v1::{
    CapacityRange, ControllerGetVolumeRequest, ControllerPublishVolumeRequest,
    ControllerUnpublishVolumeRequest, CreateVolumeRequest, DeleteVolumeRequest, GetCapacityRequest,
    ListVolumesRequest, Topology, Volume,
};
use tonic::Code;
use tonic::transport::Channel;

use crate::{CheckResult, Expectations, Outcome, ensure, expect_code, single_writer_mount};

const SIZE: i64 = 16 << 20;

fn request(name: &str, required: i64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: required,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![single_writer_mount()],
        parameters: HashMap::from([("numberOfReplicas".to_string(), "1".to_string())]),
        ..Default::default()
    }
}

fn client(ch: &Channel) -> ControllerClient<Channel> {
    ControllerClient::new(ch.clone())
}

async fn delete(ch: &Channel, id: &str) -> CheckResult {
    client(ch)
        .delete_volume(DeleteVolumeRequest {
            volume_id: id.into(),
            ..Default::default()
        })
        .await
        .map(drop)
        .map_err(|s| format!("DeleteVolume {id}: {s}"))
}

/// Bad StorageClass parameters are refused by name; a range that holds no
/// size is OUT_OF_RANGE.
async fn parameters_are_checked_by_name(ch: &Channel) -> CheckResult {
    let mut c = client(ch);
    let mut bad = request("sanity-bad-param", SIZE);
    bad.parameters
        .insert("numberOfReplicas".into(), "zero".into());
    let r = c.create_volume(bad).await;
    if let Err(s) = &r {
        ensure(s.message().contains("numberOfReplicas"), || {
            format!("the error does not name the parameter: {}", s.message())
        })?;
    }
    expect_code(
        r,
        Code::InvalidArgument,
        "CreateVolume with a bad parameter",
    )?;
    let mut unknown = request("sanity-unknown-param", SIZE);
    unknown.parameters.insert("replicaCount".into(), "1".into());
    let r = c.create_volume(unknown).await;
    if let Err(s) = &r {
        ensure(s.message().contains("replicaCount"), || {
            format!("the error does not name the key: {}", s.message())
        })?;
    }
    expect_code(
        r,
        Code::InvalidArgument,
        "CreateVolume with an unknown parameter",
    )?;
    let mut range = request("sanity-bad-range", 5000);
    if let Some(r) = range.capacity_range.as_mut() {
        r.limit_bytes = 4097;
    }
    let r = c.create_volume(range).await;
    expect_code(
        r,
        Code::OutOfRange,
        "CreateVolume whose range holds no size",
    )
}

/// A CO name of 128 bytes in mixed case with dots and '_' (what no DNS
/// label allows) creates a volume; the same request again returns the same
/// volume; ControllerGetVolume finds it by the id, with a normal condition.
async fn any_co_name_creates_one_volume(ch: &Channel, prefix: &str) -> CheckResult {
    let start = format!("PVC-Upper_Case.with.dots-{prefix}-");
    let name = format!("{start}{}", "x".repeat(128 - start.len()));
    let mut c = client(ch);
    let mut made = Vec::new();
    for _ in 0..2 {
        made.push(
            c.create_volume(request(&name, SIZE))
                .await
                .map_err(|s| format!("CreateVolume of a 128-byte name: {s}"))?
                .into_inner()
                .volume
                .ok_or_else(|| "CreateVolume returned no volume".to_string())?,
        );
    }
    let (a, b): (&Volume, &Volume) = (&made[0], &made[1]);
    ensure(a == b, || {
        format!("a repeated CreateVolume returns another volume: {a:?} vs {b:?}")
    })?;
    ensure(!a.volume_id.is_empty() && a.volume_id != name, || {
        format!("volume id {:?} for the name {name:?}", a.volume_id)
    })?;
    let got = c
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: a.volume_id.clone(),
        })
        .await
        .map_err(|s| format!("ControllerGetVolume {}: {s}", a.volume_id))?
        .into_inner();
    ensure(got.volume.as_ref() == Some(a), || {
        format!(
            "ControllerGetVolume answers {:?}, CreateVolume {a:?}",
            got.volume
        )
    })?;
    let condition = got.status.and_then(|s| s.volume_condition);
    ensure(condition.is_some_and(|c| !c.abnormal), || {
        "a new volume has no condition, or an abnormal one".into()
    })?;
    delete(ch, &a.volume_id).await
}

/// Capacity is reported, for the whole cluster and per topology segment:
/// `node`'s (when one is given) has some and no more than the whole, a zone
/// that does not exist has none.
async fn capacity(ch: &Channel, node: Option<&str>) -> CheckResult {
    let ask = |segment: Option<(&str, &str)>| {
        let mut c = client(ch);
        let req = GetCapacityRequest {
            volume_capabilities: vec![single_writer_mount()],
            accessible_topology: segment.map(|(k, v)| Topology {
                segments: HashMap::from([(k.to_string(), v.to_string())]),
            }),
            ..Default::default()
        };
        async move {
            c.get_capacity(req)
                .await
                .map(|r| r.into_inner().available_capacity)
                .map_err(|s| format!("GetCapacity: {s}"))
        }
    };
    let all = ask(None).await?;
    ensure(all > 0, || format!("available_capacity is {all}"))?;
    if let Some(node) = node {
        let here = ask(Some((ballast::topology::NODE_KEY, node))).await?;
        ensure(here > 0 && here <= all, || {
            format!("node {node}'s capacity is {here}, the cluster's {all}")
        })?;
    }
    let nowhere = ask(Some((ballast::topology::ZONE_KEY, "no-such-zone"))).await?;
    ensure(nowhere == 0, || {
        format!("a zone that does not exist has capacity {nowhere}")
    })
}

/// A published volume carries its engine's endpoint, is listed at its
/// node, and cannot be deleted (FAILED_PRECONDITION) until unpublished.
async fn a_published_volume_is_not_deleted(ch: &Channel, prefix: &str, node: &str) -> CheckResult {
    let mut c = client(ch);
    let name = format!("{prefix}-pub");
    c.create_volume(request(&name, SIZE))
        .await
        .map_err(|s| format!("CreateVolume: {s}"))?;
    let publish = |volume: &str, node: &str| ControllerPublishVolumeRequest {
        volume_id: volume.into(),
        node_id: node.into(),
        volume_capability: Some(single_writer_mount()),
        ..Default::default()
    };
    let first = c
        .controller_publish_volume(publish(&name, node))
        .await
        .map_err(|s| format!("ControllerPublishVolume: {s}"))?
        .into_inner();
    ensure(
        first.publish_context.contains_key("frontendEndpoint"),
        || format!("the publish context has no engine endpoint: {first:?}"),
    )?;
    let listed = c
        .list_volumes(ListVolumesRequest::default())
        .await
        .map_err(|s| format!("ListVolumes: {s}"))?
        .into_inner();
    let published = listed
        .entries
        .iter()
        .find(|e| e.volume.as_ref().is_some_and(|v| v.volume_id == name))
        .and_then(|e| e.status.as_ref())
        .map(|s| s.published_node_ids.clone())
        .unwrap_or_default();
    ensure(published == [node.to_string()], || {
        format!("ListVolumes says it is published at {published:?}, not [{node}]")
    })?;
    let r = c
        .delete_volume(DeleteVolumeRequest {
            volume_id: name.clone(),
            ..Default::default()
        })
        .await;
    expect_code(
        r,
        Code::FailedPrecondition,
        "DeleteVolume of a published volume",
    )?;
    let unpublish = |volume: &str, node: &str| ControllerUnpublishVolumeRequest {
        volume_id: volume.into(),
        node_id: node.into(),
        ..Default::default()
    };
    c.controller_unpublish_volume(unpublish(&name, node))
        .await
        .map_err(|s| format!("ControllerUnpublishVolume: {s}"))?;
    delete(ch, &name).await
}

/// Runs every Controller check against `ch`; the publish checks need the
/// id of a ready node (`exp.node_id`).
pub async fn controller_checks(ch: &Channel, exp: &Expectations) -> Vec<Outcome> {
    let prefix = format!("sanity-{}", std::process::id());
    let mut out = vec![
        Outcome {
            name: "controller: a bad or unknown StorageClass parameter is INVALID_ARGUMENT naming it; a range with no size is OUT_OF_RANGE",
            failure: parameters_are_checked_by_name(ch).await.err(),
        },
        Outcome {
            name: "controller: any CO name of up to 128 bytes creates one volume, found again by the same request",
            failure: any_co_name_creates_one_volume(ch, &prefix).await.err(),
        },
        Outcome {
            name: "controller: GetCapacity reports free bytes, in all and per node and zone",
            failure: capacity(ch, exp.node_id.as_deref()).await.err(),
        },
    ];
    if let Some(node) = &exp.node_id {
        out.push(Outcome {
            name: "controller: a published volume has an engine endpoint, is listed at its node, and is not deleted",
            failure: a_published_volume_is_not_deleted(ch, &prefix, node).await.err(),
        });
    }
    out
}
