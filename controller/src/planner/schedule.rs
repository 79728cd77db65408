//! Scheduling a new replica (BEHAVIOR.md "Scheduling a new replica"):
//! which node and disk, or the reasons, per node and disk, why none fits.
//!
//! Candidates pass the node checks (ready, schedulable, not cordoned when
//! the setting says so, no eviction, node selector) and the disk checks
//! (ready, schedulable, no eviction, disk selector, capacity including this
//! pass's placements). Anti-affinity comes in tiers: a zone with no replica,
//! then (zone soft) a node with no replica, then (node soft) any node;
//! within a node a disk with no replica, then (disk soft) any disk. Among
//! equals the placement leaving the most free share wins; then names.

use std::rc::Rc;

use super::pass::{Eligible, Pass};
use super::view::{DiskView, NodeView, ReplicaView, VolumeView};

/// Where a replica goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub node: String,
    pub disk: String,
}

/// Where a replica of the volume is (or is planned), for anti-affinity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub node: String,
    pub disk: String,
}

impl Peer {
    pub fn of<'x>(replicas: impl IntoIterator<Item = &'x ReplicaView>) -> Vec<Peer> {
        replicas
            .into_iter()
            .map(|r| Peer {
                node: r.node.clone(),
                disk: r.disk.clone(),
            })
            .collect()
    }
}

/// What is being placed, and under which constraints.
pub struct Request<'r> {
    pub volume: &'r VolumeView,
    /// Replicas that count for anti-affinity (the volume's staying replicas).
    pub peers: Vec<Peer>,
    /// Only this node (locality, disk pressure, balance targets).
    pub only_node: Option<&'r str>,
    /// Only nodes of this zone (zone balance).
    pub only_zone: Option<&'r str>,
    /// Never this disk (the one a replica moves off).
    pub not_disk: Option<(&'r str, &'r str)>,
    /// Locality: one replica on the attached node even if it already holds one.
    pub ignore_node_anti_affinity: bool,
    /// Disk pressure: the target's used share must stay below this.
    pub below_used_percent: Option<u64>,
    /// Disks of `only_node` that must not be chosen (already receiving).
    pub skip_disks: Vec<String>,
}

impl<'r> Request<'r> {
    pub fn new(volume: &'r VolumeView, peers: Vec<Peer>) -> Self {
        Request {
            volume,
            peers,
            only_node: None,
            only_zone: None,
            not_disk: None,
            ignore_node_anti_affinity: false,
            below_used_percent: None,
            skip_disks: Vec::new(),
        }
    }
}

fn has_tags(have: &[String], want: &[String]) -> bool {
    want.iter().all(|t| have.contains(t))
}

/// Why a node takes no new replica of this volume, if it does not.
pub fn node_refusal(pass: &Pass, node: &NodeView, volume: &VolumeView) -> Option<String> {
    let s = pass.settings;
    if !node.ready {
        return Some(format!("{}: not ready", node.id));
    }
    if !node.allow_scheduling {
        return Some(format!("{}: scheduling disabled", node.id));
    }
    if node.cordoned && s.disable_scheduling_on_cordoned_node() {
        return Some(format!("{}: cordoned", node.id));
    }
    if node.eviction_requested {
        return Some(format!("{}: eviction requested", node.id));
    }
    if !has_tags(&node.tags, &volume.node_selector) {
        return Some(format!(
            "{}: lacks node tags {:?} of the node selector",
            node.id, volume.node_selector
        ));
    }
    if let Some(pinned) = volume.pinned_node.as_ref().filter(|p| **p != node.id) {
        return Some(format!(
            "{}: the strict-local volume {} lives on {pinned} only",
            node.id, volume.name
        ));
    }
    None
}

