//! Controller service checks: what the CSI spec requires of CreateVolume,
//! DeleteVolume, ControllerPublishVolume, ControllerUnpublishVolume,
//! ListVolumes and GetCapacity, the error cases included. They create
//! small volumes (16 MiB, one replica) named `sanity-...` and delete them.

use std::collections::HashMap;

use ballast::proto::csi::v1::controller_client::ControllerClient;
use ballast::proto::csi::v1::{
    CapacityRange, ControllerGetVolumeRequest, ControllerPublishVolumeRequest,
    ControllerUnpublishVolumeRequest, CreateVolumeRequest, DeleteVolumeRequest, GetCapacityRequest,
    ListVolumesRequest,
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

async fn create_validates_its_request(ch: &Channel) -> CheckResult {
    let mut c = client(ch);
    let r = c.create_volume(request("", SIZE)).await;
    expect_code(r, Code::InvalidArgument, "CreateVolume without a name")?;
    let mut no_caps = request("sanity-no-caps", SIZE);
    no_caps.volume_capabilities.clear();
    let r = c.create_volume(no_caps).await;
    expect_code(
        r,
        Code::InvalidArgument,
        "CreateVolume without capabilities",
    )?;
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

async fn create_is_idempotent(ch: &Channel, prefix: &str) -> CheckResult {
    let name = format!("{prefix}-idem");
    let mut c = client(ch);
    let a = c
        .create_volume(request(&name, SIZE))
        .await
        .map_err(|s| format!("CreateVolume: {s}"))?
        .into_inner()
        .volume
        .ok_or("CreateVolume returned no volume")?;
    ensure(a.capacity_bytes >= SIZE, || {
        format!("capacity {} is below the {SIZE} required", a.capacity_bytes)
    })?;
    ensure(!a.volume_id.is_empty(), || "empty volume_id".into())?;
    let b = c
        .create_volume(request(&name, SIZE))
        .await
        .map_err(|s| format!("second CreateVolume: {s}"))?
        .into_inner()
        .volume
        .ok_or("second CreateVolume returned no volume")?;
    ensure(a == b, || {
        format!("a repeated CreateVolume differs: {a:?} vs {b:?}")
    })?;
    let r = c.create_volume(request(&name, 4 * SIZE)).await;
    expect_code(
        r,
        Code::AlreadyExists,
        "CreateVolume of the same name with a larger size",
    )?;
    let got = c
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: a.volume_id.clone(),
        })
        .await
        .map_err(|s| format!("ControllerGetVolume: {s}"))?
        .into_inner();
    ensure(got.volume.as_ref() == Some(&a), || {
        format!(
            "ControllerGetVolume answers {:?}, CreateVolume {a:?}",
            got.volume
        )
    })?;
    let condition = got.status.and_then(|s| s.volume_condition);
    ensure(condition.is_some_and(|c| !c.abnormal), || {
        "a new volume has no condition, or an abnormal one".into()
    })?;
    delete(ch, &a.volume_id).await?;
    delete(ch, &a.volume_id).await?;
    let r = c
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: a.volume_id.clone(),
        })
        .await;
    expect_code(r, Code::NotFound, "ControllerGetVolume of a deleted volume")?;
    let r = c
        .delete_volume(DeleteVolumeRequest {
            volume_id: String::new(),
            ..Default::default()
        })
        .await;
    expect_code(r, Code::InvalidArgument, "DeleteVolume without volume_id")
}

