//! The model cluster the simulator runs: nodes, disks, volumes, replicas,
//! a clock; the view the planner sees of it; and the effect of each action.

use std::collections::{BTreeMap, BTreeSet};

use ballast::model::{
    DiskSpec, DiskStatus, Node, NodeStatus, Replica, ReplicaMode, Volume, VolumeStatus,
};
use ballast::settings::{self, Settings};
use chrono::{DateTime, Duration, TimeZone, Utc};

use super::scenario::{DiskPatch, NodePatch, NodeSpec, Scenario, Step, VolumePatch, VolumeSpec};
use crate::executor::effects;
use crate::planner::{self, ActionKind, ClusterView, Plan};

pub struct SimNode {
    pub spec: NodeSpec,
    /// What the controller records of it (SetNodeStatus).
    pub status: NodeStatus,
    pub rebuilds_fail: bool,
}

pub struct SimVolume {
    pub spec: VolumeSpec,
    pub last_degraded_at: Option<DateTime<Utc>>,
    degraded: bool,
}

/// A replica of the model: its record, as the controller's store would
/// hold it, and how long its rebuild still takes.
#[derive(Clone, Debug, PartialEq)]
pub struct SimReplica {
    pub record: Replica,
    pub ticks_left: u32,
}

impl SimReplica {
    pub fn name(&self) -> &str {
        &self.record.name
    }
    pub fn volume(&self) -> &str {
        &self.record.spec.volume
    }
    pub fn node(&self) -> &str {
        &self.record.spec.node_id
    }
    pub fn disk(&self) -> &str {
        &self.record.spec.disk_id
    }
    pub fn mode(&self) -> Option<ReplicaMode> {
        self.record.status.mode
    }
    pub fn eviction_requested(&self) -> bool {
        self.record.spec.eviction_requested
    }
    pub fn is_rw(&self) -> bool {
        self.mode() == Some(ReplicaMode::Rw)
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub created: u32,
    pub deleted: u32,
    pub reused: u32,
}

pub struct Sim {
    pub settings: BTreeMap<String, String>,
    pub rebuild_ticks: u32,
    pub now: DateTime<Utc>,
    pub nodes: Vec<SimNode>,
    pub volumes: Vec<SimVolume>,
    pub replicas: BTreeMap<String, SimReplica>,
    pub events: Vec<(String, String, String)>,
    /// Every action applied, with the time it was applied.
    pub history: Vec<(DateTime<Utc>, planner::Action)>,
    pub counters: Counters,
    next_id: u64,
}

fn check_setting(name: &str, value: &str) -> Result<String, String> {
    settings::validate(name, value).map_err(|e| format!("settings: {e}"))
}

impl Sim {
    pub fn new(scenario: &Scenario) -> Result<Self, String> {
        let mut s = Sim {
            settings: BTreeMap::new(),
            rebuild_ticks: scenario.rebuild_ticks.max(1),
            now: Utc
                .timestamp_opt(1_700_000_000, 0)
                .single()
                .unwrap_or_default(),
            nodes: Vec::new(),
            volumes: Vec::new(),
            replicas: BTreeMap::new(),
            events: Vec::new(),
            history: Vec::new(),
            counters: Counters::default(),
            next_id: 0,
        };
        for (name, value) in &scenario.settings {
            let v = check_setting(name, &value.to_string())?;
            s.settings.insert(name.clone(), v);
        }
        for n in &scenario.nodes {
            s.add_node(n.clone())?;
        }
        for v in &scenario.volumes {
            s.add_volume(v.clone())?;
        }
        Ok(s)
    }

    fn add_node(&mut self, spec: NodeSpec) -> Result<(), String> {
        if self.nodes.iter().any(|n| n.spec.id == spec.id) {
            return Err(format!("nodes: duplicate node id {:?}", spec.id));
        }
        if spec.disks.is_empty() {
            return Err(format!("nodes: node {:?} has no disks", spec.id));
        }
        self.nodes.push(SimNode {
            spec,
            status: NodeStatus::default(),
            rebuilds_fail: false,
        });
        self.nodes.sort_by(|a, b| a.spec.id.cmp(&b.spec.id));
        Ok(())
    }

