//! The Controller service's volume RPCs: CreateVolume, DeleteVolume,
//! ControllerPublishVolume, ControllerUnpublishVolume, ListVolumes and
//! GetCapacity. Each validates its request, translates it to the volume
//! lifecycle the REST API also uses (`crate::executor`), and answers with
//! the codes the CSI spec prescribes; every one is idempotent. The volume
//! id is the volume's name, derived from the CO's name by `ids::id_for`
//! and kept with the CO's name on the record (`spec.csiName`).

use std::collections::HashMap;
use std::sync::Arc;

use ballast::model::{AccessMode, DataLocality, FsType, Node, Robustness, Volume};
use ballast::proto::csi::v1::volume_capability::AccessType;
use ballast::proto::csi::v1::volume_capability::access_mode::Mode;
use ballast::proto::csi::v1::{
    self as csi, CapacityRange, ControllerExpandVolumeRequest, ControllerExpandVolumeResponse,
    ControllerGetVolumeRequest, ControllerGetVolumeResponse, ControllerModifyVolumeRequest,
    ControllerModifyVolumeResponse, ControllerPublishVolumeRequest,
    ControllerPublishVolumeResponse, ControllerUnpublishVolumeRequest, CreateVolumeRequest,
    DeleteVolumeRequest, GetCapacityRequest, GetCapacityResponse, ListVolumesRequest,
    ListVolumesResponse, VolumeCapability, VolumeCondition, controller_get_volume_response,
    list_volumes_response,
};
use ballast::proto::csi::v1::{
    ControllerGetVolumeHealthRequest, ControllerGetVolumeHealthResponse,
    ControllerListVolumeHealthRequest, ControllerListVolumeHealthResponse, VolumeHealth,
    VolumeHealthErrorType, volume_health::VolumeHealthEntry,
};

use super::check_capability;
use super::ids::{check_name, id_for, page};
use super::params::StorageClassParams;
use crate::context::Context;
use crate::error::Error;
use crate::volumes::{CreateVolume, SIZE_ALIGN};

/// The size of a volume whose request names none.
pub const DEFAULT_SIZE: u64 = 1 << 30;

/// The key of ControllerPublishVolume's answer that carries the engine's
/// NBD endpoint, for NodeStageVolume.
pub const ENDPOINT_KEY: &str = "frontendEndpoint";

/// The size to create for `range`: the required bytes rounded up to 4 KiB
/// (1 GiB when none is required), within the limit.
pub fn size_for(range: Option<&CapacityRange>) -> Result<u64, Error> {
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    if required < 0 || limit < 0 {
        return Err(Error::invalid(
            "capacity_range",
            "bytes must not be negative",
        ));
    }
    let (required, limit) = (required as u64, limit as u64);
    let size = if required == 0 {
        match limit {
            0 => DEFAULT_SIZE,
            l => DEFAULT_SIZE.min(l / SIZE_ALIGN * SIZE_ALIGN),
        }
    } else {
        required.div_ceil(SIZE_ALIGN) * SIZE_ALIGN
    };
    if size == 0 || (limit > 0 && size > limit) {
        return Err(Error::OutOfRange {
            field: "capacity_range".into(),
            message: format!(
                "required_bytes {required} and limit_bytes {limit} leave no size that is a \
                 positive multiple of {SIZE_ALIGN} bytes"
            ),
        });
    }
    Ok(size)
}

/// Whether an existing volume satisfies a repeated CreateVolume.
fn compatible(v: &Volume, range: Option<&CapacityRange>, wanted: &Volume) -> Result<(), String> {
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    let size = v.spec.size;
    if size < required.max(0) as u64 || (limit > 0 && size > limit as u64) {
        return Err(format!(
            "it has {size} bytes, outside required_bytes {required} / limit_bytes {limit}"
        ));
    }
    let (a, b) = (&v.spec, &wanted.spec);
    if a.number_of_replicas != b.number_of_replicas
        || a.fs_type != b.fs_type
        || a.access_mode != b.access_mode
        || a.data_locality != b.data_locality
        || a.disk_selector != b.disk_selector
        || a.node_selector != b.node_selector
        || a.mkfs_params != b.mkfs_params
        || a.source != b.source
    {
        return Err("its parameters or capabilities differ".into());
    }
    Ok(())
}

