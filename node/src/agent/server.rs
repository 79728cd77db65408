//! The node agent's gRPC service: what the controller asks of this node.
//! Create, delete, grow, rebuild and scrub replicas on its disks; start,
//! stop and change the engines of volumes attached here. It decides
//! nothing: every call is the controller's decision.
//!
//! Work on a replica's files that waits on its disk (a delete, a fence
//! raised and synced) runs on the blocking pool, one call per replica at
//! a time (another waits for it, without a thread, and is ABORTED after
//! [`FILES_PATIENCE`]): a disk that hangs holds up those calls alone, not
//! the async workers that serve the node's heartbeats, its other replicas
//! and its engines, and costs one thread per replica however often the
//! controller asks again.

use std::sync::Arc;

use ballast::guard::KeyedGuards;
use ballast::proto::agent::v1::node_agent_server::NodeAgent;
use ballast::proto::agent::v1::{
    AddEngineReplicaRequest, AddEngineReplicaResponse, CreateReplicaRequest, CreateReplicaResponse,
    DeleteReplicaRequest, DeleteReplicaResponse, FenceReplicaRequest, FenceReplicaResponse,
    GetNodeStatusRequest, GetNodeStatusResponse, GrowEngineRequest, GrowEngineResponse,
    GrowReplicaRequest, GrowReplicaResponse, ListEnginesRequest, ListEnginesResponse,
    ListReplicasRequest, ListReplicasResponse, LoseBadBlocksRequest, LoseBadBlocksResponse,
    LostBlocks, MergeReplicaRequest, MergeReplicaResponse, RebuildReplicaRequest,
    RebuildReplicaResponse, RemoveEngineReplicaRequest, RemoveEngineReplicaResponse,
    RenewEngineRequest, RenewEngineResponse, ReplicaStatus, RestoreReplicaRequest,
    RestoreReplicaResponse, ScrubReplicaRequest, ScrubReplicaResponse, SnapshotReplicaRequest,
    SnapshotReplicaResponse, SnapshotVolumeRequest, SnapshotVolumeResponse, StartEngineRequest,
    StartEngineResponse, StopEngineRequest, StopEngineResponse,
};
use tonic::{Request, Response, Status};

use crate::context::NodeContext;
use crate::error::Error;
use crate::replica::replica_dir;
use crate::replica::{META_FILE, Meta, Replica};
use crate::server::ReplicaServer;
use crate::wire::client::Liveness;

/// How long a call on a replica's files waits for another on them.
const FILES_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a replica's deletion waits for a fill of it, called off, to
/// write its last pieces and end.
const FILL_STOP: std::time::Duration = std::time::Duration::from_secs(10);

/// The gRPC service the controller calls on this node.
#[derive(Clone)]
pub struct NodeAgentService {
    ctx: Arc<NodeContext>,
    /// Replicas whose files a call is working on.
    busy: KeyedGuards,
    /// Replicas being merged.
    merging: KeyedGuards,
}

impl NodeAgentService {
    pub fn new(ctx: Arc<NodeContext>) -> Self {
        NodeAgentService {
            ctx,
            busy: KeyedGuards::default(),
            merging: KeyedGuards::default(),
        }
    }

    /// Runs `work` on replica `name`'s files on the blocking pool, holding
    /// the replica until the work ends (even when the caller went away).
    async fn on_files<T: Send + 'static>(
        &self,
        name: &str,
        work: impl FnOnce(&NodeContext) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        let busy = self
            .busy
            .take_within(name, FILES_PATIENCE)
            .await
            .ok_or_else(|| {
                Error::Busy(format!(
                    "another call has been working on replica {name}'s files for {}s (its disk may hang)",
                    FILES_PATIENCE.as_secs()
                ))
            })?;
        let ctx = self.ctx.clone();
        tokio::task::spawn_blocking(move || {
            let _busy = busy;
            work(&ctx)
        })
        .await
        .map_err(|e| Error::Internal(format!("the call ended: {e}")))?
    }

    /// The node's replica server (every node plugin has one; an agent
    /// built without it, in a test, serves no replicas).
    fn replica_server(&self) -> Result<Arc<ReplicaServer>, Error> {
        self.ctx
            .replicas
            .clone()
            .ok_or_else(|| Error::Internal("this node serves no replicas".into()))
    }

    /// Runs `change` on replica `name`, held alone, on the blocking pool:
    /// BUSY, with `lent` after its name, while its volume's engine holds
    /// it (the engine makes such changes itself).
    async fn change_unlent<T: Send + 'static>(
        &self,
        name: &str,
        lent: &str,
        change: impl FnOnce(&mut Replica) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        let server = self.replica_server()?;
        if server.replicas().is_lent(name) {
            return Err(Error::Busy(format!(
                "replica {name} is in use by its volume's engine{lent}"
            )));
        }
        let replica = server
            .replicas()
            .find_async(name)
            .await
            .map_err(Error::NotFound)?;
        tokio::task::spawn_blocking(move || {
            let mut r = replica
                .write()
                .map_err(|_| Error::Internal("replica lock poisoned".into()))?;
            change(&mut r)
        })
        .await
        .map_err(|e| Error::Internal(e.to_string()))?
    }
}