    fn add_volume(&mut self, spec: VolumeSpec) -> Result<(), String> {
        if self.volumes.iter().any(|v| v.spec.name == spec.name) {
            return Err(format!("volumes: duplicate volume {:?}", spec.name));
        }
        if !(1..=20).contains(&spec.number_of_replicas) {
            return Err(format!(
                "volumes: {}: numberOfReplicas must be 1 to 20",
                spec.name
            ));
        }
        if let Some(n) = &spec.attached_node
            && self.node(n).is_none()
        {
            return Err(format!(
                "volumes: {}: attachedNode {n:?} is not a node",
                spec.name
            ));
        }
        self.volumes.push(SimVolume {
            spec,
            last_degraded_at: None,
            degraded: false,
        });
        self.volumes.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        Ok(())
    }

    fn node(&self, id: &str) -> Option<&SimNode> {
        self.nodes.iter().find(|n| n.spec.id == id)
    }

    fn node_mut(&mut self, id: &str) -> Result<&mut SimNode, String> {
        self.nodes
            .iter_mut()
            .find(|n| n.spec.id == id)
            .ok_or_else(|| format!("no node {id:?}"))
    }

    pub fn zone_of(&self, node: &str) -> String {
        self.node(node)
            .map(|n| n.spec.zone.clone())
            .unwrap_or_default()
    }