/// The filesystem a request asks for: the StorageClass's `fsType` and the
/// mount capabilities' `fs_type` must agree.
fn fs_type_of(params: &StorageClassParams, caps: &[VolumeCapability]) -> Result<FsType, Error> {
    let mut wanted = params.fs_type;
    for c in caps {
        if let Some(AccessType::Mount(m)) = &c.access_type
            && !m.fs_type.is_empty()
        {
            let t: FsType = m
                .fs_type
                .parse()
                .map_err(|e: String| Error::invalid("volume_capabilities", e))?;
            if wanted.is_some_and(|w| w != t) {
                return Err(Error::invalid(
                    "fsType",
                    format!("{wanted:?} and the capability's fs_type {t} disagree"),
                ));
            }
            wanted = Some(t);
        }
    }
    Ok(wanted.unwrap_or(FsType::Ext4))
}

fn access_mode_of(caps: &[VolumeCapability]) -> AccessMode {
    let read_only = caps.iter().all(|c| {
        c.access_mode
            .as_ref()
            .is_some_and(|m| m.mode == Mode::SingleNodeReaderOnly as i32)
    });
    if read_only {
        AccessMode::ReadOnlyMany
    } else {
        AccessMode::ReadWriteOnce
    }
}

/// What CreateVolume and ListVolumes report of a volume.
fn csi_volume(v: &Volume) -> csi::Volume {
    let mut context = HashMap::from([
        ("fsType".to_string(), v.spec.fs_type.to_string()),
        (
            "numberOfReplicas".to_string(),
            v.spec.number_of_replicas.to_string(),
        ),
    ]);
    if !v.spec.mkfs_params.is_empty() {
        context.insert("mkfsParams".into(), v.spec.mkfs_params.clone());
    }
    csi::Volume {
        capacity_bytes: i64::try_from(v.spec.size).unwrap_or(i64::MAX),
        volume_id: v.name.clone(),
        volume_context: context,
        // Pinned: only its node; else every node (no topology).
        accessible_topology: v
            .spec
            .pinned_node
            .iter()
            .map(|n| ballast::topology::pinned_to(n))
            .collect(),
        content_source: super::snapshots::content_source(v),
    }
}

/// The node a strict-local volume is pinned to: the first node the CO's
/// requirements name (preferred first) that is a Ballast node; with none
/// named, no pin (the planner places it, and the CO learns nothing).
async fn pinned_node(
    ctx: &Context,
    req: Option<&csi::TopologyRequirement>,
) -> Result<Option<String>, Error> {
    let named = ballast::topology::nodes_named(req);
    for n in &named {
        if ctx.store.get::<Node>(n).await?.is_some() {
            return Ok(Some(n.clone()));
        }
    }
    match named.first() {
        Some(n) => Err(Error::NoRoom(format!(
            "the strict-local volume's topology names {}, none of them a Ballast node; first: {n}",
            named.join(", ")
        ))),
        None => Ok(None),
    }
}

fn check_capabilities(caps: &[VolumeCapability]) -> Result<(), Error> {
    if caps.is_empty() {
        return Err(Error::invalid(
            "volume_capabilities",
            "at least one is required",
        ));
    }
    for c in caps {
        check_capability(c).map_err(|m| Error::invalid("volume_capabilities", m))?;
    }
    Ok(())
}

