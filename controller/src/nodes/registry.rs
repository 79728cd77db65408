//! The controller side of the agent protocol: nodes register, heartbeat
//! (readiness, disks, replicas, engines) and record their engines' replica
//! sets; their reports become the node, disk and replica records. It
//! trusts nothing it is told about other nodes and decides no placement.

use std::sync::Arc;

use ballast::model::{DiskSpec, DiskStatus, Kind, Node, NodeSpec, NodeStatus};
use ballast::proto::agent::v1::{
    DiskPlacement, HeartbeatRequest, HeartbeatResponse, IssueReaderRequest, IssueReaderResponse,
    NodeDisksRequest, NodeDisksResponse, RecordReplicaSetRequest, RecordReplicaSetResponse,
    RegisterRequest, RegisterResponse, controlplane_server::Controlplane,
};
use ballast::store::StoreError;
use tonic::{Request, Response, Status};

use crate::context::Context;
use crate::error::Error;

/// The gRPC service node agents call.
#[derive(Clone)]
pub struct ControlplaneService {
    ctx: Arc<Context>,
    expiry: Arc<super::expiry::Warnings>,
    renewals: Arc<super::renewal::Renewals>,
}

impl ControlplaneService {
    pub fn new(ctx: Arc<Context>) -> Self {
        ControlplaneService {
            ctx,
            expiry: Arc::default(),
            renewals: Arc::default(),
        }
    }

    /// Renewing running engines' certificates `days` before they expire
    /// (`--renew-engine-certificates-days`).
    pub fn renewing_engines_within(mut self, days: i64) -> Self {
        self.renewals = Arc::new(super::renewal::Renewals::within(days));
        self
    }
}

/// A disk as its node reports it, with the replicas found on it and
/// whether it is pressured (used share, counting what the operator
/// reserves, at or above `pressure_percent`; 0 turns it off).
fn disk_status(
    d: &ballast::proto::agent::v1::DiskStatus,
    replicas: &[ballast::proto::agent::v1::ReplicaStatus],
    reserved: u64,
    pressure_percent: u32,
) -> DiskStatus {
    let used = crate::planner::view::used_percent(d.storage_maximum, d.storage_available, reserved);
    let pressure = pressure_percent > 0
        && d.ready
        && d.storage_maximum > 0
        && used >= u64::from(pressure_percent);
    DiskStatus {
        ready: d.ready,
        message: d.message.clone(),
        storage_maximum: d.storage_maximum,
        storage_available: d.storage_available,
        storage_scheduled: d.storage_scheduled,
        scheduled_replicas: replicas
            .iter()
            .filter(|r| r.disk_id == d.id)
            .map(|r| r.name.clone())
            .collect(),
        pressure,
    }
}

/// How often a heartbeat that changes nothing else refreshes
/// `lastHeartbeat` in the store. Liveness itself is judged in memory (see
/// `liveness`), so an idle cluster's heartbeats are not writes.
const HEARTBEAT_RECORD_EVERY: chrono::Duration = chrono::Duration::minutes(5);

/// Whether a heartbeat's status is worth a write: anything changed but
/// `lastHeartbeat`, or that is older than [`HEARTBEAT_RECORD_EVERY`]. When
/// not, `after` keeps the recorded `lastHeartbeat`.
fn worth_writing(
    before: &NodeStatus,
    after: &mut NodeStatus,
    now: chrono::DateTime<chrono::Utc>,
) -> bool {
    let stale = before
        .last_heartbeat
        .is_none_or(|t| now - t >= HEARTBEAT_RECORD_EVERY);
    let beat = after.last_heartbeat.take();
    after.last_heartbeat = before.last_heartbeat;
    if stale || after != before {
        after.last_heartbeat = beat;
        return true;
    }
    false
}

/// When the certificate of node `node_id` expires, from its call: its own,
/// as the handshake verified it; or, for a call a controller forwarded,
/// what that controller's handshake read (`forward::PEER_NOT_AFTER`).
/// None with TLS off.
fn node_certificate_expiry<T>(request: &Request<T>, node_id: &str) -> Option<i64> {
    use ballast::tls::{Role, holds, leaf_not_after};
    let certs = request.peer_certs()?;
    if holds(&certs, &Role::Node(node_id.to_string())) {
        return leaf_not_after(&certs);
    }
    if !holds(&certs, &Role::Controller) {
        return None;
    }
    let forwarded = request.metadata().get(crate::forward::PEER_NOT_AFTER)?;
    forwarded.to_str().ok()?.parse().ok()
}

