use std::sync::Arc;

use ballast::model::{DiskSpec, DiskStatus, Kind, Node, NodeSpec, NodeStatus};
use ballast::proto::agent::v1::{
    HeartbeatRequest, HeartbeatResponse, RegisterRequest, RegisterResponse,
    controlplane_server::Controlplane,
};
use ballast::store::{StoreError, StoreExt};
use tonic::{Request, Response, Status};

use crate::context::Context;
use crate::error::Error;

/// The gRPC service node agents call.
#[derive(Clone)]
pub struct ControlplaneService {
    ctx: Arc<Context>,
}

impl ControlplaneService {
    pub fn new(ctx: Arc<Context>) -> Self {
        ControlplaneService { ctx }
    }
}

fn disk_status(d: &ballast::proto::agent::v1::DiskStatus, old: Option<&DiskStatus>) -> DiskStatus {
    DiskStatus {
        ready: d.ready,
        message: d.message.clone(),
        storage_maximum: d.storage_maximum,
        storage_available: d.storage_available,
        storage_scheduled: d.storage_scheduled,
        scheduled_replicas: old
            .map(|o| o.scheduled_replicas.clone())
            .unwrap_or_default(),
    }
}

/// Marks a node ready after hearing from it, with an event when it was not.
fn mark_alive(node: &mut Node) -> bool {
    node.status.last_heartbeat = Some(chrono::Utc::now());
    let was_ready = node.status.ready;
    node.status.ready = true;
    !was_ready
}

#[tonic::async_trait]
impl Controlplane for ControlplaneService {
    #[tracing::instrument(skip_all, fields(node = %request.get_ref().node_id))]
    async fn register(
        &self,
        request: Request<RegisterRequest>,
    ) -> Result<Response<RegisterResponse>, Status> {
        let req = request.into_inner();
        ballast::model::validate_name(&req.node_id).map_err(|m| Error::invalid("nodeId", m))?;
        if req.disks.is_empty() {
            return Err(Error::invalid("disks", "a node registers with at least one disk").into());
        }
        let ctx = &self.ctx;
        let store = ctx.store.as_ref();
        let endpoints = |status: &mut NodeStatus| {
            status.agent_endpoint = req.agent_endpoint.clone();
            status.replica_endpoint = req.replica_endpoint.clone();
            status.csi_endpoint = req.csi_endpoint.clone();
            status.version = req.version.clone();
        };
        let mut became_ready = false;
        let created = match store.get::<Node>(&req.node_id).map_err(Error::from)? {
            None => {
                let mut node = Node {
                    id: req.node_id.clone(),
                    resource_version: 0,
                    spec: NodeSpec {
                        zone: req.zone.clone(),
                        tags: req.tags.clone(),
                        allow_scheduling: true,
                        eviction_requested: false,
                        disks: req
                            .disks
                            .iter()
                            .map(|d| (d.id.clone(), DiskSpec::new(d.path.clone(), d.tags.clone())))
                            .collect(),
                    },
                    status: NodeStatus::default(),
                };
                endpoints(&mut node.status);
                mark_alive(&mut node);
                match store.create(&node) {
                    Ok(_) => true,
                    // Raced with another registration of the same node: fall
                    // through to the update path on the next call.
                    Err(StoreError::AlreadyExists { .. }) => {
                        return Err(Status::aborted("node registered concurrently; retry"));
                    }
                    Err(e) => return Err(Error::from(e).into()),
                }
            }
            Some(_) => {
                store
                    .modify::<Node, Error>(&req.node_id, |node| {
                        for d in &req.disks {
                            let spec =
                                node.spec.disks.entry(d.id.clone()).or_insert_with(|| {
                                    DiskSpec::new(d.path.clone(), d.tags.clone())
                                });
                            spec.path = d.path.clone();
                        }
                        endpoints(&mut node.status);
                        became_ready = mark_alive(node);
                        Ok(true)
                    })
                    .map_err(Status::from)?;
                false
            }
        };
        ctx.saw_node(&req.node_id);
        if created {
            ctx.event(
                Kind::Node,
                &req.node_id,
                "NodeRegistered",
                format!(
                    "node registered in zone {:?} with {} disk(s)",
                    req.zone,
                    req.disks.len()
                ),
            );
        } else if became_ready {
            ctx.event(
                Kind::Node,
                &req.node_id,
                "NodeReady",
                "node registered again and is ready",
            );
        }
        Ok(Response::new(RegisterResponse {
            heartbeat_interval_ms: ctx.heartbeat_interval.as_millis() as u64,
        }))
    }