#[tracing::instrument(skip_all, fields(rpc = "CreateVolume", volume = %req.name))]
pub async fn create(ctx: &Arc<Context>, req: CreateVolumeRequest) -> Result<csi::Volume, Error> {
    check_name(&req.name)?;
    check_capabilities(&req.volume_capabilities)?;
    let source = super::snapshots::source_of(ctx, req.volume_content_source.as_ref()).await?;
    let params = StorageClassParams::try_from(&req.parameters)?;
    let range = req.capacity_range.as_ref();
    let id = id_for(&req.name);
    let settings = ctx.settings().await?;
    let locality = params
        .data_locality
        .unwrap_or_else(|| settings.default_data_locality());
    // A strict-local volume lives where the CO puts its pod.
    let pinned = match locality {
        DataLocality::StrictLocal => {
            pinned_node(ctx, req.accessibility_requirements.as_ref()).await?
        }
        _ => None,
    };
    let request = CreateVolume {
        name: id.clone(),
        size: size_for(range)?,
        data_locality: pinned
            .as_ref()
            .map_or(params.data_locality, |_| Some(locality)),
        access_mode: Some(access_mode_of(&req.volume_capabilities)),
        fs_type: Some(fs_type_of(&params, &req.volume_capabilities)?),
        pinned_node: pinned,
        csi_name: Some(req.name.clone()),
        source,
        ..params
    };
    // A VolumeAttributesClass's values stand over the StorageClass's.
    let vac = super::params::mutable(&req.mutable_parameters)?;
    let request = CreateVolume {
        number_of_replicas: vac.number_of_replicas.or(request.number_of_replicas),
        data_locality: vac.data_locality.or(request.data_locality),
        replica_auto_balance: vac.replica_auto_balance.or(request.replica_auto_balance),
        ..request
    };
    let wanted = crate::volumes::build(request, &settings)?;
    let existing = |v: Volume| {
        // A volume made outside CSI has no CO name: its name stands for it.
        let owner = v.spec.csi_name.as_deref().unwrap_or(&v.name);
        if owner != req.name {
            return Err(Error::AlreadyExists(format!(
                "volume id {:?} already belongs to the CO name {owner:?}",
                v.name
            )));
        }
        if v.status.state == ballast::model::VolumeState::Creating {
            // Its replicas are still being made, or filled from its source.
            return Err(Error::Conflict(format!(
                "volume {:?} is still being created; retry",
                v.name
            )));
        }
        compatible(&v, range, &wanted)
            .map(|()| csi_volume(&v))
            .map_err(|why| {
                Error::AlreadyExists(format!(
                    "volume {:?} exists and does not match the request: {why}",
                    v.name
                ))
            })
    };
    if let Some(v) = ctx.store.get::<Volume>(&id).await? {
        // One left `creating` by a controller that stopped mid-way is made
        // again (the executor clears what it left); else it is answered.
        let cut_off =
            v.status.state == ballast::model::VolumeState::Creating && !ctx.volume_busy(&v.name);
        if !cut_off {
            return existing(v);
        }
    }
    match crate::executor::create(ctx, wanted.clone()).await {
        Ok(v) => Ok(csi_volume(&v)),
        // Created meanwhile by a call like this one.
        Err(Error::AlreadyExists(m)) => match ctx.store.get::<Volume>(&id).await? {
            Some(v) => existing(v),
            None => Err(Error::AlreadyExists(m)),
        },
        Err(e) => Err(e),
    }
}

#[tracing::instrument(skip_all, fields(rpc = "DeleteVolume", volume = %req.volume_id))]
pub async fn delete(ctx: &Arc<Context>, req: DeleteVolumeRequest) -> Result<(), Error> {
    if req.volume_id.is_empty() {
        return Err(Error::invalid("volume_id", "is required"));
    }
    let Some(v) = ctx.store.get::<Volume>(&req.volume_id).await? else {
        return Ok(());
    };
    if let Some(node) = &v.status.attached_node {
        return Err(Error::Unprocessable(format!(
            "volume {:?} is in use: published at node {node}",
            v.name
        )));
    }
    match crate::executor::delete(ctx, &req.volume_id).await {
        Err(Error::NotFound { .. } | Error::NotOnNode(_)) => Ok(()),
        other => other,
    }
}

