//! Who may serve: the record of which replicas hold a volume's latest
//! acknowledged data (`status.currentReplicas`), and its generation
//! (`status.generation`).
//!
//! - A new volume's replicas are all current (generation 1).
//! - A running engine changes the record (`record`, from the agent
//!   protocol's `RecordReplicaSet`) before it acknowledges a write that a
//!   replica it dropped lacks, and after a rebuilt replica caught up; a
//!   compare-and-set on the generation fences a stale engine.
//! - An engine is started only with current replicas (`serving`); when
//!   none is reachable the volume is faulted and the attach is refused,
//!   naming where the latest data is.
//! - A replica finished offline (detached volume) joins the record
//!   (`add_current`); a deleted one leaves it (`remove_current`).
//! - `salvage` makes one replica the whole record: an operator's explicit,
//!   logged acceptance of data loss.
//!
//! It decides nothing about placement and calls no node.

use std::sync::Arc;

use ballast::model::{Kind, Node, Replica, ReplicaMode, Robustness, Volume};

use crate::context::Context;
use crate::error::Error;

/// The replicas that hold the latest data: the record, or, for a volume
/// from before the record existed (generation 0), every replica.
pub fn current<'a>(volume: &Volume, replicas: &'a [Replica]) -> Vec<&'a Replica> {
    replicas
        .iter()
        .filter(|r| {
            r.spec.volume == volume.name
                && (volume.status.generation == 0
                    || volume.status.current_replicas.contains(&r.name))
        })
        .collect()
}

