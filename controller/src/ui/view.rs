//! What the page shows, built from the controller's copy of the records
//! (`mirror`; the events from the store) and the planner: the same records
//! the REST API serves and the same numbers the planner decides on
//! (`observe::view_of`, `Pass::scheduled`, `disk_pressure`). Nothing
//! here is computed twice or kept between requests.

use askama::Template;
use ballast::model::{Event, Replica, Volume};
use ballast::quantity::format_size;
use ballast::settings::DEFINITIONS;

use crate::context::Context;
use crate::error::Error;
use crate::planner::{self, disk_pressure, pass::Pass};

/// The newest events the page lists.
const EVENTS_SHOWN: usize = 30;

/// The whole page: the frame and its live part.
#[derive(Template)]
#[template(path = "ui/page.html")]
pub struct Page {
    /// [`Live`], rendered.
    pub live: String,
}

/// The part of the page that is fetched again on every change.
#[derive(Template)]
#[template(path = "ui/live.html")]
pub struct Live {
    pub time: String,
    pub nodes: Vec<NodeRow>,
    pub volumes: Vec<VolumeRow>,
    pub actions: Vec<PlanRow>,
    pub waits: Vec<PlanRow>,
    pub blocked: Vec<PlanRow>,
    pub events: Vec<EventRow>,
    pub settings: Vec<SettingRow>,
}

pub struct NodeRow {
    pub id: String,
    pub zone: String,
    pub ready: bool,
    pub cordoned: bool,
    pub scheduling: bool,
    pub eviction_requested: bool,
    /// Why a drain of the node waits, when it does.
    pub drain_blocked: Option<String>,
    pub disks: Vec<DiskRow>,
}

pub struct DiskRow {
    pub id: String,
    pub ready: bool,
    pub pressured: bool,
    /// Widths of the bar's parts, in percent of the disk's maximum.
    pub used_pct: u64,
    pub reserved_pct: u64,
    pub scheduled_pct: u64,
    pub used: String,
    pub reserved: String,
    pub scheduled: String,
    pub maximum: String,
}

pub struct VolumeRow {
    pub name: String,
    pub size: String,
    pub state: String,
    pub robustness: String,
    pub attached: String,
    pub number_of_replicas: u32,
    pub replicas: Vec<ReplicaRow>,
}

pub struct ReplicaRow {
    pub name: String,
    pub node: String,
    pub disk: String,
    pub mode: String,
    /// Rebuild progress, 0–100, while it is rebuilt.
    pub progress: Option<u64>,
}

pub struct PlanRow {
    pub rule: String,
    pub what: String,
    pub why: String,
}

pub struct EventRow {
    pub time: String,
    pub object: String,
    pub reason: String,
    pub message: String,
}

pub struct SettingRow {
    pub name: String,
    pub value: String,
}

/// Percent of `part` in `whole`, 0 for an unmeasured whole.
fn pct(part: u64, whole: u64) -> u64 {
    if whole == 0 {
        return 0;
    }
    (part.saturating_mul(100) / whole).min(100)
}

/// A row per volume, with its replicas (grouped once: each volume's
/// replicas are not sought among all of them).
fn volume_rows<'a>(
    volumes: impl Iterator<Item = &'a Volume>,
    replicas: impl Iterator<Item = &'a Replica>,
) -> Vec<VolumeRow> {
    let mut by_volume: std::collections::HashMap<&str, Vec<&Replica>> = Default::default();
    for r in replicas {
        by_volume.entry(r.spec.volume.as_str()).or_default().push(r);
    }
    volumes
        .map(|v| VolumeRow {
            name: v.name.clone(),
            size: format_size(v.spec.size),
            state: v.status.state.to_string(),
            robustness: v.status.robustness.to_string(),
            attached: v.status.attached_node.clone().unwrap_or_default(),
            number_of_replicas: v.spec.number_of_replicas,
            replicas: by_volume
                .get(v.name.as_str())
                .into_iter()
                .flatten()
                .map(|r| ReplicaRow {
                    name: r.name.clone(),
                    node: r.spec.node_id.clone(),
                    disk: r.spec.disk_id.clone(),
                    mode: r
                        .status
                        .mode
                        .map(|m| m.to_string())
                        .unwrap_or_else(|| "none".into()),
                    progress: r.status.rebuild_progress.as_ref().map(|p| p.percent()),
                })
                .collect(),
        })
        .collect()
}