#[tracing::instrument(skip_all, fields(rpc = "ControllerPublishVolume", volume = %req.volume_id, node = %req.node_id))]
pub async fn publish(
    ctx: &Arc<Context>,
    req: ControllerPublishVolumeRequest,
) -> Result<ControllerPublishVolumeResponse, Error> {
    if req.volume_id.is_empty() {
        return Err(Error::invalid("volume_id", "is required"));
    }
    if req.node_id.is_empty() {
        return Err(Error::invalid("node_id", "is required"));
    }
    let cap = req
        .volume_capability
        .as_ref()
        .ok_or_else(|| Error::invalid("volume_capability", "is required"))?;
    check_capability(cap).map_err(|m| Error::invalid("volume_capability", m))?;
    let volume: Volume = ctx.store.fetch(&req.volume_id).await?;
    ctx.store.fetch::<Node>(&req.node_id).await?;
    let answer = |v: &Volume| ControllerPublishVolumeResponse {
        publish_context: v
            .status
            .frontend_endpoint
            .iter()
            .map(|e| (ENDPOINT_KEY.to_string(), e.clone()))
            .chain(v.status.attached_readonly.then(|| {
                (
                    ballast::csi_caps::READONLY_KEY.to_string(),
                    "true".to_string(),
                )
            }))
            .collect(),
    };
    match &volume.status.attached_node {
        Some(n) if *n == req.node_id && volume.status.attached_readonly != req.readonly => {
            return Err(Error::AlreadyExists(format!(
                "volume {:?} is published at node {n} with readonly={}; unpublish it first to publish it with readonly={}",
                volume.name, volume.status.attached_readonly, req.readonly
            )));
        }
        // Published there already: attach again checks its engine (and
        // starts it again if it died) rather than answering a dead endpoint.
        Some(n) if *n == req.node_id => {}
        Some(n) => {
            return Err(Error::Unprocessable(format!(
                "volume {:?} is published at node {n}; it can be published at one node at a time",
                volume.name
            )));
        }
        None => {}
    }
    let mut attached = crate::executor::attach(ctx, &req.volume_id, &req.node_id).await?;
    if attached.status.attached_readonly != req.readonly {
        attached = ctx
            .store
            .modify::<Volume, Error>(&req.volume_id, |v| {
                v.status.attached_readonly = req.readonly;
                Ok(true)
            })
            .await?;
    }
    Ok(answer(&attached))
}

#[tracing::instrument(skip_all, fields(rpc = "ControllerUnpublishVolume", volume = %req.volume_id, node = %req.node_id))]
pub async fn unpublish(
    ctx: &Arc<Context>,
    req: ControllerUnpublishVolumeRequest,
) -> Result<(), Error> {
    if req.volume_id.is_empty() {
        return Err(Error::invalid("volume_id", "is required"));
    }
    // A volume that does not exist is published nowhere.
    let Some(v) = ctx.store.get::<Volume>(&req.volume_id).await? else {
        return Ok(());
    };
    match &v.status.attached_node {
        None => Ok(()),
        Some(n) if !req.node_id.is_empty() && *n != req.node_id => Ok(()),
        Some(_) => crate::executor::detach(ctx, &req.volume_id).await.map(drop),
    }
}

/// Changes what `mutable_parameters` names of a volume (its replica count,
/// data locality, auto-balance); the planner acts on the new spec.
#[tracing::instrument(skip_all, fields(rpc = "ControllerModifyVolume", volume = %req.volume_id))]
pub async fn modify(
    ctx: &Arc<Context>,
    req: ControllerModifyVolumeRequest,
) -> Result<ControllerModifyVolumeResponse, Error> {
    if req.volume_id.is_empty() {
        return Err(Error::invalid("volume_id", "is required"));
    }
    let patch = super::params::mutable(&req.mutable_parameters)?;
    ctx.store
        .modify::<Volume, Error>(&req.volume_id, |v| {
            let before = v.spec.clone();
            crate::volumes::apply_patch(v, &patch)?;
            Ok(v.spec != before)
        })
        .await?;
    Ok(ControllerModifyVolumeResponse {})
}