    #[tracing::instrument(skip_all, fields(node = %request.get_ref().node_id))]
    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let req = request.into_inner();
        let ctx = &self.ctx;
        if ctx
            .store
            .get::<Node>(&req.node_id)
            .map_err(Error::from)?
            .is_none()
        {
            return Ok(Response::new(HeartbeatResponse { known: false }));
        }
        ctx.saw_node(&req.node_id);
        let mut became_ready = false;
        ctx.store
            .modify::<Node, Error>(&req.node_id, |node| {
                let old = std::mem::take(&mut node.status.disks);
                node.status.disks = req
                    .disks
                    .iter()
                    .map(|d| (d.id.clone(), disk_status(d, old.get(&d.id))))
                    .collect();
                became_ready = mark_alive(node);
                Ok(true)
            })
            .map_err(Status::from)?;
        if became_ready {
            ctx.event(
                Kind::Node,
                &req.node_id,
                "NodeReady",
                "heartbeats resumed; node is ready",
            );
        }
        for engine in &req.engines {
            if let Err(e) = record_engine(ctx, &req.node_id, engine) {
                tracing::warn!(volume = %engine.volume, error = %e, "cannot record engine status");
            }
        }
        Ok(Response::new(HeartbeatResponse { known: true }))
    }
}

/// Records what an engine reports: its replicas' modes, and the volume's
/// robustness (and when it became degraded). Writes only changes.
fn record_engine(
    ctx: &Context,
    node: &str,
    e: &ballast::proto::agent::v1::EngineStatus,
) -> Result<(), Error> {
    use ballast::model::{ReplicaMode, Robustness, Volume};
    let Some(volume) = ctx.store.get::<Volume>(&e.volume)? else {
        return Ok(());
    };
    if volume.status.attached_node.as_deref() != Some(node) || e.replicas.is_empty() {
        return Ok(());
    }
    let now = chrono::Utc::now();
    let mut rw = 0u32;
    for r in &e.replicas {
        let Ok(mode) = r.mode.parse::<ReplicaMode>() else {
            continue;
        };
        if mode == ReplicaMode::Rw {
            rw += 1;
        }
        if ctx.store.get::<ballast::model::Replica>(&r.name)?.is_none() {
            continue;
        }
        ctx.store
            .modify::<ballast::model::Replica, Error>(&r.name, |rep| {
                let running = e.running && mode != ReplicaMode::Err;
                if rep.status.mode == Some(mode) && rep.status.running == running {
                    return Ok(false);
                }
                rep.status.mode = Some(mode);
                rep.status.running = running;
                match mode {
                    ReplicaMode::Rw if rep.spec.healthy_at.is_none() => {
                        rep.spec.healthy_at = Some(now)
                    }
                    ReplicaMode::Err if rep.spec.failed_at.is_none() => {
                        rep.spec.failed_at = Some(now)
                    }
                    _ => {}
                }
                Ok(true)
            })?;
    }
    let robustness = if rw >= volume.spec.number_of_replicas {
        Robustness::Healthy
    } else if rw > 0 {
        Robustness::Degraded
    } else {
        Robustness::Faulted
    };
    let mut changed_to = None;
    ctx.store.modify::<Volume, Error>(&e.volume, |v| {
        if v.status.robustness == robustness {
            return Ok(false);
        }
        if robustness == Robustness::Degraded {
            v.status.last_degraded_at = Some(now);
        }
        v.status.robustness = robustness;
        changed_to = Some(robustness);
        Ok(true)
    })?;
    if let Some(r) = changed_to {
        ctx.event(
            Kind::Volume,
            &e.volume,
            "VolumeRobustness",
            format!(
                "now {r}: {rw} of {} replicas rw",
                volume.spec.number_of_replicas
            ),
        );
    }
    Ok(())
}
