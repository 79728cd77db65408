//! The model cluster the simulator runs. Its records (nodes, volumes,
//! replicas, settings, events) live in a store that the controller's own
//! code reads and writes: the planner's view is `observe::cluster_view`,
//! and each action is carried out by `executor::carry_out` in a task of its
//! own, as the control loop starts it; where the executor calls a node,
//! the model's agents answer (`agents::ModelAgents`).
//!
//! What the model adds is the world the controller observes: each node's
//! spec, readiness and disks (what its heartbeat reports, the space a disk
//! holds counted from the replicas recorded on it), each volume's spec and
//! attachment (what its users write), when a volume became degraded (what
//! its engine reports), and fills that take `rebuildTicks` ticks.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use ballast::model::{
    DiskSpec, DiskStatus, Event, Node, NodeStatus, Replica, ReplicaMode, Setting, Volume,
    VolumeStatus,
};
use ballast::settings::{self, Settings};
use ballast::store::{MemoryStore, Store};
use chrono::{DateTime, Duration, TimeZone, Utc};
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

use super::agents::{ModelAgents, Outcome};
use super::scenario::{DiskPatch, NodePatch, NodeSpec, Scenario, Step, VolumePatch, VolumeSpec};
use crate::context::Context;
use crate::error::Error;
use crate::executor::{carry_out, effects};
use crate::planner::{self, ActionKind, ClusterView, Plan};

pub struct SimVolume {
    pub spec: VolumeSpec,
    degraded: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub created: u32,
    pub deleted: u32,
    pub reused: u32,
}

pub struct Sim {
    pub nodes: Vec<NodeSpec>,
    pub volumes: Vec<SimVolume>,
    /// Every action started, with the time it was started.
    pub history: Vec<(DateTime<Utc>, planner::Action)>,
    /// Actions carried out, by kind (reset by each settle).
    pub counters: Arc<Mutex<Counters>>,
    ctx: Arc<Context>,
    agents: Arc<ModelAgents>,
    tasks: Vec<JoinHandle<()>>,
    rt: Runtime,
}

fn check_setting(name: &str, value: &str) -> Result<String, String> {
    settings::validate(name, value).map_err(|e| format!("settings: {e}"))
}

/// What the model's records would say of `e`, as a step's error.
fn said(e: impl std::fmt::Display) -> String {
    format!("model store: {e}")
}

/// Each node's bytes in use per disk: the other data the scenario puts
/// there, and every replica recorded on it (its volume's actual size).
fn used_bytes(
    nodes: &[NodeSpec],
    volumes: &[SimVolume],
    replicas: &[Replica],
) -> BTreeMap<(String, String), u64> {
    let mut used: BTreeMap<(String, String), u64> = BTreeMap::new();
    for n in nodes {
        for d in &n.disks {
            used.insert((n.id.clone(), d.id.clone()), d.used);
        }
    }
    for r in replicas {
        let size = volumes
            .iter()
            .find(|v| v.spec.name == r.spec.volume)
            .map(|v| v.spec.actual_size.unwrap_or(v.spec.size))
            .unwrap_or(0);
        *used
            .entry((r.spec.node_id.clone(), r.spec.disk_id.clone()))
            .or_default() += size;
    }
    used
}

/// A node's record as its registration, heartbeat and operator make it;
/// what the executor records (auto-eviction, drain) is kept.
fn write_node(n: &NodeSpec, used: &BTreeMap<(String, String), u64>, rec: &mut Node) {
    let id = n.id.as_str();
    rec.spec.zone = n.zone.clone();
    rec.spec.tags = n.tags.clone();
    rec.spec.allow_scheduling = n.allow_scheduling;
    rec.spec.eviction_requested = n.eviction_requested;
    rec.spec.disks = n
        .disks
        .iter()
        .map(|d| {
            let spec = DiskSpec {
                path: format!("/model/{id}/{}", d.id),
                tags: d.tags.clone(),
                allow_scheduling: d.allow_scheduling,
                eviction_requested: d.eviction_requested,
                storage_reserved: d.reserved,
            };
            (d.id.clone(), spec)
        })
        .collect();
    rec.status.ready = n.ready;
    rec.status.cordoned = n.cordoned;
    rec.status.agent_endpoint = format!("model:{id}");
    rec.status.replica_endpoint = format!("model:{id}");
    rec.status.disks = n
        .disks
        .iter()
        .map(|d| {
            let on = used.get(&(n.id.clone(), d.id.clone())).copied();
            let status = DiskStatus {
                ready: n.ready,
                storage_maximum: d.size,
                storage_available: d.size.saturating_sub(on.unwrap_or(0)),
                ..Default::default()
            };
            (d.id.clone(), status)
        })
        .collect();
    rec.status.disk_count = n.disks.len() as u32;
}

