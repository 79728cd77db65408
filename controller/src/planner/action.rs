//! The planner's output: actions to take, things waited for, and why
//! something cannot be done. Every action names its rule and says why in
//! a sentence a person can read.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The rule of BEHAVIOR.md an action comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    Schedule,
    Replenish,
    Reuse,
    ZoneBalance,
    NodeBalance,
    DiskPressure,
    Locality,
    Eviction,
    Drain,
    Cleanup,
}

impl Rule {
    /// Its name as the plan's JSON writes it (`zone-balance`).
    pub fn name(self) -> &'static str {
        match self {
            Rule::Schedule => "schedule",
            Rule::Replenish => "replenish",
            Rule::Reuse => "reuse",
            Rule::ZoneBalance => "zone-balance",
            Rule::NodeBalance => "node-balance",
            Rule::DiskPressure => "disk-pressure",
            Rule::Locality => "locality",
            Rule::Eviction => "eviction",
            Rule::Drain => "drain",
            Rule::Cleanup => "cleanup",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum ActionKind {
    /// Build a replica of `volume` on `node`/`disk`. `reuse` names a failed
    /// replica rebuilt in place (clear its failure, count a retry);
    /// `copy_from` names a replica on the same node to copy locally from.
    CreateReplica {
        volume: String,
        node: String,
        disk: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        reuse: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        copy_from: Option<String>,
        /// Bytes reserved on the disk for it.
        size: u64,
    },
    DeleteReplica {
        volume: String,
        replica: String,
    },
    SetReplicaEviction {
        replica: String,
        requested: bool,
    },
    SetNodeStatus {
        node: String,
        auto_evicting: bool,
        drain_blocked: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        drain_blocked_reason: Option<String>,
    },
    /// `object` is `KIND/NAME`.
    RecordEvent {
        object: String,
        reason: String,
        message: String,
    },
}

impl ActionKind {
    /// The action in a few words (ballastctl's plan and the web view).
    pub fn describe(&self) -> String {
        match self {
            ActionKind::CreateReplica {
                volume,
                node,
                disk,
                reuse,
                copy_from,
                ..
            } => {
                let how = match (reuse, copy_from) {
                    (Some(r), _) => format!(" (reuse {r})"),
                    (None, Some(c)) => format!(" (local copy from {c})"),
                    (None, None) => String::new(),
                };
                format!("create replica of {volume} on {node}/{disk}{how}")
            }
            ActionKind::DeleteReplica { replica, .. } => format!("delete replica {replica}"),
            ActionKind::SetReplicaEviction { replica, requested } => {
                format!("set eviction of {replica} to {requested}")
            }
            ActionKind::SetNodeStatus {
                node,
                auto_evicting,
                drain_blocked,
                ..
            } => format!("node {node}: autoEvicting={auto_evicting} drainBlocked={drain_blocked}"),
            ActionKind::RecordEvent { object, reason, .. } => format!("event {reason} on {object}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Action {
    #[serde(flatten)]
    pub kind: ActionKind,
    pub rule: Rule,
    pub reason: String,
}

impl Action {
    /// The volume an action works on (and whose guard it takes), if any.
    pub fn volume(&self) -> Option<&str> {
        match &self.kind {
            ActionKind::CreateReplica { volume, .. } | ActionKind::DeleteReplica { volume, .. } => {
                Some(volume)
            }
            _ => None,
        }
    }
}

/// Something the planner deliberately waits for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Wait {
    pub volume: String,
    pub rule: Rule,
    pub what: String,
    pub until: DateTime<Utc>,
}

/// Something wanted that cannot be done now, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Blocked {
    /// `KIND/NAME`.
    pub object: String,
    pub rule: Rule,
    pub reason: String,
}

impl Blocked {
    /// The volume it holds up, when it is a volume's (`volume/NAME`).
    pub fn volume(&self) -> Option<&str> {
        self.object.strip_prefix("volume/")
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub actions: Vec<Action>,
    pub waits: Vec<Wait>,
    pub blocked: Vec<Blocked>,
}

impl Plan {
    /// How many actions, waits and blocked items it holds.
    pub fn len(&self) -> usize {
        self.actions.len() + self.waits.len() + self.blocked.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn act(&mut self, rule: Rule, kind: ActionKind, reason: impl Into<String>) {
        self.actions.push(Action {
            kind,
            rule,
            reason: reason.into(),
        });
    }

    pub fn block(&mut self, object: impl Into<String>, rule: Rule, reason: impl Into<String>) {
        self.blocked.push(Blocked {
            object: object.into(),
            rule,
            reason: reason.into(),
        });
    }

    pub fn event(
        &mut self,
        rule: Rule,
        object: impl Into<String>,
        reason: &str,
        message: impl Into<String>,
    ) {
        let message = message.into();
        self.act(
            rule,
            ActionKind::RecordEvent {
                object: object.into(),
                reason: reason.to_string(),
                message: message.clone(),
            },
            message,
        );
    }

    /// Actions that change placement or state (not only events or status).
    pub fn changes(&self) -> impl Iterator<Item = &Action> {
        self.actions.iter().filter(|a| {
            matches!(
                a.kind,
                ActionKind::CreateReplica { .. }
                    | ActionKind::DeleteReplica { .. }
                    | ActionKind::SetReplicaEviction { .. }
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Rule;

    #[test]
    fn a_rules_name_is_the_one_its_json_carries() {
        for rule in [
            Rule::Schedule,
            Rule::Replenish,
            Rule::Reuse,
            Rule::ZoneBalance,
            Rule::NodeBalance,
            Rule::DiskPressure,
            Rule::Locality,
            Rule::Eviction,
            Rule::Drain,
            Rule::Cleanup,
        ] {
            assert_eq!(serde_json::to_value(rule).unwrap(), rule.name());
        }
    }
}
