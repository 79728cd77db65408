//! What every RPC, request handler and background task of the controller
//! gets: the store, the timing configuration, the liveness table, the
//! per-volume guards, the node agents, and the clock and the names of new
//! replicas (real ones in the daemon, a model's in the simulator).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ballast::guard::{KeyGuard, KeyedGuards};
use ballast::model::{Node, Setting};
use ballast::settings::Settings;
use ballast::store::Store;
use ballast::tls::{Ca, Member};
use chrono::{DateTime, Utc};
use tokio::sync::watch;

use crate::agents::{Agents, GrpcAgents};
use crate::call_off::OfflineCopies;
use crate::error::Error;
use crate::events::Recorder;
use crate::mirror::Mirror;

pub struct Context {
    pub store: Arc<dyn Store>,
    /// A node with no heartbeat for this long is not ready.
    pub node_down_timeout: Duration,
    /// How often nodes are asked to heartbeat.
    pub heartbeat_interval: Duration,
    /// When each node was last heard from, by this process's clock. A node
    /// the store knows but this controller has not heard from since it
    /// began to lead counts from then (`leading_since`).
    pub last_seen: Mutex<HashMap<String, Instant>>,
    /// When this controller began to lead: its start on its own store, its
    /// win of the Lease on Kubernetes. Not the process's start: a follower
    /// hears no heartbeat (it forwards them), and one that took over after
    /// following for longer than the node-down timeout found every node
    /// silent since its start, and marked them all down.
    leading_since: Mutex<Instant>,
    /// When each replica in `wo` was last seen being filled: reported by
    /// its engine or its node, or under a call of this controller. A
    /// rebuild no one has driven for the node-down timeout was interrupted
    /// (its controller died) and is started again.
    pub rebuilding_seen: Mutex<HashMap<String, Instant>>,
    pub events: Recorder,
    /// Volumes with a call in progress.
    busy: KeyedGuards,
    /// Nodes merging a replica now: one at a time per node, whether the
    /// merge pass or a deleted snapshot's merges began it.
    pub merging: KeyedGuards,
    /// The copies of detached volumes' replicas under way (by volume),
    /// which a user's call on the volume calls off
    /// (`lock_volume_calling_off_copies`).
    offline_copies: OfflineCopies,
    /// The node agents the executor calls.
    pub agents: Arc<dyn Agents>,
    clock: Clock,
    names: Names,
    /// Who leads: always this process on the embedded store; elected by a
    /// Lease on Kubernetes.
    leadership: watch::Receiver<Leadership>,
    /// The cluster's client, on the Kubernetes store (to read its Nodes).
    pub kube: Option<kube::Client>,
    /// What this controller proves itself with to node agents and other
    /// controllers (and what its agent endpoint requires of callers).
    pub member: Member,
    /// The cluster's CA, which signs nodes' certificates, when TLS is on.
    pub ca: Option<Arc<Ca>>,
    /// The copy of the records the control loop plans on and heartbeats
    /// look into, kept by the store's change stream; whoever reads it
    /// brings it up to date first (`Context::records`).
    pub mirror: tokio::sync::Mutex<Mirror>,
}

/// Who leads, as this controller knows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leadership {
    /// This controller leads: it plans, acts and serves every call itself.
    pub leading: bool,
    /// The leader's identity and agent endpoint, when one is known.
    pub holder: Option<(String, String)>,
}

/// A process that always leads (one controller on its own store).
fn always_leading() -> watch::Receiver<Leadership> {
    watch::channel(Leadership {
        leading: true,
        holder: None,
    })
    .1
}

/// Where "now" comes from.
pub enum Clock {
    System,
    /// A model's time, moved on by its owner.
    Manual(Mutex<DateTime<Utc>>),
}

/// How new replicas are named: `<volume>-r<id>`.
enum Names {
    /// 8 random hex digits.
    Random,
    /// 1, 2, 3, ...: a model's names, the same on every run.
    Sequential(AtomicU64),
}

/// Held while a call works on a volume; released on drop.
pub type VolumeGuard = KeyGuard;

impl Context {
    pub fn new(store: Arc<dyn Store>, node_down_timeout: Duration) -> Arc<Self> {
        Self::serving(store, node_down_timeout, Member::default(), None)
    }

    /// A context whose calls to node agents are made as `member`, and
    /// whose nodes enroll with `ca`.
    pub fn serving(
        store: Arc<dyn Store>,
        node_down_timeout: Duration,
        member: Member,
        ca: Option<Arc<Ca>>,
    ) -> Arc<Self> {
        let agents = Arc::new(GrpcAgents::new(member.clone()));
        Arc::new(Context {
            member,
            ca,
            ..Self::build(store, node_down_timeout, agents)
        })
    }