/// The records of the replicas that hold the latest data of `volume`, in
/// the record's order (by name): each read from the store by name, so that
/// attaching a volume, rebuilding a replica of it or snapshotting it reads
/// its own few records, however many volumes there are. A name whose record is gone, or is another volume's, is
/// left out. A volume from before the record (generation 0) lists every
/// replica, as `current` does.
pub async fn current_records(ctx: &Context, volume: &Volume) -> Result<Vec<Replica>, Error> {
    if volume.status.generation == 0 {
        let all: Vec<Replica> = ctx.store.list().await?;
        return Ok(current(volume, &all).into_iter().cloned().collect());
    }
    let mut out = Vec::with_capacity(volume.status.current_replicas.len());
    for name in &volume.status.current_replicas {
        if let Some(r) = ctx.store.get::<Replica>(name).await?
            && r.spec.volume == volume.name
        {
            out.push(r);
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Records what an engine reports as its set of replicas holding the
/// latest data. Refused (FAILED_PRECONDITION) when the engine's generation
/// is not the store's, the volume is not attached at its node, or the
/// engine was started for another attachment than the volume's latest
/// (`epoch`; 0, an engine from before the claim, is not checked): an
/// engine the node or the controller replaced never changes the record.
#[tracing::instrument(skip_all, fields(volume = %volume, node = %node, generation, epoch))]
pub async fn record(
    ctx: &Context,
    volume: &str,
    node: &str,
    (generation, epoch): (u64, u64),
    replicas: &[String],
    reason: &str,
) -> Result<u64, Error> {
    if replicas.is_empty() {
        return Err(Error::invalid(
            "replicas",
            "a replica set that holds the data is never empty",
        ));
    }
    for name in replicas {
        let known = ctx.store.get::<Replica>(name).await?;
        if known.is_none_or(|r| r.spec.volume != volume) {
            return Err(Error::invalid(
                "replicas",
                format!("{name} is not a replica of volume {volume}"),
            ));
        }
    }
    let mut set: Vec<String> = replicas.to_vec();
    set.sort();
    set.dedup();
    let before = ctx
        .store
        .fetch::<Volume>(volume)
        .await?
        .status
        .current_replicas;
    let mut degraded = None;
    let v = ctx.store.modify::<Volume, Error>(volume, |v| {
        degraded = None;
        if v.status.attached_node.as_deref() != Some(node) {
            return Err(Error::Unprocessable(format!(
                "volume {volume} is not attached at {node}: this engine is stale"
            )));
        }
        if epoch != 0 && v.status.engine_epoch != epoch {
            return Err(Error::Unprocessable(format!(
                "volume {volume}'s attachment is {}, not {epoch}: this engine is stale",
                v.status.engine_epoch
            )));
        }
        if v.status.generation != generation {
            return Err(Error::Unprocessable(format!(
                "volume {volume}'s replica set is at generation {}, not {generation}: this engine is stale",
                v.status.generation
            )));
        }
        // A replica dropped: the volume degraded now (the replenish wait
        // counts from here), unless it already was; and it says so now,
        // not at its engine's next report, when fewer than it wants are
        // left.
        let dropped = v.status.current_replicas.iter().any(|r| !set.contains(r));
        if dropped && v.status.robustness == Robustness::Healthy {
            v.status.last_degraded_at = Some(ctx.now());
            let now = Robustness::of(set.len(), v.spec.number_of_replicas as usize);
            if now == Robustness::Degraded {
                v.status.robustness = Robustness::Degraded;
                degraded = Some(v.spec.number_of_replicas);
            }
        }
        v.status.generation += 1;
        v.status.current_replicas = set.clone();
        Ok(true)
    }).await?;
    tracing::info!(generation = v.status.generation, replicas = ?set, reason, "replica set recorded");
    announce(ctx, volume, v.status.generation, &before, &set, reason).await;
    if let Some(wanted) = degraded {
        announce_robustness(ctx, volume, Robustness::Degraded, set.len(), wanted).await;
    }
    Ok(v.status.generation)
}

/// The event of a volume's robustness changed, and the count of rw
/// replicas it was judged on: one wording for a record that drops a
/// replica and for an engine's report.
pub async fn announce_robustness(
    ctx: &Context,
    volume: &str,
    now: Robustness,
    rw: usize,
    wanted: u32,
) {
    ctx.event(
        Kind::Volume,
        volume,
        "VolumeRobustness",
        format!("now {now}: {rw} of {wanted} replicas rw"),
    )
    .await;
}

/// A new record: the replicas that left it are failed, and an event says
/// who holds the latest data now, who did before, and why.
async fn announce(
    ctx: &Context,
    volume: &str,
    generation: u64,
    before: &[String],
    set: &[String],
    reason: &str,
) {
    mark_left(ctx, before, set).await;
    let was = if before.is_empty() {
        "not recorded".to_string()
    } else {
        before.join(", ")
    };
    let why = if reason.is_empty() {
        String::new()
    } else {
        format!("; {reason}")
    };
    ctx.event(
        Kind::Volume,
        volume,
        "ReplicaSetChanged",
        format!(
            "generation {generation}: {} hold the latest data (was {was}){why}",
            set.join(", ")
        ),
    )
    .await;
}

/// Replicas that left the record hold older data: failed, from now on,
/// whatever their last report said.
async fn mark_left(ctx: &Context, before: &[String], after: &[String]) {
    let now = ctx.now();
    for name in before.iter().filter(|n| !after.contains(n)) {
        let _ = ctx
            .store
            .modify::<Replica, Error>(name, |r| {
                if r.status.mode != Some(ReplicaMode::Rw) {
                    return Ok(false);
                }
                r.status.mode = Some(ReplicaMode::Err);
                r.status.running = false;
                r.spec.failed_at.get_or_insert(now);
                Ok(true)
            })
            .await;
    }
}

/// Whether `replica` may serve `volume`'s data: it is in the record (or
/// nothing is recorded yet).
pub fn is_current(volume: &Volume, replica: &str) -> bool {
    volume.status.generation == 0 || volume.status.current_replicas.iter().any(|r| r == replica)
}

/// What an engine is started with: the current replicas it can reach
/// (`NAME@ADDR`), and the record as the store has it.
pub struct Serving {
    pub replicas: Vec<String>,
    /// The volume's other replicas, which the record leaves out (`stale`).
    pub stale: Vec<String>,
    pub generation: u64,
    pub current: Vec<String>,
    /// The node of each current replica, as `current` lists them.
    pub nodes: Vec<String>,
    /// "NAME on NODE" of each current replica, for messages.
    pub holders: Vec<String>,
}

impl Serving {
    /// The first current replica on `node`, if any.
    pub fn on(&self, node: &str) -> Option<&str> {
        self.current
            .iter()
            .zip(&self.nodes)
            .find(|(_, n)| *n == node)
            .map(|(r, _)| r.as_str())
    }
}

/// A current replica an engine cannot be started with now.
struct Away {
    /// "NAME on NODE (why)", for the refusal.
    why: String,
    /// Its node, when the store knows it (and says it is not ready).
    down: Option<String>,
}

/// The current replicas an engine can be started with (`NAME@ADDR`), and
/// those it cannot.
async fn reach(ctx: &Context, current: &[Replica]) -> Result<(Vec<String>, Vec<Away>), Error> {
    let mut reachable = Vec::new();
    let mut away = Vec::new();
    for r in current {
        let node = &r.spec.node_id;
        match ctx.store.get::<Node>(node).await? {
            Some(n) if n.status.ready && !n.status.replica_endpoint.is_empty() => {
                reachable.push(format!("{}@{}", r.name, n.status.replica_endpoint));
            }
            Some(_) => away.push(Away {
                why: format!("{} on {node} (not ready)", r.name),
                down: Some(node.clone()),
            }),
            None => away.push(Away {
                why: format!("{} on {node} (unknown node)", r.name),
                down: None,
            }),
        }
    }
    Ok((reachable, away))
}

/// Marks the volume faulted, records why, and returns the refusal.
pub async fn fault(ctx: &Context, volume: &str, why: String) -> Error {
    let _ = ctx
        .store
        .modify::<Volume, Error>(volume, |v| {
            let changed = v.status.robustness != Robustness::Faulted;
            v.status.robustness = Robustness::Faulted;
            Ok(changed)
        })
        .await;
    ctx.event(Kind::Volume, volume, "VolumeFaulted", why.clone())
        .await;
    Error::Unprocessable(why)
}

/// The replicas an engine of `volume` may serve from: the current ones on
/// ready nodes. When there is none, the volume is marked faulted and the
/// error names where the latest data is.
pub async fn serving(ctx: &Context, volume: &Volume) -> Result<Serving, Error> {
    let current = current_records(ctx, volume).await?;
    let (mut reachable, mut away) = reach(ctx, &current).await?;
    // Nodes the store says are not ready may be back, unheard yet by a
    // controller that has just begun to lead: an engine started without
    // their replicas would fault the volume when they are all it has, and
    // otherwise drop them from the record, to be rebuilt for nothing.
    let down: Vec<String> = away.iter().filter_map(|a| a.down.clone()).collect();
    if !down.is_empty() && ctx.await_first_heartbeats(&down).await? {
        (reachable, away) = reach(ctx, &current).await?;
    }
    if reachable.is_empty() {
        let away: Vec<&str> = away.iter().map(|a| a.why.as_str()).collect();
        let name = volume.name.clone();
        let why = if away.is_empty() {
            format!("no replica of {name} holds its latest data")
        } else {
            format!(
                "no replica that holds the latest data of {name} is reachable: {}. \
                 Bring one back, or accept losing what only it holds with \
                 `ballastctl volume salvage {name} --replica NAME`",
                away.join(", ")
            )
        };
        return Err(fault(ctx, &name, why).await);
    }
    Ok(Serving {
        stale: stale(ctx, volume, &current).await?,
        replicas: reachable,
        generation: volume.status.generation,
        current: current.iter().map(|r| r.name.clone()).collect(),
        nodes: current.iter().map(|r| r.spec.node_id.clone()).collect(),
        holders: current
            .iter()
            .map(|r| format!("{} on {}", r.name, r.spec.node_id))
            .collect(),
    })
}

/// `NAME@ENDPOINT` of the replicas of `volume` on ready nodes that the
/// record leaves out, when it holds a single replica (`current`): after a
/// power cut, the copies a suspect block of that replica may take when
/// they match the checksum it kept, and while they exist its checksums
/// are synced at every flush (the engine's `guard`). None otherwise: with
/// two or more, a block gone bad in one is sound in another.
/// Found on the copy of the records (never a whole read of the store),
/// then each read from the store by name.
async fn stale(ctx: &Context, volume: &Volume, current: &[Replica]) -> Result<Vec<String>, Error> {
    if current.len() != 1 {
        return Ok(Vec::new());
    }
    let names: Vec<String> = {
        let mirror = ctx.records().await?;
        mirror
            .replicas()
            .filter(|r| r.spec.volume == volume.name && r.name != current[0].name)
            .map(|r| r.name.clone())
            .collect()
    };
    let mut others = Vec::with_capacity(names.len());
    for name in names {
        if let Some(r) = ctx.store.get::<Replica>(&name).await?
            && r.spec.volume == volume.name
        {
            others.push(r);
        }
    }
    Ok(reach(ctx, &others).await?.0)
}

/// The record of a new volume: every replica, generation 1.
pub fn initial(volume: &mut Volume, replicas: &[Replica]) {
    volume.status.generation = 1;
    volume.status.current_replicas = replicas.iter().map(|r| r.name.clone()).collect();
    volume.status.current_replicas.sort();
}

/// Adds a replica that now holds the latest data of a detached volume
/// (an offline rebuild from a current source finished).
pub async fn add_current(
    ctx: &Context,
    volume: &str,
    replica: &str,
    reason: &str,
) -> Result<(), Error> {
    change(ctx, volume, reason, |set| {
        if set.iter().any(|r| r == replica) {
            return false;
        }
        set.push(replica.to_string());
        true
    })
    .await
}

/// Takes a deleted replica out of the record (never the last one).
pub async fn remove_current(ctx: &Context, volume: &str, replica: &str) -> Result<(), Error> {
    change(ctx, volume, &format!("{replica} deleted"), |set| match set
        .iter()
        .position(|r| r == replica)
    {
        Some(i) if set.len() > 1 => {
            set.remove(i);
            true
        }
        _ => false,
    })
    .await
}

async fn change(
    ctx: &Context,
    volume: &str,
    reason: &str,
    mut f: impl FnMut(&mut Vec<String>) -> bool + Send,
) -> Result<(), Error> {
    let mut changed = None;
    let mut before = Vec::new();
    ctx.store
        .modify::<Volume, Error>(volume, |v| {
            if v.status.generation == 0 {
                return Ok(false); // not recorded yet: every replica counts
            }
            if v.status.attached_node.is_some() {
                return Ok(false); // its engine keeps the record
            }
            before = v.status.current_replicas.clone();
            let mut set = v.status.current_replicas.clone();
            if !f(&mut set) {
                return Ok(false);
            }
            set.sort();
            v.status.generation += 1;
            v.status.current_replicas = set.clone();
            changed = Some((v.status.generation, set));
            Ok(true)
        })
        .await?;
    if let Some((generation, set)) = changed {
        announce(ctx, volume, generation, &before, &set, reason).await;
    }
    Ok(())
}

/// Whether node `id` is in the store and ready.
async fn ready(ctx: &Context, id: &str) -> Result<bool, Error> {
    Ok(ctx
        .store
        .get::<Node>(id)
        .await?
        .is_some_and(|n| n.status.ready))
}

/// Makes `replica` the only replica that counts as holding the volume's
/// data: what the other current replicas held beyond it is given up. For a
/// detached volume none of whose current replicas is on a ready node;
/// `force` salvages even when one is (its data may be gone).
#[tracing::instrument(skip_all, fields(volume = %volume, replica = %replica))]
pub async fn salvage(
    ctx: &Arc<Context>,
    volume: &str,
    replica: &str,
    force: bool,
) -> Result<Volume, Error> {
    let v: Volume = ctx.store.fetch(volume).await?;
    if let Some(n) = &v.status.attached_node {
        return Err(Error::Conflict(format!(
            "volume {volume} is attached to {n}; detach it first"
        )));
    }
    let chosen = ctx
        .store
        .get::<Replica>(replica)
        .await?
        .filter(|r| r.spec.volume == volume)
        .ok_or_else(|| {
            Error::invalid("replica", format!("{replica} is not a replica of {volume}"))
        })?;
    let current = current_records(ctx, &v).await?;
    if !force {
        for r in current.iter().filter(|r| r.name != replica) {
            if ready(ctx, &r.spec.node_id).await? {
                return Err(Error::Unprocessable(format!(
                    "replica {} holds the latest data of {volume} and its node {} is ready: attach the \
                     volume instead (or salvage with force if its data is gone)",
                    r.name, r.spec.node_id
                )));
            }
        }
    }
    if !ready(ctx, &chosen.spec.node_id).await? {
        return Err(Error::Unprocessable(format!(
            "replica {replica}'s node {} is not ready",
            chosen.spec.node_id
        )));
    }
    let given_up: Vec<String> = current
        .iter()
        .filter(|r| r.name != replica)
        .map(|r| r.name.clone())
        .collect();
    let before = v.status.current_replicas.clone();
    let v = ctx
        .store
        .modify::<Volume, Error>(volume, |v| {
            v.status.generation += 1;
            v.status.current_replicas = vec![replica.to_string()];
            v.status.robustness = Robustness::Unknown;
            Ok(true)
        })
        .await?;
    mark_left(ctx, &before, &v.status.current_replicas).await;
    // The salvaged replica holds the data from now on.
    ctx.store
        .modify::<Replica, Error>(replica, |r| {
            r.status.mode = Some(ReplicaMode::Rw);
            r.spec.failed_at = None;
            Ok(true)
        })
        .await?;
    let message = format!(
        "salvaged from {replica} by an operator (generation {}): writes that only {} held are lost",
        v.status.generation,
        if given_up.is_empty() {
            "other replicas".to_string()
        } else {
            given_up.join(", ")
        }
    );
    tracing::warn!(%message, "volume salvaged");
    ctx.event(Kind::Volume, volume, "VolumeSalvaged", message)
        .await;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use ballast::model::VolumeSpec;
    use ballast::store::Store;

    use super::*;
    use crate::executor::effects;
    use crate::test_store::{Counting, node};

    /// Twenty volumes of two replicas, on n1 (ready) and n2 (not); v3 is
    /// attached at n1.
    async fn cluster(store: &dyn Store) {
        store.create(&node("n1", true)).await.unwrap();
        store.create(&node("n2", false)).await.unwrap();
        for v in 0..20 {
            let name = format!("v{v}");
            let mut volume = Volume {
                name: name.clone(),
                resource_version: 0,
                spec: VolumeSpec::new(1 << 30, 2),
                status: Default::default(),
            };
            let mut replicas = Vec::new();
            for (k, n) in ["n1", "n2"].into_iter().enumerate() {
                let r = format!("{name}-r{k}");
                replicas.push(effects::new_replica(
                    &r,
                    &name,
                    n,
                    "d1",
                    Some(ReplicaMode::Rw),
                ));
            }
            initial(&mut volume, &replicas);
            if v == 3 {
                volume.status.attached_node = Some("n1".into());
            }
            store.create(&volume).await.unwrap();
            for r in &replicas {
                store.create(r).await.unwrap();
            }
        }
    }

    /// Whole reads of the store `f` made.
    async fn lists<T>(counting: &Counting, f: impl std::future::Future<Output = T>) -> (T, usize) {
        let before = counting.lists.load(Ordering::SeqCst);
        let out = f.await;
        (out, counting.lists.load(Ordering::SeqCst) - before)
    }

    /// Choosing who serves, recording an engine's replica set and salvaging
    /// read the volume's own records by name: no whole read of the store,
    /// however many volumes it holds. What they decide is as before.
    #[tokio::test]
    async fn who_serves_is_read_from_the_volumes_own_records() {
        let counting = Arc::new(Counting::default());
        let store: Arc<dyn Store> = counting.clone();
        cluster(store.as_ref()).await;
        let ctx = Context::new(store.clone(), Duration::from_secs(30));
        // This controller has led for a minute: n2 is not ready by its own
        // word, not by a stale record.
        ctx.led_for(Duration::from_secs(60));

        let v3: Volume = store.fetch("v3").await.unwrap();
        let (s, whole) = lists(&counting, serving(&ctx, &v3)).await;
        let s = s.unwrap();
        assert_eq!(whole, 0, "serving read the store whole");
        assert_eq!(
            s.replicas,
            ["v3-r0@n1:9500"],
            "only the ready node's replica serves"
        );
        assert_eq!(s.current, ["v3-r0", "v3-r1"]);
        assert_eq!(s.holders, ["v3-r0 on n1", "v3-r1 on n2"]);
        assert_eq!(
            (s.on("n1"), s.on("n2"), s.on("n3")),
            (Some("v3-r0"), Some("v3-r1"), None)
        );

        // The engine drops v3-r1: recorded, and v3-r1 is failed.
        let (g, whole) = lists(
            &counting,
            record(&ctx, "v3", "n1", (1, 0), &["v3-r0".into()], "v3-r1 dropped"),
        )
        .await;
        assert_eq!(g.unwrap(), 2);
        assert_eq!(whole, 0, "recording read the store whole");
        let r1: Replica = store.fetch("v3-r1").await.unwrap();
        assert_eq!(r1.status.mode, Some(ReplicaMode::Err));
        // A replica of another volume, or none at all, is refused by name.
        for stranger in ["v4-r0", "nowhere"] {
            let e = record(&ctx, "v3", "n1", (2, 0), &[stranger.into()], "")
                .await
                .unwrap_err();
            assert!(e.to_string().contains(stranger), "{e}");
        }

        // v5's only current replica is on the node that is not ready: no
        // one serves, the volume is faulted, and the refusal says where the
        // data is.
        only_on_n2(store.as_ref()).await;
        let v5: Volume = store.fetch("v5").await.unwrap();
        let (e, whole) = lists(&counting, serving(&ctx, &v5)).await;
        let e = e.err().expect("no current replica is reachable");
        assert_eq!(whole, 0);
        assert!(e.to_string().contains("v5-r1 on n2 (not ready)"), "{e}");
        let v5: Volume = store.fetch("v5").await.unwrap();
        assert_eq!(v5.status.robustness, Robustness::Faulted);

        // Salvage from v5-r0 (on the ready node) gives up v5-r1.
        let (v, whole) = lists(&counting, salvage(&ctx, "v5", "v5-r0", false)).await;
        assert_eq!(whole, 0, "salvage read the store whole");
        assert_eq!(v.unwrap().status.current_replicas, ["v5-r0"]);
        // Salvaging from a replica whose node is not ready is refused.
        let e = salvage(&ctx, "v6", "v6-r1", false).await.unwrap_err();
        assert!(e.to_string().contains("v6-r0 holds the latest data"), "{e}");
        let e = salvage(&ctx, "v6", "v6-r1", true).await.unwrap_err();
        assert!(e.to_string().contains("is not ready"), "{e}");
    }

    /// A volume whose record holds one replica: its engine is told of the
    /// volume's others on ready nodes (stale), found on the copy of the
    /// records, not by a whole read of the store; none while the record
    /// holds two, or when their node is not ready.
    #[tokio::test]
    async fn an_engine_of_a_volume_down_to_one_recorded_replica_is_told_its_stale_ones() {
        let counting = Arc::new(Counting::default());
        let store: Arc<dyn Store> = counting.clone();
        cluster(store.as_ref()).await;
        n2_ready(store.as_ref()).await;
        let ctx = Context::new(store.clone(), Duration::from_secs(30));
        ctx.led_for(Duration::from_secs(60));
        let v3: Volume = store.fetch("v3").await.unwrap();
        let s = serving(&ctx, &v3).await.unwrap();
        assert_eq!(s.replicas, ["v3-r0@n1:9500", "v3-r1@n2:9500"]);
        assert!(s.stale.is_empty(), "two recorded: {:?}", s.stale);

        record(&ctx, "v3", "n1", (1, 0), &["v3-r0".into()], "v3-r1 dropped")
            .await
            .unwrap();
        drop(ctx.records().await.unwrap()); // the copy's first, whole read
        let v3: Volume = store.fetch("v3").await.unwrap();
        let (s, whole) = lists(&counting, serving(&ctx, &v3)).await;
        let s = s.unwrap();
        assert_eq!(whole, 0, "serving read the store whole");
        assert_eq!(s.replicas, ["v3-r0@n1:9500"]);
        assert_eq!(s.stale, ["v3-r1@n2:9500"], "the one the record dropped");

        n2_is_ready(store.as_ref(), false).await;
        let s = serving(&ctx, &v3).await.unwrap();
        assert!(s.stale.is_empty(), "its node is not ready: {:?}", s.stale);
    }

    /// An engine of an attachment the volume has left behind (one the
    /// controller started again, or detached) never changes the record,
    /// even at the record's generation and on the attached node: its
    /// smaller set is refused, naming both attachments, and the set stays.
    /// The engine of the latest attachment records; an engine of a version
    /// that claims none (0) is checked by generation and node only.
    #[tokio::test]
    async fn an_engine_of_an_earlier_attachment_never_changes_the_record() {
        let store: Arc<dyn Store> = Arc::new(Counting::default());
        cluster(store.as_ref()).await;
        let ctx = Context::new(store.clone(), Duration::from_secs(30));
        store
            .modify::<Volume, Error>("v3", |v| {
                v.status.engine_epoch = 5;
                Ok(true)
            })
            .await
            .unwrap();
        let one = ["v3-r0".to_string()];
        let e = record(&ctx, "v3", "n1", (1, 2), &one, "stale")
            .await
            .unwrap_err();
        assert!(
            matches!(e, Error::Unprocessable(_))
                && e.to_string().contains("attachment is 5, not 2"),
            "{e}"
        );
        let v3: Volume = store.fetch("v3").await.unwrap();
        assert_eq!(
            (v3.status.generation, v3.status.current_replicas),
            (1, vec!["v3-r0".to_string(), "v3-r1".to_string()]),
            "the set stays"
        );
        let r1: Replica = store.fetch("v3-r1").await.unwrap();
        assert_eq!(r1.status.mode, Some(ReplicaMode::Rw), "v3-r1 is not failed");
        // Nor a later one than the store's.
        assert!(record(&ctx, "v3", "n1", (1, 6), &one, "").await.is_err());
        assert_eq!(record(&ctx, "v3", "n1", (1, 5), &one, "").await.unwrap(), 2);
        assert_eq!(record(&ctx, "v3", "n1", (2, 0), &one, "").await.unwrap(), 3);
    }

    /// n2 is ready (its heartbeat, as the registry writes it).
    async fn n2_ready(store: &dyn Store) {
        n2_is_ready(store, true).await;
    }

    /// n2 is ready, or not, as the registry writes it.
    async fn n2_is_ready(store: &dyn Store, ready: bool) {
        store
            .modify::<Node, Error>("n2", |n| {
                n.status.ready = ready;
                Ok(true)
            })
            .await
            .unwrap();
    }

    /// n2's first heartbeat to `ctx`, 300 ms from now, as the registry
    /// takes it: heard first (for liveness), written to the store as ready
    /// a moment later.
    fn n2_beats_in_300ms(
        store: &Arc<dyn Store>,
        ctx: &Arc<Context>,
    ) -> tokio::task::JoinHandle<()> {
        let (store, ctx) = (store.clone(), ctx.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            ctx.saw_node("n2");
            tokio::time::sleep(Duration::from_millis(100)).await;
            n2_ready(store.as_ref()).await;
        })
    }

    /// v5's only current replica is v5-r1, on n2 (not ready).
    async fn only_on_n2(store: &dyn Store) {
        store
            .modify::<Volume, Error>("v5", |v| {
                v.status.current_replicas = vec!["v5-r1".into()];
                Ok(true)
            })
            .await
            .unwrap();
    }

    /// v5 with its only current replica on n2, which the store says is not
    /// ready; a controller that has just begun to lead (a node-down timeout
    /// of 4 s: heartbeats every second, a grace of two).
    async fn led_anew_with_n2_away() -> (Arc<dyn Store>, Arc<Context>, Volume) {
        let store: Arc<dyn Store> = Arc::new(Counting::default());
        cluster(store.as_ref()).await;
        only_on_n2(store.as_ref()).await;
        let ctx = Context::new(store.clone(), Duration::from_secs(4));
        ctx.began_leading();
        let v5 = store.fetch("v5").await.unwrap();
        (store, ctx, v5)
    }

    /// A controller that has just begun to lead does not take the store's
    /// word that a node is not ready before that node could have beaten:
    /// n2 came back while no controller led, and its first heartbeat, 300
    /// ms in, arrives within the grace. The engine is started with its
    /// replica; the volume is not faulted, and no VolumeFaulted is told.
    #[tokio::test]
    async fn a_node_back_before_its_first_heartbeat_to_a_new_leader_serves_and_faults_nothing() {
        let (store, ctx, v5) = led_anew_with_n2_away().await;
        assert_eq!(ctx.first_heartbeats_grace(), Duration::from_secs(2));
        let beat = n2_beats_in_300ms(&store, &ctx);
        let s = serving(&ctx, &v5).await.expect("n2's replica serves");
        beat.await.unwrap();
        assert_eq!(s.replicas, ["v5-r1@n2:9500"]);
        let v5: Volume = store.fetch("v5").await.unwrap();
        assert_ne!(v5.status.robustness, Robustness::Faulted);
        let told: Vec<ballast::model::Event> = store.list().await.unwrap();
        assert!(
            !told.iter().any(|e| e.reason == "VolumeFaulted"),
            "{told:?}"
        );
    }

    /// The same when other current replicas are reachable: v3's engine is
    /// started with both its replicas, n2's too once it has beaten, not
    /// with n1's alone (which would drop n2's from the record, to be
    /// rebuilt for nothing).
    #[tokio::test]
    async fn a_new_leader_starts_an_engine_with_a_replica_whose_node_beats_within_the_grace() {
        let store: Arc<dyn Store> = Arc::new(Counting::default());
        cluster(store.as_ref()).await;
        let ctx = Context::new(store.clone(), Duration::from_secs(4));
        ctx.began_leading();
        let beat = n2_beats_in_300ms(&store, &ctx);
        let v3: Volume = store.fetch("v3").await.unwrap();
        let s = serving(&ctx, &v3).await.unwrap();
        beat.await.unwrap();
        assert_eq!(s.replicas, ["v3-r0@n1:9500", "v3-r1@n2:9500"]);
    }

    /// A node still silent when the grace ends is taken as not ready: the
    /// volume is faulted as before, naming where its data is. And once the
    /// grace is over, a refusal comes at once.
    #[tokio::test]
    async fn a_node_silent_through_the_grace_faults_the_volume_as_before() {
        let (store, ctx, v5) = led_anew_with_n2_away().await;
        let asked = std::time::Instant::now();
        let e = serving(&ctx, &v5).await.err().expect("n2 never beat");
        assert!(
            asked.elapsed() >= ctx.first_heartbeats_grace(),
            "refused after {:?}, within the grace",
            asked.elapsed()
        );
        assert!(e.to_string().contains("v5-r1 on n2 (not ready)"), "{e}");
        let v5: Volume = store.fetch("v5").await.unwrap();
        assert_eq!(v5.status.robustness, Robustness::Faulted);
        let told: Vec<ballast::model::Event> = store.list().await.unwrap();
        assert!(told.iter().any(|e| e.reason == "VolumeFaulted"), "{told:?}");
        assert!(
            !ctx.await_first_heartbeats(&["n2"]).await.unwrap(),
            "the grace is over"
        );
    }

    /// A node held down by Kubernetes (its Node deleted or NotReady) gets
    /// no grace: heartbeats do not lift it, so nothing is waited for.
    #[tokio::test]
    async fn a_node_held_down_gets_no_grace() {
        let (store, ctx, _) = led_anew_with_n2_away().await;
        store
            .modify::<Node, Error>("n2", |n| {
                n.status.held_down = Some("its Kubernetes Node was deleted".into());
                Ok(true)
            })
            .await
            .unwrap();
        assert!(!ctx.await_first_heartbeats(&["n2"]).await.unwrap());
    }

    /// A volume from before the record (generation 0): every replica of it
    /// counts, read by listing them.
    #[tokio::test]
    async fn a_volume_from_before_the_record_serves_from_every_replica() {
        let counting = Arc::new(Counting::default());
        let store: Arc<dyn Store> = counting.clone();
        cluster(store.as_ref()).await;
        n2_ready(store.as_ref()).await;
        store
            .modify::<Volume, Error>("v7", |v| {
                v.status.generation = 0;
                v.status.current_replicas.clear();
                Ok(true)
            })
            .await
            .unwrap();
        let ctx = Context::new(store.clone(), Duration::from_secs(30));
        let v7: Volume = store.fetch("v7").await.unwrap();
        let s = serving(&ctx, &v7).await.unwrap();
        assert_eq!(s.replicas, ["v7-r0@n1:9500", "v7-r1@n2:9500"]);
    }
}
