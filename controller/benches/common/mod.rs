//! Records the controller's benches build their clusters from.

use ballast::model::{DiskSpec, DiskStatus, Node, NodeSpec, NodeStatus};
use ballast::settings::Settings;
use chrono::{DateTime, Utc};

pub const GIB: u64 = 1 << 30;

/// The settings the benches plan with: best-effort balance, soft
/// anti-affinity.
pub fn settings() -> Settings {
    Settings::from_overrides([
        ("replica-auto-balance", "best-effort"),
        ("replica-soft-anti-affinity", "true"),
    ])
}

/// A ready, schedulable node `id` in `zone` with two disks, d0 and d1, of
/// 100,000 GiB with 60,000 free, last heard from at `heard`.
pub fn node(id: String, zone: String, heard: Option<DateTime<Utc>>) -> Node {
    Node {
        id,
        resource_version: 0,
        spec: NodeSpec {
            zone,
            tags: vec![],
            allow_scheduling: true,
            eviction_requested: false,
            disks: (0..2)
                .map(|d| {
                    (
                        format!("d{d}"),
                        DiskSpec::new(format!("/disks/{d}"), vec![]),
                    )
                })
                .collect(),
        },
        status: NodeStatus {
            ready: true,
            last_heartbeat: heard,
            disks: (0..2)
                .map(|d| {
                    let st = DiskStatus {
                        ready: true,
                        storage_maximum: 100_000 * GIB,
                        storage_available: 60_000 * GIB,
                        ..Default::default()
                    };
                    (format!("d{d}"), st)
                })
                .collect(),
            disk_count: 2,
            ..Default::default()
        },
    }
}
