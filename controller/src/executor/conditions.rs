//! The conditions a volume's record carries (`status.conditions`), from the
//! plan of each pass of the control loop. One so far, `Scheduled`: false
//! while a rule of the planner wants to place or move one of the volume's
//! replicas and cannot (the plan's `blocked`: no disk fits, no source to
//! rebuild from, no rebuild slot, a strict-local volume away from its
//! data), with the rule as its reason and the planner's words as its
//! message; false too while a rule waits on purpose before it places one
//! (the plan's `waits`: a failed replica whose node may come back for
//! reuse), with `<Rule>Waiting` as its reason and until when as its
//! message; true again once nothing is blocked or waited for. A volume
//! that was never either carries none (absent: scheduled), so that a
//! large cluster writes no record for it.
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

/// The reason of a `Scheduled` condition that is false: the rule's name
/// as the plan writes it (`zone-balance`) in the condition's form, and
/// whether it is blocked or waits (`ZoneBalanceBlocked`,
/// `ReplenishWaiting`).
fn reason_of(rule: Rule, waits: bool) -> String {
    let mut reason: String = rule
        .name()
        .split('-')
        .flat_map(|word| {
            let mut c = word.chars();
            c.next()
                .map(|first| first.to_ascii_uppercase())
                .into_iter()
                .chain(c)
        })
        .collect();
    reason.push_str(if waits { "Waiting" } else { "Blocked" });
    reason
}

/// The `Scheduled` condition that `plan` makes false, by volume: the
/// reason of the first rule it blocks for the volume (or, blocking none,
/// the first that waits), and every reason in the message, blocked ones
/// first, in the plan's order. A volume it does not name is scheduled.
pub fn unscheduled(plan: &Plan) -> HashMap<&str, (String, String)> {
    let blocked = plan
        .blocked
        .iter()
        .filter_map(|b| Some((b.volume()?, reason_of(b.rule, false), b.reason.clone())));
    let waits = plan.waits.iter().map(|w| {
        let message = format!(
            "waiting until {}: {}",
            w.until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            w.what
        );
        (w.volume.as_str(), reason_of(w.rule, true), message)
    });
    let mut out: HashMap<&str, (String, String)> = HashMap::new();
    for (volume, reason, message) in blocked.chain(waits) {
        out.entry(volume)
            .and_modify(|(_, m)| {
                m.push_str("; ");
                m.push_str(&message);
            })
            .or_insert((reason, message));
    }
    out
}

/// When each volume's `Scheduled` condition was last written, for the
/// once-a-minute limit on a message alone.
#[derive(Default)]
pub struct Written(HashMap<String, Instant>);

/// A condition to write: the volume, and its `Scheduled` status, reason
/// and message.
pub struct Due(String, bool, String, String);

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
            Some((reason, message)) => (false, reason.clone(), message.clone()),
            None => (true, "Scheduled".to_string(), String::new()),
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
                reason: reason.clone(),
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
    fn a_volume_is_scheduled_unless_the_plan_blocks_or_waits_for_a_rule_of_it_and_then_says_each_reason()
     {
        let mut plan = Plan::default();
        plan.block("node/n1", Rule::DiskPressure, "n1 is pressured");
        plan.block("volume/v2", Rule::Replenish, "v2: no place for a replica");
        plan.block("volume/v1", Rule::Locality, "v1 is strict-local");
        plan.block(
            "volume/v1",
            Rule::Replenish,
            "n2: 5 rebuilds already running",
        );
        let until = "2026-12-06T13:47:16.386Z".parse().unwrap();
        for volume in ["v2", "v3"] {
            plan.waits.push(crate::planner::Wait {
                volume: volume.into(),
                rule: Rule::Replenish,
                what: format!("failed replica {volume}-r1 may come back for reuse"),
                until,
            });
        }
        let got = unscheduled(&plan);
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(reason_of(Rule::ZoneBalance, false), "ZoneBalanceBlocked");
        assert_eq!(reason_of(Rule::DiskPressure, true), "DiskPressureWaiting");
        let of = |r: &str, m: &str| (r.to_string(), m.to_string());
        assert_eq!(
            got["v1"],
            of(
                "LocalityBlocked",
                "v1 is strict-local; n2: 5 rebuilds already running"
            )
        );
        assert_eq!(
            got["v2"],
            of(
                "ReplenishBlocked",
                "v2: no place for a replica; waiting until 2026-12-06T13:47:16Z: failed replica v2-r1 may come back for reuse"
            )
        );
        assert_eq!(
            got["v3"],
            of(
                "ReplenishWaiting",
                "waiting until 2026-12-06T13:47:16Z: failed replica v3-r1 may come back for reuse"
            )
        );
    }
}
