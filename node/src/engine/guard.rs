//! Guarding a volume's last copy. While one rw replica holds the volume's
//! latest data and another replica of it exists that could give a copy (a
//! member dropped or being rebuilt, or a stale replica the controller
//! named), that replica syncs its checksums at every flush
//! (`Replica::set_sums_every_flush`): after a power cut, a block of it that
//! fails its checksum may then take a copy that matches the checksum on
//! the disk (`settle::from_stale`), where before it was served as it was.
//! It costs that replica's flushes one more sync, for as long as the
//! volume has only it. Every other rw replica is told to stop.
//!
//! It decides from the engine's members and whether it was told of stale
//! replicas, and does no I/O but the one call to each replica whose guard
//! changes; the members and their modes are the engine's.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use ballast::model::ReplicaMode;

use super::{Engine, Link};

/// Whether the one rw replica of a volume guards its checksums: with
/// exactly one rw replica, while another replica is known.
pub(super) fn guarded(rw: usize, others_known: bool) -> bool {
    rw == 1 && others_known
}

impl Engine {
    /// Each rw replica with its link, and whether it should guard.
    async fn guards(&self) -> Vec<(String, Link, bool)> {
        let m = self.members.lock().await;
        let rw: Vec<_> = m.iter().filter(|x| x.mode == ReplicaMode::Rw).collect();
        let others = m.len() > rw.len() || self.stale_known.load(Ordering::Acquire);
        let on = guarded(rw.len(), others);
        rw.iter()
            .filter_map(|x| x.link.clone().map(|l| (x.at.name.clone(), l, on)))
            .collect()
    }
}

/// Tells the engine's rw replicas whether to guard, once it knows of the
/// volume's stale replicas (`Engine::settle_from_stale`, which wakes it
/// first) and at every change of its members, for as long as it lives.
/// Every rw replica is told at the first pass (its mark may be an earlier
/// engine's), one turned rw again when it does, and one whose call
/// failed at the next change.
pub(super) async fn keep(engine: Weak<Engine>, wake: Arc<tokio::sync::Notify>) {
    let mut told: BTreeMap<String, bool> = BTreeMap::new();
    loop {
        wake.notified().await;
        let Some(e) = engine.upgrade() else {
            return;
        };
        let guards = e.guards().await;
        told.retain(|name, _| guards.iter().any(|(n, _, _)| n == name));
        for (name, link, on) in guards {
            if told.get(&name) == Some(&on) {
                continue;
            }
            match link.sums_every_flush(on).await {
                Ok(()) => {
                    tracing::info!(volume = %e.volume, replica = %name, on, "told whether to sync its checksums at every flush (on while it is the volume's only rw replica and another is known)");
                    told.insert(name, on);
                }
                Err(err) => {
                    told.remove(&name);
                    tracing::warn!(volume = %e.volume, replica = %name, on, error = %err, "cannot tell the replica whether to sync its checksums at every flush");
                }
            }
        }
        drop(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_lone_rw_replica_with_another_known_guards() {
        assert!(guarded(1, true));
        assert!(
            !guarded(1, false),
            "a volume of one replica: no copy to take"
        );
        assert!(!guarded(2, true), "another rw replica settles its blocks");
        assert!(!guarded(0, true));
    }
}
