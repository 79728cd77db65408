//! The working state of one planning pass: indexes over the view, and what
//! this pass has already decided, so that later decisions see earlier ones
//! (lesson: concurrent placements over-filled disks).

use std::cell::{OnceCell, RefCell};
use std::collections::{BTreeSet, HashMap};
use std::hash::BuildHasher;
use std::rc::Rc;

use hashbrown::HashTable;
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
    /// Each node's place in `view.nodes`.
    nodes: FxHashMap<&'a str, u32>,
    /// Each node's zone as a number (the same number, the same zone),
    /// in `view.nodes`' order; `no_zone` is the empty zone's, which a node
    /// missing from the view is in. Comparing the names read each node's
    /// zone from the heap, at 100k volumes from memory.
    zones: Vec<u32>,
    no_zone: u32,
    /// Each volume's place in `view.volumes`, built on first use: grouping
    /// the replicas of a view listed in its volumes' order (as the store
    /// lists them) needs no lookup by name, and a healthy pass asks for
    /// none. At 100k volumes, building it and hashing every replica's
    /// volume name into it was a third of the pass.
    /// (Places keyed by the name's hash, so it borrows nothing.)
    volumes: OnceCell<HashTable<u32>>,
    /// Every replica of a volume of the view, grouped by volume in the
    /// view's order; volume `i`'s are `by_volume[at[i]..at[i + 1]]`.
    by_volume: Vec<&'a ReplicaView>,
    /// The places in `view.replicas` of `by_volume`'s replicas.
    grouped: Vec<u32>,
    at: Vec<u32>,
    /// Each replica's `Facts`, in the view's order.
    facts: Vec<Facts>,
    /// Each volume's attached node's place in `view.nodes` (`NONE` when
    /// detached or not in the view), resolved in the walk that meets the
    /// volume's name: a later lookup by name, one per volume, was a walk
    /// of its own through the volumes' names and the nodes' at 100k.
    attached: Vec<u32>,
    /// The places of the replicas being rebuilt, in the view's order.
    rebuilding: Vec<u32>,
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

fn name_hash(name: &str) -> u64 {
    rustc_hash::FxBuildHasher.hash_one(name)
}

/// The place of volume `name` in the view, through the index in `cell`
/// (built on first use).
fn find_volume(view: &ClusterView, cell: &OnceCell<HashTable<u32>>, name: &str) -> Option<u32> {
    let table = cell.get_or_init(|| {
        let mut table = HashTable::with_capacity(view.volumes.len());
        for (i, v) in view.volumes.iter().enumerate() {
            table.insert_unique(name_hash(&v.name), i as u32, |&j| {
                name_hash(&view.volumes[j as usize].name)
            });
        }
        table
    });
    table
        .find(name_hash(name), |&i| view.volumes[i as usize].name == name)
        .copied()
}

/// No place: a replica's volume, node or disk missing from the view.
const NONE: u32 = u32::MAX;
/// A volume's attached node not yet resolved (in `Pass::new` only).
const UNSEEN: u32 = u32::MAX - 1;

/// What the walks over every replica read, resolved once per pass: its
/// volume's and node's places in the view, its disk's place among the
/// node's, and its state, in 16 bytes. At 100k volumes the replicas'
/// records and their names take some 80 MB; each walk that read them was
/// a walk through memory, about 10 ns per replica on this machine, where a
/// walk of these stays in the cache.
#[derive(Clone, Copy, Debug)]
pub struct Facts {
    volume: u32,
    node: u32,
    disk: u32,
    flags: u8,
}

const RW: u8 = 1;
const FAILED: u8 = 2;
const HELD_DATA: u8 = 4;
const RUNNING: u8 = 8;
const EVICTION_REQUESTED: u8 = 16;

impl Facts {
    fn of(r: &ReplicaView, volume: Option<u32>, node: Option<u32>, disk: Option<usize>) -> Facts {
        let flag = |on: bool, bit: u8| if on { bit } else { 0 };
        Facts {
            volume: volume.unwrap_or(NONE),
            node: node.unwrap_or(NONE),
            disk: disk.and_then(|d| u32::try_from(d).ok()).unwrap_or(NONE),
            flags: flag(r.is_rw(), RW)
                | flag(r.is_failed(), FAILED)
                | flag(r.held_data(), HELD_DATA)
                | flag(r.running, RUNNING)
                | flag(r.eviction_requested, EVICTION_REQUESTED),
        }
    }

    /// `ReplicaView::is_rw`.
    pub fn rw(&self) -> bool {
        self.flags & RW != 0
    }

    /// `ReplicaView::is_failed`.
    pub fn failed(&self) -> bool {
        self.flags & FAILED != 0
    }

