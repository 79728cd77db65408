//! Rebuilds whose driver is gone. A replica is `wo` from the moment its
//! record is written until its engine (or, for a detached volume, this
//! controller's call to its node) has filled it. When the controller that
//! started it dies in between — a leader killed mid-rebuild, a crash — no
//! one fills it, and the next plan would wait on it for ever. A `wo`
//! replica that no engine or node has reported, and no call of this
//! controller has held, for the node-down timeout is failed (not counted as
//! an attempt), so that the planner reuses it and the rebuild starts again.
//! A detach, or an engine started again, fails the replicas the stopped
//! engine was filling at once: the call knows no one drives them.
//!
//! On Kubernetes a record's status is a request of its own, after the
//! create: a controller killed between the two leaves a replica with no
//! mode at all. In a volume that has held data no replica is made without
//! one (only an empty volume's are), so such a replica is a rebuild whose
//! driver is gone too, and is treated as one.
//!
//! It owns that one decision; what happens next is the planner's.

use std::time::Instant;

use ballast::model::{Kind, Replica, ReplicaMode};
use rustc_hash::FxHashSet;

use super::effects;
use crate::context::Context;
use crate::error::Error;

/// Whether `r` is to be filled: `wo`, or (its status lost) no mode in a
/// volume that has held data (one of `held_data`).
fn to_be_filled(r: &Replica, held_data: &FxHashSet<&str>) -> bool {
    match r.status.mode {
        Some(ReplicaMode::Wo) => true,
        None => held_data.contains(r.spec.volume.as_str()),
        Some(_) => false,
    }
}

/// Fails every replica to be filled whose rebuild no one has driven for
/// the node-down timeout, of `replicas` (all of them, as the control
/// loop's copy has them: each is checked again on the store's copy before
/// it is failed). Returns their names.
#[tracing::instrument(skip_all)]
pub async fn fail_interrupted<'a>(
    ctx: &Context,
    replicas: impl IntoIterator<Item = &'a Replica> + Clone,
) -> Result<Vec<String>, Error> {
    // Sets, not searches: a pass costs the same per replica at any count.
    let held_data: FxHashSet<&str> = replicas
        .clone()
        .into_iter()
        .filter(|r| r.spec.healthy_at.is_some())
        .map(|r| r.spec.volume.as_str())
        .collect();
    let filled: Vec<&Replica> = replicas
        .into_iter()
        .filter(|r| to_be_filled(r, &held_data))
        .collect();
    let now = Instant::now();
    let stalled: Vec<&Replica> = {
        let Ok(mut seen) = ctx.rebuilding_seen.lock() else {
            return Ok(Vec::new());
        };
        let names: FxHashSet<&str> = filled.iter().map(|r| r.name.as_str()).collect();
        seen.retain(|name, _| names.contains(name.as_str()));
        filled
            .into_iter()
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
        let why = format!(
            "no engine or node has reported filling it for {}s (its controller may have died); it is rebuilt again",
            ctx.node_down_timeout.as_secs_f64()
        );
        if interrupt(ctx, r, &why).await? {
            failed.push(r.name.clone());
        }
    }
    Ok(failed)
}

/// Fails every replica of `volume` its engine was filling, once that
/// engine is stopped (`why`: the volume detached, or its engine started
/// again): no one drives those
/// rebuilds now, and the planner starts them again at once (offline, or
/// by the next attachment's engine, keeping what was copied) rather than
/// after the node-down timeout. Returns their names.
pub async fn fail_engines_rebuilds(
    ctx: &Context,
    volume: &str,
    why: &str,
) -> Result<Vec<String>, Error> {
    let filled: Vec<Replica> = ctx
        .records()
        .await?
        .replicas()
        .filter(|r| r.spec.volume == volume && r.status.mode == Some(ReplicaMode::Wo))
        .cloned()
        .collect();
    let mut failed = Vec::new();
    for r in &filled {
        if interrupt(ctx, r, &format!("{why}; it is rebuilt again")).await? {
            failed.push(r.name.clone());
        }
    }
    Ok(failed)
}