/// Why a disk takes no new replica of this volume, if it does not
/// (capacity included).
pub fn disk_refusal(
    pass: &Pass,
    node: &NodeView,
    disk: &DiskView,
    volume: &VolumeView,
    below_used: Option<u64>,
) -> Option<String> {
    let at = format!("{}/{}", node.id, disk.id);
    if !disk.ready {
        return Some(format!("{at}: disk not ready"));
    }
    if !disk.allow_scheduling {
        return Some(format!("{at}: scheduling disabled"));
    }
    if disk.eviction_requested {
        return Some(format!("{at}: eviction requested"));
    }
    if !has_tags(&disk.tags, &volume.disk_selector) {
        return Some(format!(
            "{at}: lacks disk tags {:?} of the disk selector",
            volume.disk_selector
        ));
    }
    if let Some(why) = capacity_refusal(pass, node, disk, volume.size) {
        return Some(why);
    }
    if let Some(pct) = below_used {
        let after = used_after(pass, &node.id, disk, volume.size);
        if after >= pct {
            return Some(format!(
                "{at}: would be {after}% used after the move, pressure threshold {pct}%"
            ));
        }
    }
    None
}

/// Why a disk cannot take `size` more bytes by the capacity rules: what is
/// scheduled there within the over-provisioning limit, and enough free
/// space left after it (`storage-minimal-available-percentage`).
pub fn capacity_refusal(
    pass: &Pass,
    node: &NodeView,
    disk: &DiskView,
    size: u64,
) -> Option<String> {
    let s = pass.settings;
    let at = format!("{}/{}", node.id, disk.id);
    if disk.maximum == 0 {
        return Some(format!("{at}: size unknown"));
    }
    let scheduled = pass.scheduled(&node.id, &disk.id);
    let limit = (disk.maximum.saturating_sub(disk.reserved) as u128
        * s.over_provisioning_percentage() as u128
        / 100) as u64;
    if scheduled.saturating_add(size) > limit {
        return Some(format!(
            "{at}: {} scheduled + {} would exceed {} ({}% of maximum minus reserved)",
            gib(scheduled),
            gib(size),
            gib(limit),
            s.over_provisioning_percentage()
        ));
    }
    let free_after = disk
        .available
        .saturating_sub(pass.placed(&node.id, &disk.id))
        .saturating_sub(disk.reserved)
        .checked_sub(size);
    let min = s.minimal_available_percentage() as u128;
    match free_after {
        None => {
            return Some(format!(
                "{at}: {} free, {} needed",
                gib(disk.available),
                gib(size)
            ));
        }
        Some(f) if (f as u128) * 100 < min * disk.maximum as u128 => {
            return Some(format!(
                "{at}: {}% free after placement, minimum {min}% (setting storage-minimal-available-percentage)",
                f as u128 * 100 / disk.maximum as u128
            ));
        }
        Some(_) => {}
    }
    None
}

/// A disk's used share, in percent, after `extra` more bytes: the larger of
/// what the filesystem uses and what is scheduled, plus reserved.
pub fn used_after(pass: &Pass, node: &str, disk: &DiskView, extra: u64) -> u64 {
    if disk.maximum == 0 {
        return 100;
    }
    let used_now = disk.maximum.saturating_sub(disk.available) + pass.placed(node, &disk.id);
    let base = used_now.max(pass.scheduled(node, &disk.id));
    ((base + disk.reserved + extra) as u128 * 100 / disk.maximum as u128) as u64
}

fn gib(bytes: u64) -> String {
    ballast::quantity::format_size(bytes)
}