    /// `ReplicaView::is_rebuilding`.
    pub fn rebuilding(&self) -> bool {
        !self.failed() && !self.rw()
    }

    /// `ReplicaView::held_data`.
    pub fn held_data(&self) -> bool {
        self.flags & HELD_DATA != 0
    }

    /// `ReplicaView::running`.
    pub fn running(&self) -> bool {
        self.flags & RUNNING != 0
    }

    /// `ReplicaView::eviction_requested`.
    pub fn eviction_requested(&self) -> bool {
        self.flags & EVICTION_REQUESTED != 0
    }
}

impl<'a> Pass<'a> {
    pub fn new(view: &'a ClusterView, settings: &'a Settings, now: DateTime<Utc>) -> Self {
        let volumes = OnceCell::new();
        // One walk over the replicas' records resolves what every later
        // walk reads (see `Facts`). Each replica's volume is first sought
        // where the last one's was, or just after it, and looked up by
        // name only when it is not there.
        let mut cursor = 0usize;
        let mut nodes: FxHashMap<&str, u32> = FxHashMap::default();
        nodes.reserve(view.nodes.len());
        for (i, n) in view.nodes.iter().enumerate() {
            nodes.insert(n.id.as_str(), i as u32);
        }
        let mut numbers: FxHashMap<&str, u32> = FxHashMap::default();
        let zones: Vec<u32> = view
            .nodes
            .iter()
            .map(|n| {
                let next = numbers.len() as u32;
                *numbers.entry(n.zone.as_str()).or_insert(next)
            })
            .collect();
        let no_zone = numbers.get("").copied().unwrap_or(numbers.len() as u32);
        let mut rebuilding = Vec::new();
        let mut attached = vec![UNSEEN; view.volumes.len()];
        let resolve = |v: &VolumeView| {
            v.attached_node
                .as_deref()
                .and_then(|n| nodes.get(n).copied())
                .unwrap_or(NONE)
        };
        let facts: Vec<Facts> = view
            .replicas
            .iter()
            .enumerate()
            .map(|(k, r)| {
                let mut volume = None;
                for i in [cursor, cursor + 1] {
                    if view.volumes.get(i).is_some_and(|v| v.name == r.volume) {
                        volume = Some(i as u32);
                        break;
                    }
                }
                let volume = volume.or_else(|| find_volume(view, &volumes, &r.volume));
                if let Some(i) = volume {
                    cursor = i as usize;
                    if attached[cursor] == UNSEEN {
                        attached[cursor] = resolve(&view.volumes[cursor]);
                    }
                }
                let node = nodes.get(r.node.as_str()).copied();
                let disk = node.and_then(|n| {
                    view.nodes[n as usize]
                        .disks
                        .iter()
                        .position(|d| d.id == r.disk)
                });
                let f = Facts::of(r, volume, node, disk);
                if f.rebuilding() {
                    rebuilding.push(k as u32);
                }
                f
            })
            .collect();
        // Volumes with no replica.
        for (a, v) in attached.iter_mut().zip(&view.volumes) {
            if *a == UNSEEN {
                *a = resolve(v);
            }
        }
        // Replicas grouped by volume with a counting sort: no allocation
        // per volume, the view's order kept.
        let mut at = vec![0u32; view.volumes.len() + 1];
        for f in &facts {
            if f.volume != NONE {
                at[f.volume as usize + 1] += 1;
            }
        }
        for i in 1..at.len() {
            at[i] += at[i - 1];
        }
        let mut next = at.clone();
        let mut orphans: FxHashMap<&str, Vec<&ReplicaView>> = FxHashMap::default();
        let mut grouped = vec![0u32; at[view.volumes.len()] as usize];
        for (k, f) in facts.iter().enumerate() {
            if f.volume == NONE {
                let r = &view.replicas[k];
                orphans.entry(r.volume.as_str()).or_default().push(r);
            } else {
                grouped[next[f.volume as usize] as usize] = k as u32;
                next[f.volume as usize] += 1;
            }
        }
        let by_volume = grouped
            .iter()
            .map(|&k| &view.replicas[k as usize])
            .collect();
        let mut pass = Pass {
            view,
            settings,
            now,
            read_shared: std::cell::Cell::new(false),
            nodes,
            zones,
            no_zone,
            volumes,
            by_volume,
            grouped,
            at,
            facts,
            attached,
            rebuilding,
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
        for &k in &pass.rebuilding {
            let r = &view.replicas[k as usize];
            if pass.replicas_with(k as usize).iter().any(|o| o.held_data()) {
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
        let i = *self.nodes.get(id)?;
        self.view.nodes.get(i as usize)
    }

    pub fn disk(&self, node: &str, disk: &str) -> Option<&'a DiskView> {
        self.node(node)?.disks.iter().find(|d| d.id == disk)
    }

    pub fn volume(&self, name: &str) -> Option<&'a VolumeView> {
        let i = find_volume(self.view, &self.volumes, name)?;
        self.view.volumes.get(i as usize)
    }

    pub fn replicas_of(&self, volume: &str) -> &[&'a ReplicaView] {
        match find_volume(self.view, &self.volumes, volume) {
            Some(i) => self.replicas_at(i as usize),
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

    /// The replicas of the volume of `view.replicas[k]` (found by place,
    /// not by name, when the volume is in the view).
    pub fn replicas_with(&self, k: usize) -> &[&'a ReplicaView] {
        match self.facts.get(k) {
            Some(f) if f.volume != NONE => self.replicas_at(f.volume as usize),
            _ => self
                .view
                .replicas
                .get(k)
                .map_or(&[], |r| self.replicas_of(&r.volume)),
        }
    }

    /// Every replica's `Facts` (the replica at the same place in
    /// `view.replicas`).
    pub fn facts(&self) -> &[Facts] {
        &self.facts
    }

    /// The `Facts` of `view.volumes[i]`'s replicas, as `replicas_at(i)`
    /// lists them.
    pub fn facts_at(&self, i: usize) -> impl Iterator<Item = &Facts> {
        let places = match (self.at.get(i), self.at.get(i + 1)) {
            (Some(&from), Some(&to)) => &self.grouped[from as usize..to as usize],
            _ => &[],
        };
        places.iter().map(|&k| &self.facts[k as usize])
    }

    /// The node a replica's `Facts` name, when it is in the view.
    pub fn node_of(&self, f: &Facts) -> Option<&'a NodeView> {
        self.view.nodes.get(f.node as usize)
    }

    /// The zone of the node a replica's `Facts` name, as a number: two
    /// replicas' are equal when `zone_of` their nodes is.
    pub fn zone_number(&self, f: &Facts) -> u32 {
        self.zones
            .get(f.node as usize)
            .copied()
            .unwrap_or(self.no_zone)
    }

    /// The node `view.volumes[i]` is attached to, when it is in the view.
    pub fn attached_at(&self, i: usize) -> Option<&'a NodeView> {
        let n = *self.attached.get(i)?;
        self.view.nodes.get(n as usize)
    }

    /// The disk a replica's `Facts` name, when it is in the view.
    pub fn disk_of(&self, f: &Facts) -> Option<&'a DiskView> {
        self.node_of(f)?.disks.get(f.disk as usize)
    }