/// A volume's record as its user makes it (spec, attachment, size used).
fn write_volume(v: &VolumeSpec, rec: &mut Volume) {
    let s = &mut rec.spec;
    s.size = v.size;
    s.number_of_replicas = v.number_of_replicas;
    s.data_locality = v.data_locality;
    s.replica_auto_balance = v.replica_auto_balance;
    s.stale_replica_timeout = v.stale_replica_timeout;
    s.disk_selector = v.disk_selector.clone();
    s.node_selector = v.node_selector.clone();
    rec.status.attached_node = v.attached_node.clone();
    rec.status.actual_size = v.actual_size;
}

impl Sim {
    pub fn new(scenario: &Scenario) -> Result<Self, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .map_err(|e| format!("cannot start the model's runtime: {e}"))?;
        let agents = Arc::new(ModelAgents::new(scenario.rebuild_ticks));
        let now = Utc
            .timestamp_opt(1_700_000_000, 0)
            .single()
            .unwrap_or_default();
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let mut s = Sim {
            nodes: Vec::new(),
            volumes: Vec::new(),
            history: Vec::new(),
            counters: Arc::default(),
            ctx: Context::model(store, agents.clone(), now),
            agents,
            tasks: Vec::new(),
            rt,
        };
        for (name, value) in &scenario.settings {
            s.set(name, &value.to_string())?;
        }
        for n in &scenario.nodes {
            s.add_node(n.clone())?;
        }
        for v in &scenario.volumes {
            s.add_volume(v.clone())?;
        }
        Ok(s)
    }

    /// The controller's context over the model (its store, clock, agents).
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Runs `f` on the model's store, on the model's runtime.
    fn block<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        self.rt.block_on(f)
    }

    pub fn now(&self) -> DateTime<Utc> {
        self.ctx.now()
    }

    fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        let value = check_setting(name, value)?;
        let store = self.ctx.store.clone();
        self.block(async {
            let setting = Setting {
                name: name.to_string(),
                resource_version: 0,
                value: value.clone(),
                status: Default::default(),
            };
            match store.get::<Setting>(name).await? {
                None => store.create(&setting).await.map(drop),
                Some(mut old) => {
                    old.value = value;
                    store.update(&old).await.map(drop)
                }
            }
        })
        .map_err(said)
    }

    fn add_node(&mut self, spec: NodeSpec) -> Result<(), String> {
        if self.nodes.iter().any(|n| n.id == spec.id) {
            return Err(format!("nodes: duplicate node id {:?}", spec.id));
        }
        if spec.disks.is_empty() {
            return Err(format!("nodes: node {:?} has no disks", spec.id));
        }
        self.agents.set_down(&spec.id, !spec.ready);
        self.nodes.push(spec);
        self.nodes.sort_by(|a, b| a.id.cmp(&b.id));
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
            degraded: false,
        });
        self.volumes.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        Ok(())
    }

    fn node(&self, id: &str) -> Option<&NodeSpec> {
        self.nodes.iter().find(|n| n.id == id)
    }

    fn node_mut(&mut self, id: &str) -> Result<&mut NodeSpec, String> {
        self.nodes
            .iter_mut()
            .find(|n| n.id == id)
            .ok_or_else(|| format!("no node {id:?}"))
    }

    pub fn zone_of(&self, node: &str) -> String {
        self.node(node).map(|n| n.zone.clone()).unwrap_or_default()
    }

    /// The effective settings, as the controller reads them.
    pub fn settings(&self) -> Settings {
        self.block(self.ctx.settings())
            .unwrap_or_else(|_| Settings::from_overrides(std::iter::empty::<(&str, &str)>()))
    }

    /// The replicas' records, by name.
    pub fn replicas(&self) -> BTreeMap<String, Replica> {
        self.block(self.ctx.store.list::<Replica>())
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.name.clone(), r))
            .collect()
    }

    /// A node's record (what the controller knows of it).
    pub fn node_record(&self, id: &str) -> Option<Node> {
        self.block(self.ctx.store.get::<Node>(id)).ok().flatten()
    }

    /// A volume's record.
    pub fn volume_record(&self, name: &str) -> Option<Volume> {
        self.block(self.ctx.store.get::<Volume>(name))
            .ok()
            .flatten()
    }

    /// The events recorded, oldest first.
    pub fn events(&self) -> Vec<Event> {
        self.block(self.ctx.store.list::<Event>())
            .unwrap_or_default()
    }

    /// Writes the model's world into the records, as the nodes' heartbeats
    /// and the users' calls would: only what changed.
    fn report(&self) -> Result<(), String> {
        let store = self.ctx.store.clone();
        self.block(async {
            let replicas: Vec<Replica> = store.list().await?;
            let used = used_bytes(&self.nodes, &self.volumes, &replicas);
            for n in &self.nodes {
                match store.get::<Node>(&n.id).await? {
                    None => {
                        let mut rec = Node {
                            id: n.id.clone(),
                            resource_version: 0,
                            spec: ballast::model::NodeSpec {
                                zone: String::new(),
                                tags: Vec::new(),
                                allow_scheduling: true,
                                eviction_requested: false,
                                disks: BTreeMap::new(),
                            },
                            status: NodeStatus::default(),
                        };
                        write_node(n, &used, &mut rec);
                        store.create(&rec).await?;
                    }
                    Some(_) => {
                        store
                            .modify::<Node, Error>(&n.id, |rec| {
                                let before = rec.clone();
                                write_node(n, &used, rec);
                                Ok(*rec != before)
                            })
                            .await?;
                    }
                }
            }
            for v in &self.volumes {
                match store.get::<Volume>(&v.spec.name).await? {
                    None => {
                        let mut rec = Volume {
                            name: v.spec.name.clone(),
                            resource_version: 0,
                            spec: ballast::model::VolumeSpec::new(v.spec.size, 1),
                            status: VolumeStatus::default(),
                        };
                        write_volume(&v.spec, &mut rec);
                        store.create(&rec).await?;
                    }
                    Some(_) => {
                        store
                            .modify::<Volume, Error>(&v.spec.name, |rec| {
                                let before = rec.clone();
                                write_volume(&v.spec, rec);
                                Ok(*rec != before)
                            })
                            .await?;
                    }
                }
            }
            // An attached volume's engine runs its rw and wo replicas.
            for r in &replicas {
                let running = self
                    .volumes
                    .iter()
                    .any(|v| v.spec.name == r.spec.volume && v.spec.attached_node.is_some())
                    && matches!(r.status.mode, Some(ReplicaMode::Rw | ReplicaMode::Wo));
                if r.status.running != running {
                    store
                        .modify::<Replica, Error>(&r.name, |rec| {
                            rec.status.running = running;
                            Ok(true)
                        })
                        .await?;
                }
            }
            Ok::<(), Error>(())
        })
        .map_err(said)
    }

    /// The planner's view of the model: the controller's, of its records as
    /// last observed, from the context's copy of them brought up to date
    /// as the control loop does it.
    pub fn view(&self) -> ClusterView {
        let view = self.block(crate::observe::current_view(&self.ctx));
        view.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "the model's records cannot be read");
            ClusterView::default()
        })
    }

    /// Plans once on the current state.
    pub fn plan(&self) -> Plan {
        planner::plan(&self.view(), &self.settings(), self.now())
    }

    /// One tick: observe, plan, carry the actions out, advance the fills
    /// and the clock.
    pub fn tick(&mut self) -> Plan {
        self.observe();
        let plan = self.plan();
        self.apply(&plan);
        self.advance_fills();
        self.ctx.advance(Duration::seconds(1));
        plan
    }

    /// Starts a plan's actions as the control loop does: each in a task of
    /// its own, skipping a volume a call still holds; then runs the tasks
    /// until each is done or waits for a fill.
    pub fn apply(&mut self, plan: &Plan) {
        for a in &plan.actions {
            if a.volume().is_some_and(|v| self.ctx.volume_busy(v)) {
                continue;
            }
            self.history.push((self.now(), a.clone()));
            let (ctx, counters, action) = (self.ctx.clone(), self.counters.clone(), a.clone());
            let task = self.rt.spawn(async move {
                if let Err(e) = carry_out(&ctx, &action).await {
                    tracing::debug!(error = %e, action = ?action.kind, "model: action failed");
                    return;
                }
                let mut c = counters.lock().unwrap_or_else(|p| p.into_inner());
                match &action.kind {
                    ActionKind::CreateReplica { reuse: None, .. } => c.created += 1,
                    ActionKind::CreateReplica { .. } => c.reused += 1,
                    ActionKind::DeleteReplica { .. } => c.deleted += 1,
                    _ => {}
                }
            });
            self.tasks.push(task);
        }
        self.run_tasks();
    }

    /// Runs the executor's tasks until every one left waits for a fill.
    fn run_tasks(&mut self) {
        let mut tasks = std::mem::take(&mut self.tasks);
        let agents = self.agents.clone();
        self.rt.block_on(async {
            // Bounded, though a task waits on nothing but the model.
            for _ in 0..100_000 {
                tasks.retain(|t| !t.is_finished());
                if tasks.len() <= agents.waiting() {
                    break;
                }
                tokio::task::yield_now().await;
            }
        });
        self.tasks = tasks;
    }

    /// One tick of every fill; what ended is reported as its engine would
    /// report it (an offline fill answers the executor's call instead).
    fn advance_fills(&mut self) {
        let now = self.now();
        let store = self.ctx.store.clone();
        for (name, outcome) in self.agents.advance() {
            let mark: fn(&mut Replica, DateTime<Utc>) = match outcome {
                Outcome::Answered => continue,
                Outcome::Rw => |r, now| {
                    if r.status.mode != Some(ReplicaMode::Err) {
                        effects::rebuilt(r, now)
                    }
                },
                Outcome::Err => |r, now| effects::failed(r, now, false),
            };
            self.mark_replica(&store, &name, |r| mark(r, now));
        }
        self.run_tasks();
    }

    /// Changes one replica's record, if it still has one.
    fn mark_replica(
        &self,
        store: &Arc<dyn Store>,
        name: &str,
        f: impl Fn(&mut Replica) + Send + Sync,
    ) {
        let changed = self.block(store.modify::<Replica, Error>(name, |r| {
            f(r);
            Ok(true)
        }));
        if let Err(e) = changed {
            tracing::debug!(replica = %name, error = %e, "model: replica record not changed");
        }
    }

    /// What the controller hears before it plans: the nodes' heartbeats and
    /// the users' specs (`report`), and when each volume became degraded
    /// (as its engine reports it).
    pub fn observe(&mut self) {
        if let Err(e) = self.report() {
            tracing::warn!(error = %e, "the model cannot write its records");
        }
        let replicas = self.replicas();
        let now = self.now();
        let mut newly = Vec::new();
        for v in &mut self.volumes {
            let reps: Vec<&Replica> = replicas
                .values()
                .filter(|r| r.spec.volume == v.spec.name)
                .collect();
            let rw = reps
                .iter()
                .filter(|r| r.status.mode == Some(ReplicaMode::Rw))
                .count();
            let had_data = reps.iter().any(|r| r.spec.healthy_at.is_some());
            let degraded = had_data && rw < v.spec.number_of_replicas as usize;
            if degraded && !v.degraded {
                newly.push(v.spec.name.clone());
            }
            v.degraded = degraded;
        }
        for name in newly {
            let marked = self.block(self.ctx.store.modify::<Volume, Error>(&name, |v| {
                v.status.last_degraded_at = Some(now);
                Ok(true)
            }));
            if let Err(e) = marked {
                tracing::debug!(volume = %name, error = %e, "model: volume record not changed");
            }
        }
    }

    /// Replicas still being filled, or actions still under way (a replica
    /// in `wo` is always one or the other).
    pub fn pending(&self) -> bool {
        self.agents.busy() || !self.tasks.is_empty()
    }

    /// The placement state, for oscillation detection.
    pub fn fingerprint(&self) -> String {
        let mut parts: Vec<String> = self
            .replicas()
            .values()
            .map(|r| {
                format!(
                    "{}@{}/{}:{:?}:{}",
                    r.spec.volume,
                    r.spec.node_id,
                    r.spec.disk_id,
                    r.status.mode,
                    r.spec.eviction_requested
                )
            })
            .collect();
        parts.sort();
        parts.join(",")
    }

    /// volume -> node -> rw replicas, every node listed.
    pub fn healthy_per_node(&self) -> BTreeMap<String, BTreeMap<String, usize>> {
        self.per_volume(
            |s| s.nodes.iter().map(|n| n.id.clone()).collect(),
            |r| r.spec.node_id.clone(),
        )
    }

    /// volume -> zone -> rw replicas, every zone listed.
    pub fn healthy_per_zone(&self) -> BTreeMap<String, BTreeMap<String, usize>> {
        self.per_volume(
            |s| s.nodes.iter().map(|n| n.zone.clone()).collect(),
            |r| self.zone_of(&r.spec.node_id),
        )
    }

    /// volume -> "node/disk" -> rw replicas, disks holding some.
    pub fn healthy_per_disk(&self) -> BTreeMap<String, BTreeMap<String, usize>> {
        self.per_volume(
            |_| BTreeSet::new(),
            |r| format!("{}/{}", r.spec.node_id, r.spec.disk_id),
        )
    }

    fn per_volume(
        &self,
        all_keys: impl Fn(&Sim) -> BTreeSet<String>,
        key: impl Fn(&Replica) -> String,
    ) -> BTreeMap<String, BTreeMap<String, usize>> {
        let keys = all_keys(self);
        let mut out: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
        for v in &self.volumes {
            out.insert(
                v.spec.name.clone(),
                keys.iter().map(|k| (k.clone(), 0)).collect(),
            );
        }
        for r in self
            .replicas()
            .values()
            .filter(|r| r.status.mode == Some(ReplicaMode::Rw))
        {
            *out.entry(r.spec.volume.clone())
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
                let victim = self
                    .replicas()
                    .into_values()
                    .find(|x| {
                        x.spec.volume == r.volume
                            && x.spec.node_id == r.node
                            && x.status.mode == Some(ReplicaMode::Rw)
                    })
                    .ok_or_else(|| format!("no rw replica of {} on {}", r.volume, r.node))?;
                self.fail(&[victim.name]);
            }
            Step::DeleteReplica(r) => {
                let name = self
                    .replicas()
                    .into_values()
                    .find(|x| x.spec.volume == r.volume && x.spec.node_id == r.node)
                    .map(|x| x.name)
                    .ok_or_else(|| format!("no replica of {} on {}", r.volume, r.node))?;
                self.agents.forget(&name);
                self.block(self.ctx.store.delete::<Replica>(&name, None))
                    .map_err(said)?;
            }
            Step::Setting(s) => self.set(&s.name, &s.value.to_string())?,
            Step::Volume(p) => self.change_volume(p)?,
            Step::Advance(a) => self.ctx.advance(Duration::seconds(a.seconds as i64)),
        }
        Ok(())
    }

    /// Replicas that fail now (an I/O error, their node lost), as their
    /// engine or node reports it.
    fn fail(&self, names: &[String]) {
        let now = self.now();
        let store = self.ctx.store.clone();
        for name in names {
            self.mark_replica(&store, name, |r| effects::failed(r, now, false));
        }
    }

    /// A node changed by the operator, or going down or up. A node going
    /// down takes its replicas with it, and the fills under way there.
    fn change_node(&mut self, p: &NodePatch) -> Result<(), String> {
        let n = self.node_mut(&p.id)?;
        if let Some(z) = &p.zone {
            n.zone = z.clone();
        }
        if let Some(v) = p.allow_scheduling {
            n.allow_scheduling = v;
        }
        if let Some(v) = p.cordoned {
            n.cordoned = v;
        }
        if let Some(v) = p.eviction_requested {
            n.eviction_requested = v;
        }
        if let Some(t) = &p.tags {
            n.tags = t.clone();
        }
        if let Some(ready) = p.ready {
            n.ready = ready;
        }
        if let Some(v) = p.rebuilds_fail {
            self.agents.set_failing(&p.id, v);
        }
        if let Some(ready) = p.ready {
            self.agents.set_down(&p.id, !ready);
            if !ready {
                let lost: Vec<String> = self
                    .replicas()
                    .into_values()
                    .filter(|r| r.spec.node_id == p.id && r.status.mode != Some(ReplicaMode::Err))
                    .map(|r| r.name)
                    .collect();
                self.fail(&lost);
            }
            // The executor's calls waiting on the node hear that it is gone.
            self.run_tasks();
        }
        Ok(())
    }

    /// A disk changed by the operator, or filled by other data.
    fn change_disk(&mut self, p: &DiskPatch) -> Result<(), String> {
        let n = self.node_mut(&p.node)?;
        let d = n
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
