//! Observing: the planner's view of the cluster, built from the records
//! (the context's copy of them, `mirror`, or a list of them). The
//! reconcile loop plans on it; `GET /v1/plan` shows the plan; the
//! simulator plans on it too. `view_of` is the one way a view is built.

use ballast::model::{Node, Replica, ReplicaMode, Volume};
use ballast::store::Store;

use crate::context::Context;
use crate::error::Error;
use crate::mirror::Mirror;
use crate::planner::{ClusterView, DiskView, NodeView, ReplicaView, VolumeView};

pub fn node_view(n: &Node) -> NodeView {
    let mut disks: Vec<DiskView> = n
        .spec
        .disks
        .iter()
        .map(|(id, spec)| {
            let st = n.status.disks.get(id).cloned().unwrap_or_default();
            DiskView {
                id: id.clone(),
                tags: spec.tags.clone(),
                ready: st.ready,
                allow_scheduling: spec.allow_scheduling,
                eviction_requested: spec.eviction_requested,
                maximum: st.storage_maximum,
                available: st.storage_available,
                reserved: spec.storage_reserved,
            }
        })
        .collect();
    disks.sort_by(|a, b| a.id.cmp(&b.id));
    NodeView {
        id: n.id.clone(),
        zone: n.spec.zone.clone(),
        tags: n.spec.tags.clone(),
        ready: n.status.ready,
        allow_scheduling: n.spec.allow_scheduling,
        eviction_requested: n.spec.eviction_requested,
        cordoned: n.status.cordoned,
        auto_evicting: n.status.auto_evicting,
        drain_blocked: n.status.drain_blocked,
        drain_blocked_reason: n.status.drain_blocked_reason.clone(),
        disks,
    }
}

pub fn volume_view(v: &Volume) -> VolumeView {
    VolumeView {
        name: v.name.clone(),
        size: v.spec.size,
        // Until the data plane reports real usage, assume full.
        actual_size: v.status.actual_size.unwrap_or(v.spec.size),
        number_of_replicas: v.spec.number_of_replicas,
        data_locality: v.spec.data_locality,
        auto_balance: v.spec.replica_auto_balance,
        stale_replica_timeout: v.spec.stale_replica_timeout,
        disk_selector: v.spec.disk_selector.clone(),
        node_selector: v.spec.node_selector.clone(),
        pinned_node: v.spec.pinned_node.clone(),
        attached_node: v.status.attached_node.clone(),
        last_degraded_at: v.status.last_degraded_at,
    }
}

pub fn replica_view(r: &Replica) -> ReplicaView {
    ReplicaView {
        name: r.name.clone(),
        volume: r.spec.volume.clone(),
        node: r.spec.node_id.clone(),
        disk: r.spec.disk_id.clone(),
        mode: r.status.mode,
        running: r.status.running,
        eviction_requested: r.spec.eviction_requested,
        rebuild_retry_count: r.spec.rebuild_retry_count,
        failed_at: r.spec.failed_at,
        healthy_at: r.spec.healthy_at,
    }
}

/// The whole view, from the store, sorted as the planner expects.
pub async fn cluster_view(store: &dyn Store) -> Result<ClusterView, Error> {
    // The store lists by name, which is the order the planner wants.
    Ok(view_of(
        &store.list::<Node>().await?,
        &store.list::<Volume>().await?,
        &store.list::<Replica>().await?,
    ))
}

/// The view as the context's copy of the records has it, brought up to
/// date first: what a call plans on (placing a volume, growing one, the
/// plan `GET /v1/plan` shows) without reading the whole store.
pub async fn current_view(ctx: &Context) -> Result<ClusterView, Error> {
    let mirror = ctx.records().await?;
    Ok(mirrored_view(&mirror))
}

/// The view of the records in `mirror` as of its last refresh.
pub fn mirrored_view(mirror: &Mirror) -> ClusterView {
    view_of(mirror.nodes(), mirror.volumes(), mirror.replicas())
}