/// Marks a node ready after hearing from it, with an event when it was not.
fn mark_alive(node: &mut Node, now: chrono::DateTime<chrono::Utc>) -> bool {
    node.status.last_heartbeat = Some(now);
    let was_ready = node.status.ready;
    // A node held down (its Kubernetes Node deleted or NotReady) stays
    // down, heartbeats or not.
    node.status.ready = node.status.held_down.is_none();
    node.status.ready && !was_ready
}

#[tonic::async_trait]
impl Controlplane for ControlplaneService {
    async fn issue_reader(
        &self,
        request: Request<IssueReaderRequest>,
    ) -> Result<Response<IssueReaderResponse>, Status> {
        Ok(Response::new(
            super::readers::issue(&self.ctx, request.get_ref()).await?,
        ))
    }

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
            status.max_volumes = req.max_volumes;
        };
        let mut became_ready = false;
        let created = match store.get::<Node>(&req.node_id).await.map_err(Error::from)? {
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
                mark_alive(&mut node, self.ctx.now());
                match store.create(&node).await {
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
                        became_ready = mark_alive(node, self.ctx.now());
                        Ok(true)
                    })
                    .await
                    .map_err(Status::from)?;
                false
            }
        };
        ctx.saw_node(&req.node_id);
        self.expiry.registered(&req.node_id);
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
            )
            .await;
        } else if became_ready {
            ctx.event(
                Kind::Node,
                &req.node_id,
                "NodeReady",
                "node registered again and is ready",
            )
            .await;
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
        let expires = node_certificate_expiry(&request, &request.get_ref().node_id);
        let req = request.into_inner();
        let ctx = &self.ctx;
        if ctx
            .store
            .get::<Node>(&req.node_id)
            .await
            .map_err(Error::from)?
            .is_none()
        {
            return Ok(Response::new(HeartbeatResponse { known: false }));
        }
        if let Some(at) = expires {
            self.expiry.check(ctx, &req.node_id, at).await;
        }
        self.renewals.check(ctx, &req.node_id, &req.engines);
        ctx.saw_node(&req.node_id);
        let pressure_percent = ctx.settings().await?.disk_pressure_percentage();
        let mut became_ready = false;
        let now = self.ctx.now();
        ctx.store
            .modify::<Node, Error>(&req.node_id, |node| {
                let before = node.status.clone();
                node.status.disks = req
                    .disks
                    .iter()
                    .map(|d| {
                        let reserved = node
                            .spec
                            .disks
                            .get(&d.id)
                            .map(|s| s.storage_reserved)
                            .unwrap_or(0);
                        let st = disk_status(d, &req.replicas, reserved, pressure_percent);
                        (d.id.clone(), st)
                    })
                    .collect();
                node.status.disk_count = node.status.disks.len() as u32;
                became_ready = mark_alive(node, now);
                Ok(worth_writing(&before, &mut node.status, now))
            })
            .await
            .map_err(Status::from)?;
        if became_ready {
            ctx.event(
                Kind::Node,
                &req.node_id,
                "NodeReady",
                "heartbeats resumed; node is ready",
            )
            .await;
        }
        for r in &req.replicas {
            if r.rebuild_total > 0 {
                ctx.saw_rebuilding(&r.name);
            }
            if let Err(e) = record_progress(ctx, r).await {
                tracing::warn!(replica = %r.name, error = %e, "cannot record rebuild progress");
            }
        }
        delete_orphans(ctx, &req.node_id, &req.replicas).await;
        for engine in req.engines.iter().filter(|e| e.running) {
            if let Err(e) = record_engine(ctx, &req.node_id, engine).await {
                tracing::warn!(volume = %engine.volume, error = %e, "cannot record engine status");
            }
        }
        restart_dead_engines(ctx, &req.node_id, &req.engines).await;
        stop_stray_engines(ctx, &req.node_id, &req.engines).await;
        raise_lagging_fences(ctx, &req.node_id, &req.replicas).await;
        Ok(Response::new(HeartbeatResponse { known: true }))
    }

    #[tracing::instrument(skip_all, fields(node = %request.get_ref().node_id))]
    async fn node_disks(
        &self,
        request: Request<NodeDisksRequest>,
    ) -> Result<Response<NodeDisksResponse>, Status> {
        let req = request.into_inner();
        ballast::model::validate_name(&req.node_id).map_err(|m| Error::invalid("nodeId", m))?;
        let ctx = &self.ctx;
        let spec = match ctx
            .store
            .get::<Node>(&req.node_id)
            .await
            .map_err(Error::from)?
        {
            Some(n) => n
                .spec
                .disks
                .values()
                .map(|d| DiskPlacement {
                    path: d.path.clone(),
                    tags: d.tags.clone(),
                })
                .collect(),
            None => Vec::new(),
        };
        let mut answer = NodeDisksResponse {
            spec,
            ..Default::default()
        };
        if let Some(client) = &ctx.kube {
            use crate::kubernetes::nodes::{DEFAULT_DISKS_ANNOTATION, default_disks};
            if let Some(disks) = default_disks(client, &req.node_id).await? {
                answer.defaults = disks
                    .into_iter()
                    .map(|d| DiskPlacement {
                        path: d.path,
                        tags: d.tags,
                    })
                    .collect();
                answer.defaults_from =
                    format!("the Kubernetes Node's annotation {DEFAULT_DISKS_ANNOTATION}");
            }
        }
        Ok(Response::new(answer))
    }

    #[tracing::instrument(skip_all, fields(volume = %request.get_ref().volume, node = %request.get_ref().node_id))]
    async fn record_replica_set(
        &self,
        request: Request<RecordReplicaSetRequest>,
    ) -> Result<Response<RecordReplicaSetResponse>, Status> {
        let req = request.into_inner();
        let generation = crate::freshness::record(
            &self.ctx,
            &req.volume,
            &req.node_id,
            (req.generation, req.engine_epoch),
            &req.replicas,
            &req.reason,
        )
        .await?;
        Ok(Response::new(RecordReplicaSetResponse { generation }))
    }
}