/// Merges replica `req.name`'s layers that no snapshot in `req.keep`
/// needs: by its engine when it is lent (between the volume's I/O), else
/// by its server.
async fn merge_now(
    ctx: &NodeContext,
    server: &ReplicaServer,
    req: MergeReplicaRequest,
) -> Result<MergeReplicaResponse, Error> {
    // A fill copying its layers (another node's rebuild, which this
    // node's records cannot know of) would find them changed.
    if let Some(why) = server.replicas().copied_from(&req.name) {
        return Err(Error::Busy(why));
    }
    if server.replicas().is_lent(&req.name) {
        // Its engine holds it: the engine merges it, between its I/O.
        let dir = server
            .replicas()
            .dir_of(&req.name)
            .map_err(Error::NotFound)?;
        let volume = Meta::read(&dir)
            .map_err(|e| Error::Internal(e.to_string()))?
            .volume;
        ctx.engines
            .merge(&volume, &req.name, req.keep, req.bytes_per_second)
            .await?;
        let view = Replica::open_view(&dir).map_err(|e| Error::Internal(e.to_string()))?;
        return Ok(MergeReplicaResponse {
            layers: view.chain().len() as u32,
            ..Default::default()
        });
    }
    server
        .replicas()
        .find_async(&req.name)
        .await
        .map_err(Error::NotFound)?;
    let done = server
        .replicas()
        .merge(&req.name, req.keep, req.bytes_per_second)
        .await
        .map_err(|e| match (e.corruption(), &e) {
            // Found by the merge, marked; the controller fails the replica.
            (Some(_), _) => Error::SourceCorrupt(e.to_string()),
            (None, crate::replica::ReplicaError::Busy(why)) => Error::Busy(why.clone()),
            (None, _) => Error::Internal(e.to_string()),
        })?;
    Ok(MergeReplicaResponse {
        merged: done.merged,
        copied_bytes: done.copied,
        allocated_before: done.allocated_before,
        allocated_after: done.allocated_after,
        layers: done.layers,
    })
}

fn status_of(name: &str, disk_id: &str, meta: &Meta) -> ReplicaStatus {
    ReplicaStatus {
        pending_layers: meta.pending.len() as u32,
        name: name.to_string(),
        volume: meta.volume.clone(),
        disk_id: disk_id.to_string(),
        // Until an engine opens it, a replica has no mode.
        mode: String::new(),
        running: false,
        size: meta.size,
        ..Default::default()
    }
}

