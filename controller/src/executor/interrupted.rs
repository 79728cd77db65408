//! Rebuilds whose driver is gone. A replica is `wo` from the moment its
//! record is written until its engine (or, for a detached volume, this
//! controller's call to its node) has filled it. When the controller that
//! started it dies in between — a leader killed mid-rebuild, a crash — no
//! one fills it, and the next plan would wait on it for ever. A `wo`
//! replica that no engine or node has reported, and no call of this
//! controller has held, for the node-down timeout is failed (not counted as
//! an attempt), so that the planner reuses it and the rebuild starts again.
//!
//! It owns that one decision; what happens next is the planner's.

use std::time::Instant;

use ballast::model::{Kind, Replica, ReplicaMode};

use super::effects;
use crate::context::Context;
use crate::error::Error;

/// Fails every `wo` replica whose rebuild no one has driven for the
/// node-down timeout. Returns their names.
#[tracing::instrument(skip_all)]
pub async fn fail_interrupted(ctx: &Context) -> Result<Vec<String>, Error> {
    let replicas = ctx.store.list::<Replica>().await?;
    let now = Instant::now();
    let stalled: Vec<&Replica> = {
        let Ok(mut seen) = ctx.rebuilding_seen.lock() else {
            return Ok(Vec::new());
        };
        seen.retain(|name, _| {
            replicas
                .iter()
                .any(|r| r.name == *name && r.status.mode == Some(ReplicaMode::Wo))
        });
        replicas
            .iter()
            .filter(|r| r.status.mode == Some(ReplicaMode::Wo))
            .filter(|r| {
                if ctx.volume_busy(&r.spec.volume) {
                    seen.insert(r.name.clone(), now);
                    return false;
                }
                let at = *seen.entry(r.name.clone()).or_insert(now);
                now.duration_since(at) > ctx.node_down_timeout
            })
            .collect()
    };
    let mut failed = Vec::new();
    for r in stalled {
        let at = ctx.now();
        let mut changed = false;
        ctx.store
            .modify::<Replica, Error>(&r.name, |rep| {
                // Re-check on the fresh copy: its engine may have just
                // reported it.
                changed = rep.status.mode == Some(ReplicaMode::Wo);
                if changed {
                    effects::failed(rep, at, true);
                }
                Ok(changed)
            })
            .await?;
        if changed {
            ctx.event(
                Kind::Replica,
                &r.name,
                "RebuildInterrupted",
                format!(
                    "no engine or node has reported filling it for {}s (its controller may have died); it is rebuilt again",
                    ctx.node_down_timeout.as_secs_f64()
                ),
            )
            .await;
            failed.push(r.name.clone());
        }
    }
    Ok(failed)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use ballast::store::{MemoryStore, Store};

    use super::*;

    async fn wo(store: &Arc<dyn Store>, name: &str, volume: &str) {
        let r = effects::new_replica(name, volume, "n1", "d1", Some(ReplicaMode::Wo));
        store.create(&r).await.unwrap();
    }

    #[tokio::test]
    async fn a_rebuild_no_one_drives_for_the_timeout_is_failed_and_one_reported_or_held_is_not() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let ctx = Context::new(store.clone(), Duration::from_millis(100));
        wo(&store, "orphan-r1", "orphan").await;
        wo(&store, "reported-r1", "reported").await;
        wo(&store, "held-r1", "held").await;
        let _guard = ctx.lock_volume("held").unwrap();

        // First seen now: each has the timeout from here.
        assert!(fail_interrupted(&ctx).await.unwrap().is_empty());
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(40)).await;
            ctx.saw_rebuilding("reported-r1");
        }
        assert_eq!(fail_interrupted(&ctx).await.unwrap(), ["orphan-r1"]);
        let r: Replica = store.fetch("orphan-r1").await.unwrap();
        assert_eq!(r.status.mode, Some(ReplicaMode::Err));
        assert!(r.spec.failed_at.is_some());
        assert_eq!(r.spec.rebuild_retry_count, 0, "not counted as an attempt");
        for name in ["reported-r1", "held-r1"] {
            let r: Replica = store.fetch(name).await.unwrap();
            assert_eq!(r.status.mode, Some(ReplicaMode::Wo), "{name}");
        }
        let events: Vec<ballast::model::Event> = store.list().await.unwrap();
        assert!(
            events
                .iter()
                .any(|e| e.object == "replica/orphan-r1" && e.reason == "RebuildInterrupted"),
            "{events:?}"
        );
    }
}
