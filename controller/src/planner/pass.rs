//! The working state of one planning pass: indexes over the view, and what
//! this pass has already decided, so that later decisions see earlier ones
//! (lesson: concurrent placements over-filled disks).

use std::cell::{OnceCell, RefCell};
use std::collections::{BTreeSet, HashMap};
use std::rc::Rc;

use rustc_hash::{FxHashMap, FxHashSet};

use chrono::{DateTime, Utc};

use ballast::model::{AutoBalance, DataLocality};
use ballast::settings::Settings;

use super::view::{ClusterView, DiskView, NodeView, ReplicaView, VolumeView};

type DiskKey = (String, String);
/// What makes two volumes equally placeable: selectors, size, and the
/// pressure threshold a target must stay below.
/// (node selector, pinned node, disk selector, size, below-used limit).
type VolumeKind = (Vec<String>, Option<String>, Vec<String>, u64, Option<u64>);

pub struct Pass<'a> {
    pub view: &'a ClusterView,
    pub settings: &'a Settings,
    /// The time; read through `now()`.
    now: DateTime<Utc>,
    /// Set whenever a rule reads what depends on more than its volume and
    /// the nodes: the time, this pass's placements and rebuild counts, and
    /// the disks' scheduled bytes. Incremental planning (`Memo`) only
    /// skips volumes whose last plan read none of these.
    pub(super) read_shared: std::cell::Cell<bool>,
    // The indexes are only looked up, never walked: hash maps keep a
    // lookup at one hash and one compare at any cluster size, and the
    // plan's order stays the view's.
    nodes: FxHashMap<&'a str, &'a NodeView>,
    /// Each volume's place in `view.volumes`.
    volumes: FxHashMap<&'a str, u32>,
    /// Every replica of a volume of the view, grouped by volume in the
    /// view's order; volume `i`'s are `by_volume[at[i]..at[i + 1]]`.
    by_volume: Vec<&'a ReplicaView>,
    at: Vec<u32>,
    /// Replicas whose volume is not in the view.
    orphans: FxHashMap<&'a str, Vec<&'a ReplicaView>>,
    /// Per node, its disks' replicas and scheduled bytes (built on first
    /// use: a healthy pass never asks).
    /// (Owned, without the view's lifetime: a cell of borrowed data would
    /// tie a pass to one lifetime.)
    disks: OnceCell<FxHashMap<String, Vec<DiskIndex>>>,
    /// The settings' defaults that every volume reads.
    pub default_balance: AutoBalance,
    pub default_locality: DataLocality,
    /// Bytes placed on each disk by this pass, per node then disk (looked
    /// up by `&str` without building a key).
    placed: FxHashMap<String, FxHashMap<String, u64>>,
    /// Rebuilds running or started by this pass, per node.
    rebuilds: FxHashMap<String, u32>,
    /// Disks that receive a disk-pressure move (in flight or this pass).
    pub receiving: BTreeSet<DiskKey>,
    /// Disks this pass deletes a replica from: their usage is about to
    /// drop, so no new move leaves them in this pass.
    pub freed: BTreeSet<DiskKey>,
    /// Volumes this pass already changed; later rules leave them alone.
    pub busy: FxHashSet<String>,
    /// The eviction request each replica should have (decided first).
    pub evicting: FxHashSet<String>,
    /// Nodes that could take a replica, per kind of volume, as at the
    /// start of the pass.
    pub(super) eligible: RefCell<HashMap<VolumeKind, Rc<Eligible>>>,
}

/// One disk's replicas (their places in `view.replicas`), and the sum of
/// their volumes' sizes, from the view.
struct DiskIndex {
    id: String,
    replicas: Vec<u32>,
    scheduled: u64,
}

/// Nodes that could take a replica of a kind of volume, and their zones.
#[derive(Debug, Default)]
pub struct Eligible {
    /// Node ids, sorted.
    pub nodes: Vec<String>,
    /// Zones of those nodes, sorted.
    pub zones: BTreeSet<String>,
}

impl<'a> Pass<'a> {
    pub fn new(view: &'a ClusterView, settings: &'a Settings, now: DateTime<Utc>) -> Self {
        let nodes = view.nodes.iter().map(|n| (n.id.as_str(), n)).collect();
        let mut volumes = FxHashMap::default();
        volumes.reserve(view.volumes.len());
        for (i, v) in view.volumes.iter().enumerate() {
            volumes.insert(v.name.as_str(), i as u32);
        }
        // Replicas grouped by volume with a counting sort: one lookup per
        // replica, no allocation per volume, the view's order kept.
        let mut orphans: FxHashMap<&str, Vec<&ReplicaView>> = FxHashMap::default();
        let owner: Vec<Option<u32>> = view
            .replicas
            .iter()
            .map(|r| volumes.get(r.volume.as_str()).copied())
            .collect();
        let mut at = vec![0u32; view.volumes.len() + 1];
        for o in owner.iter().flatten() {
            at[*o as usize + 1] += 1;
        }
        for i in 1..at.len() {
            at[i] += at[i - 1];
        }
        let mut next = at.clone();
        let mut slots: Vec<Option<&ReplicaView>> = vec![None; at[view.volumes.len()] as usize];
        for (r, o) in view.replicas.iter().zip(&owner) {
            match o {
                Some(o) => {
                    slots[next[*o as usize] as usize] = Some(r);
                    next[*o as usize] += 1;
                }
                None => orphans.entry(r.volume.as_str()).or_default().push(r),
            }
        }
        let by_volume = slots.into_iter().flatten().collect();
        let mut pass = Pass {
            view,
            settings,
            now,
            read_shared: std::cell::Cell::new(false),
            nodes,
            volumes,
            by_volume,
            at,
            orphans,
            disks: OnceCell::new(),
            default_balance: settings.replica_auto_balance(),
            default_locality: settings.default_data_locality(),
            placed: FxHashMap::default(),
            rebuilds: FxHashMap::default(),
            receiving: BTreeSet::new(),
            freed: BTreeSet::new(),
            busy: FxHashSet::default(),
            evicting: FxHashSet::default(),
            eligible: RefCell::new(HashMap::new()),
        };
        // Rebuilds in flight: replicas being filled from a replica that
        // holds data (a new volume's first replicas copy nothing).
        for r in &view.replicas {
            if r.is_rebuilding() && pass.volume_has_data(&r.volume) {
                *pass.rebuilds.entry(r.node.clone()).or_default() += 1;
            }
        }
        pass
    }