/// Grows a volume, published (ONLINE expansion) or not; a mount volume's
/// filesystem grows on its node (NodeExpandVolume), at once when published.
#[tracing::instrument(skip_all, fields(rpc = "ControllerExpandVolume", volume = %req.volume_id))]
pub async fn expand(
    ctx: &Arc<Context>,
    req: ControllerExpandVolumeRequest,
) -> Result<ControllerExpandVolumeResponse, Error> {
    if req.volume_id.is_empty() {
        return Err(Error::invalid("volume_id", "is required"));
    }
    let range = req
        .capacity_range
        .as_ref()
        .ok_or_else(|| Error::invalid("capacity_range", "is required"))?;
    if range.required_bytes <= 0 && range.limit_bytes <= 0 {
        return Err(Error::invalid(
            "capacity_range",
            "required_bytes or limit_bytes is required",
        ));
    }
    if let Some(c) = &req.volume_capability {
        check_capability(c).map_err(|m| Error::invalid("volume_capability", m))?;
    }
    let size = size_for(Some(range))?;
    let volume = crate::executor::expand(ctx, &req.volume_id, size).await?;
    let block = matches!(
        req.volume_capability
            .as_ref()
            .and_then(|c| c.access_type.as_ref()),
        Some(AccessType::Block(_))
    );
    Ok(ControllerExpandVolumeResponse {
        capacity_bytes: i64::try_from(volume.spec.size).unwrap_or(i64::MAX),
        // A filesystem grows on its node; a published block device takes
        // its new size there too (its loop device).
        node_expansion_required: !block || volume.status.attached_node.is_some(),
    })
}

/// The volume's health as CSI reports it: abnormal when degraded or
/// faulted (from the engine's replica modes); the message says so, and
/// what the planner cannot do for it when anything (its `Scheduled`
/// condition, false).
fn condition(v: &Volume) -> VolumeCondition {
    let r = v.status.robustness;
    let mut message = match r {
        Robustness::Healthy => "healthy: every replica is rw".to_string(),
        Robustness::Degraded => {
            "degraded: some replicas failed or are rebuilding; I/O goes on".to_string()
        }
        Robustness::Faulted => "faulted: no usable replica".to_string(),
        Robustness::Unknown => "not published: no engine reports on it".to_string(),
    };
    if let Some(c) = v
        .status
        .conditions
        .iter()
        .find(|c| c.kind == crate::executor::conditions::SCHEDULED && !c.status)
    {
        message.push_str(&format!("; {} ({}): {}", c.kind, c.reason, c.message));
    }
    VolumeCondition {
        abnormal: matches!(r, Robustness::Degraded | Robustness::Faulted),
        message,
    }
}

#[tracing::instrument(skip_all, fields(rpc = "ControllerGetVolume", volume = %req.volume_id))]
pub async fn get(
    ctx: &Context,
    req: ControllerGetVolumeRequest,
) -> Result<ControllerGetVolumeResponse, Error> {
    if req.volume_id.is_empty() {
        return Err(Error::invalid("volume_id", "is required"));
    }
    let v: Volume = ctx.store.fetch(&req.volume_id).await?;
    Ok(ControllerGetVolumeResponse {
        volume: Some(csi_volume(&v)),
        status: Some(controller_get_volume_response::VolumeStatus {
            published_node_ids: v.status.attached_node.iter().cloned().collect(),
            volume_condition: Some(condition(&v)),
        }),
    })
}