/// Chooses a node and disk, or returns every reason none fits.
pub fn choose(pass: &Pass, req: &Request) -> Result<Placement, Vec<String>> {
    let s = pass.settings;
    let zone_soft = s.replica_zone_soft_anti_affinity();
    let node_soft = s.replica_soft_anti_affinity() || req.ignore_node_anti_affinity;
    let disk_soft = s.replica_disk_soft_anti_affinity();
    let used_zones: Vec<&str> = req.peers.iter().map(|p| pass.zone_of(&p.node)).collect();
    let used_nodes: Vec<&str> = req.peers.iter().map(|p| p.node.as_str()).collect();
    let used_disks: Vec<(&str, &str)> = req
        .peers
        .iter()
        .map(|p| (p.node.as_str(), p.disk.as_str()))
        .collect();

    let mut reasons = Vec::new();
    // (tier, disk tier, -free share in ppm, node, disk)
    let mut best: Option<((u8, u8, i64), Placement)> = None;
    for node in &pass.view.nodes {
        if req.only_node.is_some_and(|n| n != node.id)
            || req.only_zone.is_some_and(|z| z != node.zone)
        {
            continue;
        }
        if let Some(r) = node_refusal(pass, node, req.volume) {
            reasons.push(r);
            continue;
        }
        let zone_used = used_zones.contains(&node.zone.as_str());
        let node_used = used_nodes.contains(&node.id.as_str());
        let tier = match (zone_used, node_used) {
            (false, _) => 0,
            (true, false) if zone_soft => 1,
            (true, true) if zone_soft && node_soft => 2,
            (true, false) => {
                reasons.push(format!(
                    "{}: zone {:?} holds a replica of {} and replica-zone-soft-anti-affinity is false",
                    node.id, node.zone, req.volume.name
                ));
                continue;
            }
            (true, true) => {
                reasons.push(format!(
                    "{}: holds a replica of {} and replica-soft-anti-affinity is false",
                    node.id, req.volume.name
                ));
                continue;
            }
        };
        for disk in &node.disks {
            if req.not_disk == Some((node.id.as_str(), disk.id.as_str()))
                || req.skip_disks.contains(&disk.id)
            {
                continue;
            }
            if let Some(r) = disk_refusal(pass, node, disk, req.volume, req.below_used_percent) {
                reasons.push(r);
                continue;
            }
            let disk_used = used_disks.contains(&(node.id.as_str(), disk.id.as_str()));
            if disk_used && !disk_soft {
                reasons.push(format!(
                    "{}/{}: holds a replica of {} and replica-disk-soft-anti-affinity is false",
                    node.id, disk.id, req.volume.name
                ));
                continue;
            }
            let free = disk
                .available
                .saturating_sub(pass.placed(&node.id, &disk.id))
                .saturating_sub(req.volume.size);
            let share_ppm = (free as u128 * 1_000_000 / disk.maximum.max(1) as u128) as i64;
            let key = (tier, u8::from(disk_used), -share_ppm);
            // Nodes and disks come sorted, so the first of equals wins.
            if best.as_ref().is_none_or(|(k, _)| key < *k) {
                best = Some((
                    key,
                    Placement {
                        node: node.id.clone(),
                        disk: disk.id.clone(),
                    },
                ));
            }
        }
    }
    match best {
        Some((_, p)) => Ok(p),
        None => {
            if reasons.is_empty() {
                reasons.push(match (req.only_node, req.only_zone) {
                    (Some(n), _) => format!("{n}: no such node or no usable disk"),
                    (_, Some(z)) => format!("zone {z:?}: no node"),
                    _ => "no nodes".to_string(),
                });
            }
            Err(reasons)
        }
    }
}

/// Nodes that could take a replica of `volume` (node checks and one disk
/// that fits), computed once per kind of volume per pass (cached in it).
pub fn eligible(pass: &Pass, volume: &VolumeView, below_used: Option<u64>) -> Rc<Eligible> {
    // What is eligible depends on every disk's scheduled bytes, cached or not.
    pass.read_shared.set(true);
    let key = (
        volume.node_selector.clone(),
        volume.pinned_node.clone(),
        volume.disk_selector.clone(),
        volume.size,
        below_used,
    );
    if let Some(e) = pass.eligible.borrow().get(&key) {
        return e.clone();
    }
    let mut e = Eligible::default();
    for node in &pass.view.nodes {
        if node_refusal(pass, node, volume).is_some() {
            continue;
        }
        if node
            .disks
            .iter()
            .any(|d| disk_refusal(pass, node, d, volume, below_used).is_none())
        {
            e.nodes.push(node.id.clone());
            e.zones.insert(node.zone.clone());
        }
    }
    let e = Rc::new(e);
    pass.eligible.borrow_mut().insert(key, e.clone());
    e
}
