//! The working state of one planning pass: indexes over the view, and what
//! this pass has already decided, so that later decisions see earlier ones
//! (lesson: concurrent placements over-filled disks).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;

use chrono::{DateTime, Utc};

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
    pub now: DateTime<Utc>,
    nodes: BTreeMap<&'a str, &'a NodeView>,
    volumes: BTreeMap<&'a str, &'a VolumeView>,
    by_volume: BTreeMap<&'a str, Vec<&'a ReplicaView>>,
    by_disk: BTreeMap<&'a str, BTreeMap<&'a str, Vec<&'a ReplicaView>>>,
    /// Sum of the sizes of replicas on each disk, from the view.
    scheduled: BTreeMap<&'a str, BTreeMap<&'a str, u64>>,
    /// Bytes placed on each disk by this pass.
    placed: BTreeMap<DiskKey, u64>,
    /// Rebuilds running or started by this pass, per node.
    rebuilds: BTreeMap<String, u32>,
    /// Disks that receive a disk-pressure move (in flight or this pass).
    pub receiving: BTreeSet<DiskKey>,
    /// Disks this pass deletes a replica from: their usage is about to
    /// drop, so no new move leaves them in this pass.
    pub freed: BTreeSet<DiskKey>,
    /// Volumes this pass already changed; later rules leave them alone.
    pub busy: BTreeSet<String>,
    /// The eviction request each replica should have (decided first).
    pub evicting: BTreeSet<String>,
    /// Nodes that could take a replica, per kind of volume, as at the
    /// start of the pass.
    pub(super) eligible: RefCell<HashMap<VolumeKind, Rc<Eligible>>>,
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
        let volumes: BTreeMap<&str, &VolumeView> =
            view.volumes.iter().map(|v| (v.name.as_str(), v)).collect();
        let mut by_volume: BTreeMap<&str, Vec<&ReplicaView>> = BTreeMap::new();
        let mut by_disk: BTreeMap<&str, BTreeMap<&str, Vec<&ReplicaView>>> = BTreeMap::new();
        let mut scheduled: BTreeMap<&str, BTreeMap<&str, u64>> = BTreeMap::new();
        for r in &view.replicas {
            by_volume.entry(r.volume.as_str()).or_default().push(r);
            by_disk
                .entry(r.node.as_str())
                .or_default()
                .entry(r.disk.as_str())
                .or_default()
                .push(r);
            let size = volumes.get(r.volume.as_str()).map(|v| v.size).unwrap_or(0);
            *scheduled
                .entry(r.node.as_str())
                .or_default()
                .entry(r.disk.as_str())
                .or_default() += size;
        }
        let mut pass = Pass {
            view,
            settings,
            now,
            nodes,
            volumes,
            by_volume,
            by_disk,
            scheduled,
            placed: BTreeMap::new(),
            rebuilds: BTreeMap::new(),
            receiving: BTreeSet::new(),
            freed: BTreeSet::new(),
            busy: BTreeSet::new(),
            evicting: BTreeSet::new(),
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

    pub fn node(&self, id: &str) -> Option<&'a NodeView> {
        self.nodes.get(id).copied()
    }

    pub fn disk(&self, node: &str, disk: &str) -> Option<&'a DiskView> {
        self.node(node)?.disks.iter().find(|d| d.id == disk)
    }

    pub fn volume(&self, name: &str) -> Option<&'a VolumeView> {
        self.volumes.get(name).copied()
    }

    pub fn replicas_of(&self, volume: &str) -> &[&'a ReplicaView] {
        self.by_volume.get(volume).map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn replicas_on(&self, node: &str, disk: &str) -> &[&'a ReplicaView] {
        self.by_disk
            .get(node)
            .and_then(|d| d.get(disk))
            .map(Vec::as_slice)
            .unwrap_or(&[])
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
        let base = self
            .scheduled
            .get(node)
            .and_then(|d| d.get(disk))
            .copied()
            .unwrap_or(0);
        base + self.placed(node, disk)
    }

    /// Bytes this pass placed on a disk.
    pub fn placed(&self, node: &str, disk: &str) -> u64 {
        self.placed
            .get(&(node.to_string(), disk.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Records a placement: its bytes, and a rebuild on the node when it
    /// copies data.
    pub fn reserve(&mut self, node: &str, disk: &str, bytes: u64, rebuild: bool) {
        *self
            .placed
            .entry((node.to_string(), disk.to_string()))
            .or_default() += bytes;
        if rebuild {
            *self.rebuilds.entry(node.to_string()).or_default() += 1;
        }
    }

    /// Whether the node may start one more rebuild.
    pub fn rebuild_slot(&self, node: &str) -> bool {
        self.rebuilds.get(node).copied().unwrap_or(0)
            < self.settings.concurrent_rebuild_per_node_limit()
    }

    pub fn rebuilds_on(&self, node: &str) -> u32 {
        self.rebuilds.get(node).copied().unwrap_or(0)
    }
}