#[tracing::instrument(skip_all, fields(rpc = "ListVolumes"))]
pub async fn list(ctx: &Context, req: ListVolumesRequest) -> Result<ListVolumesResponse, Error> {
    let all = sorted_volumes(ctx).await?;
    let (entries, next_token) = page(&all, req.max_entries, &req.starting_token)?;
    Ok(ListVolumesResponse {
        entries: entries
            .iter()
            .map(|v| list_volumes_response::Entry {
                volume: Some(csi_volume(v)),
                status: Some(list_volumes_response::VolumeStatus {
                    published_node_ids: v.status.attached_node.iter().cloned().collect(),
                    volume_condition: Some(condition(v)),
                }),
            })
            .collect(),
        next_token,
    })
}

/// Every volume, by name.
async fn sorted_volumes(ctx: &Context) -> Result<Vec<Volume>, Error> {
    let mut all = ctx.store.list::<Volume>().await?;
    all.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(all)
}

/// A volume's health as CSI v1.13 reports it: no entry when it is healthy
/// (or not published: nothing is wrong with it), DEGRADED while some of
/// its replicas failed or rebuild, INACCESSIBLE when none is usable.
fn volume_health(v: &Volume) -> VolumeHealth {
    let entry = |status: VolumeHealthErrorType, reason: &str| VolumeHealthEntry {
        status: status as i32,
        reason: reason.into(),
        message: condition(v).message,
    };
    let health_statuses = match v.status.robustness {
        Robustness::Degraded => vec![entry(VolumeHealthErrorType::Degraded, "Degraded")],
        Robustness::Faulted => vec![entry(VolumeHealthErrorType::Inaccessible, "Faulted")],
        Robustness::Healthy | Robustness::Unknown => Vec::new(),
    };
    VolumeHealth {
        volume_id: v.name.clone(),
        health_statuses,
    }
}

#[tracing::instrument(skip_all, fields(rpc = "ControllerGetVolumeHealth", volume = %req.volume_id))]
pub async fn health(
    ctx: &Context,
    req: ControllerGetVolumeHealthRequest,
) -> Result<ControllerGetVolumeHealthResponse, Error> {
    if req.volume_id.is_empty() {
        return Err(Error::invalid("volume_id", "is required"));
    }
    let v: Volume = ctx.store.fetch(&req.volume_id).await?;
    Ok(ControllerGetVolumeHealthResponse {
        volume_health: Some(volume_health(&v)),
    })
}

#[tracing::instrument(skip_all, fields(rpc = "ControllerListVolumeHealth"))]
pub async fn list_health(
    ctx: &Context,
    req: ControllerListVolumeHealthRequest,
) -> Result<ControllerListVolumeHealthResponse, Error> {
    let all = sorted_volumes(ctx).await?;
    let (entries, next_token) = page(&all, req.max_entries, &req.starting_token)?;
    Ok(ControllerListVolumeHealthResponse {
        entries: entries.iter().map(volume_health).collect(),
        next_token,
    })
}