    /// A context with the system clock, random replica names and leading
    /// always; the constructors change what differs.
    fn build(store: Arc<dyn Store>, node_down_timeout: Duration, agents: Arc<dyn Agents>) -> Self {
        // Heartbeat several times per timeout so one lost beat is no outage.
        let heartbeat_interval =
            (node_down_timeout / 4).clamp(Duration::from_millis(200), Duration::from_secs(5));
        Context {
            mirror: tokio::sync::Mutex::new(Mirror::new(store.as_ref())),
            store,
            node_down_timeout,
            heartbeat_interval,
            last_seen: Mutex::new(HashMap::new()),
            leading_since: Mutex::new(Instant::now()),
            rebuilding_seen: Mutex::new(HashMap::new()),
            events: Recorder::default(),
            busy: KeyedGuards::default(),
            merging: KeyedGuards::default(),
            offline_copies: OfflineCopies::default(),
            agents,
            clock: Clock::System,
            names: Names::Random,
            leadership: always_leading(),
            kube: None,
            member: Member::default(),
            ca: None,
        }
    }

    /// A context on a Kubernetes cluster, whose controller leads only
    /// while `leadership` says so.
    pub fn elected(
        store: Arc<dyn Store>,
        node_down_timeout: Duration,
        leadership: watch::Receiver<Leadership>,
        client: kube::Client,
        member: Member,
        ca: Option<Arc<Ca>>,
    ) -> Arc<Self> {
        let agents = Arc::new(GrpcAgents::new(member.clone()));
        Arc::new(Context {
            leadership,
            kube: Some(client),
            member,
            ca,
            ..Self::build(store, node_down_timeout, agents)
        })
    }

    /// Who leads now.
    pub fn leadership(&self) -> Leadership {
        self.leadership.borrow().clone()
    }

    /// Changes of leadership, to wait on.
    pub fn leadership_changes(&self) -> watch::Receiver<Leadership> {
        self.leadership.clone()
    }

    /// A context over a model: its store, its agents, its clock starting
    /// at `now`, and replicas named in sequence.
    pub fn model(store: Arc<dyn Store>, agents: Arc<dyn Agents>, now: DateTime<Utc>) -> Arc<Self> {
        Arc::new(Context {
            clock: Clock::Manual(Mutex::new(now)),
            names: Names::Sequential(AtomicU64::new(0)),
            ..Self::build(store, Duration::from_secs(30), agents)
        })
    }

    /// Now, by this context's clock.
    pub fn now(&self) -> DateTime<Utc> {
        match &self.clock {
            Clock::System => Utc::now(),
            Clock::Manual(t) => *t.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }

    /// Moves a model's clock on (the system clock moves by itself).
    pub fn advance(&self, by: chrono::Duration) {
        if let Clock::Manual(t) = &self.clock {
            *t.lock().unwrap_or_else(|p| p.into_inner()) += by;
        }
    }

    /// A new replica's name: `<volume>-r<id>`.
    pub fn replica_name(&self, volume: &str) -> String {
        match &self.names {
            Names::Random => {
                let id = uuid::Uuid::new_v4().simple().to_string();
                format!("{volume}-r{}", &id[..8])
            }
            Names::Sequential(n) => format!("{volume}-r{}", n.fetch_add(1, Ordering::Relaxed) + 1),
        }
    }

    /// The effective settings: defaults overlaid with what the store holds.
    pub async fn settings(&self) -> Result<Settings, Error> {
        let stored: Vec<Setting> = self.store.list().await?;
        Ok(Settings::from_overrides(
            stored.iter().map(|s| (s.name.as_str(), s.value.as_str())),
        ))
    }

    /// Records an event on `kind/name`.
    pub async fn event(
        &self,
        kind: ballast::model::Kind,
        name: &str,
        reason: &str,
        message: impl Into<String>,
    ) {
        self.events
            .record(self.store.as_ref(), self.now(), kind, name, reason, message)
            .await;
    }

    /// Records an event on `object` (`KIND/NAME`).
    pub async fn event_on(&self, object: &str, reason: &str, message: impl Into<String>) {
        self.events
            .record_on(self.store.as_ref(), self.now(), object, reason, message)
            .await;
    }

    /// Takes the volume for one call, or says it is busy (409).
    pub fn lock_volume(&self, name: &str) -> Result<VolumeGuard, Error> {
        self.busy.try_take(name).ok_or_else(|| busy(name))
    }

    /// Takes the volume for a user's call, waiting up to `patience` for a
    /// background action (a rebuild step) to let go of it; then busy (409).
    pub async fn lock_volume_waiting(
        &self,
        name: &str,
        patience: Duration,
    ) -> Result<VolumeGuard, Error> {
        self.busy
            .take_within(name, patience)
            .await
            .ok_or_else(|| busy(name))
    }

    /// The copy of the records, brought up to date from the store's change
    /// stream, held until the guard is dropped.
    pub async fn records(&self) -> Result<tokio::sync::MutexGuard<'_, Mirror>, Error> {
        let mut mirror = self.mirror.lock().await;
        mirror.refresh(self.store.as_ref()).await?;
        Ok(mirror)
    }