async fn list_pages(ch: &Channel, prefix: &str) -> CheckResult {
    let mut c = client(ch);
    let names: Vec<String> = (0..3).map(|i| format!("{prefix}-list-{i}")).collect();
    for n in &names {
        c.create_volume(request(n, SIZE))
            .await
            .map_err(|s| format!("CreateVolume {n}: {s}"))?;
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    for _ in 0..1000 {
        let page = c
            .list_volumes(ListVolumesRequest {
                max_entries: 1,
                starting_token: token.clone(),
            })
            .await
            .map_err(|s| format!("ListVolumes: {s}"))?
            .into_inner();
        ensure(page.entries.len() <= 1, || {
            format!("{} entries for max_entries 1", page.entries.len())
        })?;
        seen.extend(
            page.entries
                .into_iter()
                .filter_map(|e| e.volume.map(|v| v.volume_id)),
        );
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    for n in &names {
        ensure(seen.contains(n), || {
            format!("{n} missing from the pages: {seen:?}")
        })?;
    }
    let r = c
        .list_volumes(ListVolumesRequest {
            max_entries: 0,
            starting_token: "not-a-token".into(),
        })
        .await;
    expect_code(r, Code::Aborted, "ListVolumes with a token it did not give")?;
    for n in &names {
        delete(ch, n).await?;
    }
    Ok(())
}

async fn capacity(ch: &Channel) -> CheckResult {
    let free = client(ch)
        .get_capacity(GetCapacityRequest {
            volume_capabilities: vec![single_writer_mount()],
            ..Default::default()
        })
        .await
        .map_err(|s| format!("GetCapacity: {s}"))?
        .into_inner()
        .available_capacity;
    ensure(free > 0, || format!("available_capacity is {free}"))
}

async fn publish_and_unpublish(ch: &Channel, prefix: &str, node: &str) -> CheckResult {
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
    let r = c.controller_publish_volume(publish("", node)).await;
    expect_code(
        r,
        Code::InvalidArgument,
        "ControllerPublishVolume without volume_id",
    )?;
    let r = c.controller_publish_volume(publish(&name, "")).await;
    expect_code(
        r,
        Code::InvalidArgument,
        "ControllerPublishVolume without node_id",
    )?;
    let r = c
        .controller_publish_volume(publish("sanity-no-such-volume", node))
        .await;
    expect_code(
        r,
        Code::NotFound,
        "ControllerPublishVolume of an unknown volume",
    )?;
    let r = c
        .controller_publish_volume(publish(&name, "sanity-no-such-node"))
        .await;
    expect_code(
        r,
        Code::NotFound,
        "ControllerPublishVolume to an unknown node",
    )?;
    let first = c
        .controller_publish_volume(publish(&name, node))
        .await
        .map_err(|s| format!("ControllerPublishVolume: {s}"))?
        .into_inner();
    let again = c
        .controller_publish_volume(publish(&name, node))
        .await
        .map_err(|s| format!("repeated ControllerPublishVolume: {s}"))?
        .into_inner();
    ensure(first == again, || {
        format!("a repeated publish answers differently: {first:?} vs {again:?}")
    })?;
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
    let r = c.controller_unpublish_volume(unpublish("", node)).await;
    expect_code(
        r,
        Code::InvalidArgument,
        "ControllerUnpublishVolume without volume_id",
    )?;
    for (what, v) in [
        ("ControllerUnpublishVolume", name.as_str()),
        ("repeated ControllerUnpublishVolume", name.as_str()),
        (
            "ControllerUnpublishVolume of an unknown volume",
            "sanity-no-such-volume",
        ),
    ] {
        c.controller_unpublish_volume(unpublish(v, node))
            .await
            .map_err(|s| format!("{what}: {s}"))?;
    }
    delete(ch, &name).await
}

/// Runs every Controller check against `ch`; the publish checks need the
/// id of a ready node (`exp.node_id`).
pub async fn controller_checks(ch: &Channel, exp: &Expectations) -> Vec<Outcome> {
    let prefix = format!("sanity-{}", std::process::id());
    let mut out = vec![
        Outcome {
            name: "controller: CreateVolume validates name, capabilities, parameters and range",
            failure: create_validates_its_request(ch).await.err(),
        },
        Outcome {
            name: "controller: CreateVolume and DeleteVolume are idempotent; a different request of the same name is ALREADY_EXISTS; ControllerGetVolume",
            failure: create_is_idempotent(ch, &prefix).await.err(),
        },
        Outcome {
            name: "controller: ListVolumes pages with next_token and aborts on a token it did not give",
            failure: list_pages(ch, &prefix).await.err(),
        },
        Outcome {
            name: "controller: GetCapacity reports free bytes",
            failure: capacity(ch).await.err(),
        },
    ];
    if let Some(node) = &exp.node_id {
        out.push(Outcome {
            name: "controller: publish and unpublish are idempotent, with spec error codes",
            failure: publish_and_unpublish(ch, &prefix, node).await.err(),
        });
    }
    out
}
