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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ballast::store::Store;

    use super::*;
    use crate::test_store::{Counting, node};

    /// A controller that takes over after following for longer than the
    /// timeout counts each node's silence from its takeover, not from its
    /// start (a follower hears no heartbeat): the nodes it has not heard
    /// from yet stay ready until a whole timeout passes with no word from
    /// them, and then they go down.
    #[tokio::test]
    async fn a_new_leader_counts_silence_from_its_takeover_not_its_start() {
        let store: Arc<dyn Store> = Arc::new(Counting::default());
        store.create(&node("n1", true)).await.unwrap();
        store.create(&node("n2", true)).await.unwrap();
        let ctx = Context::new(store.clone(), Duration::from_secs(1));
        // Following, for longer than the timeout.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        ctx.began_leading();
        assert_eq!(check_liveness(&ctx).await.unwrap(), Vec::<String>::new());
        // n1 beats; n2 stays silent for a whole timeout since the takeover.
        tokio::time::sleep(Duration::from_millis(600)).await;
        ctx.saw_node("n1");
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(check_liveness(&ctx).await.unwrap(), ["n2"]);
        let n1: Node = store.fetch("n1").await.unwrap();
        assert!(n1.status.ready);
    }
}
