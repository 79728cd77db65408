//! The one way a replica comes to be: its record first (the intent), then
//! the replica on its node's disk. When the node cannot make it, both go
//! again (one rollback rule: a replica that could not be made leaves
//! nothing behind). Volume creation and the planner's CreateReplica both
//! come through here.

use ballast::model::{DesiredState, Kind, Node, Replica, ReplicaMode, ReplicaSpec, ReplicaStatus};
use ballast::proto::agent::v1::{CreateReplicaRequest, DeleteReplicaRequest};
use ballast::store::StoreExt;

use super::{agent, replica_name, with_timeout};
use crate::context::Context;
use crate::error::Error;

/// Makes a new, empty replica of `volume` (of `size` bytes) on
/// `node`/`disk`, recorded with `mode` (`wo` when it is to be filled).
#[tracing::instrument(skip_all, fields(volume = %volume, node = %node.id, disk = %disk))]
pub async fn make(
    ctx: &Context,
    volume: &str,
    size: u64,
    node: &Node,
    disk: &str,
    mode: Option<ReplicaMode>,
) -> Result<Replica, Error> {
    let name = replica_name(volume);
    let record = Replica {
        name: name.clone(),
        resource_version: 0,
        spec: ReplicaSpec {
            volume: volume.to_string(),
            node_id: node.id.clone(),
            disk_id: disk.to_string(),
            data_directory: format!("replicas/{name}"),
            desired_state: DesiredState::Running,
            eviction_requested: false,
            rebuild_retry_count: 0,
            failed_at: None,
            healthy_at: None,
        },
        status: ReplicaStatus {
            mode,
            ..Default::default()
        },
    };
    // Intent first: the record exists before the replica does.
    let record = ctx.store.create(&record)?;
    let created = async {
        let mut c = agent(node)?;
        with_timeout(
            &node.id,
            c.create_replica(CreateReplicaRequest {
                name: name.clone(),
                volume: volume.to_string(),
                disk_id: disk.to_string(),
                size,
            }),
        )
        .await
    }
    .await;
    if let Err(e) = created {
        discard(ctx, &record).await;
        return Err(e);
    }
    ctx.event(
        Kind::Replica,
        &name,
        "ReplicaCreated",
        format!("on {}/{disk}", node.id),
    );
    Ok(record)
}

/// Undoes `make`: the replica's data on its node (when the node can be
/// reached; else it deletes it when it is back, as for any replica it
/// holds without a record), then its record.
pub async fn discard(ctx: &Context, r: &Replica) {
    if let Ok(node) = ctx.store.fetch::<Node>(&r.spec.node_id) {
        let _ = delete_on_node(&node, &r.name).await;
    }
    let _ = ctx.store.delete::<Replica>(&r.name, None);
}

/// Deletes replica `name`'s data on `node`.
pub async fn delete_on_node(node: &Node, name: &str) -> Result<(), Error> {
    let mut c = agent(node)?;
    with_timeout(
        &node.id,
        c.delete_replica(DeleteReplicaRequest {
            name: name.to_string(),
        }),
    )
    .await
    .map(drop)
}