#[tracing::instrument(skip_all, fields(rpc = "GetCapacity"))]
pub async fn capacity(
    ctx: &Context,
    req: GetCapacityRequest,
) -> Result<GetCapacityResponse, Error> {
    for c in &req.volume_capabilities {
        check_capability(c).map_err(|m| Error::invalid("volume_capabilities", m))?;
    }
    let params = StorageClassParams::try_from(&req.parameters)?;
    let has_all = |have: &[String], want: &Option<Vec<String>>| {
        want.as_ref()
            .is_none_or(|w| w.iter().all(|t| have.contains(t)))
    };
    // A segment (a node, or a zone) counts the nodes in it only.
    let in_segment = |n: &Node| {
        req.accessible_topology.as_ref().is_none_or(|t| {
            let mine = ballast::topology::of_node(&n.id, &n.spec.zone).segments;
            t.segments.iter().all(|(k, v)| mine.get(k) == Some(v))
        })
    };
    let (mut free, mut largest): (u64, u64) = (0, 0);
    for n in ctx.store.list::<Node>().await? {
        if !n.status.ready
            || !n.spec.allow_scheduling
            || !has_all(&n.spec.tags, &params.node_selector)
            || !in_segment(&n)
        {
            continue;
        }
        for (id, spec) in &n.spec.disks {
            let Some(st) = n.status.disks.get(id) else {
                continue;
            };
            if st.ready && spec.allow_scheduling && has_all(&spec.tags, &params.disk_selector) {
                let here = st.storage_available.saturating_sub(spec.storage_reserved);
                free += here;
                largest = largest.max(here);
            }
        }
    }
    let bytes = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    Ok(GetCapacityResponse {
        available_capacity: bytes(free),
        // A replica lies whole on one disk.
        maximum_volume_size: Some(bytes(largest)),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(required: i64, limit: i64) -> Option<CapacityRange> {
        Some(CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        })
    }

    #[test]
    fn a_degraded_or_faulted_volume_is_abnormal() {
        let mut v = Volume {
            name: "v".into(),
            resource_version: 0,
            spec: ballast::model::VolumeSpec::new(4096, 1),
            status: Default::default(),
        };
        for (r, abnormal) in [
            (Robustness::Healthy, false),
            (Robustness::Degraded, true),
            (Robustness::Faulted, true),
            (Robustness::Unknown, false),
        ] {
            v.status.robustness = r;
            let c = condition(&v);
            assert_eq!(c.abnormal, abnormal, "{r}");
            assert!(c.message.starts_with(match r {
                Robustness::Unknown => "not published",
                other => other.as_str(),
            }));
            // The same, as CSI v1.13's health: an entry only when abnormal.
            let h = volume_health(&v);
            assert_eq!(h.volume_id, "v");
            let statuses: Vec<i32> = h.health_statuses.iter().map(|e| e.status).collect();
            let want = match r {
                Robustness::Degraded => vec![VolumeHealthErrorType::Degraded as i32],
                Robustness::Faulted => vec![VolumeHealthErrorType::Inaccessible as i32],
                _ => Vec::new(),
            };
            assert_eq!(statuses, want, "{r}");
        }
        // What the planner cannot do for it follows, when anything.
        v.status.robustness = Robustness::Degraded;
        v.status.conditions.push(ballast::model::Condition {
            kind: "Scheduled".into(),
            status: false,
            reason: "ReplenishBlocked".into(),
            message: "v: no place for a replica: n1: cordoned".into(),
            last_transition_time: None,
        });
        let c = condition(&v);
        assert!(c.abnormal);
        assert!(
            c.message.starts_with("degraded")
                && c.message.ends_with(
                    "; Scheduled (ReplenishBlocked): v: no place for a replica: n1: cordoned"
                ),
            "{}",
            c.message
        );
        v.status.conditions[0].status = true;
        assert!(!condition(&v).message.contains("Scheduled"));
    }

    #[test]
    fn sizes_round_up_to_4k_within_the_limit() {
        assert_eq!(size_for(None).unwrap(), DEFAULT_SIZE);
        assert_eq!(size_for(range(0, 0).as_ref()).unwrap(), DEFAULT_SIZE);
        assert_eq!(size_for(range(1, 0).as_ref()).unwrap(), 4096);
        assert_eq!(size_for(range(4097, 8192).as_ref()).unwrap(), 8192);
        assert_eq!(size_for(range(0, 10_000).as_ref()).unwrap(), 8192);
        assert_eq!(size_for(range(0, 2 << 30).as_ref()).unwrap(), DEFAULT_SIZE);
        for (r, l) in [(5000, 4097), (0, 100), (8192, 4096)] {
            let e = size_for(range(r, l).as_ref()).unwrap_err();
            assert!(matches!(e, Error::OutOfRange { .. }), "{r}/{l}: {e}");
        }
        let e = size_for(range(-1, 0).as_ref()).unwrap_err();
        assert!(matches!(e, Error::Invalid { .. }), "{e}");
    }
}
