//! Unit tests of the planner on hand-built views: each rule's lesson.

use ballast::model::{ReplicaMode, VolumeAutoBalance};
use ballast::settings::Settings;
use chrono::{DateTime, TimeZone, Utc};

use super::*;

const GIB: u64 = 1 << 30;

fn t0() -> DateTime<Utc> {
    Utc.timestamp_opt(1_700_000_000, 0).single().unwrap()
}

struct Builder {
    view: ClusterView,
}

fn cluster() -> Builder {
    Builder {
        view: ClusterView::default(),
    }
}

impl Builder {
    fn node(mut self, id: &str, zone: &str) -> Self {
        self.view.nodes.push(NodeView::healthy(id, zone));
        self
    }

    fn disk(mut self, id: &str, size_gib: u64, free_gib: u64) -> Self {
        let n = self.view.nodes.last_mut().unwrap();
        n.disks
            .push(DiskView::healthy(id, size_gib * GIB, free_gib * GIB));
        self
    }

    fn cordoned(mut self) -> Self {
        self.view.nodes.last_mut().unwrap().cordoned = true;
        self
    }

    fn volume(mut self, name: &str, size_gib: u64, replicas: u32) -> Self {
        self.view
            .volumes
            .push(VolumeView::plain(name, size_gib * GIB, replicas));
        self
    }

    fn with(mut self, f: impl FnOnce(&mut VolumeView)) -> Self {
        f(self.view.volumes.last_mut().unwrap());
        self
    }

    fn replica(mut self, name: &str, node: &str, disk: &str, mode: ReplicaMode) -> Self {
        let volume = self.view.volumes.last().unwrap().name.clone();
        self.view.replicas.push(ReplicaView::placed(
            (name, &volume),
            (node, disk),
            mode,
            t0(),
        ));
        self
    }

    fn build(mut self) -> ClusterView {
        self.view.nodes.sort_by(|a, b| a.id.cmp(&b.id));
        self.view.volumes.sort_by(|a, b| a.name.cmp(&b.name));
        self.view.replicas.sort_by(|a, b| a.name.cmp(&b.name));
        self.view
    }
}

fn settings(pairs: &[(&str, &str)]) -> Settings {
    Settings::from_overrides(pairs.iter().copied())
}

fn creates(plan: &Plan) -> Vec<(String, String, String)> {
    plan.actions
        .iter()
        .filter_map(|a| match &a.kind {
            ActionKind::CreateReplica {
                volume, node, disk, ..
            } => Some((volume.clone(), node.clone(), disk.clone())),
            _ => None,
        })
        .collect()
}

