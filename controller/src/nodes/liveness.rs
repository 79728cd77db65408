//! Node liveness: a node not heard from for the timeout is marked not
//! ready (with an event), so that the planner stops placing on it and the
//! volumes on it degrade. Only the timeout decides: no probing.

use std::sync::Arc;
use std::time::Duration;

use ballast::model::{Kind, Node};

use crate::context::Context;
use crate::error::Error;

/// One pass: every ready node silent for longer than the timeout turns
/// not ready. Returns the ids it marked.
#[tracing::instrument(skip_all)]
pub async fn check_liveness(ctx: &Context) -> Result<Vec<String>, Error> {
    let mut marked = Vec::new();
    for node in ctx.store.list::<Node>().await? {
        if !node.status.ready {
            continue;
        }
        let silence = ctx.silence(&node.id);
        if silence <= ctx.node_down_timeout {
            continue;
        }
        let mut changed = false;
        ctx.store
            .modify::<Node, Error>(&node.id, |n| {
                // Re-check on the fresh copy: a heartbeat may have just landed.
                changed = n.status.ready && ctx.silence(&n.id) > ctx.node_down_timeout;
                n.status.ready = false;
                Ok(changed)
            })
            .await?;
        if changed {
            ctx.event(
                Kind::Node,
                &node.id,
                "NodeDown",
                format!(
                    "no heartbeat for {}s (timeout {}s); node is not ready",
                    silence.as_secs(),
                    ctx.node_down_timeout.as_secs_f64()
                ),
            )
            .await;
            marked.push(node.id);
        }
    }
    Ok(marked)
}

/// Runs [`check_liveness`] several times per timeout until the task is dropped.
pub async fn run_liveness(ctx: Arc<Context>) {
    let period =
        (ctx.node_down_timeout / 5).clamp(Duration::from_millis(100), Duration::from_secs(2));
    let mut tick = tokio::time::interval(period);
    loop {
        tick.tick().await;
        if let Err(e) = check_liveness(&ctx).await {
            tracing::warn!(error = %e, "liveness check failed");
        }
    }
}