/// The view of these records (each list sorted by name): the one way the
/// planner's view is built, for the controller (from its store) and for
/// the simulator (from its model). A replica outside its volume's record
/// of who holds the latest data is failed, whatever its last report said:
/// it must be rebuilt, never copied from; one in it that no engine has
/// opened yet is rw.
pub fn view_of<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    volumes: impl IntoIterator<Item = &'a Volume>,
    replicas: impl IntoIterator<Item = &'a Replica>,
) -> ClusterView {
    let volumes: Vec<&Volume> = volumes.into_iter().collect();
    // Each replica's volume, to tell a current replica from a stale one:
    // sought where the last one's was, or just after it (the store lists
    // a volume's replicas together, in its volumes' order: a replica is
    // named after its volume), and looked up by name only when it is not
    // there, in an index built then.
    let mut by_name: Option<rustc_hash::FxHashMap<&str, usize>> = None;
    let mut cursor = 0usize;
    let mut volume_of = |name: &str| -> Option<&Volume> {
        for i in [cursor, cursor + 1] {
            if volumes.get(i).is_some_and(|v| v.name == name) {
                cursor = i;
                return volumes.get(i).copied();
            }
        }
        let index = by_name.get_or_insert_with(|| {
            volumes
                .iter()
                .enumerate()
                .map(|(i, v)| (v.name.as_str(), i))
                .collect()
        });
        let i = *index.get(name)?;
        cursor = i;
        volumes.get(i).copied()
    };
    let replicas = replicas
        .into_iter()
        .map(|r| {
            let mut view = replica_view(r);
            let current =
                volume_of(&r.spec.volume).map(|v| crate::freshness::is_current(v, &r.name));
            if current == Some(false) && view.mode == Some(ReplicaMode::Rw) {
                view.mode = Some(ReplicaMode::Err);
                view.failed_at = view.failed_at.or(view.healthy_at);
            }
            // A current replica that no engine has opened yet (a new
            // volume's, or one made for a volume that never held data)
            // holds all the data there is: nothing is filling it, so it
            // counts as rw, and a lowered replica count or a balance move
            // reaches the volume before its first attach.
            if current == Some(true) && view.mode.is_none() && view.failed_at.is_none() {
                view.mode = Some(ReplicaMode::Rw);
            }
            view
        })
        .collect();
    ClusterView {
        nodes: nodes.into_iter().map(node_view).collect(),
        volumes: volumes.into_iter().map(volume_view).collect(),
        replicas,
    }
}

#[cfg(test)]
mod tests {
    use ballast::model::VolumeSpec;

    use super::*;
    use crate::executor::effects;

    fn volume(name: &str, current: &[&str]) -> Volume {
        let mut v = Volume {
            name: name.into(),
            resource_version: 0,
            spec: VolumeSpec::new(1 << 30, 2),
            status: Default::default(),
        };
        v.status.generation = 1;
        v.status.current_replicas = current.iter().map(|c| c.to_string()).collect();
        v
    }

    /// A replica outside its volume's record is failed in the view, and one
    /// in it is not, whatever order the replicas come in: together after
    /// their volume's (as the store lists them) or not.
    #[test]
    fn a_replica_outside_its_volumes_record_is_failed_in_any_order() {
        let volumes = [
            volume("a", &["a-r1"]),
            volume("b", &["b-r1"]),
            volume("c", &["c-r1", "c-r2"]),
        ];
        let rw = |name: &str, volume: &str| {
            effects::new_replica(name, volume, "n1", "d1", Some(ReplicaMode::Rw))
        };
        let listed = [
            rw("a-r1", "a"),
            rw("a-r2", "a"),
            rw("c-r1", "c"),
            rw("c-r2", "c"),
            rw("c-r3", "c"),
            rw("x-r1", "x"),
        ];
        let stale = ["a-r2", "c-r3"];
        let mut orders = vec![listed.to_vec()];
        orders.push(listed.iter().rev().cloned().collect());
        orders.push([3, 0, 5, 1, 4, 2].map(|i| listed[i].clone()).to_vec());
        for replicas in orders {
            let view = view_of(&[], &volumes, &replicas);
            for (r, v) in replicas.iter().zip(&view.replicas) {
                assert_eq!(r.name, v.name);
                let want = if stale.contains(&r.name.as_str()) {
                    ReplicaMode::Err
                } else {
                    ReplicaMode::Rw
                };
                assert_eq!(v.mode, Some(want), "{}", r.name);
            }
        }
    }

    /// A replica in its volume's record that no engine has opened yet
    /// holds all the data there is: rw in the view. Outside the record, or
    /// failed, it is not.
    #[test]
    fn a_current_replica_no_engine_opened_is_rw_in_the_view() {
        let volumes = [volume("v", &["v-r1", "v-r2"])];
        let unopened = |name: &str| effects::new_replica(name, "v", "n1", "d1", None);
        let mut failed = unopened("v-r2");
        failed.spec.failed_at = Some(chrono::Utc::now());
        let replicas = [unopened("v-r1"), failed, unopened("v-r3")];
        let view = view_of(&[], &volumes, &replicas);
        let mode = |i: usize| view.replicas[i].mode;
        assert_eq!(mode(0), Some(ReplicaMode::Rw));
        assert_eq!(mode(1), None);
        assert!(view.replicas[1].is_failed());
        assert_eq!(mode(2), None);
        assert!(view.replicas[2].is_rebuilding());
    }
}