    /// Runs `copy`, an offline copy of a replica of `volume` (its guard
    /// held), unless a call on the volume calls it off first: then
    /// Unavailable, and the copy's call is dropped (its node stops it).
    pub async fn offline_copy<T>(
        &self,
        volume: &str,
        copy: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        self.offline_copies.run(volume, copy).await
    }

    /// The volume's guard for a user's call on it (`why`: an attach, a
    /// deletion, an expansion, a snapshot), waiting at most `patience`: an
    /// offline copy of one of its replicas (a detached volume's rebuild,
    /// which may last hours) is called off, the one under way, and one
    /// that would begin while the call waits does not. The replica is
    /// rebuilt later, keeping what was copied.
    pub async fn lock_volume_calling_off_copies(
        &self,
        name: &str,
        why: &str,
        patience: Duration,
    ) -> Result<VolumeGuard, Error> {
        let (_waiting, called_off) = self.offline_copies.call_off(name, why)?;
        if called_off {
            tracing::info!(volume = %name, why, "an offline copy of a replica is called off");
        }
        self.lock_volume_waiting(name, patience).await
    }

    /// Whether a call holds the volume now.
    pub fn volume_busy(&self, name: &str) -> bool {
        self.busy.is_held(name)
    }

    pub fn saw_node(&self, id: &str) {
        if let Ok(mut m) = self.last_seen.lock() {
            m.insert(id.to_string(), Instant::now());
        }
    }

    /// A replica is being filled: its engine or node reports it.
    pub fn saw_rebuilding(&self, replica: &str) {
        if let Ok(mut m) = self.rebuilding_seen.lock() {
            m.insert(replica.to_string(), Instant::now());
        }
    }

    /// This controller leads from now on: nodes it has not heard from
    /// count as silent from now, and get their first heartbeats' grace.
    pub fn began_leading(&self) {
        self.lead_since(Instant::now());
    }

    fn lead_since(&self, at: Instant) {
        if let Ok(mut since) = self.leading_since.lock() {
            *since = at;
        }
    }

    fn leading_since(&self) -> Instant {
        *self.leading_since.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long since the node was heard from (since this controller began
    /// to lead, when not since).
    pub fn silence(&self, id: &str) -> Duration {
        let since = self.leading_since();
        self.last_seen
            .lock()
            .ok()
            .and_then(|m| m.get(id).copied())
            .filter(|&seen| seen >= since)
            .unwrap_or(since)
            .elapsed()
    }

    /// How long after it begins to lead this controller waits for a node's
    /// first heartbeat before it takes the store's word that the node is
    /// not ready: two heartbeats (never past the node-down timeout). None
    /// over a model: its nodes beat when its owner moves its clock, not
    /// while a call waits.
    pub fn first_heartbeats_grace(&self) -> Duration {
        match self.clock {
            Clock::System => (self.heartbeat_interval * 2).min(self.node_down_timeout),
            Clock::Manual(_) => Duration::ZERO,
        }
    }

    /// Waits, within the first heartbeats' grace, until the store says each
    /// of `nodes` is ready (or held down by Kubernetes, which heartbeats do
    /// not lift). A node the store says is not ready may have come back
    /// while no controller led (a controller killed, then started again; a
    /// new leader): until it could have beaten, the store's word is stale,
    /// and an attach must not fault the volume on it. (Within the grace
    /// this controller has marked no node down: silence counts from its
    /// start to lead, and the grace is shorter than the timeout.) Returns
    /// whether it waited (the caller reads the nodes again); after the
    /// grace it returns false at once.
    pub async fn await_first_heartbeats(&self, nodes: &[impl AsRef<str>]) -> Result<bool, Error> {
        let end = self.leading_since() + self.first_heartbeats_grace();
        let mut waited = false;
        while Instant::now() < end {
            let mut down = Vec::new();
            for id in nodes.iter().map(AsRef::as_ref) {
                if let Some(n) = self.store.get::<Node>(id).await?
                    && !n.status.ready
                    && n.status.held_down.is_none()
                {
                    down.push(id);
                }
            }
            if down.is_empty() {
                break;
            }
            if !waited {
                tracing::info!(
                    nodes = ?down,
                    "waiting for the first heartbeats of nodes the store says are not ready"
                );
                waited = true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(waited)
    }

    /// This controller has led for `d` already (a test's controller whose
    /// first heartbeats' grace is over).
    #[cfg(test)]
    pub fn led_for(&self, d: Duration) {
        self.lead_since(Instant::now() - d);
    }
}

fn busy(name: &str) -> Error {
    Error::Conflict(format!("volume {name:?} is busy with another call; retry"))
}