    /// The places in `view.replicas` of the replicas being rebuilt.
    pub fn rebuilding(&self) -> &[u32] {
        &self.rebuilding
    }

    /// The disks index, built on first use.
    fn disks(&self) -> &FxHashMap<String, Vec<DiskIndex>> {
        self.disks.get_or_init(|| {
            let mut disks: FxHashMap<String, Vec<DiskIndex>> = FxHashMap::default();
            for (k, r) in self.view.replicas.iter().enumerate() {
                let size = self
                    .view
                    .volumes
                    .get(self.facts[k].volume as usize)
                    .map_or(0, |v| v.size);
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

#[cfg(test)]
mod tests {
    use super::*;
    use ballast::model::ReplicaMode;
    use chrono::TimeZone;
    use proptest::prelude::*;

    /// A view of up to 6 volumes (of 8 possible names, so some replicas
    /// name a volume that is not there), each detached or attached to one
    /// of 7 node names, and 4 nodes (of 6 names, one zone of three, one of
    /// them the empty one; two disks each of `d0`..`d2`), its replicas in
    /// any order.
    fn view() -> impl Strategy<Value = ClusterView> {
        let node = (
            0..6usize,
            proptest::collection::vec(0..3usize, 0..3),
            any::<u8>(),
        );
        let replica = (0..8usize, 0..6usize, 0..3usize, 0..4u8, any::<u8>());
        (
            proptest::collection::btree_map(0..8usize, proptest::option::of(0..7usize), 0..6),
            proptest::collection::vec(node, 0..4),
            proptest::collection::vec(replica, 0..24),
            any::<bool>(),
        )
            .prop_map(|(volumes, nodes, replicas, sorted)| {
                let t0 = Utc
                    .timestamp_opt(1_700_000_000, 0)
                    .single()
                    .unwrap_or_default();
                let mut view = ClusterView::default();
                for (v, attached) in volumes {
                    let mut volume = VolumeView::plain(&format!("v{v}"), 1 << 30, 3);
                    volume.attached_node = attached.map(|n| format!("n{n}"));
                    view.volumes.push(volume);
                }
                for (n, disks, bits) in nodes {
                    let mut node = NodeView::healthy(&format!("n{n}"), ["z0", "z1", ""][n % 3]);
                    node.cordoned = bits & 1 != 0;
                    node.eviction_requested = bits & 2 != 0;
                    node.disks = disks
                        .into_iter()
                        .map(|d| {
                            let mut disk = DiskView::healthy(&format!("d{d}"), 100, 50);
                            disk.eviction_requested = bits & 4 != 0;
                            disk
                        })
                        .collect();
                    view.nodes.push(node);
                }
                for (k, (v, n, d, mode, bits)) in replicas.into_iter().enumerate() {
                    let mode = [
                        ReplicaMode::Rw,
                        ReplicaMode::Wo,
                        ReplicaMode::Err,
                        ReplicaMode::Rw,
                    ][usize::from(mode)];
                    let mut r = ReplicaView::placed(
                        (&format!("v{v}-r{k}"), &format!("v{v}")),
                        (&format!("n{n}"), &format!("d{d}")),
                        mode,
                        t0,
                    );
                    r.mode = (bits & 1 == 0).then_some(mode);
                    r.running = bits & 2 != 0;
                    r.eviction_requested = bits & 4 != 0;
                    r.healthy_at = (bits & 8 == 0).then_some(t0);
                    r.failed_at = (bits & 16 != 0).then_some(t0);
                    view.replicas.push(r);
                }
                if sorted {
                    view.replicas.sort_by(|a, b| a.name.cmp(&b.name));
                }
                view
            })
    }

    fn same<T>(a: Option<&T>, b: Option<&T>) -> bool {
        match (a, b) {
            (Some(a), Some(b)) => std::ptr::eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }

    proptest! {
        /// What the walks read from `Facts` is what the records say (a
        /// replica's node, disk, zone and state, a volume's attached node),
        /// and the replicas are grouped under their volumes in the view's
        /// order, whatever order the view lists them in.
        #[test]
        fn facts_agree_with_the_records(view in view()) {
            let settings = Settings::default();
            let pass = Pass::new(&view, &settings, Utc::now());
            prop_assert_eq!(pass.facts().len(), view.replicas.len());
            for (r, f) in view.replicas.iter().zip(pass.facts()) {
                prop_assert!(same(pass.node_of(f), pass.node(&r.node)), "{}: node", r.name);
                prop_assert!(same(pass.disk_of(f), pass.disk(&r.node, &r.disk)), "{}: disk", r.name);
                prop_assert_eq!(f.rw(), r.is_rw());
                prop_assert_eq!(f.failed(), r.is_failed());
                prop_assert_eq!(f.rebuilding(), r.is_rebuilding());
                prop_assert_eq!(f.held_data(), r.held_data());
                prop_assert_eq!(f.running(), r.running);
                prop_assert_eq!(f.eviction_requested(), r.eviction_requested);
            }
            let rebuilding: Vec<u32> = (0..view.replicas.len() as u32)
                .filter(|&k| view.replicas[k as usize].is_rebuilding())
                .collect();
            prop_assert_eq!(pass.rebuilding(), rebuilding.as_slice());
            for (k, r) in view.replicas.iter().enumerate() {
                prop_assert_eq!(pass.replicas_with(k), pass.replicas_of(&r.volume));
            }
            for (i, v) in view.volumes.iter().enumerate() {
                let expected: Vec<&ReplicaView> =
                    view.replicas.iter().filter(|r| r.volume == v.name).collect();
                prop_assert_eq!(pass.replicas_at(i), expected.as_slice());
                prop_assert_eq!(pass.replicas_of(&v.name), expected.as_slice());
                let facts: Vec<&Facts> = pass.facts_at(i).collect();
                prop_assert_eq!(facts.len(), expected.len());
                for (f, r) in facts.into_iter().zip(&expected) {
                    prop_assert!(same(pass.node_of(f), pass.node(&r.node)));
                    prop_assert_eq!(f.rw(), r.is_rw());
                }
                prop_assert!(same(pass.volume(&v.name), Some(v)));
                let attached = v.attached_node.as_deref().and_then(|n| pass.node(n));
                prop_assert!(same(pass.attached_at(i), attached), "{}: attached", v.name);
            }
            for (a, fa) in view.replicas.iter().zip(pass.facts()) {
                for (b, fb) in view.replicas.iter().zip(pass.facts()) {
                    prop_assert_eq!(
                        pass.zone_number(fa) == pass.zone_number(fb),
                        pass.zone_of(&a.node) == pass.zone_of(&b.node),
                        "the zones of {} and {}", &a.name, &b.name
                    );
                }
            }
            for r in &view.replicas {
                if pass.volume(&r.volume).is_none() {
                    let orphans: Vec<&ReplicaView> =
                        view.replicas.iter().filter(|o| o.volume == r.volume).collect();
                    prop_assert_eq!(pass.replicas_of(&r.volume), orphans.as_slice());
                }
            }
        }
    }
}