fn deletes(plan: &Plan) -> Vec<String> {
    plan.actions
        .iter()
        .filter_map(|a| match &a.kind {
            ActionKind::DeleteReplica { replica, .. } => Some(replica.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn placements_in_one_pass_reserve_capacity_for_each_other() {
    // One 100Gi disk with 60Gi free: the 25% minimum leaves room for one
    // 30Gi replica, not two, even though each fits alone.
    let view = cluster()
        .node("n1", "z1")
        .disk("d1", 100, 60)
        .volume("a", 30, 1)
        .volume("b", 30, 1)
        .build();
    let plan = plan(&view, &Settings::default(), t0());
    assert_eq!(creates(&plan), [("a".into(), "n1".into(), "d1".into())]);
    let why = &plan.blocked[0].reason;
    assert!(
        why.contains("n1/d1") && why.contains("minimum 25%"),
        "a reason per disk, not 'insufficient storage': {why}"
    );
}

#[test]
fn placement_prefers_unused_zones_then_the_most_free_share_then_names() {
    let view = cluster()
        .node("n1", "z1")
        .disk("d1", 100, 50)
        .node("n2", "z1")
        .disk("d1", 100, 90)
        .node("n3", "z2")
        .disk("d1", 100, 40)
        .volume("v", 1, 2)
        .build();
    let plan = plan(&view, &Settings::default(), t0());
    let mut got = creates(&plan);
    got.sort();
    // z1's best node (n2, most free) and z2's only node.
    assert_eq!(
        got,
        [
            ("v".into(), "n2".into(), "d1".into()),
            ("v".into(), "n3".into(), "d1".into())
        ]
    );
}

#[test]
fn planning_twice_gives_the_same_plan() {
    let view = cluster()
        .node("n1", "z1")
        .disk("d1", 100, 90)
        .node("n2", "z2")
        .disk("d1", 100, 90)
        .volume("v", 1, 3)
        .replica("r1", "n1", "d1", ReplicaMode::Rw)
        .build();
    let s = settings(&[("replica-soft-anti-affinity", "true")]);
    assert_eq!(plan(&view, &s, t0()), plan(&view, &s, t0()));
}

#[test]
fn a_cordoned_node_with_a_running_replica_counts_as_used_by_balance() {
    // v has replicas on n1 (cordoned) and n2; n3 is free. Moving off n1
    // would be undone when n1 is uncordoned: balance leaves it alone.
    let view = cluster()
        .node("n1", "z1")
        .disk("d1", 100, 90)
        .cordoned()
        .node("n2", "z1")
        .disk("d1", 100, 90)
        .node("n3", "z1")
        .disk("d1", 100, 90)
        .volume("v", 1, 2)
        .replica("r1", "n1", "d1", ReplicaMode::Rw)
        .replica("r2", "n2", "d1", ReplicaMode::Rw)
        .build();
    let s = settings(&[("replica-auto-balance", "best-effort")]);
    assert!(plan(&view, &s, t0()).changes().next().is_none());
}

#[test]
fn the_local_replica_is_never_a_balance_victim() {
    // v wants 2, has 3 rw: one on the attached node n3 and two elsewhere.
    let view = cluster()
        .node("n1", "z1")
        .disk("d1", 100, 90)
        .node("n2", "z1")
        .disk("d1", 100, 90)
        .node("n3", "z1")
        .disk("d1", 100, 10)
        .volume("v", 1, 2)
        .with(|v| {
            v.attached_node = Some("n3".into());
            v.data_locality = Some(ballast::model::DataLocality::BestEffort);
        })
        .replica("r1", "n1", "d1", ReplicaMode::Rw)
        .replica("r2", "n2", "d1", ReplicaMode::Rw)
        .replica("r3", "n3", "d1", ReplicaMode::Rw)
        .build();
    let p = plan(&view, &Settings::default(), t0());
    let gone = deletes(&p);
    assert_eq!(gone.len(), 1);
    assert_ne!(
        gone[0], "r3",
        "the local replica stays, though its disk is the fullest"
    );
}

#[test]
fn the_last_healthy_replica_is_never_deleted_even_when_stale_peers_are() {
    let view = cluster()
        .node("n1", "z1")
        .disk("d1", 100, 90)
        .volume("v", 1, 1)
        .with(|v| v.stale_replica_timeout = 1)
        .replica("r1", "n1", "d1", ReplicaMode::Err)
        .build();
    let p = plan(
        &view,
        &Settings::default(),
        t0() + chrono::Duration::hours(1),
    );
    assert!(
        deletes(&p).is_empty(),
        "a failed replica that is the only copy stays"
    );
}

#[test]
fn reuse_comes_before_a_new_replica_and_waiting_before_both_when_the_node_is_down() {
    let base = cluster()
        .node("n1", "z1")
        .disk("d1", 100, 90)
        .node("n2", "z2")
        .disk("d1", 100, 90)
        .node("n3", "z3")
        .disk("d1", 100, 90)
        .volume("v", 1, 2)
        .with(|v| v.last_degraded_at = Some(t0()))
        .replica("r1", "n1", "d1", ReplicaMode::Rw)
        .replica("r2", "n2", "d1", ReplicaMode::Err);
    // n2 is up: reuse r2 in place.
    let view = base.build();
    let p = plan(&view, &Settings::default(), t0());
    let reuse: Vec<_> = p.actions.iter().filter(|a| a.rule == Rule::Reuse).collect();
    assert_eq!(reuse.len(), 1, "{p:?}");
    assert!(creates(&p).iter().all(|(_, n, _)| n == "n2"));
    // n2 down: wait rather than build on n3.
    let mut view = view;
    view.nodes[1].ready = false;
    let p = plan(
        &view,
        &Settings::default(),
        t0() + chrono::Duration::seconds(10),
    );
    assert!(creates(&p).is_empty());
    assert_eq!(p.waits.len(), 1);
    assert_eq!(p.waits[0].until, t0() + chrono::Duration::seconds(600));
    // Past the interval: a new replica on n3.
    let p = plan(
        &view,
        &Settings::default(),
        t0() + chrono::Duration::seconds(601),
    );
    assert_eq!(creates(&p), [("v".into(), "n3".into(), "d1".into())]);
}

#[test]
fn reuse_backoff_grows_from_one_to_three_minutes() {
    assert_eq!(reuse::backoff(0).num_seconds(), 0);
    assert_eq!(reuse::backoff(1).num_seconds(), 60);
    assert_eq!(reuse::backoff(2).num_seconds(), 120);
    assert_eq!(reuse::backoff(3).num_seconds(), 180);
    assert_eq!(reuse::backoff(9).num_seconds(), 180);
}

#[test]
fn the_rebuild_limit_caps_rebuilds_per_node_and_zero_stops_them() {
    // Three degraded volumes whose only candidate is n2.
    let mut b = cluster()
        .node("n1", "z1")
        .disk("d1", 1000, 900)
        .node("n2", "z1")
        .disk("d1", 1000, 900);
    for v in ["a", "b", "c"] {
        b = b
            .volume(v, 1, 2)
            .replica(&format!("{v}-1"), "n1", "d1", ReplicaMode::Rw);
    }
    let view = b.build();
    let p = plan(
        &view,
        &settings(&[("concurrent-replica-rebuild-per-node-limit", "2")]),
        t0(),
    );
    assert_eq!(creates(&p).len(), 2);
    let p = plan(
        &view,
        &settings(&[("concurrent-replica-rebuild-per-node-limit", "0")]),
        t0(),
    );
    assert!(creates(&p).is_empty());
    assert!(
        p.blocked
            .iter()
            .all(|b| b.reason.contains("rebuilds are stopped"))
    );
}

#[test]
fn every_action_says_its_rule_and_why() {
    let view = cluster()
        .node("n1", "z1")
        .disk("d1", 100, 90)
        .volume("v", 1, 1)
        .build();
    let p = plan(&view, &Settings::default(), t0());
    assert!(!p.actions.is_empty());
    for a in &p.actions {
        assert!(!a.reason.is_empty(), "{a:?}");
    }
    let json = serde_json::to_value(&p.actions[0]).unwrap();
    assert_eq!(json["rule"], "schedule");
    assert_eq!(json["type"], "createReplica");
}

#[test]
fn an_evicted_replica_is_deleted_before_its_replacement_even_when_balance_would_object() {
    // r1 on n1 is evicted; its replacement r3 went to zone z2 while n4 (z1)
    // was closed. n4 is open now. Deleting r1 leaves z1 empty, which
    // least-effort balance will fix later; deleting the replacement instead
    // would loop for ever (found by the property tests).
    let mut view = cluster()
        .node("n1", "z1")
        .disk("d1", 100, 90)
        .node("n2", "z2")
        .disk("d1", 100, 90)
        .node("n3", "z2")
        .disk("d1", 100, 90)
        .node("n4", "z1")
        .disk("d1", 100, 90)
        .volume("v", 1, 2)
        .with(|v| v.auto_balance = VolumeAutoBalance::LeastEffort)
        .replica("r1", "n1", "d1", ReplicaMode::Rw)
        .replica("r2", "n2", "d1", ReplicaMode::Rw)
        .replica("r3", "n3", "d1", ReplicaMode::Rw)
        .build();
    view.nodes[0].eviction_requested = true;
    view.replicas[0].eviction_requested = true;
    let s = settings(&[("replica-soft-anti-affinity", "true")]);
    assert_eq!(deletes(&plan(&view, &s, t0())), ["r1"]);
}

#[test]
fn balance_never_moves_a_replica_onto_a_disk_it_would_pressure() {
    // Both replicas sit on n1; zone z2 is free but n2's disk is 92% used.
    // Moving there would only make the pressure rule move it back.
    let view = cluster()
        .node("n1", "z1")
        .disk("d1", 100, 80)
        .node("n2", "z2")
        .disk("d1", 100, 8)
        .volume("v", 1, 2)
        .replica("r1", "n1", "d1", ReplicaMode::Rw)
        .replica("r2", "n1", "d1", ReplicaMode::Rw)
        .build();
    let s = settings(&[
        ("replica-auto-balance", "best-effort"),
        ("replica-soft-anti-affinity", "true"),
        ("storage-minimal-available-percentage", "0"),
    ]);
    let p = plan(&view, &s, t0());
    assert!(creates(&p).is_empty(), "{p:?}");
}

#[test]
fn cleanup_does_not_undo_a_balance_move_because_the_target_looks_full_with_it() {
    // best-effort moved one of n1's three replicas to n3 (its only disk);
    // n3's disk now looks too full for another replica. Deleting the new
    // one would free that space and make balance move it again, for ever.
    let view = cluster()
        .node("n1", "z1")
        .disk("d1", 100, 46)
        .disk("d2", 100, 46)
        .disk("d3", 100, 46)
        .node("n3", "z1")
        .disk("d1", 50, 18)
        .volume("v", 9, 4)
        .replica("r1", "n1", "d1", ReplicaMode::Rw)
        .replica("r2", "n1", "d2", ReplicaMode::Rw)
        .replica("r3", "n1", "d3", ReplicaMode::Rw)
        .replica("r4", "n3", "d1", ReplicaMode::Rw)
        .replica("r5", "n3", "d1", ReplicaMode::Rw)
        .build();
    let s = settings(&[
        ("replica-auto-balance", "best-effort"),
        ("replica-soft-anti-affinity", "true"),
        ("replica-auto-balance-disk-pressure-percentage", "68"),
        ("storage-minimal-available-percentage", "10"),
    ]);
    let gone = deletes(&plan(&view, &s, t0()));
    assert_eq!(gone.len(), 1);
    assert!(
        gone[0] == "r1" || gone[0] == "r2" || gone[0] == "r3",
        "deleted {gone:?}, not one of n1's"
    );
}

#[test]
fn cleanup_keeps_the_local_copy_that_disk_pressure_made_not_its_pressured_source() {
    // v (best-effort locality, attached to n1) had its local replica r1 on
    // n1/d1, which is 70% used; disk pressure copied it to n1/d2. With 3 rw
    // replicas for 2, the source on the pressured disk goes, not the copy
    // (deleting the copy would make pressure copy it again, for ever).
    let view = cluster()
        .node("n1", "z1")
        .disk("d1", 100, 30)
        .disk("d2", 100, 60)
        .node("n2", "z2")
        .disk("d1", 100, 60)
        .volume("v", 1, 2)
        .with(|v| {
            v.data_locality = Some(ballast::model::DataLocality::BestEffort);
            v.attached_node = Some("n1".into());
            v.auto_balance = VolumeAutoBalance::BestEffort;
        })
        .replica("r1", "n1", "d1", ReplicaMode::Rw)
        .replica("r2", "n2", "d1", ReplicaMode::Rw)
        .replica("r3", "n1", "d2", ReplicaMode::Rw)
        .build();
    let s = settings(&[
        ("replica-soft-anti-affinity", "true"),
        ("replica-auto-balance-disk-pressure-percentage", "68"),
        ("storage-minimal-available-percentage", "10"),
    ]);
    assert_eq!(deletes(&plan(&view, &s, t0())), ["r1"]);
}

#[test]
fn growth_is_checked_on_every_replica_disk_with_the_placement_rules() {
    // v (10 GiB, 2 replicas) on n1/d1 (100 GiB, 40 free) and n2/d1 (100
    // GiB, 90 free). Growing to 30 GiB takes 20 more on each: n1/d1 would
    // keep 20 of 100 free, under the 25% minimum.
    let view = cluster()
        .node("n1", "z1")
        .disk("d1", 100, 40)
        .node("n2", "z2")
        .disk("d1", 100, 90)
        .volume("v", 10, 2)
        .replica("r1", "n1", "d1", ReplicaMode::Rw)
        .replica("r2", "n2", "d1", ReplicaMode::Rw)
        .build();
    let s = settings(&[("storage-minimal-available-percentage", "25")]);
    let v = view.volumes[0].clone();
    let reasons = growth::check(&view, &s, t0(), &v, 30 * GIB).unwrap_err();
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(
        reasons[0].starts_with(
            "replica r1: n1/d1: 20% free after placement, minimum 25% (setting storage-minimal-available-percentage)"
        ),
        "{reasons:?}"
    );
    assert_eq!(growth::check(&view, &s, t0(), &v, 20 * GIB), Ok(()));
    // Two replicas on one disk grow there together: 2 x 10 more of 40 free.
    let mut two = view.clone();
    two.replicas[1].node = "n1".into();
    let reasons = growth::check(&two, &s, t0(), &v, 20 * GIB).unwrap_err();
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(reasons[0].starts_with("replica r2: n1/d1"), "{reasons:?}");
}

#[test]
fn a_failed_replica_on_a_full_disk_waits_for_space_before_reuse() {
    let mut view = cluster()
        .node("n1", "z1")
        .disk("d1", 100, 50)
        .node("n2", "z2")
        .disk("d1", 100, 0)
        .volume("v", 1, 2)
        .with(|v| v.last_degraded_at = Some(t0()))
        .replica("r1", "n1", "d1", ReplicaMode::Rw)
        .replica("r2", "n2", "d1", ReplicaMode::Err)
        .build();
    let s = settings(&[("storage-minimal-available-percentage", "0")]);
    let p = plan(&view, &s, t0());
    assert!(creates(&p).is_empty(), "{p:?}");
    assert!(p.waits.iter().any(|w| w.what.contains("is full")), "{p:?}");
    // Space is back: reused in place.
    view.nodes[1].disks[0].available = 10 * GIB;
    let p = plan(&view, &s, t0());
    assert_eq!(creates(&p), [("v".into(), "n2".into(), "d1".into())]);
}

#[test]
fn a_pinned_strict_local_volume_is_placed_on_its_node_only() {
    // n2 has the most room, but the volume lives on n1.
    let view = cluster()
        .node("n1", "z1")
        .disk("d1", 100, 50)
        .node("n2", "z2")
        .disk("d1", 100, 95)
        .volume("v", 1, 1)
        .with(|v| {
            v.data_locality = Some(ballast::model::DataLocality::StrictLocal);
            v.pinned_node = Some("n1".into());
        })
        .build();
    let plan = plan(&view, &Settings::default(), t0());
    assert_eq!(creates(&plan), [("v".into(), "n1".into(), "d1".into())]);

    // Its node down: nowhere else, and the plan says why.
    let mut view = view;
    view.nodes[0].ready = false;
    let plan = super::plan(&view, &Settings::default(), t0());
    assert!(creates(&plan).is_empty(), "{plan:?}");
    let why = &plan.blocked[0].reason;
    assert!(
        why.contains("n2: the strict-local volume v lives on n1 only")
            && why.contains("n1: not ready"),
        "{why}"
    );
}

#[test]
fn an_attached_volume_whose_engine_node_is_down_gets_no_new_replica_and_says_why() {
    // v lost its replica on n3; its engine runs on n1, which is down.
    let view = cluster()
        .node("n1", "z1")
        .disk("d1", 100, 90)
        .node("n2", "z2")
        .disk("d1", 100, 90)
        .node("n3", "z3")
        .disk("d1", 100, 90)
        .node("n4", "z1")
        .disk("d1", 100, 90)
        .volume("v", 1, 3)
        .with(|v| v.attached_node = Some("n1".into()))
        .replica("v-a", "n1", "d1", ReplicaMode::Rw)
        .replica("v-b", "n2", "d1", ReplicaMode::Rw)
        .build();
    let mut view = view;
    view.nodes[0].ready = false;
    let plan = plan(&view, &Settings::default(), t0());
    assert!(creates(&plan).is_empty(), "{plan:?}");
    assert!(
        plan.blocked
            .iter()
            .any(|b| b.object == "volume/v"
                && b.reason.contains("attached to n1, which is not ready")),
        "{plan:?}"
    );
    // Back: the replica is rebuilt.
    view.nodes[0].ready = true;
    let plan = super::plan(&view, &Settings::default(), t0());
    assert_eq!(creates(&plan).len(), 1, "{plan:?}");
}

/// Found by the fault soak of 2026-12-02 (seed 20261210, moves schedule
/// 25): a failed replica on a node that holds another, rw, replica of the
/// volume can never be reused there (hard anti-affinity), yet it stayed
/// for the whole stale timeout (two days), its disk space with it. Once
/// the volume has every rw replica it wants it goes at once; a failed
/// replica elsewhere, one the volume still needs, or one that soft
/// anti-affinity could reuse, stays.
#[test]
fn a_failed_replica_beside_an_rw_one_of_a_whole_volume_goes_at_once() {
    let base = || {
        cluster()
            .node("n1", "z1")
            .disk("d1", 100, 90)
            .node("n2", "z2")
            .disk("d1", 100, 90)
            .node("n3", "z3")
            .disk("d1", 100, 90)
            .volume("v", 1, 2)
    };
    let whole = base()
        .replica("r1", "n1", "d1", ReplicaMode::Rw)
        .replica("r2", "n2", "d1", ReplicaMode::Rw)
        .replica("r3", "n1", "d1", ReplicaMode::Err)
        .build();
    let p = plan(&whole, &Settings::default(), t0());
    assert_eq!(deletes(&p), ["r3"], "{p:?}");
    let s = settings(&[("replica-soft-anti-affinity", "true")]);
    assert!(
        deletes(&plan(&whole, &s, t0())).is_empty(),
        "it may be reused"
    );
    // On a node of its own it may be reused if another fails: it stays.
    let elsewhere = base()
        .replica("r1", "n1", "d1", ReplicaMode::Rw)
        .replica("r2", "n2", "d1", ReplicaMode::Rw)
        .replica("r3", "n3", "d1", ReplicaMode::Err)
        .build();
    assert!(deletes(&plan(&elsewhere, &Settings::default(), t0())).is_empty());
    // The volume short of an rw replica: nothing failed goes.
    let short = base()
        .replica("r1", "n1", "d1", ReplicaMode::Rw)
        .replica("r3", "n1", "d1", ReplicaMode::Err)
        .build();
    assert!(deletes(&plan(&short, &Settings::default(), t0())).is_empty());
}
