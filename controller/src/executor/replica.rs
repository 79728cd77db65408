//! The one way a replica comes to be: its record first (the intent), then
//! the replica on its node's disk. When the node cannot make it, both go
//! again (one rollback rule: a replica that could not be made leaves
//! nothing behind). Volume creation and the planner's CreateReplica both
//! come through here.

use ballast::model::{Kind, Node, Replica, ReplicaMode};

use crate::agents::NewReplica;
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
    let name = ctx.replica_name(volume);
    let record = super::effects::new_replica(&name, volume, &node.id, disk, mode);
    // Intent first: the record exists before the replica does.
    let record = ctx.store.create(&record).await?;
    let new = NewReplica {
        name: &name,
        volume,
        disk,
        size,
    };
    let created = ctx.agents.create_replica(node, new).await;
    if let Err(e) = created {
        discard(ctx, &record).await;
        return Err(e);
    }
    ctx.event(
        Kind::Replica,
        &name,
        "ReplicaCreated",
        format!("on {}/{disk}", node.id),
    )
    .await;
    Ok(record)
}

/// Undoes `make`: the replica's data on its node (when the node can be
/// reached; else it deletes it when it is back, as for any replica it
/// holds without a record), then its record.
pub async fn discard(ctx: &Context, r: &Replica) {
    if let Ok(node) = ctx.store.fetch::<Node>(&r.spec.node_id).await {
        let _ = ctx.agents.delete_replica(&node, &r.name).await;
    }
    let _ = ctx.store.delete::<Replica>(&r.name, None).await;
}
