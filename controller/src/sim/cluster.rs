//! The model cluster the simulator runs: nodes, disks, volumes, replicas,
//! a clock; the view the planner sees of it; and the effect of each action.

use std::collections::{BTreeMap, BTreeSet};

use ballast::model::ReplicaMode;
use ballast::settings::{self, Settings};
use chrono::{DateTime, Duration, TimeZone, Utc};

use super::scenario::{NodeSpec, Scenario, Step, VolumeSpec};
use crate::planner::{
    self, ActionKind, ClusterView, DiskView, NodeView, Plan, ReplicaView, VolumeView,
};

pub struct SimNode {
    pub spec: NodeSpec,
    pub auto_evicting: bool,
    pub drain_blocked: bool,
    pub drain_blocked_reason: Option<String>,
    pub rebuilds_fail: bool,
}

pub struct SimVolume {
    pub spec: VolumeSpec,
    pub last_degraded_at: Option<DateTime<Utc>>,
    degraded: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SimReplica {
    pub name: String,
    pub volume: String,
    pub node: String,
    pub disk: String,
    pub mode: Option<ReplicaMode>,
    pub ticks_left: u32,
    pub retry: u32,
    pub failed_at: Option<DateTime<Utc>>,
    pub healthy_at: Option<DateTime<Utc>>,
    pub eviction_requested: bool,
}

impl SimReplica {
    pub fn is_rw(&self) -> bool {
        self.mode == Some(ReplicaMode::Rw)
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
            auto_evicting: false,
            drain_blocked: false,
            drain_blocked_reason: None,
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

    /// The planner's view of the model.
    pub fn view(&self) -> ClusterView {
        let mut on_disk: BTreeMap<(&str, &str), u64> = BTreeMap::new();
        for r in self.replicas.values() {
            *on_disk.entry((&r.node, &r.disk)).or_default() += self.volume_size(&r.volume).1;
        }
        let nodes = self
            .nodes
            .iter()
            .map(|n| NodeView {
                id: n.spec.id.clone(),
                zone: n.spec.zone.clone(),
                tags: n.spec.tags.clone(),
                ready: n.spec.ready,
                allow_scheduling: n.spec.allow_scheduling,
                eviction_requested: n.spec.eviction_requested,
                cordoned: n.spec.cordoned,
                auto_evicting: n.auto_evicting,
                drain_blocked: n.drain_blocked,
                drain_blocked_reason: n.drain_blocked_reason.clone(),
                disks: n
                    .spec
                    .disks
                    .iter()
                    .map(|d| {
                        let used = d.used
                            + on_disk
                                .get(&(n.spec.id.as_str(), d.id.as_str()))
                                .copied()
                                .unwrap_or(0);
                        DiskView {
                            id: d.id.clone(),
                            tags: d.tags.clone(),
                            ready: n.spec.ready,
                            allow_scheduling: d.allow_scheduling,
                            eviction_requested: d.eviction_requested,
                            maximum: d.size,
                            available: d.size.saturating_sub(used),
                            reserved: d.reserved,
                        }
                    })
                    .collect(),
            })
            .collect();
        let volumes = self
            .volumes
            .iter()
            .map(|v| VolumeView {
                name: v.spec.name.clone(),
                size: v.spec.size,
                actual_size: v.spec.actual_size.unwrap_or(v.spec.size),
                number_of_replicas: v.spec.number_of_replicas,
                data_locality: v.spec.data_locality,
                auto_balance: v.spec.replica_auto_balance,
                stale_replica_timeout: v.spec.stale_replica_timeout,
                disk_selector: v.spec.disk_selector.clone(),
                node_selector: v.spec.node_selector.clone(),
                attached_node: v.spec.attached_node.clone(),
                last_degraded_at: v.last_degraded_at,
            })
            .collect();
        let replicas = self
            .replicas
            .values()
            .map(|r| ReplicaView {
                name: r.name.clone(),
                volume: r.volume.clone(),
                node: r.node.clone(),
                disk: r.disk.clone(),
                mode: r.mode,
                running: matches!(r.mode, Some(ReplicaMode::Rw | ReplicaMode::Wo)),
                eviction_requested: r.eviction_requested,
                rebuild_retry_count: r.retry,
                failed_at: r.failed_at,
                healthy_at: r.healthy_at,
            })
            .collect();
        ClusterView {
            nodes,
            volumes,
            replicas,
        }
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
                        r.mode = Some(ReplicaMode::Wo);
                        r.ticks_left = self.rebuild_ticks;
                        r.retry += 1;
                        r.failed_at = None;
                        r.node = node.clone();
                        r.disk = disk.clone();
                        debug_assert_eq!(&r.volume, volume);
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
                    self.replicas.insert(
                        name.clone(),
                        SimReplica {
                            name,
                            volume: volume.clone(),
                            node: node.clone(),
                            disk: disk.clone(),
                            mode: Some(ReplicaMode::Wo),
                            ticks_left: self.rebuild_ticks,
                            retry: 0,
                            failed_at: None,
                            healthy_at: None,
                            eviction_requested: false,
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
                        r.eviction_requested = *requested;
                    }
                }
                ActionKind::SetNodeStatus {
                    node,
                    auto_evicting,
                    drain_blocked,
                    drain_blocked_reason,
                } => {
                    if let Ok(n) = self.node_mut(node) {
                        n.auto_evicting = *auto_evicting;
                        n.drain_blocked = *drain_blocked;
                        n.drain_blocked_reason = drain_blocked_reason.clone();
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
            if r.mode != Some(ReplicaMode::Wo) {
                continue;
            }
            if down.contains(&r.node) {
                r.mode = Some(ReplicaMode::Err);
                r.failed_at = Some(now);
                continue;
            }
            r.ticks_left = r.ticks_left.saturating_sub(1);
            if r.ticks_left == 0 {
                if failing.contains(&r.node) {
                    r.mode = Some(ReplicaMode::Err);
                    r.failed_at = Some(now);
                } else {
                    r.mode = Some(ReplicaMode::Rw);
                    r.healthy_at = Some(now);
                    r.retry = 0;
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
                .filter(|r| r.volume == v.spec.name)
                .collect();
            let rw = reps.iter().filter(|r| r.is_rw()).count();
            let had_data = reps.iter().any(|r| r.healthy_at.is_some());
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
            .any(|r| r.mode == Some(ReplicaMode::Wo))
    }

    /// The placement state, for oscillation detection.
    pub fn fingerprint(&self) -> String {
        let mut parts: Vec<String> = self
            .replicas
            .values()
            .map(|r| {
                format!(
                    "{}@{}/{}:{:?}:{}",
                    r.volume, r.node, r.disk, r.mode, r.eviction_requested
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
            |r| r.node.clone(),
        )
    }

    /// volume -> zone -> rw replicas, every zone listed.
    pub fn healthy_per_zone(&self) -> BTreeMap<String, BTreeMap<String, usize>> {
        self.per_volume(
            |s| s.nodes.iter().map(|n| n.spec.zone.clone()).collect(),
            |r| self.zone_of(&r.node),
        )
    }

    /// volume -> "node/disk" -> rw replicas, disks holding some.
    pub fn healthy_per_disk(&self) -> BTreeMap<String, BTreeMap<String, usize>> {
        self.per_volume(|_| BTreeSet::new(), |r| format!("{}/{}", r.node, r.disk))
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
            *out.entry(r.volume.clone())
                .or_default()
                .entry(key(r))
                .or_default() += 1;
        }
        out
    }

    /// Applies a step that is not `settle`.
    pub fn apply_step(&mut self, step: &Step) -> Result<(), String> {
        let now = self.now;
        match step {
            Step::Settle(_) => {}
            Step::Node(p) => {
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
                        // A node going down takes its running replicas with it.
                        for r in self.replicas.values_mut().filter(|r| r.node == p.id) {
                            if matches!(r.mode, Some(ReplicaMode::Rw | ReplicaMode::Wo)) {
                                r.mode = Some(ReplicaMode::Err);
                                r.failed_at = Some(now);
                            }
                        }
                    }
                }
            }
            Step::Disk(p) => {
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
            }
            Step::AddNode(spec) => self.add_node(spec.clone())?,
            Step::AddVolume(spec) => self.add_volume(spec.clone())?,
            Step::FailReplica(r) => {
                let victim = self
                    .replicas
                    .values_mut()
                    .find(|x| x.volume == r.volume && x.node == r.node && x.is_rw())
                    .ok_or_else(|| format!("no rw replica of {} on {}", r.volume, r.node))?;
                victim.mode = Some(ReplicaMode::Err);
                victim.failed_at = Some(now);
            }
            Step::DeleteReplica(r) => {
                let name = self
                    .replicas
                    .values()
                    .find(|x| x.volume == r.volume && x.node == r.node)
                    .map(|x| x.name.clone())
                    .ok_or_else(|| format!("no replica of {} on {}", r.volume, r.node))?;
                self.replicas.remove(&name);
            }
            Step::Setting(s) => {
                let v = check_setting(&s.name, &s.value.to_string())?;
                self.settings.insert(s.name.clone(), v);
            }
            Step::Volume(p) => {
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
            }
            Step::Advance(a) => self.now += Duration::seconds(a.seconds as i64),
        }
        Ok(())
    }
}