/// Every volume attached at `node` whose engine the node does not report
/// running and healthy, or reports for a handover to a new engine host,
/// gets it started again (in the background; the volume's guard keeps one
/// start at a time).
async fn restart_dead_engines(
    ctx: &Arc<Context>,
    node: &str,
    engines: &[ballast::proto::agent::v1::EngineStatus],
) {
    use ballast::model::{Volume, VolumeState};
    // From the context's copy of the records, not the store, and only the
    // volumes attached here: a heartbeat comes from every node every few
    // seconds, and reading (or walking) every volume each time would not
    // scale.
    let attached: Vec<Volume> = {
        let mirror = match ctx.records().await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the volumes to check their engines");
                return;
            }
        };
        mirror
            .attached_at(node)
            .filter(|v| v.status.state == VolumeState::Attached)
            .cloned()
            .collect()
    };
    for v in attached {
        let why = match engines.iter().find(|e| e.volume == v.name) {
            Some(e) if e.handover => crate::executor::Restart::Handover(e.problem.clone()),
            Some(e) if e.running => continue,
            Some(e) => crate::executor::Restart::Down(e.problem.clone()),
            None => crate::executor::Restart::Down("the node runs no engine for it".to_string()),
        };
        if ctx.volume_busy(&v.name) {
            continue;
        }
        let (ctx, node) = (ctx.clone(), node.to_string());
        tokio::spawn(async move {
            if let Err(e) = crate::executor::restart_engine(&ctx, &v.name, &node, why).await {
                tracing::warn!(volume = %v.name, error = %e, "cannot restart the engine");
            }
        });
    }
}