/// The live part, as the controller's copy of the records has it now.
pub async fn live(ctx: &Context) -> Result<Live, Error> {
    let mut events: Vec<Event> = ctx.store.list().await?;
    let settings = ctx.settings().await?;
    let now = ctx.now();
    // From the controller's copy of the records, brought up to date first
    // (on Kubernetes it can be a watch event behind): a look at the page
    // does not decode the whole store.
    let (view, volumes) = {
        let mirror = ctx.records().await?;
        (
            crate::observe::mirrored_view(&mirror),
            volume_rows(mirror.volumes(), mirror.replicas()),
        )
    };
    let plan = planner::plan(&view, &settings, now);
    let pass = Pass::new(&view, &settings, now);
    let pressure = u64::from(settings.disk_pressure_percentage());

    let nodes = view
        .nodes
        .iter()
        .map(|n| NodeRow {
            id: n.id.clone(),
            zone: n.zone.clone(),
            ready: n.ready,
            cordoned: n.cordoned,
            scheduling: n.allow_scheduling,
            eviction_requested: n.eviction_requested,
            drain_blocked: n
                .drain_blocked
                .then(|| n.drain_blocked_reason.clone().unwrap_or_default()),
            disks: n
                .disks
                .iter()
                .map(|d| {
                    let used = d.maximum.saturating_sub(d.available);
                    let scheduled = pass.scheduled(&n.id, &d.id);
                    DiskRow {
                        id: d.id.clone(),
                        ready: d.ready,
                        pressured: pressure > 0 && disk_pressure::is_pressured(d, pressure),
                        used_pct: pct(used, d.maximum),
                        reserved_pct: pct(d.reserved, d.maximum),
                        scheduled_pct: pct(scheduled, d.maximum),
                        used: format_size(used),
                        reserved: format_size(d.reserved),
                        scheduled: format_size(scheduled),
                        maximum: format_size(d.maximum),
                    }
                })
                .collect(),
        })
        .collect();

    let actions = plan
        .actions
        .iter()
        .map(|a| PlanRow {
            rule: a.rule.name().into(),
            what: a.kind.describe(),
            why: a.reason.clone(),
        })
        .collect();
    let waits = plan
        .waits
        .iter()
        .map(|w| PlanRow {
            rule: w.rule.name().into(),
            what: format!("{}: {}", w.volume, w.what),
            why: format!("until {}", w.until.format("%H:%M:%S")),
        })
        .collect();
    let blocked = plan
        .blocked
        .iter()
        .map(|b| PlanRow {
            rule: b.rule.name().into(),
            what: b.object.clone(),
            why: b.reason.clone(),
        })
        .collect();

    events.sort_by_key(|e| std::cmp::Reverse(e.time));
    let events = events
        .into_iter()
        .take(EVENTS_SHOWN)
        .map(|e| EventRow {
            time: e.time.format("%H:%M:%S").to_string(),
            object: e.object,
            reason: e.reason,
            message: e.message,
        })
        .collect();
    let settings = DEFINITIONS
        .iter()
        .map(|d| SettingRow {
            name: d.name.to_string(),
            value: settings.get(d.name).unwrap_or(d.default).to_string(),
        })
        .collect();
    Ok(Live {
        time: now.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        nodes,
        volumes,
        actions,
        waits,
        blocked,
        events,
        settings,
    })
}

#[cfg(test)]
mod tests {
    use ballast::model::{ReplicaMode, VolumeSpec};

    use super::*;
    use crate::executor::effects;

    /// Each volume's row lists its own replicas, in the order given, however
    /// the replicas of different volumes are interleaved; a volume with none
    /// lists none.
    #[test]
    fn each_volume_row_lists_its_own_replicas() {
        let volume = |name: &str| Volume {
            name: name.into(),
            resource_version: 0,
            spec: VolumeSpec::new(1 << 30, 2),
            status: Default::default(),
        };
        let volumes = [volume("a"), volume("b"), volume("c")];
        let replicas: Vec<Replica> = [("a-r1", "a"), ("c-r1", "c"), ("a-r2", "a"), ("x-r1", "x")]
            .into_iter()
            .map(|(r, v)| effects::new_replica(r, v, "n1", "d1", Some(ReplicaMode::Rw)))
            .collect();
        let rows = volume_rows(volumes.iter(), replicas.iter());
        let names: Vec<(String, Vec<String>)> = rows
            .into_iter()
            .map(|v| (v.name, v.replicas.into_iter().map(|r| r.name).collect()))
            .collect();
        assert_eq!(
            names,
            [
                (
                    "a".to_string(),
                    vec!["a-r1".to_string(), "a-r2".to_string()]
                ),
                ("b".to_string(), vec![]),
                ("c".to_string(), vec!["c-r1".to_string()]),
            ]
        );
    }
}
