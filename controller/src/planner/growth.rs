//! Growth (volume expansion): whether every disk holding a replica of a
//! volume can take that replica's growth, by the capacity rules placement
//! uses (`schedule::capacity_refusal`: the over-provisioning limit and the
//! free space left). An expansion is refused up front, with these reasons,
//! rather than failing on a node half-way.

use ballast::settings::Settings;
use chrono::{DateTime, Utc};

use super::pass::Pass;
use super::schedule;
use super::view::{ClusterView, VolumeView};

/// Ok when every replica of `volume` can grow from `volume.size` to
/// `new_size` bytes where it is; else why not, per replica.
pub fn check(
    view: &ClusterView,
    settings: &Settings,
    now: DateTime<Utc>,
    volume: &VolumeView,
    new_size: u64,
) -> Result<(), Vec<String>> {
    let extra = new_size.saturating_sub(volume.size);
    if extra == 0 {
        return Ok(());
    }
    let mut pass = Pass::new(view, settings, now);
    let mut reasons = Vec::new();
    for r in view.replicas.iter().filter(|r| r.volume == volume.name) {
        let (Some(node), Some(disk)) = (pass.node(&r.node), pass.disk(&r.node, &r.disk)) else {
            reasons.push(format!(
                "replica {}: its disk {}/{} is not known",
                r.name, r.node, r.disk
            ));
            continue;
        };
        match schedule::capacity_refusal(&pass, node, disk, extra) {
            Some(why) => reasons.push(format!("replica {}: {why}", r.name)),
            // Two replicas of the volume on one disk grow there together.
            None => pass.reserve(&r.node, &r.disk, extra, false),
        }
    }
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(reasons)
    }
}
