//! The conditions a volume's record carries (`status.conditions`), from the
//! plan of each pass of the control loop. One so far, `Scheduled`: false
//! while a rule of the planner wants to place or move one of the volume's
//! replicas and cannot (the plan's `blocked`: no disk fits, no source to
//! rebuild from, no rebuild slot, a strict-local volume away from its
//! data), with the rule as its reason and the planner's words as its
//! message; true again once nothing is blocked. A volume that was never
//! blocked carries none (absent: nothing blocked), so that a large cluster
//! writes no record for it.
//!
//! It reads the plan and writes the volumes' status, only where a
//! condition changed; it decides nothing. A message alone that changed is
//! written at most once a minute: its figures (a disk's free space) move
//! with every heartbeat.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ballast::model::{Condition, Volume};
use chrono::{DateTime, Utc};

use crate::context::Context;
use crate::error::Error;
use crate::planner::{Plan, Rule};

/// The condition's type.
pub const SCHEDULED: &str = "Scheduled";

/// How often a blocked volume's message alone is written again.
const MESSAGE_EVERY: Duration = Duration::from_secs(60);

/// The reason of a `Scheduled` condition that is false: the rule that is
/// blocked.
fn reason_of(rule: Rule) -> &'static str {
    match rule {
        Rule::Schedule => "ScheduleBlocked",
        Rule::Replenish => "ReplenishBlocked",
        Rule::Reuse => "ReuseBlocked",
        Rule::ZoneBalance => "ZoneBalanceBlocked",
        Rule::NodeBalance => "NodeBalanceBlocked",
        Rule::DiskPressure => "DiskPressureBlocked",
        Rule::Locality => "LocalityBlocked",
        Rule::Eviction => "EvictionBlocked",
        Rule::Drain => "DrainBlocked",
        Rule::Cleanup => "CleanupBlocked",
    }
}

/// The `Scheduled` condition that `plan` makes false, by volume: the
/// reason of the first rule it blocks for the volume, and every reason in
/// the message, in the plan's order. A volume it does not name is
/// scheduled.
pub fn unscheduled(plan: &Plan) -> HashMap<&str, (&'static str, String)> {
    let mut out: HashMap<&str, (&'static str, String)> = HashMap::new();
    for b in &plan.blocked {
        let Some(volume) = b.volume() else {
            continue;
        };
        out.entry(volume)
            .and_modify(|(_, m)| {
                m.push_str("; ");
                m.push_str(&b.reason);
            })
            .or_insert((reason_of(b.rule), b.reason.clone()));
    }
    out
}

/// When each volume's `Scheduled` condition was last written, for the
/// once-a-minute limit on a message alone.
#[derive(Default)]
pub struct Written(HashMap<String, Instant>);

/// A condition to write: the volume, and its `Scheduled` status, reason
/// and message.
pub struct Due(String, bool, &'static str, String);

/// The volumes of `volumes` whose `Scheduled` condition `plan` changes
/// (a message alone not within a minute of its last write). Reads only:
/// run it on the controller's copy of the records, and `write` after.
pub fn due<'a>(
    plan: &Plan,
    volumes: impl IntoIterator<Item = &'a Volume>,
    written: &mut Written,
) -> Vec<Due> {
    let mono = Instant::now();
    let blocked = unscheduled(plan);
    let mut due = Vec::new();
    for v in volumes {
        let (status, reason, message) = match blocked.get(v.name.as_str()) {
            Some((reason, message)) => (false, *reason, message.clone()),
            None => (true, "Scheduled", String::new()),
        };
        let had = v.status.conditions.iter().find(|c| c.kind == SCHEDULED);
        let write = match had {
            None => !status,
            Some(c) if c.status != status || c.reason != reason => true,
            Some(c) => {
                c.message != message
                    && written
                        .0
                        .get(&v.name)
                        .is_none_or(|at| mono.duration_since(*at) >= MESSAGE_EVERY)
            }
        };
        if write {
            due.push(Due(v.name.clone(), status, reason, message));
        }
    }
    written
        .0
        .retain(|name, _| blocked.contains_key(name.as_str()));
    due
}

/// Writes each condition of `due`. A volume whose record changed since it
/// was read is written against its new version (`modify`), with the
/// condition decided from that plan: the next pass mends it if that was
/// stale. Returns the first failure, after trying every volume.
pub async fn write(
    ctx: &Context,
    due: Vec<Due>,
    written: &mut Written,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    let mut failed = None;
    for Due(name, status, reason, message) in due {
        let set = |v: &mut Volume| {
            let had = v.status.conditions.iter().position(|c| c.kind == SCHEDULED);
            let since = match had.map(|i| &v.status.conditions[i]) {
                Some(c) if c.status == status => c.last_transition_time,
                _ => Some(now),
            };
            let c = Condition {
                kind: SCHEDULED.to_string(),
                status,
                reason: reason.to_string(),
                message: message.clone(),
                last_transition_time: since,
            };
            match had {
                Some(i) if v.status.conditions[i] == c => return Ok(false),
                Some(i) => v.status.conditions[i] = c,
                None => v.status.conditions.push(c),
            }
            Ok::<_, Error>(true)
        };
        match ctx.store.modify::<Volume, Error>(&name, set).await {
            Ok(_) => {
                written.0.insert(name, Instant::now());
            }
            // Deleted meanwhile: nothing to say about it.
            Err(Error::NotFound { .. }) => {}
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    failed.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volume_is_scheduled_unless_the_plan_blocks_a_rule_for_it_and_then_says_each_reason() {
        let mut plan = Plan::default();
        plan.block("node/n1", Rule::DiskPressure, "n1 is pressured");
        plan.block("volume/v2", Rule::Replenish, "v2: no place for a replica");
        plan.block("volume/v1", Rule::Locality, "v1 is strict-local");
        plan.block(
            "volume/v1",
            Rule::Replenish,
            "n2: 5 rebuilds already running",
        );
        let got = unscheduled(&plan);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(
            got["v1"],
            (
                "LocalityBlocked",
                "v1 is strict-local; n2: 5 rebuilds already running".to_string()
            )
        );
        assert_eq!(
            got["v2"],
            ("ReplenishBlocked", "v2: no place for a replica".to_string())
        );
    }
}