/// Engines a node reports for volumes not attached at it (the
/// node was down when its volume was detached) are stopped: the replicas
/// already refuse their changes (their attachment is behind), and their
/// records are refused; this ends the process. An engine of a volume the
/// store does not know is left alone, as its replicas are.
async fn stop_stray_engines(
    ctx: &Arc<Context>,
    node: &str,
    engines: &[ballast::proto::agent::v1::EngineStatus],
) {
    use ballast::model::Volume;
    let here: std::collections::HashSet<String> = match ctx.records().await {
        Ok(m) => m.attached_at(node).map(|v| v.name.clone()).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the volumes to check their engines");
            return;
        }
    };
    // Running or not: one fenced out answers its health check with its
    // fault, and its process still has to end.
    for e in engines.iter().filter(|e| !here.contains(&e.volume)) {
        let (ctx, node, volume) = (ctx.clone(), node.to_string(), e.volume.clone());
        tokio::spawn(async move {
            // Under the volume's guard, from the store itself: an attach
            // here records its node before it starts the engine.
            let Ok(_guard) = ctx.lock_volume(&volume) else {
                return;
            };
            let stray = match ctx.store.get::<Volume>(&volume).await {
                Ok(Some(v)) => v.status.attached_node.as_deref() != Some(node.as_str()),
                _ => false,
            };
            if !stray {
                return;
            }
            let stopped = async {
                let n: Node = ctx.store.fetch(&node).await?;
                let mut c = crate::agents::client(&n, &ctx.member)?;
                crate::agents::with_timeout(
                    &node,
                    c.stop_engine(ballast::proto::agent::v1::StopEngineRequest {
                        volume: volume.clone(),
                    }),
                )
                .await
            }
            .await;
            match stopped {
                Ok(r) if !r.get_ref().stopped => {}
                Ok(_) => {
                    ctx.event(
                        Kind::Volume,
                        &volume,
                        "StrayEngineStopped",
                        format!(
                            "an engine of it still ran on {node}, where it is not attached; stopped"
                        ),
                    )
                    .await
                }
                Err(e) => {
                    tracing::warn!(volume = %volume, node = %node, error = %e, "cannot stop a stray engine")
                }
            }
        });
    }
}

/// Replicas a node reports with a fence below their volume's attachment
/// count (`engineEpoch`) have it raised to the count: one whose node was
/// down at a detach, say, or whose node was cut off while the volume
/// moved. From the node's first heartbeat on, an engine of an earlier
/// attachment changes nothing there, not only once the volume's next
/// engine opens the replica. The count only rises, and a fence never
/// falls, so a count read a moment ago is never too high.
async fn raise_lagging_fences(
    ctx: &Arc<Context>,
    node: &str,
    replicas: &[ballast::proto::agent::v1::ReplicaStatus],
) {
    let lagging: Vec<(String, String, u64)> = match ctx.records().await {
        Ok(m) => replicas
            .iter()
            .filter_map(|r| {
                let count = m.volume(&r.volume)?.status.engine_epoch;
                (count > r.fence).then(|| (r.name.clone(), r.volume.clone(), count))
            })
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the volumes to check their replicas' fences");
            return;
        }
    };
    if lagging.is_empty() {
        return;
    }
    let (ctx, node) = (ctx.clone(), node.to_string());
    tokio::spawn(async move {
        for (name, volume, count) in lagging {
            let raised = async {
                let n: Node = ctx.store.fetch(&node).await?;
                crate::agents::fence_replica(&n, &ctx.member, &name, count).await
            }
            .await;
            match raised {
                Ok(fence) => {
                    tracing::info!(volume = %volume, replica = %name, node = %node, fence, "replica's fence raised to its volume's attachment count")
                }
                Err(e) => {
                    tracing::warn!(volume = %volume, replica = %name, node = %node, error = %e, "cannot raise a replica's fence")
                }
            }
        }
    });
}

/// Replicas a node reports that have no record while their volume has one
/// are left over (their record went while the node was away): their data is
/// deleted. A replica whose volume is unknown is only reported — a store
/// that lost its records must never make nodes delete data.
async fn delete_orphans(
    ctx: &Arc<Context>,
    node: &str,
    replicas: &[ballast::proto::agent::v1::ReplicaStatus],
) {
    use ballast::model::{Replica, Volume};
    for r in replicas {
        let known = matches!(ctx.store.get::<Replica>(&r.name).await, Ok(Some(_)));
        if known || ctx.volume_busy(&r.volume) {
            continue;
        }
        match ctx.store.get::<Volume>(&r.volume).await {
            Ok(Some(_)) => {}
            _ => {
                tracing::debug!(replica = %r.name, node, "replica of an unknown volume left on the node");
                continue;
            }
        }
        let (ctx, node, name) = (ctx.clone(), node.to_string(), r.name.clone());
        tokio::spawn(async move {
            let deleted = async {
                let n: Node = ctx.store.fetch(&node).await?;
                let mut c = crate::agents::client(&n, &ctx.member)?;
                crate::agents::with_timeout(
                    &node,
                    c.delete_replica(ballast::proto::agent::v1::DeleteReplicaRequest {
                        name: name.clone(),
                    }),
                )
                .await
            }
            .await;
            match deleted {
                Ok(_) => {
                    ctx.event(
                        Kind::Replica,
                        &name,
                        "OrphanDeleted",
                        format!("its record was gone; its data on {node} is deleted"),
                    )
                    .await
                }
                Err(e) => {
                    tracing::warn!(replica = %name, error = %e, "cannot delete a left-over replica")
                }
            }
        });
    }
}