/// Every replica on the node's disks.
pub fn scan(ctx: &NodeContext) -> Vec<ReplicaStatus> {
    let mut out = Vec::new();
    for d in &ctx.disks {
        let Ok(entries) = std::fs::read_dir(d.path.join("replicas")) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Ok(meta) = Meta::read(&e.path()) {
                let mut st = status_of(&name, &d.id, &meta);
                // An unreadable fence reads as none: the controller then
                // asks to raise it, and the error shows there.
                st.fence = crate::replica::read_fence(&e.path()).unwrap_or(0);
                if let Some((done, total)) =
                    ctx.replicas.as_ref().and_then(|s| s.fill_progress(&name))
                {
                    (st.rebuild_done, st.rebuild_total) = (done, total);
                }
                out.push(st);
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
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

    #[tracing::instrument(skip_all, fields(node = %self.ctx.node_id, replica = %request.get_ref().name, volume = %request.get_ref().volume))]
    async fn create_replica(
        &self,
        request: Request<CreateReplicaRequest>,
    ) -> Result<Response<CreateReplicaResponse>, Status> {
        let req = request.into_inner();
        let invalid = |field: &str, message: String| Error::Invalid {
            field: field.into(),
            message,
        };
        ballast::model::validate_name(&req.name).map_err(|m| invalid("name", m))?;
        let disk = self
            .ctx
            .disks
            .iter()
            .find(|d| d.id == req.disk_id)
            .ok_or_else(|| {
                invalid(
                    "disk_id",
                    format!("no disk {:?} on node {}", req.disk_id, self.ctx.node_id),
                )
            })?;
        // Not onto whatever is in its directory now (the root filesystem,
        // when the disk's did not mount).
        if let Some(why) = disk.not_here() {
            return Err(
                Error::disk(&disk.path, format!("disk {} is not ready: {why}", disk.id)).into(),
            );
        }
        let dir = replica_dir(&disk.path, &req.name);
        if dir.join(META_FILE).exists() {
            // Idempotent: the same replica again is fine, another size is not.
            let meta = Meta::read(&dir).map_err(|e| Error::Internal(e.to_string()))?;
            if meta.size != req.size || meta.volume != req.volume {
                return Err(Error::AlreadyExists(format!(
                    "replica {} exists with another volume or size",
                    req.name
                ))
                .into());
            }
            return Ok(Response::new(CreateReplicaResponse {
                replica: Some(status_of(&req.name, &disk.id, &meta)),
            }));
        }
        let (dir2, volume, size) = (dir.clone(), req.volume.clone(), req.size);
        let created =
            tokio::task::spawn_blocking(move || Replica::create_for(&dir2, &volume, size))
                .await
                .map_err(|e| Error::Internal(e.to_string()))?;
        match created {
            Ok(_) => {
                let meta = Meta::read(&dir).map_err(|e| Error::Internal(e.to_string()))?;
                Ok(Response::new(CreateReplicaResponse {
                    replica: Some(status_of(&req.name, &disk.id, &meta)),
                }))
            }
            Err(crate::replica::ReplicaError::Invalid(m)) => Err(invalid("size", m).into()),
            Err(e) => Err(Error::Internal(e.to_string()).into()),
        }
    }

    #[tracing::instrument(skip_all, fields(node = %self.ctx.node_id, replica = %request.get_ref().name, epoch = request.get_ref().epoch))]
    async fn fence_replica(
        &self,
        request: Request<FenceReplicaRequest>,
    ) -> Result<Response<FenceReplicaResponse>, Status> {
        let FenceReplicaRequest { name, epoch } = request.into_inner();
        ballast::model::validate_name(&name).map_err(|m| Error::Invalid {
            field: "name".into(),
            message: m,
        })?;
        let Some(server) = self.ctx.replicas.clone() else {
            return Err(Error::Unavailable("this node serves no replicas".into()).into());
        };
        server.replicas().dir_of(&name).map_err(Error::NotFound)?;
        let fence = self
            .on_files(&name.clone(), move |_| {
                server
                    .replicas()
                    .raise_fence(&name, epoch)
                    .map_err(Error::Internal)
            })
            .await?;
        Ok(Response::new(FenceReplicaResponse { fence }))
    }

    #[tracing::instrument(skip_all, fields(node = %self.ctx.node_id, replica = %request.get_ref().name))]
    async fn delete_replica(
        &self,
        request: Request<DeleteReplicaRequest>,
    ) -> Result<Response<DeleteReplicaResponse>, Status> {
        let name = request.into_inner().name;
        ballast::model::validate_name(&name).map_err(|m| Error::Invalid {
            field: "name".into(),
            message: m,
        })?;
        if let Some(server) = &self.ctx.replicas
            && server.replicas().is_lent(&name)
        {
            return Err(Error::Busy(format!(
                "replica {name} is in use by its volume's engine; remove it from the engine first"
            ))
            .into());
        }
        // A fill of it stops first (its last pieces written), whoever
        // asked for it: its data goes.
        if let Some(server) = &self.ctx.replicas
            && !server.call_off_fill(&name, FILL_STOP).await
        {
            return Err(Error::Busy(format!(
                "replica {name} is being filled and its fill did not stop within {}s",
                FILL_STOP.as_secs()
            ))
            .into());
        }
        self.on_files(&name.clone(), move |ctx| {
            for d in &ctx.disks {
                let dir = replica_dir(&d.path, &name);
                if dir.join(META_FILE).exists() {
                    let deleted = match &ctx.replicas {
                        Some(server) => server.replicas().delete(&name, &dir),
                        None => crate::replica::remove_replica_dir(&dir),
                    };
                    deleted.map_err(|e| Error::Internal(format!("{}: {e}", dir.display())))?;
                }
            }
            Ok(())
        })
        .await?;
        // Deleting what is not there succeeds: the call is idempotent.
        Ok(Response::new(DeleteReplicaResponse {}))
    }

    #[tracing::instrument(skip_all, fields(node = %self.ctx.node_id))]
    async fn list_replicas(
        &self,
        _request: Request<ListReplicasRequest>,
    ) -> Result<Response<ListReplicasResponse>, Status> {
        Ok(Response::new(ListReplicasResponse {
            replicas: scan(&self.ctx),
        }))
    }

    #[tracing::instrument(skip_all, fields(node = %self.ctx.node_id, volume = %request.get_ref().volume))]
    async fn start_engine(
        &self,
        request: Request<StartEngineRequest>,
    ) -> Result<Response<StartEngineResponse>, Status> {
        // On a task of its own, so that it runs to its end when the caller
        // gives up: cut off midway, it would leave an engine process
        // running that no record names, which the next start's check of
        // the control socket would take for its own.
        let ctx = self.ctx.clone();
        let spec = request.into_inner();
        let start = async move { ctx.engines.start(spec).await };
        let engine = tokio::spawn(tracing::Instrument::in_current_span(start))
            .await
            .map_err(|e| crate::error::Error::Internal(format!("the engine's start: {e}")))??;
        Ok(Response::new(StartEngineResponse {
            engine: Some(engine),
        }))
    }

    #[tracing::instrument(skip_all, fields(node = %self.ctx.node_id, volume = %request.get_ref().volume))]
    async fn stop_engine(
        &self,
        request: Request<StopEngineRequest>,
    ) -> Result<Response<StopEngineResponse>, Status> {
        let stopped = self.ctx.engines.stop(&request.into_inner().volume).await?;
        Ok(Response::new(StopEngineResponse { stopped }))
    }

    #[tracing::instrument(skip_all, fields(node = %self.ctx.node_id, volume = %request.get_ref().volume, replica = %request.get_ref().replica))]
    async fn add_engine_replica(
        &self,
        request: Request<AddEngineReplicaRequest>,
    ) -> Result<Response<AddEngineReplicaResponse>, Status> {
        let AddEngineReplicaRequest {
            volume,
            replica,
            source,
            bytes_per_second,
        } = request.into_inner();
        let source = (!source.is_empty()).then_some(source);
        let engines = &self.ctx.engines;
        engines
            .add_replica(&volume, &replica, (source, bytes_per_second))
            .await?;
        Ok(Response::new(AddEngineReplicaResponse {}))
    }

    #[tracing::instrument(skip_all, fields(node = %self.ctx.node_id, volume = %request.get_ref().volume, replica = %request.get_ref().replica))]
    async fn remove_engine_replica(
        &self,
        request: Request<RemoveEngineReplicaRequest>,
    ) -> Result<Response<RemoveEngineReplicaResponse>, Status> {
        let RemoveEngineReplicaRequest { volume, replica } = request.into_inner();
        self.ctx.engines.remove_replica(&volume, &replica).await?;
        Ok(Response::new(RemoveEngineReplicaResponse {}))
    }

    #[tracing::instrument(skip_all, fields(node = %self.ctx.node_id, replica = %request.get_ref().name, source = %request.get_ref().source))]
    async fn rebuild_replica(
        &self,
        request: Request<RebuildReplicaRequest>,
    ) -> Result<Response<RebuildReplicaResponse>, Status> {
        let req = request.into_inner();
        let server = self.replica_server()?;
        let source = (req.source.as_str(), req.bytes_per_second);
        let done = super::rebuild::offline(&server, &req.name, source, Liveness::default()).await?;
        Ok(Response::new(done))
    }

    #[tracing::instrument(skip_all, fields(node = %self.ctx.node_id, replica = %request.get_ref().name, size = request.get_ref().size))]
    async fn grow_replica(
        &self,
        request: Request<GrowReplicaRequest>,
    ) -> Result<Response<GrowReplicaResponse>, Status> {
        let req = request.into_inner();
        ballast::model::validate_name(&req.name).map_err(|m| Error::Invalid {
            field: "name".into(),
            message: m,
        })?;
        let size = req.size;
        self.change_unlent(&req.name, "; grow it detached", move |r| {
            // Smaller: the controller undoes a growth that failed elsewhere.
            let resized = if size < r.size() {
                r.shrink_unused(size)
            } else {
                r.grow(size)
            };
            resized.map_err(|e| match e {
                crate::replica::ReplicaError::Invalid(m) => Error::Invalid {
                    field: "size".into(),
                    message: m,
                },
                e => Error::Internal(e.to_string()),
            })
        })
        .await?;
        Ok(Response::new(GrowReplicaResponse {}))
    }

    #[tracing::instrument(skip_all, fields(node = %self.ctx.node_id, replica = %request.get_ref().name))]
    async fn scrub_replica(
        &self,
        request: Request<ScrubReplicaRequest>,
    ) -> Result<Response<ScrubReplicaResponse>, Status> {
        let req = request.into_inner();
        let server = self.replica_server()?;
        let answer = match server
            .replicas()
            .scrub(&req.name, req.bytes_per_second)
            .await
        {
            Ok(bytes) => ScrubReplicaResponse {
                bytes,
                corrupt: false,
                message: String::new(),
            },
            Err(e)
                if crate::wire::protocol::status_of(&e)
                    == crate::wire::protocol::status::CORRUPT =>
            {
                ScrubReplicaResponse {
                    bytes: 0,
                    corrupt: true,
                    message: e.to_string(),
                }
            }
            Err(crate::replica::ReplicaError::Invalid(m)) => return Err(Error::NotFound(m).into()),
            Err(e) => return Err(Error::Internal(e.to_string()).into()),
        };
        Ok(Response::new(answer))
    }

    #[tracing::instrument(skip_all, fields(node = %self.ctx.node_id, volume = %request.get_ref().volume, snapshot = %request.get_ref().snapshot))]
    async fn snapshot_volume(
        &self,
        request: Request<SnapshotVolumeRequest>,
    ) -> Result<Response<SnapshotVolumeResponse>, Status> {
        let req = request.into_inner();
        self.ctx
            .engines
            .snapshot(&req.volume, &req.snapshot)
            .await?;
        Ok(Response::new(SnapshotVolumeResponse {}))
    }

    #[tracing::instrument(skip_all, fields(node = %self.ctx.node_id, replica = %request.get_ref().name, snapshot = %request.get_ref().snapshot))]
    async fn snapshot_replica(
        &self,
        request: Request<SnapshotReplicaRequest>,
    ) -> Result<Response<SnapshotReplicaResponse>, Status> {
        let req = request.into_inner();
        if !crate::replica::valid_snapshot_id(&req.snapshot) {
            return Err(Error::Invalid {
                field: "snapshot".into(),
                message: format!("{:?} is not a snapshot id", req.snapshot),
            }
            .into());
        }
        let snapshot = req.snapshot;
        let answer = self
            .change_unlent(&req.name, ": its engine takes the snapshot", move |r| {
                let layer = r
                    .snapshot(Some(&snapshot))
                    .map_err(|e| Error::Internal(e.to_string()))?;
                let layers = r.layers();
                let upto = layers.iter().position(|l| l.name == layer).unwrap_or(0);
                Ok(SnapshotReplicaResponse {
                    allocated: layers[..=upto].iter().map(|l| l.allocated).sum(),
                    layer,
                })
            })
            .await?;
        Ok(Response::new(answer))
    }

    #[tracing::instrument(skip_all, fields(node = %self.ctx.node_id, replica = %request.get_ref().name, snapshot = %request.get_ref().snapshot))]
    async fn restore_replica(
        &self,
        request: Request<RestoreReplicaRequest>,
    ) -> Result<Response<RestoreReplicaResponse>, Status> {
        let req = request.into_inner();
        let server = self.replica_server()?;
        let source = (req.source.as_str(), req.bytes_per_second);
        let done = super::rebuild::restore(
            &server,
            &req.name,
            source,
            &req.snapshot,
            Liveness::default(),
        )
        .await?;
        Ok(Response::new(done))
    }

    #[tracing::instrument(skip_all, fields(node = %self.ctx.node_id, replica = %request.get_ref().name))]
    async fn merge_replica(
        &self,
        request: Request<MergeReplicaRequest>,
    ) -> Result<Response<MergeReplicaResponse>, Status> {
        let req = request.into_inner();
        let server = self.replica_server()?;
        if let Some(bad) = req
            .keep
            .iter()
            .find(|k| !crate::replica::valid_snapshot_id(k))
        {
            return Err(Error::Invalid {
                field: "keep".into(),
                message: format!("{bad:?} is not a snapshot id"),
            }
            .into());
        }
        // One merge of a replica at a time: a second beside it would copy
        // the same blocks again. Held until the merge ends, even when the
        // caller went away (its call cut), as the merge goes on.
        let merging = self
            .merging
            .try_take(&req.name)
            .ok_or_else(|| Error::Busy(format!("replica {} is being merged already", req.name)))?;
        let ctx = self.ctx.clone();
        let merge = async move {
            let _merging = merging;
            merge_now(&ctx, &server, req).await
        };
        tokio::spawn(tracing::Instrument::in_current_span(merge))
            .await
            .map_err(|e| Error::Internal(format!("the merge ended: {e}")))?
            .map(Response::new)
            .map_err(Into::into)
    }

    #[tracing::instrument(skip_all, fields(node = %self.ctx.node_id, volume = %request.get_ref().volume, size = request.get_ref().size))]
    async fn grow_engine(
        &self,
        request: Request<GrowEngineRequest>,
    ) -> Result<Response<GrowEngineResponse>, Status> {
        let req = request.into_inner();
        if req.size == 0 || !req.size.is_multiple_of(crate::replica::BLOCK) {
            return Err(Error::Invalid {
                field: "size".into(),
                message: format!("{} is not a positive multiple of 4096", req.size),
            }
            .into());
        }
        self.ctx.engines.grow(&req.volume, req.size).await?;
        Ok(Response::new(GrowEngineResponse {}))
    }

    #[tracing::instrument(skip_all, fields(node = %self.ctx.node_id, volume = %request.get_ref().volume))]
    async fn renew_engine(
        &self,
        request: Request<RenewEngineRequest>,
    ) -> Result<Response<RenewEngineResponse>, Status> {
        let req = request.into_inner();
        self.ctx
            .engines
            .renew(&req.volume, &req.tls_cert_pem, &req.tls_key_pem)
            .await?;
        Ok(Response::new(RenewEngineResponse {}))
    }

    #[tracing::instrument(skip_all, fields(node = %self.ctx.node_id, replica = %request.get_ref().name))]
    async fn lose_bad_blocks(
        &self,
        request: Request<LoseBadBlocksRequest>,
    ) -> Result<Response<LoseBadBlocksResponse>, Status> {
        let name = request.into_inner().name;
        let given_up = self
            .change_unlent(&name, "; its engine gives up what it must", |r| {
                r.lose_marked_blocks()
                    .map_err(|e| Error::Internal(e.to_string()))
            })
            .await?;
        let lost = given_up
            .into_iter()
            .map(|(layer, blocks)| LostBlocks {
                layer,
                offsets: blocks
                    .into_iter()
                    .map(|b| b * crate::replica::BLOCK)
                    .collect(),
            })
            .collect();
        Ok(Response::new(LoseBadBlocksResponse { lost }))
    }

    #[tracing::instrument(skip_all, fields(node = %self.ctx.node_id))]
    async fn list_engines(
        &self,
        _request: Request<ListEnginesRequest>,
    ) -> Result<Response<ListEnginesResponse>, Status> {
        Ok(Response::new(ListEnginesResponse {
            engines: self.ctx.engines.list().await,
        }))
    }
}