    pub fn settings(&self) -> Settings {
        Settings::from_overrides(self.settings.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    fn volume_size(&self, name: &str) -> (u64, u64) {
        self.volumes
            .iter()
            .find(|v| v.spec.name == name)
            .map(|v| (v.spec.size, v.spec.actual_size.unwrap_or(v.spec.size)))
            .unwrap_or((0, 0))
    }

    /// The model as the controller's records: each node as its heartbeat
    /// would report it (a disk's available space is its size less the
    /// other data on it and the replicas it holds), each volume and replica
    /// as the store would hold them.
    pub fn records(&self) -> (Vec<Node>, Vec<Volume>, Vec<Replica>) {
        let mut on_disk: BTreeMap<(&str, &str), u64> = BTreeMap::new();
        for r in self.replicas.values() {
            *on_disk.entry((r.node(), r.disk())).or_default() += self.volume_size(r.volume()).1;
        }
        let nodes = self
            .nodes
            .iter()
            .map(|n| {
                let id = n.spec.id.as_str();
                let all: Vec<(String, DiskSpec, DiskStatus)> = n
                    .spec
                    .disks
                    .iter()
                    .map(|d| {
                        let used = d.used + on_disk.get(&(id, d.id.as_str())).copied().unwrap_or(0);
                        (
                            d.id.clone(),
                            DiskSpec {
                                path: format!("/model/{id}/{}", d.id),
                                tags: d.tags.clone(),
                                allow_scheduling: d.allow_scheduling,
                                eviction_requested: d.eviction_requested,
                                storage_reserved: d.reserved,
                            },
                            DiskStatus {
                                ready: n.spec.ready,
                                storage_maximum: d.size,
                                storage_available: d.size.saturating_sub(used),
                                ..Default::default()
                            },
                        )
                    })
                    .collect();
                Node {
                    id: id.to_string(),
                    resource_version: 0,
                    spec: ballast::model::NodeSpec {
                        zone: n.spec.zone.clone(),
                        tags: n.spec.tags.clone(),
                        allow_scheduling: n.spec.allow_scheduling,
                        eviction_requested: n.spec.eviction_requested,
                        disks: all.iter().map(|(k, s, _)| (k.clone(), s.clone())).collect(),
                    },
                    status: NodeStatus {
                        ready: n.spec.ready,
                        cordoned: n.spec.cordoned,
                        auto_evicting: n.status.auto_evicting,
                        drain_blocked: n.status.drain_blocked,
                        drain_blocked_reason: n.status.drain_blocked_reason.clone(),
                        disks: all.into_iter().map(|(k, _, st)| (k, st)).collect(),
                        ..Default::default()
                    },
                }
            })
            .collect();
        let volumes = self
            .volumes
            .iter()
            .map(|v| {
                let mut spec =
                    ballast::model::VolumeSpec::new(v.spec.size, v.spec.number_of_replicas);
                spec.data_locality = v.spec.data_locality;
                spec.replica_auto_balance = v.spec.replica_auto_balance;
                spec.stale_replica_timeout = v.spec.stale_replica_timeout;
                spec.disk_selector = v.spec.disk_selector.clone();
                spec.node_selector = v.spec.node_selector.clone();
                Volume {
                    name: v.spec.name.clone(),
                    resource_version: 0,
                    spec,
                    status: VolumeStatus {
                        attached_node: v.spec.attached_node.clone(),
                        last_degraded_at: v.last_degraded_at,
                        actual_size: v.spec.actual_size,
                        ..Default::default()
                    },
                }
            })
            .collect();
        let replicas = self
            .replicas
            .values()
            .map(|r| {
                let mut record = r.record.clone();
                record.status.running = matches!(r.mode(), Some(ReplicaMode::Rw | ReplicaMode::Wo));
                record
            })
            .collect();
        (nodes, volumes, replicas)
    }

    /// The planner's view of the model: built from its records by the
    /// controller's own code (`observe::view_of`).
    pub fn view(&self) -> ClusterView {
        let (nodes, volumes, replicas) = self.records();
        crate::observe::view_of(&nodes, &volumes, &replicas)
    }

    /// Plans once on the current state.
    pub fn plan(&self) -> Plan {
        planner::plan(&self.view(), &self.settings(), self.now)
    }

    /// One tick: plan, apply, advance rebuilds and the clock.
    pub fn tick(&mut self) -> Plan {
        // Observe first (as the controller records degradation), then plan.
        self.observe();
        let plan = self.plan();
        self.apply(&plan);
        self.advance_rebuilds();
        self.now += Duration::seconds(1);
        plan
    }

    /// Applies a plan's actions to the model.
    pub fn apply(&mut self, plan: &Plan) {
        for a in &plan.actions {
            self.history.push((self.now, a.clone()));
            match &a.kind {
                ActionKind::CreateReplica {
                    volume,
                    node,
                    disk,
                    reuse: Some(name),
                    ..
                } => {
                    if let Some(r) = self.replicas.get_mut(name) {
                        debug_assert_eq!(
                            (r.volume(), r.node(), r.disk()),
                            (&**volume, &**node, &**disk)
                        );
                        effects::reuse(&mut r.record, Some(ReplicaMode::Wo));
                        r.ticks_left = self.rebuild_ticks;
                        self.counters.reused += 1;
                    }
                }
                ActionKind::CreateReplica {
                    volume,
                    node,
                    disk,
                    reuse: None,
                    ..
                } => {
                    self.next_id += 1;
                    let name = format!("{volume}-r{}", self.next_id);
                    let record =
                        effects::new_replica(&name, volume, node, disk, Some(ReplicaMode::Wo));
                    self.replicas.insert(
                        name,
                        SimReplica {
                            record,
                            ticks_left: self.rebuild_ticks,
                        },
                    );
                    self.counters.created += 1;
                }
                ActionKind::DeleteReplica { replica, .. } => {
                    if self.replicas.remove(replica).is_some() {
                        self.counters.deleted += 1;
                    }
                }
                ActionKind::SetReplicaEviction { replica, requested } => {
                    if let Some(r) = self.replicas.get_mut(replica) {
                        effects::set_eviction(&mut r.record, *requested);
                    }
                }
                ActionKind::SetNodeStatus {
                    node,
                    auto_evicting,
                    drain_blocked,
                    drain_blocked_reason,
                } => {
                    if let Ok(n) = self.node_mut(node) {
                        effects::set_node_status(
                            &mut n.status,
                            *auto_evicting,
                            *drain_blocked,
                            drain_blocked_reason,
                        );
                    }
                }
                ActionKind::RecordEvent {
                    object,
                    reason,
                    message,
                } => {
                    self.events
                        .push((object.clone(), reason.clone(), message.clone()));
                }
            }
        }
    }

    fn advance_rebuilds(&mut self) {
        let down: BTreeSet<String> = self
            .nodes
            .iter()
            .filter(|n| !n.spec.ready)
            .map(|n| n.spec.id.clone())
            .collect();
        let failing: BTreeSet<String> = self
            .nodes
            .iter()
            .filter(|n| n.rebuilds_fail)
            .map(|n| n.spec.id.clone())
            .collect();
        let now = self.now;
        for r in self.replicas.values_mut() {
            if r.mode() != Some(ReplicaMode::Wo) {
                continue;
            }
            if down.contains(r.node()) {
                effects::failed(&mut r.record, now, false);
                continue;
            }
            r.ticks_left = r.ticks_left.saturating_sub(1);
            if r.ticks_left == 0 {
                if failing.contains(r.node()) {
                    effects::failed(&mut r.record, now, false);
                } else {
                    effects::rebuilt(&mut r.record, now);
                }
            }
        }
    }

    /// Records when each volume became degraded (as the controller does).
    pub fn observe(&mut self) {
        for v in &mut self.volumes {
            let reps: Vec<&SimReplica> = self
                .replicas
                .values()
                .filter(|r| r.volume() == v.spec.name)
                .collect();
            let rw = reps.iter().filter(|r| r.is_rw()).count();
            let had_data = reps.iter().any(|r| r.record.spec.healthy_at.is_some());
            let degraded = had_data && rw < v.spec.number_of_replicas as usize;
            if degraded && !v.degraded {
                v.last_degraded_at = Some(self.now);
            }
            v.degraded = degraded;
        }
    }

    /// Replicas still being rebuilt.
    pub fn pending(&self) -> bool {
        self.replicas
            .values()
            .any(|r| r.mode() == Some(ReplicaMode::Wo))
    }

    /// The placement state, for oscillation detection.
    pub fn fingerprint(&self) -> String {
        let mut parts: Vec<String> = self
            .replicas
            .values()
            .map(|r| {
                format!(
                    "{}@{}/{}:{:?}:{}",
                    r.volume(),
                    r.node(),
                    r.disk(),
                    r.mode(),
                    r.eviction_requested()
                )
            })
            .collect();
        parts.sort();
        parts.join(",")
    }

    /// volume -> node -> rw replicas, every node listed.
    pub fn healthy_per_node(&self) -> BTreeMap<String, BTreeMap<String, usize>> {
        self.per_volume(
            |s| s.nodes.iter().map(|n| n.spec.id.clone()).collect(),
            |r| r.node().to_string(),
        )
    }

    /// volume -> zone -> rw replicas, every zone listed.
    pub fn healthy_per_zone(&self) -> BTreeMap<String, BTreeMap<String, usize>> {
        self.per_volume(
            |s| s.nodes.iter().map(|n| n.spec.zone.clone()).collect(),
            |r| self.zone_of(r.node()),
        )
    }

    /// volume -> "node/disk" -> rw replicas, disks holding some.
    pub fn healthy_per_disk(&self) -> BTreeMap<String, BTreeMap<String, usize>> {
        self.per_volume(
            |_| BTreeSet::new(),
            |r| format!("{}/{}", r.node(), r.disk()),
        )
    }

    fn per_volume(
        &self,
        all_keys: impl Fn(&Sim) -> BTreeSet<String>,
        key: impl Fn(&SimReplica) -> String,
    ) -> BTreeMap<String, BTreeMap<String, usize>> {
        let keys = all_keys(self);
        let mut out: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
        for v in &self.volumes {
            out.insert(
                v.spec.name.clone(),
                keys.iter().map(|k| (k.clone(), 0)).collect(),
            );
        }
        for r in self.replicas.values().filter(|r| r.is_rw()) {
            *out.entry(r.volume().to_string())
                .or_default()
                .entry(key(r))
                .or_default() += 1;
        }
        out
    }

    /// Applies a step that is not `settle`.
    pub fn apply_step(&mut self, step: &Step) -> Result<(), String> {
        match step {
            Step::Settle(_) => {}
            Step::Node(p) => self.change_node(p)?,
            Step::Disk(p) => self.change_disk(p)?,
            Step::AddNode(spec) => self.add_node(spec.clone())?,
            Step::AddVolume(spec) => self.add_volume(spec.clone())?,
            Step::FailReplica(r) => {
                let now = self.now;
                let victim = self
                    .replicas
                    .values_mut()
                    .find(|x| x.volume() == r.volume && x.node() == r.node && x.is_rw())
                    .ok_or_else(|| format!("no rw replica of {} on {}", r.volume, r.node))?;
                effects::failed(&mut victim.record, now, false);
            }
            Step::DeleteReplica(r) => {
                let name = self
                    .replicas
                    .values()
                    .find(|x| x.volume() == r.volume && x.node() == r.node)
                    .map(|x| x.name().to_string())
                    .ok_or_else(|| format!("no replica of {} on {}", r.volume, r.node))?;
                self.replicas.remove(&name);
            }
            Step::Setting(s) => {
                let v = check_setting(&s.name, &s.value.to_string())?;
                self.settings.insert(s.name.clone(), v);
            }
            Step::Volume(p) => self.change_volume(p)?,
            Step::Advance(a) => self.now += Duration::seconds(a.seconds as i64),
        }
        Ok(())
    }

    /// A node changed by the operator, or going down or up. A node going
    /// down takes its running replicas with it.
    fn change_node(&mut self, p: &NodePatch) -> Result<(), String> {
        let now = self.now;
        let n = self.node_mut(&p.id)?;
        if let Some(z) = &p.zone {
            n.spec.zone = z.clone();
        }
        if let Some(v) = p.allow_scheduling {
            n.spec.allow_scheduling = v;
        }
        if let Some(v) = p.cordoned {
            n.spec.cordoned = v;
        }
        if let Some(v) = p.eviction_requested {
            n.spec.eviction_requested = v;
        }
        if let Some(t) = &p.tags {
            n.spec.tags = t.clone();
        }
        if let Some(v) = p.rebuilds_fail {
            n.rebuilds_fail = v;
        }
        if let Some(ready) = p.ready {
            n.spec.ready = ready;
            if !ready {
                for r in self.replicas.values_mut().filter(|r| r.node() == p.id) {
                    if matches!(r.mode(), Some(ReplicaMode::Rw | ReplicaMode::Wo)) {
                        effects::failed(&mut r.record, now, false);
                    }
                }
            }
        }
        Ok(())
    }

    /// A disk changed by the operator, or filled by other data.
    fn change_disk(&mut self, p: &DiskPatch) -> Result<(), String> {
        let n = self.node_mut(&p.node)?;
        let d = n
            .spec
            .disks
            .iter_mut()
            .find(|d| d.id == p.id)
            .ok_or_else(|| format!("no disk {}/{}", p.node, p.id))?;
        if let Some(v) = p.used {
            d.used = v;
        }
        if let Some(v) = p.allow_scheduling {
            d.allow_scheduling = v;
        }
        if let Some(v) = p.eviction_requested {
            d.eviction_requested = v;
        }
        if let Some(t) = &p.tags {
            d.tags = t.clone();
        }
        Ok(())
    }

    /// A volume changed by the user: replica count, balance, locality, or
    /// attached elsewhere.
    fn change_volume(&mut self, p: &VolumePatch) -> Result<(), String> {
        if let Some(n) = p.attached_node.as_deref().filter(|n| !n.is_empty())
            && self.node(n).is_none()
        {
            return Err(format!("attachedNode {n:?} is not a node"));
        }
        let v = self
            .volumes
            .iter_mut()
            .find(|v| v.spec.name == p.name)
            .ok_or_else(|| format!("no volume {:?}", p.name))?;
        if let Some(n) = p.number_of_replicas {
            if !(1..=20).contains(&n) {
                return Err(format!("{}: numberOfReplicas must be 1 to 20", p.name));
            }
            v.spec.number_of_replicas = n;
        }
        if let Some(b) = p.replica_auto_balance {
            v.spec.replica_auto_balance = b;
        }
        if let Some(d) = p.data_locality {
            v.spec.data_locality = Some(d);
        }
        if let Some(n) = &p.attached_node {
            v.spec.attached_node = (!n.is_empty()).then(|| n.clone());
        }
        Ok(())
    }
}
