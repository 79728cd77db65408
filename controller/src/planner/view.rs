//! The planner's input: a snapshot of the cluster, built by the controller
//! from the store (or by the simulator from its model). Plain data, sorted
//! by name, so that planning is deterministic.

use chrono::{DateTime, Utc};

use ballast::model::{DataLocality, ReplicaMode, VolumeAutoBalance};

/// Everything the planner looks at.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterView {
    /// Sorted by id.
    pub nodes: Vec<NodeView>,
    /// Sorted by name.
    pub volumes: Vec<VolumeView>,
    /// Sorted by name.
    pub replicas: Vec<ReplicaView>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct NodeView {
    pub id: String,
    pub zone: String,
    pub tags: Vec<String>,
    pub ready: bool,
    pub allow_scheduling: bool,
    pub eviction_requested: bool,
    pub cordoned: bool,
    /// Status as last recorded, so that the planner only reports changes.
    pub auto_evicting: bool,
    pub drain_blocked: bool,
    pub drain_blocked_reason: Option<String>,
    /// Sorted by id.
    pub disks: Vec<DiskView>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DiskView {
    pub id: String,
    pub tags: Vec<String>,
    pub ready: bool,
    pub allow_scheduling: bool,
    pub eviction_requested: bool,
    /// Bytes of the filesystem.
    pub maximum: u64,
    /// Bytes free on the filesystem now.
    pub available: u64,
    /// Bytes the operator keeps free.
    pub reserved: u64,
}

impl NodeView {
    /// A ready, schedulable node with no disks and nothing recorded: how
    /// tests and benchmarks start a node.
    pub fn healthy(id: &str, zone: &str) -> NodeView {
        NodeView {
            id: id.into(),
            zone: zone.into(),
            tags: vec![],
            ready: true,
            allow_scheduling: true,
            eviction_requested: false,
            cordoned: false,
            auto_evicting: false,
            drain_blocked: false,
            drain_blocked_reason: None,
            disks: vec![],
        }
    }
}

impl DiskView {
    /// A ready, schedulable disk of `maximum` bytes with `available` free.
    pub fn healthy(id: &str, maximum: u64, available: u64) -> DiskView {
        DiskView {
            id: id.into(),
            tags: vec![],
            ready: true,
            allow_scheduling: true,
            eviction_requested: false,
            maximum,
            available,
            reserved: 0,
        }
    }

    /// Bytes in use, as a share of the maximum, in percent.
    pub fn used_percent(&self) -> u64 {
        used_percent(self.maximum, self.available, self.reserved)
    }
}

/// Bytes in use (what is not available, plus what the operator reserves)
/// as a share of `maximum`, in percent; 100 for an unmeasured disk.
pub fn used_percent(maximum: u64, available: u64, reserved: u64) -> u64 {
    if maximum == 0 {
        return 100;
    }
    let used = maximum.saturating_sub(available) + reserved;
    used.saturating_mul(100) / maximum
}

#[derive(Clone, Debug, PartialEq)]
pub struct VolumeView {
    pub name: String,
    /// Bytes; what a replica is scheduled for.
    pub size: u64,
    /// Bytes a replica actually holds now (what a move copies).
    pub actual_size: u64,
    pub number_of_replicas: u32,
    /// None follows the setting.
    pub data_locality: Option<DataLocality>,
    pub auto_balance: VolumeAutoBalance,
    /// Minutes.
    pub stale_replica_timeout: u64,
    pub disk_selector: Vec<String>,
    pub node_selector: Vec<String>,
    /// The only node a strict-local volume's replica may live on.
    pub pinned_node: Option<String>,
    /// The node the volume is attached to (its engine runs there).
    pub attached_node: Option<String>,
    pub last_degraded_at: Option<DateTime<Utc>>,
}

impl VolumeView {
    /// A detached volume of `size` bytes (all of them written) with
    /// `replicas` replicas and the default policies: how tests and
    /// benchmarks start a volume.
    pub fn plain(name: &str, size: u64, replicas: u32) -> VolumeView {
        VolumeView {
            name: name.into(),
            size,
            actual_size: size,
            number_of_replicas: replicas,
            data_locality: None,
            auto_balance: VolumeAutoBalance::Ignored,
            stale_replica_timeout: 2880,
            disk_selector: vec![],
            node_selector: vec![],
            pinned_node: None,
            attached_node: None,
            last_degraded_at: None,
        }
    }

    /// Attached volumes run; only they can rebuild by a pressure move.
    pub fn running(&self) -> bool {
        self.attached_node.is_some()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ReplicaView {
    pub name: String,
    pub volume: String,
    pub node: String,
    pub disk: String,
    /// None: created, not yet opened by an engine.
    pub mode: Option<ReplicaMode>,
    pub running: bool,
    pub eviction_requested: bool,
    pub rebuild_retry_count: u32,
    pub failed_at: Option<DateTime<Utc>>,
    /// When it last became rw; None for a replica that never held data.
    pub healthy_at: Option<DateTime<Utc>>,
}

impl ReplicaView {
    /// Replica `name` of `volume` on `node`/`disk` in `mode`, healthy
    /// since `at` (failed then, when `mode` is err): how tests and
    /// benchmarks place a replica.
    pub fn placed(
        (name, volume): (&str, &str),
        (node, disk): (&str, &str),
        mode: ReplicaMode,
        at: DateTime<Utc>,
    ) -> ReplicaView {
        ReplicaView {
            name: name.into(),
            volume: volume.into(),
            node: node.into(),
            disk: disk.into(),
            mode: Some(mode),
            running: mode != ReplicaMode::Err,
            eviction_requested: false,
            rebuild_retry_count: 0,
            failed_at: (mode == ReplicaMode::Err).then_some(at),
            healthy_at: Some(at),
        }
    }

    pub fn is_rw(&self) -> bool {
        self.mode == Some(ReplicaMode::Rw)
    }

    pub fn is_failed(&self) -> bool {
        self.mode == Some(ReplicaMode::Err) || self.failed_at.is_some()
    }

    /// Being filled: wo, or created and not opened yet.
    pub fn is_rebuilding(&self) -> bool {
        !self.is_failed() && !self.is_rw()
    }

    /// Has ever held the volume's data.
    pub fn held_data(&self) -> bool {
        self.healthy_at.is_some()
    }
}