/// Fails `r`, still in the mode it was seen in, as a rebuild whose driver
/// is gone (not counted as an attempt), saying `why`; whether it was.
async fn interrupt(ctx: &Context, r: &Replica, why: &str) -> Result<bool, Error> {
    let at = ctx.now();
    let mut changed = false;
    ctx.store
        .modify::<Replica, Error>(&r.name, |rep| {
            // Re-check on the fresh copy: its engine may have just
            // reported it.
            changed = rep.status.mode == r.status.mode;
            if changed {
                effects::failed(rep, at, true);
            }
            Ok(changed)
        })
        .await?;
    if changed {
        ctx.event(Kind::Replica, &r.name, "RebuildInterrupted", why)
            .await;
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use ballast::store::{MemoryStore, Store};

    use super::*;

    async fn replica(store: &Arc<dyn Store>, name: &str, volume: &str, mode: Option<ReplicaMode>) {
        let r = effects::new_replica(name, volume, "n1", "d1", mode);
        store.create(&r).await.unwrap();
    }

    async fn wo(store: &Arc<dyn Store>, name: &str, volume: &str) {
        replica(store, name, volume, Some(ReplicaMode::Wo)).await;
    }

    #[tokio::test]
    async fn a_rebuild_no_one_drives_or_whose_status_was_lost_is_failed_after_the_timeout_and_one_reported_or_held_is_not()
     {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let ctx = Context::new(store.clone(), Duration::from_millis(100));
        wo(&store, "orphan-r1", "orphan").await;
        wo(&store, "reported-r1", "reported").await;
        wo(&store, "held-r1", "held").await;
        let _guard = ctx.lock_volume("held").unwrap();
        // Its status lost (a controller killed between the create and the
        // status write): no mode, in a volume that has held data.
        let mut rw = effects::new_replica("lost-r1", "lost", "n1", "d1", Some(ReplicaMode::Rw));
        rw.spec.healthy_at = Some(ctx.now());
        store.create(&rw).await.unwrap();
        replica(&store, "lost-r2", "lost", None).await;
        // No mode in a volume that never held data: an empty replica.
        replica(&store, "empty-r1", "empty", None).await;

        // First seen now: each has the timeout from here.
        assert!(
            fail_interrupted(&ctx, &ctx.store.list::<Replica>().await.unwrap())
                .await
                .unwrap()
                .is_empty()
        );
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(40)).await;
            ctx.saw_rebuilding("reported-r1");
        }
        assert_eq!(
            fail_interrupted(&ctx, &ctx.store.list::<Replica>().await.unwrap())
                .await
                .unwrap(),
            ["lost-r2", "orphan-r1"]
        );
        for name in ["lost-r2", "orphan-r1"] {
            let r: Replica = store.fetch(name).await.unwrap();
            assert_eq!(r.status.mode, Some(ReplicaMode::Err), "{name}");
            assert!(r.spec.failed_at.is_some(), "{name}");
            assert_eq!(r.spec.rebuild_retry_count, 0, "{name}: not an attempt");
        }
        for name in ["reported-r1", "held-r1"] {
            let r: Replica = store.fetch(name).await.unwrap();
            assert_eq!(r.status.mode, Some(ReplicaMode::Wo), "{name}");
        }
        let r: Replica = store.fetch("empty-r1").await.unwrap();
        assert_eq!(r.status.mode, None, "an empty volume's replica stays");
        let r: Replica = store.fetch("lost-r1").await.unwrap();
        assert_eq!(r.status.mode, Some(ReplicaMode::Rw));
        let events: Vec<ballast::model::Event> = store.list().await.unwrap();
        assert!(
            events
                .iter()
                .any(|e| e.object == "replica/orphan-r1" && e.reason == "RebuildInterrupted"),
            "{events:?}"
        );
    }
}