/// Records how far a replica's rebuild got (bytes done of total).
async fn record_progress(
    ctx: &Context,
    r: &ballast::proto::agent::v1::ReplicaStatus,
) -> Result<(), Error> {
    use ballast::model::{RebuildProgress, Replica};
    let progress = (r.rebuild_total > 0).then_some(RebuildProgress {
        done: r.rebuild_done,
        total: r.rebuild_total,
    });
    let Some(rep) = ctx.store.get::<Replica>(&r.name).await? else {
        return Ok(());
    };
    if rep.status.rebuild_progress != progress {
        ctx.store
            .modify::<Replica, Error>(&r.name, |rep| {
                rep.status.rebuild_progress = progress.clone();
                Ok(true)
            })
            .await?;
    }
    Ok(())
}

/// Records what an engine reports: its replicas' modes, and the volume's
/// robustness (and when it became degraded). Writes only changes.
async fn record_engine(
    ctx: &Context,
    node: &str,
    e: &ballast::proto::agent::v1::EngineStatus,
) -> Result<(), Error> {
    use ballast::model::{ReplicaMode, Robustness, Volume};
    let Some(volume) = ctx.store.get::<Volume>(&e.volume).await? else {
        return Ok(());
    };
    if volume.status.attached_node.as_deref() != Some(node) || e.replicas.is_empty() {
        return Ok(());
    }
    let now = ctx.now();
    let mut rw_names = Vec::new();
    let failed: Vec<&str> = e
        .replicas
        .iter()
        .filter(|r| r.mode == ReplicaMode::Err.as_str())
        .map(|r| r.name.as_str())
        .collect();
    for r in &e.replicas {
        ctx.saw_rebuilding(&r.name);
        let Ok(mode) = r.mode.parse::<ReplicaMode>() else {
            continue;
        };
        if mode == ReplicaMode::Rw {
            rw_names.push(r.name.as_str());
        }
        let source_failed = failed.contains(&r.rebuild_source.as_str());
        record_replica(ctx, (e.running, source_failed), mode, r, now).await?;
    }
    let mut changed_to = None;
    let mut rw = 0;
    ctx.store
        .modify::<Volume, Error>(&e.volume, |v| {
            // Only the replicas the record holds count: a report taken
            // before its engine dropped a replica, read after the record
            // did, must not call the volume healthy again.
            rw = rw_names
                .iter()
                .filter(|n| crate::freshness::is_current(v, n))
                .count();
            let robustness = Robustness::of(rw, v.spec.number_of_replicas as usize);
            if v.status.robustness == robustness {
                return Ok(false);
            }
            if robustness == Robustness::Degraded {
                v.status.last_degraded_at = Some(now);
            }
            v.status.robustness = robustness;
            changed_to = Some((robustness, v.spec.number_of_replicas));
            Ok(true)
        })
        .await?;
    if let Some((r, wanted)) = changed_to {
        crate::freshness::announce_robustness(ctx, &e.volume, r, rw, wanted).await;
    }
    Ok(())
}

