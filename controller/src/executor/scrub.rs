//! The scrub: every replica's frozen layers are read back on its node and
//! checked against their checksums, once per `replica-scrub-interval`, one
//! replica per node at a time, at `replica-scrub-rate`. A replica found
//! corrupt is failed (`actions::fail_corrupt`), so that the planner
//! rebuilds it from a good one. `scrub_now` runs one on request.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ballast::model::{Kind, Node, Replica, ReplicaMode};
use ballast::proto::agent::v1::ScrubReplicaRequest;

use crate::agents::{long_call, paced};
use crate::context::Context;
use crate::error::Error;

/// Runs the periodic scrub until the task is dropped, looking every `tick`.
pub async fn run_scrub(ctx: Arc<Context>, tick: Duration) {
    let busy: Arc<Mutex<HashSet<String>>> = Arc::default();
    loop {
        tokio::time::sleep(tick).await;
        if let Err(e) = start_due(&ctx, &busy).await {
            tracing::warn!(error = %e, "scrub pass failed");
        }
    }
}

/// Starts, on each ready node not scrubbing already, the scrub of its
/// replica scrubbed longest ago, when that is over the interval.
async fn start_due(ctx: &Arc<Context>, busy: &Arc<Mutex<HashSet<String>>>) -> Result<(), Error> {
    let settings = ctx.settings().await?;
    let hours = settings.scrub_interval_hours();
    if hours == 0 {
        return Ok(());
    }
    let due_before = ctx.now() - chrono::Duration::hours(hours as i64);
    // Chosen in the controller's copy of the records, brought up to date
    // first: a pass does not decode the whole store.
    let chosen: Vec<(String, String)> = {
        let mirror = ctx.records().await?;
        let by_node = super::by_node(mirror.replicas());
        mirror
            .nodes()
            .filter(|n| n.status.ready)
            .filter(|n| !busy.lock().map(|b| b.contains(&n.id)).unwrap_or(true))
            .filter_map(|node| {
                by_node
                    .get(node.id.as_str())
                    .into_iter()
                    .flatten()
                    .filter(|r| r.status.mode == Some(ReplicaMode::Rw))
                    .filter(|r| r.status.scrubbed_at.is_none_or(|t| t < due_before))
                    .min_by_key(|r| r.status.scrubbed_at)
                    .map(|r| (node.id.clone(), r.name.clone()))
            })
            .collect()
    };
    for (node, name) in chosen {
        if let Ok(mut b) = busy.lock() {
            b.insert(node.clone());
        }
        let (ctx, busy, rate) = (ctx.clone(), busy.clone(), settings.scrub_rate_bytes());
        tokio::spawn(async move {
            if let Err(e) = scrub(&ctx, &name, rate).await {
                tracing::warn!(replica = %name, error = %e, "scrub failed");
            }
            if let Ok(mut b) = busy.lock() {
                b.remove(&node);
            }
        });
    }
    Ok(())
}

/// Scrubs `name` now (at the setting's rate): Ok(true) when it is sound.
#[tracing::instrument(skip_all, fields(replica = %name))]
pub async fn scrub_now(ctx: &Arc<Context>, name: &str) -> Result<bool, Error> {
    let rate = ctx.settings().await?.scrub_rate_bytes();
    scrub(ctx, name, rate).await
}

async fn scrub(ctx: &Arc<Context>, name: &str, rate: u64) -> Result<bool, Error> {
    let r: Replica = ctx.store.fetch(name).await?;
    let node: Node = ctx.store.fetch(&r.spec.node_id).await?;
    // As long as reading the whole volume at the rate takes: an agent
    // call's 10 s cut every scrub of more than 640 MiB at the default rate.
    let size = ctx
        .store
        .get::<ballast::model::Volume>(&r.spec.volume)
        .await?
        .map_or(0, |v| v.spec.size);
    let request = ScrubReplicaRequest {
        name: name.to_string(),
        bytes_per_second: rate,
    };
    let answer = long_call(&node, &ctx.member, paced(size, rate), |mut c| async move {
        c.scrub_replica(request).await
    })
    .await?;
    let now = ctx.now();
    ctx.store
        .modify::<Replica, Error>(name, |r| {
            r.status.scrubbed_at = Some(now);
            Ok(true)
        })
        .await?;
    if answer.corrupt {
        super::actions::fail_corrupt(ctx, &r.spec.volume, name, &answer.message).await?;
        return Ok(false);
    }
    tracing::info!(bytes = answer.bytes, "replica scrubbed: sound");
    ctx.event(
        Kind::Replica,
        name,
        "ReplicaScrubbed",
        format!(
            "{} checked, sound",
            ballast::quantity::format_size(answer.bytes)
        ),
    )
    .await;
    Ok(true)
}