    /// The time of the pass.
    pub fn now(&self) -> DateTime<Utc> {
        self.read_shared.set(true);
        self.now
    }

    pub fn node(&self, id: &str) -> Option<&'a NodeView> {
        self.nodes.get(id).copied()
    }

    pub fn disk(&self, node: &str, disk: &str) -> Option<&'a DiskView> {
        self.node(node)?.disks.iter().find(|d| d.id == disk)
    }

    pub fn volume(&self, name: &str) -> Option<&'a VolumeView> {
        let i = *self.volumes.get(name)?;
        self.view.volumes.get(i as usize)
    }

    pub fn replicas_of(&self, volume: &str) -> &[&'a ReplicaView] {
        match self.volumes.get(volume) {
            Some(&i) => self.replicas_at(i as usize),
            None => self.orphans.get(volume).map(Vec::as_slice).unwrap_or(&[]),
        }
    }

    /// The replicas of `view.volumes[i]`, without a lookup by name (volume
    /// names are unique in a view: they are the store's keys).
    pub fn replicas_at(&self, i: usize) -> &[&'a ReplicaView] {
        match (self.at.get(i), self.at.get(i + 1)) {
            (Some(&from), Some(&to)) => &self.by_volume[from as usize..to as usize],
            _ => &[],
        }
    }

    /// The disks index, built on first use.
    fn disks(&self) -> &FxHashMap<String, Vec<DiskIndex>> {
        self.disks.get_or_init(|| {
            let mut disks: FxHashMap<String, Vec<DiskIndex>> = FxHashMap::default();
            for (k, r) in self.view.replicas.iter().enumerate() {
                let size = self.volume(&r.volume).map(|v| v.size).unwrap_or(0);
                // `entry` takes an owned key, which would clone the node's
                // name for every replica; this clones it once per node.
                if !disks.contains_key(&r.node) {
                    disks.insert(r.node.clone(), Vec::new());
                }
                let Some(on) = disks.get_mut(&r.node) else {
                    continue;
                };
                let i = match on.iter().position(|d| d.id == r.disk) {
                    Some(i) => i,
                    None => {
                        on.push(DiskIndex {
                            id: r.disk.clone(),
                            replicas: Vec::new(),
                            scheduled: 0,
                        });
                        on.len() - 1
                    }
                };
                on[i].replicas.push(k as u32);
                on[i].scheduled += size;
            }
            disks
        })
    }

    fn disk_index(&self, node: &str, disk: &str) -> Option<&DiskIndex> {
        self.disks().get(node)?.iter().find(|d| d.id == disk)
    }

    /// The replicas on a disk, in the view's order.
    pub fn replicas_on(&self, node: &str, disk: &str) -> Vec<&'a ReplicaView> {
        let view: &'a ClusterView = self.view;
        self.disk_index(node, disk)
            .map(|d| {
                d.replicas
                    .iter()
                    .map(|&k| &view.replicas[k as usize])
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn zone_of(&self, node: &str) -> &'a str {
        self.node(node).map(|n| n.zone.as_str()).unwrap_or("")
    }

    /// Whether any replica of the volume has ever held data.
    pub fn volume_has_data(&self, volume: &str) -> bool {
        self.replicas_of(volume).iter().any(|r| r.held_data())
    }

    /// Scheduled bytes on a disk, including this pass's placements.
    pub fn scheduled(&self, node: &str, disk: &str) -> u64 {
        self.read_shared.set(true);
        let base = self.disk_index(node, disk).map_or(0, |d| d.scheduled);
        base + self.placed(node, disk)
    }

    /// Bytes this pass placed on a disk.
    pub fn placed(&self, node: &str, disk: &str) -> u64 {
        self.read_shared.set(true);
        self.placed
            .get(node)
            .and_then(|d| d.get(disk))
            .copied()
            .unwrap_or(0)
    }

    /// Records a placement: its bytes, and a rebuild on the node when it
    /// copies data.
    pub fn reserve(&mut self, node: &str, disk: &str, bytes: u64, rebuild: bool) {
        *self
            .placed
            .entry(node.to_string())
            .or_default()
            .entry(disk.to_string())
            .or_default() += bytes;
        if rebuild {
            *self.rebuilds.entry(node.to_string()).or_default() += 1;
        }
    }

    /// Whether the node may start one more rebuild.
    pub fn rebuild_slot(&self, node: &str) -> bool {
        self.read_shared.set(true);
        self.rebuilds.get(node).copied().unwrap_or(0)
            < self.settings.concurrent_rebuild_per_node_limit()
    }

    pub fn rebuilds_on(&self, node: &str) -> u32 {
        self.read_shared.set(true);
        self.rebuilds.get(node).copied().unwrap_or(0)
    }
}