/// Records one replica's mode as its engine reports it: reaching rw ends
/// its rebuild (with an event) and resets its retry count; err marks when
/// it failed, and a rebuild that failed with its source (`source_failed`:
/// the source's silence or corruption ended it) is not counted as an
/// attempt of its target. Writes only a change.
async fn record_replica(
    ctx: &Context,
    (engine_running, source_failed): (bool, bool),
    mode: ballast::model::ReplicaMode,
    r: &ballast::proto::agent::v1::EngineReplica,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), Error> {
    use ballast::model::ReplicaMode;
    let Some(seen) = ctx.store.get::<ballast::model::Replica>(&r.name).await? else {
        return Ok(());
    };
    let running = engine_running && mode != ReplicaMode::Err;
    if seen.status.mode == Some(mode) && seen.status.running == running {
        return Ok(());
    }
    // A rebuild's end is reported once, as the replica turns rw, and
    // before it does: whoever sees it rw finds the event.
    if mode == ReplicaMode::Rw && r.rebuild_done && seen.status.mode != Some(ReplicaMode::Rw) {
        ctx.event(
            Kind::Replica,
            &r.name,
            "ReplicaRebuilt",
            format!(
                "from {}: kept {} B, copied {} B by {}",
                r.rebuild_source, r.kept_bytes, r.copied_bytes, r.copy_path
            ),
        )
        .await;
    }
    let rebuilding = seen.status.mode == Some(ReplicaMode::Wo);
    let uncounted = rebuilding && source_failed;
    ctx.store
        .modify::<ballast::model::Replica, Error>(&r.name, |rep| {
            if rep.status.mode == Some(mode) && rep.status.running == running {
                return Ok(false);
            }
            match mode {
                // Reaching rw ends a rebuild and resets the retry count.
                ReplicaMode::Rw => crate::executor::effects::rebuilt(rep, now),
                // Uncounted as judged on the fresh copy: it was rebuilding.
                ReplicaMode::Err if rep.spec.failed_at.is_none() => {
                    let was_rebuilding = rep.status.mode == Some(ReplicaMode::Wo);
                    crate::executor::effects::failed(rep, now, source_failed && was_rebuilding)
                }
                _ => {}
            }
            rep.status.mode = Some(mode);
            rep.status.running = running;
            Ok(true)
        })
        .await?;
    if mode == ReplicaMode::Err && !r.error.is_empty() {
        tracing::debug!(replica = %r.name, error = %r.error, "replica is err");
        // A rebuild the engine ended with an error says why: no other
        // record does (an rw replica's does, the record of the replica
        // set's change).
        if rebuilding {
            let counted = if uncounted {
                " (its source failed too: not counted as an attempt)"
            } else {
                ""
            };
            ctx.event(
                Kind::Replica,
                &r.name,
                "RebuildFailed",
                format!("by its engine: {}{counted}", r.error),
            )
            .await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ballast::model::{DesiredState, Replica, ReplicaSpec, ReplicaStatus, Setting};
    use ballast::proto::agent::v1::{DiskIdentity, DiskStatus as WireDisk, ReplicaStatus as Wire};
    use ballast::store::RedbStore;

    use super::*;

    #[test]
    fn a_heartbeat_that_changes_nothing_but_its_time_is_no_write() {
        let t0 = chrono::Utc::now();
        let before = NodeStatus {
            ready: true,
            last_heartbeat: Some(t0),
            ..Default::default()
        };
        let beat = |at| NodeStatus {
            last_heartbeat: Some(at),
            ..before.clone()
        };
        let soon = t0 + chrono::Duration::seconds(5);
        let mut after = beat(soon);
        assert!(!worth_writing(&before, &mut after, soon));
        assert_eq!(after, before, "the recorded heartbeat is kept");
        let later = t0 + HEARTBEAT_RECORD_EVERY;
        let mut after = beat(later);
        assert!(worth_writing(&before, &mut after, later));
        assert_eq!(after.last_heartbeat, Some(later));
        let mut cordoned = NodeStatus {
            cordoned: true,
            ..beat(soon)
        };
        assert!(worth_writing(&before, &mut cordoned, soon));
        assert_eq!(cordoned.last_heartbeat, Some(soon));
    }

    fn disk(available: u64) -> WireDisk {
        WireDisk {
            id: "disk-1".into(),
            path: "/d".into(),
            ready: true,
            storage_maximum: 1000 << 20,
            storage_available: available,
            ..Default::default()
        }
    }

    /// A controller's heartbeat handler over a real store, with one node
    /// registered and one replica recorded on it.
    async fn service() -> (tempfile::TempDir, ControlplaneService) {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(dir.path().join("s.redb")).unwrap();
        let ctx = Context::new(Arc::new(store), Duration::from_secs(30));
        let svc = ControlplaneService::new(ctx.clone());
        svc.register(Request::new(RegisterRequest {
            node_id: "n1".into(),
            disks: vec![DiskIdentity {
                id: "disk-1".into(),
                uuid: "u".into(),
                path: "/d".into(),
                tags: vec![],
            }],
            ..Default::default()
        }))
        .await
        .unwrap();
        ctx.store
            .create(&Replica {
                name: "v-r1".into(),
                resource_version: 0,
                spec: ReplicaSpec {
                    volume: "v".into(),
                    node_id: "n1".into(),
                    disk_id: "disk-1".into(),
                    data_directory: "replicas/v-r1".into(),
                    desired_state: DesiredState::Running,
                    eviction_requested: false,
                    rebuild_retry_count: 0,
                    failed_at: None,
                    healthy_at: None,
                },
                status: ReplicaStatus::default(),
            })
            .await
            .unwrap();
        (dir, svc)
    }

    async fn beat(svc: &ControlplaneService, available: u64, done: u64, total: u64) {
        svc.heartbeat(Request::new(HeartbeatRequest {
            node_id: "n1".into(),
            disks: vec![disk(available)],
            replicas: vec![Wire {
                name: "v-r1".into(),
                volume: "v".into(),
                disk_id: "disk-1".into(),
                rebuild_done: done,
                rebuild_total: total,
                ..Default::default()
            }],
            engines: vec![],
        }))
        .await
        .unwrap();
    }

    /// A volume of two replicas attached at n1.
    fn attached_at_n1(name: &str) -> ballast::model::Volume {
        let mut v = ballast::model::Volume {
            name: name.into(),
            resource_version: 0,
            spec: ballast::model::VolumeSpec::new(1 << 30, 2),
            status: Default::default(),
        };
        v.status.attached_node = Some("n1".into());
        v
    }

    /// A rebuild its engine ended is recorded failed with its event; it
    /// counts as an attempt of its target unless its source failed too
    /// (given up for its silence, or found corrupt): the target was not
    /// at fault.
    #[tokio::test]
    async fn a_rebuild_that_failed_with_its_source_is_not_counted_against_its_target() {
        use ballast::model::ReplicaMode;
        use ballast::proto::agent::v1::{EngineReplica, EngineStatus};
        let (_dir, svc) = service().await;
        let ctx = svc.ctx.clone();
        ctx.store.create(&attached_at_n1("v")).await.unwrap();
        for (source_mode, counted) in [("rw", 1), ("err", 0)] {
            for (name, mode) in [("v-r0", ReplicaMode::Rw), ("v-r1", ReplicaMode::Wo)] {
                let mut r =
                    crate::executor::effects::new_replica(name, "v", "n1", "disk-1", Some(mode));
                if name == "v-r1" {
                    // Reused: one attempt.
                    r.spec.rebuild_retry_count = 1;
                }
                let _ = ctx.store.delete::<Replica>(name, None).await;
                ctx.store.create(&r).await.unwrap();
            }
            let engine = EngineStatus {
                volume: "v".into(),
                running: true,
                replicas: vec![
                    EngineReplica {
                        name: "v-r0".into(),
                        mode: source_mode.into(),
                        ..Default::default()
                    },
                    EngineReplica {
                        name: "v-r1".into(),
                        mode: "err".into(),
                        error: "the fill failed".into(),
                        rebuild_source: "v-r0".into(),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            };
            record_engine(&ctx, "n1", &engine).await.unwrap();
            let r: Replica = ctx.store.fetch("v-r1").await.unwrap();
            assert_eq!(r.status.mode, Some(ReplicaMode::Err));
            assert!(r.spec.failed_at.is_some());
            assert_eq!(r.spec.rebuild_retry_count, counted, "source {source_mode}");
            let mut events: Vec<ballast::model::Event> = ctx.store.list().await.unwrap();
            events.retain(|e| e.object == "replica/v-r1");
            events.sort_by(|a, b| a.name.cmp(&b.name));
            let last = events.last().unwrap();
            assert_eq!(last.reason, "RebuildFailed");
            assert!(
                last.message.starts_with("by its engine: the fill failed"),
                "{last:?}"
            );
            assert_eq!(
                last.message.contains("not counted"),
                counted == 0,
                "{last:?}"
            );
        }
    }

    /// A volume is degraded as soon as its engine's record drops a
    /// replica, not at the engine's next report; and a report taken
    /// before the drop, read after it, does not call it healthy again.
    #[tokio::test]
    async fn a_dropped_replica_degrades_the_volume_at_once_and_a_stale_report_does_not_heal_it() {
        use ballast::model::{ReplicaMode, Robustness, Volume};
        use ballast::proto::agent::v1::{EngineReplica, EngineStatus};
        let (_dir, svc) = service().await;
        let ctx = svc.ctx.clone();
        let mut v = attached_at_n1("w");
        let replicas: Vec<Replica> = ["w-r0", "w-r1"]
            .iter()
            .map(|n| {
                crate::executor::effects::new_replica(n, "w", "n1", "disk-1", Some(ReplicaMode::Rw))
            })
            .collect();
        crate::freshness::initial(&mut v, &replicas);
        ctx.store.create(&v).await.unwrap();
        for r in &replicas {
            ctx.store.create(r).await.unwrap();
        }
        let report = |r1: &str| EngineStatus {
            volume: "w".into(),
            running: true,
            replicas: vec![
                EngineReplica {
                    name: "w-r0".into(),
                    mode: "rw".into(),
                    ..Default::default()
                },
                EngineReplica {
                    name: "w-r1".into(),
                    mode: r1.into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let robustness = || async {
            let v: Volume = ctx.store.fetch("w").await.unwrap();
            v.status.robustness
        };
        let said = || async {
            let mut events: Vec<ballast::model::Event> = ctx.store.list().await.unwrap();
            events.retain(|e| e.object == "volume/w" && e.reason == "VolumeRobustness");
            events.sort_by(|a, b| a.name.cmp(&b.name));
            events.into_iter().map(|e| e.message).collect::<Vec<_>>()
        };

        record_engine(&ctx, "n1", &report("rw")).await.unwrap();
        assert_eq!(robustness().await, Robustness::Healthy);

        crate::freshness::record(&ctx, "w", "n1", (1, 0), &["w-r0".into()], "w-r1 dropped")
            .await
            .unwrap();
        assert_eq!(robustness().await, Robustness::Degraded, "at the record");
        let v: Volume = ctx.store.fetch("w").await.unwrap();
        assert!(v.status.last_degraded_at.is_some());

        // The engine's report from before the drop: w-r1 still rw in it.
        record_engine(&ctx, "n1", &report("rw")).await.unwrap();
        assert_eq!(robustness().await, Robustness::Degraded, "a stale report");
        record_engine(&ctx, "n1", &report("err")).await.unwrap();
        assert_eq!(robustness().await, Robustness::Degraded);
        assert_eq!(
            said().await,
            [
                "now healthy: 2 of 2 replicas rw",
                "now degraded: 1 of 2 replicas rw"
            ],
            "one event each way, none for the stale report"
        );
    }

    #[tokio::test]
    async fn heartbeats_record_rebuild_progress_and_disk_pressure() {
        let (_dir, svc) = service().await;
        let ctx = svc.ctx.clone();
        // 95% used, over the default threshold of 90%.
        beat(&svc, 50 << 20, 3 << 20, 8 << 20).await;
        let r: Replica = ctx.store.fetch("v-r1").await.unwrap();
        let p = r.status.rebuild_progress.unwrap();
        assert_eq!((p.done, p.total), (3 << 20, 8 << 20));
        let n: Node = ctx.store.fetch("n1").await.unwrap();
        let d = &n.status.disks["disk-1"];
        assert!(d.pressure);
        assert_eq!(d.scheduled_replicas, ["v-r1"]);
        // The fill is over; the disk has room; pressure turned off entirely.
        ctx.store
            .create(&Setting {
                name: ballast::settings::DISK_PRESSURE_PERCENTAGE.into(),
                resource_version: 0,
                value: "0".into(),
                status: Default::default(),
            })
            .await
            .unwrap();
        beat(&svc, 50 << 20, 0, 0).await;
        let r: Replica = ctx.store.fetch("v-r1").await.unwrap();
        assert_eq!(r.status.rebuild_progress, None);
        let n: Node = ctx.store.fetch("n1").await.unwrap();
        assert!(!n.status.disks["disk-1"].pressure);
    }
}
