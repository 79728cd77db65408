//! The control loop: observe the store, plan, act — on every change to the
//! store and on every resync tick. It plans on the context's copy of the
//! records (`mirror`), which each pass brings up to date by reading only
//! what changed.
//!
//! Actions run in tasks of their own, so that a long offline rebuild does
//! not hold up the rest of the cluster; the volume guard keeps one action
//! per volume at a time, and the next plan sees what is under way (a
//! replica in `wo` mode) so it never issues it twice. A failed action is
//! retried with a growing delay; the failure is recorded as an event.
//! What the plan cannot do is written on each volume's record
//! (`conditions`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::broadcast::error::RecvError;

use super::actions::carry_out;
use super::conditions::{self, Written};
use crate::context::Context;
use crate::error::Error;
use crate::planner::{self, Action, ActionKind};

const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// Changes that come together are planned together, and passes are at
/// least this far apart (every heartbeat is a change: a large cluster must
/// not plan once per heartbeat).
const SETTLE: Duration = Duration::from_millis(200);

/// Failed actions and when each may run again.
#[derive(Default)]
struct Backoff {
    failures: HashMap<String, (u32, Instant)>,
}

impl Backoff {
    fn ready(&self, key: &str, now: Instant) -> bool {
        self.failures.get(key).is_none_or(|(_, at)| *at <= now)
    }

    /// Records a failure; the delay grows with each one, except for a node
    /// that could not be reached: the planner plans on a node only while it
    /// is ready, so the action is retried soon, and at once when it is back.
    fn failed(&mut self, key: &str, now: Instant, unreachable: bool) -> Duration {
        let e = self.failures.entry(key.to_string()).or_insert((0, now));
        e.0 += 1;
        let delay = if unreachable {
            BACKOFF_MIN
        } else {
            BACKOFF_MIN.saturating_mul(1 << e.0.min(8)).min(BACKOFF_MAX)
        };
        e.1 = now + delay;
        delay
    }

    fn succeeded(&mut self, key: &str) {
        self.failures.remove(key);
    }
}

/// What identifies an action across passes, for its backoff.
fn key(a: &Action) -> String {
    match &a.kind {
        ActionKind::CreateReplica {
            volume,
            node,
            disk,
            reuse,
            ..
        } => format!(
            "create/{volume}/{node}/{disk}/{}",
            reuse.as_deref().unwrap_or("")
        ),
        ActionKind::DeleteReplica { replica, .. } => format!("delete/{replica}"),
        other => format!("{other:?}"),
    }
}

/// One pass: plan on the store as it is now (the loop's copy of it,
/// brought up to date) and start what is due.
#[tracing::instrument(skip_all)]
async fn reconcile_once(
    ctx: &Arc<Context>,
    backoff: &Arc<Mutex<Backoff>>,
    written: &mut Written,
) -> Result<usize, Error> {
    let view = {
        let mirror = ctx.records().await?;
        super::interrupted::fail_interrupted(ctx, mirror.replicas()).await?;
        crate::observe::mirrored_view(&mirror)
    };
    crate::settings_check::check_settings(ctx).await?;
    let plan = planner::plan(&view, &ctx.settings().await?, ctx.now());
    // What the plan cannot do, on each volume's record (`Scheduled`): read
    // on the copy of the records, written once the actions are started
    // and the lock on the copy is let go; a failure to write it holds up
    // no action.
    let due = {
        let mirror = ctx.records().await?;
        conditions::due(&plan, mirror.volumes(), written)
    };
    let now = Instant::now();
    let mut started = 0;
    for action in plan.actions {
        let k = key(&action);
        if !backoff.lock().map(|b| b.ready(&k, now)).unwrap_or(true) {
            continue;
        }
        if action.volume().is_some_and(|v| ctx.volume_busy(v)) {
            continue;
        }
        started += 1;
        tracing::info!(rule = ?action.rule, reason = %action.reason, action = ?action.kind, "carrying out");
        let (ctx, backoff) = (ctx.clone(), backoff.clone());
        tokio::spawn(async move {
            let result = carry_out(&ctx, &action).await;
            let failed = {
                let Ok(mut b) = backoff.lock() else {
                    return;
                };
                match result {
                    Ok(()) => {
                        b.succeeded(&k);
                        None
                    }
                    // Another call holds the volume: try on the next pass.
                    Err(Error::Conflict(_)) => None,
                    Err(e) => {
                        let unreachable = matches!(e, Error::Unavailable(_));
                        let delay = b.failed(&k, Instant::now(), unreachable);
                        tracing::warn!(error = %e, retry_in = ?delay, "action failed");
                        Some((e, delay))
                    }
                }
            };
            if let (Some((e, delay)), Some(v)) = (failed, action.volume()) {
                ctx.event(
                    ballast::model::Kind::Volume,
                    v,
                    "ActionFailed",
                    format!("{}: {e}; retrying in {delay:?}", action.reason),
                )
                .await;
            }
        });
    }
    if let Err(e) = conditions::write(ctx, due, written, ctx.now()).await {
        tracing::warn!(error = %e, "could not write a volume's Scheduled condition; the next pass tries again");
    }
    Ok(started)
}

/// Runs the loop until the task is dropped.
pub async fn run_reconcile(ctx: Arc<Context>, resync: Duration) {
    let mut changes = ctx.store.subscribe();
    let backoff = Arc::new(Mutex::new(Backoff::default()));
    let mut written = Written::default();
    let mut tick = tokio::time::interval(resync);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            got = changes.recv() => {
                match got {
                    Err(RecvError::Closed) => return,
                    // Events are reports, not state: nothing to plan on.
                    Ok(c) if c.kind == ballast::model::Kind::Event => continue,
                    _ => {}
                }
                tokio::time::sleep(SETTLE).await;
                while changes.try_recv().is_ok() {}
            }
        }
        if let Err(e) = reconcile_once(&ctx, &backoff, &mut written).await {
            tracing::warn!(error = %e, "reconcile pass failed");
        }
    }
}
