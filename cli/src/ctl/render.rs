//! How each kind the API answers with is shown to a person: one table row
//! per object, under one header per kind. The rows are built from the
//! model types, never from JSON by string.

use ballast::api::{ReplicaSummary, SettingView};
use ballast::model::{Condition, Event, Node, RebuildProgress, Replica, Snapshot, Volume};
use ballast::quantity::format_size;
use ballast_controller::planner::Action;

/// A kind shown as a table.
pub trait Row {
    const HEADER: &'static [&'static str];
    fn cells(&self) -> Vec<String>;
}

/// Prints `items` as one table.
pub fn table<T: Row>(items: &[T]) {
    super::table::print(T::HEADER, items.iter().map(Row::cells).collect());
}

/// `-` for what is not there.
fn or_dash(s: impl ToString) -> String {
    let s = s.to_string();
    if s.is_empty() { "-".into() } else { s }
}

fn opt(v: Option<impl ToString>) -> String {
    v.map(|x| or_dash(x)).unwrap_or_else(|| "-".into())
}

impl Row for Volume {
    /// CSI NAME: the CO's name of a volume created through CSI (NAME is
    /// its id).
    const HEADER: &'static [&'static str] = &[
        "NAME",
        "SIZE",
        "REPLICAS",
        "STATE",
        "ROBUSTNESS",
        "NODE",
        "CSI NAME",
    ];
    fn cells(&self) -> Vec<String> {
        vec![
            self.name.clone(),
            format_size(self.spec.size),
            self.spec.number_of_replicas.to_string(),
            self.status.state.to_string(),
            self.status.robustness.to_string(),
            opt(self.status.attached_node.as_ref()),
            opt(self.spec.csi_name.as_ref()),
        ]
    }
}

impl Row for Condition {
    const HEADER: &'static [&'static str] = &["CONDITION", "STATUS", "REASON", "SINCE", "MESSAGE"];
    fn cells(&self) -> Vec<String> {
        vec![
            self.kind.clone(),
            if self.status { "True" } else { "False" }.into(),
            or_dash(&self.reason),
            opt(self
                .last_transition_time
                .map(|t| t.format("%Y-%m-%d %H:%M:%S"))),
            or_dash(&self.message),
        ]
    }
}

impl Row for ReplicaSummary {
    const HEADER: &'static [&'static str] = &["REPLICA", "NODE", "DISK", "MODE", "REBUILD"];
    fn cells(&self) -> Vec<String> {
        vec![
            self.name.clone(),
            self.node_id.clone(),
            self.disk_id.clone(),
            opt(self.mode),
            rebuild_cell(self.rebuild_progress.as_ref()),
        ]
    }
}

impl Row for Replica {
    const HEADER: &'static [&'static str] = &["NAME", "VOLUME", "NODE", "DISK", "MODE"];
    fn cells(&self) -> Vec<String> {
        vec![
            self.name.clone(),
            self.spec.volume.clone(),
            self.spec.node_id.clone(),
            self.spec.disk_id.clone(),
            opt(self.status.mode),
        ]
    }
}

impl Row for Snapshot {
    const HEADER: &'static [&'static str] = &["NAME", "VOLUME", "SIZE", "READY", "CREATED"];
    fn cells(&self) -> Vec<String> {
        vec![
            self.name.clone(),
            self.spec.volume.clone(),
            format_size(self.status.size),
            self.status.ready_to_use.to_string(),
            opt(self
                .status
                .created_at
                .map(|t| t.format("%Y-%m-%d %H:%M:%S"))),
        ]
    }
}

impl Row for Node {
    const HEADER: &'static [&'static str] =
        &["ID", "STATUS", "ZONE", "SCHEDULABLE", "CORDONED", "DISKS"];
    fn cells(&self) -> Vec<String> {
        let disks: Vec<String> = self
            .status
            .disks
            .iter()
            .map(|(id, d)| {
                format!(
                    "{id}: {} free of {}",
                    format_size(d.storage_available),
                    format_size(d.storage_maximum)
                )
            })
            .collect();
        vec![
            self.id.clone(),
            ready(self.status.ready).into(),
            or_dash(&self.spec.zone),
            self.spec.allow_scheduling.to_string(),
            self.status.cordoned.to_string(),
            or_dash(disks.join(", ")),
        ]
    }
}

fn ready(yes: bool) -> &'static str {
    if yes { "Ready" } else { "NotReady" }
}

/// A node's disks, one row each: what the operator set and what the node
/// reports.
pub fn node_disks(n: &Node) {
    let rows = n
        .spec
        .disks
        .iter()
        .map(|(id, spec)| {
            let st = n.status.disks.get(id).cloned().unwrap_or_default();
            vec![
                id.clone(),
                spec.path.clone(),
                if st.ready {
                    "Ready".into()
                } else {
                    format!("NotReady {}", or_dash(&st.message))
                },
                format_size(st.storage_maximum),
                format_size(st.storage_available),
                format_size(spec.storage_reserved),
                spec.allow_scheduling.to_string(),
                spec.eviction_requested.to_string(),
                or_dash(spec.tags.join(",")),
            ]
        })
        .collect();
    super::table::print(
        &[
            "DISK",
            "PATH",
            "STATUS",
            "MAXIMUM",
            "AVAILABLE",
            "RESERVED",
            "SCHEDULABLE",
            "EVICTING",
            "TAGS",
        ],
        rows,
    );
}

impl Row for SettingView {
    const HEADER: &'static [&'static str] = &["NAME", "VALUE", "DEFAULT"];
    fn cells(&self) -> Vec<String> {
        vec![
            self.name.clone(),
            or_dash(&self.value),
            or_dash(&self.default),
        ]
    }
}

impl Row for Event {
    const HEADER: &'static [&'static str] = &["TIME", "OBJECT", "REASON", "MESSAGE"];
    fn cells(&self) -> Vec<String> {
        vec![
            self.time.to_rfc3339(),
            self.object.clone(),
            self.reason.clone(),
            self.message.clone(),
        ]
    }
}

impl Row for Action {
    const HEADER: &'static [&'static str] = &["RULE", "ACTION", "WHY"];
    fn cells(&self) -> Vec<String> {
        vec![
            self.rule.name().to_string(),
            self.kind.describe(),
            self.reason.clone(),
        ]
    }
}

/// `42% (1.2Gi of 2.9Gi)` while a replica is being rebuilt; empty otherwise.
pub fn rebuild_cell(p: Option<&RebuildProgress>) -> String {
    match p {
        Some(p) if p.total > 0 => format!(
            "{}% ({} of {})",
            p.percent(),
            format_size(p.done),
            format_size(p.total)
        ),
        _ => String::new(),
    }
}
